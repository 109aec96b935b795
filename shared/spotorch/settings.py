"""Deployment settings read from the environment: one place for every variable, topic and collection."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

# Environment variables the functions read. deploy/ must provide each (tests/test_deploy.py checks).
ENV_PROJECT = "SPOTORCH_PROJECT"
ENV_REGION = "SPOTORCH_REGION"
ENV_EVENTS_TOPIC = "SPOTORCH_EVENTS_TOPIC"
ENV_TRAINER_EVENTS_TOPIC = "SPOTORCH_TRAINER_EVENTS_TOPIC"
ENV_PIPELINES = "SPOTORCH_PIPELINES"
ENV_TRAINING_SERVICE_ACCOUNT = "SPOTORCH_TRAINING_SERVICE_ACCOUNT"
ENV_VERTEX_ENDPOINT = "SPOTORCH_VERTEX_ENDPOINT"
# issue 31: the Dataflow API's endpoint (the local stack's emulator; unset: Google's) and the
# gs:// spec of spotorch's launcher flex template that runs a package's Beam module.
ENV_DATAFLOW_ENDPOINT = "SPOTORCH_DATAFLOW_ENDPOINT"
ENV_DATAFLOW_LAUNCHER = "SPOTORCH_DATAFLOW_LAUNCHER"
ENV_DATAFLOW_SERVICE_ACCOUNT = "SPOTORCH_DATAFLOW_SERVICE_ACCOUNT"  # preprocess jobs' worker account
ENV_DATAFLOW_NETWORK = "SPOTORCH_DATAFLOW_NETWORK"  # preprocess workers' VPC (default: Dataflow's)
ENV_DATAFLOW_SUBNETWORK = "SPOTORCH_DATAFLOW_SUBNETWORK"
# issue 42: Spark preprocess steps on Dataproc Serverless: the API's endpoint (the local stack's
# Dataproc at host:port; unset: Google's regional endpoints), spotorch's PySpark driver (a gs://
# main file, deploy/spark-driver/), the batches' service account and network.
ENV_DATAPROC_ENDPOINT = "SPOTORCH_DATAPROC_ENDPOINT"
ENV_SPARK_DRIVER = "SPOTORCH_SPARK_DRIVER"
ENV_DATAPROC_SERVICE_ACCOUNT = "SPOTORCH_DATAPROC_SERVICE_ACCOUNT"
ENV_DATAPROC_NETWORK = "SPOTORCH_DATAPROC_NETWORK"
ENV_DATAPROC_SUBNETWORK = "SPOTORCH_DATAPROC_SUBNETWORK"
# The access token sent to an emulator endpoint (the local stack's Vertex emulator knows the
# caller by it); never set in production, where clients use Application Default Credentials.
ENV_VERTEX_TOKEN = "SPOTORCH_VERTEX_TOKEN"
ENV_FIRESTORE_DATABASE = "SPOTORCH_FIRESTORE_DATABASE"
# "1": Vertex request budgets shared by all instances through Firestore (spotorch.adapters.budget);
# unset or "0": each instance keeps its own. deploy/ sets it (var.shared_request_budget).
ENV_SHARED_BUDGET = "SPOTORCH_SHARED_BUDGET"
# The operator's side: the local stack's state file (`spotorch dev up` exports it).
ENV_STATE = "SPOTORCH_STATE"
# Optional: Cloud Logging's API at host:port (the local Vertex emulator serves ListLogEntries).
ENV_LOGGING_ENDPOINT = "SPOTORCH_LOGGING_ENDPOINT"
# Optional: Cloud Monitoring's API at host:port (the local Vertex emulator serves ListTimeSeries
# of its endpoints' prediction metrics: a canary's traffic, issue 37).
ENV_MONITORING_ENDPOINT = "SPOTORCH_MONITORING_ENDPOINT"
# A BigQuery REST endpoint (http://host:port: the local stack's emulator); unset: Google's.
ENV_BIGQUERY_ENDPOINT = "SPOTORCH_BIGQUERY_ENDPOINT"
# Optional: the location of the BigQuery snapshot datasets (where the snapshot jobs run and are
# read back: jobs.get needs it outside the US and EU multi-regions); unset: BigQuery's default.
ENV_BIGQUERY_LOCATION = "SPOTORCH_BIGQUERY_LOCATION"
# Optional: seconds one invocation waits for a BigQuery snapshot's jobs before it returns (5).
ENV_BIGQUERY_WAIT = "SPOTORCH_BIGQUERY_WAIT_S"
# Optional: seconds an upload that matched no pipeline stays quiet before its one alert.
ENV_UNMATCHED_ALERT_AFTER = "SPOTORCH_UNMATCHED_ALERT_AFTER_S"

FUNCTION_ENV = (
    ENV_PROJECT, ENV_REGION, ENV_EVENTS_TOPIC, ENV_TRAINER_EVENTS_TOPIC, ENV_PIPELINES,
    ENV_TRAINING_SERVICE_ACCOUNT, ENV_FIRESTORE_DATABASE, ENV_DATAFLOW_SERVICE_ACCOUNT,
)

# Pub/Sub topics (short names; the project is added at run time).
TOPIC_TRAINER_EVENTS = "spotorch-trainer-events"
TOPIC_JOB_EVENTS = "spotorch-job-events"
TOPIC_TICK = "spotorch-tick"
TOPIC_EVENTS = "spotorch-events"
TOPIC_DEAD_LETTER = "spotorch-dead-letter"
SUBSCRIPTION_DEAD_LETTER = "spotorch-dead-letter-hold"  # keeps dead letters for a replay
SUBSCRIPTION_DEAD_LETTER_LOCAL = "spotorch-dead-letter-observer"  # the local stack's hold
TOPIC_GCS_NOTIFICATIONS = "spotorch-gcs-notifications"  # local stack only; production uses Eventarc

# Firestore collections.
COLLECTION_RUNS = "runs"
COLLECTION_SNAPSHOTS = "snapshots"
COLLECTION_DEDUPE = "dedupe"
COLLECTION_REJECTED = "rejected_events"
COLLECTION_LISTINGS = "listings"  # per landing prefix: where the reconcile listing goes on
COLLECTION_FAILURES = "delivery_failures"  # message id -> last transient failure (dead letters)
COLLECTION_SWEEPS = "sweeps"  # sweep id -> the sweep (spotorch.core.sweeps), its trials and outbox
COLLECTION_JOBS = "jobs"  # job id -> run, attempt, job name: attributes log-sink entries
COLLECTION_SPOT_REGIONS = "spot_regions"  # region x shape -> Spot seen by all runs (spot_record)
COLLECTION_BUDGETS = "request_budgets"  # region:kind -> Vertex request tokens granted lately
COLLECTION_UNMATCHED = "unmatched_uploads"  # bucket x folder -> objects no pipeline took; TTL on expires_at
COLLECTION_NOTIFICATIONS = "notifications"  # one doc per (event, channel); TTL on expires_at
COLLECTION_NOTIFICATION_RUNS = "notification_runs"  # one doc per (run, channel); TTL on expires_at
COLLECTION_PROBES = "hardware_probes"  # pipeline -> its hardware candidates' cached measurements
COLLECTION_TABLE_WATCHES = "table_watches"  # pipeline -> its BigQuery tables as last seen
COLLECTION_CHAMPIONS = "model_champions"  # model -> its champion and the gate's decisions
COLLECTION_ROLLOUTS = "endpoint_rollouts"  # endpoint -> what it serves, its canary, what waits

# How long each collection's documents live. A collection that grows with use has a TTL field,
# a timestamp the code writes (a number is ignored by Firestore) and deploy/firestore.tf has a
# policy on; the others say why they keep their documents. tests/test_deploy.py checks both sides.
TTL_FIELD = "expires_at"
FAILURE_RETENTION_S = 14 * 24 * 3600.0  # longer than the dead-letter hold keeps a message (7 days)
JOB_RECORD_GRACE_S = 30 * 24 * 3600.0  # after the job's own timeout: late log lines still attribute
RETENTION: Mapping[str, tuple[str | None, str]] = {
    COLLECTION_RUNS: (None, "the run history: what ran, what it cost; deleting it is yours to do"),
    COLLECTION_SWEEPS: (None, "the sweep history, as runs"),
    COLLECTION_SNAPSHOTS: (None, "one per snapshot: what keeps a snapshot from starting a second run"),
    COLLECTION_LISTINGS: (None, "one per landing prefix, rewritten in place"),
    COLLECTION_BUDGETS: (None, "one per region and request kind, rewritten in place"),
    COLLECTION_PROBES: (None, "one per pipeline, rewritten in place"),
    COLLECTION_TABLE_WATCHES: (None, "one per BigQuery pipeline, rewritten in place"),
    COLLECTION_CHAMPIONS: (None, "one per promoted model, rewritten in place"),
    COLLECTION_ROLLOUTS: (None, "one per serving endpoint, rewritten in place"),
    COLLECTION_DEDUPE: (TTL_FIELD, "an object event's id, 7 days"),
    COLLECTION_REJECTED: (TTL_FIELD, "a rejected event, 30 days"),
    COLLECTION_FAILURES: (TTL_FIELD, "a message's last transient failure, 14 days"),
    COLLECTION_JOBS: (TTL_FIELD, "a job's run and attempt, its timeout plus 30 days"),
    COLLECTION_SPOT_REGIONS: (TTL_FIELD, "Spot seen per region and shape, a day past its window"),
    COLLECTION_UNMATCHED: (TTL_FIELD, "a folder of uploads no pipeline took, 7 days past its last"),
    COLLECTION_NOTIFICATIONS: (TTL_FIELD, "an alert's delivery, the ledger's retention"),
    COLLECTION_NOTIFICATION_RUNS: (TTL_FIELD, "a run's alert window, the ledger's retention"),
}


@dataclass(frozen=True)
class Settings:
    """Where this deployment of spotorch lives and what it talks to."""

    project: str
    region: str = "us-central1"
    events_topic: str = TOPIC_EVENTS
    trainer_events_topic: str = TOPIC_TRAINER_EVENTS
    pipelines: str = "pipelines"
    training_service_account: str | None = None
    vertex_endpoint: str | None = None
    vertex_token: str | None = None  # with vertex_endpoint only (the local stack)
    firestore_database: str = "(default)"
    shared_budget: bool = False
    logging_endpoint: str | None = None
    monitoring_endpoint: str | None = None
    bigquery_endpoint: str | None = None
    bigquery_wait_s: float = 5.0
    bigquery_location: str | None = None
    unmatched_alert_after_s: float = 600.0
    dataflow_endpoint: str | None = None
    dataflow_launcher: str | None = None
    dataflow_service_account: str | None = None
    dataflow_network: str | None = None
    dataflow_subnetwork: str | None = None
    dataproc_endpoint: str | None = None
    spark_driver: str | None = None
    dataproc_service_account: str | None = None
    dataproc_network: str | None = None
    dataproc_subnetwork: str | None = None

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        """Read settings from the environment; the project falls back to Google's own variables."""
        env = os.environ if environ is None else environ
        project = (env.get(ENV_PROJECT) or env.get("GOOGLE_CLOUD_PROJECT")
                   or env.get("GCLOUD_PROJECT") or "spotorch-local")
        return cls(
            project=project,
            region=env.get(ENV_REGION, cls.region),
            events_topic=env.get(ENV_EVENTS_TOPIC, cls.events_topic),
            trainer_events_topic=env.get(ENV_TRAINER_EVENTS_TOPIC, cls.trainer_events_topic),
            pipelines=env.get(ENV_PIPELINES, cls.pipelines),
            training_service_account=env.get(ENV_TRAINING_SERVICE_ACCOUNT) or None,
            vertex_endpoint=env.get(ENV_VERTEX_ENDPOINT) or None,
            vertex_token=env.get(ENV_VERTEX_TOKEN) or None,
            firestore_database=env.get(ENV_FIRESTORE_DATABASE, cls.firestore_database),
            shared_budget=env.get(ENV_SHARED_BUDGET, "").strip().lower() in ("1", "true", "yes"),
            logging_endpoint=env.get(ENV_LOGGING_ENDPOINT) or None,
            monitoring_endpoint=env.get(ENV_MONITORING_ENDPOINT) or None,
            bigquery_endpoint=env.get(ENV_BIGQUERY_ENDPOINT) or None,
            bigquery_wait_s=_seconds(env.get(ENV_BIGQUERY_WAIT), cls.bigquery_wait_s),
            bigquery_location=env.get(ENV_BIGQUERY_LOCATION) or None,
            unmatched_alert_after_s=_seconds(env.get(ENV_UNMATCHED_ALERT_AFTER),
                                             cls.unmatched_alert_after_s),
            dataflow_endpoint=env.get(ENV_DATAFLOW_ENDPOINT) or None,
            dataflow_launcher=env.get(ENV_DATAFLOW_LAUNCHER) or None,
            dataflow_service_account=env.get(ENV_DATAFLOW_SERVICE_ACCOUNT) or None,
            dataflow_network=env.get(ENV_DATAFLOW_NETWORK) or None,
            dataflow_subnetwork=env.get(ENV_DATAFLOW_SUBNETWORK) or None,
            dataproc_endpoint=env.get(ENV_DATAPROC_ENDPOINT) or None,
            spark_driver=env.get(ENV_SPARK_DRIVER) or None,
            dataproc_service_account=env.get(ENV_DATAPROC_SERVICE_ACCOUNT) or None,
            dataproc_network=env.get(ENV_DATAPROC_NETWORK) or None,
            dataproc_subnetwork=env.get(ENV_DATAPROC_SUBNETWORK) or None,
        )

    def topic_path(self, topic: str) -> str:
        """Full resource name of a topic in this project (a full name passes through)."""
        return topic if topic.startswith("projects/") else f"projects/{self.project}/topics/{topic}"


def _seconds(text: str | None, default: float) -> float:
    """A number of seconds from the environment; the default when unset or not a number >= 0."""
    if not text:
        return default
    try:
        value = float(text)
    except ValueError:
        return default
    return value if value >= 0 else default
