"""The trade-off, pure: which trials no other beats on every objective, and which one to choose.

A point is a trial's values by metric name (quality, cost, latency...). The front is every
point not dominated by another (at least as good on every objective, better on one). The choice
is the best quality (the first objective) among the points that meet every constraint; when
none meets them there is no choice, and the reason says which constraint each missed by how much.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from spotorch.core.sweep_spec import Goal

Point = Mapping[str, float]


@dataclass(frozen=True)
class Objective:
    """One metric the search optimises and which way is better."""

    name: str
    goal: Goal


@dataclass(frozen=True)
class Limit:
    """A business constraint on one metric: at most `max`, at least `min` (either may be None)."""

    metric: str
    max: float | None = None
    min: float | None = None

    def missed_by(self, value: float | None) -> str | None:
        """Why a value misses this limit, or None when it meets it (a missing value misses)."""
        if value is None:
            return f"{self.metric} not reported"
        if self.max is not None and value > self.max:
            return f"{self.metric} {value:g} > max {self.max:g}"
        if self.min is not None and value < self.min:
            return f"{self.metric} {value:g} < min {self.min:g}"
        return None


@dataclass(frozen=True)
class Choice:
    """The decision over a set of trials: the front, who meets the constraints, who is chosen."""

    front: tuple[int, ...]  # keys of the non-dominated points, in the input's order
    feasible: tuple[int, ...]  # keys of the points meeting every constraint
    chosen: int | None
    why: str
    misses: Mapping[int, tuple[str, ...]]  # key -> the constraints it misses


def _better_or_equal(goal: Goal, a: float, b: float) -> bool:
    return a <= b if goal is Goal.MINIMIZE else a >= b


def dominates(a: Point, b: Point, objectives: Sequence[Objective]) -> bool:
    """Whether a is at least as good as b on every objective and strictly better on one."""
    if not all(o.name in a and o.name in b for o in objectives):
        return False
    return (all(_better_or_equal(o.goal, a[o.name], b[o.name]) for o in objectives)
            and any(a[o.name] != b[o.name] for o in objectives))


def front(points: Mapping[int, Point], objectives: Sequence[Objective]) -> tuple[int, ...]:
    """The keys of the points no other point dominates (points missing an objective are out)."""
    complete = {k: p for k, p in points.items() if all(o.name in p for o in objectives)}
    return tuple(k for k, p in complete.items()
                 if not any(dominates(q, p, objectives) for j, q in complete.items() if j != k))


def choose(points: Mapping[int, Point], objectives: Sequence[Objective],
           limits: Sequence[Limit] = ()) -> Choice:
    """The front, and the best quality (first objective) among the points meeting every limit."""
    if not objectives:
        raise ValueError("choose needs at least one objective")
    quality = objectives[0]
    misses = {k: tuple(m for m in (lim.missed_by(p.get(lim.metric)) for lim in limits) if m)
              for k, p in points.items()}
    feasible = tuple(k for k, p in points.items() if not misses[k] and quality.name in p)
    best: int | None = None
    for key in feasible:  # ties: the earlier point
        if best is None or (points[key][quality.name] != points[best][quality.name]
                            and _better_or_equal(quality.goal, points[key][quality.name],
                                                 points[best][quality.name])):
            best = key
    if best is not None:
        why = (f"best {quality.name} ({points[best][quality.name]:g}) among the "
               f"{len(feasible)} of {len(points)} trials that meet the constraints"
               if limits else f"best {quality.name} ({points[best][quality.name]:g})")
    elif not points:
        why = "no trial reported its values"
    else:
        why = ("no trial meets the constraints: " if limits else "no trial reported ") + "; ".join(
            f"trial {k}: {', '.join(m) or quality.name + ' not reported'}"
            for k, m in sorted(misses.items()))
    return Choice(front=front(points, objectives), feasible=feasible, chosen=best, why=why,
                  misses={k: m for k, m in misses.items() if m})


def hypervolume(points: Sequence[Point], objectives: Sequence[Objective], reference: Point) -> float:
    """The volume the points dominate up to a reference point (exact, by slicing; small fronts).

    Every objective is turned into minimisation; points not better than the reference on every
    objective add nothing."""
    def as_min(p: Point) -> tuple[float, ...]:
        return tuple(p[o.name] if o.goal is Goal.MINIMIZE else -p[o.name] for o in objectives)

    ref = as_min(reference)
    pts = [q for q in (as_min(p) for p in points if all(o.name in p for o in objectives))
           if all(v < r for v, r in zip(q, ref, strict=True))]
    return _volume(pts, ref)


def _volume(points: list[tuple[float, ...]], ref: tuple[float, ...]) -> float:
    if not points:
        return 0.0
    if len(ref) == 1:
        return ref[0] - min(p[0] for p in points)
    total, ordered = 0.0, sorted(points, key=lambda p: p[0])
    for i, p in enumerate(ordered):
        upper = ordered[i + 1][0] if i + 1 < len(ordered) else ref[0]
        if upper > p[0]:
            total += (upper - p[0]) * _volume([q[1:] for q in ordered[:i + 1]], ref[1:])
    return total
