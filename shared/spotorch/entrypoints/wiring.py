"""Builds the production dependencies from the environment; every client is created on first use."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from spotorch.app import bootstrap
from spotorch.app.deps import Deps
from spotorch.settings import TOPIC_TICK, Settings

if TYPE_CHECKING:
    from spotorch.core.pipeline import Pipeline


class SystemClock:
    """Clock: the system's wall clock."""
    def now(self) -> float:
        """Clock.now: time.time()."""
        return time.time()


def _quota_rule(pipelines: Iterable[Pipeline]) -> Callable[[str, str], bool]:
    """The launcher's in-call retry rule: a refusal by a resource quota of any pipeline's
    patterns (the defaults with none) is not retried at once (spotorch.core.quotas)."""
    from spotorch.core.pipeline import RecoveryPolicy
    from spotorch.core.quotas import retry_is_futile

    lists = tuple(dict.fromkeys([p.recovery.quota_patterns for p in pipelines]
                                or [RecoveryPolicy().quota_patterns]))
    return lambda code, message: retry_is_futile(code, message, lists)


def production_deps(settings: Settings | None = None) -> Deps:
    """Firestore, Vertex AI, GCS and Pub/Sub adapters configured from SPOTORCH_* variables."""
    from spotorch.adapters.gcp._storage_client import StorageClient
    from spotorch.adapters.gcp.bigquery import BigQueryTables
    from spotorch.adapters.gcp.checkpoints import StorageCheckpointStore
    from spotorch.adapters.gcp.dataflow import DataflowStepLauncher, GcsStepOutputs
    from spotorch.adapters.gcp.dataproc import DataprocStepLauncher
    from spotorch.adapters.gcp.endpoint_traffic import MonitoringEndpointTraffic
    from spotorch.adapters.gcp.endpoints import VertexEndpoints
    from spotorch.adapters.gcp.firestore import FirestoreDocumentStore
    from spotorch.adapters.gcp.job_logs import CloudLoggingJobLogs
    from spotorch.adapters.gcp.pubsub import PubSubPublisher, PubSubShardDispatcher
    from spotorch.adapters.gcp.registry import VertexExperimentTracker, VertexModelRegistry
    from spotorch.adapters.gcp.storage import GcsObjectStore
    from spotorch.adapters.gcp.vertex import VertexJobLauncher
    from spotorch.adapters.gcp.vertex_budgets import RequestBudget, SharedRequestBudget
    from spotorch.adapters.gcp.vizier import VertexTrialSearch
    from spotorch.app.run_store import DocumentRunStore
    from spotorch.spec.compiled import function_pipelines
    from spotorch.spec.prices import price_table

    settings = settings or Settings.from_env()
    docs = FirestoreDocumentStore(project=settings.project, database=settings.firestore_database)
    # Validated at deploy time: read from pipelines.json without pydantic (cold starts).
    pipelines = {p.name: p for p in function_pipelines(settings.pipelines)}
    regions = tuple(sorted({r for p in pipelines.values() for r in p.job.regions}))
    budget = SharedRequestBudget(docs) if settings.shared_budget else RequestBudget()
    storage = StorageClient(settings.project)  # one Cloud Storage client, made on first use
    return bootstrap.deps(
        prices=price_table(),  # SPOTORCH_PRICES' table, else the shipped list prices
        runs=DocumentRunStore(docs),
        docs=docs,
        launcher=VertexJobLauncher(settings.project, endpoint=settings.vertex_endpoint,
                                   regions=regions or (settings.region,), budget=budget,
                                   token=settings.vertex_token,
                                   futile=_quota_rule(pipelines.values())),
        checkpoints=StorageCheckpointStore(),
        publisher=PubSubPublisher(settings.topic_path(settings.events_topic)),
        clock=SystemClock(),
        pipelines=pipelines,
        objects=GcsObjectStore(storage),
        events_topic=settings.topic_path(settings.trainer_events_topic),
        project=settings.project,
        shards=PubSubShardDispatcher(settings.topic_path(TOPIC_TICK)),
        # Clients on first use: only pipelines with a `model` section ever call them.
        models=VertexModelRegistry(settings.project, endpoint=settings.vertex_endpoint,
                                   token=settings.vertex_token),
        experiments=VertexExperimentTracker(settings.project, endpoint=settings.vertex_endpoint,
                                            token=settings.vertex_token),
        # issue 37: clients on first use: only pipelines with model.serve call them.
        endpoints=VertexEndpoints(settings.project, endpoint=settings.vertex_endpoint,
                                  budget=budget, token=settings.vertex_token),
        endpoint_traffic=MonitoringEndpointTraffic(settings.project,
                                                   endpoint=settings.monitoring_endpoint,
                                                   token=settings.vertex_token),
        # issue 38: the client on first use: only sweeps with search: vizier call it.
        search=VertexTrialSearch(settings.project, endpoint=settings.vertex_endpoint,
                                 token=settings.vertex_token),
        # A failed attempt's stderr tail: Cloud Logging (the Vertex emulator locally).
        job_logs=CloudLoggingJobLogs(settings.project, endpoint=settings.logging_endpoint,
                                     token=settings.vertex_token),
        unmatched_alert_after_s=settings.unmatched_alert_after_s,
        table_wait_s=settings.bigquery_wait_s,
        # issue 31: clients on first use: only pipelines with a `preprocess` step call them.
        steps=DataflowStepLauncher(settings.project, launcher_template=settings.dataflow_launcher,
                                   service_account=settings.dataflow_service_account,
                                   network=settings.dataflow_network,
                                   subnetwork=settings.dataflow_subnetwork,
                                   endpoint=settings.dataflow_endpoint,
                                   token=settings.vertex_token),
        step_outputs=GcsStepOutputs(storage),
        # issue 42: a client on first use: only pipelines with a Spark step call it.
        spark_steps=DataprocStepLauncher(settings.project, driver_uri=settings.spark_driver,
                                         service_account=settings.dataproc_service_account,
                                         network=settings.dataproc_network,
                                         subnetwork=settings.dataproc_subnetwork,
                                         endpoint=settings.dataproc_endpoint,
                                         token=settings.vertex_token),
        # The client on first use: only pipelines with trigger.bigquery call it.
        tables=BigQueryTables(settings.project, endpoint=settings.bigquery_endpoint,
                              location=settings.bigquery_location),
    )
