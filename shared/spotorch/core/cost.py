"""The cost ledger of a run: what each attempt cost, what the run saved against standard VMs, and
what preemptions cost in redone work. Pure functions over a Run, its Pipeline and a price table.

Billing follows Vertex AI's rule: an attempt is billed from its job's start to its end, never while
queued or preempted (FACTS.md). Prices come from a price table (spotorch.core.prices; the list
prices shipped in spotorch.core.price_list unless SPOTORCH_PRICES names another), each entry
with its source and date, unless the pipeline overrides them with `prices` (capacity -> price per
replica-hour). This is the one cost: budgets, events, alerts, sweeps, Experiments and every view
state what this ledger says.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from spotorch.core.model import Attempt, Run, RunStatus
from spotorch.core.pipeline import Capacity, Pipeline, WorkerPool, pool_role
from spotorch.core.price_list import LIST_PRICES
from spotorch.core.prices import (
    ANY_REGION,
    DATAFLOW_MEMORY_GB,
    DATAFLOW_PD_GB,
    DATAFLOW_VCPU,
    DATAPROC_DCU,
    DATAPROC_SHUFFLE_GB,
    PriceTable,
    Rate,
    UnitRates,
    region_entry,
    shape_of,
)
from spotorch.core.regions import egress_per_gb, region_of
from spotorch.core.shapes import run_pipeline


@dataclass(frozen=True)
class HourlyRate:
    """What one hour of a job costs on one capacity in one region, and how that was found.

    per_hour is None when the table has no price for a machine or accelerator of the job
    (`unknown` names them): an unknown price, never another machine's."""

    per_hour: float | None
    basis: tuple[str, ...]  # sources used, and any region the table stood in with
    unknown: tuple[str, ...] = ()
    pools: tuple[PoolRate, ...] = ()  # the same hour per worker pool (their sum is per_hour)


@dataclass(frozen=True)
class PoolRate:
    """One worker pool's share of an hour: its role, its replicas, their price together."""

    pool: int  # index in the pipeline's job.worker_pools
    role: str
    replicas: int
    per_hour: float | None  # every replica of the pool; None: price unknown


def _where(key: str, found_in: str | None, region: str) -> str:
    """A note when a price is another region's (the table has none for this one)."""
    if found_in in (None, region, ANY_REGION):
        return ""
    return f" ({found_in}'s price: none listed for {region})"


def _host_rate(machine_type: str, capacity: Capacity, region: str, table: PriceTable,
               notes: list[str]) -> float | None:
    whole, found_in = region_entry(table.machines, machine_type, region)
    if isinstance(whole, Rate):
        notes.append(f"{machine_type}: {whole.source} ({whole.as_of})"
                     + _where(machine_type, found_in, region))
        return whole.on(capacity)
    shape = shape_of(machine_type)
    if shape is None:
        return None
    units, found_in = region_entry(table.families, shape.family, region)
    if not isinstance(units, UnitRates):
        return None
    notes.append(f"{machine_type} ({shape.vcpus} vCPUs, {shape.gib:g} GiB at {shape.family} rates): "
                 f"{units.vcpu.source} ({units.vcpu.as_of})" + _where(shape.family, found_in, region))
    return shape.vcpus * units.vcpu.on(capacity) + shape.gib * units.gib.on(capacity)


def _pool_rate(pool: WorkerPool, capacity: Capacity, region: str, table: PriceTable,
               notes: list[str], unknown: list[str]) -> float | None:
    host = _host_rate(pool.machine_type, capacity, region, table, notes)
    if host is None:
        unknown.append(f"machine {pool.machine_type}")
    accelerators = 0.0
    if pool.accelerator_type and pool.accelerator_count:
        rate, found_in = region_entry(table.accelerators, pool.accelerator_type, region)
        if isinstance(rate, Rate):
            accelerators = rate.on(capacity) * pool.accelerator_count
            notes.append(f"{pool.accelerator_type}: {rate.source} ({rate.as_of})"
                         + _where(pool.accelerator_type, found_in, region))
        else:
            unknown.append(f"accelerator {pool.accelerator_type}")
            return None
    return None if host is None else (host + accelerators) * pool.replica_count


def machine_hourly(machine_type: str, region: str, table: PriceTable = LIST_PRICES
                   ) -> tuple[float | None, tuple[str, ...]]:
    """One hour of a machine on standard capacity (an endpoint's node, issue 37) and where the
    price comes from; None when the table does not know it. Compute Engine's list price: Vertex
    AI bills prediction nodes at its own, higher rates (a pipeline's own table can say so)."""
    notes: list[str] = []
    return _host_rate(machine_type, Capacity.STANDARD, region, table, notes), tuple(notes)


def hourly_rate(pipeline: Pipeline | None, capacity: Capacity, region: str,
                table: PriceTable = LIST_PRICES) -> HourlyRate:
    """One hour of the pipeline's job on this capacity in this region (the pipeline's prices win)."""
    if pipeline is None:
        pools: Sequence[WorkerPool] = (WorkerPool(),)
        notes = ["pipeline unknown: priced as one default replica"]
    else:
        pools, notes = pipeline.job.worker_pools, []
        override = dict(pipeline.prices).get(str(capacity))
        if override is not None:
            replicas = sum(p.replica_count for p in pools)
            return HourlyRate(override * replicas, (f"pipeline {pipeline.name} prices",),
                              pools=_pool_rates(tuple(pools), [override * p.replica_count
                                                               for p in pools]))
    unknown: list[str] = []
    rates = [_pool_rate(p, capacity, region, table, notes, unknown) for p in pools]
    total = None if any(r is None for r in rates) else sum(r for r in rates if r is not None)
    return HourlyRate(total, tuple(dict.fromkeys(notes)), tuple(dict.fromkeys(unknown)),
                      _pool_rates(tuple(pools), rates))


def _pool_rates(pools: tuple[WorkerPool, ...], rates: Sequence[float | None]
                ) -> tuple[PoolRate, ...]:
    return tuple(PoolRate(i, str(pool_role(pools, i)), p.replica_count, rate)
                 for i, (p, rate) in enumerate(zip(pools, rates, strict=True)))


@dataclass(frozen=True)
class StepCost:
    """What a preprocess step cost at the table's Dataflow prices, and how that was found."""

    cost: float  # every resource priced; `unknown` names any the table does not price
    basis: tuple[str, ...] = ()
    unknown: tuple[str, ...] = ()


# A step record's billed resources (GetJobMetrics' totals, in unit-seconds) by the table's key.
# A Spark step's batch (issue 42): UsageMetrics.milli_dcu_seconds (per 1000) and
# shuffle_storage_gb_seconds. (key, record field, unit-seconds per recorded unit, service)
_STEP_USAGE = ((DATAFLOW_VCPU, "vcpu_s", 1.0, "Dataflow"),
               (DATAFLOW_MEMORY_GB, "memory_gb_s", 1.0, "Dataflow"),
               (DATAFLOW_PD_GB, "pd_gb_s", 1.0, "Dataflow"),
               (DATAPROC_DCU, "milli_dcu_s", 0.001, "Dataproc"),
               (DATAPROC_SHUFFLE_GB, "shuffle_gb_s", 1.0, "Dataproc"))


def step_cost(step: Mapping[str, Any] | None, table: PriceTable = LIST_PRICES) -> StepCost:
    """What a run's preprocess step cost: its record's billed resources at the table's Dataflow
    prices for the step's region; a cache hit cost nothing (its job was another run's)."""
    if not step or step.get("cache_hit"):
        return StepCost(0.0)
    region = str(step.get("region") or "")
    cost, notes, unknown = 0.0, [], []
    spark = step.get("kind") == "spark"
    for key, field_name, scale, service in _STEP_USAGE:
        if (service == "Dataproc") != spark:
            continue
        used_s = float(step.get(field_name) or 0.0) * scale
        rate, found_in = region_entry(table.dataflow, key, region)
        if not isinstance(rate, Rate):
            if used_s:
                unknown.append(f"{service} {key}")
            continue
        cost += used_s / 3600 * rate.standard
        notes.append(f"{service}: {rate.source} ({rate.as_of})" + _where(key, found_in, region))
    return StepCost(cost, tuple(dict.fromkeys(notes)), tuple(unknown))


def preprocess_cost(step: Mapping[str, Any] | None, table: PriceTable = LIST_PRICES) -> float:
    """step_cost's figure alone (events and views that show the step's cost)."""
    return step_cost(step, table).cost


@dataclass(frozen=True)
class AttemptCost:
    """One attempt's line in the ledger."""

    attempt: int
    capacity: Capacity
    region: str
    billed_s: float  # from its job's start to its end (or now, while it runs)
    per_hour: float | None  # None: the table has no price for its machine or accelerator
    cost: float  # 0 when its price is unknown (the ledger's `unpriced` says so)
    lost_steps: int  # steps it ran that the next attempt had to redo
    lost_s: float  # compute time spent on those steps
    lost_cost: float
    pools: tuple[PoolCost, ...] = ()  # the attempt's cost per worker pool


@dataclass(frozen=True)
class PoolCost:
    """What one worker pool of an attempt (or of the run) cost: all its replicas' billed time."""

    pool: int
    role: str
    replicas: int
    cost: float  # 0 when its price is unknown
    per_replica: float  # cost / replicas


class RunResult(StrEnum):
    """What the run has produced so far, as the ledger judges its cost."""

    RESULT = "result"  # succeeded: the work is done, and savings are real
    RUNNING = "running"  # still going: spent so far against the same work on standard VMs
    NO_RESULT = "no_result"  # failed or cancelled: money spent, nothing produced


def result_of(run: Run) -> RunResult:
    """Whether a run produced its result, is still going, or ended without one."""
    if run.status in (RunStatus.SUCCEEDED, RunStatus.REGISTERING):
        return RunResult.RESULT
    return RunResult.NO_RESULT if run.status.terminal else RunResult.RUNNING


@dataclass(frozen=True)
class Ledger:
    """What a run cost, what the same work would have cost on standard VMs, what it saved (only
    once it produced its result), and what preemptions cost."""

    currency: str
    attempts: tuple[AttemptCost, ...]
    total: float  # every known price; `unpriced` names what could not be priced
    standard_equivalent: float  # kept compute time x standard price + one start-up
    savings: float | None  # standard_equivalent - total, for a run that produced its result
    savings_pct: float | None  # of the standard equivalent; None without savings
    useful_s: float
    lost_steps: int
    lost_cost: float
    preemptions: int
    basis: tuple[str, ...] = field(default_factory=tuple)
    probes: int = 0  # Spot capacity probes launched (never attempts)
    probe_cost: float = 0.0  # their billed time at the Spot price; part of total
    result: RunResult = RunResult.RUNNING
    unpriced: tuple[str, ...] = ()  # machines and accelerators the price table does not know
    preprocess_cost: float = 0.0  # the preprocess step's Dataflow job; part of total
    egress_cost: float = 0.0  # checkpoints copied between regions (issue 43); part of total
    moves: int = 0  # attempts that started in another region than the checkpoint's

    def sentence(self) -> str:
        """The ledger in one line, as alerts and summaries say it."""
        if self.total == 0 and self.standard_equivalent == 0 and not self.unpriced:
            return "nothing billed yet"
        spent = f"{money(self.total)} spent" + (" so far" if self.result is RunResult.RUNNING
                                                else "")
        if self.savings is not None:
            pct = f" ({abs(self.savings_pct):.0f}%)" if self.savings_pct is not None else ""
            line = (f"{spent}; saved {money(self.savings)}{pct} against standard VMs"
                    if self.savings >= 0 else
                    f"{spent}; {money(-self.savings)}{pct} more than standard VMs")
        else:
            line = (f"{spent}; standard VMs would have cost {money(self.standard_equivalent)} "
                    "for the same work")
            if self.result is RunResult.NO_RESULT:
                line += " (no result)"
        if self.preemptions:
            plural = "s" if self.preemptions != 1 else ""
            redone = (f"cost {money(self.lost_cost)} of redone work ({self.lost_steps} steps)"
                      if self.lost_steps else "redid no work")
            line += f"; {self.preemptions} preemption{plural} {redone}"
        if self.probes:
            plural = "s" if self.probes != 1 else ""
            line += f"; {self.probes} Spot probe{plural} cost {money(self.probe_cost)}"
        if self.preprocess_cost:
            line += f"; the preprocess step cost {money(self.preprocess_cost)}"
        if self.moves:
            plural = "s" if self.moves != 1 else ""
            line += f"; {self.moves} move{plural} between regions cost " \
                    f"{money(self.egress_cost)} of egress"
        if self.unpriced:
            line += f"; price unknown for {', '.join(self.unpriced)} (not counted)"
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


def ledger(run: Run, pipeline: Pipeline | None, now: float,
           table: PriceTable = LIST_PRICES) -> Ledger:
    """The cost ledger of a run at time `now` (a live attempt is billed up to now).

    Each attempt's billed time is its start-up (the pipeline's restart overhead, at most the
    whole attempt) and its compute; the compute spent on steps the next attempt redid is lost.
    The standard equivalent is the kept compute plus one start-up, at standard prices: what the
    same useful work would have cost on standard VMs without interruptions. Savings are stated
    only for a run that produced its result.
    """
    overhead_s = pipeline.recovery.restart_overhead_s if pipeline is not None else 0.0
    if pipeline is not None:  # issue 19: priced on the shape the run's hardware choice names
        pipeline = run_pipeline(pipeline, run.hardware)
    lines: list[AttemptCost] = []
    basis: list[str] = []
    unpriced: list[str] = []
    useful_s = 0.0
    standard_useful = 0.0
    startup: tuple[float, float] | None = None  # (seconds, standard price) of one start-up
    for i, attempt in enumerate(run.attempts):
        successor = run.attempts[i + 1] if i + 1 < len(run.attempts) else None
        rate = hourly_rate(pipeline, attempt.capacity, attempt.region, table)
        standard = hourly_rate(pipeline, Capacity.STANDARD, attempt.region, table)
        basis += [*rate.basis, *standard.basis]
        billed = billed_seconds(attempt, now)
        if billed > 0:
            unpriced += [*rate.unknown, *standard.unknown]
        per_hour, standard_per_hour = rate.per_hour or 0.0, standard.per_hour or 0.0
        compute = max(billed - overhead_s, 0.0)
        lost_steps, lost_fraction = _lost_work(attempt, successor)
        lost_s = compute * lost_fraction
        lines.append(AttemptCost(attempt.number, attempt.capacity, attempt.region, billed,
                                 rate.per_hour, billed / 3600 * per_hour, lost_steps, lost_s,
                                 lost_s / 3600 * per_hour, _pool_costs(rate.pools, billed)))
        useful_s += compute - lost_s
        standard_useful += (compute - lost_s) / 3600 * standard_per_hour
        if billed > 0:
            startup = (max(startup[0] if startup else 0.0, min(overhead_s, billed)),
                       standard_per_hour)
    # Spot probes: billed from their job's start (capacity found) to its end, like any job.
    probe_cost = 0.0
    for probe in run.probes:
        if probe.started_at is None:
            continue
        end = probe.ended_at if probe.ended_at is not None else now
        billed = end - probe.started_at
        if math.isfinite(billed) and billed > 0:
            rate = hourly_rate(pipeline, Capacity.SPOT, probe.region, table)
            unpriced += rate.unknown
            probe_cost += billed / 3600 * (rate.per_hour or 0.0)
    egress, moves = egress_of(run, pipeline)
    step = step_cost(run.preprocess, table)
    basis += step.basis
    unpriced += step.unknown
    total = sum(line.cost for line in lines) + probe_cost + step.cost + egress
    # The preprocess step runs on Dataflow either way: the same cost on both sides.
    standard_equivalent = standard_useful + (startup[0] / 3600 * startup[1] if startup else 0.0) \
        + step.cost
    result = result_of(run)
    savings = standard_equivalent - total if result is RunResult.RESULT and not unpriced else None
    return Ledger(
        currency=table.currency, attempts=tuple(lines), total=total,
        standard_equivalent=standard_equivalent, savings=savings,
        savings_pct=savings / standard_equivalent * 100
        if savings is not None and standard_equivalent > 0 else None,
        useful_s=useful_s, lost_steps=sum(line.lost_steps for line in lines),
        lost_cost=sum(line.lost_cost for line in lines), preemptions=run.counters.preemptions,
        basis=tuple(dict.fromkeys(basis)), probes=run.counters.probes, probe_cost=probe_cost,
        result=result, unpriced=tuple(dict.fromkeys(unpriced)), preprocess_cost=step.cost,
        egress_cost=egress, moves=moves)


def egress_of(run: Run, pipeline: Pipeline | None) -> tuple[float, int]:
    """Egress dollars of the run's moves between regions, and how many: each attempt that started
    in another region than the last started one copied the checkpoint (recovery.checkpoint_gb) at
    the inter-region rate (core.regions.egress_per_gb, as the simulator's MovePrices)."""
    size = pipeline.recovery.checkpoint_gb if pipeline is not None else 0.0
    where: str | None = None
    dollars, moves = 0.0, 0
    for attempt in run.attempts:
        if attempt.started_at is None:
            continue
        region = region_of(attempt.region)
        if where is not None and region != where:
            moves += 1
            dollars += size * egress_per_gb(where, region)
        where = region
    return dollars, moves


def _pool_costs(rates: tuple[PoolRate, ...], billed_s: float) -> tuple[PoolCost, ...]:
    """Each pool's cost for billed_s seconds (every replica runs the job's whole time)."""
    costs = [billed_s / 3600 * (r.per_hour or 0.0) for r in rates]
    return tuple(PoolCost(r.pool, r.role, r.replicas, cost, cost / r.replicas if r.replicas else 0.0)
                 for r, cost in zip(rates, costs, strict=True))


def pool_totals(book: Ledger) -> tuple[PoolCost, ...]:
    """The run's cost per worker pool, over its attempts (probes not included)."""
    by_pool: dict[int, PoolCost] = {}
    for line in book.attempts:
        for c in line.pools:
            was = by_pool.get(c.pool)
            cost = c.cost + (was.cost if was else 0.0)
            by_pool[c.pool] = PoolCost(c.pool, c.role, c.replicas, cost,
                                       cost / c.replicas if c.replicas else 0.0)
    return tuple(by_pool[k] for k in sorted(by_pool))


def _pool_dict(c: PoolCost) -> dict[str, object]:
    return {"pool": c.pool, "role": c.role, "replicas": c.replicas, "cost": round(c.cost, 4),
            "per_replica": round(c.per_replica, 4)}


def ledger_dict(book: Ledger) -> dict[str, object]:
    """The ledger as JSON (API, CLI --json, terminal events, the demo's summary)."""
    return {
        "currency": book.currency, "total": round(book.total, 4),
        "standard_equivalent": round(book.standard_equivalent, 4),
        "savings": None if book.savings is None else round(book.savings, 4),
        "savings_pct": None if book.savings_pct is None else round(book.savings_pct, 1),
        "result": str(book.result), "unpriced": list(book.unpriced),
        "useful_s": round(book.useful_s, 1), "lost_steps": book.lost_steps,
        "lost_cost": round(book.lost_cost, 4), "preemptions": book.preemptions,
        "probes": book.probes, "probe_cost": round(book.probe_cost, 4),
        "preprocess_cost": round(book.preprocess_cost, 4),
        "egress_cost": round(book.egress_cost, 4), "moves": book.moves,
        "summary": book.sentence(), "basis": list(book.basis),
        "attempts": [{"attempt": a.attempt, "capacity": str(a.capacity), "region": a.region,
                      "billed_s": round(a.billed_s, 1),
                      "per_hour": None if a.per_hour is None else round(a.per_hour, 4),
                      "cost": round(a.cost, 4), "lost_steps": a.lost_steps,
                      "lost_cost": round(a.lost_cost, 4),
                      "pools": [_pool_dict(c) for c in a.pools]} for a in book.attempts],
        "pools": [_pool_dict(c) for c in pool_totals(book)],
    }
