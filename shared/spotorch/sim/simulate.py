"""`spotorch simulate`: replay Spot availability traces through the escalation policies."""

# The model, shared by every policy, the offline optimum and the brute force that checks it:
# - Time runs in steps of --tick-minutes. A trace is resampled onto that grid: Spot is available
#   in a step only if it was available (count >= --nodes) for the whole step, and the step's
#   Spot price is the mean of the trace's prices over it.
# - Decisions happen at every step boundary, which is also where preemptions land, so policies
#   see every preemption and every capacity change at the moment it happens.
# - Each (re)launch costs --restart-overhead-hours of billed time before useful work. Spot runs
#   only while available; a SPOT choice during an outage waits for free. Standard never fails.
# - Cost is price x time x nodes, pro rata in the step where the work completes. A run that
#   misses its deadline is charged as if it finished on standard right after it (one more
#   launch), so costs stay comparable.
# - With --checkpoint-interval-hours, a preemption loses the work done since the last checkpoint
#   (one every that much work); a switch the policy asks for checkpoints first (a cancel is
#   graceful). Without it nothing is lost. The offline optimum knows every preemption in
#   advance and is assumed to checkpoint just before each: a lower bound.
# - By default policies see the trace's Spot availability at every tick, also while on
#   standard. With --spot-cooldown-minutes they see what production sees (domain.py): on
#   standard, Spot counts as available again once that long has passed since it was last seen
#   unavailable (a preemption, or a Spot attempt given up while queued without capacity), and a
#   switch back to Spot is refused before then, and policies get spot_assumed=True on standard.
# - In both modes the Spot history in PolicyView (spot_run_s, spot_wait_s, spot_waits,
#   spot_down_at_s) comes only from the run's own Spot attempts, as production observes it.

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from spotorch.pipeline import Capacity, EscalationKind, RecoveryPolicy
from spotorch.policy import (
    PolicyView,
    always_standard,
    choose_capacity,
    greedy,
    uniform_progress,
)

TRACES_ENV = "SPOTORCH_TRACES"
REPO_ROOT = Path(__file__).resolve().parents[3]  # shared/spotorch/sim/simulate.py -> the repository
DEFAULT_TRACES = REPO_ROOT.parent / "shared" / "traces"

POLICIES = ("standard", "greedy", "count", "deadline", "uniform_progress", "optimal")

FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]
OnlinePolicy = Callable[[PolicyView], Capacity]


class SimulateError(Exception):
    """Base of this module's errors."""


class TraceError(SimulateError):
    """A trace file is missing, malformed or too short."""


class ScenarioError(SimulateError):
    """The task, deadline or step settings cannot be simulated."""


# ---------------------------------------------------------------------------------------------
# Traces


@dataclass(frozen=True)
class Trace:
    """One availability trace as published: counts of available Spot instances per tick."""

    name: str  # path relative to the traces root, e.g. availability/1-node/aws-.../x.json
    family: str  # the directory holding it, e.g. availability/1-node/aws-02-15-2023
    gap_s: int
    counts: npt.NDArray[np.int64]
    prices: FloatArray | None  # Spot price per tick, when the trace carries one

    @property
    def hours(self) -> float:
        return len(self.counts) * self.gap_s / 3600.0


def find_trace_files(paths: Iterable[Path]) -> list[tuple[Path, Path]]:
    """(file, root it was found under) for every .json below the given files or directories."""
    found: list[tuple[Path, Path]] = []
    for path in paths:
        if path.is_dir():
            found.extend((p, path) for p in sorted(path.rglob("*.json")))
        elif path.is_file():
            found.append((path, path.parent))
        else:
            raise TraceError(f"no such trace file or directory: {path}")
    if not found:
        raise TraceError("no trace files found in " + ", ".join(str(p) for p in paths))
    return found


def load_trace(path: Path, root: Path | None = None) -> Trace:
    """Read a trace file: {"metadata": {"gap_seconds": N}, "data": [...], "prices": [...]?}."""
    try:
        raw = json.loads(path.read_text())
        gap = raw["metadata"]["gap_seconds"]
        counts = np.asarray(raw["data"], dtype=np.int64)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise TraceError(f"{path}: not a trace file ({exc})") from exc
    if int(gap) != gap or gap <= 0 or counts.ndim != 1 or len(counts) == 0:
        raise TraceError(f"{path}: gap_seconds must be a positive integer and data a list")
    prices = raw.get("prices")
    price_array = None if prices is None else np.asarray(prices, dtype=np.float64)
    if price_array is not None and price_array.shape != counts.shape:
        raise TraceError(f"{path}: prices and data differ in length")
    rel = path.relative_to(root) if root is not None and path.is_relative_to(root) else path
    family = str(rel.parent) if str(rel.parent) != "." else path.parent.name
    return Trace(name=str(rel), family=family, gap_s=int(gap), counts=counts, prices=price_array)


# ---------------------------------------------------------------------------------------------
# Scenario and windows


@dataclass(frozen=True)
class Scenario:
    """The task being replayed and how it is priced."""

    task_s: float
    deadline_s: float
    overhead_s: float
    step_s: float = 300.0
    checkpoint_s: float | None = None
    nodes: int = 1
    price_ratio: float = 3.0  # on-demand / Spot, when the trace has no prices or as multiplier
    od_price: float | None = None  # per node-hour; default: price_ratio x mean Spot price
    count_after: int = 3  # preemptions before the count policy escalates
    spot_cooldown_s: float | None = None  # None: Spot seen at every tick; else production's view

    def __post_init__(self) -> None:
        for name in ("task_s", "deadline_s", "overhead_s", "step_s"):
            value = getattr(self, name)
            if value != round(value) or value < 0:
                raise ScenarioError(f"{name} must be a whole number of seconds, got {value}")
        if self.step_s <= 0 or self.task_s <= 0:
            raise ScenarioError("step and task must be positive")
        if self.deadline_s % self.step_s:
            raise ScenarioError("the deadline must be a whole number of steps")
        if self.task_s % self.unit_s:
            raise ScenarioError("the task must be a whole number of work units "
                                f"({self.unit_s:.0f} s: gcd of step and overhead)")
        if self.task_s + self.overhead_s > self.deadline_s:
            raise ScenarioError("infeasible: task plus one launch overhead exceeds the deadline")

    @property
    def unit_s(self) -> int:
        """Work quantum: every progress increment is a multiple of it, so the DP is exact."""
        return math.gcd(int(self.step_s), int(self.overhead_s)) or int(self.step_s)

    @property
    def steps(self) -> int:
        return int(self.deadline_s // self.step_s)


@dataclass(frozen=True)
class Window:
    """One replay: a slice of a trace resampled onto the scenario's step grid."""

    trace: str
    family: str
    start_s: float
    avail: BoolArray  # per step
    spot_price: FloatArray  # per node-hour, per step
    od_price: float  # per node-hour


def resample(trace: Trace, step_s: int, nodes: int) -> tuple[BoolArray, FloatArray]:
    """Availability and mean Spot price per step over the whole trace."""
    n_steps = len(trace.counts) * trace.gap_s // step_s
    edges = np.arange(n_steps + 1, dtype=np.int64) * step_s
    first = edges[:-1] // trace.gap_s  # first sample overlapping each step
    last = -((-edges[1:]) // trace.gap_s)  # one past the last sample overlapping it
    down = np.concatenate([[0], np.cumsum(trace.counts < nodes)])
    avail = (down[last] - down[first]) == 0
    if trace.prices is None:
        return avail, np.ones(n_steps)
    summed = np.concatenate([[0.0], np.cumsum(trace.prices)])
    return avail, (summed[last] - summed[first]) / (last - first)


def windows_of(trace: Trace, scenario: Scenario, stride_s: float | None) -> list[Window]:
    """Every window of the scenario's deadline that fits in the trace, stride_s apart."""
    step = int(scenario.step_s)
    avail, price = resample(trace, step, scenario.nodes)
    od = scenario.od_price
    if od is None:
        od = scenario.price_ratio * (float(np.mean(trace.prices)) if trace.prices is not None
                                     else 1.0)
    n = scenario.steps
    if stride_s is None:
        starts = range(0, 1 if len(avail) >= n else 0)
    else:
        starts = range(0, len(avail) - n + 1, max(1, round(stride_s / step)))
    return [Window(trace=trace.name, family=trace.family, start_s=float(s * step),
                   avail=avail[s:s + n], spot_price=price[s:s + n], od_price=od)
            for s in starts]


# ---------------------------------------------------------------------------------------------
# Replaying one policy


@dataclass(frozen=True)
class Outcome:
    """How one policy did on one window."""

    cost: float
    finished_s: float | None  # None: missed the deadline
    preemptions: int
    changeovers: int

    @property
    def met_deadline(self) -> bool:
        return self.finished_s is not None


def run_online(window: Window, scenario: Scenario, policy: OnlinePolicy) -> Outcome:
    """Replay a window through a production policy function, deciding at every step."""
    dt, overhead = float(scenario.step_s), float(scenario.overhead_s)
    total, deadline, checkpoint = float(scenario.task_s), float(scenario.deadline_s), \
        scenario.checkpoint_s
    per_s = scenario.nodes / 3600.0
    avail = window.avail.tolist()
    prices = window.spot_price.tolist()
    od = window.od_price
    spot, standard = Capacity.SPOT, Capacity.STANDARD
    cooldown = scenario.spot_cooldown_s
    cool_until = -math.inf  # with a cooldown: until then, standard does not go back to Spot
    done = safe = cost = 0.0
    current: Capacity | None = None
    last: Capacity | None = None
    running = False
    overhead_left = 0.0
    preemptions = changeovers = 0
    # Spot history as production sees it: only through Spot attempts (running or queued), in
    # both modes, never from the trace while on standard or idle.
    spot_run_s = spot_wait_s = 0.0
    spot_waits = 0
    queued = False  # the live Spot attempt spent the last step waiting for capacity
    last_down: float | None = None  # when a Spot attempt last saw Spot unavailable
    for i, up in enumerate(avail):
        now = i * dt
        if current is spot and running and not up:
            preemptions += 1
            current, running = None, False
            done = safe
            cool_until = now + (cooldown or 0.0)
            last_down = now
        if queued and current is spot and up:
            spot_waits += 1  # a queued Spot attempt got capacity: one outage seen to its end
        queued = False
        if current is spot and not up:
            last_down = now  # a Spot attempt still queued: Spot seen unavailable now
        # On standard, production cannot see Spot: it assumes it back after the cooldown.
        seen = up if cooldown is None or current is not standard else now >= cool_until
        want = policy(PolicyView(now_s=now, deadline_s=deadline, work_total_s=total,
                                 work_done_s=safe, restart_overhead_s=overhead, current=current,
                                 spot_available=seen, preemptions=preemptions,
                                 changeovers=changeovers, tick_s=dt, spot_run_s=spot_run_s,
                                 spot_wait_s=spot_wait_s, spot_waits=spot_waits,
                                 spot_down_at_s=last_down,
                                 spot_assumed=cooldown is not None and current is standard))
        if cooldown is not None:
            if current is spot and not running and not up and want is not spot:
                cool_until = now + cooldown  # gave up on a Spot attempt queued without capacity
            if current is standard and want is spot and now < cool_until:
                want = standard  # as domain.py: back to Spot only once it may have capacity
        if want is not current:
            if last is not None and want is not last:
                changeovers += 1
            current, last, running = want, want, False
            safe = done  # a requested switch is a graceful cancel: checkpoint first
        if current is spot:
            if up:
                spot_run_s += dt
            else:
                spot_wait_s += dt
                queued = True
                last_down = now
        if current is standard or up:
            price = od if current is standard else prices[i]
            if not running:
                running, overhead_left = True, overhead
            lost = min(overhead_left, dt)
            overhead_left -= lost
            if done + dt - lost >= total:
                used = lost + total - done
                return Outcome(cost + price * used * per_s, now + used, preemptions,
                               changeovers)
            done += dt - lost
            cost += price * dt * per_s
            safe = done if checkpoint is None else max(safe, done // checkpoint * checkpoint)
        else:
            running = False
    # Missed: finish on standard right after the deadline, so the cost stays comparable.
    cost += od * (overhead + total - safe) * per_s
    return Outcome(cost, None, preemptions, changeovers)


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


# ---------------------------------------------------------------------------------------------
# The offline optimum


_NONE, _SPOT, _STD = 0, 1, 2
# Path statistics ride along with each DP state, packed into one int32:
# preemptions * _PRE + changeovers * _CHG + last capacity launched (0 none yet, 1 spot, 2 std).
_CHG = 4
_PRE = 1 << 20
_LAST = 3
IntArray = npt.NDArray[np.int32]


def _relabel_table(target: int) -> IntArray:
    """Code increment when launching `target`, indexed by the last capacity launched."""
    return np.array([target + (_CHG if last not in (0, target) else 0) - last
                     for last in range(_LAST + 1)], dtype=np.int32)


_RELABEL = {target: _relabel_table(target) for target in (_SPOT, _STD)}


def _launch_code(code: IntArray, source: int, target: int) -> IntArray:
    """Statistics after launching `target` from `source`: a changeover if the last launch differs."""
    if source != _NONE:  # the last launch is the source itself
        return code + (target - source + _CHG)
    relabelled: IntArray = code + _RELABEL[target][code & _LAST]
    return relabelled


def _merge(value: FloatArray, code: IntArray, other: FloatArray, other_code: IntArray) -> None:
    """value = min(value, other) in place, keeping the winner's statistics."""
    better = other < value
    np.copyto(value, other, where=better)
    np.copyto(code, other_code, where=better)


def optimal(windows: Sequence[Window], scenario: Scenario) -> list[Outcome]:
    """The cheapest schedule that meets the deadline, knowing each window's future (batched DP)."""
    # Forward DP over steps; state = (capacity running at the step boundary: none/spot/standard,
    # work done in quanta of gcd(step, overhead)). A launch's overhead is charged up front as
    # negative work. That is exact because idling is always allowed: a launch preempted or
    # abandoned inside its overhead buys nothing, so idling instead dominates it (checked
    # against brute_force in the tests).
    # Work is indexed by its deficit against running flat out to the deadline: column j holds
    # work k = j + goal - (steps left) * run. Continuing keeps j, a launch moves it down by the
    # overhead, idling by a whole step, and j < 0 can no longer finish. So the live states form
    # one contiguous band as wide as the slack, whatever the step, and every window is batched.
    if not windows:
        return []
    n = scenario.steps
    unit = scenario.unit_s
    run = int(scenario.step_s) // unit  # quanta a step on the running capacity adds
    pad = int(scenario.overhead_s) // unit  # quanta a launch costs before useful work
    goal = int(scenario.task_s) // unit  # quanta of the whole task
    width = n * run - goal + 1  # slack in quanta, plus one
    batch = len(windows)
    dt = float(scenario.step_s)
    per_s = scenario.nodes / 3600.0
    avail = np.stack([w.avail for w in windows])
    spot_rate = np.stack([w.spot_price for w in windows]) * per_s  # per second, per step
    od_rate = np.array([w.od_price for w in windows]) * per_s
    inf = np.inf
    # Two buffers, swapped each step; columns outside the live band are never read.
    costs = [np.full((3, batch, width), inf), np.full((3, batch, width), inf)]
    codes = [np.zeros((3, batch, width), dtype=np.int32) for _ in range(2)]
    costs[0][_NONE, :, width - 1] = 0.0  # no work yet, every step still ahead
    best = np.full(batch, inf)
    best_code = np.zeros(batch, dtype=np.int32)
    best_end = np.full(batch, np.nan)
    rows = np.arange(batch)

    for i in range(n):
        left = (n - i) * run  # quanta that running flat out would still add; j >= left is done
        # Live columns: not yet all the work, and no less than a launch's overhead below zero.
        lo, hi = max(left - goal - pad, 0), min(left, width)
        up = avail[:, i]
        down = ~up
        cost, code = costs[i % 2], codes[i % 2]
        nxt, nxt_code = costs[1 - i % 2], codes[1 - i % 2]
        f_none, f_spot, f_std = (cost[c, :, lo:hi] for c in (_NONE, _SPOT, _STD))
        c_none, c_spot, c_std = (code[c, :, lo:hi] for c in (_NONE, _SPOT, _STD))
        # Preemption at this boundary: a running Spot attempt ends.
        lost = down[:, None] & (f_spot < f_none)
        np.copyto(f_none, f_spot, where=lost)
        np.copyto(c_none, c_spot + _PRE, where=lost)
        f_spot[down] = inf
        rates = {_SPOT: spot_rate[:, i], _STD: od_rate}
        # Launch sources: the cheaper of the two other states, statistics relabelled.
        to_spot, to_spot_code = f_none.copy(), _launch_code(c_none, _NONE, _SPOT)
        _merge(to_spot, to_spot_code, f_std, _launch_code(c_std, _STD, _SPOT))
        to_std, to_std_code = f_none.copy(), _launch_code(c_none, _NONE, _STD)
        _merge(to_std, to_std_code, f_spot, _launch_code(c_spot, _SPOT, _STD))
        # (target, source values, their statistics, columns moved down, continuing?)
        moves = ((_SPOT, f_spot, c_spot, 0, True), (_SPOT, to_spot, to_spot_code, pad, False),
                 (_STD, f_std, c_std, 0, True), (_STD, to_std, to_std_code, pad, False))

        # Runs that complete inside this step: pro rata cost of the time actually used.
        for target, value, value_code, overhead, _ in moves:
            first = max(left - run + overhead, lo)
            if first >= hi:
                continue
            used = (left - np.arange(first, hi) + overhead) * unit  # seconds of the step used
            finish = value[:, first - lo:] + rates[target][:, None] * used[None, :]
            if target == _SPOT:
                finish[down] = inf
            pick = np.argmin(finish, axis=1)
            picked = finish[rows, pick]
            better = picked < best
            if better.any():
                best = np.where(better, picked, best)
                best_code = np.where(better, value_code[rows, first - lo + pick], best_code)
                best_end = np.where(better, i * dt + used[pick], best_end)

        # Runs still going after this step: continuing keeps the column, a launch moves it down
        # by the overhead, idling by a whole step. Columns from left - run on are finished.
        done_from = left - run  # first finished column after this step
        nxt[:, :, max(lo - max(pad, run), 0):hi] = inf  # the next band, and a margin below it
        for target, value, value_code, overhead, continuing in moves:
            # Target columns fed by the live sources, shifted down by the overhead.
            a, b = max(lo - overhead, 0), min(hi - overhead, done_from)
            if a >= b:
                continue
            src = slice(a + overhead - lo, b + overhead - lo)
            if continuing:  # the first candidate for this target: assign instead of merging
                np.add(value[:, src], dt * rates[target][:, None], out=nxt[target, :, a:b])
                nxt_code[target, :, a:b] = value_code[:, src]
            else:
                _merge(nxt[target, :, a:b], nxt_code[target, :, a:b],
                       value[:, src] + dt * rates[target][:, None], value_code[:, src])
        nxt[_SPOT][down] = inf
        # Idle: any attempt may be cancelled, and a queued Spot attempt costs nothing.
        a, b = max(lo - run, 0), min(hi - run, done_from)
        if a < b:
            src = slice(a + run - lo, b + run - lo)
            idle, idle_code = nxt[_NONE, :, a:b], nxt_code[_NONE, :, a:b]
            idle[...] = f_none[:, src]
            idle_code[...] = c_none[:, src]
            _merge(idle, idle_code, f_spot[:, src], c_spot[:, src])
            _merge(idle, idle_code, f_std[:, src], c_std[:, src])

    return [Outcome(float(best[b]), float(best_end[b]), int(best_code[b] // _PRE),
                    int(best_code[b] % _PRE // _CHG)) if np.isfinite(best[b])
            else Outcome(inf, None, 0, 0) for b in range(batch)]


def brute_force(window: Window, scenario: Scenario) -> float:
    """The optimum by trying every sequence of idle/Spot/standard per step (tiny windows only)."""
    dt, overhead, total = float(scenario.step_s), float(scenario.overhead_s), \
        float(scenario.task_s)
    per_s = scenario.nodes / 3600.0
    n = len(window.avail)
    best = math.inf

    def walk(i: int, running: Capacity | None, overhead_left: float, done: float,
             cost: float) -> None:
        nonlocal best
        if cost >= best or i == n:
            return
        up = bool(window.avail[i])
        if running is Capacity.SPOT and not up:
            running = None
        choices: list[Capacity | None] = [None, Capacity.STANDARD]
        if up:
            choices.append(Capacity.SPOT)
        for choice in choices:
            if choice is None:
                walk(i + 1, None, 0.0, done, cost)
                continue
            price = (window.od_price if choice is Capacity.STANDARD
                     else float(window.spot_price[i])) * per_s
            left = overhead_left if choice is running else overhead
            lost = min(left, dt)
            if done + dt - lost >= total - 1e-9:
                best = min(best, cost + price * (lost + total - done))
                continue
            walk(i + 1, choice, left - lost, done + dt - lost, cost + price * dt)

    walk(0, None, 0.0, 0.0, 0.0)
    return best


# ---------------------------------------------------------------------------------------------
# Evaluating many windows


@dataclass(frozen=True)
class RunRecord:
    """Every policy's outcome on one window."""

    trace: str
    family: str
    start_s: float
    outcomes: Mapping[str, Outcome]


def evaluate(windows: Sequence[Window], scenario: Scenario,
             policies: Sequence[str] = POLICIES) -> list[RunRecord]:
    """Replay every window through every named policy."""
    unknown = set(policies) - set(POLICIES)
    if unknown:
        raise ScenarioError(f"unknown policies: {sorted(unknown)}")
    online = online_policies(scenario)
    best = optimal(windows, scenario) if "optimal" in policies else None
    records = []
    for index, window in enumerate(windows):
        outcomes: dict[str, Outcome] = {}
        for name in policies:
            if name == "optimal":
                assert best is not None
                outcomes[name] = best[index]
            elif name == "standard":
                outcomes[name] = run_standard(window, scenario)
            else:
                outcomes[name] = run_online(window, scenario, online[name])
        records.append(RunRecord(window.trace, window.family, window.start_s, outcomes))
    return records


def evaluate_trace(job: tuple[Path, Path | None, Scenario, float | None, tuple[str, ...]]
                   ) -> list[RunRecord]:
    """One trace file's windows (a top-level function, so worker processes can run it)."""
    path, root, scenario, stride_s, policies = job
    return evaluate(windows_of(load_trace(path, root), scenario, stride_s), scenario, policies)


def evaluate_files(files: Sequence[tuple[Path, Path | None]], scenario: Scenario,
                   stride_s: float | None, policies: Sequence[str] = POLICIES,
                   workers: int = 1) -> list[RunRecord]:
    """Evaluate many trace files, in worker processes when workers > 1."""
    jobs = [(path, root, scenario, stride_s, tuple(policies)) for path, root in files]
    if workers <= 1:
        return [r for job in jobs for r in evaluate_trace(job)]
    import multiprocessing  # why lazy: most callers run one process

    with multiprocessing.get_context("fork").Pool(workers) as pool:
        return [r for part in pool.map(evaluate_trace, jobs, chunksize=1) for r in part]


@dataclass(frozen=True)
class PolicySummary:
    """Aggregates of one policy over many windows."""

    mean_cost: float
    p95_cost: float
    deadline_met_fraction: float
    mean_cost_ratio_to_optimal: float | None
    mean_preemptions: float
    mean_changeovers: float

    def as_json(self) -> dict[str, float | None]:
        return {"mean_cost": self.mean_cost, "p95_cost": self.p95_cost,
                "deadline_met_fraction": self.deadline_met_fraction,
                "mean_cost_ratio_to_optimal": self.mean_cost_ratio_to_optimal,
                "mean_preemptions": self.mean_preemptions,
                "mean_changeovers": self.mean_changeovers}


def summarize(records: Sequence[RunRecord]) -> dict[str, PolicySummary]:
    """Per-policy aggregates; ratios are taken per window against the optimum, then averaged."""
    if not records:
        return {}
    names = list(records[0].outcomes)
    best = (np.array([r.outcomes["optimal"].cost for r in records])
            if "optimal" in names else None)
    out = {}
    for name in names:
        outcomes = [r.outcomes[name] for r in records]
        costs = np.array([o.cost for o in outcomes])
        ratio = None
        if best is not None:
            ok = np.isfinite(best) & (best > 0)
            ratio = float(np.mean(costs[ok] / best[ok])) if ok.any() else None
        out[name] = PolicySummary(
            mean_cost=float(np.mean(costs)), p95_cost=float(np.percentile(costs, 95)),
            deadline_met_fraction=float(np.mean([o.met_deadline for o in outcomes])),
            mean_cost_ratio_to_optimal=ratio,
            mean_preemptions=float(np.mean([o.preemptions for o in outcomes])),
            mean_changeovers=float(np.mean([o.changeovers for o in outcomes])))
    return out


def format_table(summary: Mapping[str, PolicySummary]) -> str:
    """A fixed-width table of the summary."""
    lines = [f"{'policy':<17}{'mean cost':>11}{'p95 cost':>11}{'met':>8}{'vs opt':>9}"
             f"{'preempt':>9}{'switches':>9}"]
    for name, s in summary.items():
        ratio = "-" if s.mean_cost_ratio_to_optimal is None else \
            f"{s.mean_cost_ratio_to_optimal:.3f}"
        lines.append(f"{name:<17}{s.mean_cost:>11.2f}{s.p95_cost:>11.2f}"
                     f"{s.deadline_met_fraction:>8.3f}{ratio:>9}"
                     f"{s.mean_preemptions:>9.2f}{s.mean_changeovers:>9.2f}")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# Command line


def default_trace_paths() -> list[Path]:
    """SPOTORCH_TRACES (os.pathsep-separated) if set, else ../shared/traces beside the repo."""
    env = os.environ.get(TRACES_ENV)
    if env:
        return [Path(p) for p in env.split(os.pathsep) if p]
    return [DEFAULT_TRACES]


def _hours(value: float) -> float:
    return round(value * 3600.0)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="spotorch simulate",
        description="Replay Spot traces through the escalation policies and the offline optimum.")
    parser.add_argument("traces", nargs="*", type=Path,
                        help=f"trace files or directories (default: ${TRACES_ENV} or "
                             f"{DEFAULT_TRACES})")
    parser.add_argument("--task-hours", type=float, default=48.0)
    parser.add_argument("--deadline-hours", type=float, default=60.0)
    parser.add_argument("--restart-overhead-hours", type=float, default=0.2)
    parser.add_argument("--checkpoint-interval-hours", type=float, default=None)
    parser.add_argument("--price-ratio", type=float, default=3.0,
                        help="on-demand / Spot price (applied to the trace's mean Spot price "
                             "when it has prices)")
    parser.add_argument("--on-demand-price", type=float, default=None,
                        help="on-demand price per node-hour (overrides --price-ratio)")
    parser.add_argument("--tick-minutes", type=float, default=5.0)
    parser.add_argument("--window-stride-hours", type=float, default=None,
                        help="replay windows starting this far apart (default: one per trace)")
    parser.add_argument("--nodes", type=int, default=1,
                        help="Spot counts as available when the trace's count is at least this")
    parser.add_argument("--count-after", type=int, default=3,
                        help="preemptions before the count policy escalates")
    parser.add_argument("--spot-cooldown-minutes", type=float, default=None,
                        help="replay with production's view of Spot: unseen while on standard, "
                             "assumed back this long after it was last seen unavailable")
    parser.add_argument("--policies", default=",".join(POLICIES))
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--plot", type=Path, default=None,
                        help="write cost vs deadline slack per policy (PNG)")
    parser.add_argument("--plot-deadline-hours", type=float, nargs="+", default=None,
                        help="deadlines swept by --plot (default: task + 4, 12, 24, 48 h)")
    return parser


def scenario_from_args(args: argparse.Namespace, deadline_hours: float) -> Scenario:
    checkpoint = args.checkpoint_interval_hours
    return Scenario(task_s=_hours(args.task_hours), deadline_s=_hours(deadline_hours),
                    overhead_s=_hours(args.restart_overhead_hours),
                    step_s=round(args.tick_minutes * 60.0),
                    checkpoint_s=None if checkpoint is None else _hours(checkpoint),
                    nodes=args.nodes, price_ratio=args.price_ratio,
                    od_price=args.on_demand_price, count_after=args.count_after,
                    spot_cooldown_s=None if args.spot_cooldown_minutes is None
                    else round(args.spot_cooldown_minutes * 60.0))


@dataclass(frozen=True)
class SweepPoint:
    """Summaries at one deadline, for the plot."""

    slack_hours: float
    summary: Mapping[str, PolicySummary] = field(default_factory=dict)


def plot_sweep(points: Sequence[SweepPoint], path: Path) -> None:
    """Mean cost per policy against deadline slack."""
    import matplotlib  # why lazy: only --plot needs it, and it is slow to import

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8.5, 4.5))
    for name in points[0].summary:
        ax.plot([p.slack_hours for p in points], [p.summary[name].mean_cost for p in points],
                marker="o", label=name)
    ax.set_xlabel("deadline slack (hours beyond the task)")
    ax.set_ylabel("mean cost per run")
    ax.set_title("spotorch simulate: cost vs deadline slack")
    ax.grid(True, alpha=0.3)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    """Entry point of `spotorch simulate`; returns the process exit code."""
    args = build_parser().parse_args(argv)
    policies = tuple(p.strip() for p in args.policies.split(",") if p.strip())
    try:
        files = find_trace_files(args.traces or default_trace_paths())
        scenario = scenario_from_args(args, args.deadline_hours)
        records = evaluate_files(files, scenario, _stride(args), policies, args.workers)
        if not records:
            raise TraceError("no trace is long enough for the deadline")
        summary = summarize(records)
        if args.plot is not None:
            deadlines = args.plot_deadline_hours or [args.task_hours + h for h in (4, 12, 24, 48)]
            points = [SweepPoint(d - args.task_hours, summarize(evaluate_files(
                files, scenario_from_args(args, d), _stride(args), policies, args.workers)))
                for d in sorted(deadlines)]
            plot_sweep(points, args.plot)
    except SimulateError as exc:
        print(f"spotorch simulate: {exc}", file=sys.stderr)
        return 2
    if args.json:
        payload: dict[str, Any] = {"runs": len(records), "policies": {
            name: s.as_json() for name, s in summary.items()}}
        print(json.dumps(payload))
    else:
        print(f"{len(records)} runs over {len(files)} trace files; task {args.task_hours} h, "
              f"deadline {args.deadline_hours} h, overhead {args.restart_overhead_hours} h")
        print(format_table(summary))
    return 0


def _stride(args: argparse.Namespace) -> float | None:
    hours: float | None = args.window_stride_hours
    return None if hours is None else hours * 3600.0


if __name__ == "__main__":
    raise SystemExit(main())
