"""The preprocess step on Dataflow (issue 31): StepLauncher over google-cloud-dataflow-client, and
StepOutputs over Cloud Storage.

A Cloud Function cannot build a Beam graph (Beam is not in the function bundle), so every job is
a Flex Template launch (FlexTemplatesService.LaunchFlexTemplate): the user's own template, or
spotorch's launcher template (SPOTORCH_DATAFLOW_LAUNCHER, a template spec whose image installs
the code package's URIs and runs `python -m MODULE` with DataflowRunner). Launching is idempotent
by the job's deterministic name: before creating, the active jobs of that name are looked up
(ListJobs with name), and Dataflow itself refuses a second active job of one name.

The REST transport is used when an endpoint is given (the local stack's Dataflow emulator);
production uses the client's default (gRPC to dataflow.googleapis.com). Clients are made on
first use (cold starts).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Mapping, Sequence
from typing import Any

from spotorch.adapters.gcp._storage_client import storage_client
from spotorch.core.preprocess import (
    JOB_STATE_FAILED,
    LIVE_STATES,
    TERMINAL_STATES,
    JobView,
    explain,
    folder_digest,
)
from spotorch.core.triggers import split_gs_uri
from spotorch.ports.steps import StepLaunch, StepLaunchError

# GetJobMetrics' names of the resources Dataflow bills (batch): vCPU-seconds, MB-seconds of
# memory, GB-seconds of standard persistent disk.
METRIC_VCPU, METRIC_MEMORY_MB, METRIC_PD_GB = "TotalVcpuTime", "TotalMemoryUsage", "TotalPdUsage"
PERMANENT_CODES = frozenset({3, 7, 9})  # INVALID_ARGUMENT, PERMISSION_DENIED, FAILED_PRECONDITION
ERROR_TEXT_LIMIT = 4000


class DataflowStepLauncher:
    """StepLauncher: Flex Template launches, GetJob/ListJobs, job messages and metrics, cancels."""

    def __init__(self, project: str, *, launcher_template: str | None = None,
                 service_account: str | None = None, endpoint: str | None = None,
                 token: str | None = None, network: str | None = None,
                 subnetwork: str | None = None) -> None:
        self.project = project
        self.launcher_template = launcher_template
        self.service_account = service_account  # spotorch-dataflow, unless the step names one
        # the deployment's VPC for the workers (SPOTORCH_DATAFLOW_NETWORK/_SUBNETWORK), unless
        # the step names its own; neither: Dataflow's default, the `default` network
        self.network = network
        self.subnetwork = subnetwork
        self.endpoint = endpoint
        self.token = token
        self._clients: dict[str, Any] = {}
        self._lock = threading.Lock()

    def _client(self, kind: str) -> Any:
        with self._lock:
            if kind not in self._clients:
                self._clients[kind] = self._make(kind)
            return self._clients[kind]

    def _make(self, kind: str) -> Any:
        from google.cloud import dataflow_v1beta3 as df

        cls = {"flex": df.FlexTemplatesServiceClient, "jobs": df.JobsV1Beta3Client,
               "messages": df.MessagesV1Beta3Client, "metrics": df.MetricsV1Beta3Client}[kind]
        if not self.endpoint:
            return cls()
        from google.oauth2.credentials import Credentials

        # The emulator checks the caller by its bearer token (the local stack's IAM), as the
        # Vertex emulator does. The REST session needs credentials of some kind: without a
        # token, one the emulator does not know (refused when it checks IAM).
        credentials = Credentials(self.token or "no-token")
        endpoint = self.endpoint if "://" in self.endpoint else f"http://{self.endpoint}"
        return cls(transport="rest", credentials=credentials,
                   client_options={"api_endpoint": endpoint})

    # --- StepLauncher -----------------------------------------------------------------------

    def launch(self, request: StepLaunch) -> JobView:
        """StepLauncher.launch: the live job of that name if there is one, else a new launch."""
        existing = self._find(request.job_name, request.region, active_only=True)
        if existing is not None:
            return existing
        from google.api_core import exceptions
        from google.cloud import dataflow_v1beta3 as df

        template, parameters = self._template(request)
        environment = df.FlexTemplateRuntimeEnvironment(
            max_workers=request.max_workers, machine_type=request.machine_type,
            temp_location=request.temp_uri, staging_location=request.temp_uri,
            service_account_email=request.service_account or self.service_account or "",
            network=request.network or self.network or "",
            subnetwork=request.subnetwork or self.subnetwork or "",
            additional_user_labels=dict(request.labels))
        parameter = df.LaunchFlexTemplateParameter(
            job_name=request.job_name, container_spec_gcs_path=template,
            parameters=parameters, environment=environment)
        try:
            response = self._client("flex").launch_flex_template(
                request=df.LaunchFlexTemplateRequest(project_id=self.project,
                                                     location=request.region,
                                                     launch_parameter=parameter))
        except exceptions.Conflict:  # ALREADY_EXISTS (409): a live job of that name
            found = self._find(request.job_name, request.region, active_only=True)
            if found is not None:
                return found
            raise StepLaunchError(f"job {request.job_name} exists but cannot be found") from None
        except exceptions.GoogleAPICallError as exc:
            code = getattr(exc, "grpc_status_code", None)
            permanent = bool(code is not None and code.value[0] in PERMANENT_CODES) or \
                exc.code in (400, 403, 412)
            raise StepLaunchError(f"LaunchFlexTemplate: {explain(str(exc.message))}",
                                  permanent=permanent) from exc
        job = response.job
        return JobView(job_id=job.id, name=job.name or request.job_name,
                       state=_state_name(job.current_state) or "JOB_STATE_QUEUED")

    def _template(self, request: StepLaunch) -> tuple[str, dict[str, str]]:
        """The template spec to launch and its parameters: the user's template gets input,
        output and the options; spotorch's launcher also gets the module and package URIs."""
        parameters = {"input": request.input_uri, "output": request.output_uri}
        if request.template_uri:  # the user's template declares its options as parameters
            return request.template_uri, {**parameters, **dict(request.options)}
        if not self.launcher_template:
            raise StepLaunchError("a Beam module needs spotorch's launcher flex template: set "
                                  "SPOTORCH_DATAFLOW_LAUNCHER to its template spec gs:// URI",
                                  permanent=True)
        # The launcher's metadata declares its parameters (Dataflow refuses others): the step's
        # options travel in one, as JSON, and the launcher passes each on as --NAME=VALUE.
        parameters["module"] = request.python_module or ""
        if request.package_uris:
            parameters["packages"] = ",".join(request.package_uris)
        if request.options:
            parameters["options"] = json.dumps(dict(request.options), sort_keys=True)
        if request.inputs_uri:
            parameters["inputs"] = request.inputs_uri
        return self.launcher_template, parameters

    def get(self, job_name: str, region: str, job_id: str | None = None) -> JobView | None:
        """StepLauncher.get: the job by its id when known (one GetJob while it runs), else the
        newest of that name (ListJobs, then GetJob); its error text (a failed job) and billed
        resources are read once it has ended: they serve the error and the cost, not the poll."""
        from google.api_core import exceptions
        from google.cloud import dataflow_v1beta3 as df

        job: Any = None
        if job_id:
            try:
                job = self._client("jobs").get_job(request=df.GetJobRequest(
                    project_id=self.project, location=region, job_id=job_id))
            except exceptions.NotFound:
                job = None
            if job is not None and job.name != job_name:
                job = None  # an id recorded for another name: follow the name instead
        if job is None:
            found = self._find(job_name, region, active_only=False)
            if found is None:
                return None
            job = self._client("jobs").get_job(request=df.GetJobRequest(
                project_id=self.project, location=region, job_id=found.job_id))
        state = _state_name(job.current_state) or "JOB_STATE_UNKNOWN"
        if state not in TERMINAL_STATES:
            return JobView(job_id=job.id, name=job.name, state=state)
        error = explain(self._errors(job.id, region)) if state == JOB_STATE_FAILED else ""
        vcpu_s, memory_gb_s, pd_gb_s = self._metrics(job.id, region)
        return JobView(job_id=job.id, name=job.name, state=state, error=error, vcpu_s=vcpu_s,
                       memory_gb_s=memory_gb_s, pd_gb_s=pd_gb_s)

    def cancel(self, job_name: str, region: str) -> None:
        """StepLauncher.cancel: UpdateJob with requested_state JOB_STATE_CANCELLED."""
        found = self._find(job_name, region, active_only=True)
        if found is None:
            return
        from google.cloud import dataflow_v1beta3 as df

        self._client("jobs").update_job(request=df.UpdateJobRequest(
            project_id=self.project, location=region, job_id=found.job_id,
            job=df.Job(requested_state=df.JobState.JOB_STATE_CANCELLED)))

    # --- reads ------------------------------------------------------------------------------

    def _find(self, job_name: str, region: str, *, active_only: bool) -> JobView | None:
        from google.cloud import dataflow_v1beta3 as df

        filter_ = df.ListJobsRequest.Filter.ACTIVE if active_only else df.ListJobsRequest.Filter.ALL
        newest: Any = None
        for job in self._client("jobs").list_jobs(request=df.ListJobsRequest(
                project_id=self.project, location=region, filter=filter_, name=job_name)):
            if job.name != job_name:
                continue  # the name filter is a hint; the name is checked here
            if active_only and _state_name(job.current_state) not in LIVE_STATES:
                continue
            if newest is None or _created(job) > _created(newest):
                newest = job
        if newest is None:
            return None
        return JobView(job_id=newest.id, name=newest.name,
                       state=_state_name(newest.current_state) or "JOB_STATE_UNKNOWN")

    def _errors(self, job_id: str, region: str) -> str:
        from google.cloud import dataflow_v1beta3 as df

        texts = [m.message_text for m in self._client("messages").list_job_messages(
            request=df.ListJobMessagesRequest(
                project_id=self.project, location=region, job_id=job_id,
                minimum_importance=df.JobMessageImportance.JOB_MESSAGE_ERROR))]
        return "\n".join(texts)[-ERROR_TEXT_LIMIT:]

    def _metrics(self, job_id: str, region: str) -> tuple[float, float, float]:
        """(vCPU-seconds, memory GB-seconds, disk GB-seconds) Dataflow bills the job for."""
        from google.cloud import dataflow_v1beta3 as df

        metrics = self._client("metrics").get_job_metrics(request=df.GetJobMetricsRequest(
            project_id=self.project, location=region, job_id=job_id))
        values: dict[str, float] = {}
        for update in metrics.metrics:
            name = update.name.name
            if name in (METRIC_VCPU, METRIC_MEMORY_MB, METRIC_PD_GB):
                values[name] = max(values.get(name, 0.0), _number(update.scalar))
        return (values.get(METRIC_VCPU, 0.0), values.get(METRIC_MEMORY_MB, 0.0) / 1024,
                values.get(METRIC_PD_GB, 0.0))


def _state_name(state: Any) -> str:
    name = getattr(state, "name", None)
    return str(name) if name else (str(state) if isinstance(state, str) else "")


def _created(job: Any) -> float:
    create = getattr(job, "create_time", None)
    return create.timestamp() if create is not None and hasattr(create, "timestamp") else 0.0


def _number(value: Any) -> float:
    """A MetricUpdate scalar (a protobuf Value or a plain number) as a float."""
    if isinstance(value, int | float):
        return float(value)
    number = getattr(value, "number_value", None)
    if isinstance(number, int | float):
        return float(number)
    try:
        return float(value)
    except (TypeError, ValueError):
        return 0.0


class GcsStepOutputs:
    """StepOutputs: the input folder's checksums by listing, and markers as JSON objects."""

    def __init__(self, client: Any = None, *, project: str | None = None) -> None:
        self._clients = storage_client(client, project)  # a StorageClient may be shared

    def _storage(self) -> Any:
        return self._clients.get()

    def content_digest(self, data_uri: str,
                       pinned: Sequence[tuple[str, int]] | None = None) -> str | None:
        """StepOutputs.content_digest: names below the folder, sizes and CRC32C, by listing; for
        pinned generations the listing serves those still live, and each overwritten one is
        read by its generation (one metadata GET each)."""
        bucket, folder = split_gs_uri(data_uri)
        live: dict[str, tuple[int, int, str | None]] = {}  # name -> (generation, size, crc32c)
        for blob in self._storage().list_blobs(bucket, prefix=folder):
            live[blob.name] = (int(blob.generation or 0), int(blob.size or 0), blob.crc32c)
        if pinned is None:
            picked = [(n, s, c) for n, (_, s, c) in live.items()]
        else:
            picked = []
            for name, generation in pinned:
                seen = live.get(name)
                if seen is None or seen[0] != int(generation):
                    blob = self._storage().bucket(bucket).get_blob(name,
                                                                   generation=int(generation))
                    if blob is None:
                        return None  # that generation is gone: the input cannot be named
                    seen = (int(generation), int(blob.size or 0), blob.crc32c)
                picked.append((name, seen[1], seen[2]))
        if not picked or any(c is None for _, _, c in picked):
            return None
        return folder_digest((n.removeprefix(folder), s, str(c)) for n, s, c in picked)

    def read_manifest(self, uri: str) -> Mapping[str, Any] | None:
        """StepOutputs.read_manifest: the inputs manifest's JSON, None when it is not there."""
        return self._json(uri)

    def read_marker(self, uri: str) -> Mapping[str, Any] | None:
        """StepOutputs.read_marker: the marker's JSON, None when it is not there."""
        return self._json(uri)

    def _json(self, uri: str) -> Mapping[str, Any] | None:
        from google.api_core import exceptions

        bucket, name = _object(uri)
        try:
            data = self._storage().bucket(bucket).blob(name).download_as_bytes()
        except exceptions.NotFound:
            return None
        doc = json.loads(data)
        return doc if isinstance(doc, dict) else None

    def write_marker(self, uri: str, doc: Mapping[str, Any]) -> None:
        """StepOutputs.write_marker: the marker's JSON (overwritten: the same facts)."""
        bucket, name = _object(uri)
        self._storage().bucket(bucket).blob(name).upload_from_string(
            json.dumps(dict(doc), sort_keys=True), content_type="application/json")


def _object(uri: str) -> tuple[str, str]:
    """(bucket, object name) of gs://bucket/name (split_gs_uri is for folders)."""
    bucket, _, name = uri.removeprefix("gs://").partition("/")
    return bucket, name
