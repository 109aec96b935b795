"""When the Vertex emulator preempts Spot jobs and when Spot capacity is gone (pure)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from spotorch.ports.jobs import LABEL_ATTEMPT, LABEL_PIPELINE, LABEL_RUN, label_value


class ScheduleError(ValueError):
    """A preemption schedule or trace that cannot be used."""


@dataclass(frozen=True)
class PreemptRule:
    """Preempt matching SPOT jobs `after_s` seconds after they started running: every VM, or
    only one replica's (pool and index) when `pool` is set."""

    after_s: float
    attempt: int | None = None  # matched on the LABEL_ATTEMPT label; None: any
    run: str | None = None  # matched on the LABEL_RUN label; None: any
    pipeline: str | None = None  # matched on the LABEL_PIPELINE label; None: any
    pool: int | None = None  # only this pool's replica `index` (workerpoolP-I); None: the job
    index: int = 0
    run_suffix: str | None = None  # the LABEL_RUN label ends with it (a sweep's "-t1"); None: any

    @property
    def replica(self) -> str | None:
        """The one replica this rule preempts (workerpoolP-I); None: every VM of the job."""
        return None if self.pool is None else f"workerpool{self.pool}-{self.index}"

    def matches(self, labels: Mapping[str, str]) -> bool:
        wanted = ((LABEL_ATTEMPT, None if self.attempt is None else str(self.attempt)),
                  (LABEL_RUN, self.run), (LABEL_PIPELINE, self.pipeline))
        return all(v is None or labels.get(k) == label_value(v) for k, v in wanted) and (
            self.run_suffix is None
            or labels.get(LABEL_RUN, "").endswith(label_value(self.run_suffix)))


@dataclass(frozen=True)
class EventDrop:
    """Lose every job-state message of matching jobs, as a log sink may lose messages."""

    attempt: int | None = None  # matched on the LABEL_ATTEMPT label; None: any
    run: str | None = None
    pipeline: str | None = None

    def matches(self, labels: Mapping[str, str]) -> bool:
        return PreemptRule(0.0, self.attempt, self.run, self.pipeline).matches(labels)


@dataclass(frozen=True)
class Window:
    """Spot capacity gone from `from_s` (seconds after the emulator started) for `for_s` seconds."""

    from_s: float = 0.0
    for_s: float | None = None  # None: forever

    def covers(self, t: float) -> bool:
        return t >= self.from_s and (self.for_s is None or t < self.from_s + self.for_s)


@dataclass(frozen=True)
class SpotTrace:
    """A spot availability trace replayed from the emulator's start; 0 means no Spot capacity."""

    values: tuple[int, ...]
    gap_s: float
    speed: float = 1.0  # trace seconds per wall-clock second
    offset: int = 0  # index of the tick the replay starts at

    def available(self, t: float) -> bool:
        """Whether Spot capacity exists t wall seconds after the start (the trace wraps around)."""
        index = self.offset + int(t * self.speed / self.gap_s)
        return self.values[index % len(self.values)] > 0

    @classmethod
    def load(cls, path: str | Path, *, speed: float = 1.0, offset: int = 0) -> SpotTrace:
        """Read a spot trace file (spotorch/sim/traces ({"metadata": {"gap_seconds"}, "data"})."""
        try:
            raw = json.loads(Path(path).read_text())
            values = tuple(int(v) for v in raw["data"])
            gap = float(raw["metadata"]["gap_seconds"])
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ScheduleError(f"{path}: not a spot trace: {exc}") from exc
        if not values or gap <= 0 or speed <= 0:
            raise ScheduleError(f"{path}: empty trace, or gap/speed not positive")
        return cls(values, gap, speed, offset)


@dataclass(frozen=True)
class SpotSchedule:
    """Everything that decides when Spot jobs lose (or never get) their VMs."""

    rules: tuple[PreemptRule, ...] = ()
    every_spot_job_after_s: float | None = None
    stockouts: tuple[Window, ...] = ()
    trace: SpotTrace | None = None
    drop_events: tuple[EventDrop, ...] = ()  # jobs whose job-state messages are all lost

    def spot_available(self, t: float) -> bool:
        """Whether Spot capacity exists t seconds after the emulator started."""
        if any(w.covers(t) for w in self.stockouts):
            return False
        return self.trace is None or self.trace.available(t)

    def preempt_after(self, labels: Mapping[str, str]) -> float | None:
        """Seconds after start at which a SPOT job with these labels is preempted; None: never."""
        delays = [r.after_s for r in self.rules if r.pool is None and r.matches(labels)]
        if self.every_spot_job_after_s is not None:
            delays.append(self.every_spot_job_after_s)
        return min(delays) if delays else None

    def replica_rules(self, labels: Mapping[str, str]) -> list[tuple[int, PreemptRule]]:
        """The single-replica rules (by their place in the schedule) that match a job."""
        return [(i, r) for i, r in enumerate(self.rules)
                if r.pool is not None and r.matches(labels)]

    def drops_events_of(self, labels: Mapping[str, str]) -> bool:
        """Whether every job-state message of a job with these labels is lost."""
        return any(d.matches(labels) for d in self.drop_events)

    def with_stockout(self, window: Window) -> SpotSchedule:
        return replace(self, stockouts=(*self.stockouts, window))

    def with_trace(self, trace: SpotTrace) -> SpotSchedule:
        return replace(self, trace=trace)


_RULE_KEYS = {"after_s", "attempt", "run", "run_suffix", "pipeline", "pool", "index"}
_DROP_KEYS = {"attempt", "run", "pipeline"}
_SCHEDULE_KEYS = {"preempt", "every_spot_job_after_s", "stockouts", "drop_events"}
_WINDOW_KEYS = {"from_s", "for_s"}


def _number(value: Any, where: str, *, optional: bool = False) -> float | None:
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        raise ScheduleError(f"{where}: expected a non-negative number, got {value!r}")
    return float(value)


def _keys(obj: Any, allowed: set[str], where: str) -> Mapping[str, Any]:
    if not isinstance(obj, Mapping):
        raise ScheduleError(f"{where}: expected an object")
    unknown = set(obj) - allowed
    if unknown:
        raise ScheduleError(f"{where}: unknown keys {sorted(unknown)}; allowed {sorted(allowed)}")
    return obj


def _rule(obj: Any, where: str) -> PreemptRule:
    raw = _keys(obj, _RULE_KEYS, where)
    after = _number(raw.get("after_s"), f"{where}.after_s")
    pool, index = raw.get("pool"), raw.get("index", 0)
    for key, value in (("pool", pool), ("index", index)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                  or not 0 <= value <= (3 if key == "pool" else 10**6)):
            raise ScheduleError(f"{where}.{key}: expected a "
                                f"{'pool 0-3' if key == 'pool' else 'replica index'}, got {value!r}")
    if pool is None and "index" in raw:
        raise ScheduleError(f"{where}.index: names a replica of a pool; give pool too")
    suffix = raw.get("run_suffix")
    if suffix is not None and (not isinstance(suffix, str) or not suffix):
        raise ScheduleError(f"{where}.run_suffix: expected the end of a run id, got {suffix!r}")
    return PreemptRule(after or 0.0, *_match(raw, where), pool=pool, index=int(index or 0),
                       run_suffix=suffix)


def _drop(obj: Any, where: str) -> EventDrop:
    return EventDrop(*_match(_keys(obj, _DROP_KEYS, where), where))


def _match(raw: Mapping[str, Any], where: str) -> tuple[int | None, str | None, str | None]:
    """A rule's job selector: attempt, run, pipeline (each None: any)."""
    attempt = raw.get("attempt")
    if attempt is not None and (isinstance(attempt, bool) or not isinstance(attempt, int)):
        raise ScheduleError(f"{where}.attempt: expected an integer, got {attempt!r}")
    run, pipeline = raw.get("run"), raw.get("pipeline")
    return attempt, None if run is None else str(run), None if pipeline is None else str(pipeline)


def _window(obj: Any, where: str) -> Window:
    raw = _keys(obj, _WINDOW_KEYS, where)
    return Window(from_s=_number(raw.get("from_s", 0), f"{where}.from_s") or 0.0,
                  for_s=_number(raw.get("for_s"), f"{where}.for_s", optional=True))


def parse_schedule(obj: Any) -> SpotSchedule:
    """A schedule from JSON: a list of rules, or {"preempt": [...], "every_spot_job_after_s": X,
    "stockouts": [{"from_s": T, "for_s": N}], "drop_events": [{"attempt"?, "run"?,
    "pipeline"?}]}; a rule is {"after_s", "attempt"?, "run"?, "pipeline"?, "pool"?, "index"?}
    (pool: only that replica's VM); an omitted for_s means forever."""
    if isinstance(obj, Sequence) and not isinstance(obj, str):
        obj = {"preempt": list(obj)}
    raw = _keys(obj, _SCHEDULE_KEYS, "schedule")
    rules = raw.get("preempt", [])
    windows = raw.get("stockouts", [])
    drops = raw.get("drop_events", [])
    if not all(isinstance(x, list) for x in (rules, windows, drops)):
        raise ScheduleError("schedule: preempt, stockouts and drop_events must be lists")
    return SpotSchedule(
        rules=tuple(_rule(r, f"preempt[{i}]") for i, r in enumerate(rules)),
        every_spot_job_after_s=_number(raw.get("every_spot_job_after_s"),
                                       "every_spot_job_after_s", optional=True),
        stockouts=tuple(_window(w, f"stockouts[{i}]") for i, w in enumerate(windows)),
        drop_events=tuple(_drop(d, f"drop_events[{i}]") for i, d in enumerate(drops)),
    )


def load_schedule(path: str | Path) -> SpotSchedule:
    """Read a schedule JSON file."""
    try:
        return parse_schedule(json.loads(Path(path).read_text()))
    except (OSError, ValueError) as exc:
        raise ScheduleError(f"{path}: {exc}") from exc
