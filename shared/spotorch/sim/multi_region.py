"""Multi-region replays: the zones of one run, aligned tick by tick, and the price of moving.

`spotorch simulate --multi-region TRACE...`: every trace file given (or found below a directory
given) is one zone of the same run; its name's first part (`us-east-1a` of
`us-east-1a_v100_1.json`) names the zone and its region (`us-east-1`). A move between regions
costs the checkpoint's (and the data's) egress and transfer time, on top of the restart
overhead (core.regions.MovePrices); within a region nothing is moved.

Policies: `optimal` (sim.optimal_multi: knows every zone's future), `single_region` (today's
deadline policy and region rule, in the data's region only), `uniform_progress` (multi-region
UP, SkyNomad's baseline: Uniform Progress that takes Spot in any zone that has it) and
`deadline` (spotorch's multi-region policy: the deadline policy, with the next Spot attempt's
location chosen by core.regions.choose_spot_region from per-zone estimates, the function
production's launches call too).

Views, as in the single-region replay (sim.replay):
- visible: every zone's availability is seen at every tick, and so are its past day and the
  age of its current run of capacity;
- production: only the run's own attempts and probes. A Spot attempt sees its own zone; one
  queued past the stockout wait is cancelled and its zone avoided for the cooldown (as is a
  zone that preempted the run), and the next attempt goes elsewhere; on standard, Spot is seen
  only through probes (policy.probe_worth decides when; the policy's own choice says where).
  The estimates are the run's own: attempts and probes per zone, hits, Spot time, preemptions.
Simplifications here (not in sim.replay): no FLEX_START, no minimum dwell, and the single-
region cooldown is replaced by the per-zone marks (core.regions), since a stockout in one zone
says nothing of another.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from spotorch.core.pipeline import Capacity, EscalationKind, RecoveryPolicy
from spotorch.core.policy import (
    PolicyView,
    ProbeTerms,
    RegionRecord,
    choose_capacity,
    probe_worth,
    rank_regions,
    uniform_progress,
)
from spotorch.core.region_moves import record_prior
from spotorch.core.regions import (
    AVOID_PREEMPTED,
    AVOID_STOCKOUT,
    HOP_OBTAIN,
    MovePrices,
    RegionMark,
    SpotEstimate,
    choose_region,
    choose_spot_region,
    mark,
    obtainability,
    region_of,
)
from spotorch.sim.evaluate import PolicySummary, RunRecord, format_table, summarize
from spotorch.sim.model import (
    BoolArray,
    Outcome,
    RegionChoice,
    Scenario,
    ScenarioError,
    TraceError,
    View,
    find_trace_files,
    load_trace,
    resample,
)
from spotorch.sim.optimal_multi import Zones, optimal_multi
from spotorch.sim.replay import fast_view

SPOT, STANDARD = Capacity.SPOT, Capacity.STANDARD
MULTI_POLICIES = ("single_region", "uniform_progress", "deadline", "optimal")
PAST_S = 24 * 3600.0  # what the visible view's estimates see before a window starts


@dataclass(frozen=True)
class MultiWindow:
    """One replay: every zone's availability over the window, and its past day."""

    family: str
    start_s: float
    avail: BoolArray  # zones x steps
    past: BoolArray  # zones x steps before the window (at most PAST_S)


@dataclass(frozen=True)
class MultiOutcome(Outcome):
    """An outcome with what moving cost: egress dollars (in cost) and moves between regions."""

    egress_cost: float = 0.0
    moves: int = 0


def zone_name(path: Path) -> str:
    """The zone a trace file stands for: the first part of its name (us-east-1a_v100_1.json)."""
    return path.stem.split("_")[0]


def load_zones(paths: Sequence[Path], nodes: int, step_s: int
               ) -> tuple[str, tuple[str, ...], BoolArray]:
    """(family, zone names, zones x steps availability) of the given traces, aligned."""
    files = find_trace_files(list(paths))
    traces = [load_trace(p, root) for p, root in files]
    if len({t.gap_s for t in traces}) != 1:
        raise TraceError("zone traces must share gap_seconds: " + ", ".join(t.name for t in traces))
    names = tuple(zone_name(p) for p, _ in files)
    if len(set(names)) != len(names):
        raise TraceError("two traces name the same zone: " + ", ".join(names))
    avail = [resample(t, step_s, nodes)[0] for t in traces]
    length = min(len(a) for a in avail)
    family = ", ".join(dict.fromkeys(t.family for t in traces))
    return family, names, np.stack([a[:length] for a in avail])


def multi_windows(family: str, avail: BoolArray, scenario: Scenario,
                  stride_s: float | None) -> list[MultiWindow]:
    """Every window of the scenario's deadline that fits, stride_s apart (None: one)."""
    step = int(scenario.step_s)
    n = scenario.steps
    length = avail.shape[1]
    past = int(PAST_S // step)
    starts = range(0, 1 if length >= n else 0) if stride_s is None else \
        range(0, length - n + 1, max(1, round(stride_s / step)))
    return [MultiWindow(family, float(s * step), avail[:, s:s + n],
                        avail[:, max(s - past, 0):s]) for s in starts]


# ---------------------------------------------------------------------------------------------
# What a policy sees, and the policies


@dataclass(frozen=True)
class Decision:
    """One decision point of a multi-region run."""

    view: PolicyView  # spot_available: the current Spot attempt's zone (or a probe's yes)
    estimates: tuple[SpotEstimate, ...]  # per zone, as this view knows them
    zone: int | None  # the live Spot attempt's zone
    checkpoint_region: str | None
    marks: tuple[RegionMark, ...]
    zones: Zones
    visible: bool
    # Zones best first by the shared record of every zone's Spot (production's ctx.regions, as
    # app.spot_record ranks them); ties between zones the run has not seen follow it.
    order: tuple[int, ...] = ()

    def ranked(self) -> tuple[int, ...]:
        """Zone indices best first: the record's order, else the configured one."""
        return self.order or tuple(range(len(self.zones.names)))


@dataclass(frozen=True)
class Choice:
    """Capacity and where: a zone for Spot, a region (any of its zones) for standard."""

    capacity: Capacity
    zone: int


class MultiPolicy:
    """A multi-region policy: decide() at every tick; probe_zone() says where a probe goes."""

    name = ""

    def decide(self, d: Decision) -> Choice:
        """The capacity and zone for this tick."""
        raise NotImplementedError

    def probe_zone(self, d: Decision) -> int | None:
        """Where a probe goes now (None: nowhere worth it)."""
        raise NotImplementedError

    def capacity(self, view: PolicyView) -> Capacity:
        """Spot or standard for a view (probe_worth asks it too)."""
        raise NotImplementedError


DEADLINE = RecoveryPolicy(escalation=EscalationKind.DEADLINE)


def _home_zone(d: Decision) -> int:
    """A zone of the region standard runs in: the checkpoint's, else the data's, else the first."""
    home = d.checkpoint_region or d.zones.move.data_region
    if home is not None:
        for z, name in enumerate(d.zones.names):
            if region_of(name) == region_of(home):
                return z
    return 0


def _with(view: PolicyView, **changes: Any) -> PolicyView:
    return fast_view({**vars(view), **changes})


class SpotorchMulti(MultiPolicy):
    """spotorch: the deadline policy, Spot placed by core.regions.choose_spot_region."""

    name = "deadline"

    def capacity(self, view: PolicyView) -> Capacity:
        """Spot or standard for a view (probe_worth asks it too)."""
        return choose_capacity(view, DEADLINE)

    def _pick(self, d: Decision) -> tuple[int, float] | None:
        view = d.view
        home = _home_zone(d)
        work_left = max((view.work_total_s or 0.0) - view.work_done_s, 0.0)
        pick = choose_spot_region(
            [d.estimates[z] for z in d.ranked()], checkpoint_region=d.checkpoint_region, prices=d.zones.move,
            spot_per_h=dict(zip(d.zones.names, d.zones.spot_per_h, strict=True)),
            standard_per_h=d.zones.standard_per_h[home], work_left_s=work_left,
            overhead_s=view.restart_overhead_s, marks=() if d.visible else d.marks,
            now=view.now_s)
        if pick is None:
            return None
        return d.zones.names.index(pick.location), pick.move_s

    def decide(self, d: Decision) -> Choice:
        """The capacity and zone for this tick."""
        view = d.view
        if view.current is SPOT and d.zone is not None and not view.spot_queued:
            cap = self.capacity(_with(view, spot_available=True))
            return Choice(cap, d.zone if cap is SPOT else _home_zone(d))
        if view.current is SPOT and d.zone is not None and not d.visible:
            # Production: a queued attempt waits for its zone until the stockout wait ends it,
            # or, when the deadline would leave Spot, tries a zone elsewhere worth a Spot try
            # (core.region_moves.spot_elsewhere in production: a stockout called early).
            cap = self.capacity(view)
            if cap is SPOT:
                return Choice(SPOT, d.zone)
            here = d.zones.names[d.zone]
            marks = mark(d.marks, here, SPOT, view.now_s + 1.0, AVOID_STOCKOUT, view.now_s)
            pick = self._pick(Decision(view, d.estimates, None, d.checkpoint_region, marks,
                                       d.zones, d.visible, d.order))
            if pick is not None and obtainability(d.estimates[pick[0]]) > HOP_OBTAIN and \
                    self.capacity(_with(
                    view, current=None, spot_queued=False, spot_available=True,
                    restart_overhead_s=view.restart_overhead_s + pick[1])) is SPOT:
                return Choice(SPOT, pick[0])
            return Choice(cap, _home_zone(d))
        pick = self._pick(d)
        if pick is None:
            cap = self.capacity(_with(view, spot_available=False))
            zone = d.zone if d.zone is not None else _home_zone(d)
            return Choice(cap, zone if cap is SPOT else _home_zone(d))
        zone, move_s = pick
        seen = d.estimates[zone].seen
        available = seen is True or (seen is None and view.current is not STANDARD)
        cap = self.capacity(_with(view, spot_available=available,
                                  restart_overhead_s=view.restart_overhead_s + move_s,
                                  spot_up_s=d.estimates[zone].up_s if available else None))
        return Choice(cap, zone if cap is SPOT else _home_zone(d))

    def probe_zone(self, d: Decision) -> int | None:
        """Where a probe goes now (None: nowhere worth it)."""
        blind = tuple(replace(e, seen=None, up_s=None) for e in d.estimates)
        pick = self._pick(Decision(d.view, blind, d.zone, d.checkpoint_region, d.marks,
                                   d.zones, d.visible, d.order))
        return None if pick is None else pick[0]


class UniformProgressMulti(MultiPolicy):
    """Multi-region Uniform Progress: UP's rule, Spot taken in any zone that has it."""

    name = "uniform_progress"

    def capacity(self, view: PolicyView) -> Capacity:
        """Spot or standard for a view (probe_worth asks it too)."""
        return uniform_progress(view)

    def decide(self, d: Decision) -> Choice:
        """The capacity and zone for this tick."""
        view = d.view
        if d.visible:
            up = [z for z, e in enumerate(d.estimates) if e.seen]
            if d.zone is not None and d.zone in up:
                up.insert(0, d.zone)
            cap = self.capacity(_with(view, spot_available=bool(up)))
            if cap is SPOT:
                return Choice(SPOT, up[0] if up else (d.zone if d.zone is not None else 0))
            return Choice(cap, _home_zone(d))
        cap = self.capacity(view)
        if cap is not SPOT:
            return Choice(cap, _home_zone(d))
        if view.current is SPOT and d.zone is not None:
            return Choice(SPOT, d.zone)
        zone = self.probe_zone(d)
        return Choice(SPOT, 0 if zone is None else zone)

    def probe_zone(self, d: Decision) -> int | None:
        """Where a probe goes now (None: nowhere worth it)."""
        names = d.zones.names
        ranked = [names[z] for z in d.ranked()]
        return names.index(choose_region(ranked, d.marks, SPOT, d.view.now_s))


class SingleRegion(MultiPolicy):
    """Today's policy in the data's region: its zones in order, avoided for a while after a
    stockout or a preemption (core.regions.choose_region), the deadline policy's capacity."""

    name = "single_region"

    def capacity(self, view: PolicyView) -> Capacity:
        """Spot or standard for a view (probe_worth asks it too)."""
        return choose_capacity(view, DEADLINE)

    def _zones(self, d: Decision) -> tuple[str, ...]:
        home = region_of(d.zones.move.data_region or d.zones.names[0])
        names = d.zones.names
        return tuple(names[z] for z in d.ranked() if region_of(names[z]) == home)

    def decide(self, d: Decision) -> Choice:
        """The capacity and zone for this tick."""
        view = d.view
        zone = d.zone if view.current is SPOT and d.zone is not None else self.probe_zone(d)
        assert zone is not None
        if d.visible:
            view = _with(view, spot_available=bool(d.estimates[zone].seen),
                         spot_up_s=d.estimates[zone].up_s)
        cap = self.capacity(view)
        return Choice(cap, zone if cap is SPOT else _home_zone(d))

    def probe_zone(self, d: Decision) -> int | None:
        """Where a probe goes now (None: nowhere worth it)."""
        return d.zones.names.index(choose_region(self._zones(d), d.marks, SPOT, d.view.now_s))


def multi_policies() -> dict[str, MultiPolicy]:
    """The replayed multi-region policies by name."""
    return {p.name: p for p in (SingleRegion(), UniformProgressMulti(), SpotorchMulti())}


# ---------------------------------------------------------------------------------------------
# The replay


@dataclass
class _ZoneSeen:
    """What the run's own attempts and probes saw of one zone (production's estimates)."""

    tries: int = 0
    found: int = 0
    run_s: float = 0.0
    preemptions: int = 0


def _visible_estimates(window: MultiWindow, names: Sequence[str], i: int, dt: float
                       ) -> tuple[SpotEstimate, ...]:
    """Every zone seen now, its past day's Spot time and preemptions, its current run's age."""
    full = np.concatenate([window.past, window.avail[:, :i + 1]], axis=1)
    b = full.shape[1]
    recent = full[:, max(b - int(PAST_S // dt), 0):b]
    drops = (recent[:, :-1] & ~recent[:, 1:]).sum(axis=1)
    out = []
    for z, name in enumerate(names):
        row = full[z]
        up = bool(row[-1])
        age = None
        if up:
            down = np.flatnonzero(~row)
            age = (len(row) - 1 - (down[-1] if len(down) else -1)) * dt
        out.append(SpotEstimate(name, run_s=float(recent[z].sum()) * dt,
                                preemptions=int(drops[z]), seen=up, up_s=age))
    return tuple(out)


def zone_records(window: MultiWindow, i: int, dt: float) -> list[RegionRecord]:
    """The shared record of every zone over the past day before step i: as complete as a fleet
    observing every zone would make it, an upper bound (sim.replay's ZoneRecord assumes the
    same)."""
    full = np.concatenate([window.past, window.avail[:, :i]], axis=1)
    recent = full[:, max(full.shape[1] - int(PAST_S // dt), 0):]
    if recent.shape[1] == 0:
        return []
    drops = (recent[:, :-1] & ~recent[:, 1:]).sum(axis=1)
    return [RegionRecord(observed_s=recent.shape[1] * dt,
                         available_s=float(recent[z].sum()) * dt, preemptions=int(drops[z]))
            for z in range(recent.shape[0])]


def with_record(estimates: tuple[SpotEstimate, ...], records: Sequence[RegionRecord]
                ) -> tuple[SpotEstimate, ...]:
    """The run's own estimates with the record's figures as their priors, as production's
    (core.region_moves.record_prior)."""
    if not records:
        return estimates
    return tuple(record_prior(e, r) for e, r in zip(estimates, records, strict=True))


def run_multi(window: MultiWindow, scenario: Scenario, zones: Zones,
              policy: MultiPolicy) -> MultiOutcome:
    """Replay one window through a multi-region policy, deciding at every step. Production's
    view ranks zones by the shared record (Scenario.regions HISTORY, the default here) or keeps
    their order (FIXED)."""
    scenario_record = scenario.regions is RegionChoice.HISTORY
    dt, overhead = float(scenario.step_s), float(scenario.overhead_s)
    total, deadline = float(scenario.task_s), float(scenario.deadline_s)
    per_s = scenario.nodes / 3600.0
    names = zones.names
    avail = window.avail.tolist()
    n = len(avail[0])
    visible = scenario.view is View.VISIBLE
    probes = None if visible else scenario.probes
    cooldown = scenario.spot_cooldown_s
    move = zones.move
    seen = [_ZoneSeen() for _ in names]
    marks: tuple[RegionMark, ...] = ()
    current: Capacity | None = None
    zone: int | None = None  # the live attempt's zone (standard: any zone of its region)
    checkpoint: str | None = None  # region of the checkpoint (None: none yet)
    running = False
    done = safe = cost = egress = probe_cost = 0.0
    overhead_left = 0.0
    preemptions = changeovers = moves = probes_sent = 0
    last: Capacity | None = None
    changed_at: float | None = None
    spot_run_s = spot_wait_s = 0.0
    spot_waits = 0
    queued = False
    queued_steps = 0
    last_down: float | None = None
    ran_from = 0.0
    probe_due: int | None = None
    probe_zone: int | None = None
    probe_hit: int | None = None  # step the probe found capacity
    for i in range(n):
        now = i * dt
        just_preempted = False
        if current is SPOT and zone is not None and not running and \
                queued_steps * dt >= scenario.stockout_wait_s:
            # As production: a Spot attempt queued past the stockout wait is cancelled and its
            # zone avoided; the run decides again.
            marks = mark(marks, names[zone], SPOT, now + cooldown, AVOID_STOCKOUT, now)
            current, just_preempted, queued_steps, queued = None, True, 0, False
        up = zone is not None and bool(avail[zone][i])
        if current is SPOT and running and not up:
            assert zone is not None
            preemptions += 1
            seen[zone].preemptions += 1
            current, running, just_preempted = None, False, True
            done = safe
            last_down = now
            marks = mark(marks, names[zone], SPOT, now + cooldown, AVOID_PREEMPTED, now)
        if queued and current is SPOT and up:
            spot_waits += 1
        queued = False
        answer: int | None = None
        if probe_due == i:
            probe_due = None
            if current is STANDARD and probe_zone is not None:
                if probe_hit is not None:
                    answer = probe_zone
                    seen[probe_zone].found += 1
                else:
                    last_down = now
        elif probe_due is not None and current is not STANDARD:
            probe_due = None
        # What the policy sees.
        if visible:
            estimates = _visible_estimates(window, names, i, dt)
            here = up if current is SPOT else (bool(avail[zone][i]) if zone is not None
                                                else False)
        else:
            estimates = tuple(
                SpotEstimate(name, s.tries, s.found, s.run_s, s.preemptions,
                             seen=True if (z == answer or (z == zone and current is SPOT
                                                           and up and running))
                             else False if (z == zone and current is SPOT and not up) else None)
                for z, (name, s) in enumerate(zip(names, seen, strict=True)))
            if current is SPOT:
                here = up
            elif current is STANDARD:
                here = answer is not None
            else:
                here = not just_preempted
        up_s = (now - ran_from) if current is SPOT and running else None
        view = fast_view(dict(
            now_s=now, deadline_s=deadline, work_total_s=total, work_done_s=safe,
            restart_overhead_s=overhead, current=current, spot_available=here,
            preemptions=preemptions, changeovers=changeovers, tick_s=dt,
            spot_run_s=spot_run_s, spot_wait_s=spot_wait_s, spot_waits=spot_waits,
            spot_down_at_s=last_down, spot_assumed=False,
            spot_queued=current is SPOT and not running, flex_wait_s=None,
            spot_up_s=up_s, spot_down_s=None, changed_at_s=changed_at))
        order: tuple[int, ...] = ()
        if scenario_record and not visible:
            records = zone_records(window, i, dt)
            order = tuple(rank_regions(records)) if records else ()
            estimates = with_record(estimates, records)
        decision = Decision(view, estimates, zone if current is SPOT else None, checkpoint,
                            marks, zones, visible, order)
        choice = policy.decide(decision)
        if current is STANDARD and answer is not None and choice.capacity is SPOT \
                and choice.zone != answer and estimates[choice.zone].seen is not True:
            choice = Choice(SPOT, answer)  # the probe found Spot there: go where it is
        want, where = choice.capacity, choice.zone
        if probes is not None and current is STANDARD and want is STANDARD and probe_due is None:
            terms = ProbeTerms(hit_cost=probes.billed_s * zones.spot_per_h[0] * per_s,
                               saving_per_s=(zones.standard_per_h[0] - zones.spot_per_h[0])
                               * per_s, wait_s=probes.wait_s)
            target = policy.probe_zone(decision) if probe_worth(view, terms, policy.capacity) \
                else None
            if target is not None:
                probes_sent += 1
                seen[target].tries += 1
                wait_steps = max(1, math.ceil(probes.wait_s / dt))
                probe_zone = target
                probe_hit = next((j for j in range(i, min(i + wait_steps, n))
                                  if avail[target][j]), None)
                if probe_hit is not None:
                    paid = probes.billed_s * zones.spot_per_h[target] * per_s
                    probe_cost += paid
                    cost += paid
                    probe_due = max(i + 1, probe_hit + math.ceil(probes.latency_s / dt))
                else:
                    probe_due = i + wait_steps
        moved = want is not current or (
            want is SPOT and where != zone) or (
            want is STANDARD and zone is not None and region_of(names[where]) !=
            region_of(names[zone]))
        if moved:
            if current is SPOT and zone is not None and not running and want is SPOT:
                # A queued attempt moved elsewhere: its zone had no capacity (a stockout).
                marks = mark(marks, names[zone], SPOT, now + cooldown, AVOID_STOCKOUT, now)
            if last is not None and want is not last:
                changeovers += 1
                changed_at = now
            current, last, running, zone = want, want, False, where
            safe = done  # a requested switch is a graceful cancel: checkpoint first
            queued_steps = 0
            if want is SPOT:
                seen[where].tries += 1
        up = zone is not None and bool(avail[zone][i])
        if current is SPOT:
            if up:
                spot_run_s += dt
                queued_steps = 0
                assert zone is not None
                seen[zone].run_s += dt
            else:
                spot_wait_s += dt
                queued = True
                last_down = now
                queued_steps += 1
        active = current is STANDARD or (current is SPOT and up)
        if active:
            assert zone is not None
            region = region_of(names[zone])
            price = zones.standard_per_h[zone] if current is STANDARD else \
                zones.spot_per_h[zone]
            if not running:
                running, ran_from = True, now
                if current is SPOT and queued_steps == 0:
                    seen[zone].found += 1
                paid = move.cost(checkpoint, region)
                overhead_left = overhead + move.seconds(checkpoint, region)
                if checkpoint is not None and region_of(checkpoint) != region:
                    moves += 1
                cost += paid
                egress += paid
                checkpoint = region
            lost = min(overhead_left, dt)
            overhead_left -= lost
            if done + dt - lost >= total:
                used = lost + total - done
                return MultiOutcome(cost + price * used * per_s, now + used, preemptions,
                                    changeovers, probes_sent, probe_cost, egress, moves)
            done += dt - lost
            cost += price * dt * per_s
            safe = done
        else:
            running = False
    # Missed: finished on standard right after the deadline, in the checkpoint's region.
    home = next((z for z, name in enumerate(names)
                 if checkpoint is not None and region_of(name) == checkpoint), 0)
    cost += zones.standard_per_h[home] * (overhead + total - safe) * per_s
    return MultiOutcome(cost, None, preemptions, changeovers, probes_sent, probe_cost, egress,
                        moves)


# ---------------------------------------------------------------------------------------------
# Many windows


def evaluate_multi(windows: Sequence[MultiWindow], scenario: Scenario, zones: Zones,
                   policies: Sequence[str] = MULTI_POLICIES) -> list[RunRecord]:
    """Replay every window through every named multi-region policy and the optimum."""
    unknown = set(policies) - set(MULTI_POLICIES)
    if unknown:
        raise ScenarioError(f"unknown multi-region policies: {sorted(unknown)}")
    online = multi_policies()
    best = optimal_multi(np.stack([w.avail for w in windows]), scenario, zones) \
        if "optimal" in policies and windows else []
    records = []
    for index, window in enumerate(windows):
        outcomes: dict[str, Outcome] = {}
        for name in policies:
            if name == "optimal":
                b = best[index]
                outcomes[name] = MultiOutcome(b.cost, b.finished_s, 0, 0)
            else:
                outcomes[name] = run_multi(window, scenario, zones, online[name])
        records.append(RunRecord(window.family, window.family, window.start_s, outcomes))
    return records


@dataclass(frozen=True)
class MultiResult:
    """A multi-region evaluation: the records, and the per-policy summary with move figures."""

    records: list[RunRecord]
    summary: dict[str, PolicySummary] = field(default_factory=dict)

    def as_json(self) -> dict[str, Any]:
        """`spotorch simulate --multi-region --json`."""
        out: dict[str, Any] = {}
        for name, s in self.summary.items():
            outcomes = [r.outcomes[name] for r in self.records]
            out[name] = {**s.as_json(),
                         "p95_cost_ratio_to_optimal": p95_ratio(self.records, name),
                         "mean_egress_cost": float(np.mean([getattr(o, "egress_cost", 0.0)
                                                            for o in outcomes])),
                         "mean_moves": float(np.mean([getattr(o, "moves", 0)
                                                      for o in outcomes]))}
        return out


def p95_ratio(records: Sequence[RunRecord], name: str) -> float | None:
    """The 95th percentile of a policy's per-window cost over the optimum's."""
    pairs = [(r.outcomes[name].cost, r.outcomes["optimal"].cost) for r in records
             if "optimal" in r.outcomes]
    ratios = [c / b for c, b in pairs if math.isfinite(b) and b > 0]
    return float(np.percentile(ratios, 95)) if ratios else None


def run_multi_region(paths: Sequence[Path], scenario: Scenario, prices: PriceArgs,
                     move: MovePrices, stride_s: float | None,
                     policies: Sequence[str] = MULTI_POLICIES) -> tuple[MultiResult, Zones]:
    """Load the zones, build the windows, replay them: what the command line does."""
    family, names, avail = load_zones(paths, scenario.nodes, int(scenario.step_s))
    zones = prices.zones(names, move)
    windows = multi_windows(family, avail, scenario, stride_s)
    if not windows:
        raise TraceError("no window of the deadline fits in the traces")
    records = evaluate_multi(windows, scenario, zones, policies)
    return MultiResult(records, summarize(records)), zones


@dataclass(frozen=True)
class PriceArgs:
    """Prices per zone: one Spot price and on-demand at price_ratio x it, or a table by region
    ({"us-east-1": {"spot": 0.9, "standard": 3.06}, ...}; a region missing uses the default)."""

    spot_per_h: float = 1.0
    price_ratio: float = 3.0
    standard_per_h: float | None = None
    table: dict[str, dict[str, float]] = field(default_factory=dict)

    def zones(self, names: Sequence[str], move: MovePrices) -> Zones:
        """The zones at these prices."""
        std = self.standard_per_h if self.standard_per_h is not None else \
            self.price_ratio * self.spot_per_h
        spot, standard = [], []
        for name in names:
            row = self.table.get(name) or self.table.get(region_of(name)) or {}
            spot.append(float(row.get("spot", self.spot_per_h)))
            standard.append(float(row.get("standard", std)))
        return Zones(tuple(names), tuple(spot), tuple(standard), move)


def load_price_table(path: Path | None) -> dict[str, dict[str, float]]:
    """A region (or zone) price table from JSON, checked."""
    if path is None:
        return {}
    try:
        raw = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ScenarioError(f"{path}: not a price table ({exc})") from exc
    if not isinstance(raw, dict) or not all(
            isinstance(v, dict) and set(v) <= {"spot", "standard"}
            and all(isinstance(x, int | float) and x >= 0 for x in v.values())
            for v in raw.values()):
        raise ScenarioError(f"{path}: must map a region or zone to "
                            '{"spot": price, "standard": price} per hour')
    return {str(k): {kk: float(vv) for kk, vv in v.items()} for k, v in raw.items()}


def format_multi(result: MultiResult) -> str:
    """The summary table with each policy's egress and moves."""
    lines = format_table(result.summary).splitlines()
    extra = result.as_json()
    lines[0] += f"{'p95 vs opt':>11}{'egress $':>10}{'moves':>7}"
    for k, name in enumerate(result.summary, start=1):
        p95 = extra[name]["p95_cost_ratio_to_optimal"]
        lines[k] += (f"{'-' if p95 is None else f'{p95:.3f}':>11}"
                     f"{extra[name]['mean_egress_cost']:>10.2f}{extra[name]['mean_moves']:>7.2f}")
    return "\n".join(lines)


def simulate_multi(args: Any, base: Scenario) -> int:
    """`spotorch simulate --multi-region` on the command line's scenario: the exit code (2 on bad
    input). The caller (spotorch.sim.simulate) builds `base`, so this module never imports it."""
    import sys

    from spotorch.sim.evaluate import POLICIES
    from spotorch.sim.model import SimulateError

    named = tuple(p.strip() for p in args.policies.split(",") if p.strip())
    policies = MULTI_POLICIES if named == POLICIES else named
    try:
        if not args.traces:
            raise TraceError("--multi-region needs the zones' traces (files or a directory)")
        scenario = replace(base, regions=RegionChoice(args.zone_order))
        if args.checkpoint_gb < 0 or args.data_gb < 0 or args.transfer_gbps <= 0 or \
                (args.egress_per_gb is not None and args.egress_per_gb < 0):
            raise ScenarioError("sizes and egress must be >= 0 and the transfer rate > 0")
        files = find_trace_files(list(args.traces))
        first_region = region_of(zone_name(files[0][0]))
        move = MovePrices(checkpoint_gb=args.checkpoint_gb, data_gb=args.data_gb,
                          data_region=args.data_region or first_region,
                          bandwidth_gbps=args.transfer_gbps, egress_per_gb=args.egress_per_gb)
        prices = PriceArgs(spot_per_h=args.spot_price, price_ratio=args.price_ratio,
                           standard_per_h=args.on_demand_price,
                           table=load_price_table(args.region_prices))
        stride = None if args.window_stride_hours is None else args.window_stride_hours * 3600.0
        result, zones = run_multi_region(list(args.traces), scenario, prices, move, stride,
                                         policies)
    except SimulateError as exc:
        print(f"spotorch simulate: {exc}", file=sys.stderr)
        return 2
    if args.as_json:
        print(json.dumps({"runs": len(result.records), "view": scenario.view.value,
                          "zones": list(zones.names), "data_region": move.data_region,
                          "policies": result.as_json()}))
    else:
        print(f"{len(result.records)} runs over {len(zones.names)} zones in "
              f"{len(zones.regions)} regions; task {args.task_hours} h, deadline "
              f"{args.deadline_hours} h, overhead {args.restart_overhead_hours} h; checkpoint "
              f"{move.checkpoint_gb:g} GB, data {move.data_gb:g} GB in {move.data_region}; "
              f"view {scenario.view.value}")
        print(format_multi(result))
    return 0
