"""Training health in decide: (state, observation) -> decisions for every rule, then the service."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from fakes import fake_deps
from spotorch.adapters.memory.twins import InMemoryCheckpoints, InMemoryLauncher, ManualClock
from spotorch.app import tick as reconcile_tick
from spotorch.app.job_events import trainer_reported
from spotorch.app.launch_specs import launch_spec
from spotorch.app.runs import run_summary, start_run
from spotorch.core.context import Context
from spotorch.core.decide import decide, new_run
from spotorch.core.events import kind_of
from spotorch.core.health import DivergenceAction, HealthPolicy
from spotorch.core.intents import CancelIntent, DeleteCheckpointsIntent, LaunchIntent, PublishIntent
from spotorch.core.model import TRANSITIONS, Checkpoint, FailureClass, JobPhase, JobStatus, Run, RunStatus
from spotorch.core.observations import CheckpointsDeleted, JobObserved, LaunchDone, Tick, TrainerReported
from spotorch.core.pipeline import JobTemplate, Pipeline, RecoveryPolicy, Trigger, WorkerPool
from spotorch.core.training_health import checkpoint_advice
from spotorch.spec.event_schemas import validate_event
from spotorch_trainer import contract

T0 = 1_800_000_000.0
ROOT = "gs://c/p/r1"


def pipeline(**health: object) -> Pipeline:
    return Pipeline(name="p", trigger=Trigger(bucket="b"), checkpoint_uri="gs://c/p",
                    output_uri="gs://m/p",
                    job=JobTemplate(worker_pools=(WorkerPool(machine_type="n1-standard-4"),)),
                    recovery=RecoveryPolicy(max_no_progress_attempts=99),
                    health=HealthPolicy(**health))  # type: ignore[arg-type]


def launched(run: Run, p: Pipeline, now: float) -> Run:
    intent = next(i for i in run.outbox if isinstance(i, LaunchIntent))
    name = f"job-{intent.attempt}"
    run = decide(run, LaunchDone(intent.id, intent.attempt, name), Context(p, now))
    return decide(run, JobObserved(intent.attempt, JobStatus(name, JobPhase.RUNNING)),
                  Context(p, now))


def started(p: Pipeline, now: float = T0, interval: float | None = 10.0) -> Run:
    run = new_run(run_id="r1", pipeline=p, now=now, data_uri="gs://b/d/", snapshot_id="s")
    run = launched(run, p, now)
    return report(run, p, "started", now, step=0, report_interval_s=interval)


def report(run: Run, p: Pipeline, kind: str, at: float, **fields: object) -> Run:
    attempt = run.current.number if run.current else 1
    obs = TrainerReported(attempt, kind, at, total_steps=1000, **fields)  # type: ignore[arg-type]
    return decide(run, obs, Context(p, at))


def progress(run: Run, p: Pipeline, at: float, step: int, loss: float | None = None) -> Run:
    if loss is None:
        return report(run, p, "progress", at, step=step)
    if math.isfinite(loss):
        return report(run, p, "progress", at, step=step, metrics={"loss": loss})
    return report(run, p, "progress", at, step=step, nonfinite=("loss",))


def checkpoint(run: Run, p: Pipeline, at: float, step: int, **metrics: float) -> Run:
    return report(run, p, "checkpoint", at, step=step, checkpoint_uri=f"{ROOT}/step-{step}",
                  metrics=metrics, checkpoint_s=2.0)


def end(run: Run, p: Pipeline, phase: JobPhase, now: float, **status: object) -> Run:
    current = run.current
    assert current is not None
    obs = JobObserved(current.number, JobStatus(current.job_name or "", phase, **status))  # type: ignore[arg-type]
    return decide(run, obs, Context(p, now))


def events(run: Run) -> list[PublishIntent]:
    return [i for i in run.outbox if isinstance(i, PublishIntent)]


def published(run: Run) -> list[str]:
    return [kind_of(str(i.event["type"])) for i in events(run)]


def event(run: Run, kind: str) -> dict[str, object]:
    found = [i.event for i in events(run) if kind_of(str(i.event["type"])) == kind]
    assert found, f"no {kind} in {published(run)}"
    assert validate_event(found[-1]) == []
    return dict(found[-1]["data"])


def tick(run: Run, p: Pipeline, now: float) -> Run:
    return decide(run, Tick(), Context(p, now))


# ---------------------------------------------------------------- the tables

def test_every_new_status_has_its_row_and_a_way_in() -> None:
    for status in (RunStatus.FAILED_HUNG, RunStatus.FAILED_DIVERGED,
                   RunStatus.FAILED_OUT_OF_MEMORY):
        assert status.terminal and status.failed and TRANSITIONS[status] == frozenset()
        assert status in TRANSITIONS[RunStatus.RUNNING]
    assert RunStatus.FAILED_DIVERGED in TRANSITIONS[RunStatus.CANCELLING]


# ---------------------------------------------------------------- hung

# (pipeline options, interval the trainer reported, seconds silent at the tick) -> hung?
HANG_TABLE = [
    ({}, 10.0, 100.0, False),
    ({}, 10.0, 130.0, True),  # derived: max(10 x 10 s, floor 120 s)
    ({}, None, 10_000.0, False),  # an older trainer that says no interval: not watched
    ({"hang_after_s": 300.0}, None, 301.0, True),  # unless the pipeline says how long
    ({"hang_after_s": 300.0}, None, 299.0, False),
    ({}, 60.0, 599.0, False),  # 10 x 60 s
]


@pytest.mark.parametrize(("options", "interval", "silent", "is_hung"), HANG_TABLE)
def test_hang_table(options: dict[str, object], interval: float | None, silent: float,
                    is_hung: bool) -> None:
    p = pipeline(**options)
    run = progress(started(p, interval=interval), p, T0 + 10, 10)
    run = tick(run, p, T0 + 10 + silent)
    assert (run.current is not None and run.current.cancel_reason == "hung") is is_hung
    assert ("attempt.hung" in published(run)) is is_hung


def test_a_hung_attempt_is_cancelled_and_relaunched_from_its_latest_checkpoint() -> None:
    p = pipeline()
    run = checkpoint(progress(started(p), p, T0 + 10, 10), p, T0 + 11, 10)
    run = tick(run, p, T0 + 200)
    data = event(run, "attempt.hung")
    assert data["attempt"] == 1 and data["hang_after_s"] == 120.0 and data["step"] == 10
    cancel = [i for i in run.outbox if isinstance(i, CancelIntent)]
    assert [c.reason for c in cancel] == ["hung"] and run.status is RunStatus.RUNNING
    assert any("hung" in h.what for h in run.history)
    run = end(run, p, JobPhase.CANCELLED, T0 + 210)
    first, second = run.attempts
    assert first.failure is FailureClass.HUNG and first.end_reason is not None
    assert first.end_reason.startswith("hung: no trainer report for")
    assert run.counters.hangs == 1 and run.status is RunStatus.STARTING
    assert second.resumed_from_step == 10  # relaunched at once, from the checkpoint


def test_hangs_beyond_their_budget_fail_the_run_hung() -> None:
    p = pipeline(max_hangs=1)
    run = progress(started(p), p, T0 + 10, 10)
    run = end(tick(run, p, T0 + 200), p, JobPhase.CANCELLED, T0 + 201)
    run = launched(run, p, T0 + 202)
    run = progress(report(run, p, "started", T0 + 203, step=0, report_interval_s=10.0), p,
                   T0 + 210, 5)
    run = end(tick(run, p, T0 + 400), p, JobPhase.CANCELLED, T0 + 401)
    assert run.status is RunStatus.FAILED_HUNG and run.counters.hangs == 2
    assert event(run, "run.budget_exceeded")["budget"] == "hangs"


def test_a_run_without_trainer_reports_is_never_hung() -> None:
    p = pipeline(hang_after_s=60.0)
    run = launched(new_run(run_id="r1", pipeline=p, now=T0, data_uri="d", snapshot_id=None), p,
                   T0)
    run = tick(run, p, T0 + 100_000)
    assert run.current is not None and run.current.cancel_reason is None
    assert "attempt.hung" not in published(run)


def test_startup_may_be_silent_for_longer_than_hang_after() -> None:
    p = pipeline()
    run = started(p)  # "started", then nothing: loading data, compiling
    assert run.current is not None and run.current.cancel_reason is None
    assert tick(run, p, T0 + 1000).current.cancel_reason is None  # type: ignore[union-attr]
    assert tick(run, p, T0 + 1801).current.cancel_reason == "hung"  # type: ignore[union-attr]


# ---------------------------------------------------------------- step rate

def rates(p: Pipeline, gaps: list[float]) -> Run:
    """Progress reports 10 steps apart, `gap` seconds apart each."""
    run, at, step = started(p), T0, 0
    for gap in gaps:
        at, step = at + gap, step + 10
        run = progress(run, p, at, step)
    return run


def test_step_rate_collapse_warns_once_and_does_not_cancel() -> None:
    p = pipeline()
    run = rates(p, [1.0] * 7 + [5.0] * 5)  # 10 steps/s, then 2 steps/s
    assert published(run).count("run.step_rate_degraded") == 1
    data = event(run, "run.step_rate_degraded")
    assert data["action"] == "warn" and data["rate"] == pytest.approx(2.0)
    assert data["median"] == pytest.approx(10.0)
    assert run.current is not None and run.current.cancel_reason is None


def straggling(p: Pipeline, times: list[list[float]]) -> Run:
    """Progress reports 2 s apart, each carrying the replicas' step times by rank."""
    run, at = started(p), T0
    for i, step_s in enumerate(times):
        at += 2.0
        run = report(run, p, "progress", at, step=10 * (i + 1), replica_step_s=tuple(step_s))
    return run


def test_a_straggling_replica_is_named_once_after_straggler_for_reports() -> None:
    p = pipeline()
    even, slow = [0.10, 0.11, 0.10], [0.10, 0.10, 0.30]  # rank 2 = workerpool1-1
    run = straggling(p, [even, even, slow, slow])
    assert "run.straggler" not in published(run)  # two reports in a row: not yet
    run = straggling(p, [even, even, slow, slow, slow, slow, slow])
    assert published(run).count("run.straggler") == 1
    data = event(run, "run.straggler")
    assert (data["rank"], data["replica"], data["action"]) == (2, "workerpool1-1", "warn")
    assert data["step_s"] == pytest.approx(0.30) and data["median_s"] == pytest.approx(0.10)
    assert run.current is not None and run.current.cancel_reason is None
    assert any("workerpool1-1 is a straggler" in h.what for h in run.history)


def test_no_straggler_when_the_replicas_are_even_or_the_gap_is_noise_or_the_rule_is_off() -> None:
    assert "run.straggler" not in published(straggling(pipeline(), [[0.1, 0.12, 0.11]] * 6))
    noise = [[0.001, 0.001, 0.004]] * 6  # 4x, but 3 ms per step: under straggler_min
    assert "run.straggler" not in published(straggling(pipeline(), noise))
    slow = [[0.1, 0.1, 0.4]] * 6
    assert "run.straggler" not in published(straggling(pipeline(straggler_factor=None), slow))
    # A different replica each time is no one straggler.
    wandering = [[0.3, 0.1, 0.1], [0.1, 0.3, 0.1], [0.1, 0.1, 0.3]] * 2
    assert "run.straggler" not in published(straggling(pipeline(), wandering))


def test_a_straggler_relaunches_on_new_vms_when_the_pipeline_says_so() -> None:
    p = pipeline(straggler_relaunch=True)
    run = straggling(p, [[0.4, 0.1]] * 3)  # the chief itself can be the slow one
    data = event(run, "run.straggler")
    assert (data["replica"], data["action"]) == ("workerpool0-0", "relaunch")
    assert run.current is not None and run.current.cancel_reason == "slow"
    run = end(run, p, JobPhase.CANCELLED, T0 + 100)
    assert run.attempts[0].failure is FailureClass.HUNG and len(run.attempts) == 2


def test_bad_straggler_settings_are_listed() -> None:
    problems = dict(HealthPolicy(straggler_factor=1.0, straggler_for=0).problems())
    assert problems == {"straggler_factor": "must be > 1", "straggler_for": "must be >= 1"}


def test_step_rate_collapse_relaunches_when_the_pipeline_says_so() -> None:
    p = pipeline(step_rate_relaunch=True)
    run = rates(p, [1.0] * 7 + [5.0] * 3)
    assert event(run, "run.step_rate_degraded")["action"] == "relaunch"
    assert run.current is not None and run.current.cancel_reason == "slow"
    run = end(run, p, JobPhase.CANCELLED, T0 + 100)
    assert run.attempts[0].failure is FailureClass.HUNG and len(run.attempts) == 2


# ---------------------------------------------------------------- divergence

def healthy(p: Pipeline) -> Run:
    """Loss 1.0, 0.8, 0.7, 0.6 at steps 10..40; checkpoints at 20 and 40."""
    run = started(p)
    for i, loss in enumerate((1.0, 0.8, 0.7, 0.6), start=1):
        run = progress(run, p, T0 + 10 * i, 10 * i, loss)
        if i % 2 == 0:
            run = checkpoint(run, p, T0 + 10 * i + 1, 10 * i)
    return run


# the rule's reports after healthy() -> (rule, step, checkpoint a relaunch resumes from)
DIVERGENCE = [
    ([math.nan], "nonfinite_loss", 50, 40),
    ([math.inf], "nonfinite_loss", 50, 40),
    ([9.0, 9.5, 10.0], "loss_spike", 70, 40),
]


@pytest.mark.parametrize(("losses", "rule", "step", "resume"), DIVERGENCE)
def test_divergence_fails_the_run_with_the_rule_in_its_reason(
        losses: list[float], rule: str, step: int, resume: int) -> None:
    p = pipeline()
    run = healthy(p)
    for i, loss in enumerate(losses, start=5):
        run = progress(run, p, T0 + 10 * i, 10 * i, loss)
    data = event(run, "run.diverged")
    assert (data["rule"], data["step"], data["action"]) == (rule, step, "fail")
    assert run.status is RunStatus.CANCELLING
    assert any(rule in h.what and str(step) in h.what for h in run.history)
    run = end(run, p, JobPhase.CANCELLED, T0 + 100)
    assert run.status is RunStatus.FAILED_DIVERGED
    assert run.end_reason is not None and rule in run.end_reason
    failed = event(run, "run.failed")
    assert failed["status"] == "FAILED_DIVERGED" and failed["failure_class"] == "diverged"


@pytest.mark.parametrize(("losses", "rule", "step", "resume"), DIVERGENCE)
def test_divergence_relaunches_from_the_checkpoint_before_it_began(
        losses: list[float], rule: str, step: int, resume: int) -> None:
    p = pipeline(divergence_action=DivergenceAction.RELAUNCH)
    run = checkpoint(healthy(p), p, T0 + 45, 50)  # written while it was going wrong
    for i, loss in enumerate(losses, start=5):
        run = progress(run, p, T0 + 10 * i, 10 * i, loss)
    data = event(run, "run.diverged")
    assert (data["rule"], data["action"], data["resume_step"]) == (rule, "relaunch", resume)
    assert run.current is not None and run.current.cancel_reason == "diverged"
    run = end(run, p, JobPhase.CANCELLED, T0 + 100)
    assert run.counters.divergences == 1 and run.attempts[0].failure is FailureClass.DIVERGED
    assert run.latest_checkpoint == Checkpoint(resume, f"{ROOT}/step-{resume}")
    delete = [i for i in run.outbox if isinstance(i, DeleteCheckpointsIntent)]
    launch = [i for i in run.outbox if isinstance(i, LaunchIntent)][-1]
    assert [d.above for d in delete] == [resume]
    assert run.outbox.index(delete[0]) < run.outbox.index(launch)  # deleted before it starts
    assert launch.resume_step == resume and launch.resume_exact
    # A lookup of the (not yet deleted) diverged checkpoint is not believed.
    again = decide(run, JobObserved(1, JobStatus("job-1", JobPhase.CANCELLED),
                                    Checkpoint(50, f"{ROOT}/step-50")), Context(p, T0 + 101))
    assert again.latest_checkpoint == run.latest_checkpoint
    done = decide(run, CheckpointsDeleted(delete[0].id, (50,), 123), Context(p, T0 + 102))
    assert done.health.trust_until_step is None and done.health.bytes_reclaimed == 123
    assert event(done, "run.checkpoints_deleted")["reason"] == "divergence"


def test_divergences_beyond_their_budget_fail_diverged() -> None:
    p = pipeline(divergence_action=DivergenceAction.RELAUNCH, max_divergences=0)
    run = progress(healthy(p), p, T0 + 50, 50, math.nan)
    run = end(run, p, JobPhase.CANCELLED, T0 + 60)
    assert run.status is RunStatus.FAILED_DIVERGED
    assert event(run, "run.budget_exceeded")["budget"] == "divergences"


def test_loss_plateau_fires_only_when_configured() -> None:
    flat = [(10 * i, 1.0) for i in range(1, 30)]
    for options, fires in (({}, False), ({"loss_plateau_steps": 100}, True)):
        p = pipeline(**options)
        run = started(p)
        for step, loss in flat:
            run = progress(run, p, T0 + step, step, loss)
        assert ("run.diverged" in published(run)) is fires


# ---------------------------------------------------------------- out of memory

def test_out_of_memory_moves_to_the_next_larger_machine_then_fails() -> None:
    p = pipeline(fallback_machines=("n1-highmem-8", "n1-highmem-16"))
    run = started(p)
    run = end(run, p, JobPhase.FAILED, T0 + 50, failure=FailureClass.OUT_OF_MEMORY,
              exit_code=137, message="Out of memory: Killed process 4242 (python)")
    assert run.attempts[0].end_reason is not None and "out of memory" in run.attempts[0].end_reason
    assert run.attempts[-1].machine_type == "n1-highmem-8" and run.status is RunStatus.STARTING
    assert event(run, "run.machine_changed")["to"] == "n1-highmem-8"
    assert [i for i in run.outbox if isinstance(i, LaunchIntent)][-1].machine_type == "n1-highmem-8"
    run = end(launched(run, p, T0 + 60), p, JobPhase.FAILED, T0 + 90,
              failure=FailureClass.OUT_OF_MEMORY)
    assert run.attempts[-1].machine_type == "n1-highmem-16"
    run = end(launched(run, p, T0 + 100), p, JobPhase.FAILED, T0 + 130,
              failure=FailureClass.OUT_OF_MEMORY)
    assert run.status is RunStatus.FAILED_OUT_OF_MEMORY and run.counters.out_of_memory == 3
    assert run.end_reason is not None and "n1-highmem-16 is the largest" in run.end_reason


def test_out_of_memory_without_fallbacks_fails_and_says_why() -> None:
    p = pipeline()
    run = end(started(p), p, JobPhase.FAILED, T0 + 50, failure=FailureClass.OUT_OF_MEMORY)
    assert run.status is RunStatus.FAILED_OUT_OF_MEMORY and len(run.attempts) == 1
    assert run.end_reason is not None and "no health.fallback_machines" in run.end_reason
    assert event(run, "run.failed")["failure_class"] == "out_of_memory"


# ---------------------------------------------------------------- stale checkpoints

def test_stale_checkpoint_warns_once_per_checkpoint_and_attempt() -> None:
    p = pipeline(checkpoint_stale_after_s=600.0, hang_after_s=10_000.0)
    run = checkpoint(progress(started(p), p, T0 + 10, 10), p, T0 + 20, 10)
    assert "run.checkpoint_stale" not in published(tick(run, p, T0 + 600))
    run = tick(run, p, T0 + 700)
    data = event(run, "run.checkpoint_stale")
    assert data["checkpoint_step"] == 10 and data["since_s"] == pytest.approx(680.0)
    run = tick(run, p, T0 + 900)
    assert published(run).count("run.checkpoint_stale") == 1
    run = checkpoint(run, p, T0 + 950, 20)
    run = tick(run, p, T0 + 1600)
    assert published(run).count("run.checkpoint_stale") == 2


def test_checkpoint_advice_uses_the_runs_own_checkpoints_and_preemptions() -> None:
    p = pipeline()
    run = started(p)
    for i in range(1, 5):
        run = checkpoint(run, p, T0 + 600 * i, 10 * i)
    advice = checkpoint_advice(run, T0 + 3000)
    assert advice.interval_s == 600.0 and advice.checkpoint_cost_s == 2.0
    assert advice.mtbf_s is None and advice.verdict == "not enough history"


# ---------------------------------------------------------------- retention

def test_retention_passes_protect_resume_points_and_best_and_end_with_the_run() -> None:
    p = pipeline(keep_last=2, keep_best_metric="val_loss")
    run = started(p)
    run = checkpoint(run, p, T0 + 10, 10, val_loss=0.2)  # the best
    run = checkpoint(run, p, T0 + 20, 20, val_loss=0.5)
    passes = [i for i in run.outbox if isinstance(i, DeleteCheckpointsIntent)]
    assert len(passes) == 1  # one pending pass at a time; it lists the bucket when it runs
    assert passes[0].keep_newest == 2 and 10 in passes[0].keep and not passes[0].ending
    run = decide(run, CheckpointsDeleted(passes[0].id, (), 0), Context(p, T0 + 21))
    run = checkpoint(run, p, T0 + 30, 30, val_loss=0.4)
    passes = [i for i in run.outbox if isinstance(i, DeleteCheckpointsIntent)]
    assert set(passes[0].keep) == {10, 30}
    run = decide(run, CheckpointsDeleted(passes[0].id, (20,), 2048), Context(p, T0 + 31))
    assert event(run, "run.checkpoints_deleted")["steps"] == [20]
    assert run.health.bytes_reclaimed == 2048
    run = end(run, p, JobPhase.SUCCEEDED, T0 + 40)
    final = [i for i in run.outbox if isinstance(i, DeleteCheckpointsIntent)]
    assert final and final[-1].ending and final[-1].keep_newest == 1
    n = len(published(run))
    run = decide(run, CheckpointsDeleted(final[-1].id, (10,), 1000), Context(p, T0 + 41))
    assert run.health.bytes_reclaimed == 3048 and len(published(run)) == n  # none after the end
    assert any("1 checkpoint(s) deleted" in h.what for h in run.history)


def test_no_retention_unless_the_pipeline_asks() -> None:
    p = pipeline()
    run = checkpoint(checkpoint(started(p), p, T0 + 10, 10), p, T0 + 20, 20)
    run = end(run, p, JobPhase.SUCCEEDED, T0 + 40)
    assert not any(isinstance(i, DeleteCheckpointsIntent) for i in run.outbox)


def test_health_state_round_trips_through_the_document() -> None:
    p = pipeline(keep_last=2, keep_best_metric="loss",
                 divergence_action=DivergenceAction.RELAUNCH)
    run = healthy(p)
    run = rates(p, [1.0] * 7)
    run = progress(healthy(p), p, T0 + 50, 50, math.nan)
    assert run.health.rollback is not None and run.health.checkpoints
    assert Run.from_dict(run.to_dict()) == run


# ---------------------------------------------------------------- through the service

def test_service_deletes_what_retention_dooms_and_records_the_bytes() -> None:
    p = replace(pipeline(keep_last=2), checkpoint_uri="gs://c/p")
    deps = fake_deps(p)
    store = deps.checkpoints
    assert isinstance(store, InMemoryCheckpoints)
    run = start_run(deps, "p", run_id="r1", data_uri="gs://b/d/", snapshot_id="s",
                            reason="test")
    assert run is not None
    launcher = deps.launcher
    assert isinstance(launcher, InMemoryLauncher)
    job = launcher.job_of("r1", 1)
    launcher.set_status(job, JobPhase.RUNNING)
    reconcile_tick.tick(deps)
    for step, size in ((100, 1000), (200, 2000), (300, 3000)):
        store.put(ROOT, step, size=size)
    store.put(ROOT, 400, complete=False, size=5)  # being written: never deleted
    for step in (100, 200, 300):
        run = trainer_reported(deps, "r1", TrainerReported(
            1, "checkpoint", deps.clock.now(), step=step, total_steps=1000,
            checkpoint_uri=contract.checkpoint_uri(ROOT, step)))
    assert [c.step for c in store.list(ROOT)] == [200, 300, 400]
    assert run.health.bytes_reclaimed == 1000 and run.health.deleted_checkpoints == 1
    assert not any(isinstance(i, DeleteCheckpointsIntent) for i in run.outbox)
    launcher.set_status(job, JobPhase.SUCCEEDED)
    run = reconcile_tick.tick(deps)[0]
    assert run.status is RunStatus.SUCCEEDED
    assert [c.step for c in store.list(ROOT)] == [300, 400]  # keep_last_on_end 1
    assert run.health.bytes_reclaimed == 3000
    assert run_summary(run)["health"]["bytes_reclaimed"] == 3000


def test_service_launches_the_fallback_machine_and_exact_resume() -> None:
    p = pipeline(fallback_machines=("n1-highmem-8",))
    deps = fake_deps(p)
    run = start_run(deps, "p", run_id="r1", data_uri="gs://b/d/", snapshot_id="s",
                            reason="test")
    assert run is not None
    launcher = deps.launcher
    assert isinstance(launcher, InMemoryLauncher)
    launcher.set_status(launcher.job_of("r1", 1), JobPhase.FAILED,
                        failure=FailureClass.OUT_OF_MEMORY, exit_code=137)
    run = reconcile_tick.tick(deps)[0]
    spec = launcher.jobs[launcher.job_of("r1", 2)].spec
    assert spec.template.worker_pools[0].machine_type == "n1-highmem-8"
    assert contract.ENV_RESUME_EXACT not in spec.env
    intent = LaunchIntent("x", 3, run.attempts[-1].capacity, "us-central1", resume_step=5,
                          resume_uri="u", resume_exact=True)
    assert launch_spec(deps, run, intent).env[contract.ENV_RESUME_EXACT] == "1"


@pytest.mark.emulator
def test_health_state_round_trips_through_firestore(emulators: object) -> None:
    import uuid

    from spotorch.adapters.gcp.firestore import FirestoreDocumentStore
    from spotorch.app.run_store import DocumentRunStore

    p = pipeline(keep_last=2, keep_best_metric="loss",
                 divergence_action=DivergenceAction.RELAUNCH)
    run = progress(healthy(p), p, T0 + 50, 50, math.nan)
    run = replace(run, run_id=f"health-{uuid.uuid4().hex[:8]}")
    assert run.health.rollback is not None and run.health.loss.best is not None
    store = DocumentRunStore(FirestoreDocumentStore(project=emulators.project))  # type: ignore[attr-defined]
    store.save(run, None)
    loaded, _ = store.load(run.run_id)
    assert loaded == run


class FlakyCheckpoints(InMemoryCheckpoints):
    """Deletes fail while `failing` > 0 (GCS briefly unavailable)."""

    failing: int = 0

    def delete(self, uri: str) -> int:
        if self.failing > 0:
            self.failing -= 1
            raise ConnectionError("storage unavailable (simulated)")
        return super().delete(uri)


def test_a_relaunch_after_divergence_waits_until_the_diverged_checkpoints_are_gone() -> None:
    p = pipeline(divergence_action=DivergenceAction.RELAUNCH)
    deps = fake_deps(p)
    store = FlakyCheckpoints()
    deps.checkpoints = store
    launcher = deps.launcher
    assert isinstance(launcher, InMemoryLauncher)
    start_run(deps, "p", run_id="r1", data_uri="gs://b/d/", snapshot_id="s",
                      reason="test")
    job = launcher.job_of("r1", 1)
    launcher.set_status(job, JobPhase.RUNNING)
    reconcile_tick.tick(deps)
    clock = deps.clock
    assert isinstance(clock, ManualClock)
    now = deps.clock.now

    def say(kind: str, step: int, **fields: object) -> Run:
        clock.advance(5)  # progress reports closer than 1 s are coalesced
        return trainer_reported(deps, "r1", TrainerReported(
            1, kind, now(), step=step, total_steps=1000, **fields))  # type: ignore[arg-type]

    say("started", 0, report_interval_s=10.0)
    for step, loss in ((10, 1.0), (20, 0.5)):
        store.put(ROOT, step, size=100)
        say("progress", step, metrics={"loss": loss})
        say("checkpoint", step, checkpoint_uri=contract.checkpoint_uri(ROOT, step))
    store.put(ROOT, 30, size=100)  # written while the loss went NaN
    run = say("progress", 30, nonfinite=("loss",))
    assert run.current is not None and run.current.cancel_reason == "diverged"
    assert job in launcher.cancelled
    store.failing = 1
    run = reconcile_tick.tick(deps)[0]  # the cancelled job ends: roll back, relaunch
    assert run.latest_checkpoint is not None and run.latest_checkpoint.step == 20
    assert launcher.created == 1  # the launch waits: step 30 is still there
    assert any(isinstance(i, DeleteCheckpointsIntent) for i in run.outbox)
    clock.advance(200)  # the claims expire; the tick carries both out, deletion first
    run = reconcile_tick.tick(deps)[0]
    assert [c.step for c in store.list(ROOT)] == [10, 20]
    assert launcher.created == 2
    spec = launcher.jobs[launcher.job_of("r1", 2)].spec
    assert spec.env[contract.ENV_RESUME_EXACT] == "1"
    assert spec.env[contract.ENV_RESUME_STEP] == "20"


def test_a_nan_loss_is_never_coalesced_away() -> None:
    """Progress reports within COALESCE_S are dropped, except one that names a NaN loss."""
    p = pipeline()
    deps = fake_deps(p)
    start_run(deps, "p", run_id="r1", data_uri="gs://b/d/", snapshot_id="s",
                      reason="test")
    now = deps.clock.now()
    trainer_reported(deps, "r1", TrainerReported(
        1, "progress", now, step=10, total_steps=1000, metrics={"loss": 1.0}))
    run = trainer_reported(deps, "r1", TrainerReported(
        1, "progress", now + 0.1, step=11, total_steps=1000, metrics={"loss": 0.9}))
    assert run.progress.step == 10  # coalesced
    run = trainer_reported(deps, "r1", TrainerReported(
        1, "progress", now + 0.2, step=12, total_steps=1000, nonfinite=("loss",)))
    assert run.status is RunStatus.CANCELLING and run.stop_status is RunStatus.FAILED_DIVERGED
