"""Reading runs and sweeps for people: one, or every one newest first with filters and pages."""

from __future__ import annotations

import base64
import binascii
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from spotorch.domain import Run, RunStatus
from spotorch.ports import DocumentStore
from spotorch.settings import COLLECTION_RUNS, COLLECTION_SWEEPS
from spotorch.sweep import Sweep, SweepStatus

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


@dataclass(frozen=True)
class RunQuery:
    """Which runs to list: newest first, filtered, one page at a time."""

    statuses: frozenset[RunStatus] = frozenset()  # empty: any
    pipeline: str | None = None
    since: float | None = None  # created at or after (epoch seconds)
    limit: int = 20
    page_token: str | None = None

    def __post_init__(self) -> None:
        if not 1 <= self.limit <= MAX_PAGE:
            raise BadQuery(f"limit must be between 1 and {MAX_PAGE}, not {self.limit}")

    def matches(self, run: Run) -> bool:
        return ((not self.statuses or run.status in self.statuses)
                and (self.pipeline is None or run.pipeline == self.pipeline)
                and (self.since is None or run.created_at >= self.since))


@dataclass(frozen=True)
class RunPage:
    runs: tuple[Run, ...]
    next_page_token: str | None = None


def _key(item: Run | Sweep) -> tuple[float, str]:
    """The listing order of runs and sweeps: creation time, ties by id (both descending)."""
    return item.created_at, item.run_id if isinstance(item, Run) else item.sweep_id


def encode_token(item: Run | Sweep) -> str:
    """The page token after `item`: its sort key, opaque to callers."""
    at, ident = _key(item)
    return base64.urlsafe_b64encode(f"{at!r}|{ident}".encode()).decode()


def decode_token(token: str) -> tuple[float, str]:
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
        if after is not None and _key(item) >= after:
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
        ...

    def list(self, query: RunQuery) -> RunPage:
        ...


class _DocumentCollection:
    """Every document of one collection of any DocumentStore, active or not (each run and
    sweep document says whether it is active: two queries read them all)."""

    def __init__(self, docs: DocumentStore, collection: str) -> None:
        self.docs = docs
        self.collection = collection

    def _get(self, key: str) -> dict[str, Any] | None:
        data, _ = self.docs.get(self.collection, key)
        return data

    def _all(self) -> list[dict[str, Any]]:
        return [*self.docs.query(self.collection, "active", True),
                *self.docs.query(self.collection, "active", False)]


class DocumentRunReader(_DocumentCollection):
    """Reads runs from any DocumentStore."""

    def __init__(self, docs: DocumentStore, collection: str = COLLECTION_RUNS) -> None:
        super().__init__(docs, collection)

    def get(self, run_id: str) -> Run | None:
        data = self._get(run_id)
        return None if data is None else Run.from_dict(data)

    def list(self, query: RunQuery) -> RunPage:
        runs = sorted((Run.from_dict(d) for d in self._all()), key=_key, reverse=True)
        return page_of(iter(runs), query)


class _FirestoreNewestFirst:
    """Documents of one collection newest first by `created_at`, streamed only as far as a page
    needs.

    Only `created_at` is queried (range and order on one field: Firestore's automatic single-field
    index serves it, no composite index to deploy); status and pipeline are filtered here.
    """

    def __init__(self, client: Any, collection: str, timeout_s: float) -> None:
        self.client = client
        self.collection = collection
        self.timeout_s = timeout_s

    def _deadline(self) -> dict[str, Any]:
        # Without these the client retries an unreachable Firestore for minutes.
        from google.api_core.retry import Retry

        return {"retry": Retry(timeout=self.timeout_s), "timeout": self.timeout_s}

    def _get(self, doc_id: str) -> dict[str, Any] | None:
        snap = self.client.collection(self.collection).document(doc_id).get(**self._deadline())
        return snap.to_dict() if snap.exists else None

    def _stream(self, since: float | None, page_token: str | None) -> Iterator[dict[str, Any]]:
        from google.cloud import firestore
        from google.cloud.firestore_v1.base_query import FieldFilter

        q = self.client.collection(self.collection)
        if since is not None:
            q = q.where(filter=FieldFilter("created_at", ">=", since))
        if page_token:
            at, _ = decode_token(page_token)
            q = q.where(filter=FieldFilter("created_at", "<=", at))
        q = q.order_by("created_at", direction=firestore.Query.DESCENDING)
        return (snap.to_dict() for snap in q.stream(**self._deadline()))


class FirestoreRunReader(_FirestoreNewestFirst):
    """Reads runs from Firestore newest first (see _FirestoreNewestFirst)."""

    def __init__(self, client: Any, collection: str = COLLECTION_RUNS,
                 timeout_s: float = READ_TIMEOUT_S) -> None:
        super().__init__(client, collection, timeout_s)

    def get(self, run_id: str) -> Run | None:
        doc = self._get(run_id)
        return None if doc is None else Run.from_dict(doc)

    def list(self, query: RunQuery) -> RunPage:
        runs = (Run.from_dict(d) for d in self._stream(query.since, query.page_token))
        return page_of(_ties_sorted(runs), query)


def _ties_sorted(items: Iterator[_Item]) -> Iterator[_Item]:
    """Items ordered by created_at descending, with equal times ordered by id descending."""
    group: list[_Item] = []
    for item in items:
        if group and item.created_at != group[0].created_at:
            yield from sorted(group, key=_key, reverse=True)
            group = []
        group.append(item)
    yield from sorted(group, key=_key, reverse=True)


# ---------------------------------------------------------------- sweeps

SWEEP_STATUS_GROUPS: Mapping[str, frozenset[SweepStatus]] = {
    "active": frozenset(s for s in SweepStatus if not s.terminal),
    "ended": frozenset(s for s in SweepStatus if s.terminal),
}


def parse_sweep_statuses(names: Iterable[str]) -> frozenset[SweepStatus]:
    """Sweep status names or groups (case-insensitive); BadQuery names the unknown one."""
    return _parse(names, SweepStatus, (s.value for s in SweepStatus), SWEEP_STATUS_GROUPS,
                  "sweep status")


@dataclass(frozen=True)
class SweepQuery:
    """Which sweeps to list: newest first, filtered, one page at a time."""

    statuses: frozenset[SweepStatus] = frozenset()  # empty: any
    pipeline: str | None = None
    since: float | None = None  # created at or after (epoch seconds)
    limit: int = 20
    page_token: str | None = None

    def __post_init__(self) -> None:
        if not 1 <= self.limit <= MAX_PAGE:
            raise BadQuery(f"limit must be between 1 and {MAX_PAGE}, not {self.limit}")

    def matches(self, sw: Sweep) -> bool:
        return ((not self.statuses or sw.status in self.statuses)
                and (self.pipeline is None or sw.pipeline == self.pipeline)
                and (self.since is None or sw.created_at >= self.since))


@dataclass(frozen=True)
class SweepPage:
    sweeps: tuple[Sweep, ...]
    next_page_token: str | None = None


def sweep_page_of(newest_first: Iterator[Sweep], query: SweepQuery) -> SweepPage:
    return SweepPage(*_cut(newest_first, query.matches, query.limit, query.page_token))


class SweepReader(Protocol):
    """Sweeps as operators read them (the documents sweep_service writes)."""

    def get(self, sweep_id: str) -> Sweep | None:
        ...

    def list(self, query: SweepQuery) -> SweepPage:
        ...


class DocumentSweepReader(_DocumentCollection):
    """Reads sweeps from any DocumentStore (the documents sweep_service writes)."""

    def __init__(self, docs: DocumentStore, collection: str = COLLECTION_SWEEPS) -> None:
        super().__init__(docs, collection)

    def get(self, sweep_id: str) -> Sweep | None:
        data = self._get(sweep_id)
        return None if data is None else Sweep.from_dict(data)

    def list(self, query: SweepQuery) -> SweepPage:
        sweeps = sorted((Sweep.from_dict(d) for d in self._all()), key=_key, reverse=True)
        return sweep_page_of(iter(sweeps), query)


class FirestoreSweepReader(_FirestoreNewestFirst):
    """Reads sweeps from Firestore newest first (see _FirestoreNewestFirst)."""

    def __init__(self, client: Any, collection: str = COLLECTION_SWEEPS,
                 timeout_s: float = READ_TIMEOUT_S) -> None:
        super().__init__(client, collection, timeout_s)

    def get(self, sweep_id: str) -> Sweep | None:
        doc = self._get(sweep_id)
        return None if doc is None else Sweep.from_dict(doc)

    def list(self, query: SweepQuery) -> SweepPage:
        sweeps = (Sweep.from_dict(d) for d in self._stream(query.since, query.page_token))
        return sweep_page_of(_ties_sorted(sweeps), query)
