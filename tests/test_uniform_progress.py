"""Uniform Progress against an independent reimplementation from the paper's description."""

# The reference below is written from "Can't Be Late" (Wu et al., NSDI'24), section 4, and the
# way its authors' simulator steps time (a tick loop: observe the last gap, credit its work net
# of the restart overhead still owed, decide, and ask for NONE when Spot is wanted but absent).
# It shares no code with spotorch.core.policy or spotorch.sim.replay; only the inputs (a window of
# availability already resampled onto 5-minute ticks) and the billing convention (per tick,
# pro rata in the tick that completes the work, as the simulator bills) are common.

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from spotorch.core.policy import uniform_progress
from spotorch.sim.model import Scenario, Window, find_trace_files, load_trace, windows_of
from spotorch.sim.replay import run_online
from spotorch.sim.simulate import DEFAULT_TRACES

NONE, SPOT, OD = "none", "spot", "on-demand"


def reference_up(avail: list[bool], spot_price: list[float], od_price: float, task_s: float,
                 deadline_s: float, d: float, gap: float) -> tuple[float, bool]:
    """Cost of Uniform Progress on one window, and whether it met the deadline."""
    done = 0.0
    owed = 0.0  # restart overhead still to pay before useful work
    cluster = NONE  # what ran during the last gap
    cost = 0.0
    for tick, has_spot in enumerate(avail):
        t = tick * gap
        # The cluster asked for at the last tick ran through the last gap (Spot only while
        # available, so a preemption lands at this tick).
        if cluster == SPOT and not has_spot:
            cluster = NONE
        left = task_s - done
        if left <= 1e-6:
            break
        # The paper's quantities: cp(t) = done, ep(t) = C0 * t / R0, R(t) = time left.
        ahead = done - task_s * t / deadline_s  # > 0: ahead of the uniform progress line
        behind_2d = task_s * (t + 2 * d) / deadline_s - done  # >= 0: hysteresis holds
        time_left = math.floor((deadline_s - t) / gap) * gap
        need = math.ceil((left + d) / gap) * gap
        need_2d = math.ceil((left + 2 * d) / gap) * gap
        want = SPOT if has_spot else NONE  # exploitation: Spot whenever it is there
        if ahead < 0:  # uniform progress: behind the line, catch up on on-demand if no Spot
            want = SPOT if has_spot else OD
        if cluster == OD and (not has_spot or behind_2d >= 0):  # hysteresis; no Spot: stay
            want = OD
        if need_2d >= time_left and cluster in (NONE, OD):  # safety net
            want = OD
        if need >= time_left:  # the strong guarantee
            want = SPOT if cluster == SPOT and owed < 1e-6 else OD
        if want != cluster and want != NONE:
            owed = d  # a launch
        cluster = want
        if cluster == NONE:
            continue
        price = od_price if cluster == OD else spot_price[tick]
        work = max(gap - owed, 0.0)
        owed = max(owed - gap, 0.0)
        if work >= left:
            return cost + price * (gap - work + left) / 3600.0, True
        done += work
        cost += price * gap / 3600.0
    if task_s - done <= 1e-6:
        return cost, True
    return cost + od_price * (d + task_s - done) / 3600.0, False


def agreement(windows: list[Window], scenario: Scenario) -> tuple[float, list[float]]:
    """Fraction of windows where spotorch's UP is within 0.5% of the reference, and the gaps."""
    gaps = []
    for win in windows:
        ours = run_online(win, scenario, uniform_progress)
        ref, met = reference_up(win.avail.tolist(), win.spot_price.tolist(), win.od_price,
                                scenario.task_s, scenario.deadline_s, scenario.overhead_s,
                                scenario.step_s)
        assert met and ours.met_deadline
        gaps.append(abs(ours.cost - ref) / ref)
    return float(np.mean(np.array(gaps) <= 0.005)), gaps


H = 3600


@pytest.mark.parametrize(("avail", "task_h", "deadline_h", "d_h", "cost"), [
    # Exploitation: wait (ahead of the line at t = 0), then Spot for the whole task.
    ([0, 1, 1, 1], 2, 4, 0, 2.0),
    # Uniform progress: behind the line at 1 h with no Spot -> on-demand to the end.
    ([0, 0, 0, 0], 2, 4, 0, 6.0),
    # Stay on on-demand while Spot is unavailable, even ahead of the line at 2 h (the old
    # rule left to wait and took Spot at 3 h: 3 + 1 = 4).
    ([0, 0, 0, 1, 1, 1], 2, 6, 0, 6.0),
    # Hysteresis: on on-demand at 2 h with cp = ep(2 h) = 1 h and Spot back: stay (their
    # condition2 >= 0 keeps on-demand at equality).
    ([0, 0, 1, 1], 2, 4, 0, 6.0),
    # Safety net: 1 h of Spot work (after a 1 h launch), preempted at 2 h, ahead -> wait;
    # at 3 h slack 2 h < 2d + tick = 3 h -> on-demand: 1 h overhead + 1 h work.
    ([1, 1, 0, 0, 0, 0], 2, 6, 1, 2.0 + 6.0),
])
def test_hand_computed_windows(avail: list[int], task_h: float, deadline_h: float, d_h: float,
                               cost: float) -> None:
    """Each rule on a window small enough to follow by hand; both implementations agree."""
    scenario = Scenario(task_s=task_h * H, deadline_s=deadline_h * H, overhead_s=d_h * H,
                        step_s=H)
    win = Window("t", "f", 0.0, np.array(avail, dtype=bool), np.ones(len(avail)), 3.0)
    ours = run_online(win, scenario, uniform_progress)
    assert ours.met_deadline and ours.cost == pytest.approx(cost)
    ref, met = reference_up([bool(a) for a in avail], [1.0] * len(avail), 3.0, task_h * H,
                            deadline_h * H, d_h * H, H)
    assert met and ref == pytest.approx(cost)


def test_agrees_on_random_markov_windows() -> None:
    """Synthetic windows of every kind, tick for tick the same cost."""
    rng = np.random.default_rng(18)
    scenario = Scenario(task_s=8 * H, deadline_s=12 * H, overhead_s=720, step_s=300)
    wins = []
    for _ in range(60):
        up, down = rng.uniform(2, 40, size=2)
        avail = np.empty(scenario.steps, dtype=bool)
        avail[0] = rng.random() < 0.5
        for i in range(1, scenario.steps):
            avail[i] = avail[i - 1] != (rng.random() < 1.0 / (up if avail[i - 1] else down))
        wins.append(Window("m", "m", 0.0, avail, rng.uniform(0.8, 1.2, scenario.steps), 3.0))
    fraction, gaps = agreement(wins, scenario)
    assert fraction == 1.0, max(gaps)


def _public_windows(every: int) -> list[tuple[Scenario, list[Window]]]:
    roots = [p for p in (DEFAULT_TRACES,) if p.is_dir()]
    if not roots:
        pytest.skip(f"public traces not found at {DEFAULT_TRACES}")
    traces = [load_trace(path, root) for path, root in find_trace_files([Path(r) for r in roots])]
    cells = []
    for overhead_h in (0.1, 0.2):
        for deadline_h in (52, 60, 72, 96):
            scenario = Scenario(task_s=48 * H, deadline_s=deadline_h * H,
                                overhead_s=round(overhead_h * H), step_s=300)
            wins = [w for t in traces for w in windows_of(t, scenario, 24 * H)]
            cells.append((scenario, wins[::every]))
    return cells


def test_agrees_on_a_sample_of_the_public_traces() -> None:
    """Every 8th window of the benchmark grid (task 48 h, 8 cells): >= 99% within 0.5%."""
    for scenario, wins in _public_windows(every=8):
        fraction, gaps = agreement(wins, scenario)
        assert fraction >= 0.99, (scenario, fraction, max(gaps))


@pytest.mark.slow
@pytest.mark.grid
def test_agrees_on_every_window_of_the_public_traces() -> None:
    """The whole benchmark grid (about 5,500 windows, a few minutes on one core)."""
    for scenario, wins in _public_windows(every=1):
        fraction, gaps = agreement(wins, scenario)
        assert fraction >= 0.99, (scenario, fraction, max(gaps))
