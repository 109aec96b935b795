"""Spot or standard: the run's view for the escalation policy, its Spot history, and the rules
shared with the simulator."""

from __future__ import annotations

from dataclasses import dataclass, replace

from spotorch.core.context import Context
from spotorch.core.model import Attempt, FailureClass, Run
from spotorch.core.moves import fmt_s, iso, publish
from spotorch.core.pipeline import Capacity, EscalationKind
from spotorch.core.policy import PolicyView, choose_capacity

# ---------------------------------------------------------------- the escalation policy

def _work_estimates(run: Run, ctx: Context) -> tuple[float | None, float]:
    """Estimated compute of the whole task and the part already checkpointed, in seconds."""
    total_steps = run.progress.total_steps
    total_s = ctx.recovery.expected_compute_s
    measured = (run.hardware or {}).get("expected_compute_s")  # probed before the run (issue 19)
    if isinstance(measured, int | float) and measured > 0:
        total_s = float(measured)
    if total_steps and run.progress.rate:
        total_s = total_steps / run.progress.rate
    if total_s is None or not total_steps:
        return total_s, 0.0
    done_steps = run.latest_checkpoint.step if run.latest_checkpoint else 0
    return total_s, total_s * min(done_steps, total_steps) / total_steps


def policy_view(run: Run, ctx: Context, *, current: Capacity | None,
                spot_available: bool, assumed: bool | None = None) -> PolicyView:
    """What the escalation policy sees of the run now: time, deadline, work left, Spot history."""
    total_s, done_s = _work_estimates(run, ctx)
    deadline_s = None if run.deadline_at is None else run.deadline_at - run.created_at
    changeovers = sum(1 for a, b in zip(run.attempts, run.attempts[1:], strict=False)
                      if a.capacity != b.capacity)
    history = spot_history(run, ctx.now)
    changed = (run.escalated or {}).get("at")  # set by launching when the capacity changed
    return PolicyView(now_s=ctx.now - run.created_at, deadline_s=deadline_s,
                      work_total_s=total_s, work_done_s=done_s,
                      restart_overhead_s=ctx.recovery.restart_overhead_s, current=current,
                      spot_available=spot_available, preemptions=run.counters.preemptions,
                      changeovers=changeovers, tick_s=ctx.recovery.decision_interval_s,
                      spot_run_s=history.run_s, spot_wait_s=history.wait_s,
                      spot_waits=history.waits,
                      spot_down_at_s=None if history.down_at is None
                      else history.down_at - run.created_at,
                      spot_assumed=current is Capacity.STANDARD if assumed is None else assumed,
                      changed_at_s=float(changed) - run.created_at
                      if isinstance(changed, int | float) else None,
                      spot_failures_left=spot_failures_left(run, ctx))


# A Spot attempt queued longer than this is waiting for capacity, not just being provisioned.
SPOT_QUEUE_GRACE_S = 60.0


@dataclass(frozen=True)
class SpotHistory:
    """What this run's own Spot attempts showed of Spot capacity (nothing is seen on standard)."""

    run_s: float = 0.0  # time Spot attempts ran, until preemption, cancel or now
    wait_s: float = 0.0  # time Spot attempts waited for capacity beyond provisioning
    waits: int = 0  # Spot attempts that waited for capacity and then started
    down_at: float | None = None  # last time a Spot attempt found no capacity (epoch seconds)


def spot_history(run: Run, now: float) -> SpotHistory:
    """Sum up the Spot attempts: running time, waits for capacity, and the last sign of none."""
    run_s = wait_s = 0.0
    waits = 0
    down_at: float | None = None
    for a in run.attempts:
        if a.capacity is not Capacity.SPOT:
            continue
        queued_from = a.queued_since or a.created_at
        queued_to = a.started_at or a.ended_at or now
        waited = max(queued_to - queued_from - SPOT_QUEUE_GRACE_S, 0.0)
        wait_s += waited
        if waited > 0:
            down_at = max(down_at or 0.0, queued_to if a.started_at is None else queued_from)
            waits += a.started_at is not None
        if a.started_at is not None:
            run_s += max((a.ended_at or now) - a.started_at, 0.0)
        if a.failure is FailureClass.PREEMPTED and a.ended_at is not None:
            down_at = max(down_at or 0.0, a.ended_at)
    for p in run.probes:
        if p.found is False:  # a probe that waited in vain saw no capacity until it gave up
            down_at = max(down_at or 0.0, p.ended_at or now)
    return SpotHistory(run_s, wait_s, waits, down_at)


def policy_capacity(run: Run, ctx: Context, *, current: Capacity | None,
                     spot_available: bool) -> Capacity:
    """Spot or standard for the run's next attempt, as its pipeline's escalation policy says."""
    view = policy_view(run, ctx, current=current, spot_available=spot_available)
    return choose_capacity(view, ctx.recovery)


def escalation_reason(run: Run, ctx: Context, failure: FailureClass) -> str:
    """Why the run leaves Spot, in words for its history and events."""
    recovery = ctx.recovery
    if spot_failures_left(run, ctx) <= 0:
        return budget_words(run, ctx) + ": one more Spot failure would end the run"
    if recovery.escalation is EscalationKind.COUNT:
        return f"{run.counters.preemptions} preemptions (escalate after " \
               f"{recovery.escalate_after_preemptions})"
    if recovery.escalation is EscalationKind.ALWAYS_STANDARD:
        return "pipeline runs on standard VMs"
    return f"deadline: Spot too risky after {failure} (time left " \
           f"{fmt_s((run.deadline_at or ctx.now) - ctx.now)})"


def deadline_warning(run: Run, ctx: Context, wanted: Capacity, current: Attempt) -> Run:
    """Publish run.deadline_at_risk once, when a Spot attempt must give way to standard VMs."""
    if run.deadline_warned or run.deadline_at is None or wanted is not Capacity.STANDARD \
            or current.capacity is not Capacity.SPOT:
        return run
    total_s, done_s = _work_estimates(run, ctx)
    deadline_at = run.deadline_at
    run = replace(run, deadline_warned=True)
    return publish(run, ctx, "run.deadline_at_risk", deadline=iso(deadline_at),
                    remaining_work_s=None if total_s is None else max(total_s - done_s, 0.0),
                    time_left_s=deadline_at - ctx.now, action="switching to standard VMs")


# ---------------------------------------------------------------- the Spot failure budgets
# A budget ends a run only when no capacity could finish it (issue 39): while standard VMs may
# still finish it, a spent preemption or stockout budget moves the run to standard instead.

def spot_failures_left(run: Run, ctx: Context) -> int:
    """How many more preemptions or stockouts the budgets allow before one ends the run."""
    recovery = ctx.recovery
    return min(recovery.max_preemptions - run.counters.preemptions,
               recovery.max_stockouts - run.counters.stockouts)


def budget_words(run: Run, ctx: Context) -> str:
    """The Spot budgets' use, e.g. 'preemption budget: 20 of 20 used'."""
    recovery, counters = ctx.recovery, run.counters
    if recovery.max_preemptions - counters.preemptions <= \
            recovery.max_stockouts - counters.stockouts:
        return f"preemption budget: {counters.preemptions} of {recovery.max_preemptions} used"
    return f"stockout budget: {counters.stockouts} of {recovery.max_stockouts} used"


def standard_cannot_finish(run: Run, ctx: Context) -> str | None:
    """Why standard VMs can no longer finish the run by its deadline; None when they can (or
    when there is no deadline, or the work left is unknown: then they may)."""
    if run.deadline_at is None:
        return None
    total_s, done_s = _work_estimates(run, ctx)
    if total_s is None:
        return None
    work_left = max(total_s - done_s, 0.0)
    overhead = ctx.recovery.restart_overhead_s
    time_left = run.deadline_at - ctx.now
    if work_left + overhead <= time_left:
        return None
    return (f"standard VMs cannot finish by the deadline either ({fmt_s(work_left)} of work "
            f"and a {fmt_s(overhead)} launch, {fmt_s(max(time_left, 0.0))} left)")


def budget_escape(run: Run, ctx: Context, attempt: Attempt,
                  failure: FailureClass) -> tuple[bool, str]:
    """Once a Spot failure budget is spent: (True, why) when the run moves to standard VMs
    instead of ending; (False, why no capacity can finish it) when the budget ends it."""
    if failure not in (FailureClass.PREEMPTED, FailureClass.STOCKOUT) \
            or attempt.capacity is Capacity.STANDARD:
        return False, ""
    if ctx.recovery.escalation is EscalationKind.NEVER:
        return False, "; no capacity can finish it: escalation 'never' allows no standard VMs"
    late = standard_cannot_finish(run, ctx)
    if late is not None:
        return False, f"; no capacity can finish it: {late}"
    left = "" if run.deadline_at is None else \
        f" by the deadline ({fmt_s(run.deadline_at - ctx.now)} left)"
    return True, f"standard VMs can still finish it{left}"


# ---- rules shared with the simulator
# Small pure rules the trace simulator (spotorch.sim) replays exactly as production applies them.

def spot_cooldown_until(now: float, cooldown_s: float) -> float:
    """Until when Spot counts as unavailable after a sign of none (preemption, stockout, queue)."""
    return now + cooldown_s


def spot_cooling(now: float, unavailable_until: float | None) -> bool:
    """True while Spot counts as unavailable: no move back to Spot, and standard not told of it."""
    return now < (unavailable_until or 0.0)
