"""Where the next job of a run goes: the one region rule, shared by production and the simulator.

A region that just had no capacity for a run (a stockout) or just took it back (a preemption) is
avoided for a while: the run keeps a mark per region and capacity with the time it ends, so
the rule never depends on a position in a list that the history re-ranks meanwhile. Among the
regions not avoided, the best ranked wins (the shared record's order for the run's shape, else
the pipeline's own order); a region where a probe just found Spot wins over the ranking. When
every region is avoided, the one whose mark ends first is the least bad.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
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


# ---------------------------------------------------------------------------------------------
# Moving a run between regions (issue 43): what a move costs, what each region's Spot is
# expected to give, and where the next Spot attempt goes. Production (core.launching) and the
# simulator (spotorch.sim.multi_region) both call choose_spot_region.

# Google's network pricing for data moved between regions, per GB, by continent pair (source
# and destination in one continent, else between continents). Assumed from Google Cloud's
# published inter-region rates (Cloud Storage "data transfer within Google Cloud", 2025): within
# North America or Europe $0.02/GB, within Asia $0.08/GB, between continents $0.08/GB. Not in
# FACTS.md as figures: callers may pass their own rate (MovePrices.egress_per_gb).
EGRESS_SAME_CONTINENT_PER_GB = {"us": 0.02, "northamerica": 0.02, "europe": 0.02, "asia": 0.08}
EGRESS_INTERCONTINENTAL_PER_GB = 0.08
_NORTH_AMERICA = frozenset({"us", "northamerica"})


def region_of(location: str) -> str:
    """The region of a zone or region name: us-central1-a and us-east-1a -> us-central1, us-east-1."""
    if len(location) > 2 and location[-2] == "-" and location[-1].isalpha():
        return location[:-2]  # Google's zones: us-central1-a
    if len(location) > 1 and location[-1].isalpha() and location[-2].isdigit():
        return location[:-1]  # AWS-style zones, as in the public traces: us-east-1a
    return location


def _continent(region: str) -> str:
    head = region.split("-")[0]
    return "us" if head in _NORTH_AMERICA else head


def egress_per_gb(source: str, target: str) -> float:
    """Dollars per GB moved from one region to another (0 within a region)."""
    a, b = _continent(region_of(source)), _continent(region_of(target))
    if region_of(source) == region_of(target):
        return 0.0
    if a == b:
        return EGRESS_SAME_CONTINENT_PER_GB.get(a, EGRESS_INTERCONTINENTAL_PER_GB)
    return EGRESS_INTERCONTINENTAL_PER_GB


@dataclass(frozen=True)
class MovePrices:
    """What moving a run's work to another region costs: its checkpoint, and its data.

    A checkpoint lives in the region of the attempt that wrote it; an attempt in another region
    copies it first (egress, and transfer time before any work). The data lives in
    `data_region` and every attempt elsewhere reads it across regions once. Within a region
    nothing is moved (a zone reads its region's bucket as part of the restart overhead)."""

    checkpoint_gb: float = 0.0
    data_gb: float = 0.0
    data_region: str | None = None  # None: the data is read in every region at no charge
    bandwidth_gbps: float = 8.0  # sustained inter-region copy rate, gigabits per second
    egress_per_gb: float | None = None  # one rate for every pair; None: egress_per_gb()
    time_quantum_s: float = 60.0  # transfer times are rounded up to whole quanta

    def rate(self, source: str, target: str) -> float:
        """$/GB between two regions."""
        if region_of(source) == region_of(target):
            return 0.0
        return egress_per_gb(source, target) if self.egress_per_gb is None else self.egress_per_gb

    def gb_moved(self, source: str | None, target: str) -> tuple[float, float]:
        """(checkpoint GB, data GB) an attempt in `target` must copy; source: the checkpoint's
        region, None before the first checkpoint."""
        ckpt = self.checkpoint_gb if source is not None and \
            region_of(source) != region_of(target) else 0.0
        data = self.data_gb if self.data_region is not None and \
            region_of(self.data_region) != region_of(target) else 0.0
        return ckpt, data

    def cost(self, source: str | None, target: str) -> float:
        """Egress dollars of an attempt in `target` whose checkpoint is in `source`."""
        ckpt, data = self.gb_moved(source, target)
        return (ckpt * self.rate(source, target) if source is not None else 0.0) + \
            (data * self.rate(self.data_region, target) if self.data_region is not None else 0.0)

    def seconds(self, source: str | None, target: str) -> float:
        """Transfer time an attempt in `target` spends copying before any work (rounded up)."""
        ckpt, data = self.gb_moved(source, target)
        raw = (ckpt + data) * 8.0 / self.bandwidth_gbps if self.bandwidth_gbps > 0 else 0.0
        q = self.time_quantum_s
        return math.ceil(raw / q - 1e-9) * q if raw > 0 and q > 0 else raw


@dataclass(frozen=True)
class SpotEstimate:
    """What a run has seen of Spot in one location (a region or a zone): its own attempts and
    probes there. `seen` is what is known now: True capacity seen, False none, None unknown."""

    location: str
    tries: int = 0  # Spot attempts and probes that asked for capacity here
    found: int = 0  # of which got it within the stockout wait
    run_s: float = 0.0  # Spot time seen running here
    preemptions: int = 0
    seen: bool | None = None
    up_s: float | None = None  # how long capacity has been seen without a break, when seen
    # Priors from a record of every run's Spot in this location (the shared record), in place
    # of the flat ones below; None: no record.
    prior_obtain: float | None = None
    prior_lifetime_s: float | None = None


# Priors of the estimates (pseudo-observations): an unseen location gets half a chance of
# capacity and the deadline policy's prior Spot up-time.
PRIOR_OBTAIN, PRIOR_OBTAIN_WEIGHT = 0.5, 2.0
PRIOR_LIFETIME_S, PRIOR_LIFETIME_WEIGHT = 5 * 3600.0, 1.0


def obtainability(e: SpotEstimate) -> float:
    """Chance a Spot attempt here gets capacity: seen now, else attempts' hits shrunk to a prior."""
    if e.seen is not None:
        return 1.0 if e.seen else 0.0
    prior = PRIOR_OBTAIN if e.prior_obtain is None else e.prior_obtain
    return (e.found + prior * PRIOR_OBTAIN_WEIGHT) / (e.tries + PRIOR_OBTAIN_WEIGHT)


# A queued Spot attempt that the deadline would move to standard tries another location instead
# (a stockout called early) only where Spot is likelier than this.
HOP_OBTAIN = 0.5


def lifetime_s(e: SpotEstimate) -> float:
    """Expected Spot run before a preemption here: run time per preemption, shrunk to a prior;
    capacity seen up for a while is expected to last at least as long again (heavy tails)."""
    prior = PRIOR_LIFETIME_S if e.prior_lifetime_s is None else e.prior_lifetime_s
    mean = (e.run_s + prior * PRIOR_LIFETIME_WEIGHT) / (e.preemptions + PRIOR_LIFETIME_WEIGHT)
    return max(mean, e.up_s or 0.0)


@dataclass(frozen=True)
class SpotPick:
    """Where the next Spot attempt goes, what moving there costs, and why."""

    location: str
    move_cost: float  # egress dollars
    move_s: float  # transfer time before work
    value: float  # expected saving less the move, dollars
    reason: str


def choose_spot_region(estimates: Sequence[SpotEstimate], *, checkpoint_region: str | None,
                       prices: MovePrices, spot_per_h: Mapping[str, float],
                       standard_per_h: float, work_left_s: float, overhead_s: float,
                       marks: Sequence[RegionMark] = (), now: float = 0.0) -> SpotPick | None:
    """The location of the next Spot attempt, or None when no location is worth a try.

    Each location not avoided is worth the Spot discount on the work it is expected to do before
    a preemption (its lifetime, capped by the work left) times the chance it has capacity, less
    one restart overhead at the Spot price, less the move (egress, and the transfer time billed
    at the Spot price). A move out of the checkpoint's region must pay for itself: the best
    location wins; ties go to the checkpoint's region, then the data's, then the given order."""
    blocked = avoided(marks, Capacity.SPOT, now)
    best: SpotPick | None = None
    best_key: tuple[float, int, int] | None = None
    home = checkpoint_region or prices.data_region
    for e in estimates:
        if e.location in blocked:
            continue
        p = obtainability(e)
        if p <= 0.0:
            continue
        spot = spot_per_h.get(e.location, spot_per_h.get(region_of(e.location), 0.0))
        move_cost = prices.cost(checkpoint_region, e.location)
        move_s = prices.seconds(checkpoint_region, e.location)
        useful = min(lifetime_s(e), max(work_left_s, 0.0))
        value = p * (standard_per_h - spot) * useful / 3600.0 \
            - spot * (overhead_s + move_s) / 3600.0 - move_cost
        if value <= 0.0:
            continue
        stays = home is not None and region_of(e.location) == region_of(home)
        at_data = prices.data_region is not None and \
            region_of(e.location) == region_of(prices.data_region)
        key = (round(value, 6), int(stays), int(at_data))
        if best_key is None or key > best_key:
            best_key = key
            reason = "stays in the checkpoint's region" if move_cost == 0 and move_s == 0 else \
                f"moves: expected saving pays ${move_cost:.2f} egress and {move_s:.0f} s transfer"
            best = SpotPick(e.location, move_cost, move_s, value, reason)
    return best
