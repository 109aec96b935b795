"""Production's side of the multi-region rule (issue 43): the run's own per-region estimates of
Spot, and where its next Spot attempt goes, through core.regions.choose_spot_region, the function
the simulator's multi-region policy (spotorch.sim.multi_region.SpotorchMulti) calls too.

Three places use it: launching (the region of the next Spot attempt), recovery (after a
preemption or a stockout, Spot counts as available when another region is worth a try) and the
tick (a queued Spot attempt the deadline would move to standard tries another region instead
when Spot there is likely: a stockout called early). The simulator's production view does the
same. The estimates' priors are the shared record's figures per region (Context.region_records,
read by app.deps.context), as in the simulator's production view; its order (Context.regions)
breaks ties."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import replace

from spotorch.core.context import Context
from spotorch.core.cost import hourly_rate
from spotorch.core.escalation import policy_view
from spotorch.core.model import Attempt, FailureClass, Run
from spotorch.core.pipeline import Capacity
from spotorch.core.policy import PolicyView, RegionRecord, choose_capacity
from spotorch.core.regions import (
    AVOID_STOCKOUT,
    HOP_OBTAIN,
    PRIOR_LIFETIME_S,
    PRIOR_OBTAIN,
    MovePrices,
    RegionMark,
    SpotEstimate,
    SpotPick,
    choose_region,
    choose_spot_region,
    mark,
    obtainability,
    region_of,
)


def checkpoint_region(run: Run) -> str | None:
    """Where the run's checkpoint lives: the region of its last attempt that started."""
    started = [a for a in run.attempts if a.started_at is not None]
    return region_of(started[-1].region) if started else None


RECORD_PRIOR_S = 3600.0  # weight of the flat prior against the record's observed time


def record_prior(estimate: SpotEstimate, record: RegionRecord | None) -> SpotEstimate:
    """The estimate with the shared record's figures as its priors: the share of observed time
    the region had Spot capacity, and its capacity per preemption, each shrunk to the flat
    prior (an hour of observation, one preemption) so a region seen briefly is not judged on
    it (as policy.rank_regions)."""
    if record is None or record.observed_s <= 0:
        return estimate
    share = (record.available_s + PRIOR_OBTAIN * RECORD_PRIOR_S) / \
        (record.observed_s + RECORD_PRIOR_S)
    lifetime = (record.available_s + PRIOR_LIFETIME_S) / (record.preemptions + 1)
    return replace(estimate, prior_obtain=share, prior_lifetime_s=lifetime)


def spot_estimates(run: Run, regions: tuple[str, ...], now: float,
                   records: Mapping[str, RegionRecord] | None = None
                   ) -> tuple[SpotEstimate, ...]:
    """Per region, what this run's own Spot attempts and probes saw there, with the shared
    record's figures (when given) as priors."""
    out = []
    for region in regions:
        tries = found = preemptions = 0
        run_s = 0.0
        seen: bool | None = None
        for a in run.attempts:
            if a.capacity is not Capacity.SPOT or a.region != region:
                continue
            tries += 1
            if a.started_at is not None:
                found += 1
                run_s += max((a.ended_at if a.ended_at is not None else now) - a.started_at, 0.0)
                if a.ended_at is None:
                    seen = True
            if a.failure is FailureClass.PREEMPTED:
                preemptions += 1
        for p in run.probes:
            if p.region != region:
                continue
            tries += 1
            found += p.started_at is not None
        out.append(record_prior(SpotEstimate(region, tries, found, run_s, preemptions, seen),
                                (records or {}).get(region)))
    return tuple(out)


def move_prices(ctx: Context) -> MovePrices:
    """What moving this run between regions costs: its pipeline's checkpoint size."""
    return MovePrices(checkpoint_gb=ctx.recovery.checkpoint_gb)


def spot_pick(run: Run, ctx: Context, marks: Sequence[RegionMark] | None = None
              ) -> tuple[SpotPick, SpotEstimate] | None:
    """The region choose_spot_region picks for the run's next Spot attempt (None: none worth a
    try, a single region, or a price unknown), with that region's estimate."""
    regions = ctx.regions
    if len(regions) < 2:
        return None
    pipeline = ctx.pipeline
    spot = {r: hourly_rate(pipeline, Capacity.SPOT, r).per_hour for r in regions}
    home = checkpoint_region(run) or regions[0]
    standard = hourly_rate(pipeline, Capacity.STANDARD, home).per_hour
    if standard is None or any(v is None for v in spot.values()):
        return None  # a price unknown: no saving can be weighed
    view = policy_view(run, ctx, current=None, spot_available=True)
    work_left = math.inf if view.work_total_s is None else \
        max(view.work_total_s - view.work_done_s, 0.0)
    estimates = spot_estimates(run, regions, ctx.now, ctx.region_records)
    pick = choose_spot_region(
        estimates, checkpoint_region=checkpoint_region(run), prices=move_prices(ctx),
        spot_per_h={r: v or 0.0 for r, v in spot.items()}, standard_per_h=standard,
        work_left_s=work_left, overhead_s=ctx.recovery.restart_overhead_s,
        marks=run.avoid_regions if marks is None else marks, now=ctx.now)
    if pick is None:
        return None
    return pick, estimates[regions.index(pick.location)]


def next_region(run: Run, ctx: Context, capacity: Capacity) -> str:
    """The region of the run's next attempt on `capacity`.

    Spot, among several regions and without a probe's find to follow: the best region by the
    run's own estimates, a move out of the checkpoint's region only when its expected saving pays
    the egress and the transfer time (choose_spot_region). Otherwise, and when no region is
    worth a Spot try, the region rule of core.regions.choose_region."""
    prefer = run.next_region if capacity is Capacity.SPOT else None
    fallback = choose_region(ctx.regions, run.avoid_regions, capacity, ctx.now, prefer=prefer)
    if capacity is not Capacity.SPOT or prefer is not None:
        return fallback
    found = spot_pick(run, ctx)
    return fallback if found is None else found[0].location


def spot_elsewhere(run: Run, ctx: Context) -> bool:
    """After a preemption or a stockout (its region already avoided): another region is worth
    a Spot try, so Spot counts as available for the next attempt."""
    return spot_pick(run, ctx) is not None


def hop_elsewhere(run: Run, ctx: Context, current: Attempt, view: PolicyView) -> bool:
    """A queued Spot attempt the deadline would move to standard: True when another region is
    likelier than HOP_OBTAIN to have Spot and the deadline policy would take Spot there, so the
    attempt is cancelled as a stockout and the next one goes there."""
    marks = mark(run.avoid_regions, current.region, Capacity.SPOT, ctx.now + 1.0,
                 AVOID_STOCKOUT, ctx.now)
    found = spot_pick(run, ctx, marks)
    if found is None or obtainability(found[1]) <= HOP_OBTAIN:
        return False
    pick = found[0]
    there = replace(view, current=None, spot_queued=False, spot_available=True,
                    restart_overhead_s=view.restart_overhead_s + pick.move_s)
    return choose_capacity(there, ctx.recovery) is Capacity.SPOT
