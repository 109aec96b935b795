"""Traces, the replayed scenario and its windows: the inputs every replay shares."""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from enum import StrEnum
from pathlib import Path

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]


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
        """How many hours the trace covers."""
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


class View(StrEnum):
    """What a replayed policy may know of Spot capacity."""

    VISIBLE = "visible"  # availability known at every tick, also on standard (the papers')
    PRODUCTION = "production"  # what production observes: its own attempts and its probes


@dataclass(frozen=True)
class Probes:
    """Spot probes in the production view (a minimal Spot job, cancelled once it runs)."""

    # Vertex AI bills a Spot job from provisioning to its end and nothing while it is queued;
    # how long a probe that found capacity is billed is not documented for so short a job:
    # keep it configurable and pessimistic (provisioning, a RUNNING report, the cancel).
    billed_s: float = 300.0  # billed time of a probe that found capacity, at the Spot price
    latency_s: float = 300.0  # from capacity found to the run knowing (RUNNING seen, a tick)
    wait_s: float = 600.0  # a probe without capacity this long is cancelled (and costs nothing)

    def problems(self) -> list[str]:
        """What is wrong with these probe settings (empty: nothing)."""
        return [f"probe {name} must be >= 0, got {getattr(self, name)}"
                for name in ("billed_s", "latency_s") if getattr(self, name) < 0] + (
            [f"probe wait_s must be > 0, got {self.wait_s}"] if self.wait_s <= 0 else [])


class RegionChoice(StrEnum):
    """Where a multi-zone window's Spot attempts go."""

    FIXED = "fixed"  # the pipeline's order: stay in a region until a stockout, then the next
    HISTORY = "history"  # ranked by the shared record of every region (policy.rank_regions)


class FlexWait(StrEnum):
    """Distribution of a FLEX_START attempt's queue wait."""

    FIXED = "fixed"  # always the mean
    EXPONENTIAL = "exponential"  # memoryless, with the given mean
    UNIFORM = "uniform"  # uniform on [0, 2 x mean]


@dataclass(frozen=True)
class Flex:
    """FLEX_START (Dynamic Workload Scheduler): waits for capacity, then runs unpreempted."""

    # Its price and queue waits are not in FACTS.md: both configurable. A wait longer than
    # max_wait_s ends the attempt unstarted (Vertex's max_wait_duration), unbilled.
    price_ratio: float = 0.6  # per node-hour, as a fraction of the on-demand price
    max_wait_s: float = 4 * 3600.0
    mean_wait_s: float = 1800.0
    wait: FlexWait = FlexWait.EXPONENTIAL
    seed: int = 0  # waits are drawn per window from (seed, window start), reproducibly

    def problems(self) -> list[str]:
        """What is wrong with these Flex-start settings (empty: nothing)."""
        out = []
        if self.price_ratio <= 0.0:
            out.append(f"flex price_ratio must be > 0, got {self.price_ratio}")
        if self.max_wait_s <= 0 or self.mean_wait_s < 0:
            out.append("flex max_wait_s must be > 0 and mean_wait_s >= 0")
        return out


@dataclass(frozen=True)
class Scenario:
    """The task being replayed, how it is priced, and what the policies may see."""

    task_s: float
    deadline_s: float
    overhead_s: float
    step_s: float = 300.0
    checkpoint_s: float | None = None
    nodes: int = 1
    price_ratio: float = 3.0  # on-demand / Spot, when the trace has no prices or as multiplier
    od_price: float | None = None  # per node-hour; default: price_ratio x mean Spot price
    # Spot per node-hour in a price table's money (simulate --pipeline): a trace without prices
    # is priced at it, one with prices scaled so its mean is it. None: Spot = 1, or the trace's.
    spot_price: float | None = None
    count_after: int = 3  # preemptions before the count policy escalates
    # The preemption budget (RecoveryPolicy.max_preemptions): with none left, the production
    # dispatch (policy.choose_capacity) keeps count and deadline off Spot. None: no budget.
    max_preemptions: int | None = 50
    view: View = View.VISIBLE
    # Production view: the domain's Spot cooldown (RecoveryPolicy.spot_cooldown_s), and probes
    # (None: none; then standard assumes Spot back once the cooldown has passed, as the core does).
    spot_cooldown_s: float = 7200.0
    probes: Probes | None = None
    # Production view: the minimum dwell between moves (policy.may_switch), as decide.py; off
    # only to measure what it costs (docs/policy-benchmark.md).
    min_dwell: bool = True
    flex: Flex | None = None  # FLEX_START offered to the policies; None: not allowed
    # Multi-zone windows only: how Spot regions are chosen, the record's TTL, and how long a
    # Spot attempt waits for capacity before it counts as a stockout (RecoveryPolicy's).
    regions: RegionChoice = RegionChoice.FIXED
    region_ttl_s: float = 24 * 3600.0
    stockout_wait_s: float = 900.0

    def __post_init__(self) -> None:
        problems = [] if self.probes is None else self.probes.problems()
        problems += [] if self.flex is None else self.flex.problems()
        if self.spot_cooldown_s < 0:
            problems.append(f"spot_cooldown_s must be >= 0, got {self.spot_cooldown_s}")
        if problems:
            raise ScenarioError("; ".join(problems))
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
        """How many ticks fit before the deadline."""
        return int(self.deadline_s // self.step_s)


@dataclass(frozen=True)
class Window:
    """One replay: a slice of a trace resampled onto the scenario's step grid."""

    trace: str
    family: str
    start_s: float
    avail: BoolArray  # per step (multi-zone: the first zone's)
    spot_price: FloatArray  # per node-hour, per step
    od_price: float  # per node-hour
    # Multi-zone windows (zone_windows): availability per zone x step, and the steps before the
    # window (at most the region record's TTL) that the shared record has already seen.
    zones: BoolArray | None = None
    zone_past: BoolArray | None = None


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
    if scenario.spot_price is not None:
        price = price * (scenario.spot_price / (float(np.mean(trace.prices))
                                                if trace.prices is not None else 1.0))
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


@dataclass(frozen=True)
class Outcome:
    """How one policy did on one window."""

    cost: float
    finished_s: float | None  # None: missed the deadline
    preemptions: int
    changeovers: int
    probes: int = 0  # Spot probes launched (production view)
    probe_cost: float = 0.0  # what they cost, included in cost

    @property
    def met_deadline(self) -> bool:
        """Whether the policy finished before the deadline."""
        return self.finished_s is not None


def zone_windows(traces: Sequence[Trace], scenario: Scenario, stride_s: float) -> list[Window]:
    """Multi-zone windows: the same slice of several zones' traces (one family, one shape)."""
    if len({t.gap_s for t in traces}) != 1:
        raise TraceError("zone traces must share gap_seconds: " + ", ".join(t.name for t in traces))
    step = int(scenario.step_s)
    resampled = [resample(t, step, scenario.nodes) for t in traces]
    length = min(len(a) for a, _ in resampled)
    zones = np.stack([a[:length] for a, _ in resampled])
    # Prices: the first zone's (the public multi-zone family has none: 1.0 everywhere).
    first = windows_of(traces[0], scenario, stride_s)
    past = int(scenario.region_ttl_s // step)
    n = scenario.steps
    out = []
    for win in first:
        s = int(win.start_s // step)
        if s + n > length:
            break
        out.append(replace(win, trace=win.family, avail=zones[0, s:s + n],
                           zones=zones[:, s:s + n], zone_past=zones[:, max(s - past, 0):s]))
    return out
