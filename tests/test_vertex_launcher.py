"""VertexJobLauncher without a network: the CustomJob it builds, classification, retries."""

from __future__ import annotations

import itertools
import re
import subprocess
import sys
from collections.abc import Iterable
from datetime import timedelta
from typing import Any

import pytest
from google.api_core import exceptions as api
from google.cloud import aiplatform_v1 as v1

from classifying import classify
from spotorch.adapters.gcp.vertex import (
    STATE_PHASES,
    JobState,
    VertexJobLauncher,
    build_custom_job,
    find_filter,
    parse_exit_code,
    parse_job_state,
)
from spotorch.adapters.gcp.vertex_calls import RetryPolicy, label_key
from spotorch.core.model import FailureClass, JobPhase
from spotorch.core.pipeline import Capacity, JobTemplate, RecoveryPolicy, WorkerPool
from spotorch.core.recovery import classify as core_classify
from spotorch.local._vertex_filter import matches, parse_filter
from spotorch.ports.jobs import LABEL_ATTEMPT, LABEL_PIPELINE, LABEL_RUN, LaunchError, LaunchSpec, label_value

REGION = "europe-west4"


def status_of(error: Exception) -> str:
    """The gRPC status name google.api_core attaches to its exception classes."""
    kind: Any = type(error)
    return str(kind.grpc_status_code.name)


def gpu_spec(capacity: Capacity = Capacity.SPOT, attempt: int = 2, **template: Any) -> LaunchSpec:
    chief = WorkerPool(machine_type="a2-highgpu-4g", replica_count=1,
                       accelerator_type="NVIDIA_TESLA_A100", accelerator_count=4,
                       boot_disk_type="pd-ssd", boot_disk_size_gb=200,
                       image_uri="europe-docker.pkg.dev/p/train/img:1",
                       command=("python", "-m", "train"), args=("--epochs", "3"),
                       env=(("NCCL_DEBUG", "INFO"), ("SPOTORCH_ATTEMPT", "stale")))
    workers = WorkerPool(machine_type="a2-highgpu-4g", replica_count=3,
                         accelerator_type="nvidia-tesla-a100", accelerator_count=4,
                         boot_disk_type="pd-balanced", boot_disk_size_gb=150,
                         image_uri="europe-docker.pkg.dev/p/train/img:1",
                         command=("python", "-m", "train"))
    defaults: dict[str, Any] = dict(
        worker_pools=(chief, workers), regions=(REGION,),
        service_account="trainer@p.iam.gserviceaccount.com",
        network="projects/123/global/networks/vpc", labels=(("team", "Vision ML"),),
        timeout_s=3600.0, flex_max_wait_s=1800.0, base_output_uri="gs://models/demo/")
    defaults.update(template)
    return LaunchSpec(
        run_id="demo-20261129-abc", pipeline="demo", attempt=attempt, capacity=capacity,
        region=REGION, template=JobTemplate(**defaults),
        env={"SPOTORCH_RUN_ID": "demo-20261129-abc", "SPOTORCH_ATTEMPT": str(attempt)},
        labels={LABEL_RUN: "demo-20261129-abc", LABEL_ATTEMPT: str(attempt),
                LABEL_PIPELINE: "demo"},
        display_name=f"spotorch demo-20261129-abc attempt {attempt}")


# --- building the request -------------------------------------------------------------------------

def test_multi_worker_gpu_spot_job_has_every_field() -> None:
    job = build_custom_job(gpu_spec())
    assert job.display_name == "spotorch demo-20261129-abc attempt 2"
    assert job.labels[LABEL_RUN] == "demo-20261129-abc"
    assert job.labels[LABEL_ATTEMPT] == "2" and job.labels[LABEL_PIPELINE] == "demo"
    assert job.labels["team"].startswith("vision-ml-")  # sanitized, with a hash of the original
    spec = job.job_spec
    assert spec.service_account == "trainer@p.iam.gserviceaccount.com"
    assert spec.network == "projects/123/global/networks/vpc"
    assert spec.base_output_directory.output_uri_prefix == "gs://models/demo/demo-20261129-abc"
    assert spec.scheduling.strategy == v1.Scheduling.Strategy.SPOT
    assert spec.scheduling.timeout == timedelta(hours=1)
    # Four replicas in one training world: one restarted alone could not rejoin it.
    assert spec.scheduling.restart_job_on_worker_restart is True
    assert not spec.scheduling.max_wait_duration
    chief, workers = spec.worker_pool_specs
    assert chief.replica_count == 1 and workers.replica_count == 3
    for pool in (chief, workers):
        assert pool.machine_spec.machine_type == "a2-highgpu-4g"
        assert pool.machine_spec.accelerator_type == v1.AcceleratorType.NVIDIA_TESLA_A100
        assert pool.machine_spec.accelerator_count == 4
        assert pool.container_spec.image_uri == "europe-docker.pkg.dev/p/train/img:1"
        assert list(pool.container_spec.command) == ["python", "-m", "train"]
    assert (chief.disk_spec.boot_disk_type, chief.disk_spec.boot_disk_size_gb) == ("pd-ssd", 200)
    assert (workers.disk_spec.boot_disk_type, workers.disk_spec.boot_disk_size_gb) == \
        ("pd-balanced", 150)
    assert list(chief.container_spec.args) == ["--epochs", "3"]
    chief_env = {e.name: e.value for e in chief.container_spec.env}
    # spotorch's contract variables win over a pool's stale value of the same name.
    assert chief_env == {"NCCL_DEBUG": "INFO", "SPOTORCH_RUN_ID": "demo-20261129-abc",
                         "SPOTORCH_ATTEMPT": "2"}
    assert {e.name for e in workers.container_spec.env} == {"SPOTORCH_RUN_ID", "SPOTORCH_ATTEMPT"}


@pytest.mark.parametrize(("capacity", "strategy", "max_wait"), [
    (Capacity.STANDARD, v1.Scheduling.Strategy.STANDARD, None),
    (Capacity.FLEX_START, v1.Scheduling.Strategy.FLEX_START, timedelta(minutes=30)),
])
def test_capacity_sets_the_scheduling_strategy(capacity: Capacity, strategy: Any,
                                               max_wait: timedelta | None) -> None:
    scheduling = build_custom_job(gpu_spec(capacity)).job_spec.scheduling
    assert scheduling.strategy == strategy
    assert (scheduling.max_wait_duration or None) == max_wait


def test_minimal_template_leaves_optional_fields_unset() -> None:
    spec = gpu_spec(worker_pools=(WorkerPool(command=("true",)),), service_account=None,
                    network=None, base_output_uri=None, labels=())
    job = build_custom_job(spec)
    assert not job.job_spec.service_account and not job.job_spec.network
    assert "base_output_directory" not in job.job_spec
    machine = job.job_spec.worker_pool_specs[0].machine_spec
    assert machine.accelerator_count == 0 and not machine.accelerator_type


@pytest.mark.parametrize(("raw", "clean"), [
    ("demo-1", "demo-1"),
    ("a_b-9", "a_b-9"),
    ("", ""),
])
def test_valid_label_values_pass_unchanged(raw: str, clean: str) -> None:
    assert label_value(raw) == clean


@pytest.mark.parametrize("raw", ["Demo-1", "demo-1", "run/2026 11 29", "x" * 80, "Ünïcode"])
def test_label_values_are_always_valid_and_distinct(raw: str) -> None:
    clean = label_value(raw)
    assert re.fullmatch(r"[a-z0-9_-]{0,63}", clean)
    assert label_value(raw) == clean  # deterministic: find() sanitizes the same way
    assert label_value(raw.upper()) != clean or raw.upper() == raw


def test_label_keys_start_with_a_letter() -> None:
    assert label_key("team") == "team"
    for raw in ("9lives", "_x", "Team"):
        assert label_key(raw)[0].isalpha() and label_key(raw)[0].islower()


def test_find_filter_uses_sanitized_labels() -> None:
    text = find_filter("Run 1", 3)
    terms = parse_filter(text)
    assert matches(terms, {LABEL_RUN: label_value("Run 1"), LABEL_ATTEMPT: "3"}, "x", "")
    assert not matches(terms, {LABEL_RUN: label_value("Run 1"), LABEL_ATTEMPT: "4"}, "x", "")


def test_a_spec_vertex_would_refuse_is_a_permanent_launch_error() -> None:
    bad = gpu_spec(worker_pools=(WorkerPool(accelerator_type="NVIDIA_TPU_9000",
                                            accelerator_count=1, command=("x",)),))
    client = FakeJobService()
    launcher = VertexJobLauncher("p", client_factory=lambda region: client)
    with pytest.raises(LaunchError) as err:
        launcher.launch(bad)
    assert err.value.permanent and err.value.code == "INVALID_ARGUMENT"
    assert client.calls == []


# --- states and classification --------------------------------------------------------------------

@pytest.mark.parametrize(("state", "phase", "failure"), [
    (JobState.UNSPECIFIED, JobPhase.QUEUED, None),
    (JobState.QUEUED, JobPhase.QUEUED, None),
    (JobState.PENDING, JobPhase.PENDING, None),
    (JobState.RUNNING, JobPhase.RUNNING, None),
    (JobState.SUCCEEDED, JobPhase.SUCCEEDED, None),
    (JobState.FAILED, JobPhase.FAILED, FailureClass.INFRA),  # no error at all: Google's side
    (JobState.CANCELLING, JobPhase.CANCELLING, None),
    (JobState.CANCELLED, JobPhase.CANCELLED, FailureClass.CANCELLED),
    (JobState.PAUSED, JobPhase.QUEUED, None),
    (JobState.EXPIRED, JobPhase.FAILED, FailureClass.STOCKOUT),
    (JobState.UPDATING, JobPhase.RUNNING, None),
    (JobState.PARTIALLY_SUCCEEDED, JobPhase.FAILED, FailureClass.INFRA),
])
def test_every_job_state_maps_to_a_phase(state: JobState, phase: JobPhase,
                                         failure: FailureClass | None) -> None:
    assert classify(state, 0, "") == (phase, failure, None)
    assert classify(f"JOB_STATE_{state.name}", 0, "")[0] is phase


def test_the_table_covers_every_vertex_state() -> None:
    assert {s.name for s in STATE_PHASES} == {
        n.removeprefix("JOB_STATE_") for n in v1.JobState.__members__}
    assert all(JobState[n.removeprefix("JOB_STATE_")] == int(v)
               for n, v in v1.JobState.__members__.items())


def test_job_state_parses_numbers_and_names() -> None:
    assert parse_job_state(5) is parse_job_state("JOB_STATE_FAILED") is JobState.FAILED
    assert parse_job_state("failed") is JobState.FAILED
    assert parse_job_state("3") is JobState.RUNNING
    with pytest.raises(ValueError):
        parse_job_state("JOB_STATE_EXPLODED")


NONZERO = ("The replica workerpool0-0 exited with a non-zero status of {}. Termination reason: "
           "Error. To find out more about why your job exited please check the logs: "
           "https://console.cloud.google.com/logs/viewer?project=spotorch-prod&resource=ml_job")


@pytest.mark.parametrize(("code", "message", "started", "failure", "exit_code"), [
    (3, NONZERO.format(1), True, FailureClass.USER_ERROR, 1),
    # SIGKILL without an out-of-memory signal: the VM or the kernel, not the code (issue 27)
    (3, NONZERO.format(137), True, FailureClass.INFRA, 137),
    (3, NONZERO.format(143), True, FailureClass.PREEMPTED, 143),  # trainer's EXIT_PREEMPTED
    (3, "Replica exited with a non-zero status code 2", None, FailureClass.USER_ERROR, 2),
    (8, "Job failed due to STOCKOUT: the Spot VMs were preempted", True,
     FailureClass.PREEMPTED, None),
    (14, "The Spot VM was preempted.", None, FailureClass.PREEMPTED, None),
    (8, "Resources are insufficient in region: us-central1. Please try a different region.",
     False, FailureClass.STOCKOUT, None),
    (8, "Job failed due to STOCKOUT.", False, FailureClass.STOCKOUT, None),
    (8, "Job failed due to STOCKOUT.", True, FailureClass.PREEMPTED, None),
    (8, "The following quota metrics exceed quota limits: aiplatform.googleapis.com/"
        "custom_model_training_nvidia_a100_gpus", False, FailureClass.QUOTA, None),
    (13, "Internal error occurred for the current attempt.", True, FailureClass.INFRA, None),
    # The project name must not make an internal error look like a Spot problem.
    (13, "Internal error in projects/spotorch-prod/locations/us-central1/customJobs/1", True,
     FailureClass.INFRA, None),
    (4, "Job exceeded its scheduling timeout of 3600 seconds.", True, FailureClass.TIMEOUT, None),
    (4, "", True, FailureClass.TIMEOUT, None),
    (1, "CANCELED", True, FailureClass.CANCELLED, None),
    (7, "Permission denied on bucket gs://x", False, FailureClass.USER_ERROR, None),
    (0, "", None, FailureClass.INFRA, None),
])
def test_failed_jobs_are_classified(code: int, message: str, started: bool | None,
                                    failure: FailureClass, exit_code: int | None) -> None:
    assert classify(JobState.FAILED, code, message,
                    started=started) == (JobPhase.FAILED, failure, exit_code)


def test_patterns_come_from_the_recovery_policy() -> None:
    policy = RecoveryPolicy(preemption_patterns=("(?i)reclaimed",), infra_patterns=("(?i)gremlin",),
                            timeout_patterns=("(?i)too slow",))
    assert classify(5, 0, "VM reclaimed", policy, started=True)[1] is FailureClass.PREEMPTED
    assert classify(5, 0, "a gremlin", policy)[1] is FailureClass.INFRA
    assert classify(5, 0, "too slow", policy)[1] is FailureClass.TIMEOUT
    # the default "preempt" pattern is gone: the error code decides
    assert classify(5, 13, "preempted", policy)[1] is FailureClass.INFRA


def test_exit_code_parsing() -> None:
    assert parse_exit_code(NONZERO.format(42)) == 42
    assert parse_exit_code("all good") is None


# --- the API calls, on a fake JobService ---------------------------------------------------------

class FakeJobService:
    """A JobServiceClient double: keeps CustomJobs, fails on demand, counts calls."""

    def __init__(self) -> None:
        self.jobs: dict[str, Any] = {}
        self.calls: list[str] = []
        self.failures: dict[str, list[Exception]] = {}
        self.lose_create_response = False
        self._ids = itertools.count(100)

    def fail(self, method: str, *errors: Exception) -> None:
        self.failures.setdefault(method, []).extend(errors)

    def _enter(self, method: str) -> None:
        self.calls.append(method)
        pending = self.failures.get(method)
        if pending:
            raise pending.pop(0)

    def create_custom_job(self, *, parent: str, custom_job: Any, timeout: float) -> Any:
        self._enter("create")
        job = v1.CustomJob.deserialize(v1.CustomJob.serialize(custom_job))
        job.name = f"{parent}/customJobs/{next(self._ids)}"
        job.state = v1.JobState.JOB_STATE_QUEUED
        self.jobs[job.name] = job
        if self.lose_create_response:  # created, but the answer never came back
            self.lose_create_response = False
            raise api.DeadlineExceeded("deadline exceeded")
        return job

    def list_custom_jobs(self, *, request: dict[str, str], timeout: float) -> Iterable[Any]:
        self._enter("list")
        terms = parse_filter(request["filter"])
        return [j for n, j in self.jobs.items() if n.startswith(request["parent"])
                and matches(terms, j.labels, j.display_name, v1.JobState(j.state).name)]

    def get_custom_job(self, *, name: str, timeout: float) -> Any:
        self._enter("get")
        if name not in self.jobs:
            raise api.NotFound(f"{name} not found")
        return self.jobs[name]

    def cancel_custom_job(self, *, name: str, timeout: float) -> None:
        self._enter("cancel")
        if name not in self.jobs:
            raise api.NotFound(f"{name} not found")
        job = self.jobs[name]
        if job.state in (v1.JobState.JOB_STATE_SUCCEEDED, v1.JobState.JOB_STATE_FAILED,
                         v1.JobState.JOB_STATE_CANCELLED):
            raise api.FailedPrecondition("job already ended")
        job.state = v1.JobState.JOB_STATE_CANCELLING


@pytest.fixture
def fake() -> FakeJobService:
    return FakeJobService()


@pytest.fixture
def sleeps() -> list[float]:
    return []


@pytest.fixture
def launcher(fake: FakeJobService, sleeps: list[float]) -> VertexJobLauncher:
    retry = RetryPolicy(attempts=4, base_s=0.5, cap_s=1.5, sleep=sleeps.append,
                        jitter=lambda: 1.0)
    return VertexJobLauncher("p", client_factory=lambda region: fake, retry=retry,
                             regions=(REGION,))


def test_launch_creates_once_and_adopts_the_job_afterwards(launcher: VertexJobLauncher,
                                                           fake: FakeJobService) -> None:
    name = launcher.launch(gpu_spec())
    assert name.startswith(f"projects/p/locations/{REGION}/customJobs/")
    assert launcher.launch(gpu_spec()) == name  # the same run and attempt: adopted
    assert fake.calls.count("create") == 1
    other = launcher.launch(gpu_spec(attempt=3))
    assert other != name and fake.calls.count("create") == 2
    found = launcher.find("demo-20261129-abc", 2)
    assert found is not None and found.job_name == name and found.phase is JobPhase.QUEUED


def test_a_create_whose_answer_was_lost_is_adopted_on_retry(launcher: VertexJobLauncher,
                                                            fake: FakeJobService,
                                                            sleeps: list[float]) -> None:
    fake.lose_create_response = True
    name = launcher.launch(gpu_spec())
    assert fake.calls == ["list", "create", "list"]  # looked again instead of creating twice
    assert list(fake.jobs) == [name] and len(sleeps) == 1


@pytest.mark.parametrize("error", [
    api.ServiceUnavailable("down"), api.DeadlineExceeded("slow"),
    api.ResourceExhausted("rate"), api.Aborted("contention"),
])
def test_transient_errors_are_retried_with_capped_backoff(launcher: VertexJobLauncher,
                                                          fake: FakeJobService,
                                                          sleeps: list[float],
                                                          error: Exception) -> None:
    name = launcher.launch(gpu_spec())
    fake.fail("get", error, error)
    assert launcher.get(name).job_name == name
    assert sleeps == [0.5, 1.0]
    fake.fail("get", *[error] * 4)
    with pytest.raises(LaunchError) as err:
        launcher.get(name)
    assert not err.value.permanent and err.value.code == status_of(error)
    assert sleeps[2:] == [0.5, 1.0, 1.5]  # capped at cap_s


def test_backoff_has_full_jitter() -> None:
    draws = iter([0.0, 0.5, 0.25])
    retry = RetryPolicy(base_s=2.0, cap_s=100.0, jitter=lambda: next(draws))
    assert [retry.delay(i) for i in range(3)] == [0.0, 2.0, 2.0]


@pytest.mark.parametrize(("error", "code"), [
    (api.InvalidArgument("bad"), "INVALID_ARGUMENT"),
    (api.PermissionDenied("no"), "PERMISSION_DENIED"),
    (api.NotFound("gone"), "NOT_FOUND"),
    (api.FailedPrecondition("no"), "FAILED_PRECONDITION"),
    (api.InternalServerError("oops"), "INTERNAL"),
    (api.Unauthenticated("who"), "UNAUTHENTICATED"),
])
def test_permanent_errors_are_not_retried(launcher: VertexJobLauncher, fake: FakeJobService,
                                          sleeps: list[float], error: Exception,
                                          code: str) -> None:
    fake.fail("create", error)
    with pytest.raises(LaunchError) as err:
        launcher.launch(gpu_spec())
    assert err.value.permanent and err.value.code == code
    assert fake.calls == ["list", "create"] and sleeps == []


def test_get_maps_the_job(launcher: VertexJobLauncher, fake: FakeJobService) -> None:
    name = launcher.launch(gpu_spec())
    job = fake.jobs[name]
    job.state = v1.JobState.JOB_STATE_FAILED
    job.start_time = {"seconds": 1_800_000_000}
    job.error = {"code": 3, "message": NONZERO.format(2)}
    status = launcher.get(name)
    # what Vertex said, unclassified; the core classifies it (spotorch.core.recovery)
    assert (status.phase, status.failure, status.exit_code, status.error_code, status.state,
            status.started) == (JobPhase.FAILED, None, 2, 3, "FAILED", True)
    assert core_classify(status) is FailureClass.USER_ERROR
    assert status.start_time == 1_800_000_000 and status.labels[LABEL_ATTEMPT] == "2"
    with pytest.raises(LaunchError) as err:
        launcher.get(name.replace(name.rsplit("/", 1)[1], "999"))
    assert err.value.code == "NOT_FOUND" and err.value.permanent
    with pytest.raises(LaunchError) as err:
        launcher.get("not-a-job-name")
    assert err.value.code == "INVALID_ARGUMENT"


def test_cancel_is_quiet_for_ended_and_unknown_jobs(launcher: VertexJobLauncher,
                                                    fake: FakeJobService) -> None:
    name = launcher.launch(gpu_spec())
    launcher.cancel(name)
    assert fake.jobs[name].state == v1.JobState.JOB_STATE_CANCELLING
    fake.jobs[name].state = v1.JobState.JOB_STATE_CANCELLED
    launcher.cancel(name)  # FAILED_PRECONDITION on an ended job: fine
    launcher.cancel(f"projects/p/locations/{REGION}/customJobs/404")  # NOT_FOUND: nothing to stop
    fake.jobs[name].state = v1.JobState.JOB_STATE_RUNNING
    fake.fail("cancel", api.FailedPrecondition("something else"))
    with pytest.raises(LaunchError) as err:  # refused while still running: a real problem
        launcher.cancel(name)
    assert err.value.code == "FAILED_PRECONDITION"


def test_find_looks_in_every_known_region(fake: FakeJobService) -> None:
    launcher = VertexJobLauncher("p", client_factory=lambda region: fake,
                                 regions=("us-central1",))
    assert launcher.find("demo-20261129-abc", 2) is None
    name = launcher.launch(gpu_spec())  # in REGION, which the launcher now knows
    found = launcher.find("demo-20261129-abc", 2)
    assert found is not None and found.job_name == name


def test_the_real_client_is_built_per_region_and_cached(monkeypatch: pytest.MonkeyPatch) -> None:
    built: list[str] = []
    launcher = VertexJobLauncher("p")
    def factory(region: str) -> object:
        built.append(region)
        return object()

    monkeypatch.setattr(launcher, "_factory", factory)
    assert launcher._client("us-central1") is launcher._client("us-central1")
    launcher._client("europe-west4")
    assert built == ["us-central1", "europe-west4"]
    emulated = VertexJobLauncher("p", endpoint="127.0.0.1:1")
    client = emulated._client("us-central1")
    assert emulated._client("asia-east1") is client  # one emulator serves every region
    assert type(client).__name__ == "JobServiceClient"


def test_importing_the_modules_does_not_import_the_client() -> None:
    code = ("import sys, spotorch.adapters.gcp.vertex, spotorch.entrypoints.log_entries; "
            "assert 'google.cloud.aiplatform_v1' not in sys.modules, 'imported'")
    subprocess.run([sys.executable, "-c", code], check=True)
