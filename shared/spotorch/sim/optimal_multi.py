"""The multi-region offline optimum: the cheapest schedule that meets the deadline knowing every
zone's future, with each move between regions priced (egress dollars and transfer time)."""

# The model (shared with sim.multi_region's replay and checked against brute_force here):
# - Time runs in the scenario's steps; Spot in zone z is available in a step only if the zone's
#   trace shows it for the whole step. Standard never fails and runs in a region.
# - A (re)launch costs the restart overhead of billed time before useful work, plus, when the
#   attempt's region is not the checkpoint's, the checkpoint's transfer time and its egress
#   dollars (and the data's, when the attempt is not in the data's region): MovePrices.
# - The checkpoint lives in the region of the last attempt launched (None before the first).
# The DP is the single-region one of sim.optimal (work indexed by its deficit against running
# flat out, so the live states form one band as wide as the slack), over more states: idle with
# the checkpoint in region r (and "fresh", no checkpoint yet), Spot running in zone z, standard
# running in region r. Launch overheads differ by source region, so launches are shifted per
# (source region, target region) pair, every target of one region at once.

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import reduce

import numpy as np
import numpy.typing as npt

from spotorch.core.regions import MovePrices, region_of
from spotorch.sim.model import BoolArray, Scenario, ScenarioError

FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True)
class Zones:
    """The zones of a multi-region run: names, their regions, prices per hour, the move's prices."""

    names: tuple[str, ...]
    spot_per_h: tuple[float, ...]  # per zone
    standard_per_h: tuple[float, ...]  # per zone (standard runs at its region's cheapest)
    move: MovePrices = field(default_factory=MovePrices)

    def __post_init__(self) -> None:
        if not self.names or len({len(self.names), len(self.spot_per_h),
                                  len(self.standard_per_h)}) != 1:
            raise ScenarioError("zones need one name, Spot price and standard price each")
        if len(set(self.names)) != len(self.names):
            raise ScenarioError("zone names must differ: " + ", ".join(self.names))
        if min(self.spot_per_h) < 0 or min(self.standard_per_h) < 0:
            raise ScenarioError("prices must be >= 0")

    @property
    def regions(self) -> tuple[str, ...]:
        """The distinct regions, in the zones' order."""
        return tuple(dict.fromkeys(region_of(n) for n in self.names))

    def region_index(self, zone: int) -> int:
        """Index in `regions` of a zone's region."""
        return self.regions.index(region_of(self.names[zone]))

    def standard_of(self, region: int) -> float:
        """Standard price per hour in a region: its cheapest zone's."""
        name = self.regions[region]
        return min(p for n, p in zip(self.names, self.standard_per_h, strict=True)
                   if region_of(n) == name)

    def unit_s(self, scenario: Scenario) -> int:
        """Work quantum: the gcd of the step, the overhead and every transfer time."""
        values = [int(scenario.step_s), int(scenario.overhead_s)]
        for src in (None, *self.regions):
            values += [int(self.move.seconds(src, dst)) for dst in self.regions]
        unit = reduce(math.gcd, values)
        return unit or int(scenario.step_s)


@dataclass(frozen=True)
class MultiOptimum:
    """The optimum of one window: its cost (egress included) and when it finishes."""

    cost: float
    finished_s: float | None


def optimal_multi(avail: BoolArray, scenario: Scenario, zones: Zones) -> list[MultiOptimum]:
    """The multi-region optimum of each window: avail is windows x zones x steps."""
    if avail.ndim != 3 or avail.shape[1] != len(zones.names) or avail.shape[2] < scenario.steps:
        raise ScenarioError(f"availability must be windows x {len(zones.names)} zones x "
                            f">= {scenario.steps} steps, got {avail.shape}")
    if avail.shape[0] == 0:
        return []
    unit = zones.unit_s(scenario)
    for name in ("step_s", "overhead_s", "task_s"):
        if int(getattr(scenario, name)) % unit:
            raise ScenarioError(f"{name} must be a whole number of {unit} s quanta")
    n = scenario.steps
    run = int(scenario.step_s) // unit
    goal = int(scenario.task_s) // unit
    width = n * run - goal + 1
    batch = avail.shape[0]
    dt = float(scenario.step_s)
    per_s = scenario.nodes / 3600.0
    regions = zones.regions
    n_reg = len(regions)
    zone_reg = [zones.region_index(z) for z in range(len(zones.names))]
    # State layout: idle with the checkpoint in region 0..R-1, idle fresh (R); then per region
    # a block of its Spot zones followed by its standard.
    fresh = n_reg
    blocks: list[tuple[int, int, list[int]]] = []  # (first state, standard state, zones)
    at = n_reg + 1
    for r in range(n_reg):
        zs = [z for z in range(len(zones.names)) if zone_reg[z] == r]
        blocks.append((at, at + len(zs), zs))
        at += len(zs) + 1
    states = at
    rate = np.zeros(states)  # per second
    for r, (first, std, zs) in enumerate(blocks):
        rate[first:std] = [zones.spot_per_h[z] * per_s for z in zs]
        rate[std] = zones.standard_of(r) * per_s
    sources: list[str | None] = [*regions, None]  # checkpoint region of idle states 0..R
    move_cost = np.array([[zones.move.cost(s, d) for d in regions] for s in sources])
    pad = np.array([[(int(scenario.overhead_s) + int(zones.move.seconds(s, d))) // unit
                     for d in regions] for s in sources], dtype=np.int64)
    max_pad = int(pad.max())
    inf = np.inf
    cur = np.full((states, batch, width), inf)
    nxt = np.full((states, batch, width), inf)
    cur[fresh, :, width - 1] = 0.0
    best = np.full(batch, inf)
    best_end = np.full(batch, np.nan)
    rows = np.arange(batch)

    def consider(value: FloatArray, target: int, overhead: int, left: int, lo: int,
                 hi: int, i: int, down: BoolArray | None) -> None:
        """Finishes inside step i from `value` (columns lo..hi) launched/continued on target."""
        nonlocal best, best_end
        first = max(left - run + overhead, lo)
        if first >= hi:
            return
        used = (left - np.arange(first, hi) + overhead) * unit
        finish = value[:, first - lo:] + rate[target] * used[None, :]
        if down is not None:
            finish[down] = inf
        pick = np.argmin(finish, axis=1)
        picked = finish[rows, pick]
        better = picked < best
        if better.any():
            best = np.where(better, picked, best)
            best_end = np.where(better, i * dt + used[pick], best_end)

    for i in range(n):
        left = (n - i) * run
        lo, hi = max(left - goal - max_pad, 0), min(left, width)
        down_all = ~avail[:, :, i]  # windows x zones
        f = cur[:, :, lo:hi]
        # Preemptions at this boundary: a running Spot attempt ends, idle in its region.
        for r, (first, _std, zs) in enumerate(blocks):
            for k, z in enumerate(zs):
                lost = down_all[:, z]
                if lost.any():
                    f[r][lost] = np.minimum(f[r][lost], f[first + k][lost])
                    f[first + k][lost] = inf
        # Best value per checkpoint region, whatever runs now (a launch may stop it).
        stop = np.empty((n_reg + 1, batch, hi - lo))
        for r, (first, std, _zs) in enumerate(blocks):
            np.minimum(f[r], f[first:std + 1].min(axis=0), out=stop[r])
        stop[fresh] = f[fresh]
        # Finishing inside this step, continuing or after a launch.
        for r, (first, std, zs) in enumerate(blocks):
            for t in range(first, std + 1):
                down = down_all[:, zs[t - first]] if t < std else None
                consider(f[t], t, 0, left, lo, hi, i, down)
                for s in range(n_reg + 1):
                    consider(stop[s] + move_cost[s, r], t, int(pad[s, r]), left, lo, hi, i, down)
        if i + 1 == n:
            break
        # Still going after this step: continuing keeps the column, a launch moves it down by
        # its overhead and transfer, idling by a whole step.
        done_from = left - run
        nxt[:, :, max(lo - max(max_pad, run), 0):hi] = inf
        for r, (first, std, _zs) in enumerate(blocks):
            step_cost = dt * rate[first:std + 1][:, None, None]
            b = min(hi, done_from)
            if lo < b:
                nxt[first:std + 1, :, lo:b] = f[first:std + 1, :, :b - lo] + step_cost
            for s in range(n_reg + 1):
                p = int(pad[s, r])
                a, b = max(lo - p, 0), min(hi - p, done_from)
                if a >= b:
                    continue
                src = stop[s][:, a + p - lo:b + p - lo] + move_cost[s, r]
                target = nxt[first:std + 1, :, a:b]
                np.minimum(target, src[None] + step_cost, out=target)
            for k, z in enumerate(_zs):
                nxt[first + k][down_all[:, z]] = inf
        a, b = max(lo - run, 0), min(hi - run, done_from)
        if a < b:
            nxt[:n_reg + 1, :, a:b] = stop[:, :, a + run - lo:b + run - lo]
        cur, nxt = nxt, cur
    return [MultiOptimum(float(c), float(e)) if np.isfinite(c) else MultiOptimum(math.inf, None)
            for c, e in zip(best, best_end, strict=True)]


def brute_force_multi(avail: BoolArray, scenario: Scenario, zones: Zones) -> float:
    """The optimum by trying every choice per step: idle, Spot in a zone, standard in a region
    (tiny windows only). avail is zones x steps."""
    dt, overhead, total = float(scenario.step_s), float(scenario.overhead_s), \
        float(scenario.task_s)
    per_s = scenario.nodes / 3600.0
    regions = zones.regions
    n = scenario.steps
    choices: list[tuple[str, int]] = [("spot", z) for z in range(len(zones.names))] + \
        [("std", r) for r in range(len(regions))]
    best = math.inf

    def walk(i: int, running: tuple[str, int] | None, overhead_left: float, done: float,
             cost: float, ckpt: str | None) -> None:
        nonlocal best
        if cost >= best or i == n:
            return
        if running is not None and running[0] == "spot" and not avail[running[1], i]:
            running = None
        walk(i + 1, None, 0.0, done, cost, ckpt)
        for choice in choices:
            kind, index = choice
            if kind == "spot" and not avail[index, i]:
                continue
            region = region_of(zones.names[index]) if kind == "spot" else regions[index]
            price = (zones.spot_per_h[index] if kind == "spot"
                     else zones.standard_of(index)) * per_s
            paid, left, where = cost, overhead_left, ckpt
            if choice != running:
                paid += zones.move.cost(ckpt, region)
                left = overhead + zones.move.seconds(ckpt, region)
                where = region
            lost = min(left, dt)
            if done + dt - lost >= total - 1e-9:
                best = min(best, paid + price * (lost + total - done))
                continue
            walk(i + 1, choice, left - lost, done + dt - lost, paid + price * dt, where)

    walk(0, None, 0.0, 0.0, 0.0, None)
    return best


def zone_prices(names: Sequence[str], spot_per_h: float, standard_per_h: float,
                move: MovePrices | None = None) -> Zones:
    """Zones at one Spot and one standard price each."""
    return Zones(tuple(names), tuple(spot_per_h for _ in names),
                 tuple(standard_per_h for _ in names), move or MovePrices())
