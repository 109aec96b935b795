"""Reading runs for people: one run, or every run newest first with filters and pages."""

from __future__ import annotations

import base64
import binascii
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from spotorch.domain import Run, RunStatus
from spotorch.ports import DocumentStore
from spotorch.settings import COLLECTION_RUNS

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


def parse_statuses(names: Iterable[str]) -> frozenset[RunStatus]:
    """Status names or groups (case-insensitive) as a set; BadQuery names the unknown one."""
    wanted: set[RunStatus] = set()
    for raw in names:
        for name in filter(None, (n.strip() for n in raw.split(","))):
            if name.lower() in STATUS_GROUPS:
                wanted |= STATUS_GROUPS[name.lower()]
                continue
            try:
                wanted.add(RunStatus(name.upper()))
            except ValueError:
                choices = ", ".join([*STATUS_GROUPS, *(s.value for s in RunStatus)])
                raise BadQuery(f"unknown status {name!r}; one of: {choices}") from None
    return frozenset(wanted)


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


def _key(run: Run) -> tuple[float, str]:
    return run.created_at, run.run_id


def encode_token(run: Run) -> str:
    """The page token after `run`: its sort key, opaque to callers."""
    return base64.urlsafe_b64encode(f"{run.created_at!r}|{run.run_id}".encode()).decode()


def decode_token(token: str) -> tuple[float, str]:
    try:
        at, _, run_id = base64.urlsafe_b64decode(token.encode()).decode().partition("|")
        return float(at), run_id
    except (binascii.Error, UnicodeDecodeError, ValueError):
        raise BadQuery(f"bad page token {token!r}: pass the next_page_token of a listing") \
            from None


def page_of(newest_first: Iterator[Run], query: RunQuery) -> RunPage:
    """Cut one page out of runs sorted newest first (ties by run id, descending)."""
    after = decode_token(query.page_token) if query.page_token else None
    picked: list[Run] = []
    for run in newest_first:
        if after is not None and _key(run) >= after:
            continue
        if not query.matches(run):
            continue
        if len(picked) == query.limit:
            return RunPage(tuple(picked), encode_token(picked[-1]))
        picked.append(run)
    return RunPage(tuple(picked), None)


class RunReader(Protocol):
    """Runs as operators read them."""

    def get(self, run_id: str) -> Run | None:
        ...

    def list(self, query: RunQuery) -> RunPage:
        ...


class DocumentRunReader:
    """Reads runs from any DocumentStore (every run document says whether it is active)."""

    def __init__(self, docs: DocumentStore, collection: str = COLLECTION_RUNS) -> None:
        self.docs = docs
        self.collection = collection

    def get(self, run_id: str) -> Run | None:
        data, _ = self.docs.get(self.collection, run_id)
        return None if data is None else Run.from_dict(data)

    def list(self, query: RunQuery) -> RunPage:
        docs = [*self.docs.query(self.collection, "active", True),
                *self.docs.query(self.collection, "active", False)]
        runs = sorted((Run.from_dict(d) for d in docs), key=_key, reverse=True)
        return page_of(iter(runs), query)


class FirestoreRunReader:
    """Reads runs from Firestore newest first, streaming only as far as the page needs.

    Only `created_at` is queried (range and order on one field: Firestore's automatic single-field
    index serves it, no composite index to deploy); status and pipeline are filtered here.
    """

    def __init__(self, client: Any, collection: str = COLLECTION_RUNS,
                 timeout_s: float = READ_TIMEOUT_S) -> None:
        self.client = client
        self.collection = collection
        self.timeout_s = timeout_s

    def _deadline(self) -> dict[str, Any]:
        # Without these the client retries an unreachable Firestore for minutes.
        from google.api_core.retry import Retry

        return {"retry": Retry(timeout=self.timeout_s), "timeout": self.timeout_s}

    def get(self, run_id: str) -> Run | None:
        snap = self.client.collection(self.collection).document(run_id).get(**self._deadline())
        return Run.from_dict(snap.to_dict()) if snap.exists else None

    def list(self, query: RunQuery) -> RunPage:
        from google.cloud import firestore
        from google.cloud.firestore_v1.base_query import FieldFilter

        q = self.client.collection(self.collection)
        if query.since is not None:
            q = q.where(filter=FieldFilter("created_at", ">=", query.since))
        if query.page_token:
            at, _ = decode_token(query.page_token)
            q = q.where(filter=FieldFilter("created_at", "<=", at))
        q = q.order_by("created_at", direction=firestore.Query.DESCENDING)
        runs = (Run.from_dict(snap.to_dict()) for snap in q.stream(**self._deadline()))
        return page_of(_ties_sorted(runs), query)


def _ties_sorted(runs: Iterator[Run]) -> Iterator[Run]:
    """Runs ordered by created_at descending, with equal times ordered by run id descending."""
    group: list[Run] = []
    for run in runs:
        if group and run.created_at != group[0].created_at:
            yield from sorted(group, key=_key, reverse=True)
            group = []
        group.append(run)
    yield from sorted(group, key=_key, reverse=True)
