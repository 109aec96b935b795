"""The cost ledger of a run: what each attempt cost, what the run saved against standard VMs, and
what preemptions cost in redone work. Pure functions over a Run, its Pipeline and a price table.

Billing follows Vertex AI's rule: an attempt is billed from its job's start to its end, never while
queued or preempted (FACTS.md). Prices come from PRICES (each entry names its source and date)
unless the pipeline overrides them with `prices` (capacity -> price per replica-hour).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from spotorch.core.pipeline import Capacity, Pipeline, WorkerPool
from spotorch.core.shapes import run_pipeline

if TYPE_CHECKING:  # only annotations: spotorch.domain may import this module (terminal events)
    from spotorch.core.model import Attempt, Run

ANY_REGION = "*"


@dataclass(frozen=True)
class Price:
    """Hourly prices of one resource by capacity, and where they come from."""

    per_hour: Mapping[Capacity, float]
    source: str
    as_of: str  # ISO 8601 date the figure was read


@dataclass(frozen=True)
class PriceTable:
    """Machine-type and accelerator prices by region (ANY_REGION: the fallback for any region)."""

    machines: Mapping[str, Mapping[str, Price]]
    accelerators: Mapping[str, Mapping[str, Price]]
    default_machine: str = "n1-standard-4"
    currency: str = "USD"


_CE_GPU = "Compute Engine GPU pricing (on-demand and Spot list prices), FACTS.md 'Prices'"
_CE_VM = ("Compute Engine VM instance pricing, n1-standard-4 in us-central1 (on-demand; Spot "
          "changes at most once a day)")

# Compute Engine list prices: Vertex AI custom training bills its own rates, a little higher; a
# pipeline with a negotiated or current Vertex rate sets `prices` and those win (see docs).
# FLEX_START (Dynamic Workload Scheduler) is billed about half the on-demand rate.
PRICES = PriceTable(
    machines={
        "n1-standard-4": {ANY_REGION: Price(
            {Capacity.STANDARD: 0.19, Capacity.SPOT: 0.04, Capacity.FLEX_START: 0.095},
            _CE_VM, "2026-11-30")},
        # N1 list prices scale with the size (vCPUs and memory in the same ratio): n1-standard-4's
        # per 4 vCPUs. Derived, not read from the price page (issue 19 compares CPU sizes).
        **{f"n1-standard-{n}": {ANY_REGION: Price(
            {Capacity.STANDARD: 0.19 * n / 4, Capacity.SPOT: 0.04 * n / 4,
             Capacity.FLEX_START: 0.095 * n / 4},
            _CE_VM + f", scaled to {n} vCPUs", "2026-11-30")} for n in (8, 16, 32, 64, 96)},
    },
    accelerators={
        "NVIDIA_TESLA_A100": {ANY_REGION: Price(
            {Capacity.STANDARD: 2.934, Capacity.SPOT: 1.147, Capacity.FLEX_START: 1.467},
            _CE_GPU + ", us-central1", "2026-11-30")},
        "NVIDIA_L4": {ANY_REGION: Price(
            {Capacity.STANDARD: 0.56, Capacity.SPOT: 0.223, Capacity.FLEX_START: 0.28},
            _CE_GPU + ", us-central1", "2026-11-30")},
        "NVIDIA_TESLA_T4": {ANY_REGION: Price(
            {Capacity.STANDARD: 0.35, Capacity.SPOT: 0.14, Capacity.FLEX_START: 0.175},
            _CE_GPU + ", europe-west1", "2026-11-30")},
        # per TPU v5e chip-hour: from memory of Cloud TPU list prices, NOT verified here; Vertex
        # AI's TPU training prices differ. Override with the pipeline's `prices`.
        "TPU_V5_LITEPOD": {ANY_REGION: Price(
            {Capacity.STANDARD: 1.20, Capacity.SPOT: 0.48, Capacity.FLEX_START: 0.60},
            "Cloud TPU v5e pricing as remembered (unverified)", "2026-12-01")},
    },
)


@dataclass(frozen=True)
class HourlyRate:
    """What one hour of a job costs on one capacity in one region, and how that was found."""

    per_hour: float
    basis: tuple[str, ...]  # sources used, and any fallback taken


def _lookup(table: Mapping[str, Mapping[str, Price]], key: str, region: str) -> Price | None:
    by_region = table.get(key)
    if not by_region:
        return None
    return by_region.get(region) or by_region.get(ANY_REGION)


def _pool_rate(pool: WorkerPool, capacity: Capacity, region: str, table: PriceTable,
               notes: list[str]) -> float:
    machine = _lookup(table.machines, pool.machine_type, region)
    if machine is None:
        machine = _lookup(table.machines, table.default_machine, region)
        notes.append(f"no price for machine {pool.machine_type}: priced as {table.default_machine}")
    per_replica = machine.per_hour[capacity] if machine else 0.0
    if machine:
        notes.append(f"{pool.machine_type}: {machine.source} ({machine.as_of})")
    if pool.accelerator_type and pool.accelerator_count:
        accelerator = _lookup(table.accelerators, pool.accelerator_type, region)
        if accelerator is None:
            notes.append(f"no price for accelerator {pool.accelerator_type}: not counted")
        else:
            per_replica += accelerator.per_hour[capacity] * pool.accelerator_count
            notes.append(f"{pool.accelerator_type}: {accelerator.source} ({accelerator.as_of})")
    return per_replica * pool.replica_count


def hourly_rate(pipeline: Pipeline | None, capacity: Capacity, region: str,
                table: PriceTable = PRICES) -> HourlyRate:
    """One hour of the pipeline's job on this capacity in this region (the pipeline's prices win)."""
    if pipeline is None:
        pools: Sequence[WorkerPool] = (WorkerPool(),)
        notes = ["pipeline unknown: priced as one default replica"]
    else:
        pools, notes = pipeline.job.worker_pools, []
        override = dict(pipeline.prices).get(str(capacity))
        if override is not None:
            replicas = sum(p.replica_count for p in pools)
            return HourlyRate(override * replicas, (f"pipeline {pipeline.name} prices",))
    total = sum(_pool_rate(p, capacity, region, table, notes) for p in pools)
    return HourlyRate(total, tuple(dict.fromkeys(notes)))


@dataclass(frozen=True)
class AttemptCost:
    """One attempt's line in the ledger."""

    attempt: int
    capacity: Capacity
    region: str
    billed_s: float  # from its job's start to its end (or now, while it runs)
    per_hour: float
    cost: float
    lost_steps: int  # steps it ran that the next attempt had to redo
    lost_s: float  # compute time spent on those steps
    lost_cost: float


@dataclass(frozen=True)
class Ledger:
    """What a run cost, what it saved against standard VMs, and what preemptions cost."""

    currency: str
    attempts: tuple[AttemptCost, ...]
    total: float
    standard_equivalent: float  # kept compute time x standard price + one start-up
    savings: float
    savings_pct: float | None  # of the standard equivalent; None when that is zero
    useful_s: float
    lost_steps: int
    lost_cost: float
    preemptions: int
    basis: tuple[str, ...] = field(default_factory=tuple)
    probes: int = 0  # Spot capacity probes launched (never attempts)
    probe_cost: float = 0.0  # their billed time at the Spot price; part of total

    def sentence(self) -> str:
        """The ledger in one line, as alerts and summaries say it."""
        if self.total == 0 and self.standard_equivalent == 0:
            return "nothing billed yet"
        pct = f" ({self.savings_pct:.0f}%)" if self.savings_pct is not None else ""
        verb = "saved" if self.savings >= 0 else "cost"
        line = (f"{money(self.total)} spent; {verb} {money(abs(self.savings))}{pct} "
                "against standard VMs")
        if self.preemptions:
            plural = "s" if self.preemptions != 1 else ""
            line += (f"; {self.preemptions} preemption{plural} cost {money(self.lost_cost)} of "
                     f"redone work ({self.lost_steps} steps)")
        if self.probes:
            plural = "s" if self.probes != 1 else ""
            line += f"; {self.probes} Spot probe{plural} cost {money(self.probe_cost)}"
        return line


def money(amount: float | None) -> str:
    """Dollars as people read them: whole dollars from $100, four decimals below a cent."""
    if amount is None:
        return "-"
    sign, value = ("-" if amount < 0 else ""), abs(amount)
    if 0 < value < 0.01:
        return f"{sign}${value:.4f}"  # a small run's fractions of a cent still say something
    return f"{sign}${value:,.2f}" if value < 100 else f"{sign}${value:,.0f}"


def billed_seconds(attempt: Attempt, now: float) -> float:
    """Billed time of an attempt: its job's running time; nothing before it started."""
    if attempt.started_at is None:
        return 0.0
    end = attempt.ended_at if attempt.ended_at is not None else now
    seconds = end - attempt.started_at
    return seconds if math.isfinite(seconds) and seconds > 0 else 0.0


def _lost_work(attempt: Attempt, successor: Attempt | None) -> tuple[int, float]:
    """Steps an attempt ran that its successor redid, and that share of its billed time."""
    if successor is None:
        return 0, 0.0
    start = attempt.resumed_from_step or 0
    reached = attempt.progress_step if attempt.progress_step is not None else start
    ran = max(reached - start, 0)
    kept_until = successor.resumed_from_step or 0
    lost = max(reached - max(kept_until, start), 0)
    if ran == 0:
        return 0, 1.0  # it ran without reporting a step: nothing of it was kept
    return lost, lost / ran


def ledger(run: Run, pipeline: Pipeline | None, now: float, table: PriceTable = PRICES) -> Ledger:
    """The cost ledger of a run at time `now` (a live attempt is billed up to now).

    Each attempt's billed time is its start-up (the pipeline's restart overhead, at most the
    whole attempt) and its compute; the compute spent on steps the next attempt redid is lost.
    The standard equivalent is the kept compute plus one start-up, at standard prices: what the
    same useful work would have cost on standard VMs without interruptions.
    """
    overhead_s = pipeline.recovery.restart_overhead_s if pipeline is not None else 0.0
    if pipeline is not None:  # issue 19: priced on the shape the run's hardware choice names
        pipeline = run_pipeline(pipeline, run.hardware)
    lines: list[AttemptCost] = []
    basis: list[str] = []
    useful_s = 0.0
    standard_useful = 0.0
    startup: tuple[float, float] | None = None  # (seconds, standard price) of one start-up
    for i, attempt in enumerate(run.attempts):
        successor = run.attempts[i + 1] if i + 1 < len(run.attempts) else None
        rate = hourly_rate(pipeline, attempt.capacity, attempt.region, table)
        standard = hourly_rate(pipeline, Capacity.STANDARD, attempt.region, table)
        basis += [*rate.basis, *standard.basis]
        billed = billed_seconds(attempt, now)
        compute = max(billed - overhead_s, 0.0)
        lost_steps, lost_fraction = _lost_work(attempt, successor)
        lost_s = compute * lost_fraction
        cost = billed / 3600 * rate.per_hour
        lines.append(AttemptCost(attempt.number, attempt.capacity, attempt.region, billed,
                                 rate.per_hour, cost, lost_steps, lost_s,
                                 lost_s / 3600 * rate.per_hour))
        useful_s += compute - lost_s
        standard_useful += (compute - lost_s) / 3600 * standard.per_hour
        if billed > 0:
            startup = (max(startup[0] if startup else 0.0, min(overhead_s, billed)),
                       standard.per_hour)
    # Spot probes: billed from their job's start (capacity found) to its end, like any job.
    probe_cost = 0.0
    for probe in run.probes:
        if probe.started_at is None:
            continue
        end = probe.ended_at if probe.ended_at is not None else now
        billed = end - probe.started_at
        if math.isfinite(billed) and billed > 0:
            probe_cost += billed / 3600 * hourly_rate(pipeline, Capacity.SPOT, probe.region,
                                                      table).per_hour
    total = sum(line.cost for line in lines) + probe_cost
    standard_equivalent = standard_useful + (startup[0] / 3600 * startup[1] if startup else 0.0)
    savings = standard_equivalent - total
    return Ledger(
        currency=table.currency, attempts=tuple(lines), total=total,
        standard_equivalent=standard_equivalent, savings=savings,
        savings_pct=savings / standard_equivalent * 100 if standard_equivalent > 0 else None,
        useful_s=useful_s, lost_steps=sum(line.lost_steps for line in lines),
        lost_cost=sum(line.lost_cost for line in lines), preemptions=run.counters.preemptions,
        basis=tuple(dict.fromkeys(basis)), probes=run.counters.probes, probe_cost=probe_cost)


def ledger_dict(book: Ledger) -> dict[str, object]:
    """The ledger as JSON (API, CLI --json, terminal events, the demo's summary)."""
    return {
        "currency": book.currency, "total": round(book.total, 4),
        "standard_equivalent": round(book.standard_equivalent, 4),
        "savings": round(book.savings, 4),
        "savings_pct": None if book.savings_pct is None else round(book.savings_pct, 1),
        "useful_s": round(book.useful_s, 1), "lost_steps": book.lost_steps,
        "lost_cost": round(book.lost_cost, 4), "preemptions": book.preemptions,
        "probes": book.probes, "probe_cost": round(book.probe_cost, 4),
        "summary": book.sentence(), "basis": list(book.basis),
        "attempts": [{"attempt": a.attempt, "capacity": str(a.capacity), "region": a.region,
                      "billed_s": round(a.billed_s, 1), "per_hour": round(a.per_hour, 4),
                      "cost": round(a.cost, 4), "lost_steps": a.lost_steps,
                      "lost_cost": round(a.lost_cost, 4)} for a in book.attempts],
    }
