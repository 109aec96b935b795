"""JobLauncher on Vertex AI custom jobs (aiplatform_v1): build, launch idempotently, report."""

from __future__ import annotations

import functools
import re
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import replace
from datetime import datetime, timedelta
from enum import IntEnum
from typing import TYPE_CHECKING, Any, TypeVar

from spotorch.adapters.gcp.vertex_budgets import RequestBudget
from spotorch.adapters.gcp.vertex_calls import (
    RetryPolicy,
    call_with_retries,
    classify_failure,
    emulator_channel,
    label_key,
)
from spotorch.core.model import JobPhase, JobStatus
from spotorch.core.pipeline import (
    Capacity,
    RecoveryPolicy,
    WorkerPool,
    pool_positions,
    training_world,
)
from spotorch.core.quotas import retry_is_futile
from spotorch.ports.budget import CRUD, SUBMIT, Budget
from spotorch.ports.jobs import (
    LABEL_ATTEMPT,
    LABEL_PIPELINE,
    LABEL_RUN,
    LIST_PAGE_SIZE,
    LaunchError,
    LaunchSpec,
    label_value,
)

if TYPE_CHECKING:
    from google.cloud import aiplatform_v1

T = TypeVar("T")

# Labels that identify the job of an attempt; find() and the job-state messages rely on them.

MAX_LABELS = 64
MAX_DISPLAY_NAME_LEN = 128


class JobState(IntEnum):
    """Vertex AI JobState numbers (aiplatform.v1.JobState; names without JOB_STATE_)."""

    UNSPECIFIED = 0
    QUEUED = 1
    PENDING = 2
    RUNNING = 3
    SUCCEEDED = 4
    FAILED = 5
    CANCELLING = 6
    CANCELLED = 7
    PAUSED = 8
    EXPIRED = 9
    UPDATING = 10
    PARTIALLY_SUCCEEDED = 11


def parse_job_state(value: int | str) -> JobState:
    """A JobState from its number, its full name (JOB_STATE_RUNNING) or its short name (RUNNING)."""
    if isinstance(value, int):
        return JobState(value)
    name = str(value).strip().upper().removeprefix("JOB_STATE_")
    if name.lstrip("-").isdigit():
        return JobState(int(name))
    try:
        return JobState[name]
    except KeyError:
        raise ValueError(f"unknown job state {value!r}") from None


# JobState -> phase. What a state means for a run (its failure class) is the core's to say
# (spotorch.core.recovery.classify): this adapter reports the state, the error and the exit code.
# Choices that are not 1:1:
# - UNSPECIFIED: nothing reported yet; QUEUED keeps the job non-terminal so polling goes on.
# - PAUSED: not used by custom jobs; the job is not running and not ended, i.e. waiting: QUEUED.
# - UPDATING: a change to a live resource; the workers keep running: RUNNING.
# - EXPIRED: the job never got capacity within its wait window (FLEX_START max_wait_duration):
#   FAILED, its state name reported with it (the core counts it a stockout).
# - PARTIALLY_SUCCEEDED: not used by custom jobs; a training job that did not fully succeed has
#   no trustworthy model: FAILED.
STATE_PHASES: Mapping[JobState, JobPhase] = {
    JobState.UNSPECIFIED: JobPhase.QUEUED,
    JobState.QUEUED: JobPhase.QUEUED,
    JobState.PENDING: JobPhase.PENDING,
    JobState.RUNNING: JobPhase.RUNNING,
    JobState.SUCCEEDED: JobPhase.SUCCEEDED,
    JobState.FAILED: JobPhase.FAILED,
    JobState.CANCELLING: JobPhase.CANCELLING,
    JobState.CANCELLED: JobPhase.CANCELLED,
    JobState.PAUSED: JobPhase.QUEUED,
    JobState.EXPIRED: JobPhase.FAILED,
    JobState.UPDATING: JobPhase.RUNNING,
    JobState.PARTIALLY_SUCCEEDED: JobPhase.FAILED,
}

# "The replica workerpool0-0 exited with a non-zero status of 1." and the older wordings.
_EXIT_CODE = re.compile(r"(?i)non-zero (?:exit )?status(?: code)?(?: of)?:? (-?\d+)")


def parse_exit_code(message: str) -> int | None:
    """The replica exit code in a Vertex error message, if it names one."""
    found = _EXIT_CODE.search(message or "")
    return int(found.group(1)) if found else None


def reported(job_state: int | str, error_code: int, error_message: str, *,
             started: bool | None = None, job_name: str = "") -> JobStatus:
    """What Vertex says of a job (its state and its error, a google.rpc.Status), unclassified.

    `started`: whether the job ever ran (it has a start_time); None: unknown.
    Raises ValueError for an unknown state.
    """
    state = parse_job_state(job_state)
    phase = STATE_PHASES[state]
    ended_badly = phase is JobPhase.FAILED
    return JobStatus(job_name=job_name, phase=phase,
                     exit_code=parse_exit_code(error_message) if ended_badly else None,
                     message=str(error_message or ""), error_code=int(error_code or 0),
                     state=state.name, started=started)


# --- labels -----------------------------------------------------------------------------------

def job_labels(spec: LaunchSpec) -> dict[str, str]:
    """The job's labels: the template's, then the spec's, then run/attempt/pipeline (always set)."""
    merged = {**dict(spec.template.labels), **dict(spec.labels),
              LABEL_RUN: spec.run_id, LABEL_ATTEMPT: spec.job_key,
              LABEL_PIPELINE: spec.pipeline}
    labels = {label_key(k): label_value(v) for k, v in merged.items()}
    if len(labels) > MAX_LABELS:
        raise ValueError(f"a job can carry at most {MAX_LABELS} labels, got {len(labels)}")
    return labels


_ENDED_STATES = ("JOB_STATE_SUCCEEDED", "JOB_STATE_FAILED", "JOB_STATE_CANCELLED",
                 "JOB_STATE_EXPIRED", "JOB_STATE_PARTIALLY_SUCCEEDED")
# spotorch's jobs (they all carry the run label) that have not ended.
LIVE_FILTER = f"labels.{LABEL_RUN}:* AND " + " AND ".join(f'state!="{s}"' for s in _ENDED_STATES)


def find_filter(run_id: str, attempt: int | str) -> str:
    """The list filter that finds the job of a run's attempt (or probe: its job key)."""
    return (f'labels.{LABEL_RUN}="{label_value(run_id)}" AND '
            f'labels.{LABEL_ATTEMPT}="{label_value(str(attempt))}"')


# --- building the CustomJob ---------------------------------------------------------------------

STRATEGIES: Mapping[Capacity, str] = {
    Capacity.SPOT: "SPOT",
    Capacity.STANDARD: "STANDARD",
    Capacity.FLEX_START: "FLEX_START",
}


def _env(pool: WorkerPool, spec_env: Mapping[str, str]) -> list[dict[str, str]]:
    # spotorch's contract variables win over a pool's own of the same name.
    merged = {**dict(pool.env), **dict(spec_env)}
    return [{"name": k, "value": v} for k, v in merged.items()]


def _worker_pool(v1: Any, pool: WorkerPool, spec_env: Mapping[str, str]) -> Any:
    machine: dict[str, Any] = {"machine_type": pool.machine_type}
    if pool.accelerator_type:
        if pool.accelerator_count < 1:
            raise ValueError(f"accelerator {pool.accelerator_type} needs accelerator_count >= 1")
        name = pool.accelerator_type.strip().upper().replace("-", "_")
        if name not in v1.AcceleratorType.__members__:
            raise ValueError(f"unknown accelerator type {pool.accelerator_type!r}")
        machine["accelerator_type"] = v1.AcceleratorType[name]
        machine["accelerator_count"] = pool.accelerator_count
    if pool.tpu_topology:  # MachineSpec.tpu_topology, e.g. "2x2" for a TPU slice
        machine["tpu_topology"] = pool.tpu_topology
    code: dict[str, Any]
    package = pool.python_package
    if package is not None:  # your code on a prebuilt container: no image of yours
        if not package.package_uris:
            raise ValueError("python_package has no package_uris: the pipeline's packages were "
                             "not built where it was deployed (spotorch.spec.packages)")
        code = {"python_package_spec": v1.PythonPackageSpec(
            executor_image_uri=package.executor_image_uri, package_uris=list(package.package_uris),
            python_module=package.python_module, args=list(pool.args),
            env=_env(pool, spec_env))}
    else:
        code = {"container_spec": v1.ContainerSpec(
            image_uri=pool.image_uri, command=list(pool.command), args=list(pool.args),
            env=_env(pool, spec_env))}
    return v1.WorkerPoolSpec(
        machine_spec=v1.MachineSpec(**machine),
        replica_count=pool.replica_count,
        disk_spec=v1.DiskSpec(boot_disk_type=pool.boot_disk_type,
                              boot_disk_size_gb=pool.boot_disk_size_gb),
        **code,
    )


def _worker_pools(v1: Any, pools: tuple[WorkerPool, ...], spec_env: Mapping[str, str]) -> list[Any]:
    """Every pool at its role's place in workerPoolSpecs[]; places without a pool are sent
    empty, as Vertex AI expects (an evaluator without parameter servers: [chief, {}, {}, eval])."""
    specs: list[Any] = []
    for pool, place in zip(pools, pool_positions(pools), strict=True):
        specs.extend(v1.WorkerPoolSpec() for _ in range(place - len(specs)))
        specs.append(_worker_pool(v1, pool, spec_env))
    return specs


def build_custom_job(spec: LaunchSpec) -> aiplatform_v1.CustomJob:
    """The CustomJob of an attempt (pure; raises ValueError for a spec Vertex would refuse)."""
    from google.cloud import aiplatform_v1 as v1

    template = spec.template
    if not template.worker_pools:
        raise ValueError("the job template has no worker pools")
    scheduling = v1.Scheduling(
        strategy=getattr(v1.Scheduling.Strategy, STRATEGIES[spec.capacity]),
        timeout=timedelta(seconds=template.timeout_s),
        # One replica alone resumes from its checkpoint by itself; a training world of several
        # (chief and workers in one collective, e.g. gloo or NCCL) cannot take back one
        # restarted member: every replica must restart and resume the chief's checkpoint.
        restart_job_on_worker_restart=training_world(template.worker_pools) > 1,
    )
    if spec.capacity is Capacity.FLEX_START:
        scheduling.max_wait_duration = timedelta(seconds=template.flex_max_wait_s)
    job_spec = v1.CustomJobSpec(
        worker_pool_specs=_worker_pools(v1, template.worker_pools, spec.env),
        scheduling=scheduling,
    )
    if template.service_account:
        job_spec.service_account = template.service_account
    if template.network:
        job_spec.network = template.network
    if template.base_output_uri:
        job_spec.base_output_directory = v1.GcsDestination(
            output_uri_prefix=f"{template.base_output_uri.rstrip('/')}/{spec.run_id}")
    return v1.CustomJob(display_name=spec.display_name[:MAX_DISPLAY_NAME_LEN] or spec.run_id,
                        labels=job_labels(spec), job_spec=job_spec)


def _timestamp(value: datetime | None) -> float | None:
    return None if value is None else value.timestamp()


def status_of(job: Any) -> JobStatus:
    """JobStatus of an aiplatform_v1.CustomJob: what Vertex said of it, unclassified."""
    error = job.error
    said = reported(int(job.state), int(error.code), str(error.message),
                    started=job.start_time is not None, job_name=job.name)
    return replace(said, labels=dict(job.labels), create_time=_timestamp(job.create_time),
                   start_time=_timestamp(job.start_time), end_time=_timestamp(job.end_time))


# --- calling the API ----------------------------------------------------------------------------

def parse_job_name(job_name: str) -> tuple[str, str, str]:
    """(project, region, id) of projects/P/locations/R/customJobs/ID; ValueError otherwise."""
    parts = job_name.split("/")
    if len(parts) != 6 or parts[0] != "projects" or parts[2] != "locations" \
            or parts[4] != "customJobs" or not all(parts[1::2]):
        raise ValueError(f"not a custom job name: {job_name!r}")
    return parts[1], parts[3], parts[5]


ClientFactory = Callable[[str], Any]
# (code, message) of a transient-looking refusal -> whether retrying it is futile: the core's
# quota rule (spotorch.core.quotas.retry_is_futile); wiring passes it with every pipeline's
# patterns, the default has the default recovery policy's.
Futile = Callable[[str, str], bool]


def _default_futile(code: str, message: str) -> bool:
    return retry_is_futile(code, message, (RecoveryPolicy().quota_patterns,))

# A listing's next page is worth waiting for (the budget's own wait is for launches, which a
# later tick retries): a listing cut short makes the tick ask every job of the region instead.
# Longer than the shared budget's 65-s horizon, by when every grant it counted has left.
LIST_PAGE_WAIT_S = 70.0


class VertexJobLauncher:
    """ports.JobLauncher on Vertex AI custom jobs; a client per region, created on first use."""

    def __init__(self, project: str, *, endpoint: str | None = None,
                 futile: Futile | None = None, retry: RetryPolicy | None = None,
                 client_factory: ClientFactory | None = None,
                 regions: Sequence[str] = ("us-central1",), call_timeout_s: float = 60.0,
                 budget: Budget | None = None, token: str | None = None) -> None:
        """endpoint: None for {region}-aiplatform.googleapis.com, or host:port of the emulator
        (token: the local access token sent to it; production uses Application Default
        Credentials).

        futile: which transient-looking refusals are not retried within a call (a resource
        quota's RESOURCE_EXHAUSTED): the core's rule, by default with the default quota patterns.
        regions: where find() looks (with every region this launcher has used); client_factory:
        region -> JobServiceClient-like object, for tests; budget: what each call takes first
        (spotorch.adapters.budget: this instance's own, or the one shared through Firestore).
        """
        self.project = project
        self.endpoint = endpoint
        self._token = token
        self.futile: Futile = futile or _default_futile
        self.retry = retry or RetryPolicy()
        self.call_timeout_s = call_timeout_s
        self.budget: Budget = budget or RequestBudget()
        self._factory = client_factory or self._real_client
        self._regions = list(dict.fromkeys(regions))
        self._clients: dict[str, Any] = {}
        self._lock = threading.Lock()

    def _real_client(self, region: str) -> Any:
        from google.cloud import aiplatform_v1 as v1

        if self.endpoint:
            from google.cloud.aiplatform_v1.services.job_service.transports.grpc import (
                JobServiceGrpcTransport,
            )

            channel = emulator_channel(self.endpoint, self._token)
            return v1.JobServiceClient(transport=JobServiceGrpcTransport(channel=channel))
        return v1.JobServiceClient(
            client_options={"api_endpoint": f"{region}-aiplatform.googleapis.com"})

    def _client(self, region: str) -> Any:
        key = "" if self.endpoint else region  # the emulator serves every region on one address
        with self._lock:
            if region not in self._regions:
                self._regions.append(region)
            if key not in self._clients:
                self._clients[key] = self._factory(region)
            return self._clients[key]

    def _parent(self, region: str) -> str:
        return f"projects/{self.project}/locations/{region}"

    def _call(self, what: str, fn: Callable[[], T]) -> T:
        """Run fn, retrying transient API errors; every failure becomes a LaunchError (a
        futile one, e.g. a resource quota, at once: the next try is refused the same way)."""
        return call_with_retries(what, fn, self.retry, LaunchError, futile=self.futile)

    def _find_in(self, region: str, run_id: str, attempt: int | str) -> JobStatus | None:
        client = self._client(region)  # inside _call: building a client can fail (credentials)
        self.budget.take(region, (CRUD,))
        request = {"parent": self._parent(region), "filter": find_filter(run_id, attempt)}
        jobs = list(client.list_custom_jobs(request=request, timeout=self.call_timeout_s))
        if not jobs:
            return None
        # Two jobs for one attempt should not exist; if they do, the newest is the one to follow.
        newest = max(jobs, key=lambda j: _timestamp(j.create_time) or 0.0)
        return status_of(newest)

    def launch(self, spec: LaunchSpec) -> str:
        """Create the attempt's job, or return the one that already carries its labels."""
        try:
            job = build_custom_job(spec)
        except ValueError as exc:
            raise LaunchError(f"invalid job for {spec.run_id} attempt {spec.attempt}: {exc}",
                              permanent=True, code="INVALID_ARGUMENT") from exc

        def find_or_create() -> str:
            # Looking again on every retry: a create that timed out may have created the job.
            existing = self._find_in(spec.region, spec.run_id, spec.job_key)
            if existing is not None:
                return existing.job_name
            self.budget.take(spec.region, (CRUD, SUBMIT))
            created = self._client(spec.region).create_custom_job(
                parent=self._parent(spec.region), custom_job=job, timeout=self.call_timeout_s)
            return str(created.name)

        return self._call(f"launch {spec.run_id} attempt {spec.attempt}", find_or_create)

    def find(self, run_id: str, attempt: int) -> JobStatus | None:
        """The job of a run's attempt in any known region, or None."""
        with self._lock:
            regions = list(self._regions)
        for region in regions:
            found = self._call(f"find {run_id} attempt {attempt} in {region}",
                               functools.partial(self._find_in, region, run_id, attempt))
            if found is not None:
                return found
        return None

    def list_live(self, region: str) -> Iterator[JobStatus]:
        """spotorch's live jobs in a region, a page (LIST_PAGE_SIZE jobs) per request."""
        request = {"parent": self._parent(region), "filter": LIVE_FILTER,
                   "page_size": LIST_PAGE_SIZE}
        # The first page; each next page takes its own.
        self.budget.take(region, (CRUD,), max_wait_s=LIST_PAGE_WAIT_S)
        pager = self._call(f"list live jobs in {region}", lambda: self._client(region)
                           .list_custom_jobs(request=request, timeout=self.call_timeout_s))
        pages = iter(getattr(pager, "pages", [pager]))
        while True:
            try:  # a page that fails ends the listing: the caller falls back to GetCustomJob
                page = next(pages, None)
                if page is not None and bool(getattr(page, "next_page_token", None)):
                    self.budget.take(region, (CRUD,), max_wait_s=LIST_PAGE_WAIT_S)
            except Exception as exc:
                code, transient = classify_failure(exc)
                raise LaunchError(f"list live jobs in {region}: {code}: {exc}",
                                  permanent=not transient, code=code) from exc
            if page is None:
                return
            for job in getattr(page, "custom_jobs", page):
                yield status_of(job)

    def get(self, job_name: str) -> JobStatus:
        """Current status of a job; LaunchError(code NOT_FOUND) when it does not exist."""
        region = self._region_of(job_name)
        self.budget.take(region, (CRUD,))
        job = self._call(f"get {job_name}", lambda: self._client(region).get_custom_job(
            name=job_name, timeout=self.call_timeout_s))
        return status_of(job)

    def cancel(self, job_name: str) -> None:
        """Ask a job to stop; an ended or unknown job is left as it is."""
        region = self._region_of(job_name)
        self.budget.take(region, (CRUD,))
        try:
            self._call(f"cancel {job_name}", lambda: self._client(region).cancel_custom_job(
                name=job_name, timeout=self.call_timeout_s))
        except LaunchError as exc:
            if exc.code == "NOT_FOUND":
                return
            # Vertex refuses to cancel an ended job with FAILED_PRECONDITION; anything else is real.
            if exc.code != "FAILED_PRECONDITION":
                raise
            status = self.get(job_name)
            if not (status.phase.terminal or status.phase is JobPhase.CANCELLING):
                raise

    def _region_of(self, job_name: str) -> str:
        try:
            return parse_job_name(job_name)[1]
        except ValueError as exc:
            raise LaunchError(str(exc), permanent=True, code="INVALID_ARGUMENT") from exc
