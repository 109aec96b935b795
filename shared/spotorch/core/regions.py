"""Where the next job of a run goes: the one region rule, shared by production and the simulator.

A region that just had no capacity for a run (a stockout) or just took it back (a preemption) is
avoided for a while: the run keeps a mark per region and capacity with the time it ends, so
the rule never depends on a position in a list that the history re-ranks meanwhile. Among the
regions not avoided, the best ranked wins (the shared record's order for the run's shape, else
the pipeline's own order); a region where a probe just found Spot wins over the ranking. When
every region is avoided, the one whose mark ends first is the least bad.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from spotorch.core.pipeline import Capacity

# Why a run avoids a region for a while (RegionMark.why).
AVOID_STOCKOUT = "stockout"
AVOID_PREEMPTED = "preempted"
AVOID_QUOTA = "quota"  # a resource quota refused the job there (spotorch.core.quotas)


@dataclass(frozen=True)
class RegionMark:
    """A run avoids `region` for `capacity` until `until` (epoch seconds), because of `why`."""

    region: str
    capacity: Capacity
    until: float
    why: str


def mark(marks: Sequence[RegionMark], region: str, capacity: Capacity, until: float, why: str,
         now: float) -> tuple[RegionMark, ...]:
    """The marks with this region avoided until `until` (the later of two marks of one region
    and capacity holds); expired marks are dropped, so the run document stays small."""
    kept = [m for m in marks if m.until > now and not (m.region == region
                                                       and m.capacity is capacity)]
    old = next((m for m in marks if m.region == region and m.capacity is capacity), None)
    new = RegionMark(region, capacity, max(until, old.until if old else until), why)
    return (*kept, new)


def avoided(marks: Sequence[RegionMark], capacity: Capacity, now: float) -> dict[str, float]:
    """Region -> until when, for regions this capacity avoids now."""
    out: dict[str, float] = {}
    for m in marks:
        if m.capacity is capacity and m.until > now:
            out[m.region] = max(out.get(m.region, 0.0), m.until)
    return out


def choose_region(ranked: Sequence[str], marks: Sequence[RegionMark], capacity: Capacity,
                  now: float, *, prefer: str | None = None) -> str:
    """The region of the next job on `capacity`: `prefer` (a probe found Spot there) if not
    avoided, else the best ranked one not avoided, else the one whose mark ends first."""
    if not ranked:
        raise ValueError("no regions to choose from")
    blocked = avoided(marks, capacity, now)
    if prefer is not None and prefer in ranked and prefer not in blocked:
        return prefer
    free = [r for r in ranked if r not in blocked]
    if free:
        return free[0]
    order = {r: i for i, r in enumerate(ranked)}
    return min(ranked, key=lambda r: (blocked[r], order[r]))
