"""The local Vertex AI emulator, driven through the real aiplatform_v1 client and the launcher."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, TypeVar

import grpc
import pytest
from google.api_core import exceptions as api
from google.cloud import aiplatform_v1 as v1
from google.cloud.aiplatform_v1.services.job_service.transports.grpc import (
    JobServiceGrpcTransport,
)

from spotorch.adapters.gcp.vertex import JobState, VertexJobLauncher
from spotorch.adapters.gcp.vertex_calls import RetryPolicy
from spotorch.core.model import FailureClass, JobPhase, JobStatus
from spotorch.core.pipeline import Capacity, JobTemplate, PoolRole, WorkerPool
from spotorch.core.recovery import classify as core_classify
from spotorch.local._vertex_logs import LogFormat, LogFormatError
from spotorch.local._vertex_quota import QuotaLimits
from spotorch.local._vertex_schedule import (
    PreemptRule,
    ScheduleError,
    SpotSchedule,
    SpotTrace,
    Window,
    parse_schedule,
)
from spotorch.local.emulators import EmulatorSet
from spotorch.local.vertex_emulator import READY_LINE, EmulatorError, VertexEmulator
from spotorch.ports.jobs import LABEL_ATTEMPT, LABEL_RUN, LaunchSpec

PROJECT = "spotorch-test"
REGION = "us-central1"
T = TypeVar("T")

# A worker that reports SIGTERM in a file and exits 143, as the trainer does on preemption.
TRAP = """
import pathlib, signal, sys, time
out = pathlib.Path(sys.argv[1])
def on_term(signum, frame):
    out.write_text("SIGTERM")
    sys.exit(143)
signal.signal(signal.SIGTERM, on_term)
pathlib.Path(sys.argv[1] + ".ready").write_text(str(__import__("os").getpid()))
time.sleep(60)
"""
DEAF = """
import pathlib, signal, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
pathlib.Path(sys.argv[1] + ".ready").write_text("ready")
time.sleep(60)
"""


def wait_for(fn: Callable[[], T | None], timeout: float = 20.0, what: str = "condition") -> T:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = fn()
        if value:
            return value
        time.sleep(0.03)
    raise AssertionError(f"timed out waiting for {what}")


def spec(run: str, attempt: int, *command: str, capacity: Capacity = Capacity.SPOT,
         pools: tuple[WorkerPool, ...] | None = None, env: Mapping[str, str] | None = None,
         base_output_uri: str | None = None) -> LaunchSpec:
    template = JobTemplate(worker_pools=pools or (WorkerPool(command=command),),
                           base_output_uri=base_output_uri)
    return LaunchSpec(run_id=run, pipeline="demo", attempt=attempt, capacity=capacity,
                      region=REGION, template=template, env=dict(env or {}),
                      labels={LABEL_RUN: run, LABEL_ATTEMPT: str(attempt)},
                      display_name=f"{run} attempt {attempt}")


class Harness:
    """An emulator, a launcher on the real client, and the state changes it reported."""

    def __init__(self, **options: Any) -> None:
        # No quotas by default: these tests poll every 30 ms (test_quotas_* turns them on).
        options = {"grace_s": 0.5, "queued_s": 0.05, "pending_s": 0.05, "tick_s": 0.02,
                   "job_events_topic": None, "quotas": QuotaLimits.unlimited(), **options}
        self.events: list[Mapping[str, Any]] = []
        self.emulator = VertexEmulator(PROJECT, listener=self.events.append, **options)
        self.address = self.emulator.start()
        self.launcher = VertexJobLauncher(PROJECT, endpoint=self.address,
                                          retry=RetryPolicy(attempts=2, base_s=0.01))

    def states(self, job_name: str) -> list[str]:
        return [s.name for s in self.emulator.states(job_name)]

    def lines(self, job_name: str) -> list[str]:
        """The service lines logged for a job, in order (what a log sink would deliver)."""
        job_id = job_name.rsplit("/", 1)[1]
        return [e["textPayload"] for e in list(self.events)
                if e["resource"]["labels"]["job_id"] == job_id]

    def until(self, job_name: str, phase: JobPhase, timeout: float = 20.0) -> JobStatus:
        return wait_for(lambda: s if (s := self.launcher.get(job_name)).phase is phase else None,
                        timeout, f"{job_name} {phase}")

    def raw_client(self) -> Any:
        channel = grpc.insecure_channel(self.address)
        return v1.JobServiceClient(transport=JobServiceGrpcTransport(channel=channel))


@pytest.fixture
def harness(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[..., Harness]]:
    started: list[Harness] = []

    def start(**options: Any) -> Harness:
        options.setdefault("workdir", tmp_path_factory.mktemp("vertex"))
        started.append(Harness(**options))
        return started[-1]

    yield start
    for h in started:
        h.emulator.stop()


def test_a_job_runs_its_command_to_success(harness: Callable[..., Harness], tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", "http://127.0.0.1:9")  # the emulator's own env
    h = harness()
    out = tmp_path / "env.json"
    code = ("import json, os, sys; json.dump(dict(os.environ), open(sys.argv[1], 'w')); "
            "print('trained')")
    pool = WorkerPool(command=("python3", "-c", code), args=(str(out),),
                      env=(("POOL_VAR", "p"),))
    name = h.launcher.launch(spec("r-ok", 1, pools=(pool,), env={"SPOTORCH_RUN_ID": "r-ok"},
                                  base_output_uri="gs://models/demo"))
    status = h.until(name, JobPhase.SUCCEEDED)
    assert core_classify(status) is None and status.message == ""
    assert status.create_time and status.start_time and status.end_time
    assert status.create_time <= status.start_time <= status.end_time
    env = json.loads(out.read_text())
    assert env["AIP_MODEL_DIR"] == "gs://models/demo/r-ok/model"
    assert env["AIP_CHECKPOINT_DIR"] == "gs://models/demo/r-ok/checkpoints"
    assert env["AIP_TENSORBOARD_LOG_DIR"] == "gs://models/demo/r-ok/logs"
    assert env["CLOUD_ML_JOB_ID"] == name.rsplit("/", 1)[1]
    assert json.loads(env["TF_CONFIG"])["task"] == {"type": "chief", "index": 0}
    assert json.loads(env["CLUSTER_SPEC"])["task"] == {"type": "workerpool0", "index": 0}
    assert (env["POOL_VAR"], env["SPOTORCH_RUN_ID"]) == ("p", "r-ok")
    assert env["STORAGE_EMULATOR_HOST"] == "http://127.0.0.1:9"
    assert "trained" in (h.emulator.log_dir(name) / "workerpool0-0.log").read_text()
    wait_for(lambda: "SUCCEEDED" in h.states(name))
    assert h.states(name) == ["QUEUED", "PENDING", "RUNNING", "SUCCEEDED"]
    wait_for(lambda: "Job completed successfully." in h.lines(name))
    assert h.lines(name) == [
        "Waiting for job to be provisioned.", "Vertex AI is setting up this job.",
        "Job is preparing.", "Job is running.", "Tearing down training program.",
        "Finished tearing down training program.", "Job completed successfully."]


def test_a_nonzero_exit_fails_the_job_with_its_exit_code(harness: Callable[..., Harness]) -> None:
    h = harness()
    name = h.launcher.launch(spec("r-bad", 1, "sh", "-c", "echo oops >&2; exit 3"))
    status = h.until(name, JobPhase.FAILED)
    assert (core_classify(status), status.exit_code) == (FailureClass.USER_ERROR, 3)
    assert "workerpool0-0 exited with a non-zero status of 3" in status.message
    # stderr apart from stdout, as Vertex logs them (ERROR and INFO entries)
    assert "oops" in (h.emulator.log_dir(name) / "workerpool0-0.stderr").read_text()
    assert (h.emulator.log_dir(name) / "workerpool0-0.log").read_text() == ""
    job = h.raw_client().get_custom_job(name=name)
    assert job.error.code == 3 and job.state == v1.JobState.JOB_STATE_FAILED


def test_a_command_that_cannot_start_fails_like_exit_127(harness: Callable[..., Harness]) -> None:
    h = harness()
    name = h.launcher.launch(spec("r-none", 1, "/nonexistent/trainer"))
    status = h.until(name, JobPhase.FAILED)
    assert (core_classify(status), status.exit_code) == (FailureClass.USER_ERROR, 127)


def test_spot_jobs_are_preempted_by_schedule_and_standard_jobs_never(
        harness: Callable[..., Harness], tmp_path: Path) -> None:
    h = harness(schedule=[{"attempt": 1, "after_s": 1.5}])
    spot_file = tmp_path / "spot"
    spot = h.launcher.launch(spec("r-spot", 1, "python", "-c", TRAP, str(spot_file)))
    finish = "import time; time.sleep(2.5)"
    standard = h.launcher.launch(spec("r-std", 1, "python", "-c", finish,
                                      capacity=Capacity.STANDARD))
    other = h.launcher.launch(spec("r-spot", 2, "python", "-c", finish))  # attempt 2: no rule
    status = h.until(spot, JobPhase.FAILED)
    assert Path(f"{spot_file}.ready").exists()
    assert spot_file.read_text() == "SIGTERM"  # the worker had its chance to checkpoint
    assert core_classify(status) is FailureClass.PREEMPTED and status.exit_code is None
    assert "STOCKOUT" in status.message and "preempted" in status.message
    assert status.start_time is not None and status.end_time is not None
    assert status.end_time - status.start_time >= 1.4
    assert h.until(standard, JobPhase.SUCCEEDED).failure is None
    assert h.until(other, JobPhase.SUCCEEDED).failure is None
    assert h.states(spot)[-2:] == ["RUNNING", "FAILED"]


def test_a_worker_that_ignores_sigterm_is_killed_after_the_grace_period(
        harness: Callable[..., Harness], tmp_path: Path) -> None:
    h = harness(grace_s=0.6)
    name = h.launcher.launch(spec("r-deaf", 1, "python", "-c", DEAF, str(tmp_path / "deaf")))
    h.until(name, JobPhase.RUNNING)
    wait_for(lambda: (tmp_path / "deaf.ready").exists(), what="worker ready")
    preempted_at = time.time()
    assert h.emulator.preempt(name)
    status = h.until(name, JobPhase.FAILED)
    assert core_classify(status) is FailureClass.PREEMPTED
    assert status.end_time is not None and status.end_time - preempted_at >= 0.55
    assert not h.emulator.preempt(name)  # ended: nothing to preempt


def test_a_stockout_window_keeps_spot_jobs_queued(harness: Callable[..., Harness]) -> None:
    h = harness(stockout_from_s=0.0, stockout_for_s=3.0)
    quick = "print('done')"
    spot = h.launcher.launch(spec("r-so", 1, "python", "-c", quick))
    standard = h.launcher.launch(spec("r-so-std", 1, "python", "-c", quick,
                                      capacity=Capacity.STANDARD))
    h.until(standard, JobPhase.SUCCEEDED)  # standard capacity is unaffected
    assert h.launcher.get(spot).phase is JobPhase.QUEUED
    time.sleep(0.5)
    assert h.launcher.get(spot).phase is JobPhase.QUEUED
    status = h.until(spot, JobPhase.SUCCEEDED)  # capacity came back after the window
    assert status.start_time is not None and status.create_time is not None
    assert status.start_time - status.create_time >= 2.5


def test_a_trace_replay_preempts_and_queues_spot_jobs(harness: Callable[..., Harness],
                                                      tmp_path: Path) -> None:
    trace = tmp_path / "trace.json"
    trace.write_text(json.dumps({"metadata": {"gap_seconds": 300}, "data": [1, 0, 1]}))
    # 300 trace seconds per tick at speed 200: capacity for 1.5 s, none for 1.5 s, then back.
    h = harness(trace=trace, trace_speed=200.0)
    running = h.launcher.launch(spec("r-tr", 1, "python", "-c", "import time; time.sleep(60)"))
    h.until(running, JobPhase.RUNNING)
    status = h.until(running, JobPhase.FAILED)
    assert core_classify(status) is FailureClass.PREEMPTED
    late = h.launcher.launch(spec("r-tr", 2, "python", "-c", "print(1)"))
    time.sleep(0.4)
    assert h.launcher.get(late).phase is JobPhase.QUEUED  # no capacity yet
    assert h.until(late, JobPhase.SUCCEEDED).failure is None


def test_cancel_stops_queued_and_running_jobs(harness: Callable[..., Harness],
                                              tmp_path: Path) -> None:
    h = harness()
    flag = tmp_path / "cancelled"
    running = h.launcher.launch(spec("r-c", 1, "python", "-c", TRAP, str(flag),
                                     capacity=Capacity.STANDARD))
    queued = h.launcher.launch(spec("r-c", 2, "python", "-c", "print(1)"))
    h.emulator.schedule = SpotSchedule(stockouts=(Window(0.0),))  # keep the SPOT job queued
    h.until(running, JobPhase.RUNNING)
    wait_for(lambda: Path(f"{flag}.ready").exists(), what="worker ready")
    h.launcher.cancel(running)
    h.launcher.cancel(queued)
    for name in (running, queued):
        status = h.until(name, JobPhase.CANCELLED)
        assert core_classify(status) is FailureClass.CANCELLED
        assert h.raw_client().get_custom_job(name=name).error.code == 1
    assert flag.read_text() == "SIGTERM"
    assert h.states(running)[-2:] == ["CANCELLING", "CANCELLED"]
    h.launcher.cancel(running)  # already ended: not an error
    with pytest.raises(api.FailedPrecondition):
        h.raw_client().cancel_custom_job(name=running)
    with pytest.raises(api.NotFound):
        h.raw_client().get_custom_job(name=f"projects/{PROJECT}/locations/{REGION}/customJobs/1")


def test_list_filters_by_labels_and_pages(harness: Callable[..., Harness]) -> None:
    h = harness(stockout_from_s=0.0)  # every SPOT job stays queued
    names = {(run, attempt): h.launcher.launch(spec(run, attempt, "true"))
             for run in ("r-a", "r-b") for attempt in (1, 2)}
    assert len(set(names.values())) == 4
    found = h.launcher.find("r-b", 2)
    assert found is not None and found.job_name == names[("r-b", 2)]
    assert found.phase is JobPhase.QUEUED and found.labels[LABEL_RUN] == "r-b"
    assert h.launcher.find("r-c", 1) is None
    client = h.raw_client()
    parent = f"projects/{PROJECT}/locations/{REGION}"
    by_run = [j.name for j in client.list_custom_jobs(
        request={"parent": parent, "filter": f'labels.{LABEL_RUN}="r-a"'})]
    assert sorted(by_run) == sorted([names[("r-a", 1)], names[("r-a", 2)]])
    paged = list(client.list_custom_jobs(request={"parent": parent, "page_size": 1}))
    assert len(paged) == 4
    assert not list(client.list_custom_jobs(
        request={"parent": f"projects/{PROJECT}/locations/europe-west4"}))
    assert len(list(client.list_custom_jobs(
        request={"parent": parent, "filter": 'state="JOB_STATE_QUEUED"'}))) == 4
    with pytest.raises(api.InvalidArgument):
        list(client.list_custom_jobs(request={"parent": parent, "filter": "labels.x OR y"}))
    with pytest.raises(api.PermissionDenied):
        list(client.list_custom_jobs(request={"parent": "projects/other/locations/us-central1"}))


def test_jobs_vertex_would_refuse_are_refused(harness: Callable[..., Harness]) -> None:
    client = harness().raw_client()
    parent = f"projects/{PROJECT}/locations/{REGION}"
    pool = {"machine_spec": {"machine_type": "n1-standard-4"}, "replica_count": 1,
            "container_spec": {"image_uri": "img", "command": ["true"]}}
    bad_jobs: list[dict[str, Any]] = [
        {"display_name": "x", "labels": {"Bad Key": "v"},
         "job_spec": {"worker_pool_specs": [pool]}},
        {"display_name": "", "job_spec": {"worker_pool_specs": [pool]}},
        {"display_name": "x", "job_spec": {"worker_pool_specs": []}},
        {"display_name": "x", "job_spec": {"worker_pool_specs": [
            {**pool, "container_spec": {"image_uri": "img"}}]}},
    ]
    for job in bad_jobs:
        with pytest.raises(api.InvalidArgument):
            client.create_custom_job(parent=parent, custom_job=job)
    with pytest.raises(api.InvalidArgument):
        client.create_custom_job(parent="projects/x", custom_job=bad_jobs[1])


def test_every_replica_of_every_pool_runs(harness: Callable[..., Harness],
                                          tmp_path: Path) -> None:
    h = harness()
    code = ("import json, os, sys; t = json.loads(os.environ['TF_CONFIG']); "
            "open(os.path.join(sys.argv[1], t['task']['type'] + str(t['task']['index'])), 'w')"
            ".write(os.environ['CLUSTER_SPEC'])")
    # The primary's exit ends the job (the others are shut down): it waits for the workers.
    wait = ("; import time; d = time.time() + 20\n"
            "while len(os.listdir(sys.argv[1])) < 3 and time.time() < d: time.sleep(0.05)")
    chief = WorkerPool(command=("python", "-c", code + wait), args=(str(tmp_path),))
    workers = WorkerPool(replica_count=2, command=("python", "-c", code), args=(str(tmp_path),))
    name = h.launcher.launch(spec("r-multi", 1, pools=(chief, workers)))
    h.until(name, JobPhase.SUCCEEDED)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["chief0", "worker0", "worker1"]
    cluster = json.loads((tmp_path / "worker1").read_text())["cluster"]
    assert [len(cluster["workerpool0"]), len(cluster["workerpool1"])] == [1, 2]
    logs = sorted(p.name for p in h.emulator.log_dir(name).iterdir())
    assert logs == [f"workerpool{p}-{i}.{kind}" for p, i in ((0, 0), (1, 0), (1, 1))
                    for kind in ("log", "stderr")]


def test_one_failing_replica_fails_the_job_and_stops_the_others(
        harness: Callable[..., Harness], tmp_path: Path) -> None:
    h = harness()
    chief = WorkerPool(command=("python", "-c", TRAP), args=(str(tmp_path / "chief"),))
    worker = WorkerPool(command=("sh", "-c", "sleep 0.5; exit 7"))
    name = h.launcher.launch(spec("r-partial", 1, pools=(chief, worker)))
    status = h.until(name, JobPhase.FAILED)
    assert (core_classify(status), status.exit_code) == (FailureClass.USER_ERROR, 7)
    assert "workerpool1-0" in status.message
    wait_for(lambda: (tmp_path / "chief").exists(), what="chief stopped")


# --- schedules and traces (pure) ------------------------------------------------------------------

def test_schedules_parse_from_json() -> None:
    schedule = parse_schedule({"preempt": [{"attempt": 1, "after_s": 20},
                                           {"run": "r-x", "after_s": 5}],
                               "every_spot_job_after_s": 60,
                               "stockouts": [{"from_s": 10, "for_s": 5}, {"from_s": 100}]})
    assert schedule.rules == (PreemptRule(20.0, attempt=1), PreemptRule(5.0, run="r-x"))
    assert schedule.preempt_after({LABEL_ATTEMPT: "1", LABEL_RUN: "r-x"}) == 5.0
    assert schedule.preempt_after({LABEL_ATTEMPT: "1", LABEL_RUN: "r-y"}) == 20.0
    assert schedule.preempt_after({LABEL_ATTEMPT: "2"}) == 60.0
    assert [schedule.spot_available(t) for t in (0, 10, 14.9, 15, 99, 100, 1e9)] == \
        [True, False, False, True, True, False, False]
    assert parse_schedule([{"after_s": 3}]).preempt_after({}) == 3.0
    assert SpotSchedule().preempt_after({LABEL_ATTEMPT: "1"}) is None


def test_a_rule_can_name_one_replica_and_then_spares_the_rest_of_the_job() -> None:
    schedule = parse_schedule([{"attempt": 1, "after_s": 4, "pool": 1, "index": 2},
                               {"attempt": 2, "after_s": 9}])
    assert schedule.rules[0].replica == "workerpool1-2" and schedule.rules[1].replica is None
    assert schedule.preempt_after({LABEL_ATTEMPT: "1"}) is None  # not the whole job
    assert schedule.replica_rules({LABEL_ATTEMPT: "1"}) == [(0, schedule.rules[0])]
    assert schedule.replica_rules({LABEL_ATTEMPT: "2"}) == []


def test_a_rule_can_name_the_end_of_a_run_id_one_trial_of_a_sweep() -> None:
    """Issue 38: a sweep's id is not known ahead; its trial 3 is the run whose id ends -t3."""
    schedule = parse_schedule([{"attempt": 1, "run_suffix": "-t3", "after_s": 9}])
    assert schedule.preempt_after({LABEL_ATTEMPT: "1", LABEL_RUN: "demo-abc-t3"}) == 9.0
    assert schedule.preempt_after({LABEL_ATTEMPT: "1", LABEL_RUN: "demo-abc-t13"}) is None
    assert schedule.preempt_after({LABEL_ATTEMPT: "2", LABEL_RUN: "demo-abc-t3"}) is None
    with pytest.raises(ScheduleError, match="run_suffix"):
        parse_schedule([{"run_suffix": "", "after_s": 1}])


def test_a_schedule_loses_the_messages_of_the_jobs_it_names() -> None:
    schedule = parse_schedule({"drop_events": [{"attempt": 2}, {"run": "r-deaf"}]})
    assert schedule.drops_events_of({LABEL_ATTEMPT: "2", LABEL_RUN: "r-a"})
    assert schedule.drops_events_of({LABEL_ATTEMPT: "1", LABEL_RUN: "r-deaf"})
    assert not schedule.drops_events_of({LABEL_ATTEMPT: "1", LABEL_RUN: "r-a"})
    assert not SpotSchedule().drops_events_of({LABEL_ATTEMPT: "2"})


@pytest.mark.parametrize("bad", [
    {"preempt": [{"attempt": 1}]},
    {"preempt": [{"after_s": -1}]},
    {"preempt": [{"after_s": 1, "atempt": 2}]},
    {"preempt": [{"after_s": 1, "attempt": "1"}]},
    {"stockouts": [{"from_s": "soon"}]},
    {"every_spot_job_after_s": True},
    {"surprise": 1},
    {"drop_events": [{"attempt": 2, "after_s": 1}]},
    {"drop_events": {"attempt": 2}},
    {"preempt": [{"after_s": 1, "pool": 4}]},
    {"preempt": [{"after_s": 1, "pool": "1"}]},
    {"preempt": [{"after_s": 1, "index": 1}]},
    "nonsense",
])
def test_bad_schedules_are_refused(bad: Any) -> None:
    with pytest.raises(ScheduleError):
        parse_schedule(bad)
    with pytest.raises(EmulatorError):
        VertexEmulator(schedule=bad if not isinstance(bad, str) else {"x": bad})


def test_traces_replay_at_speed_and_wrap() -> None:
    trace = SpotTrace(values=(1, 0, 2), gap_s=30.0, speed=10.0)
    assert [trace.available(t) for t in (0.0, 2.9, 3.0, 5.9, 6.0, 9.0)] == \
        [True, True, False, False, True, True]
    assert SpotTrace(values=(1, 0), gap_s=30.0, offset=1).available(0.0) is False


def test_the_shared_traces_load() -> None:
    root = Path(__file__).resolve().parent.parent / "shared/spotorch/sim/traces/preemption/1-node"
    files = sorted(root.glob("*/*.json"))
    assert files, f"the traces ship with the repository: none under {root}"
    trace = SpotTrace.load(files[0], speed=100.0)
    assert trace.gap_s > 0 and set(trace.values) <= {0, 1} and len(trace.values) > 100


# --- Pub/Sub and the command line -----------------------------------------------------------------

def _subscription(project: str) -> tuple[Any, str, str]:
    from google.cloud import pubsub_v1

    topic_name = f"vertex-events-{uuid.uuid4().hex[:8]}"
    publisher, subscriber = pubsub_v1.PublisherClient(), pubsub_v1.SubscriberClient()
    topic = publisher.topic_path(project, topic_name)
    publisher.create_topic(name=topic)
    subscription = subscriber.subscription_path(project, topic_name)
    subscriber.create_subscription(name=subscription, topic=topic)
    return subscriber, subscription, topic_name


def _pull(subscriber: Any, subscription: str, seconds: float,
          last: str = "Job completed successfully.") -> list[Any]:
    messages: list[Any] = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        with contextlib.suppress(api.DeadlineExceeded):
            response = subscriber.pull(request={"subscription": subscription,
                                                "max_messages": 50}, timeout=2)
            if response.received_messages:
                subscriber.acknowledge(request={"subscription": subscription, "ack_ids": [
                    m.ack_id for m in response.received_messages]})
                messages += [m.message for m in response.received_messages]
                if any(json.loads(m.message.data).get("textPayload") == last
                       for m in response.received_messages):
                    return messages
    return messages


ENTRY_KEYS = {"logName", "resource", "textPayload", "timestamp", "receiveTimestamp", "severity",
              "insertId"}


@pytest.mark.emulator
def test_state_changes_arrive_on_pubsub_as_a_log_sink_exports_them(
        emulators: EmulatorSet, harness: Callable[..., Harness]) -> None:
    subscriber, subscription, topic = _subscription(emulators.project)
    h = harness(job_events_topic=topic)
    name = h.launcher.launch(spec("r-ps", 3, "python", "-c", "print('hi')"))
    h.until(name, JobPhase.SUCCEEDED)
    messages = _pull(subscriber, subscription, 15.0)
    job_id = name.rsplit("/", 1)[1]
    entries = [json.loads(m.data) for m in messages]
    for message, entry in zip(messages, entries, strict=True):
        # Nothing a real sink would not send: no run, attempt, state, region or error code.
        assert dict(message.attributes) == {
            "logging.googleapis.com/timestamp": entry["timestamp"]}
        assert set(entry) == ENTRY_KEYS
        assert entry["logName"] == f"projects/{PROJECT}/logs/ml.googleapis.com%2F{job_id}"
        assert entry["resource"] == {"type": "ml_job", "labels": {
            "job_id": job_id, "project_id": PROJECT, "task_name": "service"}}
        assert entry["severity"] == "INFO"
        assert entry["receiveTimestamp"] >= entry["timestamp"].rstrip("Z")
        assert entry["timestamp"].endswith("Z")
    assert "r-ps" not in json.dumps(entries) and REGION not in json.dumps(entries)
    assert len({e["insertId"] for e in entries}) == len(entries)
    ordered = [e["textPayload"] for e in sorted(entries, key=lambda e: e["timestamp"])]
    assert ordered[0] == "Waiting for job to be provisioned."
    assert ordered[-1] == "Job completed successfully."
    assert sorted(ordered) == sorted(h.lines(name))


def test_failure_and_cancel_lines_are_configurable_and_can_go_to_json_payload(
        harness: Callable[..., Harness], tmp_path: Path) -> None:
    fmt = LogFormat.from_json({"payload": "jsonPayload.message", "lines": {
        "FAILED": [{"text": "Job failed: {error_message}", "severity": "ERROR"}],
        "JOB_STATE_QUEUED": []}})
    h = harness(log_format=fmt)
    name = h.launcher.launch(spec("r-fmt", 1, "sh", "-c", "exit 4"))
    h.until(name, JobPhase.FAILED)
    wait_for(lambda: any(e["severity"] == "ERROR" for e in list(h.events)), what="failure line")
    assert all("textPayload" not in e and set(e["jsonPayload"]) == {"message"} for e in h.events)
    messages = [e["jsonPayload"]["message"] for e in h.events]
    assert "Waiting for job to be provisioned." not in messages  # QUEUED writes nothing now
    assert messages[-1].startswith("Job failed: The replica workerpool0-0 exited with a "
                                   "non-zero status of 4.")
    bad: dict[str, Any]
    for bad in ({"lines": {"EXPLODED": []}}, {"payload": "protoPayload"},
                {"lines": {"FAILED": ["{exit_code}"]}}, {"lines": {"FAILED": "Job failed."}},
                {"lines": {"FAILED": [{"text": "x", "severity": "LOUD"}]}}, {"extra": 1}):
        with pytest.raises(LogFormatError):
            LogFormat.from_json(bad)


def test_quotas_answer_resource_exhausted_per_region(harness: Callable[..., Harness]) -> None:
    h = harness(quotas=QuotaLimits(resource_management=8, job_submission=2, window_s=1.5))
    client = h.raw_client()
    parent = f"projects/{PROJECT}/locations/{REGION}"
    job = {"display_name": "q", "job_spec": {"worker_pool_specs": [
        {"machine_spec": {"machine_type": "n1-standard-4"}, "replica_count": 1,
         "container_spec": {"image_uri": "img", "command": ["sleep", "30"]}}]}}
    started = time.monotonic()
    names = [client.create_custom_job(parent=parent, custom_job=job).name for _ in range(2)]
    with pytest.raises(api.ResourceExhausted, match="Job or LRO submission requests"):
        client.create_custom_job(parent=parent, custom_job=job)
    # Another region has its own quota.
    other = f"projects/{PROJECT}/locations/europe-west4"
    client.create_custom_job(parent=other, custom_job=job)
    # 2 creates + 1 refused (not charged) = 2 of 8 CRUD requests used in us-central1.
    for _ in range(6):
        client.get_custom_job(name=names[0])
    with pytest.raises(api.ResourceExhausted, match="Resource management"):
        client.get_custom_job(name=names[0])
    with pytest.raises(api.ResourceExhausted):
        list(client.list_custom_jobs(parent=parent))
    assert time.monotonic() - started < 1.5, "the test ran too slowly to see the window"
    time.sleep(1.6)  # the window slides: quota is back
    assert client.get_custom_job(name=names[0]).name == names[0]
    assert client.create_custom_job(parent=parent, custom_job=job).name


def test_default_quotas_are_vertex_defaults() -> None:
    limits = VertexEmulator(PROJECT).quotas
    assert (limits.resource_management, limits.job_submission, limits.window_s) == \
        (600, 60, 60.0)


def test_jobs_survive_a_restart_and_lost_workers_fail(harness: Callable[..., Harness],
                                                      tmp_path: Path) -> None:
    workdir = tmp_path / "vertex"
    h = harness(workdir=workdir, persist=True, stockout_from_s=0.0)
    running = h.launcher.launch(spec("r-p", 1, "python", "-c", DEAF, str(tmp_path / "deaf"),
                                     capacity=Capacity.STANDARD))
    done = h.launcher.launch(spec("r-p", 2, "true", capacity=Capacity.STANDARD))
    queued = h.launcher.launch(spec("r-p", 3, "true"))  # SPOT, no capacity: stays queued
    h.until(done, JobPhase.SUCCEEDED)
    h.until(running, JobPhase.RUNNING)
    wait_for(lambda: (tmp_path / "deaf.ready").exists(), what="worker ready")
    h.emulator.stop()
    assert (workdir / "jobs.json").exists()
    again = harness(workdir=workdir, persist=True)  # Spot capacity is back
    assert again.launcher.get(done).phase is JobPhase.SUCCEEDED
    lost = again.launcher.get(running)
    assert lost.phase is JobPhase.FAILED and "lost" in lost.message
    assert again.emulator.states(running)[-2:] == [JobState.RUNNING, JobState.FAILED]
    assert again.until(queued, JobPhase.SUCCEEDED).failure is None  # carried on
    assert again.launcher.find("r-p", 1) is not None  # List knows the old jobs too
    assert not list(_live_workers(tmp_path / "deaf"))
    fresh = harness(workdir=tmp_path / "other", persist=True)
    with pytest.raises(api.NotFound):
        fresh.raw_client().get_custom_job(name=done)


@pytest.mark.emulator
def test_dropped_state_messages_leave_polling_to_tell(emulators: EmulatorSet,
                                                      harness: Callable[..., Harness]) -> None:
    subscriber, subscription, topic = _subscription(emulators.project)
    h = harness(job_events_topic=topic, drop_events=1.0)
    name = h.launcher.launch(spec("r-drop", 1, "true"))
    assert h.until(name, JobPhase.SUCCEEDED).failure is None  # GetCustomJob still knows
    wait_for(lambda: h.emulator.events_dropped >= 4, what="dropped events")
    assert h.emulator.events_published == 0
    assert _pull(subscriber, subscription, 1.5) == []


def test_a_scheduled_drop_loses_one_attempts_messages_and_no_other(
        emulators: EmulatorSet, harness: Callable[..., Harness]) -> None:
    subscriber, subscription, topic = _subscription(emulators.project)
    h = harness(job_events_topic=topic, schedule={"drop_events": [{"attempt": 2}]})
    deaf = h.launcher.launch(spec("r-sel", 2, "true"))
    heard = h.launcher.launch(spec("r-sel", 1, "true"))
    for name in (deaf, heard):
        assert h.until(name, JobPhase.SUCCEEDED).failure is None  # polling knows both
    wait_for(lambda: h.emulator.events_dropped >= 4 and h.emulator.events_published >= 4,
             what="dropped and published events")
    jobs = {json.loads(m.data)["resource"]["labels"]["job_id"]
            for m in _pull(subscriber, subscription, 3.0)}
    assert jobs == {heard.rsplit("/", 1)[1]}


def test_the_command_line_serves_until_sigterm_and_kills_its_workers(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "PUBSUB_EMULATOR_HOST"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "spotorch.local.vertex_emulator", "--port", "0", "--project",
         PROJECT, "--job-events-topic", "", "--grace-s", "0.5", "--queued-s", "0.05",
         "--pending-s", "0.05", "--workdir", str(tmp_path / "work")],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env, text=True)
    try:
        lines: list[str] = []
        stdout = proc.stdout
        assert stdout is not None
        reader = threading.Thread(target=lambda: lines.append(stdout.readline()))
        reader.start()
        reader.join(timeout=30)
        assert lines and lines[0].startswith("vertex emulator listening on 127.0.0.1:")
        address = lines[0].strip().rsplit(" ", 1)[1]
        assert lines[0] == READY_LINE.format(address=address) + "\n"
        launcher = VertexJobLauncher(PROJECT, endpoint=address)
        pid_file = tmp_path / "worker"
        name = launcher.launch(spec("r-cli", 1, "python", "-c", DEAF, str(pid_file),
                                    capacity=Capacity.STANDARD))
        wait_for(lambda: Path(f"{pid_file}.ready").exists(), what="worker ready")
        assert launcher.get(name).phase is JobPhase.RUNNING
        assert (tmp_path / "work").is_dir()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0
        assert stdout.read() == ""  # exactly one line
        assert not list(_live_workers(pid_file))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _live_workers(marker: Path) -> Iterator[int]:
    """Processes still running the DEAF worker of this test (found by their argument)."""
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                cmdline = (entry / "cmdline").read_bytes().split(b"\0")
                if str(marker).encode() in cmdline:
                    yield int(entry.name)


@pytest.mark.parametrize("how", ["kill -9 of the emulator", "the job ends"])
def test_workers_die_with_their_job_and_with_the_emulator(tmp_path: Path, how: str) -> None:
    """Issue 27: after kill -9 of the emulator its worker trained on and wrote checkpoints
    while the run recovered; a real VM is gone with its job. Each replica is a process group
    whose leader (the shim) has a parent-death signal: the whole group goes, children too."""
    from spotorch.local._stack_procs import group_members

    env = {k: v for k, v in os.environ.items() if k != "PUBSUB_EMULATOR_HOST"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "spotorch.local.vertex_emulator", "--port", "0", "--project",
         PROJECT, "--job-events-topic", "", "--grace-s", "0.5", "--queued-s", "0.05",
         "--pending-s", "0.05", "--workdir", str(tmp_path / "work")],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env, text=True)
    try:
        stdout = proc.stdout
        assert stdout is not None
        address = stdout.readline().strip().rsplit(" ", 1)[1]
        launcher = VertexJobLauncher(PROJECT, endpoint=address)
        # A worker with a child of its own (a data loader, a shell's job), both deaf to SIGTERM.
        worker = (f"trap '' TERM; sleep 300 & echo $! > {tmp_path}/child; "
                  f"echo $$ > {tmp_path}/worker; wait")
        name = launcher.launch(spec("r-orphan", 1, "sh", "-c", worker,
                                    capacity=Capacity.STANDARD))
        def written() -> list[int] | None:
            texts = [(tmp_path / f).read_text().strip() if (tmp_path / f).exists() else ""
                     for f in ("child", "worker")]
            return [int(t) for t in texts] if all(texts) else None

        pids = wait_for(written, what="worker and its child")
        group = os.getpgid(pids[1])
        assert group != os.getpgrp() and set(pids) <= set(group_members(group))
        if how == "the job ends":
            launcher.cancel(name)
        else:
            proc.kill()  # SIGKILL: the emulator has no chance to stop anything
            proc.wait(timeout=10)
        wait_for(lambda: not group_members(group), timeout=10, what="the replica's group gone")
        assert all(not Path(f"/proc/{pid}").exists() or
                   Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] in "ZX"
                   for pid in pids)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
# --- one replica's Spot VM preempted (what Vertex does then is undocumented: both ways) ---------

# A replica that records each start (with its CLUSTER_SPEC) and each SIGTERM, and exits 0 at a
# wall-clock time (so a replica restarted in place ends with the others).
REPLICA = """
import json, os, pathlib, signal, sys, time
task = json.loads(os.environ["CLUSTER_SPEC"])["task"]
out = pathlib.Path(sys.argv[1]) / f"{task['type']}-{task['index']}"
def note(text):
    with open(out, "a") as f:
        f.write(f"{text} {time.time():.3f}\\n")
def on_term(signum, frame):
    note("SIGTERM")
    sys.exit(143)
signal.signal(signal.SIGTERM, on_term)
note("start " + os.environ["CLUSTER_SPEC"].replace(" ", ""))
while time.time() < float(sys.argv[2]):
    time.sleep(0.05)
"""


def cluster(tmp_path: Path, end_in_s: float) -> tuple[WorkerPool, ...]:
    args = (str(tmp_path), str(time.time() + end_in_s))
    return (WorkerPool(command=("python", "-c", REPLICA), args=args),
            WorkerPool(replica_count=2, command=("python", "-c", REPLICA), args=args))


def notes(tmp_path: Path, replica: str) -> list[tuple[str, float]]:
    path = tmp_path / replica
    lines = path.read_text().splitlines() if path.exists() else []
    return [(line.split(" ", 1)[0], float(line.rsplit(" ", 1)[1])) for line in lines]


def test_one_replicas_preemption_fails_the_whole_job_by_default(
        harness: Callable[..., Harness], tmp_path: Path) -> None:
    h = harness(schedule=[{"attempt": 1, "after_s": 1.0, "pool": 1, "index": 1}])
    name = h.launcher.launch(spec("r-one", 1, pools=cluster(tmp_path, 60)))
    status = h.until(name, JobPhase.FAILED)
    assert core_classify(status) is FailureClass.PREEMPTED and status.exit_code is None
    assert "STOCKOUT" in status.message and "workerpool1-1" in status.message
    assert "workerpool1-0" not in status.message
    hit = dict(notes(tmp_path, "workerpool1-1"))
    # The preempted VM got SIGTERM first; the job's shutdown then reached the others.
    for other in ("workerpool0-0", "workerpool1-0"):
        assert dict(notes(tmp_path, other))["SIGTERM"] >= hit["SIGTERM"]
    assert [k for k, _ in notes(tmp_path, "workerpool1-1")] == ["start", "SIGTERM"]


def test_one_replicas_preemption_can_restart_it_in_place_instead(
        harness: Callable[..., Harness], tmp_path: Path) -> None:
    h = harness(schedule=[{"attempt": 1, "after_s": 1.0, "pool": 3, "index": 0}],
                replica_preemption="restart_replica")
    chief, _ = cluster(tmp_path, 4.0)
    evaluator = WorkerPool(role=PoolRole.EVALUATOR, command=chief.command, args=chief.args)
    # A chief alone trains: the job does not ask Vertex to restart everyone with a worker.
    name = h.launcher.launch(spec("r-restart", 1, pools=(chief, evaluator)))
    h.until(name, JobPhase.RUNNING)
    assert h.until(name, JobPhase.SUCCEEDED, timeout=30).failure is None
    hit = notes(tmp_path, "workerpool3-0")
    kinds = [k for k, _ in hit]  # a last SIGTERM may be the job's end (see below)
    assert kinds[:3] == ["start", "SIGTERM", "start"] and kinds.count("start") == 2
    starts = [line for line in (tmp_path / "workerpool3-0").read_text().splitlines()
              if line.startswith("start")]
    assert starts[0].rsplit(" ", 1)[0] == starts[1].rsplit(" ", 1)[0]  # same CLUSTER_SPEC
    assert [k for k, _ in notes(tmp_path, "workerpool0-0")] == ["start"]  # ran on untouched
    assert "FAILED" not in h.states(name)


def test_with_restart_job_on_worker_restart_every_replica_restarts_with_the_preempted_one(
        harness: Callable[..., Harness], tmp_path: Path) -> None:
    h = harness(schedule=[{"attempt": 1, "after_s": 1.0, "pool": 1, "index": 0}],
                replica_preemption="restart_replica")
    name = h.launcher.launch(spec("r-restart-all", 1, pools=cluster(tmp_path, 4.0)))
    assert h.raw_client().get_custom_job(name=name).job_spec.scheduling \
        .restart_job_on_worker_restart  # three replicas train together
    assert h.until(name, JobPhase.SUCCEEDED, timeout=30).failure is None
    for replica in ("workerpool0-0", "workerpool1-0", "workerpool1-1"):
        # A worker still in its last step when the primary exits 0 is stopped by the job's
        # end: a second SIGTERM after the second start is the job finishing, not a restart.
        kinds = [k for k, _ in notes(tmp_path, replica)]
        assert kinds[:3] == ["start", "SIGTERM", "start"] and kinds.count("start") == 2


def test_the_job_succeeds_when_its_primary_exits_0_and_the_others_are_shut_down(
        harness: Callable[..., Harness], tmp_path: Path) -> None:
    h = harness()
    args = (str(tmp_path), str(time.time() + 60))
    chief = WorkerPool(command=("python", "-c", REPLICA), args=(str(tmp_path), str(time.time() + 2)))
    workers = WorkerPool(replica_count=2, command=("python", "-c", REPLICA), args=args)
    name = h.launcher.launch(spec("r-primary", 1, pools=(chief, workers)))
    status = h.until(name, JobPhase.SUCCEEDED, timeout=20)
    assert core_classify(status) is None
    for worker in ("workerpool1-0", "workerpool1-1"):  # still running: stopped by the job's end
        assert [k for k, _ in notes(tmp_path, worker)] == ["start", "SIGTERM"]
    assert [k for k, _ in notes(tmp_path, "workerpool0-0")] == ["start"]


def test_a_replica_is_restarted_in_place_five_times_then_the_job_fails(
        harness: Callable[..., Harness], tmp_path: Path) -> None:
    rules = [{"attempt": 1, "after_s": 1.0 + i, "pool": 3, "index": 0} for i in range(6)]
    h = harness(schedule=rules, replica_preemption="restart_replica")
    chief, _ = cluster(tmp_path, 60.0)
    evaluator = WorkerPool(role=PoolRole.EVALUATOR, command=chief.command, args=chief.args)
    name = h.launcher.launch(spec("r-restarts", 1, pools=(chief, evaluator)))
    status = h.until(name, JobPhase.FAILED, timeout=40)
    assert core_classify(status) is FailureClass.PREEMPTED
    assert "STOCKOUT" in status.message and "workerpool3-0 " in status.message
    assert "after 5 restarts in place" in status.message
    assert [k for k, _ in notes(tmp_path, "workerpool3-0")].count("start") == 6


def test_replicas_get_addresses_they_can_listen_on(harness: Callable[..., Harness],
                                                   tmp_path: Path) -> None:
    h = harness()
    name = h.launcher.launch(spec("r-ports", 1, pools=cluster(tmp_path, 0.5)))
    h.until(name, JobPhase.SUCCEEDED)
    line = (tmp_path / "workerpool0-0").read_text().split(" ", 2)[1]
    addresses = [a for pool in json.loads(line)["cluster"].values() for a in pool]
    assert len(set(addresses)) == 3 and all(a.startswith("127.0.0.1:") for a in addresses)
    chief_host, chief_port = addresses[0].rsplit(":", 1)
    with socket.socket() as s:  # the chief's address is free to listen on (a rendezvous)
        s.bind((chief_host, int(chief_port)))
