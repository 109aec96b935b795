"""Real runs for the operator tests, written by the service layer: a preempted-twice, escalated,
successful run and a few others, on in-memory adapters or on any DocumentStore (Firestore)."""

from __future__ import annotations

from dataclasses import replace

from fakes import fake_deps
from spotorch.domain import Checkpoint, FailureClass, JobPhase, Run, TrainerReported
from spotorch.memory import InMemoryCheckpoints, InMemoryLauncher, ManualClock
from spotorch.pipeline import EscalationKind, Pipeline, RecoveryPolicy, Trigger
from spotorch.service import Deps, job_changed, submit, trainer_reported
from spotorch.store import DocumentRunStore

T0 = 1_800_000_000.0  # 2027-01-15T08:00:00Z
TOTAL_STEPS = 300
PIPELINE = Pipeline(
    name="ops", trigger=Trigger(bucket="landing", prefix="ops/"),
    checkpoint_uri="gs://ckpt/ops", output_uri="gs://models/ops", deadline_s=4 * 3600.0,
    recovery=RecoveryPolicy(escalation=EscalationKind.COUNT, escalate_after_preemptions=2,
                            restart_overhead_s=600.0, backoff_base_s=1.0))


def deps_for(docs: object = None) -> Deps:
    """In-memory deps knowing PIPELINE; with `docs`, runs are stored there (e.g. Firestore)."""
    deps = fake_deps(PIPELINE)
    deps.clock = ManualClock(T0)  # type: ignore[misc]
    if docs is not None:
        deps = replace(deps, docs=docs, runs=DocumentRunStore(docs))  # type: ignore[arg-type]
    return deps


def _clock(deps: Deps) -> ManualClock:
    assert isinstance(deps.clock, ManualClock)
    return deps.clock


def _attempt_runs(deps: Deps, run_id: str, n: int, *, until_step: int, checkpoint: int,
                  run_s: float, end: FailureClass | None) -> Run:
    """Attempt n waits 30 s for capacity, runs run_s reporting steps, then ends (None: succeeds)."""
    launcher, clock = deps.launcher, _clock(deps)
    assert isinstance(launcher, InMemoryLauncher) and isinstance(deps.checkpoints,
                                                                 InMemoryCheckpoints)
    job = launcher.job_of(run_id, n)
    job_changed(deps, run_id, n, launcher.set_status(job, JobPhase.QUEUED))
    clock.advance(30)
    job_changed(deps, run_id, n, launcher.set_status(job, JobPhase.RUNNING))
    clock.advance(run_s / 2)
    ckpt_uri = f"gs://ckpt/ops/{run_id}/step-{checkpoint:07d}"
    trainer_reported(deps, run_id, TrainerReported(n, "checkpoint", clock.now(), step=checkpoint,
                                                   total_steps=TOTAL_STEPS,
                                                   checkpoint_uri=ckpt_uri))
    deps.checkpoints.latest_by_uri[f"gs://ckpt/ops/{run_id}"] = Checkpoint(checkpoint, ckpt_uri)
    clock.advance(run_s / 2)
    trainer_reported(deps, run_id, TrainerReported(n, "progress", clock.now(), step=until_step,
                                                   total_steps=TOTAL_STEPS,
                                                   metrics={"loss": 0.5 / n}))
    phase = JobPhase.SUCCEEDED if end is None else JobPhase.FAILED
    run = job_changed(deps, run_id, n, launcher.set_status(job, phase, failure=end))
    assert run is not None
    return run


def preempted_twice_then_standard(deps: Deps, request_id: str = "story") -> Run:
    """Spot, preempted at step 110 (checkpoint 100); Spot again, preempted at 220 (checkpoint 200);
    escalated to standard, succeeds at 300."""
    run = submit(deps, "ops", "gs://landing/ops/batch-1/", request_id=request_id)
    assert run is not None
    run_id = run.run_id
    _attempt_runs(deps, run_id, 1, until_step=110, checkpoint=100, run_s=1200,
                  end=FailureClass.PREEMPTED)
    _clock(deps).advance(5)
    _attempt_runs(deps, run_id, 2, until_step=220, checkpoint=200, run_s=1200,
                  end=FailureClass.PREEMPTED)
    _clock(deps).advance(5)
    return _attempt_runs(deps, run_id, 3, until_step=300, checkpoint=290, run_s=900, end=None)


def running_run(deps: Deps, request_id: str = "live") -> Run:
    """A run whose first Spot attempt is running at step 40."""
    run = submit(deps, "ops", "gs://landing/ops/batch-2/", request_id=request_id)
    assert run is not None and isinstance(deps.launcher, InMemoryLauncher)
    job = deps.launcher.job_of(run.run_id, 1)
    job_changed(deps, run.run_id, 1, deps.launcher.set_status(job, JobPhase.RUNNING))
    _clock(deps).advance(300)
    out = trainer_reported(deps, run.run_id, TrainerReported(1, "progress", deps.clock.now(),
                                                             step=40, total_steps=TOTAL_STEPS))
    assert out is not None
    return out


def queued_run(deps: Deps, request_id: str = "waiting") -> Run:
    """A run submitted while another of its pipeline is active: QUEUED behind it."""
    run = submit(deps, "ops", "gs://landing/ops/batch-4/", request_id=request_id)
    assert run is not None
    return run


def every_kind(deps: Deps) -> dict[str, Run]:
    """The story, a failed run, a running one and one queued behind it, a minute apart."""
    runs = {"story": preempted_twice_then_standard(deps)}
    _clock(deps).advance(60)
    runs["failed"] = failed_run(deps)
    _clock(deps).advance(60)
    runs["live"] = running_run(deps)
    _clock(deps).advance(60)
    runs["queued"] = queued_run(deps)
    return runs


def failed_run(deps: Deps, request_id: str = "broken") -> Run:
    """A run whose training code exits 1 twice (user-error budget 1): FAILED."""
    run = submit(deps, "ops", "gs://landing/ops/batch-3/", request_id=request_id)
    assert run is not None and isinstance(deps.launcher, InMemoryLauncher)
    for n in (1, 2):
        job = deps.launcher.job_of(run.run_id, n)
        job_changed(deps, run.run_id, n, deps.launcher.set_status(job, JobPhase.RUNNING))
        _clock(deps).advance(60)
        out = job_changed(deps, run.run_id, n, deps.launcher.set_status(
            job, JobPhase.FAILED, failure=FailureClass.USER_ERROR, exit_code=1,
            message="ValueError: bad column"))
        _clock(deps).advance(10)
        from spotorch.service import tick

        tick(deps)
    assert out is not None
    return deps.runs.load(run.run_id)[0] or out
