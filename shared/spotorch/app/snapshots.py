"""Data arrival: matching objects gather into snapshots; each complete snapshot is reported once.

One document per (pipeline, snapshot) in COLLECTION_SNAPSHOTS holds the state; every change is
docs.get -> a pure decision -> docs.put(version), retried on ConflictError, so duplicated,
reordered and concurrent deliveries of both event forms converge on one SnapshotReady. Handled
event ids are remembered in COLLECTION_DEDUPE (with `expires_at` for a Firestore TTL policy).
See docs/pipelines.md for the batch modes and the snapshot cycle rules.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from types import MappingProxyType
from typing import Any

from spotorch.app import updates
from spotorch.core.errors import InvalidEvent, SpotorchError
from spotorch.core.pipeline import BatchMode, Pipeline
from spotorch.core.triggers import Match, ObjectEvent, ObjectEventKind, match, skip_reason, split_gs_uri
from spotorch.ports.storage import ObjectInfo, ObjectNotFound, ObjectStore
from spotorch.ports.store import ConflictError, DocumentStore
from spotorch.settings import COLLECTION_DEDUPE, COLLECTION_SNAPSHOTS

DEDUPE_TTL_S = 7 * 24 * 3600.0  # a redelivery later than this is handled again (harmlessly)
WRITE_ATTEMPTS = 6  # conditional writes per change before giving up (the event is redelivered)
BACKOFF_S = 0.02  # first pause after a conflict; doubles, with full jitter
REDISPATCH_AFTER_S = 120.0  # a completed snapshot no run has claimed by then is reported again
REDISPATCH_LIMIT = 3
MAX_TRACKED_BYTES = 400_000  # object names kept per snapshot document (Firestore's limit: 1 MiB)
MAX_MANIFEST_BYTES = 1 << 20
SNAPSHOT_ID_HEX = 16
STATE_FORMAT = 1

log = logging.getLogger("spotorch.app.snapshots")


class IntakeError(SpotorchError):
    """Base of the intake's errors."""


class ManifestError(IntakeError, InvalidEvent):
    """A manifest marker that cannot be used: acknowledge and record the event, never retry it."""


class InvalidSubmit(IntakeError, ValueError):
    """A manual submit that cannot start a run."""


# --- the snapshot that is reported --------------------------------------------------------------


@dataclass(frozen=True)
class SnapshotReady:
    """A complete data snapshot: the service starts exactly one run for it (run_id_for)."""

    pipeline: str
    snapshot_id: str
    data_uri: str  # gs://bucket/folder/ (each_object: the object itself)
    objects: tuple[str, ...] = ()  # object names, sorted
    generations: tuple[int, ...] = ()  # one per object
    completed_at: float = 0.0
    manual: bool = False
    request_id: str = ""
    overrides: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}), hash=False)
    # A BigQuery snapshot's map (spotorch.app.table_intake), carried into the run's provenance.
    bigquery: Mapping[str, Any] | None = field(default=None, hash=False)


def snapshot_id_of(pipeline: str, bucket: str, key: str,
                   objects: Sequence[tuple[str, int]]) -> str:
    """Stable id of a snapshot: a digest of where it is and of its objects' names, generations."""
    canonical = json.dumps([pipeline, bucket, key, sorted([n, g] for n, g in objects)],
                           separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:SNAPSHOT_ID_HEX]


_RUN_ID_SAFE = re.compile(r"[a-z][a-z0-9-]*")
_SNAPSHOT_ID_SAFE = re.compile(r"[0-9a-f]{8,32}")


def run_id_for(pipeline: str, snapshot_id: str) -> str:
    """Deterministic run id of a snapshot: lowercase letters, digits and dashes, at most 63 chars,
    starting with a letter (a valid Vertex AI label value and Firestore document id)."""
    if (_RUN_ID_SAFE.fullmatch(pipeline) and not pipeline.endswith("-")
            and _SNAPSHOT_ID_SAFE.fullmatch(snapshot_id)
            and len(pipeline) + 1 + len(snapshot_id) <= 63):
        return f"{pipeline}-{snapshot_id}"  # the common case: readable, and unambiguous
    digest = hashlib.sha256(f"{pipeline}\n{snapshot_id}".encode()).hexdigest()[:SNAPSHOT_ID_HEX]
    slug = re.sub(r"[^a-z0-9]+", "-", pipeline.lower()).strip("-")
    slug = slug if slug[:1].isalpha() else f"r-{slug}".rstrip("-")
    return f"{slug[:63 - 1 - len(digest)].rstrip('-')}-{digest}"


def manual_snapshot(pipeline: Pipeline | str, data_uri: str, *, request_id: str = "",
                    overrides: Mapping[str, Any] | None = None, now: float) -> SnapshotReady:
    """A snapshot submitted by hand (CLI/API); the same pipeline, URI and request id give the same
    id, so a retried submit starts no second run. Overrides do not change the id."""
    name = pipeline if isinstance(pipeline, str) else pipeline.name
    if not (data_uri.startswith("gs://") and split_gs_uri(data_uri)[0]) \
            and not data_uri.startswith("/"):
        raise InvalidSubmit(f"data_uri must be gs://bucket/path (or an absolute local path): "
                            f"{data_uri!r}")
    if len(request_id) > 200:
        raise InvalidSubmit("request_id is longer than 200 characters")
    canonical = json.dumps(["manual", name, data_uri, request_id], separators=(",", ":"))
    return SnapshotReady(
        pipeline=name,
        snapshot_id=hashlib.sha256(canonical.encode()).hexdigest()[:SNAPSHOT_ID_HEX],
        data_uri=data_uri, completed_at=now, manual=True, request_id=request_id,
        overrides=MappingProxyType(dict(overrides or {})))


# --- reading manifests --------------------------------------------------------------------------


def parse_manifest(content: bytes, *, bucket: str, folder: str, marker: str) -> tuple[str, ...]:
    """Object names a manifest lists, sorted: JSON (a list, or {"objects": [...]}) or one per line
    ('#' comments); each entry relative to the snapshot folder, or gs://bucket/name inside it."""
    if len(content) > MAX_MANIFEST_BYTES:
        raise ManifestError(f"manifest larger than {MAX_MANIFEST_BYTES} bytes")
    try:
        text = content.decode("utf-8").strip()
    except UnicodeDecodeError:
        raise ManifestError("manifest is not UTF-8 text") from None
    if text[:1] in ("[", "{"):
        try:
            parsed = json.loads(text)
        except ValueError as exc:
            raise ManifestError(f"manifest is not valid JSON: {exc}") from None
        entries = parsed.get("objects") if isinstance(parsed, dict) else parsed
        if not isinstance(entries, list) or not all(isinstance(e, str) for e in entries):
            raise ManifestError('a JSON manifest is a list of names or {"objects": [names]}')
    else:
        entries = [line.strip() for line in text.splitlines()]
        entries = [e for e in entries if e and not e.startswith("#")]
    names = set()
    for entry in entries:
        name = entry
        if entry.startswith("gs://"):
            entry_bucket, _, name = entry[len("gs://"):].partition("/")
            if entry_bucket != bucket or not name.startswith(folder):
                raise ManifestError(f"manifest entry {entry!r} is not inside gs://{bucket}/{folder}")
        else:
            if entry.startswith("/") or ".." in entry.split("/"):
                raise ManifestError(f"manifest entry {entry!r} must be relative to the folder")
            name = folder + entry
        if name == folder + marker or name.endswith("/"):
            raise ManifestError(f"manifest entry {entry!r} is the marker or a folder")
        names.add(name)
    if not names:
        raise ManifestError("manifest lists no objects")
    if sum(_size(n) for n in names) > MAX_TRACKED_BYTES // 2:
        raise ManifestError(f"manifest lists {len(names)} objects, more than one snapshot "
                            "document can track: split the snapshot into folders")
    return tuple(sorted(names))


# --- snapshot state (pure) ----------------------------------------------------------------------


def _size(name: str) -> int:
    """Bytes an object's entry takes in a snapshot document, roughly."""
    return len(name.encode()) + 48


@dataclass(frozen=True)
class Entry:
    """The newest generation seen of one object, and the cycle it joined."""

    name: str
    generation: int
    cycle: int


@dataclass(frozen=True)
class SnapshotState:
    """Everything known about one snapshot folder of one pipeline, across its cycles."""

    pipeline: str
    bucket: str
    key: str  # folder ending in '/', or the object name (each_object)
    batch: str
    cycle: int = 0  # the current cycle; 0 before the first object
    open: bool = False  # the current cycle is gathering objects and has not completed
    entries: tuple[Entry, ...] = ()
    expected: tuple[str, ...] | None = None  # manifest: the current cycle's object names
    first_seen: float | None = None  # of the current cycle
    last_seen: float | None = None
    completed_at: float | None = None
    snapshot_id: str | None = None  # of the last completed cycle
    ready: tuple[tuple[str, int], ...] = ()  # its objects, kept until a run has claimed it
    pending_dispatch: bool = False  # completed, and no run is known to have claimed it yet
    dispatched_at: float | None = None  # last time it was (re)reported
    redispatches: int = 0
    truncated: bool = False  # objects were left out of `entries` to keep the document small
    # batch: marker (no manifest): names of the current cycle's data objects seen before its
    # marker (at most EARLY_SAMPLE; the marker alone makes the snapshot, so none is tracked)
    early: tuple[str, ...] = ()
    started: str | None = None  # the run (or sweep) that took the last completed cycle
    # A BigQuery snapshot's export (spotorch.app.table_intake): tables, snapshot_time,
    # snapshot_tables, export_uris, objects; None for a Cloud Storage snapshot.
    bigquery: Mapping[str, Any] | None = None

    @property
    def data_uri(self) -> str:
        """The snapshot's folder as a gs:// URI."""
        return f"gs://{self.bucket}/{self.key}"

    def entry(self, name: str) -> Entry | None:
        """The object of this name in the snapshot, None if it is not there."""
        return next((e for e in self.entries if e.name == name), None)

    def members(self) -> tuple[tuple[str, int], ...]:
        """Objects of the current cycle."""
        return tuple((e.name, e.generation) for e in self.entries if e.cycle == self.cycle)

    def with_entry(self, new: Entry) -> SnapshotState:
        """Record an object, unless a new name would outgrow the document (then: truncated)."""
        kept = tuple(e for e in self.entries if e.name != new.name)
        if len(kept) == len(self.entries) and \
                sum(_size(e.name) for e in kept) + _size(new.name) > MAX_TRACKED_BYTES:
            return replace(self, truncated=True)
        return replace(self, entries=(*kept, new))

    def to_doc(self) -> dict[str, Any]:
        """The snapshot's Firestore document."""
        # Objects as a list of maps, not a {name: generation} map: Firestore map keys are field
        # paths in some calls and reserve names like __init__.py.
        return {
            "format": STATE_FORMAT, "pipeline": self.pipeline, "bucket": self.bucket,
            "key": self.key, "data_uri": self.data_uri, "batch": self.batch, "cycle": self.cycle,
            "open": self.open,
            "objects": [{"name": e.name, "generation": e.generation, "cycle": e.cycle}
                        for e in self.entries],
            "expected": None if self.expected is None else list(self.expected),
            "first_seen": self.first_seen, "last_seen": self.last_seen,
            "completed_at": self.completed_at, "snapshot_id": self.snapshot_id,
            "ready": [{"name": n, "generation": g} for n, g in self.ready],
            "pending_dispatch": self.pending_dispatch, "dispatched_at": self.dispatched_at,
            "redispatches": self.redispatches, "truncated": self.truncated,
            "early": list(self.early), "started": self.started,
            **({} if self.bigquery is None else {"bigquery": dict(self.bigquery)}),
        }

    @classmethod
    def from_doc(cls, doc: Mapping[str, Any]) -> SnapshotState:
        """The snapshot state a stored document holds (the inverse of to_doc)."""
        expected = doc.get("expected")
        return cls(
            pipeline=str(doc["pipeline"]), bucket=str(doc["bucket"]), key=str(doc["key"]),
            batch=str(doc.get("batch", "")), cycle=int(doc.get("cycle", 0)),
            open=bool(doc.get("open", False)),
            entries=tuple(Entry(str(o["name"]), int(o["generation"]), int(o["cycle"]))
                          for o in doc.get("objects") or ()),
            expected=None if expected is None else tuple(str(n) for n in expected),
            first_seen=doc.get("first_seen"), last_seen=doc.get("last_seen"),
            completed_at=doc.get("completed_at"), snapshot_id=doc.get("snapshot_id"),
            ready=tuple((str(o["name"]), int(o["generation"])) for o in doc.get("ready") or ()),
            pending_dispatch=bool(doc.get("pending_dispatch", False)),
            dispatched_at=doc.get("dispatched_at"), redispatches=int(doc.get("redispatches", 0)),
            truncated=bool(doc.get("truncated", False)),
            early=tuple(str(n) for n in doc.get("early") or ()),
            started=doc.get("started"),
            bigquery=doc.get("bigquery"),
        )


@dataclass(frozen=True)
class Arrival:
    """A matching object generation, as the decisions see it."""

    name: str
    generation: int
    is_marker: bool


@dataclass(frozen=True)
class Outcome:
    """A decision: the state to write (None: no change), the snapshot it completes, and why."""

    state: SnapshotState | None
    ready: SnapshotReady | None = None
    note: str = ""


def _ready(state: SnapshotState) -> SnapshotReady:
    return SnapshotReady(
        pipeline=state.pipeline, snapshot_id=state.snapshot_id or "", data_uri=state.data_uri,
        objects=tuple(n for n, _ in state.ready), generations=tuple(g for _, g in state.ready),
        completed_at=state.completed_at or 0.0, bigquery=state.bigquery)


def _complete(state: SnapshotState, objects: Sequence[tuple[str, int]], now: float,
              note: str) -> Outcome:
    pairs = tuple(sorted(objects))
    done = replace(state, open=False, completed_at=now, ready=pairs, pending_dispatch=True,
                   dispatched_at=now, redispatches=0, early=(), started=None,
                   snapshot_id=snapshot_id_of(state.pipeline, state.bucket, state.key, pairs))
    return Outcome(done, _ready(done), note)


def _unchanged(note: str) -> Outcome:
    return Outcome(None, None, note)


def decide_single(state: SnapshotState, arrival: Arrival, now: float) -> Outcome:
    """each_object, and the marker of batch: marker: a new generation is a complete snapshot."""
    current = state.entry(arrival.name)
    if current is not None and current.generation >= arrival.generation:
        return _unchanged("duplicate or older generation")
    cycle = state.cycle + 1
    grown = replace(state.with_entry(Entry(arrival.name, arrival.generation, cycle)),
                    cycle=cycle, first_seen=now, last_seen=now)
    return _complete(grown, [(arrival.name, arrival.generation)], now, "new generation")


def decide_gather(state: SnapshotState, arrival: Arrival, now: float,
                  min_objects: int | None) -> Outcome:
    """quiet_period and min_objects: objects join the open cycle; after completion only a new
    generation of one of its objects opens the next cycle, other newcomers are late."""
    current = state.entry(arrival.name)
    if current is not None and current.generation >= arrival.generation:
        return _unchanged("duplicate or older generation")
    if not state.open:
        if state.cycle > 0 and current is None:
            return _unchanged("late: the snapshot already completed")
        state = replace(state, cycle=state.cycle + 1, open=True, first_seen=now)
    grown = replace(state.with_entry(Entry(arrival.name, arrival.generation, state.cycle)),
                    last_seen=now)
    members = grown.members()
    if min_objects is not None and len(members) >= min_objects:
        return _complete(grown, members, now, f"{len(members)} objects")
    return Outcome(grown, None, "gathering")


def decide_manifest(state: SnapshotState, arrival: Arrival, now: float,
                    expected: tuple[str, ...] | None, marker: str) -> Outcome:
    """marker with manifest: every object is recorded (it may belong to the next manifest); a new
    marker generation opens a cycle that completes once every listed object has arrived."""
    current = state.entry(arrival.name)
    if current is not None and current.generation >= arrival.generation:
        return _unchanged("duplicate or older generation")
    if arrival.is_marker:
        if expected is None:
            raise ValueError("a manifest marker needs its manifest")
        cycle = state.cycle + 1
        grown = replace(state.with_entry(Entry(arrival.name, arrival.generation, cycle)),
                        cycle=cycle, open=True, expected=expected, first_seen=now, last_seen=now)
    else:
        grown = replace(state.with_entry(Entry(arrival.name, arrival.generation, state.cycle)),
                        last_seen=now)
    if not grown.open or grown.expected is None:
        return Outcome(grown, None, "waiting for the marker")
    seen = {e.name: e.generation for e in grown.entries}
    missing = [n for n in grown.expected if n not in seen]
    if missing:
        return Outcome(grown, None, f"waiting for {len(missing)} listed objects")
    objects = [(n, seen[n]) for n in grown.expected] + \
        ([(marker, seen[marker])] if marker in seen else [])
    return _complete(grown, objects, now, "every listed object arrived")


def decide_close(state: SnapshotState | None, quiet_period_s: float, now: float) -> Outcome:
    """quiet_period: complete the open cycle once nothing new arrived for the quiet period."""
    if state is None or not state.open or state.last_seen is None:
        return _unchanged("not open")
    if state.last_seen + quiet_period_s > now:
        return _unchanged("not quiet yet")
    members = state.members()
    return _complete(state, members, now, "quiet") if members else _unchanged("empty")


def decide_dispatched(state: SnapshotState | None, snapshot_id: str,
                      started: str | None = None) -> Outcome:
    """A run claimed the snapshot: forget the copy kept for repairs, remember which run."""
    if state is None or not state.pending_dispatch or state.snapshot_id != snapshot_id:
        return _unchanged("nothing pending")
    return Outcome(replace(state, pending_dispatch=False, ready=(), started=started), None,
                   "dispatched")


EARLY_SAMPLE = 5  # data objects named per marker folder waiting for its marker
EARLY_REFRESH_S = 30.0  # beyond the sample, last_seen is written at most this often


def decide_early(state: SnapshotState, name: str, object_time: float | None,
                 now: float) -> Outcome:
    """batch: marker (no manifest): a data object before its marker opens the folder's cycle,
    so the folder shows as waiting for its marker; written only when that is news."""
    if not state.open:
        if state.completed_at is not None and (object_time is None
                                               or object_time <= state.completed_at):
            return _unchanged("part of the completed snapshot")
        return Outcome(replace(state, open=True, first_seen=now, last_seen=now, early=(name,)),
                       None, "waiting for the marker")
    if name not in state.early and len(state.early) < EARLY_SAMPLE:
        return Outcome(replace(state, early=(*state.early, name), last_seen=now), None,
                       "waiting for the marker")
    if now - (state.last_seen or 0.0) < EARLY_REFRESH_S:
        return _unchanged("already waiting for the marker")
    return Outcome(replace(state, last_seen=now), None, "still waiting for the marker")


def decide_repair(state: SnapshotState | None, snapshot_id: str, run_exists: bool,
                  now: float) -> Outcome:
    """A completed snapshot nobody confirmed: report it again, unless its run exists or we tried
    enough (the report may have been lost in a crash between completion and the run's creation)."""
    if state is None or not state.pending_dispatch or state.snapshot_id != snapshot_id:
        return _unchanged("nothing pending")
    if run_exists or state.redispatches >= REDISPATCH_LIMIT:
        note = "its run exists" if run_exists else "gave up reporting it again"
        return Outcome(replace(state, pending_dispatch=False, ready=()), None, note)
    if (state.dispatched_at or 0.0) + REDISPATCH_AFTER_S > now:
        return _unchanged("reported recently")
    again = replace(state, dispatched_at=now, redispatches=state.redispatches + 1)
    return Outcome(again, _ready(again), "reported again")


# --- the store side -----------------------------------------------------------------------------


def snapshot_doc_key(pipeline: str, bucket: str, key: str) -> str:
    """Document id of a snapshot folder: the pipeline, then a digest of where (ids hold no '/')."""
    safe = re.sub(r"[^A-Za-z0-9_-]", "-", pipeline)[:100]
    where = hashlib.sha256(f"{bucket}\n{key}".encode()).hexdigest()[:32]
    return f"{safe}-{where}"


def dedupe_key(source: str, event_id: str) -> str:
    """Document id in COLLECTION_DEDUPE of one handled event of a source ("gcs", "bq")."""
    return f"{source}-{hashlib.sha256(event_id.encode()).hexdigest()[:40]}"


def handled_before(docs: DocumentStore, key: str) -> bool:
    """Whether the event of this dedupe key was handled (a redelivery changes nothing)."""
    return docs.get(COLLECTION_DEDUPE, key)[0] is not None


def remember_handled(docs: DocumentStore, key: str, record: Mapping[str, Any],
                     now: float) -> None:
    """Record a handled event (expiring after DEDUPE_TTL_S: Firestore's TTL policy)."""
    doc = {**record, "handled_at": now,
           "expires_at": datetime.fromtimestamp(now + DEDUPE_TTL_S, UTC)}
    # A concurrent redelivery may have recorded it first; the writes it made were idempotent.
    with contextlib.suppress(ConflictError):
        docs.put(COLLECTION_DEDUPE, key, doc, None)


def conditional_update(docs: DocumentStore, collection: str, doc_key: str,
                       decide: Callable[[Mapping[str, Any] | None], Mapping[str, Any] | None]
                       ) -> Mapping[str, Any] | None:
    """get -> decide -> conditional put (the document's version): app.updates' loop, on one
    document of a collection; the document written, or None when decide changed nothing. The
    last ConflictError propagates (the caller's event is redelivered, or the next tick tries)."""
    written = updates.conditional_update(
        lambda: docs.get(collection, doc_key), decide,
        lambda new, version: docs.put(collection, doc_key, new, version),
        what=f"{collection}/{doc_key}", attempts=WRITE_ATTEMPTS, backoff_s=BACKOFF_S)
    return None if written is None else written.doc


def _update(docs: DocumentStore, doc_key: str,
            decide: Callable[[SnapshotState | None], Outcome]) -> Outcome:
    """A snapshot's conditional_update; the outcome of the decision that was written (or the
    last one, when it changed nothing)."""
    outcomes: list[Outcome] = []

    def decided(raw: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
        outcomes.append(decide(None if raw is None else SnapshotState.from_doc(raw)))
        state = outcomes[-1].state
        return None if state is None else state.to_doc()
    conditional_update(docs, COLLECTION_SNAPSHOTS, doc_key, decided)
    return outcomes[-1]


def listed_objects(objects: ObjectStore, bucket: str, prefix: str,
                   page_size: int = 1000) -> tuple[tuple[str, int], ...]:
    """Every live object (name, generation) under a prefix, sorted."""
    out: list[tuple[str, int]] = []
    token: str | None = None
    while True:
        page = objects.list_page(bucket, prefix, token, page_size)
        out += [(o.name, o.generation) for o in page.objects]
        token = page.next_page_token
        if token is None:
            return tuple(sorted(out))


def _stateful(found: Match) -> bool:
    """Whether an object changes snapshot state; a plain marker pipeline only watches its marker."""
    trigger = found.pipeline.trigger
    return not (trigger.batch is BatchMode.MARKER and not trigger.manifest and not found.is_marker)


def _read_manifest(found: Match, event: ObjectEvent,
                   reader: ObjectStore) -> tuple[str, ...] | None:
    """The manifest's names; None when that marker generation is gone (a newer one will come)."""
    try:
        content = reader.read(event.bucket, event.name, event.generation, MAX_MANIFEST_BYTES + 1)
    except ObjectNotFound:
        return None
    trigger = found.pipeline.trigger
    try:
        names = parse_manifest(content, bucket=event.bucket, folder=found.snapshot_key,
                               marker=trigger.marker)
    except ManifestError as exc:
        raise ManifestError(f"{event.uri}: {exc.reason}", event_id=event.event_id) from None
    for name in names:
        probe = replace(event, name=name, kind=ObjectEventKind.FINALIZE)
        why = skip_reason(found.pipeline, probe)
        if why is not None:
            raise ManifestError(f"{event.uri}: lists {name}, which pipeline "
                                f"{found.pipeline.name} never watches ({why})",
                                event_id=event.event_id)
    return names


def _apply(found: Match, event: ObjectEvent, docs: DocumentStore, now: float,
           reader: ObjectStore) -> SnapshotReady | None:
    pipeline, trigger = found.pipeline, found.pipeline.trigger
    expected: tuple[str, ...] | None = None
    if trigger.batch is BatchMode.MARKER and trigger.manifest and found.is_marker:
        expected = _read_manifest(found, event, reader)
        if expected is None:
            return None
    arrival = Arrival(event.name, event.generation, found.is_marker)
    fresh = SnapshotState(pipeline.name, found.bucket, found.snapshot_key, trigger.batch.value)
    marker = found.snapshot_key + trigger.marker
    deciders: Mapping[BatchMode, Callable[[SnapshotState], Outcome]] = {
        BatchMode.EACH_OBJECT: lambda s: decide_single(s, arrival, now),
        BatchMode.MARKER: (lambda s: decide_manifest(s, arrival, now, expected, marker))
        if trigger.manifest else (lambda s: decide_single(s, arrival, now)),
        BatchMode.QUIET_PERIOD: lambda s: decide_gather(s, arrival, now, None),
        BatchMode.MIN_OBJECTS: lambda s: decide_gather(s, arrival, now, trigger.min_objects),
    }
    decide = deciders[trigger.batch]
    return _update(docs, snapshot_doc_key(pipeline.name, found.bucket, found.snapshot_key),
                   lambda s: decide(s or fresh)).ready


def _note_early(found: Match, event: ObjectEvent, docs: DocumentStore, now: float) -> None:
    """A plain marker pipeline's data object: its folder waits for the marker (shown to people)."""
    trigger = found.pipeline.trigger
    fresh = SnapshotState(found.pipeline.name, found.bucket, found.snapshot_key,
                          trigger.batch.value)
    _update(docs, snapshot_doc_key(found.pipeline.name, found.bucket, found.snapshot_key),
            lambda s: decide_early(s or fresh, event.name, event.time, now))


def handle_object_event(event: ObjectEvent, *, pipelines: Sequence[Pipeline], docs: DocumentStore,
                        now: float, reader: ObjectStore) -> list[SnapshotReady]:
    """Feed one object event to every pipeline it matches; the snapshots it completes, each once.

    Events that match nothing cost no document access (spotorch.app.unmatched records them). A
    plain marker pipeline's data objects cost a read each, and a write when their folder's
    waiting state is news. A redelivered event id is skipped. A ConflictError after
    WRITE_ATTEMPTS propagates: let the event be redelivered. A bad manifest raises ManifestError
    (an InvalidEvent). reader reads manifests.
    """
    matched = [m for m in (match(p, event) for p in pipelines) if m is not None]
    for early in (m for m in matched if not _stateful(m)):
        _note_early(early, event, docs, now)
    found = [m for m in matched if _stateful(m)]
    if not found:
        return []
    dedupe = dedupe_key("gcs", event.event_id)
    if handled_before(docs, dedupe):
        return []
    ready = [r for m in found if (r := _apply(m, event, docs, now, reader)) is not None]
    remember_handled(docs, dedupe, {"event_id": event.event_id, "source": "gcs",
                                    "object": event.uri, "generation": event.generation}, now)
    return ready


def close_due_snapshots(*, pipelines: Sequence[Pipeline], docs: DocumentStore,
                        now: float, run_exists: Callable[[str], bool]) -> list[SnapshotReady]:
    """The tick: complete quiet_period snapshots whose quiet period has passed, and report again
    completed snapshots no run has claimed after REDISPATCH_AFTER_S (lost in a crash)."""
    by_name = {p.name: p for p in pipelines}
    out: list[SnapshotReady] = []
    for raw in docs.query(COLLECTION_SNAPSHOTS, "open", True):
        state = SnapshotState.from_doc(raw)
        pipeline = by_name.get(state.pipeline)
        if pipeline is None or pipeline.trigger.batch is not BatchMode.QUIET_PERIOD \
                or decide_close(state, pipeline.trigger.quiet_period_s, now).ready is None:
            continue
        quiet = pipeline.trigger.quiet_period_s
        # _tick_update calls the decision before the loop moves on: no late-binding surprise.
        out += _tick_update(docs, state, lambda s: decide_close(s, quiet, now))  # noqa: B023
    for raw in docs.query(COLLECTION_SNAPSHOTS, "pending_dispatch", True):
        state = SnapshotState.from_doc(raw)
        sid = state.snapshot_id or ""
        if state.pipeline not in by_name or decide_repair(state, sid, False, now).state is None:
            continue
        exists = run_exists(run_id_for(state.pipeline, sid))
        out += _tick_update(docs, state,
                            lambda s: decide_repair(s, sid, exists, now))  # noqa: B023
    return out


def _tick_update(docs: DocumentStore, state: SnapshotState,
                 decide: Callable[[SnapshotState | None], Outcome]) -> list[SnapshotReady]:
    """One snapshot's change on the tick; under contention it waits for the next tick."""
    try:
        outcome = _update(docs, snapshot_doc_key(state.pipeline, state.bucket, state.key), decide)
    except ConflictError:
        log.warning("snapshot %s of %s is contended; the next tick tries again",
                    state.data_uri, state.pipeline)
        return []
    return [outcome.ready] if outcome.ready else []


def mark_dispatched(ready: SnapshotReady, *, docs: DocumentStore,
                    started: str | None = None) -> None:
    """The service took the snapshot (started, queued or skipped its run: `started` names the
    run or sweep, None when skipped): stop guarding it."""
    if ready.manual or not ready.data_uri.startswith("gs://"):
        return
    bucket, _, key = ready.data_uri[len("gs://"):].partition("/")
    _update(docs, snapshot_doc_key(ready.pipeline, bucket, key),
            lambda s: decide_dispatched(s, ready.snapshot_id, started))


# --- what events miss: listing -------------------------------------------------------------------


def landing_prefixes(pipelines: Sequence[Pipeline]) -> tuple[tuple[str, str], ...]:
    """(bucket, prefix) of every trigger, each once: what the reconcile lists."""
    return tuple(sorted({(p.trigger.bucket, p.trigger.prefix) for p in pipelines
                         if p.trigger.bigquery is None}))


def listed_event(info: ObjectInfo) -> ObjectEvent:
    """A listed object as the finalize event it once had (its id names the generation)."""
    return ObjectEvent(event_id=f"listing:{info.bucket}/{info.name}#{info.generation}"[:1400],
                       kind=ObjectEventKind.FINALIZE, bucket=info.bucket, name=info.name,
                       generation=info.generation, size=info.size, time=info.updated)
