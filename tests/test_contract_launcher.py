"""One contract suite for JobLauncher; one subclass per implementation: the in-memory launcher,
the Vertex launcher over a fake JobService, and the Vertex launcher over the local emulator
(the real aiplatform_v1 client over gRPC)."""

from __future__ import annotations

import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from spotorch.adapters.gcp.vertex import VertexJobLauncher
from spotorch.adapters.gcp.vertex_calls import RetryPolicy
from spotorch.adapters.memory.twins import InMemoryLauncher
from spotorch.core.model import JobPhase, JobStatus
from spotorch.core.pipeline import Capacity, JobTemplate, WorkerPool
from spotorch.ports.jobs import LABEL_ATTEMPT, LABEL_RUN, JobLauncher, LaunchError, LaunchSpec, label_value

REGION = "us-central1"
LIVE = (JobPhase.QUEUED, JobPhase.PENDING, JobPhase.RUNNING)


def spec(run_id: str, attempt: int = 1, command: tuple[str, ...] = ()) -> LaunchSpec:
    pool = WorkerPool(command=command or (sys.executable, "-c", "import time; time.sleep(30)"))
    return LaunchSpec(run_id=run_id, pipeline="contract", attempt=attempt,
                      capacity=Capacity.SPOT, region=REGION,
                      template=JobTemplate(worker_pools=(pool,), regions=(REGION,)),
                      env={"SPOTORCH_RUN_ID": run_id},
                      labels={LABEL_RUN: run_id, LABEL_ATTEMPT: str(attempt)},
                      display_name=f"spotorch-{run_id}-a{attempt}")


def eventually(check: Callable[[], bool], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.05)


class JobLauncherContract:
    """What every JobLauncher does; subclasses provide `launcher` and `make_succeed`."""

    @pytest.fixture
    def launcher(self) -> JobLauncher:
        raise NotImplementedError

    def make_succeed(self, launcher: JobLauncher, job_name: str) -> None:
        """Bring the job to SUCCEEDED the way this implementation's world does."""
        raise NotImplementedError

    @pytest.fixture
    def run_id(self) -> str:
        return f"c-{uuid.uuid4().hex[:10]}"

    def test_launch_names_a_live_job_whose_labels_name_the_attempt(
            self, launcher: JobLauncher, run_id: str) -> None:
        name = launcher.launch(spec(run_id))
        assert name.startswith("projects/") and f"/locations/{REGION}/customJobs/" in name
        assert name.rsplit("/", 1)[1].isdigit()  # log-sink entries carry this numeric id
        status = launcher.get(name)
        assert status.job_name == name and status.phase in LIVE
        assert status.labels[LABEL_RUN] == label_value(run_id)
        assert status.labels[LABEL_ATTEMPT] == "1"

    def test_launching_the_same_attempt_again_adopts_the_job(
            self, launcher: JobLauncher, run_id: str) -> None:
        first = launcher.launch(spec(run_id))
        assert launcher.launch(spec(run_id)) == first
        assert launcher.launch(spec(run_id, attempt=2)) != first

    def test_find_by_run_and_attempt(self, launcher: JobLauncher, run_id: str) -> None:
        name = launcher.launch(spec(run_id))
        found = launcher.find(run_id, 1)
        assert found is not None and found.job_name == name
        assert launcher.find(run_id, 2) is None and launcher.find("c-nobody", 1) is None

    def test_an_unknown_job_is_not_found(self, launcher: JobLauncher) -> None:
        name = f"projects/p/locations/{REGION}/customJobs/987654321"
        with pytest.raises(LaunchError) as err:
            launcher.get(name)
        assert err.value.code == "NOT_FOUND"
        launcher.cancel(name)  # quiet

    def test_cancel_stops_a_live_job(self, launcher: JobLauncher, run_id: str) -> None:
        name = launcher.launch(spec(run_id))
        launcher.cancel(name)
        assert launcher.get(name).phase in (JobPhase.CANCELLING, JobPhase.CANCELLED)
        eventually(lambda: launcher.get(name).phase is JobPhase.CANCELLED)
        launcher.cancel(name)  # cancelling an ended job is not an error
        assert launcher.get(name).phase is JobPhase.CANCELLED

    def test_list_live_shows_live_jobs_with_their_labels_and_not_ended_ones(
            self, launcher: JobLauncher, run_id: str) -> None:
        live = launcher.launch(spec(run_id))
        done = launcher.launch(spec(run_id, attempt=2, command=(sys.executable, "-c", "pass")))
        self.make_succeed(launcher, done)
        eventually(lambda: launcher.get(done).phase is JobPhase.SUCCEEDED)
        listed = {s.job_name: s for s in launcher.list_live(REGION)}
        assert live in listed and done not in listed
        assert listed[live].labels[LABEL_RUN] == label_value(run_id)
        assert listed[live].phase in LIVE
        assert list(launcher.list_live("europe-west4")) == []

    def test_a_job_that_succeeds_says_so(self, launcher: JobLauncher, run_id: str) -> None:
        name = launcher.launch(spec(run_id, command=(sys.executable, "-c", "pass")))
        self.make_succeed(launcher, name)
        eventually(lambda: launcher.get(name).phase is JobPhase.SUCCEEDED)
        status: JobStatus = launcher.get(name)
        assert status.failure is None
        launcher.cancel(name)
        assert launcher.get(name).phase is JobPhase.SUCCEEDED


class TestInMemoryLauncher(JobLauncherContract):
    @pytest.fixture
    def launcher(self) -> JobLauncher:
        return InMemoryLauncher()

    def make_succeed(self, launcher: JobLauncher, job_name: str) -> None:
        assert isinstance(launcher, InMemoryLauncher)
        launcher.set_status(job_name, JobPhase.SUCCEEDED)


class TestVertexLauncherOnAFakeJobService(JobLauncherContract):
    @pytest.fixture
    def launcher(self) -> JobLauncher:
        from test_vertex_launcher import FakeJobService

        self.fake = FakeJobService()
        retry = RetryPolicy(attempts=2, base_s=0.0, cap_s=0.0, sleep=lambda s: None,
                            jitter=lambda: 1.0)
        return VertexJobLauncher("p", client_factory=lambda region: self.fake, retry=retry,
                                 regions=(REGION,))

    def make_succeed(self, launcher: JobLauncher, job_name: str) -> None:
        from google.cloud import aiplatform_v1 as v1

        self.fake.jobs[job_name].state = v1.JobState.JOB_STATE_SUCCEEDED

    def test_cancel_stops_a_live_job(self, launcher: JobLauncher, run_id: str) -> None:
        from google.cloud import aiplatform_v1 as v1

        name = launcher.launch(spec(run_id))
        launcher.cancel(name)
        assert launcher.get(name).phase is JobPhase.CANCELLING
        self.fake.jobs[name].state = v1.JobState.JOB_STATE_CANCELLED  # what Vertex does next
        super().test_cancel_stops_a_live_job(launcher, run_id)


@pytest.mark.emulator
class TestVertexLauncherOnTheEmulator(JobLauncherContract):
    @pytest.fixture
    def launcher(self, tmp_path: Path) -> Iterator[JobLauncher]:
        from spotorch.local.vertex_emulator import VertexEmulator

        emulator = VertexEmulator("spotorch-test", workdir=tmp_path, grace_s=0.5, queued_s=0.05,
                                  pending_s=0.05, tick_s=0.02, job_events_topic=None)
        address = emulator.start()
        try:
            yield VertexJobLauncher("spotorch-test", endpoint=address,
                                    retry=RetryPolicy(attempts=2, base_s=0.01),
                                    regions=(REGION,))
        finally:
            emulator.stop()

    def make_succeed(self, launcher: JobLauncher, job_name: str) -> None:
        pass  # its worker runs `python -c pass` and exits 0
