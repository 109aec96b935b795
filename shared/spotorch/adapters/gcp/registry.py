"""ModelRegistry and ExperimentTracker on Vertex AI (aiplatform_v1 ModelService, MetadataService).

Clients are built on first use, one per region (one for the emulator); every call goes through
the same retry and classification as the job launcher, failures become RegistryError.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from spotorch.adapters.gcp.vertex_budgets import RequestBudget
from spotorch.adapters.gcp.vertex_calls import (
    RetryPolicy,
    call_with_retries,
    emulator_channel,
    label_key,
)
from spotorch.ports.budget import CRUD, SUBMIT, Budget
from spotorch.ports.jobs import label_value
from spotorch.ports.registry import (
    LABEL_MODEL_RUN,
    ExperimentRun,
    ModelUpload,
    ModelVersion,
    RegistryError,
    context_id,
    model_id,
)

T = TypeVar("T")

SCHEMA_EXPERIMENT = "system.Experiment"  # the titles the Vertex AI SDK gives its contexts
SCHEMA_EXPERIMENT_RUN = "system.ExperimentRun"
SCHEMA_VERSION = "0.0.1"
PARAMS_KEY, METRICS_KEY, STATE_KEY = "_params", "_metrics", "_state"  # the SDK's metadata keys
PROVENANCE_KEY = "spotorch_provenance"  # ours: a flat map of strings (a Struct holds any keys)
# What the SDK writes on an experiment's context (aiplatform.metadata.constants
# EXPERIMENT_METADATA); the console lists an experiment only with it.
EXPERIMENT_METADATA = {"experiment_deleted": False}
UPLOAD_TIMEOUT_S = 300.0  # how long to wait for UploadModel's long-running operation


class _Clients:
    """One client per region (one in all for the emulator), built on first use; calls retried."""

    def __init__(self, project: str, make: Callable[[str], Any], *, endpoint: str | None,
                 retry: RetryPolicy | None, budget: Budget | None,
                 call_timeout_s: float) -> None:
        self.project = project
        self.endpoint = endpoint
        self.retry = retry or RetryPolicy()
        self.budget: Budget = budget or RequestBudget()
        self.call_timeout_s = call_timeout_s
        self._make = make
        self._clients: dict[str, Any] = {}
        self._lock = threading.Lock()

    def client(self, region: str) -> Any:
        key = "" if self.endpoint else region
        with self._lock:
            if key not in self._clients:
                self._clients[key] = self._make(region)
            return self._clients[key]

    def call(self, what: str, fn: Callable[[], T]) -> T:
        return call_with_retries(what, fn, self.retry, RegistryError)


def _model_service(endpoint: str | None, region: str, token: str | None = None) -> Any:
    from google.cloud import aiplatform_v1 as v1

    if endpoint:
        from google.cloud.aiplatform_v1.services.model_service.transports.grpc import (
            ModelServiceGrpcTransport,
        )
        return v1.ModelServiceClient(transport=ModelServiceGrpcTransport(
            channel=emulator_channel(endpoint, token)))
    return v1.ModelServiceClient(client_options={"api_endpoint": f"{region}-aiplatform.googleapis.com"})


def _metadata_service(endpoint: str | None, region: str, token: str | None = None) -> Any:
    from google.cloud import aiplatform_v1 as v1

    if endpoint:
        from google.cloud.aiplatform_v1.services.metadata_service.transports.grpc import (
            MetadataServiceGrpcTransport,
        )
        return v1.MetadataServiceClient(
            transport=MetadataServiceGrpcTransport(channel=emulator_channel(endpoint, token)))
    return v1.MetadataServiceClient(
        client_options={"api_endpoint": f"{region}-aiplatform.googleapis.com"})


def _version_of(model: Any) -> ModelVersion:
    return ModelVersion(name=f"{model.name}@{model.version_id}", version_id=str(model.version_id),
                        display_name=str(model.display_name), artifact_uri=str(model.artifact_uri),
                        serving_image=str(model.container_spec.image_uri),
                        labels=dict(model.labels), aliases=tuple(model.version_aliases))


class VertexModelRegistry:
    """ports.ModelRegistry on ModelService: UploadModel (a long-running operation) as a new
    version of the pipeline's model, found again by the run's label before uploading."""

    def __init__(self, project: str, *, endpoint: str | None = None,
                 retry: RetryPolicy | None = None, budget: Budget | None = None,
                 call_timeout_s: float = 60.0, upload_timeout_s: float = UPLOAD_TIMEOUT_S,
                 client_factory: Callable[[str], Any] | None = None,
                 token: str | None = None) -> None:
        self.upload_timeout_s = upload_timeout_s
        self._c = _Clients(project,
                           client_factory or (lambda r: _model_service(endpoint, r, token)),
                           endpoint=endpoint, retry=retry, budget=budget,
                           call_timeout_s=call_timeout_s)

    def _existing(self, client: Any, model: str, run_label: str) -> str | None:
        from google.api_core import exceptions as api

        try:
            versions = list(client.list_model_versions(request={
                "name": model, "filter": f'labels.{LABEL_MODEL_RUN}="{run_label}"'},
                timeout=self._c.call_timeout_s))
        except api.NotFound:
            return None
        return f"{versions[0].name}@{versions[0].version_id}" if versions else ""

    def upload(self, upload: ModelUpload) -> str:
        """ModelRegistry.upload: a new version of the pipeline's model, idempotent by the run's label."""
        from google.cloud import aiplatform_v1 as v1

        parent = f"projects/{self._c.project}/locations/{upload.region}"
        mid = model_id(upload.pipeline)
        model = f"{parent}/models/{mid}"
        labels = {label_key(k): label_value(v) for k, v in upload.labels.items()}
        run_label = labels.get(LABEL_MODEL_RUN, label_value(upload.run_id))
        labels[LABEL_MODEL_RUN] = run_label

        def find_or_upload() -> str:
            client = self._c.client(upload.region)
            self._c.budget.take(upload.region, (CRUD,))
            found = self._existing(client, model, run_label)
            if found:
                return found  # registered by an earlier delivery
            self._c.budget.take(upload.region, (CRUD, SUBMIT))
            request = v1.UploadModelRequest(
                parent=parent,
                model=v1.Model(display_name=upload.display_name, artifact_uri=upload.artifact_uri,
                               container_spec=v1.ModelContainerSpec(image_uri=upload.serving_image),
                               labels=labels, version_aliases=list(upload.aliases)),
                # The first upload creates the model under the pipeline's id; later ones add a
                # version to it (found is "" when the model exists without this run's version).
                **({"parent_model": model} if found == "" else {"model_id": mid}))
            operation = client.upload_model(request=request, timeout=self._c.call_timeout_s)
            response = operation.result(timeout=self.upload_timeout_s)
            return f"{response.model}@{response.model_version_id}"

        return self._c.call(f"upload the model of {upload.run_id}", find_or_upload)

    def version(self, name: str) -> ModelVersion:
        """ModelRegistry.version: GetModel of a version's resource name."""
        region = name.split("/")[3] if name.count("/") >= 3 else ""
        got = self._c.call(f"get {name}", lambda: self._c.client(region).get_model(
            name=name, timeout=self._c.call_timeout_s))
        return _version_of(got)

    def move_alias(self, name: str, alias: str) -> None:
        """ModelRegistry.move_alias: MergeVersionAliases on the version (Vertex moves the alias
        from the version holding it)."""
        region = name.split("/")[3] if name.count("/") >= 3 else ""

        def merge() -> None:
            self._c.budget.take(region, (CRUD,))
            self._c.client(region).merge_version_aliases(
                name=name, version_aliases=[alias], timeout=self._c.call_timeout_s)

        self._c.call(f"give {name} the alias {alias}", merge)


def _struct(value: Mapping[str, Any]) -> Any:
    from google.protobuf import struct_pb2

    struct = struct_pb2.Struct()
    struct.update(dict(value))
    return struct


class VertexExperimentTracker:
    """ports.ExperimentTracker on MetadataService: the pipeline's experiment is a
    system.Experiment context, each spotorch run a system.ExperimentRun context below it with
    its parameters, final metrics and state in the context's metadata (the SDK's keys)."""

    def __init__(self, project: str, *, endpoint: str | None = None,
                 retry: RetryPolicy | None = None, budget: Budget | None = None,
                 call_timeout_s: float = 60.0,
                 client_factory: Callable[[str], Any] | None = None,
                 token: str | None = None) -> None:
        self._c = _Clients(project,
                           client_factory or (lambda r: _metadata_service(endpoint, r, token)),
                           endpoint=endpoint, retry=retry, budget=budget,
                           call_timeout_s=call_timeout_s)
        self._stores: set[str] = set()

    def _store(self, client: Any, region: str) -> str:
        """The default metadata store, created (a long-running operation) when missing."""
        from google.api_core import exceptions as api

        store = f"projects/{self._c.project}/locations/{region}/metadataStores/default"
        if store in self._stores:
            return store
        try:
            client.get_metadata_store(name=store, timeout=self._c.call_timeout_s)
        except api.NotFound:
            with contextlib.suppress(api.AlreadyExists):  # created meanwhile by someone else
                client.create_metadata_store(
                    parent=f"projects/{self._c.project}/locations/{region}",
                    metadata_store={}, metadata_store_id="default",
                    timeout=self._c.call_timeout_s).result(timeout=UPLOAD_TIMEOUT_S)
        self._stores.add(store)
        return store

    def _ensure(self, client: Any, store: str, cid: str, context: Any, *,
                update_existing: bool) -> str:
        """Create the context; an existing one gets this metadata only with update_existing."""
        from google.api_core import exceptions as api

        name = f"{store}/contexts/{cid}"
        try:
            client.create_context(parent=store, context=context, context_id=cid,
                                  timeout=self._c.call_timeout_s)
        except api.AlreadyExists:
            if update_existing:
                context.name = name
                client.update_context(context=context, timeout=self._c.call_timeout_s)
        return name

    def log_run(self, run: ExperimentRun) -> str:
        """ExperimentTracker.log_run: the experiment and its run as metadata contexts, made if missing."""
        from google.cloud import aiplatform_v1 as v1

        def log() -> str:
            client = self._c.client(run.region)
            self._c.budget.take(run.region, (CRUD,))
            store = self._store(client, run.region)
            experiment = self._ensure(client, store, context_id(run.experiment), v1.Context(
                display_name=run.experiment, schema_title=SCHEMA_EXPERIMENT,
                schema_version=SCHEMA_VERSION, metadata=_struct(EXPERIMENT_METADATA)),
                update_existing=False)
            metadata: dict[str, Any] = {PARAMS_KEY: dict(run.params),
                                        METRICS_KEY: dict(run.metrics), STATE_KEY: run.state}
            if run.provenance:
                metadata[PROVENANCE_KEY] = dict(run.provenance)
            name = self._ensure(client, store, context_id(f"{run.experiment}-{run.run_id}"),
                                v1.Context(display_name=run.run_id,
                                           schema_title=SCHEMA_EXPERIMENT_RUN,
                                           schema_version=SCHEMA_VERSION,
                                           metadata=_struct(metadata)), update_existing=True)
            client.add_context_children(context=experiment, child_contexts=[name],
                                        timeout=self._c.call_timeout_s)
            return name

        return self._c.call(f"log experiment run {run.run_id}", log)

    def read_run(self, name: str) -> ExperimentRun:
        """ExperimentTracker.read_run: the run's context read back as an ExperimentRun."""
        parts = name.split("/")
        region = parts[3] if len(parts) > 3 else ""
        got = self._c.call(f"get {name}", lambda: self._c.client(region).get_context(
            name=name, timeout=self._c.call_timeout_s))
        meta = dict(got.metadata)
        parent = next(iter(got.parent_contexts), "")
        return ExperimentRun(experiment=_display_of(self._c, region, parent), run_id=got.display_name,
                             region=region, params=dict(meta.get(PARAMS_KEY) or {}),
                             metrics={k: float(v) for k, v in (meta.get(METRICS_KEY) or {}).items()},
                             state=str(meta.get(STATE_KEY, "")),
                             provenance={str(k): str(v) for k, v in
                                         (meta.get(PROVENANCE_KEY) or {}).items()})

    def runs_of(self, experiment: str, region: str) -> tuple[str, ...]:
        """ExperimentTracker.runs_of: the run contexts whose parent is the experiment's."""
        store = f"projects/{self._c.project}/locations/{region}/metadataStores/default"
        parent = f"{store}/contexts/{context_id(experiment)}"
        request = {"parent": store, "filter": f'schema_title="{SCHEMA_EXPERIMENT_RUN}" AND '
                                              f'parent_contexts:"{parent}"'}
        found = self._c.call(f"list runs of {experiment}", lambda: list(
            self._c.client(region).list_contexts(request=request, timeout=self._c.call_timeout_s)))
        return tuple(str(c.name) for c in found)


def _display_of(clients: _Clients, region: str, name: str) -> str:
    if not name:
        return ""
    got = clients.call(f"get {name}", lambda: clients.client(region).get_context(
        name=name, timeout=clients.call_timeout_s))
    return str(got.display_name)
