"""The JobLogs port's contract: the in-memory twin, and the Cloud Logging adapter (the real
google-cloud-logging GAPIC client) against the Vertex emulator's ListLogEntries, fed by a real
job whose worker writes to stdout and stderr and exits 1."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import grpc
import pytest

from spotorch.adapters.gcp.job_logs import CloudLoggingJobLogs, error_filter
from spotorch.adapters.gcp.vertex import VertexJobLauncher
from spotorch.adapters.gcp.vertex_calls import RetryPolicy
from spotorch.adapters.memory.twins import InMemoryJobLogs
from spotorch.core.model import JobPhase
from spotorch.core.pipeline import Capacity, JobTemplate, WorkerPool
from spotorch.local._vertex_quota import QuotaLimits
from spotorch.local.vertex_emulator import VertexEmulator
from spotorch.ports.job_logs import JobLogs, LogReadError
from spotorch.ports.jobs import LABEL_ATTEMPT, LABEL_RUN, LaunchSpec

PROJECT = "spotorch-test"
# (job's stderr lines) -> the job's name, once those lines were written (and some on stdout).
Writer = Callable[[Sequence[str]], str]


class JobLogsContract:
    """What every JobLogs adapter does."""

    @pytest.fixture
    def world(self) -> Iterator[tuple[JobLogs, Writer]]:
        raise NotImplementedError

    def test_the_newest_lines_oldest_first_only_stderr(
            self, world: tuple[JobLogs, Writer]) -> None:
        logs, write = world
        lines = [f"line {i}" for i in range(30)] + ["RuntimeError: my bug at step 5"]
        job = write(lines)
        assert logs.error_tail(job, since=time.time() - 3600, limit=20) == tuple(lines[-20:])
        assert logs.error_tail(job, since=None, limit=3) == tuple(lines[-3:])

    def test_a_job_without_stderr_or_unknown_gives_nothing(
            self, world: tuple[JobLogs, Writer]) -> None:
        logs, write = world
        quiet = write([])
        assert logs.error_tail(quiet, since=None, limit=20) == ()
        unknown = quiet.rsplit("/", 1)[0] + "/987654321"
        assert logs.error_tail(unknown, since=None, limit=20) == ()

    def test_lines_before_since_are_not_read(self, world: tuple[JobLogs, Writer]) -> None:
        logs, write = world
        job = write(["too early"])
        assert logs.error_tail(job, since=time.time() + 3600, limit=20) == ()


class TestInMemoryJobLogs(JobLogsContract):
    @pytest.fixture
    def world(self) -> Iterator[tuple[JobLogs, Writer]]:
        logs = InMemoryJobLogs()
        count = iter(range(1, 10**6))

        def write(lines: Sequence[str]) -> str:
            job = f"projects/{PROJECT}/locations/us-central1/customJobs/{next(count)}"
            logs.write(job, *lines, at=time.time())
            return job

        yield logs, write

    def test_a_failure_to_read_is_a_log_read_error(self) -> None:
        logs = InMemoryJobLogs(fail_next=1)
        with pytest.raises(LogReadError):
            logs.error_tail("projects/p/locations/r/customJobs/1", since=None, limit=5)


WORKER = """
import json, sys
print("an ordinary line on stdout", flush=True)
for line in json.loads(sys.argv[1]):
    print(line, file=sys.stderr, flush=True)
sys.exit(1)
"""


@pytest.mark.emulator
class TestCloudLoggingOnTheVertexEmulator(JobLogsContract):
    @pytest.fixture
    def world(self, tmp_path: Path) -> Iterator[tuple[JobLogs, Writer]]:
        emulator = VertexEmulator(PROJECT, workdir=tmp_path, grace_s=0.5, queued_s=0.05,
                                  pending_s=0.05, tick_s=0.02, job_events_topic=None,
                                  quotas=QuotaLimits.unlimited())
        address = emulator.start()
        launcher = VertexJobLauncher(PROJECT, endpoint=address,
                                     retry=RetryPolicy(attempts=2, base_s=0.01))
        count = iter(range(1, 10**6))

        def write(lines: Sequence[str]) -> str:
            n = next(count)
            command = (sys.executable, "-c", WORKER, json.dumps(list(lines)))
            template = JobTemplate(worker_pools=(WorkerPool(command=command),))
            job = launcher.launch(LaunchSpec(
                run_id=f"r{n}", pipeline="demo", attempt=1, capacity=Capacity.STANDARD,
                region="us-central1", template=template, env={},
                labels={LABEL_RUN: f"r{n}", LABEL_ATTEMPT: "1"}, display_name=f"r{n}"))
            deadline = time.monotonic() + 30
            while launcher.get(job).phase is not JobPhase.FAILED:
                assert time.monotonic() < deadline, "the job did not fail"
                time.sleep(0.05)
            return job

        try:
            yield CloudLoggingJobLogs(PROJECT, endpoint=address), write
        finally:
            emulator.stop()

    def test_a_filter_it_does_not_understand_is_refused(self, world: tuple[JobLogs, Writer]
                                                        ) -> None:
        logs, _ = world
        assert isinstance(logs, CloudLoggingJobLogs)
        with pytest.raises(Exception) as raised:
            logs.client.list_log_entries(request={"resource_names": [f"projects/{PROJECT}"],
                                                  "filter": 'jsonPayload.x =~ "y"'})
        assert getattr(raised.value, "code", None) is not None or \
            isinstance(raised.value, grpc.RpcError)
        assert "does not understand" in str(raised.value)

    def test_the_filter_is_the_one_gcloud_uses_narrowed_to_the_replicas_errors(self) -> None:
        text = error_filter("projects/p/locations/r/customJobs/42", 1_800_000_000.0)
        assert text.startswith('resource.type="ml_job" AND resource.labels.job_id="42"')
        assert 'resource.labels.task_name!="service"' in text and "severity>=ERROR" in text
        assert 'timestamp>="2027-01-15T08:00:00.000000Z"' in text
