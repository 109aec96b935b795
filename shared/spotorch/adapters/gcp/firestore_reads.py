"""Run, sweep and arrival readers on Firestore queries: newest first, filtered and paged by the
server, through either of Firestore's own interfaces.

The readers ask a source for documents ordered by one field, descending, a batch at a time
with a cursor after the last one (Firestore's automatic single-field index serves that: no
composite index to deploy). Two sources: the google-cloud-firestore client (the api function,
which has it loaded anyway) and Firestore's REST API over urllib (the CLI and the web view: a
`spotorch runs` then imports no gRPC client at all, a third of its time). Both speak to the
real service or to Google's emulator.
"""

from __future__ import annotations

import base64
import json
import os
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from datetime import datetime
from typing import Any, Protocol

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


class Source(Protocol):
    """Documents of Firestore, as the readers need them."""

    def get(self, collection: str, doc_id: str) -> dict[str, Any] | None:
        """The document's fields, None if there is no such document."""
        ...

    def newest(self, collection: str, field: str, *, since: float | None, until: float | None,
               limit: int, after: Any) -> tuple[list[dict[str, Any]], Any]:
        """Up to `limit` documents by `field` descending (since <= field <= until), after the
        cursor `after` (None: from the top); and the cursor after the last one."""
        ...


# ---------------------------------------------------------------- google-cloud-firestore

class ClientSource:
    """The google-cloud-firestore client as a Source."""

    def __init__(self, client: Any, timeout_s: float = READ_TIMEOUT_S) -> None:
        self.client = client
        self.timeout_s = timeout_s

    def _deadline(self) -> dict[str, Any]:
        # Without these the client retries an unreachable Firestore for minutes.
        from google.api_core.retry import Retry

        return {"retry": Retry(timeout=self.timeout_s), "timeout": self.timeout_s}

    def get(self, collection: str, doc_id: str) -> dict[str, Any] | None:
        """Source.get: one document read, with a deadline."""
        snap = self.client.collection(collection).document(doc_id).get(**self._deadline())
        return snap.to_dict() if snap.exists else None

    def newest(self, collection: str, field: str, *, since: float | None, until: float | None,
               limit: int, after: Any) -> tuple[list[dict[str, Any]], Any]:
        """Source.newest: an ordered, bounded query that starts after the cursor document."""
        from google.cloud import firestore
        from google.cloud.firestore_v1.base_query import FieldFilter

        q = self.client.collection(collection)
        if since is not None:
            q = q.where(filter=FieldFilter(field, ">=", since))
        if until is not None:
            q = q.where(filter=FieldFilter(field, "<=", until))
        q = q.order_by(field, direction=firestore.Query.DESCENDING)
        snaps = list((q if after is None else q.start_after(after)).limit(limit)
                     .stream(**self._deadline()))
        return [s.to_dict() for s in snaps], (snaps[-1] if snaps else after)


# ---------------------------------------------------------------- Firestore's REST API

class Forbidden(Exception):
    """HTTP 403 from Firestore (the name describe_store_error knows)."""


class Unauthenticated(Exception):
    """HTTP 401 from Firestore."""


def decode_value(value: Mapping[str, Any]) -> Any:
    """A REST Value as the Python client gives it (timestamps as datetimes, bytes as bytes)."""
    kind, raw = next(iter(value.items())) if value else ("nullValue", None)
    if kind == "mapValue":
        return {k: decode_value(v) for k, v in ((raw or {}).get("fields") or {}).items()}
    if kind == "arrayValue":
        return [decode_value(v) for v in (raw or {}).get("values") or ()]
    converters: Mapping[str, Callable[[Any], Any]] = {
        "nullValue": lambda r: None, "booleanValue": bool, "integerValue": int,
        "doubleValue": float, "stringValue": str, "referenceValue": str,
        "bytesValue": base64.b64decode,
        "timestampValue": lambda r: datetime.fromisoformat(str(r).replace("Z", "+00:00")),
        "geoPointValue": dict}
    return converters[kind](raw)


def decode_document(doc: Mapping[str, Any]) -> dict[str, Any]:
    """A REST Document's fields as the Python client gives them."""
    return {k: decode_value(v) for k, v in (doc.get("fields") or {}).items()}


class RestSource:
    """Firestore's REST API (v1) as a Source: urllib and JSON, an access token from the user's
    Google credentials (none for the emulator)."""

    def __init__(self, project: str, database: str = "(default)", *,
                 emulator: str | None = None, timeout_s: float = READ_TIMEOUT_S,
                 token: Callable[[], str] | None = None) -> None:
        self.project, self.database = project, database
        self.base = (f"http://{emulator}/v1/" if emulator else "https://firestore.googleapis.com/v1/")
        self.root = f"projects/{project}/databases/{database}/documents"
        self.timeout_s = timeout_s
        self._token = token if token is not None else (None if emulator else google_token)

    @classmethod
    def from_environment(cls, project: str, database: str = "(default)") -> RestSource:
        """The emulator when FIRESTORE_EMULATOR_HOST says so (as the Python client decides)."""
        return cls(project, database, emulator=os.environ.get("FIRESTORE_EMULATOR_HOST") or None)

    def _call(self, path: str, body: Mapping[str, Any] | None = None) -> Any:
        request = urllib.request.Request(
            self.base + urllib.parse.quote(path, safe="/:()"),
            data=None if body is None else json.dumps(body).encode(),
            headers={"Content-Type": "application/json"}, method="GET" if body is None else "POST")
        if self._token is not None:
            request.add_header("Authorization", f"Bearer {self._token()}")
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as reply:
                return json.loads(reply.read() or b"null")
        except urllib.error.HTTPError as exc:
            if exc.code == 404 and body is None:
                return None
            detail = _error_message(exc)
            raise {401: Unauthenticated, 403: Forbidden}.get(exc.code, RuntimeError)(
                f"HTTP {exc.code}: {detail}") from None

    def get(self, collection: str, doc_id: str) -> dict[str, Any] | None:
        """Source.get: a GET of the document; None on 404."""
        found = self._call(f"{self.root}/{collection}/{doc_id}")
        return None if found is None else decode_document(found)

    def newest(self, collection: str, field: str, *, since: float | None, until: float | None,
               limit: int, after: Any) -> tuple[list[dict[str, Any]], Any]:
        """Source.newest: a runQuery ordered by the field, the cursor being the last document's values."""
        filters = [{"fieldFilter": {"field": {"fieldPath": field}, "op": op,
                                    "value": {"doubleValue": bound}}}
                   for op, bound in (("GREATER_THAN_OR_EQUAL", since), ("LESS_THAN_OR_EQUAL", until))
                   if bound is not None]
        query: dict[str, Any] = {
            "from": [{"collectionId": collection}],
            "orderBy": [{"field": {"fieldPath": field}, "direction": "DESCENDING"},
                        {"field": {"fieldPath": "__name__"}, "direction": "DESCENDING"}],
            "limit": limit}
        if filters:
            query["where"] = filters[0] if len(filters) == 1 else \
                {"compositeFilter": {"op": "AND", "filters": filters}}
        if after is not None:
            query["startAt"] = {"values": after, "before": False}
        answer = self._call(f"{self.root}:runQuery", {"structuredQuery": query}) or []
        docs = [item["document"] for item in answer if "document" in item]
        cursor = ([docs[-1]["fields"].get(field, {"nullValue": None}),
                   {"referenceValue": docs[-1]["name"]}] if docs else after)
        return [decode_document(d) for d in docs], cursor


def _error_message(exc: urllib.error.HTTPError) -> str:
    try:
        return str(json.loads(exc.read())["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return str(exc.reason)


def google_token() -> str:
    """An OAuth access token from the user's Application Default Credentials."""
    import google.auth
    from google.auth.transport.requests import Request

    credentials, _ = google.auth.default(scopes=["https://www.googleapis.com/auth/datastore"])
    credentials.refresh(Request())
    return str(credentials.token)


# ---------------------------------------------------------------- the readers

def as_source(client: Any, timeout_s: float) -> Source:
    """A Source as given, or the google-cloud-firestore client wrapped as one."""
    return client if isinstance(client, RestSource | ClientSource) else ClientSource(client,
                                                                                     timeout_s)


class _NewestFirst:
    """Documents of one collection newest first by `created_at`, read only as far as a page
    needs; status and pipeline are filtered here."""

    def __init__(self, client: Any, collection: str, timeout_s: float) -> None:
        self.source = as_source(client, timeout_s)
        self.collection = collection

    def _get(self, doc_id: str) -> dict[str, Any] | None:
        return self.source.get(self.collection, doc_id)

    def _stream(self, since: float | None, page_token: str | None,
                batch: int) -> Iterator[dict[str, Any]]:
        until = decode_token(page_token)[0] if page_token else None
        cursor = None
        while True:
            docs, cursor = self.source.newest(self.collection, "created_at", since=since,
                                              until=until, limit=batch, after=cursor)
            yield from docs
            if len(docs) < batch:
                return


class FirestoreRunReader(_NewestFirst):
    """Reads runs from Firestore newest first (a google-cloud-firestore client or a Source)."""

    def __init__(self, client: Any, collection: str = COLLECTION_RUNS,
                 timeout_s: float = READ_TIMEOUT_S) -> None:
        super().__init__(client, collection, timeout_s)

    def get(self, run_id: str) -> Run | None:
        """RunReader.get: the run document, None if absent."""
        doc = self._get(run_id)
        return None if doc is None else Run.from_dict(doc)

    def list(self, query: RunQuery) -> RunPage:
        """RunReader.list: created_at descending from the server, the other filters and the page here."""
        runs = (Run.from_dict(d) for d in self._stream(query.since, query.page_token,
                                                      batch_size(query)))
        return page_of(ties_sorted(runs), query)


class FirestoreSweepReader(_NewestFirst):
    """Reads sweeps from Firestore newest first (a google-cloud-firestore client or a Source)."""

    def __init__(self, client: Any, collection: str = COLLECTION_SWEEPS,
                 timeout_s: float = READ_TIMEOUT_S) -> None:
        super().__init__(client, collection, timeout_s)

    def get(self, sweep_id: str) -> Sweep | None:
        """SweepReader.get: the sweep document, None if absent."""
        doc = self._get(sweep_id)
        return None if doc is None else Sweep.from_dict(doc)

    def list(self, query: SweepQuery) -> SweepPage:
        """SweepReader.list: created_at descending from the server, the other filters and the page here."""
        sweeps = (Sweep.from_dict(d) for d in self._stream(query.since, query.page_token,
                                                          batch_size(query)))
        return sweep_page_of(ties_sorted(sweeps), query)


class FirestoreArrivalReader:
    """Snapshot and unmatched-upload documents, most recently active first (one query on
    `last_seen`)."""

    def __init__(self, client: Any, timeout_s: float = READ_TIMEOUT_S) -> None:
        self.source = as_source(client, timeout_s)

    def _recent(self, collection: str, limit: int) -> Sequence[Mapping[str, Any]]:
        docs, _ = self.source.newest(collection, "last_seen", since=None, until=None,
                                     limit=limit, after=None)
        return docs

    def snapshots(self, limit: int) -> Sequence[Mapping[str, Any]]:
        """ArrivalReader.snapshots: the snapshot documents most recently active first."""
        return self._recent(COLLECTION_SNAPSHOTS, limit)

    def unmatched(self, limit: int) -> Sequence[Mapping[str, Any]]:
        """ArrivalReader.unmatched: the unmatched-upload records most recently active first."""
        return self._recent(COLLECTION_UNMATCHED, limit)

    def signals(self, limit: int) -> tuple[Sequence[Mapping[str, Any]],
                                           Sequence[Mapping[str, Any]]]:
        """The newest alert deliveries (the notification ledger, by claim time) and the newest
        recorded delivery failures (what `spotorch dead-letters` names), at most `limit` each."""
        from spotorch.settings import COLLECTION_FAILURES, COLLECTION_NOTIFICATIONS

        sent, _ = self.source.newest(COLLECTION_NOTIFICATIONS, "claimed_at", since=None,
                                     until=None, limit=limit, after=None)
        failed, _ = self.source.newest(COLLECTION_FAILURES, "at", since=None, until=None,
                                       limit=limit, after=None)
        return sent, failed
