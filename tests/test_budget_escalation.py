"""A Spot failure budget ends a run only when no capacity could finish it (issue 39): while
standard VMs may still finish it, the escalation rule moves it to standard instead."""

from __future__ import annotations

from dataclasses import replace

from spotorch.core.context import Context
from spotorch.core.decide import decide, new_run
from spotorch.core.model import FailureClass, JobPhase, Run, RunStatus
from spotorch.core.observations import Tick
from spotorch.core.pipeline import Capacity, EscalationKind, Pipeline
from spotorch.core.policy import PolicyView, budget_allows_spot, choose_capacity
from test_domain import T0, ended, launched, pipeline, published, started


def with_deadline(p: Pipeline, deadline_s: float, compute_s: float) -> Pipeline:
    return replace(p, deadline_s=deadline_s,
                   recovery=replace(p.recovery, expected_compute_s=compute_s))


def preempt(run: Run, p: Pipeline, now: float) -> Run:
    run = ended(run, p, JobPhase.FAILED, FailureClass.PREEMPTED, now=now)
    if run.status is RunStatus.RECOVERING:
        assert run.next_action_at is not None
        run = decide(run, Tick(), Context(p, run.next_action_at))
    return launched(run, p, now + 1)


def test_the_last_preemption_the_budget_allows_sends_the_next_attempt_to_standard() -> None:
    p = with_deadline(pipeline(max_preemptions=3, escalation=EscalationKind.DEADLINE,
                               max_no_progress_attempts=99, restart_overhead_s=10.0,
                               decision_interval_s=10.0), 3600.0, 600.0)
    run = started(p)
    for n in range(3):
        run = preempt(run, p, T0 + 10 + n * 10)
        expected = Capacity.STANDARD if n == 2 else Capacity.SPOT
        assert run.attempts[-1].capacity is expected, n
    assert run.active and run.counters.preemptions == 3
    assert run.escalated is not None and "preemption budget: 3 of 3 used" in \
        run.escalated["reason"]
    assert "run.budget_exceeded" not in published(run)
    # On standard, Spot seen back does not tempt the deadline policy while the budget is spent.
    later = decide(run, Tick(), Context(p, T0 + 3000))
    assert later.attempts[-1].capacity is Capacity.STANDARD and len(later.attempts) == 4


def test_a_spent_budget_on_spot_escalates_instead_of_failing() -> None:
    # A Spot attempt already live when the budget is spent (e.g. launched by another rule).
    p = with_deadline(pipeline(max_preemptions=2, escalation=EscalationKind.DEADLINE,
                               max_no_progress_attempts=99, restart_overhead_s=10.0),
                      3600.0, 600.0)
    run = started(p)
    run = replace(run, counters=replace(run.counters, preemptions=2))
    run = ended(run, p, JobPhase.FAILED, FailureClass.PREEMPTED, now=T0 + 100)
    assert run.active and run.attempts[-1].capacity is Capacity.STANDARD
    reason = str((run.escalated or {}).get("reason", ""))
    assert "preemptions budget spent (3 > 2)" in reason
    assert "standard VMs can still finish it by the deadline" in reason


def test_a_budget_ends_the_run_when_standard_cannot_meet_the_deadline_and_says_so() -> None:
    p = with_deadline(pipeline(max_preemptions=2, escalation=EscalationKind.DEADLINE,
                               max_no_progress_attempts=99, restart_overhead_s=60.0),
                      600.0, 3000.0)
    run = started(p)  # already late: the policy starts it on standard; say it got Spot
    spot = replace(run.attempts[-1], capacity=Capacity.SPOT)
    run = replace(run, counters=replace(run.counters, preemptions=2), attempts=(spot,))
    run = ended(run, p, JobPhase.FAILED, FailureClass.PREEMPTED, now=T0 + 100)
    assert run.status is RunStatus.FAILED_PREEMPTED
    assert "preemptions budget exhausted: 3 > 2" in (run.end_reason or "")
    assert "standard VMs cannot finish by the deadline either" in (run.end_reason or "")


def test_escalation_never_keeps_spot_and_the_budget_names_why() -> None:
    p = pipeline(max_preemptions=1, escalation=EscalationKind.NEVER, max_no_progress_attempts=99)
    run = preempt(started(p), p, T0 + 10)
    assert run.attempts[-1].capacity is Capacity.SPOT
    run = ended(run, p, JobPhase.FAILED, FailureClass.PREEMPTED, now=T0 + 100)
    assert run.status is RunStatus.FAILED_PREEMPTED
    assert "escalation 'never' allows no standard VMs" in (run.end_reason or "")


def test_a_spent_stockout_budget_also_moves_to_standard() -> None:
    p = pipeline(max_stockouts=1, escalation=EscalationKind.DEADLINE, backoff_base_s=1.0)
    p = replace(p, job=replace(p.job, regions=("us-central1", "europe-west4", "asia-east1")))
    run = started(p)
    run = ended(run, p, JobPhase.FAILED, FailureClass.STOCKOUT, now=T0 + 100)
    if run.status is RunStatus.RECOVERING:
        run = decide(run, Tick(), Context(p, T0 + 1000))
    assert run.attempts[-1].capacity is Capacity.STANDARD
    assert "stockout budget: 1 of 1 used" in (run.escalated or {}).get("reason", "")


def test_choose_capacity_applies_the_budget_to_every_policy_but_never() -> None:
    view = PolicyView(now_s=0.0, deadline_s=None, work_total_s=None, work_done_s=0.0,
                      restart_overhead_s=60.0, current=None, spot_available=True, preemptions=5,
                      spot_failures_left=0)
    assert not budget_allows_spot(view)
    for kind in (EscalationKind.DEADLINE, EscalationKind.COUNT):
        recovery = replace(pipeline().recovery, escalation=kind, escalate_after_preemptions=99)
        assert choose_capacity(view, recovery) is Capacity.STANDARD, kind
        assert choose_capacity(replace(view, spot_failures_left=1), recovery) is Capacity.SPOT
    never = replace(pipeline().recovery, escalation=EscalationKind.NEVER)
    assert choose_capacity(view, never) is Capacity.SPOT
    # A live Spot attempt is not cancelled for it: its preemption escalates (budget_escape).
    live = replace(view, current=Capacity.SPOT)
    deadline = replace(pipeline().recovery, escalation=EscalationKind.DEADLINE)
    assert choose_capacity(live, deadline) is Capacity.SPOT
    # On standard, Spot is not taken back while the budget is spent.
    standard = replace(view, current=Capacity.STANDARD, spot_assumed=False)
    assert choose_capacity(standard, deadline) is Capacity.STANDARD


def test_a_fresh_run_with_budget_left_starts_on_spot() -> None:
    p = pipeline(escalation=EscalationKind.DEADLINE)
    run = new_run(run_id="r1", pipeline=p, now=T0, data_uri="gs://b/d/", snapshot_id="s")
    assert run.attempts[0].capacity is Capacity.SPOT
