"""Batching and dedupe: objects become snapshots, each reported once, whatever the delivery."""

from __future__ import annotations

import base64
import contextlib
import random
import re
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spotorch.adapters.memory.twins import InMemoryDocumentStore, InMemoryObjectStore
from spotorch.app import snapshots as intake
from spotorch.app.snapshots import (
    REDISPATCH_AFTER_S,
    REDISPATCH_LIMIT,
    InvalidSubmit,
    ManifestError,
    SnapshotReady,
    close_due_snapshots,
    handle_object_event,
    manual_snapshot,
    mark_dispatched,
    run_id_for,
    snapshot_id_of,
)
from spotorch.core.errors import InvalidEvent
from spotorch.core.pipeline import BatchMode, JobTemplate, Pipeline, Trigger
from spotorch.core.triggers import ObjectEvent, ObjectEventKind
from spotorch.entrypoints.storage_events import parse_object_event
from spotorch.ports.store import AddTo, ConflictError, DocumentStore
from spotorch.settings import COLLECTION_DEDUPE, COLLECTION_RUNS, COLLECTION_SNAPSHOTS
from test_triggers import BUCKET, eventarc, notification


def runs_in(docs: DocumentStore) -> Callable[[str], bool]:
    """Whether a run exists, read from the runs collection (as the service's RunStore does)."""
    return lambda run_id: docs.get(COLLECTION_RUNS, run_id)[0] is not None

T0 = 1_800_000_000.0
FOLDER = "data/b1/"


def make_pipeline(batch: BatchMode, name: str = "p", **trigger: Any) -> Pipeline:
    settings_: dict[str, Any] = {"bucket": BUCKET, "prefix": "data/", "batch": batch, **trigger}
    return Pipeline(name=name, trigger=Trigger(**settings_), job=JobTemplate(),
                    checkpoint_uri="gs://ckpt/p", output_uri="gs://models/p")


_ids = iter(range(10**9))


def obj(name: str, generation: int = 1, kind: str = ObjectEventKind.FINALIZE,
        event_id: str | None = None) -> ObjectEvent:
    return ObjectEvent(event_id or f"ev-{next(_ids)}", kind, BUCKET, name, generation)


class Intake:
    """One pipeline set on one store, handling events at a settable time."""

    def __init__(self, *pipelines: Pipeline, docs: DocumentStore | None = None,
                 reader: InMemoryObjectStore | None = None) -> None:
        self.pipelines = pipelines
        self.docs = docs if docs is not None else InMemoryDocumentStore()
        self.reader = reader or InMemoryObjectStore()
        self.now = T0

    def handle(self, event: ObjectEvent) -> list[SnapshotReady]:
        return handle_object_event(event, pipelines=self.pipelines, docs=self.docs,
                                   now=self.now, reader=self.reader)

    def tick(self) -> list[SnapshotReady]:
        return close_due_snapshots(pipelines=self.pipelines, docs=self.docs, now=self.now,
                                   run_exists=runs_in(self.docs))

    def manifest(self, name: str, generation: int, lines: Sequence[str]) -> ObjectEvent:
        self.reader.put(BUCKET, name, generation, "\n".join(lines).encode())
        return obj(name, generation)


# --- each batch mode ------------------------------------------------------------------------------


def test_each_object_is_its_own_snapshot() -> None:
    it = Intake(make_pipeline(BatchMode.EACH_OBJECT))
    [a] = it.handle(obj("data/a.csv", 5))
    assert (a.pipeline, a.data_uri, a.objects, a.generations) == \
        ("p", "gs://landing/data/a.csv", ("data/a.csv",), (5,))
    assert a.snapshot_id == snapshot_id_of("p", BUCKET, "data/a.csv", [("data/a.csv", 5)])
    assert it.handle(obj("data/a.csv", 5)) == []  # the same generation via another event id
    assert it.handle(obj("data/a.csv", 4)) == []  # an older generation, delivered late
    [again] = it.handle(obj("data/a.csv", 6))  # a new generation is new data
    assert again.snapshot_id != a.snapshot_id
    assert len(it.handle(obj("data/b.csv"))) == 1


def test_marker_completes_the_folder_and_data_objects_before_it_show_it_waiting() -> None:
    docs = InMemoryDocumentStore()
    it = Intake(make_pipeline(BatchMode.MARKER, suffixes=(".csv",)), docs=docs)
    assert it.handle(obj(f"{FOLDER}part-0.csv")) == []
    assert docs.round_trips == 2  # read, and one write: the folder now waits for its marker
    [doc] = docs.query(COLLECTION_SNAPSHOTS, "open", True)
    assert doc["early"] == [f"{FOLDER}part-0.csv"] and doc["cycle"] == 0
    before = docs.round_trips
    for i in range(1, 8):  # five names at most; beyond them only a read, no write
        it.handle(obj(f"{FOLDER}part-{i}.csv"))
    assert docs.round_trips - before == 4 * 2 + 3 and len(docs.query(
        COLLECTION_SNAPSHOTS, "open", True)[0]["early"]) == 5
    [ready] = it.handle(obj(f"{FOLDER}_SUCCESS", 9))
    assert docs.query(COLLECTION_SNAPSHOTS, "open", True) == []
    assert ready.data_uri == f"gs://{BUCKET}/{FOLDER}" and ready.objects == (f"{FOLDER}_SUCCESS",)
    assert it.handle(obj(f"{FOLDER}_SUCCESS", 9)) == []
    assert it.handle(obj(f"{FOLDER}part-1.csv")) == []  # late data changes nothing
    [rerun] = it.handle(obj(f"{FOLDER}_SUCCESS", 10))  # a new marker generation: a new snapshot
    assert rerun.snapshot_id != ready.snapshot_id
    assert len(it.handle(obj("data/b2/_SUCCESS"))) == 1  # another folder


def test_manifest_waits_for_every_listed_object() -> None:
    it = Intake(make_pipeline(BatchMode.MARKER, marker="_MANIFEST", manifest=True))
    assert it.handle(obj(f"{FOLDER}a.csv", 3)) == []  # before the manifest: remembered
    assert it.handle(it.manifest(f"{FOLDER}_MANIFEST", 7,
                                 ["# three shards", "a.csv", "b.csv",
                                  f"gs://{BUCKET}/{FOLDER}sub/c.csv"])) == []
    assert it.handle(obj(f"{FOLDER}b.csv", 4)) == []
    assert it.handle(obj(f"{FOLDER}unlisted.csv")) == []
    [ready] = it.handle(obj(f"{FOLDER}sub/c.csv", 5))
    assert dict(zip(ready.objects, ready.generations, strict=True)) == {
        f"{FOLDER}_MANIFEST": 7, f"{FOLDER}a.csv": 3, f"{FOLDER}b.csv": 4,
        f"{FOLDER}sub/c.csv": 5}
    assert it.handle(obj(f"{FOLDER}b.csv", 4)) == []
    assert it.reader.reads == 1


def test_a_json_manifest_whose_objects_are_all_there_completes_at_once() -> None:
    it = Intake(make_pipeline(BatchMode.MARKER, marker="_MANIFEST", manifest=True))
    it.handle(obj(f"{FOLDER}a.csv"))
    it.reader.put(BUCKET, f"{FOLDER}_MANIFEST", 2, b'{"objects": ["a.csv"]}')
    assert len(it.handle(obj(f"{FOLDER}_MANIFEST", 2))) == 1


@pytest.mark.parametrize("lines, words", [
    (["../elsewhere.csv"], "relative"),
    ([f"gs://{BUCKET}/other/x.csv"], "not inside"),
    (["gs://another-bucket/data/b1/x.csv"], "not inside"),
    ([], "no objects"),
    (["x.json"], "never watches"),
    (["x.tmp"], "never watches"),
    (["_MANIFEST"], "marker"),
])
def test_bad_manifests_are_invalid_events(lines: list[str], words: str) -> None:
    it = Intake(make_pipeline(BatchMode.MARKER, marker="_MANIFEST", manifest=True,
                              suffixes=(".csv", ".tmp")))
    with pytest.raises(ManifestError, match=words) as caught:
        it.handle(it.manifest(f"{FOLDER}_MANIFEST", 1, lines))
    assert isinstance(caught.value, InvalidEvent)


def test_a_manifest_too_large_to_track_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(intake, "MAX_TRACKED_BYTES", 1000)
    it = Intake(make_pipeline(BatchMode.MARKER, marker="_MANIFEST", manifest=True))
    with pytest.raises(ManifestError, match="split the snapshot"):
        it.handle(it.manifest(f"{FOLDER}_MANIFEST", 1, [f"part-{i}.csv" for i in range(20)]))


def test_a_manifest_generation_that_is_gone_is_ignored() -> None:
    it = Intake(make_pipeline(BatchMode.MARKER, marker="_MANIFEST", manifest=True))
    assert it.handle(obj(f"{FOLDER}_MANIFEST", 1)) == []  # nothing stored under that generation
    assert it.docs.query(COLLECTION_SNAPSHOTS, "open", True) == []


def test_quiet_period_completes_on_the_tick() -> None:
    it = Intake(make_pipeline(BatchMode.QUIET_PERIOD, quiet_period_s=300))
    for i in range(3):
        assert it.handle(obj(f"{FOLDER}part-{i}.csv")) == []
        it.now += 100
    assert it.tick() == []  # last object arrived 100 s ago
    it.now += 201
    [ready] = it.tick()
    assert len(ready.objects) == 3 and it.tick() == []
    mark_dispatched(ready, docs=it.docs)  # the service took it (else the tick reports it again)
    it.now += 1000
    assert it.handle(obj(f"{FOLDER}straggler.csv")) == []  # a new name after completion: late
    assert it.tick() == []
    assert it.handle(obj(f"{FOLDER}part-1.csv", 2)) == []  # a new generation: the next cycle
    it.handle(obj(f"{FOLDER}part-3.csv"))
    it.now += 301
    [second] = it.tick()
    assert set(second.objects) == {f"{FOLDER}part-1.csv", f"{FOLDER}part-3.csv"}
    assert second.snapshot_id != ready.snapshot_id


def test_min_objects_counts_distinct_objects() -> None:
    it = Intake(make_pipeline(BatchMode.MIN_OBJECTS, min_objects=3))
    it.handle(obj(f"{FOLDER}a"))
    it.handle(obj(f"{FOLDER}a"))
    assert it.handle(obj(f"{FOLDER}b")) == []
    [ready] = it.handle(obj(f"{FOLDER}c"))
    assert ready.objects == (f"{FOLDER}a", f"{FOLDER}b", f"{FOLDER}c")
    assert it.handle(obj(f"{FOLDER}d")) == []  # the rest of the upload is late
    assert it.handle(obj(f"{FOLDER}a", 2)) == []  # a new generation opens the next cycle
    it.handle(obj(f"{FOLDER}e"))
    assert len(it.handle(obj(f"{FOLDER}f"))) == 1


def test_objects_are_tracked_up_to_a_document_size_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(intake, "MAX_TRACKED_BYTES", 200)
    it = Intake(make_pipeline(BatchMode.QUIET_PERIOD, quiet_period_s=10))
    for i in range(10):
        it.handle(obj(f"{FOLDER}part-{i:03d}.csv"))
    [doc] = it.docs.query(COLLECTION_SNAPSHOTS, "open", True)
    assert doc["truncated"] and 0 < len(doc["objects"]) < 10
    it.now += 11
    assert len(it.tick()) == 1


# --- what never triggers, dedupe ------------------------------------------------------------------


@pytest.mark.parametrize("kind", [ObjectEventKind.DELETE, ObjectEventKind.METADATA,
                                  ObjectEventKind.ARCHIVE])
def test_deletes_and_metadata_updates_touch_nothing(kind: ObjectEventKind) -> None:
    docs = InMemoryDocumentStore()
    it = Intake(make_pipeline(BatchMode.EACH_OBJECT), docs=docs)
    assert it.handle(obj("data/a.csv", kind=kind)) == []
    assert docs.round_trips == 0


def test_own_checkpoints_never_start_runs() -> None:
    p = Pipeline(name="p", trigger=Trigger(bucket=BUCKET, batch=BatchMode.EACH_OBJECT),
                 checkpoint_uri=f"gs://{BUCKET}/ckpt", output_uri=f"gs://{BUCKET}/models")
    it = Intake(p)
    assert it.handle(obj("ckpt/run/step-0000000001/_COMPLETE")) == []
    assert it.handle(obj("models/run/model.npz")) == []
    assert len(it.handle(obj("new/data.csv"))) == 1


def test_a_redelivered_event_is_skipped_and_recorded_with_a_ttl() -> None:
    docs = InMemoryDocumentStore()
    it = Intake(make_pipeline(BatchMode.QUIET_PERIOD), docs=docs)
    first = obj(f"{FOLDER}a", event_id="msg-1")
    it.handle(first)
    before = docs.round_trips
    assert it.handle(first) == []
    assert docs.round_trips == before + 1  # one read of the dedupe record
    [record] = docs.query(COLLECTION_DEDUPE, "event_id", "msg-1")
    assert record["expires_at"] == datetime.fromtimestamp(T0, UTC) + timedelta(days=7)
    assert record["object"] == f"gs://{BUCKET}/{FOLDER}a"


def test_a_repeated_object_changes_no_snapshot() -> None:
    docs = InMemoryDocumentStore()
    it = Intake(make_pipeline(BatchMode.QUIET_PERIOD), docs=docs)
    it.handle(obj(f"{FOLDER}a"))
    [doc] = docs.query(COLLECTION_SNAPSHOTS, "open", True)
    key = intake.snapshot_doc_key("p", BUCKET, FOLDER)
    _, version = docs.get(COLLECTION_SNAPSHOTS, key)
    it.now += 50
    it.handle(obj(f"{FOLDER}a"))  # the other event form: another id, the same generation
    assert docs.get(COLLECTION_SNAPSHOTS, key) == (doc, version)


def test_one_event_can_feed_several_pipelines() -> None:
    it = Intake(make_pipeline(BatchMode.EACH_OBJECT, name="a"),
                make_pipeline(BatchMode.EACH_OBJECT, name="b"),
                make_pipeline(BatchMode.EACH_OBJECT, name="c", prefix="other/"))
    assert sorted(r.pipeline for r in it.handle(obj("data/x.csv"))) == ["a", "b"]


class FlakyStore(InMemoryDocumentStore):
    """Loses the race on the first `conflicts` snapshot writes, as a concurrent writer would."""

    def __init__(self, conflicts: int) -> None:
        super().__init__()
        self.conflicts = conflicts

    def put(self, collection: str, key: str, data: Mapping[str, Any], version: Any,
            adds: Sequence[AddTo] = ()) -> Any:
        if collection == COLLECTION_SNAPSHOTS and self.conflicts > 0:
            self.conflicts -= 1
            raise ConflictError("simulated")
        return super().put(collection, key, data, version, adds)


def test_conflicts_are_retried(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(intake, "BACKOFF_S", 0.0)
    it = Intake(make_pipeline(BatchMode.EACH_OBJECT), docs=FlakyStore(intake.WRITE_ATTEMPTS - 1))
    assert len(it.handle(obj("data/a.csv"))) == 1


def test_endless_conflicts_propagate_and_the_redelivery_succeeds(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(intake, "BACKOFF_S", 0.0)
    docs = FlakyStore(intake.WRITE_ATTEMPTS)
    it = Intake(make_pipeline(BatchMode.EACH_OBJECT), docs=docs)
    event = obj("data/a.csv")
    with pytest.raises(ConflictError):
        it.handle(event)
    assert docs.query(COLLECTION_DEDUPE, "event_id", event.event_id) == []  # not marked handled
    assert len(it.handle(event)) == 1


def test_a_contended_snapshot_waits_for_the_next_tick(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(intake, "BACKOFF_S", 0.0)
    docs = FlakyStore(0)
    it = Intake(make_pipeline(BatchMode.QUIET_PERIOD, quiet_period_s=10), docs=docs)
    it.handle(obj(f"{FOLDER}a"))
    it.now += 11
    docs.conflicts = intake.WRITE_ATTEMPTS
    assert it.tick() == []
    assert len(it.tick()) == 1


# --- a lost report is repaired by the tick -------------------------------------------------------


def test_a_completed_snapshot_nobody_claimed_is_reported_again() -> None:
    it = Intake(make_pipeline(BatchMode.EACH_OBJECT))
    [ready] = it.handle(obj("data/a.csv"))
    assert it.tick() == []
    reported = []
    for _ in range(REDISPATCH_LIMIT + 2):
        it.now += REDISPATCH_AFTER_S
        reported += it.tick()
    assert [r.snapshot_id for r in reported] == [ready.snapshot_id] * REDISPATCH_LIMIT
    assert reported[0] == ready


def test_a_snapshot_whose_run_exists_or_was_marked_is_not_reported_again() -> None:
    it = Intake(make_pipeline(BatchMode.EACH_OBJECT))
    [a] = it.handle(obj("data/a.csv"))
    [b] = it.handle(obj("data/b.csv"))
    it.docs.put(COLLECTION_RUNS, run_id_for("p", a.snapshot_id), {"run_id": "x"}, None)
    mark_dispatched(b, docs=it.docs)
    it.now += REDISPATCH_AFTER_S
    assert it.tick() == []
    assert it.docs.query(COLLECTION_SNAPSHOTS, "pending_dispatch", True) == []


# --- ids -----------------------------------------------------------------------------------------

LABEL_SAFE = re.compile(r"[a-z][a-z0-9-]{0,62}")


@given(st.text(max_size=80), st.text(max_size=80))
@settings(max_examples=200, deadline=None)
def test_run_ids_are_label_safe_and_deterministic(pipeline: str, snapshot: str) -> None:
    run_id = run_id_for(pipeline, snapshot)
    assert LABEL_SAFE.fullmatch(run_id) and not run_id.endswith("-")
    assert run_id_for(pipeline, snapshot) == run_id


def test_run_ids_read_well_and_differ() -> None:
    assert run_id_for("demo", "0123456789abcdef") == "demo-0123456789abcdef"
    ids = {run_id_for(p, s) for p in ("demo", "Demo", "demo-", "x" * 70, "9lives", "a_b", "a-b")
           for s in ("0123456789abcdef", "fedcba9876543210", "manual/1")}
    assert len(ids) == 21


def test_manual_snapshots_have_stable_ids() -> None:
    p = make_pipeline(BatchMode.MARKER)
    a = manual_snapshot(p, "gs://b/data/x/", request_id="r1", now=T0)
    assert manual_snapshot("p", "gs://b/data/x/", request_id="r1", now=T0) == a
    assert manual_snapshot("p", "gs://b/data/x/", request_id="r1", now=T0 + 5,
                           overrides={"deadline": "1h"}).snapshot_id == a.snapshot_id
    assert manual_snapshot("p", "gs://b/data/x/", request_id="r2", now=T0).snapshot_id \
        != a.snapshot_id
    assert manual_snapshot("p", "gs://b/data/y/", request_id="r1", now=T0).snapshot_id \
        != a.snapshot_id
    assert a.manual and a.data_uri == "gs://b/data/x/"
    assert LABEL_SAFE.fullmatch(run_id_for("p", a.snapshot_id))


@pytest.mark.parametrize("uri", ["", "s3://b/x", "gs://", "data/x", "http://x"])
def test_manual_snapshots_need_a_data_uri(uri: str) -> None:
    with pytest.raises(InvalidSubmit):
        manual_snapshot("p", uri, request_id="r", now=T0)


# --- any order, any duplication -> one snapshot (hypothesis, sequential) --------------------------


@given(st.permutations(range(8)), st.lists(st.integers(0, 8), max_size=12))
@settings(max_examples=60, deadline=None)
def test_any_order_and_duplication_gives_one_snapshot(order: list[int], dups: list[int]) -> None:
    # Objects 0..7, and 8 = the manifest; every mode must see the same single snapshot.
    names = [f"{FOLDER}part-{i}.csv" for i in range(8)] + [f"{FOLDER}_MANIFEST"]
    sequence = [names[i] for i in [*order, 8, *dups]]
    for batch, extra in ((BatchMode.MIN_OBJECTS, {"min_objects": 8}),
                         (BatchMode.MARKER, {"marker": "_MANIFEST", "manifest": True})):
        it = Intake(make_pipeline(batch, **extra))
        it.reader.put(BUCKET, names[8], 1, "\n".join(n.rsplit("/", 1)[1] for n in names[:8])
                      .encode())
        ready = [r for name in sequence for r in it.handle(obj(name))]
        assert len(ready) == 1, batch
        assert set(names[:8]) <= set(ready[0].objects)


# --- a burst from both forms, several threads: exactly one SnapshotReady --------------------------


@pytest.fixture
def memory_docs() -> DocumentStore:
    return InMemoryDocumentStore()


@pytest.fixture
def firestore_docs(firestore_emulator: Any) -> DocumentStore:
    from spotorch.adapters.gcp.firestore import FirestoreDocumentStore

    return FirestoreDocumentStore(project=firestore_emulator.project)


BURST_MODES: dict[str, tuple[BatchMode, dict[str, Any]]] = {
    "min_objects": (BatchMode.MIN_OBJECTS, {}),
    "manifest": (BatchMode.MARKER, {"marker": "_MANIFEST", "manifest": True}),
    "quiet_period": (BatchMode.QUIET_PERIOD, {"quiet_period_s": 60.0}),
}


def burst(objects: int, marker: str | None, seed: int) -> Iterator[tuple[str, str, Any]]:
    """Every object of one folder in both wire forms, about half of them redelivered, some deletes
    and metadata updates, all shuffled: (CloudEvent type, id, data)."""
    rng = random.Random(seed)
    names = [f"{FOLDER}part-{i:04d}.parquet" for i in range(objects)] + ([marker] if marker else [])
    events = []
    for i, name in enumerate(names):
        for form, (type_, data) in (("ea", eventarc(name, 1000 + i)),
                                    ("ps", notification(name, 1000 + i))):
            events.append((type_, f"{form}-{i}", data))
            if rng.random() < 0.5:
                events.append((type_, f"{form}-{i}", data))  # redelivered: the same id
        if rng.random() < 0.1:
            type_, data = eventarc(name, 1000 + i, kind="metadata")
            events.append((type_, f"md-{i}", data))
    rng.shuffle(events)
    yield from events


def deliver_all(events: Sequence[tuple[str, str, Any]], handle: Callable[[ObjectEvent],
                list[SnapshotReady]], threads: int) -> tuple[list[SnapshotReady], int]:
    """Handle events on several threads, redelivering on ConflictError as Pub/Sub would."""
    redeliveries = 0
    lock = threading.Lock()

    def one(item: tuple[str, str, Any]) -> list[SnapshotReady]:
        nonlocal redeliveries
        for _ in range(100):
            try:
                return handle(parse_object_event(*item))
            except ConflictError:
                with lock:
                    redeliveries += 1
        raise AssertionError("never handled")

    with ThreadPoolExecutor(threads) as pool:
        results = list(pool.map(one, events))
    return [r for rs in results for r in rs], redeliveries


class CountingStore:
    """A DocumentStore that counts the conflicts its conditional writes meet."""

    def __init__(self, docs: DocumentStore) -> None:
        self.docs, self.conflicts = docs, 0
        self._lock = threading.Lock()

    def get(self, collection: str, key: str) -> tuple[dict[str, Any] | None, Any]:
        return self.docs.get(collection, key)

    def put(self, collection: str, key: str, data: Mapping[str, Any], version: Any,
            adds: Sequence[AddTo] = ()) -> Any:
        try:
            return self.docs.put(collection, key, data, version, adds)
        except ConflictError:
            with self._lock:
                self.conflicts += 1
            raise

    def query(self, collection: str, field_name: str, value: Any) -> Sequence[dict[str, Any]]:
        return self.docs.query(collection, field_name, value)


def run_burst(store: DocumentStore, mode: str, objects: int, threads: int) -> None:
    docs = CountingStore(store)
    batch, extra = BURST_MODES[mode]
    if batch is BatchMode.MIN_OBJECTS:
        extra = {"min_objects": objects}
    pipeline = make_pipeline(batch, suffixes=(".parquet",), **extra)
    marker = f"{FOLDER}_MANIFEST" if mode == "manifest" else None
    reader = InMemoryObjectStore()
    if marker:
        reader.put(BUCKET, marker, 1000 + objects, "\n".join(
            f"part-{i:04d}.parquet" for i in range(objects)).encode())
    events = list(burst(objects, marker, seed=objects))
    started = time.perf_counter()
    ready, redeliveries = deliver_all(
        events, lambda e: handle_object_event(e, pipelines=[pipeline], docs=docs, now=T0,
                                              reader=reader), threads)
    if mode == "quiet_period":
        assert ready == [] and close_due_snapshots(pipelines=[pipeline], docs=docs,
                                                   now=T0 + 59, run_exists=runs_in(docs)) == []
        with ThreadPoolExecutor(threads) as pool:
            ticks = list(pool.map(lambda _: close_due_snapshots(
                pipelines=[pipeline], docs=docs, now=T0 + 61, run_exists=runs_in(docs)),
                range(threads)))
        ready = [r for rs in ticks for r in rs]
    elapsed = time.perf_counter() - started
    print(f"\n{mode}: {len(events)} events, {threads} threads, {docs.conflicts} conflicts, "
          f"{redeliveries} redeliveries, {elapsed:.2f}s")
    assert len(ready) == 1, [r.snapshot_id for r in ready]
    expected = {f"{FOLDER}part-{i:04d}.parquet": 1000 + i for i in range(objects)}
    if marker:
        expected[marker] = 1000 + objects
    assert dict(zip(ready[0].objects, ready[0].generations, strict=True)) == expected
    assert ready[0].snapshot_id == snapshot_id_of("p", BUCKET, FOLDER, list(expected.items()))


@pytest.mark.parametrize("mode", list(BURST_MODES))
def test_a_burst_gives_one_snapshot_in_memory(memory_docs: DocumentStore, mode: str) -> None:
    run_burst(memory_docs, mode, objects=100, threads=4)


@pytest.mark.emulator
@pytest.mark.parametrize("mode", list(BURST_MODES))
def test_a_burst_gives_one_snapshot_on_firestore(firestore_docs: DocumentStore,
                                                 mode: str) -> None:
    run_burst(firestore_docs, mode, objects=100, threads=4)


# --- the real protocols: fake-gcs-server -> Pub/Sub emulator -> intake on Firestore ---------------


@pytest.mark.emulator
def test_gcs_notifications_through_the_emulators(firestore_emulator: Any) -> None:
    from google.api_core import exceptions
    from google.cloud import pubsub_v1, storage

    from spotorch.adapters.gcp.firestore import FirestoreDocumentStore
    from spotorch.adapters.gcp.storage import GcsObjectStore
    from spotorch.ports.storage import ObjectNotFound
    from spotorch.settings import TOPIC_GCS_NOTIFICATIONS

    project = firestore_emulator.project
    bucket_name = f"landing-{int(time.time() * 1000)}"
    publisher, subscriber = pubsub_v1.PublisherClient(), pubsub_v1.SubscriberClient()
    topic = publisher.topic_path(project, TOPIC_GCS_NOTIFICATIONS)
    with contextlib.suppress(exceptions.AlreadyExists):  # another test may have made it
        publisher.create_topic(name=topic)
    subscription = subscriber.subscription_path(project, f"intake-{bucket_name}")
    subscriber.create_subscription(name=subscription, topic=topic)
    gcs = storage.Client(project=project)
    bucket = gcs.create_bucket(bucket_name)
    pipeline = Pipeline(name="live", trigger=Trigger(
        bucket=bucket_name, prefix="in/", batch=BatchMode.MARKER, marker="_MANIFEST",
        manifest=True, suffixes=(".csv",)), checkpoint_uri=f"gs://{bucket_name}/ckpt",
        output_uri=f"gs://{bucket_name}/out")
    for name in ("a.csv", "b.csv"):
        bucket.blob(f"in/d1/{name}").upload_from_string(b"x,y\n1,2\n")
    manifest = bucket.blob("in/d1/_MANIFEST")
    manifest.upload_from_string(b"a.csv\nb.csv\n")
    bucket.blob("ckpt/run/step-0000000001/_COMPLETE").upload_from_string(b"")
    bucket.blob("in/d1/a.csv").delete()

    messages: list[Any] = []
    deadline = time.monotonic() + 20
    while len(messages) < 5 and time.monotonic() < deadline:
        response = subscriber.pull(subscription=subscription, max_messages=20, timeout=5)
        messages += [m for m in response.received_messages
                     if m.message.attributes.get("bucketId") == bucket_name]
    assert len(messages) == 5

    docs, reader = FirestoreDocumentStore(project=project), GcsObjectStore(gcs)
    ready = []
    for received in messages:
        m = received.message
        data = {"message": {"data": base64.b64encode(m.data).decode(),
                            "attributes": dict(m.attributes), "messageId": m.message_id}}
        event = parse_object_event("google.cloud.pubsub.topic.v1.messagePublished",
                                   m.message_id, data)
        ready += handle_object_event(event, pipelines=[pipeline], docs=docs, now=T0,
                                     reader=reader)
    assert [r.objects for r in ready] == [("in/d1/_MANIFEST", "in/d1/a.csv", "in/d1/b.csv")]
    assert ready[0].data_uri == f"gs://{bucket_name}/in/d1/"
    with pytest.raises(ObjectNotFound):
        reader.read(bucket_name, "in/d1/_MANIFEST", manifest.generation + 1, 1024)
