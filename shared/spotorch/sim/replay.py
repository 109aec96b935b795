"""Replaying one online policy on one window, in the visible or the production view."""

# The model, shared by every policy, the offline optimum and the brute force that checks it:
# - Time runs in steps of the scenario's step. Spot is available in a step only if it was
#   available for the whole step (model.resample); preemptions land on step boundaries, where
#   the policy is consulted, so it sees every preemption at the moment it happens.
# - Each (re)launch costs the restart overhead of billed time before useful work. Spot runs only
#   while available; a SPOT choice during an outage is a queued Spot attempt, which costs
#   nothing. Standard never fails.
# - Cost is price x time x nodes, pro rata in the step where the work completes. A run that
#   misses its deadline is charged as if it finished on standard right after it (one more
#   launch), so costs stay comparable.
# - With a checkpoint interval, a preemption loses the work done since the last checkpoint; a
#   switch the policy asks for checkpoints first (a cancel is graceful).
# Views (Scenario.view):
# - VISIBLE: the policy sees the trace's Spot availability at every tick, also on standard.
# - PRODUCTION: what production observes. A Spot attempt sees its own capacity (running, or
#   queued without it); a relaunch after a preemption is decided with Spot unavailable and the
#   first launch with Spot available, as the core does. On standard Spot is unseen: without
#   probes it is assumed back once the domain's cooldown (domain.spot_cooling) has passed, and
#   a switch to Spot is refused while cooling, as the core does; with probes, standard sees
#   Spot only through a probe's answer (policy.probe_worth decides when to launch one). A probe
#   that finds capacity is billed Probes.billed_s at the Spot price; its answer arrives
#   latency_s after capacity was found (or wait_s after launch, without capacity), and a yes
#   also ends the cooldown: positive evidence beats an assumption.
# - In both views the Spot history in PolicyView (spot_run_s, spot_wait_s, spot_waits,
#   spot_down_at_s) comes only from the run's own Spot attempts and probes.
# FLEX_START (Scenario.flex): a flex attempt waits a drawn time, at most its max wait (capped by
# policy.flex_max_wait_s so that a timeout leaves time for standard), then runs to the end
# without preemption at its own price; the policy is not consulted while it is live (as the
# domain's tick skips flex attempts).

from __future__ import annotations

import dataclasses
import math
import zlib
from collections.abc import Callable
from typing import Any

import numpy as np

from spotorch.core.escalation import spot_cooldown_until, spot_cooling
from spotorch.core.pipeline import Capacity, EscalationKind, RecoveryPolicy
from spotorch.core.policy import (
    PolicyView,
    ProbeTerms,
    RegionRecord,
    always_standard,
    choose_capacity,
    flex_max_wait_s,
    greedy,
    may_switch,
    probe_worth,
    rank_regions,
    uniform_progress,
)
from spotorch.core.regions import AVOID_PREEMPTED, AVOID_STOCKOUT, RegionMark, choose_region, mark
from spotorch.sim.model import Flex, FlexWait, Outcome, RegionChoice, Scenario, View, Window

OnlinePolicy = Callable[[PolicyView], Capacity]

SPOT, STANDARD, FLEX = Capacity.SPOT, Capacity.STANDARD, Capacity.FLEX_START

_WAIT_DRAWS: dict[FlexWait, Callable[[np.random.Generator, float], float]] = {
    FlexWait.FIXED: lambda _rng, mean: mean,
    FlexWait.EXPONENTIAL: lambda rng, mean: float(rng.exponential(mean)) if mean > 0 else 0.0,
    FlexWait.UNIFORM: lambda rng, mean: float(rng.uniform(0.0, 2.0 * mean)),
}


def flex_waits(flex: Flex, window: Window) -> np.random.Generator:
    """The window's own stream of flex queue waits, reproducible from the seed and the window."""
    key = zlib.crc32(f"{window.trace}@{window.start_s:.0f}".encode())
    return np.random.default_rng([flex.seed, key])


class ZoneRecord:
    """The shared record of a multi-zone window: every zone's last TTL of Spot behaviour."""

    # Assumed to be as complete as a fleet of runs and probes observing every zone at every
    # step would make it: the most a history can know (an upper bound for this choice).

    def __init__(self, window: Window, scenario: Scenario) -> None:
        assert window.zones is not None and window.zone_past is not None
        full = np.concatenate([window.zone_past, window.zones], axis=1)
        self.past = window.zone_past.shape[1]
        self.ttl = int(scenario.region_ttl_s // scenario.step_s)
        self.dt = float(scenario.step_s)
        zero = np.zeros((full.shape[0], 1), dtype=np.int64)
        self.up = np.concatenate([zero, np.cumsum(full, axis=1)], axis=1)
        drops = np.concatenate([zero, (full[:, :-1] & ~full[:, 1:]).astype(np.int64)], axis=1)
        self.drops = np.concatenate([zero, np.cumsum(drops, axis=1)], axis=1)

    def ranked(self, step: int) -> list[int]:
        """Zones best first at this step, from what the record saw before it."""
        b = self.past + step
        a = max(b - self.ttl, 0)
        records = [RegionRecord(observed_s=(b - a) * self.dt,
                                available_s=float(self.up[z, b] - self.up[z, a]) * self.dt,
                                preemptions=int(self.drops[z, b] - self.drops[z, a]))
                   for z in range(self.up.shape[0])]
        return rank_regions(records)


VIEW_FIELDS = frozenset(f.name for f in dataclasses.fields(PolicyView))


def fast_view(fields: dict[str, Any]) -> PolicyView:
    """PolicyView(**fields) for a dict naming every field, at a sixth of the cost."""
    # Why: PolicyView is a frozen dataclass; its generated __init__ sets each of its 17 fields
    # through object.__setattr__ (about 3 us), and a replay builds one per simulated tick (tens
    # of millions per benchmark grid). Filling the instance dict gives the same object
    # (tests/test_simulate.py compares it with the constructor's) for about 0.5 us.
    view: PolicyView = object.__new__(PolicyView)
    view.__dict__.update(fields)
    return view


def _up_since(avail: list[bool]) -> list[int]:
    """Per step, the step where the current run of availability began (anything when down)."""
    up = np.asarray(avail, dtype=bool)
    starts = np.where(up & ~np.concatenate([[False], up[:-1]]), np.arange(len(up)), 0)
    since: list[int] = np.maximum.accumulate(starts).tolist()
    return since


def _ranked(record: ZoneRecord | None, step: int, zones: int) -> list[str]:
    """The zones best first as production ranks regions: by the record, else in their order."""
    return [str(z) for z in (record.ranked(step) if record is not None else range(zones))]


def run_online(window: Window, scenario: Scenario, policy: OnlinePolicy) -> Outcome:
    """Replay a window through a production policy function, deciding at every step."""
    dt, overhead = float(scenario.step_s), float(scenario.overhead_s)
    total, deadline, checkpoint = float(scenario.task_s), float(scenario.deadline_s), \
        scenario.checkpoint_s
    per_s = scenario.nodes / 3600.0
    avail = window.avail.tolist()
    # Multi-zone: Spot attempts run in one zone at a time; zone_up[z] is zone z's availability.
    zone_up = window.zones.tolist() if window.zones is not None else [avail]
    record = ZoneRecord(window, scenario) \
        if window.zones is not None and scenario.regions is RegionChoice.HISTORY else None
    multizone = window.zones is not None
    zone = 0
    # The zones this run avoids for a while (a stockout, a preemption): production's region rule.
    marks: tuple[RegionMark, ...] = ()
    prefer: int | None = None  # the zone a probe just found capacity in
    probe_zone = 0
    queued_steps = 0
    prices = window.spot_price.tolist()
    od = window.od_price
    n = len(avail)
    production = scenario.view is View.PRODUCTION
    dwell = production and scenario.min_dwell  # decide.py's minimum dwell (policy.may_switch)
    cooldown = scenario.spot_cooldown_s
    probes = scenario.probes if production else None
    flex = scenario.flex
    flex_price = od * flex.price_ratio if flex is not None else math.inf
    rng = flex_waits(flex, window) if flex is not None else None
    flex_wait = None if flex is None else flex.mean_wait_s
    cool_until: float | None = None  # production: Spot counts as unavailable until then
    budget = scenario.max_preemptions
    done = safe = cost = probe_cost = 0.0
    current: Capacity | None = None
    last: Capacity | None = None
    changed_at: float | None = None  # when the run last moved between capacities (the dwell)
    running = False
    overhead_left = 0.0
    preemptions = changeovers = probes_sent = 0
    just_preempted = False
    # Spot history as production sees it: only through Spot attempts and probes.
    spot_run_s = spot_wait_s = 0.0
    spot_waits = 0
    queued = False  # the live Spot attempt spent the last step waiting for capacity
    last_down: float | None = None  # when a Spot attempt or probe last saw no Spot capacity
    probe_due: int | None = None  # step at which the probe in flight answers
    probe_hit = False
    # Probes see capacity without a break from when one found it until its RUNNING is seen; a
    # probe launched on a yes answer that finds capacity at once continues that observation.
    probe_found = 0.0  # since when the probe in flight (and those before it) saw capacity
    last_yes: int | None = None  # step of the last probe answer that found capacity
    ran_from = 0.0  # when the live Spot attempt got capacity
    # Visible view: where each zone's current run of availability (or outage) began: its age is seen.
    since = None if production else [_up_since(z) for z in zone_up]
    down_since = None if production else [_up_since([not u for u in z]) for z in zone_up]
    flex_start = flex_end = 0  # live flex attempt: step it gets capacity, step it gives up
    for i in range(n):
        up = zone_up[zone][i]
        now = i * dt
        just_preempted = False
        if multizone and current is SPOT and not running and \
                queued_steps * dt >= scenario.stockout_wait_s:
            # As production (spotorch.core.decide, core.regions): a Spot attempt queued past the
            # stockout wait is cancelled, the run
            # moves to the next region and decides again with Spot unavailable.
            current, just_preempted, queued_steps, queued = None, True, 0, False
            cool_until = spot_cooldown_until(now, cooldown)
            marks = mark(marks, str(zone), SPOT, now + cooldown, AVOID_STOCKOUT, now)
        if current is SPOT and running and not up:
            preemptions += 1
            current, running, just_preempted = None, False, True
            done = safe
            cool_until = spot_cooldown_until(now, cooldown)
            last_down = now
            if multizone:
                marks = mark(marks, str(zone), SPOT, now + cooldown, AVOID_PREEMPTED, now)
        if current is FLEX and not running and i >= flex_end and i < flex_start:
            current = None  # waited its max wait without capacity: the attempt ends, unbilled
        if queued and current is SPOT and up:
            spot_waits += 1  # a queued Spot attempt got capacity: one outage seen to its end
        queued = False
        if current is SPOT and not up:
            last_down = now  # a Spot attempt still queued: Spot seen unavailable now
        answer: bool | None = None
        up_s: float | None = None  # how long Spot has been seen available (PolicyView's)
        down_s: float | None = None  # how long it has been seen unavailable (visible view)
        if since is not None and down_since is not None:
            up_s = (i - since[zone][i]) * dt if up else None
            down_s = None if up else (i - down_since[zone][i]) * dt
        elif current is SPOT and running:
            up_s = now - ran_from
        if probe_due == i:
            probe_due = None
            if current is STANDARD:
                answer = probe_hit
                if probe_hit:
                    up_s, last_yes = now - probe_found, i
                    cool_until = None  # capacity confirmed: the cooldown's guess is void
                    prefer = probe_zone
                else:
                    last_down = now
        elif probe_due is not None and current is not STANDARD:
            probe_due = None  # the run left standard: the probe is cancelled
        if current is FLEX:
            want: Capacity = FLEX  # the domain leaves a flex attempt alone until it ends
            view = None
        else:
            seen, assumed = up, False
            if production:
                if current is STANDARD:
                    if probes is not None:
                        seen = answer is True
                        up_s = up_s if seen else None
                    else:
                        seen, assumed, up_s = not spot_cooling(now, cool_until), True, None
                elif current is None:
                    seen = not just_preempted  # the domain: spot_available = not spot_lost
                    up_s = None
            view = fast_view(dict(
                now_s=now, deadline_s=deadline, work_total_s=total, work_done_s=safe,
                restart_overhead_s=overhead, current=current, spot_available=seen,
                preemptions=preemptions, changeovers=changeovers, tick_s=dt,
                spot_run_s=spot_run_s, spot_wait_s=spot_wait_s, spot_waits=spot_waits,
                spot_down_at_s=last_down, spot_assumed=assumed,
                spot_queued=current is SPOT and not running, flex_wait_s=flex_wait,
                spot_up_s=up_s, spot_down_s=down_s, changed_at_s=changed_at,
                spot_failures_left=None if budget is None else budget - preemptions))
            want = policy(view)
            if want is FLEX and flex is None:
                want = STANDARD  # not offered: a policy asking for it gets standard
            if production:
                if dwell and current is not None and want is not current \
                        and not may_switch(view, want):
                    want = current  # as decide.py: not within the minimum dwell of the last move
                if current is SPOT and not running and not up and want is not SPOT:
                    cool_until = spot_cooldown_until(now, cooldown)  # gave up a Spot queue
                if current is STANDARD and want is SPOT and spot_cooling(now, cool_until):
                    want = STANDARD  # as the core: back to Spot only once it may have capacity
        if probes is not None and view is not None and current is STANDARD \
                and want is STANDARD and probe_due is None \
                and (not dwell or may_switch(view, SPOT)):  # as probes.tick_probe
            terms = ProbeTerms(hit_cost=probes.billed_s * prices[i] * per_s,
                               saving_per_s=(od - prices[i]) * per_s, wait_s=probes.wait_s)
            if probe_worth(view, terms, policy):
                probes_sent += 1
                wait_steps = max(1, math.ceil(probes.wait_s / dt))
                probe_zone = int(choose_region(_ranked(record, i, len(zone_up)), marks, SPOT,
                                               now))
                probed = zone_up[probe_zone]
                hit_at = next((j for j in range(i, min(i + wait_steps, n)) if probed[j]), None)
                probe_hit = hit_at is not None
                if hit_at is not None:
                    if not (hit_at == i and last_yes == i):
                        probe_found = hit_at * dt
                    paid = probes.billed_s * prices[hit_at] * per_s
                    probe_cost += paid
                    cost += paid
                    probe_due = max(i + 1, hit_at + math.ceil(probes.latency_s / dt))
                else:
                    probe_due = i + wait_steps
        if want is not current:
            if last is not None and want is not last:
                changeovers += 1
                changed_at = now
            current, last, running = want, want, False
            safe = done  # a requested switch is a graceful cancel: checkpoint first
            if want is SPOT and multizone:
                zone = int(choose_region(_ranked(record, i, len(zone_up)), marks, SPOT, now,
                                         prefer=None if prefer is None else str(prefer)))
                up, prefer, queued_steps = zone_up[zone][i], None, 0
            if want is FLEX:
                assert flex is not None and view is not None and rng is not None
                cap = flex_max_wait_s(view, flex.max_wait_s)
                wait = _WAIT_DRAWS[flex.wait](rng, flex.mean_wait_s)
                flex_end = i + max(1, math.ceil(cap / dt))
                flex_start = i + math.ceil(wait / dt) if wait <= cap else n + 1
        if current is SPOT:
            if up:
                spot_run_s += dt
                queued_steps = 0
            else:
                spot_wait_s += dt
                queued = True
                last_down = now
                queued_steps += 1
        active = current is STANDARD or (current is SPOT and up) or \
            (current is FLEX and i >= flex_start)
        if active:
            price = od if current is STANDARD else flex_price if current is FLEX else prices[i]
            if not running:
                running, overhead_left, ran_from = True, overhead, now
            lost = min(overhead_left, dt)
            overhead_left -= lost
            if done + dt - lost >= total:
                used = lost + total - done
                return Outcome(cost + price * used * per_s, now + used, preemptions,
                               changeovers, probes_sent, probe_cost)
            done += dt - lost
            cost += price * dt * per_s
            safe = done if checkpoint is None else max(safe, done // checkpoint * checkpoint)
        elif current is not FLEX:
            running = False
    # Missed: finish on standard right after the deadline, so the cost stays comparable.
    cost += od * (overhead + total - safe) * per_s
    return Outcome(cost, None, preemptions, changeovers, probes_sent, probe_cost)


def run_standard(window: Window, scenario: Scenario) -> Outcome:
    """All on standard: one launch, no surprises (closed form of run_online(always_standard))."""
    used = scenario.overhead_s + scenario.task_s
    return Outcome(window.od_price * used * scenario.nodes / 3600.0, used, 0, 0)


def online_policies(scenario: Scenario) -> dict[str, OnlinePolicy]:
    """The replayed policies; count and deadline go through the production dispatch."""
    count = RecoveryPolicy(escalation=EscalationKind.COUNT,
                           escalate_after_preemptions=scenario.count_after)
    deadline = RecoveryPolicy(escalation=EscalationKind.DEADLINE)
    return {
        "standard": always_standard,
        "greedy": greedy,
        "count": lambda view: choose_capacity(view, count),
        "deadline": lambda view: choose_capacity(view, deadline),
        "uniform_progress": uniform_progress,
    }
