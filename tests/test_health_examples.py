"""The misbehaving workloads (examples/unhealthy.py) as real processes, through spotorch's rules.

Each test runs the script with spotorch's env, reads the trainer events it logs (--verbose 1, no
events topic), decodes them as on_job_event does and feeds them to `decide` with Vertex-like job
observations: the process really hangs, its loss really explodes, it really allocates past a
memory limit. (The Vertex emulator and `spotorch demo --scenario` will do the same on the local
stack; see docs/pipelines.md, "Training health".)
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from classifying import classify
from spotorch.core.context import Context
from spotorch.core.decide import decide, new_run
from spotorch.core.events import kind_of
from spotorch.core.health import HealthPolicy
from spotorch.core.intents import LaunchIntent, PublishIntent
from spotorch.core.model import FailureClass, JobPhase, JobStatus, Run, RunStatus
from spotorch.core.observations import JobObserved, LaunchDone, Tick
from spotorch.core.pipeline import JobTemplate, Pipeline, RecoveryPolicy, Trigger, WorkerPool
from spotorch.entrypoints.functions import parse_trainer_message
from spotorch_trainer import contract

pytestmark = pytest.mark.slow  # real processes that sleep and hang: ~15 s in all

SCRIPT = Path(__file__).resolve().parent.parent / "examples" / "unhealthy.py"
FAST = ["--step-sleep", "0.01", "--progress-interval", "0.05", "--checkpoint-every", "10",
        "--total-steps", "120", "--verbose", "1"]
# What the Vertex emulator would enforce per machine shape (MiB of address space).
MEMORY_MB = {"n1-standard-4": 200, "n1-highmem-8": 1024}


@dataclass
class Worker:
    """One attempt's process and the trainer events it printed so far."""

    proc: subprocess.Popen[str]
    events: list[bytes] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)

    def read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.append(line)
            marker = " DEBUG event "
            if marker in line:
                self.events.append(line.split(marker, 1)[1].strip().encode())

    def wait_for(self, text: str, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while not any(text in line for line in self.lines):
            assert time.monotonic() < deadline, f"no {text!r} in {self.lines[-5:]}"
            time.sleep(0.05)


@pytest.fixture
def spawn(tmp_path: Path) -> Iterator[object]:
    workers: list[Worker] = []

    def start(run: Run, attempt: int, *args: str, memory_mb: int = 0) -> Worker:
        resume = run.attempts[attempt - 1].resumed_from_uri
        env = {**os.environ, contract.ENV_RUN_ID: run.run_id, contract.ENV_ATTEMPT: str(attempt),
               contract.ENV_PIPELINE: run.pipeline,
               contract.ENV_CHECKPOINT_URI: str(tmp_path / "ckpt"),
               contract.ENV_RESUME_FROM: resume or "",
               contract.ENV_MODEL_URI: str(tmp_path / "model"), contract.ENV_EVENTS_TOPIC: ""}
        extra = ["--memory-limit-mb", str(memory_mb)] if memory_mb else []
        proc = subprocess.Popen([sys.executable, str(SCRIPT), *FAST, *args, *extra], env=env,
                                stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
        worker = Worker(proc)
        threading.Thread(target=worker.read, daemon=True).start()
        workers.append(worker)
        return worker

    yield start
    for w in workers:
        if w.proc.poll() is None:
            w.proc.kill()
            w.proc.wait()


def pipeline(**health: object) -> Pipeline:
    return Pipeline(name="p", trigger=Trigger(bucket="b"), checkpoint_uri="/unused",
                    output_uri="/unused",
                    job=JobTemplate(worker_pools=(WorkerPool(machine_type="n1-standard-4"),)),
                    recovery=RecoveryPolicy(max_no_progress_attempts=99),
                    health=HealthPolicy(**health))  # type: ignore[arg-type]


def running(run: Run, p: Pipeline, attempt: int) -> Run:
    intent = next(i for i in run.outbox if isinstance(i, LaunchIntent) and i.attempt == attempt)
    now = time.time()
    run = decide(run, LaunchDone(intent.id, attempt, f"job-{attempt}"), Context(p, now))
    return decide(run, JobObserved(attempt, JobStatus(f"job-{attempt}", JobPhase.RUNNING)),
                  Context(p, now))


def feed(run: Run, p: Pipeline, worker: Worker, done: int = 0) -> tuple[Run, int]:
    """Decode the worker's events since `done` as on_job_event does and decide on each."""
    events = list(worker.events)
    for body in events[done:]:
        report, _, _ = parse_trainer_message(body)
        run = decide(run, report, Context(p, max(report.at, time.time())))
    return run, len(events)


def job_ended(run: Run, p: Pipeline, attempt: int, phase: JobPhase, message: str = "",
              code: int = 0) -> Run:
    _, failure, exit_code = classify(int({JobPhase.SUCCEEDED: 4, JobPhase.FAILED: 5,
                                          JobPhase.CANCELLED: 7}[phase]), code, message)
    status = JobStatus(f"job-{attempt}", phase, failure=failure, exit_code=exit_code,
                       message=message)
    return decide(run, JobObserved(attempt, status), Context(p, time.time()))


def published(run: Run) -> list[str]:
    return [kind_of(str(i.event["type"])) for i in run.outbox if isinstance(i, PublishIntent)]


def fresh(p: Pipeline) -> Run:
    return running(new_run(run_id="r1", pipeline=p, now=time.time() - 1, data_uri="d",
                           snapshot_id=None), p, 1)


def test_a_process_that_hangs_is_cancelled_and_the_relaunch_succeeds(spawn: object) -> None:
    p = pipeline(hang_after_s=1.0)
    run = fresh(p)
    worker = spawn(run, 1, "--mode", "hang", "--hang-at-step", "35")  # type: ignore[operator]
    worker.wait_for("hanging at step")
    time.sleep(1.5)
    assert worker.proc.poll() is None  # alive, and silent
    run, _ = feed(run, p, worker)
    run = decide(run, Tick(), Context(p, time.time()))
    assert "attempt.hung" in published(run) and run.current is not None
    assert run.current.cancel_reason == "hung"
    worker.proc.send_signal(signal.SIGTERM)  # what a Vertex cancel does first
    time.sleep(1.0)
    assert worker.proc.poll() is None  # the stuck loop never looks at the flag
    worker.proc.kill()  # the grace-period SIGKILL
    worker.proc.wait()
    run = job_ended(run, p, 1, JobPhase.CANCELLED, "CANCELED", 1)
    assert run.attempts[0].failure is FailureClass.HUNG and run.counters.hangs == 1
    assert run.attempts[1].resumed_from_step == 30  # the latest checkpoint before the hang
    run = running(run, p, 2)
    second = spawn(run, 2, "--mode", "hang", "--hang-at-step", "35")  # type: ignore[operator]
    assert second.proc.wait(timeout=60) == 0
    time.sleep(0.2)
    run, _ = feed(run, p, second)
    run = job_ended(run, p, 2, JobPhase.SUCCEEDED)
    assert run.status is RunStatus.SUCCEEDED and len(run.attempts) == 2


def test_a_loss_that_explodes_ends_the_run_diverged_well_before_its_steps(
        spawn: object) -> None:
    p = pipeline()
    run = fresh(p)
    worker = spawn(run, 1, "--mode", "diverge", "--diverge-at-step", "30")  # type: ignore[operator]
    assert worker.proc.wait(timeout=60) == 0  # it would happily train to the end
    time.sleep(0.2)
    run, _ = feed(run, p, worker)
    assert run.status is RunStatus.CANCELLING and run.stop_status is RunStatus.FAILED_DIVERGED
    diverged = next(i.event["data"] for i in run.outbox if isinstance(i, PublishIntent)
                    and kind_of(str(i.event["type"])) == "run.diverged")
    assert diverged["rule"] in ("nonfinite_loss", "loss_spike") and diverged["step"] < 60
    run = job_ended(run, p, 1, JobPhase.CANCELLED, "CANCELED", 1)
    assert run.status is RunStatus.FAILED_DIVERGED
    assert run.end_reason is not None and str(diverged["rule"]) in run.end_reason


def test_a_process_past_its_memory_limit_moves_to_the_next_machine(spawn: object) -> None:
    p = pipeline(fallback_machines=("n1-highmem-8",))
    run = fresh(p)
    machine = "n1-standard-4"
    first = spawn(run, 1, "--mode", "oom", "--alloc-mb", "400",  # type: ignore[operator]
                  "--bad-attempts", "99", memory_mb=MEMORY_MB[machine])
    code = first.proc.wait(timeout=60)
    time.sleep(0.2)
    assert code == 1 and any("MemoryError" in line for line in first.lines)
    run, _ = feed(run, p, first)
    # What Vertex (and the emulator) put in the job's error: the exit, then the log's tail.
    tail = " ".join(line.strip() for line in first.lines[-3:])
    message = (f"The replica workerpool0-0 exited with a non-zero status of {code}. "
               f"Termination reason: Error. {tail}")
    run = job_ended(run, p, 1, JobPhase.FAILED, message, 3)
    assert run.attempts[0].failure is FailureClass.OUT_OF_MEMORY
    assert run.attempts[1].machine_type == "n1-highmem-8" and "run.machine_changed" in published(run)
    run = running(run, p, 2)
    second = spawn(run, 2, "--mode", "oom", "--alloc-mb", "400",  # type: ignore[operator]
                   "--bad-attempts", "99", memory_mb=MEMORY_MB["n1-highmem-8"])
    assert second.proc.wait(timeout=60) == 0
    run, _ = feed(run, p, second)
    run = job_ended(run, p, 2, JobPhase.SUCCEEDED)
    assert run.status is RunStatus.SUCCEEDED
