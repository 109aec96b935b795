"""Run and sweep readers on Firestore queries: newest first, filtered and paged by the server."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from spotorch.core.model import Run
from spotorch.core.sweeps import Sweep
from spotorch.ports.reads import (
    MAX_PAGE,
    READ_TIMEOUT_S,
    RunPage,
    RunQuery,
    SweepPage,
    SweepQuery,
    decode_token,
    page_of,
    sweep_page_of,
    ties_sorted,
)
from spotorch.settings import COLLECTION_RUNS, COLLECTION_SNAPSHOTS, COLLECTION_SWEEPS, COLLECTION_UNMATCHED

TIE_SLACK = 8  # a page may skip the equal-time items the last page showed, and needs one more


def batch_size(query: RunQuery | SweepQuery) -> int:
    """Documents per query: a page's worth when the server's order is all the page needs, more
    when status or pipeline are filtered here (most documents read are then not shown)."""
    filtered = bool(query.statuses) or query.pipeline is not None
    return min(MAX_PAGE, query.limit * 5 if filtered else query.limit + 1 + TIE_SLACK)


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

    def _stream(self, since: float | None, page_token: str | None,
                batch: int) -> Iterator[dict[str, Any]]:
        """Documents newest first, `batch` at a time (a query each, cursor after the last
        one), only as many batches as the caller reads: a page of 20 reads about 20 documents,
        not the collection (a run document with its history is several KB)."""
        from google.cloud import firestore
        from google.cloud.firestore_v1.base_query import FieldFilter

        q = self.client.collection(self.collection)
        if since is not None:
            q = q.where(filter=FieldFilter("created_at", ">=", since))
        if page_token:
            at, _ = decode_token(page_token)
            q = q.where(filter=FieldFilter("created_at", "<=", at))
        q = q.order_by("created_at", direction=firestore.Query.DESCENDING)
        last = None
        while True:
            part = (q if last is None else q.start_after(last)).limit(batch)
            snaps = list(part.stream(**self._deadline()))
            for snap in snaps:
                yield snap.to_dict()
            if len(snaps) < batch:
                return
            last = snaps[-1]


class FirestoreRunReader(_FirestoreNewestFirst):
    """Reads runs from Firestore newest first (see _FirestoreNewestFirst)."""

    def __init__(self, client: Any, collection: str = COLLECTION_RUNS,
                 timeout_s: float = READ_TIMEOUT_S) -> None:
        super().__init__(client, collection, timeout_s)

    def get(self, run_id: str) -> Run | None:
        doc = self._get(run_id)
        return None if doc is None else Run.from_dict(doc)

    def list(self, query: RunQuery) -> RunPage:
        runs = (Run.from_dict(d) for d in self._stream(query.since, query.page_token,
                                                      batch_size(query)))
        return page_of(ties_sorted(runs), query)


class FirestoreSweepReader(_FirestoreNewestFirst):
    """Reads sweeps from Firestore newest first (see _FirestoreNewestFirst)."""

    def __init__(self, client: Any, collection: str = COLLECTION_SWEEPS,
                 timeout_s: float = READ_TIMEOUT_S) -> None:
        super().__init__(client, collection, timeout_s)

    def get(self, sweep_id: str) -> Sweep | None:
        doc = self._get(sweep_id)
        return None if doc is None else Sweep.from_dict(doc)

    def list(self, query: SweepQuery) -> SweepPage:
        sweeps = (Sweep.from_dict(d) for d in self._stream(query.since, query.page_token,
                                                          batch_size(query)))
        return sweep_page_of(ties_sorted(sweeps), query)


class FirestoreArrivalReader:
    """Snapshot and unmatched-upload documents, most recently active first (one query on
    `last_seen`, served by Firestore's automatic single-field index)."""

    def __init__(self, client: Any, timeout_s: float = READ_TIMEOUT_S) -> None:
        self.client = client
        self.timeout_s = timeout_s

    def _recent(self, collection: str, limit: int) -> Sequence[Mapping[str, Any]]:
        from google.api_core.retry import Retry
        from google.cloud import firestore

        q = (self.client.collection(collection)
             .order_by("last_seen", direction=firestore.Query.DESCENDING).limit(limit))
        return [snap.to_dict() for snap in q.stream(retry=Retry(timeout=self.timeout_s),
                                                     timeout=self.timeout_s)]

    def snapshots(self, limit: int) -> Sequence[Mapping[str, Any]]:
        return self._recent(COLLECTION_SNAPSHOTS, limit)

    def unmatched(self, limit: int) -> Sequence[Mapping[str, Any]]:
        return self._recent(COLLECTION_UNMATCHED, limit)
