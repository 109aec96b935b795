"""The offline optimum: the cheapest schedule that meets the deadline, knowing the trace."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace

import numpy as np
import numpy.typing as npt

from spotorch.core.pipeline import Capacity
from spotorch.sim.model import FloatArray, Outcome, Scenario, ScenarioError, Window

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


# Windows x slack columns per batch: the DP's dozen working arrays then stay in a 1 MiB L2
# cache; a whole cell at once (a 2,881-column band for 48 h of slack) runs 1.8 x slower.
BATCH_CELLS = 48_000


def optimal(windows: Sequence[Window], scenario: Scenario) -> list[Outcome]:
    """The cheapest schedule that meets the deadline, knowing each window's future (batched DP)."""
    return optimal_at(windows, scenario, (scenario.deadline_s,))[scenario.deadline_s]


def optimal_at(windows: Sequence[Window], scenario: Scenario,
               deadlines_s: Sequence[float]) -> dict[float, list[Outcome]]:
    """optimal() of every window's prefix at each deadline (<= the scenario's), in one DP."""
    # The forward DP's values do not depend on the deadline: a state that can still finish by
    # a shorter deadline is reached only through states that could too (work grows by at most
    # a step per step), so the shorter DP is a sub-band of the longer one, value for value,
    # and its optimum is the best finish before its last step (tests/test_simulate.py checks
    # equality with separate runs). The grid's four deadlines share one DP per window start.
    for deadline in deadlines_s:
        if deadline > scenario.deadline_s:
            raise ScenarioError(f"deadline {deadline} s beyond the windows' {scenario.deadline_s} s")
        replace(scenario, deadline_s=deadline)  # validates it
    ends = sorted({int(d // scenario.step_s) for d in deadlines_s})
    width = scenario.steps * (int(scenario.step_s) // scenario.unit_s) \
        - int(scenario.task_s) // scenario.unit_s + 1
    size = max(1, BATCH_CELLS // max(width, 1))
    parts = [_optimal_batch(windows[start:start + size], scenario, ends)
             for start in range(0, len(windows), size)]
    return {d: [o for part in parts for o in part[int(d // scenario.step_s)]]
            for d in deadlines_s}


def _optimal_batch(windows: Sequence[Window], scenario: Scenario,
                   ends: Sequence[int]) -> dict[int, list[Outcome]]:
    """optimal_at() on one batch of windows, all at once: outcomes per deadline in steps."""
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
        return {end: [] for end in ends}
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
    found: dict[int, list[Outcome]] = {}
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
        if i + 1 in ends:
            found[i + 1] = _outcomes(best, best_code, best_end)

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

    return found


def _outcomes(best: FloatArray, best_code: IntArray, best_end: FloatArray) -> list[Outcome]:
    return [Outcome(float(cost), float(end), int(code // _PRE), int(code % _PRE // _CHG))
            if np.isfinite(cost) else Outcome(math.inf, None, 0, 0)
            for cost, code, end in zip(best, best_code, best_end, strict=True)]


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
