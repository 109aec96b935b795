"""One contract suite for the document and run stores; one subclass per adapter (memory, Firestore)."""

from __future__ import annotations

import threading
import uuid
from typing import Any

import pytest

from spotorch.adapters.memory.twins import InMemoryDocumentStore
from spotorch.app.run_store import DocumentRunStore
from spotorch.core.decide import new_run
from spotorch.core.pipeline import Pipeline, Trigger
from spotorch.ports.store import MAX_BATCH_WRITES, AddTo, ConflictError, DocumentStore, InvalidDocument


class DocumentStoreContract:
    """What every DocumentStore must do; subclasses provide `store`."""

    @pytest.fixture
    def store(self) -> DocumentStore:
        raise NotImplementedError

    @pytest.fixture
    def coll(self) -> str:
        return f"c{uuid.uuid4().hex[:8]}"

    def test_missing_document_has_no_version(self, store: DocumentStore, coll: str) -> None:
        assert store.get(coll, "nope") == (None, None)

    def test_create_then_read_back(self, store: DocumentStore, coll: str) -> None:
        data = {"a": 1, "nested": {"x": [1, 2], "y": None}, "s": "text", "f": 1.5, "b": True}
        version = store.put(coll, "k", data, None)
        got, got_version = store.get(coll, "k")
        assert got == data and got_version == version

    def test_create_twice_conflicts(self, store: DocumentStore, coll: str) -> None:
        store.put(coll, "k", {"a": 1}, None)
        with pytest.raises(ConflictError):
            store.put(coll, "k", {"a": 2}, None)
        assert store.get(coll, "k")[0] == {"a": 1}

    def test_write_with_current_version_replaces_every_field(self, store: DocumentStore,
                                                             coll: str) -> None:
        v1 = store.put(coll, "k", {"a": 1, "m": {"x": 1, "y": 2}}, None)
        v2 = store.put(coll, "k", {"a": 2, "m": {"x": 3}}, v1)
        assert store.get(coll, "k") == ({"a": 2, "m": {"x": 3}}, v2)

    def test_write_with_stale_version_conflicts(self, store: DocumentStore, coll: str) -> None:
        v1 = store.put(coll, "k", {"a": 1}, None)
        store.put(coll, "k", {"a": 2}, v1)
        with pytest.raises(ConflictError):
            store.put(coll, "k", {"a": 3}, v1)
        assert store.get(coll, "k")[0] == {"a": 2}

    def test_query_by_field(self, store: DocumentStore, coll: str) -> None:
        store.put(coll, "a", {"active": True, "n": 1}, None)
        store.put(coll, "b", {"active": False, "n": 2}, None)
        store.put(coll, "c", {"active": True, "n": 3}, None)
        assert sorted(d["n"] for d in store.query(coll, "active", True)) == [1, 3]

    def test_racing_writers_one_wins_per_version(self, store: DocumentStore, coll: str) -> None:
        v = store.put(coll, "k", {"n": 0}, None)
        wins: list[int] = []

        def write(i: int) -> None:
            try:
                store.put(coll, "k", {"n": i}, v)
                wins.append(i)
            except ConflictError:
                pass

        threads = [threading.Thread(target=write, args=(i,)) for i in range(1, 5)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(wins) == 1 and store.get(coll, "k")[0] == {"n": wins[0]}

    def test_blind_additions_from_racing_writers_all_count(self, store: DocumentStore,
                                                           coll: str) -> None:
        # Eight writers, each committing its own document with an addition to the same one
        # (runs ending Spot attempts of one region at once): none conflicts, every one counts.
        def add(i: int) -> None:
            store.put(coll, f"k{i}", {"n": i}, None,
                      [AddTo(coll, "c", {"seen": {"h1": 1.5, f"w{i % 2}": 1.0}}, {"who": "x"})])

        threads = [threading.Thread(target=add, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        doc, _ = store.get(coll, "c")
        assert doc == {"seen": {"h1": 12.0, "w0": 4.0, "w1": 4.0}, "who": "x"}
        store.put(coll, "k8", {"n": 8}, None, [AddTo(coll, "c", {"seen": {"h2": 2.0}}, {})])
        added, _ = store.get(coll, "c")
        assert added is not None
        assert added["seen"] == {"h1": 12.0, "w0": 4.0, "w1": 4.0, "h2": 2.0}

    def test_additions_commit_with_a_conditional_write_or_not_at_all(
            self, store: DocumentStore, coll: str) -> None:
        adds = [AddTo(coll, "c1", {"seen": {"h1": 1.5}}, {"who": "x"}),
                AddTo(coll, "c2", {"seen": {"h1": 2.0}}, {})]
        v1 = store.put(coll, "k", {"n": 1}, None, adds)  # a create, with two additions
        v2 = store.put(coll, "k", {"n": 2}, v1, adds[:1])  # an update, with one
        assert store.get(coll, "k") == ({"n": 2}, v2)
        assert store.get(coll, "c1")[0] == {"seen": {"h1": 3.0}, "who": "x"}
        assert store.get(coll, "c2")[0] == {"seen": {"h1": 2.0}}
        with pytest.raises(ConflictError):  # a stale version: the additions are not made
            store.put(coll, "k", {"n": 3}, v1, adds)
        with pytest.raises(ConflictError):  # nor with a create that finds the document
            store.put(coll, "k", {"n": 3}, None, adds)
        with pytest.raises(InvalidDocument):  # nor with a document Firestore refuses
            store.put(coll, "k", {"reason": "x" * (1 << 20)}, v2, adds)
        assert store.get(coll, "k")[0] == {"n": 2}
        assert store.get(coll, "c1")[0] == {"seen": {"h1": 3.0}, "who": "x"}
        assert store.get(coll, "c2")[0] == {"seen": {"h1": 2.0}}

    def test_a_commit_over_the_batch_limit_is_refused_whole(self, store: DocumentStore,
                                                            coll: str) -> None:
        adds = [AddTo(coll, f"c{i}", {"seen": {"h": 1.0}}, {}) for i in range(MAX_BATCH_WRITES)]
        with pytest.raises(InvalidDocument, match="writes in one commit"):
            store.put(coll, "k", {"n": 1}, None, adds)  # the put and 500 adds: 501 writes
        assert store.get(coll, "k") == (None, None) and store.get(coll, "c0") == (None, None)
        store.put(coll, "k", {"n": 1}, None, adds[:-1])  # 500 writes: one batch
        assert store.get(coll, f"c{MAX_BATCH_WRITES - 2}")[0] == {"seen": {"h": 1.0}}

    def test_a_document_over_one_mebibyte_is_refused_whole(self, store: DocumentStore,
                                                           coll: str) -> None:
        with pytest.raises(InvalidDocument):
            store.put(coll, "big", {"reason": "x" * (1 << 20)}, None)
        assert store.get(coll, "big") == (None, None)
        store.put(coll, "fits", {"reason": "x" * 500_000}, None)  # well within: written

    def test_a_run_with_probes_and_hardware_results_round_trips(self,
                                                                store: DocumentStore) -> None:
        from dataclasses import replace

        from spotorch.core.model import AttemptState, Probe

        runs = DocumentRunStore(store, collection=f"runs{uuid.uuid4().hex[:6]}")
        p = Pipeline(name="p", trigger=Trigger(bucket="b"), checkpoint_uri="gs://c",
                     output_uri="gs://m")
        run = new_run(run_id="r1", pipeline=p, now=1.0e9, data_uri="gs://b/d/", snapshot_id="s")
        run = replace(run, probes=(
            Probe(1, "us-central1", AttemptState.CANCELLED, "projects/p/x/1", 1.0e9, found=False,
                  cancel_reason="no capacity"),
            Probe(2, "us-central1", AttemptState.SUCCEEDED, kind="hardware", candidate="l4")),
            hardware_results={"l4": {"candidate": "l4", "fit": True, "steps_per_s": 4.5}})
        runs.save(run, None)
        loaded, _ = runs.load("r1")
        assert loaded == run

    def test_run_store_round_trip_and_active_query(self, store: DocumentStore) -> None:
        runs = DocumentRunStore(store, collection=f"runs{uuid.uuid4().hex[:6]}")
        p = Pipeline(name="p", trigger=Trigger(bucket="b"), checkpoint_uri="gs://c",
                     output_uri="gs://m")
        run = new_run(run_id="r1", pipeline=p, now=1.0e9, data_uri="gs://b/d/", snapshot_id="s")
        version = runs.save(run, None)
        loaded, loaded_version = runs.load("r1")
        assert loaded == run and loaded_version == version
        assert [r.run_id for r in runs.active()] == ["r1"]
        assert [r.run_id for r in runs.active_for_pipeline("p")] == ["r1"]
        assert runs.active_for_pipeline("other") == []


class TestInMemoryDocumentStore(DocumentStoreContract):
    @pytest.fixture
    def store(self) -> DocumentStore:
        return InMemoryDocumentStore()


@pytest.mark.emulator
class TestFirestoreDocumentStore(DocumentStoreContract):
    @pytest.fixture
    def store(self, emulators: Any) -> DocumentStore:
        from spotorch.adapters.gcp.firestore import FirestoreDocumentStore

        return FirestoreDocumentStore(project=emulators.project)
