"""The pure core: tables of (state, failure class, policy) -> decision, and state-machine rules."""

from __future__ import annotations

from dataclasses import replace

import pytest

from spotorch.core.context import Context
from spotorch.core.decide import decide, new_run
from spotorch.core.events import kind_of
from spotorch.core.intents import CancelIntent, LaunchIntent, PublishIntent
from spotorch.core.model import (
    TRANSITIONS,
    AttemptState,
    Checkpoint,
    FailureClass,
    JobPhase,
    JobStatus,
    Run,
    RunStatus,
)
from spotorch.core.observations import (
    CancelRequested,
    IntentDone,
    JobObserved,
    LaunchDone,
    LaunchFailed,
    Tick,
    TrainerReported,
)
from spotorch.core.pipeline import Capacity, EscalationKind, Pipeline, RecoveryPolicy, Trigger

T0 = 1_800_000_000.0


def as_launch(intent: object) -> LaunchIntent:
    """The launch intent a test expects (narrowed for the type checker)."""
    assert isinstance(intent, LaunchIntent)
    return intent


def pipeline(**recovery: object) -> Pipeline:
    return Pipeline(name="p", trigger=Trigger(bucket="b"), checkpoint_uri="gs://c/p",
                    output_uri="gs://m/p", recovery=RecoveryPolicy(**recovery))  # type: ignore[arg-type]


def started(p: Pipeline, now: float = T0) -> Run:
    run = new_run(run_id="r1", pipeline=p, now=now, data_uri="gs://b/d/", snapshot_id="s")
    return launched(run, p, now)


def launched(run: Run, p: Pipeline, now: float) -> Run:
    """Carry out the pending launch: the job exists and runs."""
    intent = next(i for i in run.outbox if i.kind == "launch")
    run = decide(run, LaunchDone(intent.id, as_launch(intent).attempt, f"job-{as_launch(intent).attempt}"),
                 Context(p, now))
    return decide(run, JobObserved(as_launch(intent).attempt,
                                   JobStatus(f"job-{as_launch(intent).attempt}", JobPhase.RUNNING)),
                  Context(p, now))


def ended(run: Run, p: Pipeline, phase: JobPhase, failure: FailureClass | None = None,
          exit_code: int | None = None, now: float = T0 + 100,
          checkpoint: Checkpoint | None = None) -> Run:
    current = run.current
    assert current is not None
    status = JobStatus(current.job_name or "", phase, failure=failure, exit_code=exit_code)
    return decide(run, JobObserved(current.number, status, checkpoint), Context(p, now))


def kinds(run: Run) -> list[str]:
    return [i.kind for i in run.outbox]


def published(run: Run) -> list[str]:
    return [kind_of(str(i.event["type"])) for i in run.outbox if isinstance(i, PublishIntent)]


def test_transition_table_has_terminal_states_with_no_way_out() -> None:
    terminal = {s for s in RunStatus if s.terminal}
    assert RunStatus.SUCCEEDED in terminal and RunStatus.FAILED_NO_RESOURCE in terminal
    assert all(not TRANSITIONS[s] for s in terminal)
    assert all(TRANSITIONS[s] for s in RunStatus if s not in terminal)


def test_new_run_announces_itself_and_launches_the_first_attempt_on_spot() -> None:
    p = pipeline(escalation=EscalationKind.DEADLINE)
    run = new_run(run_id="r1", pipeline=p, now=T0, data_uri="gs://b/d/", snapshot_id="s")
    assert run.status is RunStatus.STARTING
    assert kinds(run) == ["publish", "launch"]
    assert run.attempts[0].capacity is Capacity.SPOT
    assert run.attempts[0].resumed_from_step is None


def test_always_standard_pipeline_starts_on_standard() -> None:
    run = new_run(run_id="r1", pipeline=pipeline(escalation=EscalationKind.ALWAYS_STANDARD),
                  now=T0, data_uri="d", snapshot_id=None)
    assert run.attempts[0].capacity is Capacity.STANDARD


def test_success_ends_the_run_and_publishes_in_order() -> None:
    p = pipeline()
    run = ended(started(p), p, JobPhase.SUCCEEDED)
    assert run.status is RunStatus.SUCCEEDED
    assert published(run)[-2:] == ["attempt.ended", "run.succeeded"]


# (failure class, budget field) -> status once the budget is exhausted
BUDGETS = [
    (FailureClass.PREEMPTED, "max_preemptions", RunStatus.FAILED_PREEMPTED),
    (FailureClass.USER_ERROR, "max_user_errors", RunStatus.FAILED),
    (FailureClass.INFRA, "max_infra_errors", RunStatus.FAILED_INFRA),
    (FailureClass.TIMEOUT, "max_timeouts", RunStatus.FAILED_TIMEOUT),
]


@pytest.mark.parametrize(("failure", "budget", "final"), BUDGETS)
@pytest.mark.parametrize("escalation", list(EscalationKind))
def test_each_failure_class_has_its_own_budget(failure: FailureClass, budget: str,
                                               final: RunStatus,
                                               escalation: EscalationKind) -> None:
    p = pipeline(**{budget: 1, "escalation": escalation, "max_no_progress_attempts": 99,
                    "backoff_base_s": 1.0})
    run = started(p)
    first = ended(run, p, JobPhase.FAILED, failure, exit_code=1)
    assert first.active, f"{failure} with budget 1 must retry once"
    if first.status is RunStatus.RECOVERING:
        assert first.next_action_at is not None and first.next_action_at > T0 + 100
        first = decide(first, Tick(), Context(p, first.next_action_at))
    assert first.status is RunStatus.STARTING and len(first.attempts) == 2
    second = ended(launched(first, p, T0 + 200), p, JobPhase.FAILED, failure, exit_code=1,
                   now=T0 + 300)
    assert second.status is final
    assert "budget exhausted" in (second.end_reason or "")
    assert published(second)[-2:] == ["run.budget_exceeded", "run.failed"]


def test_preemption_relaunches_at_once_and_resumes_from_the_latest_checkpoint() -> None:
    p = pipeline(escalation=EscalationKind.NEVER)
    run = started(p)
    run = decide(run, TrainerReported(1, "checkpoint", T0 + 50, step=40,
                                      checkpoint_uri="gs://c/p/r1/step-40"), Context(p, T0 + 50))
    run = ended(run, p, JobPhase.FAILED, FailureClass.PREEMPTED,
                checkpoint=Checkpoint(60, "gs://c/p/r1/step-60"))
    assert run.status is RunStatus.STARTING
    assert run.counters.preemptions == 1
    second = run.attempts[1]
    assert (second.capacity, second.resumed_from_step) == (Capacity.SPOT, 60)
    launch = [i for i in run.outbox if i.kind == "launch"][-1]
    assert isinstance(launch, LaunchIntent) and launch.resume_uri == "gs://c/p/r1/step-60"
    assert "attempt.preempted" in published(run)


def test_count_policy_escalates_after_n_preemptions() -> None:
    p = pipeline(escalation=EscalationKind.COUNT, escalate_after_preemptions=2,
                 max_no_progress_attempts=99)
    run = started(p)
    run = ended(run, p, JobPhase.FAILED, FailureClass.PREEMPTED)
    assert run.attempts[-1].capacity is Capacity.SPOT
    run = ended(launched(run, p, T0 + 150), p, JobPhase.FAILED, FailureClass.PREEMPTED,
                now=T0 + 200)
    assert run.attempts[-1].capacity is Capacity.STANDARD
    assert run.escalated is not None and run.escalated["to"] == "standard"
    assert "run.escalated" in published(run)


def test_no_progress_on_spot_escalates_then_fails_on_standard() -> None:
    p = pipeline(escalation=EscalationKind.DEADLINE, max_no_progress_attempts=2,
                 max_infra_errors=10, backoff_base_s=1.0)
    run = started(p)
    for i in range(2):
        run = ended(run, p, JobPhase.FAILED, FailureClass.INFRA, now=T0 + 100 + i * 100)
        run = decide(run, Tick(), Context(p, T0 + 160 + i * 100))
        run = launched(run, p, T0 + 170 + i * 100)
    assert run.attempts[-1].capacity is Capacity.STANDARD
    assert "without a newer checkpoint" in (run.escalated or {}).get("reason", "")
    run = ended(run, p, JobPhase.FAILED, FailureClass.INFRA, now=T0 + 900)
    assert run.status is RunStatus.FAILED_NO_PROGRESS


def test_stockout_cancels_a_queued_spot_attempt_and_moves_region() -> None:
    p = replace(pipeline(stockout_wait_s=60, backoff_base_s=1.0, escalation=EscalationKind.NEVER),
                job=replace(pipeline().job, regions=("us-central1", "europe-west4")))
    run = new_run(run_id="r1", pipeline=p, now=T0, data_uri="d", snapshot_id=None)
    intent = run.outbox[-1]
    run = decide(run, LaunchDone(intent.id, 1, "job-1"), Context(p, T0))
    run = decide(run, Tick(), Context(p, T0 + 30))
    assert "cancel" not in kinds(run)
    run = decide(run, Tick(), Context(p, T0 + 61))
    assert kinds(run)[-1] == "cancel" and run.attempts[0].cancel_reason == "stockout"
    run = decide(run, JobObserved(1, JobStatus("job-1", JobPhase.CANCELLED)), Context(p, T0 + 65))
    assert run.counters.stockouts == 1 and run.status is RunStatus.RECOVERING
    run = decide(run, Tick(), Context(p, T0 + 400))
    assert run.attempts[1].region == "europe-west4"


def test_stockouts_beyond_budget_fail_with_no_resource() -> None:
    p = pipeline(max_stockouts=0, escalation=EscalationKind.NEVER)
    run = ended(started(p), p, JobPhase.FAILED, FailureClass.STOCKOUT)
    assert run.status is RunStatus.FAILED_NO_RESOURCE


def test_retryable_exit_code_uses_the_infra_budget() -> None:
    p = pipeline(max_user_errors=0, retryable_exit_codes=(42,))
    run = ended(started(p), p, JobPhase.FAILED, FailureClass.USER_ERROR, exit_code=42)
    assert run.active and run.counters.infra_errors == 1 and run.counters.user_errors == 0
    run2 = ended(started(p), p, JobPhase.FAILED, FailureClass.USER_ERROR, exit_code=1)
    assert run2.status is RunStatus.FAILED


def test_permanent_launch_rejection_fails_the_run() -> None:
    p = pipeline()
    run = new_run(run_id="r1", pipeline=p, now=T0, data_uri="d", snapshot_id=None)
    intent = run.outbox[-1]
    transient = decide(run, LaunchFailed(intent.id, 1, "unavailable", False), Context(p, T0 + 5))
    # transient: kept, its claim given up, so the next tick tries again (issue 27)
    again = [i for i in transient.outbox if i.id == intent.id]
    assert transient.status is RunStatus.STARTING and again and again[0].claimed_until == T0 + 5
    quota = decide(run, LaunchFailed(intent.id, 1, "spent", False, "RESOURCE_EXHAUSTED"),
                   Context(p, T0 + 5))
    kept = [i for i in quota.outbox if i.id == intent.id]
    # refused for quota: kept, its claim given up, so the tick's retry pass may take it now
    assert quota.status is RunStatus.STARTING and kept and kept[0].claimed_until == T0 + 5
    assert isinstance(kept[0], LaunchIntent) and kept[0].deferred == "RESOURCE_EXHAUSTED"
    run = decide(run, LaunchFailed(intent.id, 1, "PERMISSION_DENIED", True), Context(p, T0))
    assert run.status is RunStatus.FAILED_LAUNCH and "PERMISSION_DENIED" in (run.end_reason or "")


def test_cancel_stops_the_job_then_ends_cancelled() -> None:
    p = pipeline()
    run = decide(started(p), CancelRequested("not needed"), Context(p, T0 + 10))
    assert run.status is RunStatus.CANCELLING and kinds(run)[-1] == "cancel"
    again = decide(run, CancelRequested("twice"), Context(p, T0 + 11))
    assert kinds(again) == kinds(run)
    run = ended(run, p, JobPhase.CANCELLED)
    assert run.status is RunStatus.CANCELLED and run.end_reason == "not needed"


def test_a_job_created_after_cancel_is_cancelled_too() -> None:
    p = pipeline()
    run = new_run(run_id="r1", pipeline=p, now=T0, data_uri="d", snapshot_id=None)
    intent = run.outbox[-1]
    run = decide(run, CancelRequested("stop"), Context(p, T0 + 1))
    run = decide(run, LaunchDone(intent.id, 1, "job-1"), Context(p, T0 + 2))
    assert kinds(run)[-1] == "cancel" and isinstance(run.outbox[-1], CancelIntent) \
        and run.outbox[-1].job_name == "job-1"


def test_cancelled_outside_spotorch_ends_the_run_cancelled() -> None:
    p = pipeline()
    run = ended(started(p), p, JobPhase.CANCELLED)
    assert run.status is RunStatus.CANCELLED and "outside" in (run.end_reason or "")


def test_late_and_repeated_job_news_never_move_an_attempt_back() -> None:
    p = pipeline()
    run = ended(started(p), p, JobPhase.SUCCEEDED)
    for phase in (JobPhase.RUNNING, JobPhase.QUEUED, JobPhase.FAILED):
        assert decide(run, JobObserved(1, JobStatus("job-1", phase)), Context(p, T0 + 500)) \
            .attempts == run.attempts


def test_terminal_runs_never_change_status() -> None:
    p = pipeline()
    run = ended(started(p), p, JobPhase.SUCCEEDED)
    for obs in (CancelRequested("x"), Tick(), TrainerReported(1, "progress", T0, step=5)):
        assert decide(run, obs, Context(p, T0 + 1000)).status is RunStatus.SUCCEEDED


def test_intent_done_empties_the_outbox() -> None:
    p = pipeline()
    run = started(p)
    for intent in run.outbox:
        run = decide(run, IntentDone(intent.id), Context(p, T0))
    assert run.outbox == ()


def test_progress_reports_measure_the_step_rate() -> None:
    p = pipeline()
    run = started(p)
    run = decide(run, TrainerReported(1, "progress", T0 + 10, step=100, total_steps=1000),
                 Context(p, T0 + 10))
    run = decide(run, TrainerReported(1, "progress", T0 + 20, step=200, total_steps=1000),
                 Context(p, T0 + 20))
    assert run.progress.rate == pytest.approx(10.0)
    assert run.attempts[0].progress_step == 200


def test_deadline_policy_switches_a_spot_attempt_to_standard_when_time_runs_short() -> None:
    p = replace(pipeline(escalation=EscalationKind.DEADLINE, restart_overhead_s=60),
                deadline_s=3600.0)
    run = started(p)
    # 1000 steps at 0.5 steps/s = 2000 s of work; at T0+1500 with 100 steps done it cannot wait.
    run = decide(run, TrainerReported(1, "progress", T0 + 100, step=50, total_steps=1000),
                 Context(p, T0 + 100))
    run = decide(run, TrainerReported(1, "checkpoint", T0 + 200, step=100, total_steps=1000,
                                      checkpoint_uri="gs://c/p/r1/step-100"), Context(p, T0 + 200))
    run = decide(run, Tick(), Context(p, T0 + 1500))
    assert run.attempts[0].cancel_reason == "switch"
    assert "run.deadline_at_risk" in published(run)
    run = ended(run, p, JobPhase.CANCELLED, now=T0 + 1510)
    assert run.attempts[-1].capacity is Capacity.STANDARD
    assert run.attempts[-1].resumed_from_step == 100


def test_run_document_round_trips() -> None:
    p = pipeline()
    run = ended(started(p), p, JobPhase.FAILED, FailureClass.PREEMPTED,
                checkpoint=Checkpoint(7, "u"))
    assert Run.from_dict(run.to_dict()) == run
    assert run.to_dict()["active"] is True
    assert run.attempts[0].state is AttemptState.FAILED


def stockout(run: Run, p: Pipeline, now: float) -> Run:
    """The current attempt sits queued past the stockout wait, is cancelled, and the backoff ends."""
    current = run.current
    assert current is not None
    intent = [i for i in run.outbox if i.kind == "launch"][-1]
    run = decide(run, LaunchDone(intent.id, current.number, f"job-{current.number}"),
                 Context(p, now))
    run = decide(run, Tick(), Context(p, now + p.recovery.stockout_wait_s + 1))
    run = decide(run, JobObserved(current.number, JobStatus(f"job-{current.number}",
                                                            JobPhase.CANCELLED)),
                 Context(p, now + p.recovery.stockout_wait_s + 2))
    return decide(run, Tick(), Context(p, now + p.recovery.stockout_wait_s + 600))


def test_stockouts_in_every_region_move_to_standard_and_stay_during_the_cooldown() -> None:
    p = replace(pipeline(stockout_wait_s=60, spot_cooldown_s=3600),
                job=replace(pipeline().job, regions=("us-central1", "europe-west4")))
    run = new_run(run_id="r1", pipeline=p, now=T0, data_uri="d", snapshot_id=None)
    run = stockout(run, p, T0)
    assert [a.capacity for a in run.attempts] == [Capacity.SPOT, Capacity.SPOT]
    run = stockout(run, p, T0 + 1000)
    assert run.attempts[-1].capacity is Capacity.STANDARD
    assert "no Spot capacity in any of 2 region(s)" in (run.escalated or {}).get("reason", "")
    run = launched(run, p, T0 + 1700)
    cooling = decide(run, Tick(), Context(p, T0 + 2000))
    assert cooling.attempts[-1].cancel_reason is None  # no deadline: Spot preferred, but cooling
    after = decide(run, Tick(), Context(p, T0 + 1700 + 3600))
    assert after.attempts[-1].cancel_reason == "switch" and after.next_capacity is Capacity.SPOT


def test_never_escalating_pipeline_keeps_waiting_for_spot_after_stockouts() -> None:
    p = replace(pipeline(stockout_wait_s=60, escalation=EscalationKind.NEVER),
                job=replace(pipeline().job, regions=("us-central1",)))
    run = new_run(run_id="r1", pipeline=p, now=T0, data_uri="d", snapshot_id=None)
    run = stockout(stockout(run, p, T0), p, T0 + 1000)
    assert [a.capacity for a in run.attempts] == [Capacity.SPOT] * 3


def test_a_run_past_its_cost_budget_is_stopped_and_fails_with_budget() -> None:
    p = replace(pipeline(), max_cost=1.0, prices=(("spot", 0.5), ("standard", 2.0)))
    run = started(p)  # running on spot from T0 at 0.5 per hour
    within = decide(run, Tick(), Context(p, T0 + 3600))
    assert within.status is RunStatus.RUNNING
    over = decide(run, Tick(), Context(p, T0 + 3 * 3600))
    assert over.status is RunStatus.CANCELLING and kinds(over)[-1] == "cancel"
    assert published(over)[-1] == "run.budget_exceeded"
    done = ended(over, p, JobPhase.CANCELLED, now=T0 + 3 * 3600 + 30)
    assert done.status is RunStatus.FAILED_BUDGET
    assert "cost budget exhausted" in (done.end_reason or "")
    assert published(done)[-1] == "run.failed"


def test_what_a_run_spent_is_the_ledger_s_total_with_its_accelerators() -> None:
    from spotorch.core.cost import ledger
    from spotorch.core.moves import spent
    from spotorch.core.pipeline import WorkerPool

    p = replace(pipeline(), job=replace(pipeline().job, worker_pools=(
        WorkerPool(accelerator_type="NVIDIA_TESLA_A100", accelerator_count=8, replica_count=2),)))
    run = started(p)
    host = 4 * 0.011149 + 15 * 0.001494  # n1-standard-4 on Spot
    assert spent(run, Context(p, T0 + 3600)) == pytest.approx(2 * (host + 8 * 1.147))
    assert spent(run, Context(p, T0 + 3600)) == ledger(run, p, T0 + 3600).total


def test_spot_history_counts_only_what_spot_attempts_showed() -> None:
    from spotorch.core.escalation import spot_history

    p = pipeline(escalation=EscalationKind.NEVER)
    run = started(p)  # spot, running from T0
    run = ended(run, p, JobPhase.FAILED, FailureClass.PREEMPTED, now=T0 + 3600)
    intent = [i for i in run.outbox if i.kind == "launch"][-1]
    run = decide(run, LaunchDone(intent.id, 2, "job-2"), Context(p, T0 + 3600))
    history = spot_history(run, T0 + 3600 + 600)  # attempt 2 queued for 10 minutes
    assert history.run_s == pytest.approx(3600)
    assert history.wait_s == pytest.approx(600 - 60)
    assert history.waits == 0 and history.down_at == pytest.approx(T0 + 3600 + 600)
    running = decide(run, JobObserved(2, JobStatus("job-2", JobPhase.RUNNING)),
                     Context(p, T0 + 3600 + 900))
    after = spot_history(running, T0 + 3600 + 1000)
    assert after.waits == 1 and after.wait_s == pytest.approx(900 - 60)
