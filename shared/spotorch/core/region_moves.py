"""Production's side of the multi-region rule (issue 43): the run's own per-region estimates of
Spot, and the region of its next Spot attempt through core.regions.choose_spot_region, the
function the simulator's multi-region policy (spotorch.sim.multi_region) calls too."""

from __future__ import annotations

import math

from spotorch.core.context import Context
from spotorch.core.cost import hourly_rate
from spotorch.core.escalation import policy_view
from spotorch.core.model import FailureClass, Run
from spotorch.core.pipeline import Capacity
from spotorch.core.regions import (
    MovePrices,
    SpotEstimate,
    choose_region,
    choose_spot_region,
    region_of,
)


def checkpoint_region(run: Run) -> str | None:
    """Where the run's checkpoint lives: the region of its last attempt that started."""
    started = [a for a in run.attempts if a.started_at is not None]
    return region_of(started[-1].region) if started else None


def spot_estimates(run: Run, regions: tuple[str, ...], now: float) -> tuple[SpotEstimate, ...]:
    """Per region, what this run's own Spot attempts and probes saw there."""
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
        out.append(SpotEstimate(region, tries, found, run_s, preemptions, seen))
    return tuple(out)


def move_prices(ctx: Context) -> MovePrices:
    """What moving this run between regions costs: its pipeline's checkpoint size."""
    return MovePrices(checkpoint_gb=ctx.recovery.checkpoint_gb)


def next_region(run: Run, ctx: Context, capacity: Capacity) -> str:
    """The region of the run's next attempt on `capacity`.

    Spot, among several regions and without a probe's find to follow: the best region by the
    run's own estimates, a move out of the checkpoint's region only when its expected saving pays
    the egress and the transfer time (choose_spot_region). Otherwise, and when no region is
    worth a Spot try, the region rule of core.regions.choose_region."""
    regions = ctx.regions
    prefer = run.next_region if capacity is Capacity.SPOT else None
    fallback = choose_region(regions, run.avoid_regions, capacity, ctx.now, prefer=prefer)
    if capacity is not Capacity.SPOT or len(regions) < 2 or prefer is not None:
        return fallback
    pipeline = ctx.pipeline
    spot = {r: hourly_rate(pipeline, Capacity.SPOT, r).per_hour for r in regions}
    home = checkpoint_region(run) or regions[0]
    standard = hourly_rate(pipeline, Capacity.STANDARD, home).per_hour
    if standard is None or any(v is None for v in spot.values()):
        return fallback  # a price unknown: no saving can be weighed
    view = policy_view(run, ctx, current=None, spot_available=True)
    work_left = math.inf if view.work_total_s is None else \
        max(view.work_total_s - view.work_done_s, 0.0)
    pick = choose_spot_region(
        spot_estimates(run, regions, ctx.now), checkpoint_region=checkpoint_region(run),
        prices=move_prices(ctx), spot_per_h={r: v or 0.0 for r, v in spot.items()},
        standard_per_h=standard, work_left_s=work_left,
        overhead_s=ctx.recovery.restart_overhead_s, marks=run.avoid_regions,
        now=ctx.now)
    return fallback if pick is None else pick.location
