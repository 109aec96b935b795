"""Escalation policies: pure functions that pick Spot or standard capacity at each decision point."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import NamedTuple

from spotorch.core.pipeline import Capacity, EscalationKind, RecoveryPolicy

# How long, at worst, until the policy is consulted again (reconcile tick plus event latency).
# Every deadline guard keeps one such period in hand, because nothing can react faster.
DEFAULT_TICK_S = 300.0


class PolicyError(Exception):
    """Base of this module's errors."""


class UnknownEscalation(PolicyError):
    """The recovery policy names an escalation kind no policy implements."""


@dataclass(frozen=True)
class PolicyView:
    """What a policy may know at a decision point; times are seconds since the run started."""

    now_s: float  # seconds since the run started
    deadline_s: float | None  # seconds since the run started; None = no deadline
    work_total_s: float | None  # compute the whole task needs (same speed on spot and standard)
    work_done_s: float  # compute already safely done (checkpointed / survives a restart)
    restart_overhead_s: float  # time lost by each (re)launch before useful work
    current: Capacity | None  # capacity of the live attempt (running or queued); None between
    # False while Spot is known unavailable. On STANDARD, pass True only with positive evidence
    # that Spot capacity is back: True makes the policy cancel standard and relaunch on Spot.
    spot_available: bool
    preemptions: int  # preemptions so far in this run
    changeovers: int = 0  # capacity switches so far
    tick_s: float = DEFAULT_TICK_S  # longest time until the next decision point (safety margin)
    # Spot history of this run, seen only through its own Spot attempts (a Spot attempt is
    # "running" from when its VM starts until preemption/cancel, "queued" while it waits for
    # capacity); nothing is learnt while on standard. Defaults: no history yet.
    spot_run_s: float = 0.0  # total time Spot attempts ran, to preemption, cancel or now
    spot_wait_s: float = 0.0  # total time Spot attempts sat queued without capacity, to now
    spot_waits: int = 0  # queued Spot attempts that then started (outages seen to their end)
    spot_down_at_s: float | None = None  # last time an attempt saw no Spot capacity (a
    # preemption, or a tick spent queued); None: never
    # True when spot_available on STANDARD is assumed (a cooldown elapsed), not observed.
    spot_assumed: bool = False
    # True when the live Spot attempt has not started: it waits for capacity (or was just
    # launched). A queued attempt that finds capacity pays a launch overhead, like a new one.
    spot_queued: bool = False
    # FLEX_START (Dynamic Workload Scheduler) offered with this expected queue wait; None: the
    # pipeline does not allow it.
    flex_wait_s: float | None = None
    # How long Spot capacity has been seen available without a break, up to now: since a
    # probe found it (on standard), since the live Spot attempt got it, or, in the simulator's
    # visible view, since the trace shows it. None: not known (no age-based hysteresis).
    spot_up_s: float | None = None
    # How long Spot capacity has been seen unavailable without a break, up to now: in the
    # simulator's visible view, since the trace shows it gone. None: not known (production
    # does not pass it: an outage's start is seen only by a Spot attempt that was running).
    spot_down_s: float | None = None
    # When the run last moved between capacities (seconds since it started): the launch of the
    # first attempt on its current capacity after one on another. None: never (the minimum
    # dwell, may_switch, does not hold it back).
    changed_at_s: float | None = None
    # How many more Spot failures (preemptions, stockouts) the run's budgets allow before the
    # next one ends the run (the smallest of the budgets left); None: no budget. At 0 another
    # Spot attempt risks ending a run standard VMs could still finish (budget_allows_spot).
    spot_failures_left: int | None = None


class Slack(NamedTuple):
    """The run's position against its deadline, derived once per decision."""

    # A NamedTuple, not a frozen dataclass: as immutable, and built several times per
    # simulated tick (the benchmark replays millions of ticks), at a fifth of the cost.

    remaining_s: float  # wall time left before the deadline
    work_left_s: float  # compute still to do
    overhead_s: float
    tick_s: float

    @property
    def slack_s(self) -> float:
        """Wall time left beyond the work itself: what waiting and restarts may still consume."""
        return self.remaining_s - self.work_left_s

    @property
    def must_run_standard(self) -> bool:
        """True when one more tick away from standard could make the deadline unreachable."""
        return self.slack_s - self.overhead_s < self.tick_s

    @property
    def can_try_spot(self) -> bool:
        """True when a Spot launch may fail at once and still leave time to launch standard."""
        return self.slack_s - 2.0 * self.overhead_s >= self.tick_s


def slack_of(view: PolicyView) -> Slack | None:
    """The run's slack, or None when there is no deadline or the amount of work is unknown."""
    if view.deadline_s is None or view.work_total_s is None:
        return None
    # Positional: built at every decision (millions of times per benchmark grid), 40% faster.
    return Slack(view.deadline_s - view.now_s, max(view.work_total_s - view.work_done_s, 0.0),
                 view.restart_overhead_s, view.tick_s)


# ---------------------------------------------------------------------------------------------
# Baselines


def always_spot(view: PolicyView) -> Capacity:
    """Spot only: wait through every outage, whatever the deadline."""
    return Capacity.SPOT


def always_standard(view: PolicyView) -> Capacity:
    """Standard VMs from the start."""
    return Capacity.STANDARD


def count_based(view: PolicyView, after_preemptions: int) -> Capacity:
    """Spot until N preemptions, then standard for good (Flyte's interruptible last retry)."""
    return Capacity.STANDARD if view.preemptions >= after_preemptions else Capacity.SPOT


def greedy(view: PolicyView) -> Capacity:
    """Spot whenever possible; standard only once the deadline forces it, then to the end."""
    slack = slack_of(view)
    if slack is None or slack.work_left_s <= 0.0:
        return Capacity.SPOT
    if view.current is Capacity.STANDARD or slack.must_run_standard:
        # On standard the slack stays constant, so once forced there is no way back.
        return Capacity.STANDARD
    return Capacity.SPOT


def uniform_progress(view: PolicyView) -> Capacity:
    """Uniform Progress as published in "Can't Be Late" (Wu et al., NSDI'24): the reference."""
    # The paper's four rules; cp(t) = work done, ep(t) = C0 * t / R0, d = restart overhead:
    # 1. uniform progress: idle and cp(t) < ep(t) -> on-demand, stay on it to catch up;
    # 2. exploitation: Spot whenever available (even when behind), stay until preempted;
    # 3. hysteresis: on on-demand, stay until cp(t) >= ep(t + 2d);
    # 4. safety net: idle and R(t) < C(t) + 2d -> on-demand until the end.
    # Applied as the authors' simulator does (sky_spot, strategy rc_cr_threshold):
    # - on on-demand while Spot is unavailable, stay on it, even ahead of the line: leaving
    #   would only idle until Spot is back (rule 3 reads "stay on it", condition2 is only
    #   consulted when Spot is there to switch to);
    # - the hysteresis keeps on-demand while cp(t) <= ep(t + 2d) (their condition2 >= 0);
    # - rule 4 covers a run that is idle or on on-demand, and a Spot attempt still waiting
    #   for capacity is idle (their simulator has no queued Spot: it asks for NONE);
    # - time is rounded to decision ticks: their ceil/floor to the gap is exactly one tick of
    #   margin when the deadline is a whole number of ticks, as here;
    # - their strong guarantee (R(t) <= C(t) + d + tick: on-demand) also lets a Spot VM past
    #   its launch overhead keep running; here it forces on-demand like every policy's guard.
    #   The two agree in this model: running Spot keeps the slack constant, a Spot launch needs
    #   slack >= 2d + tick (rule 4) and its overhead eats d, so a running Spot VM past its
    #   overhead always has slack >= d + tick (tests/test_policy.py checks the agreement).
    slack = slack_of(view)
    if slack is None or slack.work_left_s <= 0.0:
        return Capacity.SPOT
    assert view.deadline_s is not None and view.work_total_s is not None
    total, deadline, d = view.work_total_s, view.deadline_s, view.restart_overhead_s
    done, now = view.work_done_s, view.now_s
    spot_running = view.current is Capacity.SPOT and view.spot_available and not view.spot_queued

    def expected(t: float) -> float:
        return total * t / deadline

    if slack.must_run_standard:  # the strong guarantee
        return Capacity.STANDARD
    if not spot_running and slack.slack_s < 2.0 * d + slack.tick_s:  # rule 4
        return Capacity.STANDARD
    if view.current is Capacity.STANDARD and (
            not view.spot_available or done <= expected(now + 2.0 * d)):  # rule 3
        return Capacity.STANDARD
    if view.spot_available:  # rule 2
        return Capacity.SPOT
    if done < expected(now):  # rule 1
        return Capacity.STANDARD
    return Capacity.SPOT  # idle: wait for Spot (a queued Spot attempt costs nothing)


# ---------------------------------------------------------------------------------------------
# spotorch's deadline policy


@dataclass(frozen=True)
class DeadlineTuning:
    """Knobs of the deadline policy (tuned on the first half of every trace; see the benchmark)."""
    # The optimum is flat: each knob +-50% moves each cell by under 1%.

    # Wait out an outage only with slack >= guard + wait_reserve x work left; else buy standard.
    wait_reserve: float = 0.2
    # Leave standard for Spot only with slack >= guard + switch_reserve x work left x overhead /
    # expected Spot up-time (all in hours): expected preemptions left x what each one costs.
    switch_reserve: float = 1.0
    # Prior of the run's mean Spot up-time and outage (hours), and its weight in pseudo-events.
    prior_up_h: float = 5.0
    prior_up_weight: float = 3.0
    prior_down_h: float = 1.0
    prior_down_weight: float = 1.0
    # On standard, leave for Spot only once its capacity has been seen for this many restart
    # overheads (0: at once). A return that ends within the launch overhead costs two launches
    # and buys nothing, and on the public traces a quarter to a third of returns last 15 min or
    # less; but every return then loses the wait's Spot discount. Off by default: at 0.5 the
    # benchmark gains 0.4-0.7% at 0.2 h, loses 0.3-0.7% at 0.1 h and up to 3% on memoryless
    # (Markov) availability, and meets no further target (docs/policy-benchmark.md).
    switch_after_overheads: float = 0.0


DEFAULT_TUNING = DeadlineTuning()


def mean_up_h(view: PolicyView, tuning: DeadlineTuning = DEFAULT_TUNING) -> float:
    """Expected Spot up-time (h) of this run: up-time seen per preemption, shrunk to a prior."""
    # Up-times are censored by cancels; run time over preemptions is the exponential MLE.
    weight = tuning.prior_up_weight
    return (view.spot_run_s / 3600.0 + weight * tuning.prior_up_h) / (view.preemptions + weight)


def mean_down_h(view: PolicyView, tuning: DeadlineTuning = DEFAULT_TUNING) -> float:
    """Expected Spot outage (h) of this run: queued time per outage seen to its end, shrunk."""
    weight = tuning.prior_down_weight
    return (view.spot_wait_s / 3600.0 + weight * tuning.prior_down_h) / (view.spot_waits + weight)


def deadline_policy(view: PolicyView, tuning: DeadlineTuning = DEFAULT_TUNING) -> Capacity:
    """spotorch's policy: spend slack on waiting for Spot and on switches, never the deadline."""
    # Slack (time left minus work left) buys two things: idling through an outage for free,
    # and the restart overheads of moving between Spot and standard. At a tight deadline the
    # second matters most (the offline optimum hardly ever idles then); at a loose one, the
    # first. Two reserves, both proportional to the work left, ration the two uses.
    slack = slack_of(view)
    if slack is None or slack.work_left_s <= 0.0:
        return Capacity.SPOT
    if slack.must_run_standard:
        return Capacity.STANDARD
    guard = 2.0 * slack.overhead_s + slack.tick_s  # a Spot launch, a fallback launch, a tick
    if view.current is Capacity.STANDARD:
        if not view.spot_available:
            # Leaving standard inside an outage only to relaunch it later costs an overhead at
            # the on-demand price and buys nothing: stay until Spot is back.
            return Capacity.STANDARD
        if view.spot_assumed and view.spot_down_at_s is not None and \
                view.now_s - view.spot_down_at_s < mean_down_h(view, tuning) * 3600.0:
            # Spot is only assumed back: not before an outage of this run's typical length.
            return Capacity.STANDARD
        if view.spot_up_s is not None and \
                view.spot_up_s < tuning.switch_after_overheads * slack.overhead_s:
            return Capacity.STANDARD
        # A round trip to Spot costs two overheads; each expected preemption of the work left
        # costs about as much again, so the bar scales with work left / expected up-time.
        reserve = (tuning.switch_reserve * slack.work_left_s * slack.overhead_s / 3600.0
                   / mean_up_h(view, tuning))
        return Capacity.SPOT if slack.slack_s >= guard + reserve else Capacity.STANDARD
    paid = _flex_or_standard(view, slack, guard)
    if view.spot_available:
        return Capacity.SPOT if slack.can_try_spot else paid
    reserve = tuning.wait_reserve * slack.work_left_s
    return Capacity.SPOT if slack.slack_s >= guard + reserve else paid


def _flex_or_standard(view: PolicyView, slack: Slack, guard: float) -> Capacity:
    """Paid capacity when leaving Spot: FLEX_START if the slack covers its wait, else standard."""
    # FLEX_START is cheaper than standard and never preempted once it runs, but waits for
    # capacity first. Take it only when twice the expected wait still leaves the guard, so a
    # long wait rarely ends in a timeout; flex_max_wait_s caps the wait so a timeout still
    # leaves time for standard.
    if view.flex_wait_s is not None and slack.slack_s >= guard + 2.0 * view.flex_wait_s:
        return Capacity.FLEX_START
    return Capacity.STANDARD


def flex_max_wait_s(view: PolicyView, configured_s: float) -> float:
    """The max wait to give a FLEX_START launch now: what leaves time for standard after it."""
    slack = slack_of(view)
    if slack is None:
        return configured_s
    guard = 2.0 * slack.overhead_s + slack.tick_s
    return max(min(configured_s, slack.slack_s - guard), slack.tick_s)


# ---------------------------------------------------------------------------------------------
# The minimum dwell: how often a run may switch capacity


# A run stays on a capacity it moved to for at least one restart overhead (and one decision
# interval) before it switches again, unless the deadline forces standard. A switch reversed
# sooner buys nothing: its attempt had not done useful work yet, and each switch costs a
# restart. (Issue 27: one run flapped Spot -> standard -> Spot 8 times in 58 s.) Production
# (decide's tick switch, a probe's answer, launching a probe) and the simulator's production
# view apply it through may_switch; docs/policy-benchmark.md measures what it costs.
MIN_DWELL_OVERHEADS = 1.0


def min_dwell_s(view: PolicyView) -> float:
    """The shortest time a run stays on a capacity it moved to (see MIN_DWELL_OVERHEADS)."""
    return max(MIN_DWELL_OVERHEADS * view.restart_overhead_s, view.tick_s)


def may_switch(view: PolicyView, wanted: Capacity) -> bool:
    """Whether the live attempt may be switched to `wanted` now: the minimum dwell since the
    run's last move has passed, or the deadline forces standard."""
    if view.changed_at_s is None or view.now_s - view.changed_at_s >= min_dwell_s(view):
        return True
    slack = slack_of(view)
    return wanted is Capacity.STANDARD and slack is not None and slack.must_run_standard


# ---------------------------------------------------------------------------------------------
# Spot probes: looking at Spot while running on standard


@dataclass(frozen=True)
class ProbeTerms:
    """What a probe costs and what finding Spot back is worth; all money in one currency."""

    # A probe is a minimal Spot job of the run's machine shape, cancelled as soon as it runs
    # (capacity confirmed) or after `wait_s` without capacity. Vertex AI bills a Spot job from
    # provisioning to its end, nothing while it is queued: a probe that finds capacity costs
    # `hit_cost`, one that does not costs `miss_cost` (0 unless the shape bills otherwise).
    hit_cost: float
    saving_per_s: float  # standard price - Spot price, for the run's whole shape, per second
    wait_s: float = 600.0  # how long a probe waits for capacity before it is cancelled
    miss_cost: float = 0.0


def probe_worth(view: PolicyView, terms: ProbeTerms,
                policy: Callable[[PolicyView], Capacity] | None = None) -> bool:
    """True when a Spot probe now is worth its cost; only a run on standard ever probes."""
    # A probe answers one question: is Spot back? The answer is worth something only if the
    # run's own policy would leave standard on a yes; then it buys the Spot discount on the
    # work left, less the round trip (a Spot launch and, at worst, a standard relaunch, both
    # overheads at the standard premium). Outages are taken as memoryless with this run's mean
    # outage m (Spot history, shrunk to a prior): a probe waiting w finds capacity with
    # p = 1 - exp(-w / m), whatever the time already spent in the outage.
    if view.current is not Capacity.STANDARD:
        return False  # a Spot attempt, running or queued, sees Spot capacity itself
    slack = slack_of(view)
    if slack is None or slack.work_left_s <= 0.0:
        return False
    gain = terms.saving_per_s * (slack.work_left_s - 2.0 * slack.overhead_s)
    p_hit = 1.0 - math.exp(-terms.wait_s / max(mean_down_h(view) * 3600.0, 1.0))
    if p_hit * (gain - terms.hit_cost) <= (1.0 - p_hit) * terms.miss_cost:
        return False
    decide = policy or deadline_policy
    # vars() and a constructor, not dataclasses.replace: this runs at every tick on standard.
    # The answer's age is the probe's to tell: the question here is only whether Spot, seen
    # back, would be taken.
    seen = PolicyView(**{**vars(view), "spot_available": True, "spot_assumed": False,
                         "spot_up_s": None})
    return decide(seen) is Capacity.SPOT


# ---------------------------------------------------------------------------------------------
# Regions chosen by history


@dataclass(frozen=True)
class RegionRecord:
    """What the shared record holds of one region's Spot capacity for one shape, within its TTL."""

    observed_s: float  # time covered by observations (attempts, probes) of any run
    available_s: float  # of which Spot had capacity
    preemptions: int = 0  # capacity lost while observed (running attempts preempted)


def rank_regions(records: Sequence[RegionRecord], prior_available: float = 0.5,
                 prior_weight_s: float = 3600.0) -> list[int]:
    """Region indices, best first, for the next Spot attempt (ties keep the configured order)."""
    # Capacity share observed, shrunk to a prior so a region seen for minutes is not ranked on
    # them; then the preemption rate (capacity that comes and goes costs a relaunch each time).
    def key(index: int) -> tuple[float, float, int]:
        r = records[index]
        share = (r.available_s + prior_available * prior_weight_s) / \
            (r.observed_s + prior_weight_s)
        rate = r.preemptions / max(r.available_s, 1.0)
        return (-round(share, 6), rate, index)

    return sorted(range(len(records)), key=key)


# ---------------------------------------------------------------------------------------------
# Dispatch


def _count(view: PolicyView, recovery: RecoveryPolicy) -> Capacity:
    return count_based(view, recovery.escalate_after_preemptions)


_DISPATCH: Mapping[EscalationKind, Callable[[PolicyView, RecoveryPolicy], Capacity]] = (
    MappingProxyType({
        EscalationKind.NEVER: lambda view, _recovery: always_spot(view),
        EscalationKind.ALWAYS_STANDARD: lambda view, _recovery: always_standard(view),
        EscalationKind.COUNT: _count,
        EscalationKind.DEADLINE: lambda view, _recovery: deadline_policy(view),
    }))


def budget_allows_spot(view: PolicyView) -> bool:
    """False once the Spot failure budgets are spent: one more preemption or stockout would
    end the run, so a policy that may use standard VMs must not risk Spot again (issue 39)."""
    return view.spot_failures_left is None or view.spot_failures_left > 0


def choose_capacity(view: PolicyView, recovery: RecoveryPolicy) -> Capacity:
    """The capacity the run should be on now; a change means cancel and relaunch on it."""
    try:
        policy = _DISPATCH[recovery.escalation]
    except KeyError as exc:
        raise UnknownEscalation(str(recovery.escalation)) from exc
    wanted = policy(view, recovery)
    if wanted is Capacity.SPOT and view.current is not Capacity.SPOT \
            and recovery.escalation is not EscalationKind.NEVER and not budget_allows_spot(view):
        # The next attempt: the budget would end the run at its first Spot failure, and
        # standard cannot fail so. A live Spot attempt is left alone (cancelling it costs a
        # restart; its preemption moves the run to standard: recovery.budget_escape).
        return Capacity.STANDARD
    return wanted
