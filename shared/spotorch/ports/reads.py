"""The read ports: queries of runs and sweeps for people, newest first, filtered and paged."""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

from spotorch.core.model import Run, RunStatus
from spotorch.core.sweeps import Sweep, SweepStatus
from spotorch_trainer.contract import parse_rfc3339

E = TypeVar("E", RunStatus, SweepStatus)

MAX_PAGE = 500
READ_TIMEOUT_S = 20.0

# Names `--status` accepts besides the statuses themselves.
STATUS_GROUPS: Mapping[str, frozenset[RunStatus]] = {
    "active": frozenset(s for s in RunStatus if not s.terminal),
    "ended": frozenset(s for s in RunStatus if s.terminal),
    "failed": frozenset(s for s in RunStatus if s.failed),
}


class BadQuery(ValueError):
    """A run query that cannot be answered as asked (unknown status, bad page token...)."""


def _parse(names: Iterable[str], enum: Callable[[str], E], values: Iterable[str],
           groups: Mapping[str, frozenset[E]], what: str) -> frozenset[E]:
    """Status names or groups (case-insensitive) as a set; BadQuery names the unknown one."""
    wanted: set[E] = set()
    for raw in names:
        for name in filter(None, (n.strip() for n in raw.split(","))):
            if name.lower() in groups:
                wanted |= groups[name.lower()]
                continue
            try:
                wanted.add(enum(name.upper()))
            except ValueError:
                choices = ", ".join([*groups, *values])
                raise BadQuery(f"unknown {what} {name!r}; one of: {choices}") from None
    return frozenset(wanted)


def parse_statuses(names: Iterable[str]) -> frozenset[RunStatus]:
    """Run status names or groups (case-insensitive); BadQuery names the unknown one."""
    return _parse(names, RunStatus, (s.value for s in RunStatus), STATUS_GROUPS, "status")


class Listed(Protocol):
    """What a query filters on: a run or a sweep."""

    @property
    def status(self) -> RunStatus | SweepStatus: ...  # noqa: D102

    @property
    def pipeline(self) -> str: ...  # noqa: D102

    @property
    def created_at(self) -> float: ...  # noqa: D102


@dataclass(frozen=True)
class Query(Generic[E]):
    """Which runs or sweeps to list: newest first, filtered, one page at a time (one query
    type for both: RunQuery and SweepQuery name it with their status)."""

    statuses: frozenset[E] = frozenset()  # empty: any
    pipeline: str | None = None
    since: float | None = None  # created at or after (epoch seconds)
    limit: int = 20
    page_token: str | None = None

    def __post_init__(self) -> None:
        if not 1 <= self.limit <= MAX_PAGE:
            raise BadQuery(f"limit must be between 1 and {MAX_PAGE}, not {self.limit}")

    def matches(self, item: Listed) -> bool:
        """Whether the run or sweep passes the query's filters (the page and limit aside)."""
        return ((not self.statuses or item.status in self.statuses)
                and (self.pipeline is None or item.pipeline == self.pipeline)
                and (self.since is None or item.created_at >= self.since))


RunQuery = Query[RunStatus]


@dataclass(frozen=True)
class RunPage:
    """One page of runs and the token of the next (None: the last page)."""
    runs: tuple[Run, ...]
    next_page_token: str | None = None


def order_key(item: Run | Sweep) -> tuple[float, str]:
    """The listing order of runs and sweeps: creation time, ties by id (both descending)."""
    return item.created_at, item.run_id if isinstance(item, Run) else item.sweep_id


def encode_token(item: Run | Sweep) -> str:
    """The page token after `item`: its sort key, opaque to callers."""
    at, ident = order_key(item)
    return base64.urlsafe_b64encode(f"{at!r}|{ident}".encode()).decode()


def decode_token(token: str) -> tuple[float, str]:
    """The sort key a page token holds; BadQuery if it is not one a listing gave."""
    try:
        at, _, run_id = base64.urlsafe_b64decode(token.encode()).decode().partition("|")
        return float(at), run_id
    except (binascii.Error, UnicodeDecodeError, ValueError):
        raise BadQuery(f"bad page token {token!r}: pass the next_page_token of a listing") \
            from None


_Item = TypeVar("_Item", Run, Sweep)


def _cut(newest_first: Iterator[_Item], matches: Callable[[_Item], bool], limit: int,
         page_token: str | None) -> tuple[tuple[_Item, ...], str | None]:
    """One page out of items sorted newest first, and the token of the next one (None: last)."""
    after = decode_token(page_token) if page_token else None
    picked: list[_Item] = []
    for item in newest_first:
        if after is not None and order_key(item) >= after:
            continue
        if not matches(item):
            continue
        if len(picked) == limit:
            return tuple(picked), encode_token(picked[-1])
        picked.append(item)
    return tuple(picked), None


def page_of(newest_first: Iterator[Run], query: RunQuery) -> RunPage:
    """Cut one page out of runs sorted newest first (ties by run id, descending)."""
    return RunPage(*_cut(newest_first, query.matches, query.limit, query.page_token))


class RunReader(Protocol):
    """Runs as operators read them."""

    def get(self, run_id: str) -> Run | None:
        """The run, None if there is no such run."""
        ...

    def list(self, query: RunQuery) -> RunPage:
        """One page of the runs the query asks for, newest first."""
        ...


def ties_sorted(items: Iterator[_Item]) -> Iterator[_Item]:
    """Items ordered by created_at descending, with equal times ordered by id descending."""
    group: list[_Item] = []
    for item in items:
        if group and item.created_at != group[0].created_at:
            yield from sorted(group, key=order_key, reverse=True)
            group = []
        group.append(item)
    yield from sorted(group, key=order_key, reverse=True)


# ---------------------------------------------------------------- sweeps

SWEEP_STATUS_GROUPS: Mapping[str, frozenset[SweepStatus]] = {
    "active": frozenset(s for s in SweepStatus if not s.terminal),
    "ended": frozenset(s for s in SweepStatus if s.terminal),
}


def parse_sweep_statuses(names: Iterable[str]) -> frozenset[SweepStatus]:
    """Sweep status names or groups (case-insensitive); BadQuery names the unknown one."""
    return _parse(names, SweepStatus, (s.value for s in SweepStatus), SWEEP_STATUS_GROUPS,
                  "sweep status")


SweepQuery = Query[SweepStatus]


@dataclass(frozen=True)
class SweepPage:
    """One page of sweeps and the token of the next (None: the last page)."""
    sweeps: tuple[Sweep, ...]
    next_page_token: str | None = None


def sweep_page_of(newest_first: Iterator[Sweep], query: SweepQuery) -> SweepPage:
    """Cut one page out of sweeps sorted newest first (ties by sweep id, descending)."""
    return SweepPage(*_cut(newest_first, query.matches, query.limit, query.page_token))


class SweepReader(Protocol):
    """Sweeps as operators read them (the documents sweep_service writes)."""

    def get(self, sweep_id: str) -> Sweep | None:
        """The sweep, None if there is no such sweep."""
        ...

    def list(self, query: SweepQuery) -> SweepPage:
        """One page of the sweeps the query asks for, newest first."""
        ...


# --- times operators type: an ISO 8601 instant or a span back from now (30m, 6h, 2d, 1w) ---

_UNITS: Mapping[str, float] = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_SPAN = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*$", re.IGNORECASE)


def parse_since(text: str, now: float) -> float:
    """Epoch seconds of `text`: '6h' is six hours before now, '2026-11-30' or an ISO time is that."""
    span = _SPAN.match(text)
    if span:
        return now - float(span.group(1)) * _UNITS[span.group(2).lower()]
    try:
        return parse_rfc3339(text)
    except ValueError:
        raise BadQuery(f"--since {text!r}: give an ISO 8601 time (2026-11-30T08:00:00Z) or a "
                       "span back from now (30m, 6h, 2d, 1w)") from None


# ---------------------------------------------------------------- data arrival

class ArrivalReader(Protocol):
    """What arrived in the landing buckets, as operators read it: the snapshot documents
    (spotorch.app.snapshots) and the records of uploads that matched no pipeline
    (spotorch.app.unmatched), most recently active first."""

    def snapshots(self, limit: int) -> Sequence[Mapping[str, Any]]:
        """The newest snapshot documents, at most `limit`, most recently active first."""
        ...

    def unmatched(self, limit: int) -> Sequence[Mapping[str, Any]]:
        """The newest records of uploads that matched no pipeline, at most `limit`."""
        ...
