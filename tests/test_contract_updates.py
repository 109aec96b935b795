"""The one conditional-update loop (spotorch.app.updates) and the one meaning of an outbox's
claims (spotorch.core.outbox), tested once against every DocumentStore: the in-memory twin and
Firestore's emulator (issue 36). Runs, sweeps, snapshot watches and unmatched uploads all go
through this loop."""

from __future__ import annotations

import uuid
from dataclasses import asdict, dataclass
from typing import Any

import pytest

from spotorch.adapters.memory.twins import InMemoryDocumentStore
from spotorch.app.updates import Written, conditional_update
from spotorch.core import outbox
from spotorch.ports.store import ConflictError, DocumentStore

NOW = 1_800_000_000.0


@dataclass(frozen=True)
class Item:
    """An outbox intent as core.outbox sees one."""

    id: str
    claimed_until: float = 0.0


def _items(doc: Any) -> tuple[Item, ...]:
    return tuple(Item(**i) for i in (doc or {}).get("outbox", ()))


class ConditionalUpdateContract:
    """What the loop does on any DocumentStore; subclasses provide `store`."""

    @pytest.fixture
    def store(self) -> DocumentStore:
        raise NotImplementedError

    @pytest.fixture
    def coll(self) -> str:
        return f"u{uuid.uuid4().hex[:8]}"

    def update(self, store: DocumentStore, coll: str, decide: Any,
               attempts: int = 8) -> Written[Any] | None:
        return conditional_update(lambda: store.get(coll, "d"), decide,
                                  lambda new, version: store.put(coll, "d", new, version),
                                  what=f"{coll}/d", attempts=attempts, backoff_s=0.0)

    def test_an_absent_document_is_created_once_and_a_racing_creator_is_decided_on(
            self, store: DocumentStore, coll: str) -> None:
        seen: list[Any] = []

        def count(doc: Any) -> dict[str, Any]:
            seen.append(doc)
            if len(seen) == 1:  # another writer creates it between our read and our write
                store.put(coll, "d", {"n": 10}, None)
            return {"n": (doc or {}).get("n", 0) + 1}
        written = self.update(store, coll, count)
        assert written is not None and written.doc == {"n": 11}
        assert seen == [None, {"n": 10}]  # decided again on what the other wrote
        assert store.get(coll, "d") == ({"n": 11}, written.version)

    def test_nothing_to_change_writes_nothing(self, store: DocumentStore, coll: str) -> None:
        version = store.put(coll, "d", {"n": 1}, None)
        assert self.update(store, coll, lambda doc: None) is None
        assert store.get(coll, "d") == ({"n": 1}, version)

    def test_a_stale_read_loses_no_change(self, store: DocumentStore, coll: str) -> None:
        store.put(coll, "d", {"tags": ["a"]}, None)
        calls = 0

        def add(doc: Any) -> dict[str, Any]:
            nonlocal calls
            calls += 1
            if calls == 1:
                current, version = store.get(coll, "d")
                assert current is not None
                store.put(coll, "d", {"tags": [*current["tags"], "theirs"]}, version)
            return {"tags": [*doc["tags"], "ours"]}
        self.update(store, coll, add)
        assert store.get(coll, "d")[0] == {"tags": ["a", "theirs", "ours"]} and calls == 2

    def test_contention_beyond_the_attempts_raises_conflict_naming_the_document(
            self, store: DocumentStore, coll: str) -> None:
        store.put(coll, "d", {"n": 0}, None)
        calls = 0

        def always_overtaken(doc: Any) -> dict[str, Any]:
            nonlocal calls
            calls += 1
            current, version = store.get(coll, "d")
            assert current is not None
            store.put(coll, "d", {"n": current["n"] + 100}, version)
            return {"n": doc["n"] + 1}
        with pytest.raises(ConflictError, match=f"{coll}/d: too much contention"):
            self.update(store, coll, always_overtaken, attempts=3)
        assert calls == 3 and store.get(coll, "d")[0] == {"n": 300}

    # --- the outbox's claims, carried by the loop ------------------------------------------

    def take_over(self, store: DocumentStore, coll: str, now: float,
                  during: Any = None) -> tuple[str, ...]:
        """What the tick does: claim, in one conditional write, the intents free to take."""
        taken: list[str] = []

        def decide(doc: Any) -> dict[str, Any] | None:
            if during is not None and not taken:
                during()
                taken.append("")  # the race happens once
            free = outbox.claimable(_items(doc), now)
            taken[:] = ["", *(i.id for i in free)]
            if not free:
                return None
            items = outbox.claim(_items(doc), (i.id for i in free), now)
            return {"outbox": [asdict(i) for i in items]}
        self.update(store, coll, decide)
        return tuple(taken[1:])

    def test_of_two_racing_takers_one_claims_an_intent(self, store: DocumentStore,
                                                       coll: str) -> None:
        store.put(coll, "d", {"outbox": [asdict(Item("a", NOW - 1))]}, None)  # claim ran out
        theirs: list[tuple[str, ...]] = []
        ours = self.take_over(store, coll, NOW,
                              during=lambda: theirs.append(self.take_over(store, coll, NOW)))
        assert theirs == [("a",)] and ours == ()
        assert _items(store.get(coll, "d")[0]) == (Item("a", NOW + outbox.LEASE_S),)

    def test_a_deferred_intent_is_released_and_taken_at_once_a_claimed_one_is_not(
            self, store: DocumentStore, coll: str) -> None:
        store.put(coll, "d", {"outbox": [asdict(Item("a", NOW - 1)),
                                         asdict(Item("b", NOW - 1))]}, None)
        assert self.take_over(store, coll, NOW) == ("a", "b")
        assert self.take_over(store, coll, NOW + 1) == ()  # claimed: no one else takes them

        def defer_a(doc: Any) -> dict[str, Any]:  # its executor failed: defer = release
            return {"outbox": [asdict(i) for i in outbox.release(_items(doc), "a", NOW + 2)]}
        self.update(store, coll, defer_a)
        assert self.take_over(store, coll, NOW + 3) == ("a",)  # at once, not after LEASE_S
        assert self.take_over(store, coll, NOW + outbox.LEASE_S + 1) == ("b",)  # ran out


class TestInMemoryConditionalUpdate(ConditionalUpdateContract):
    @pytest.fixture
    def store(self) -> DocumentStore:
        return InMemoryDocumentStore()


@pytest.mark.emulator
class TestFirestoreConditionalUpdate(ConditionalUpdateContract):
    @pytest.fixture
    def store(self, emulators: Any) -> DocumentStore:
        from spotorch.adapters.gcp.firestore import FirestoreDocumentStore

        return FirestoreDocumentStore(project=emulators.project)


def test_a_run_and_a_sweep_defer_an_intent_the_same_way() -> None:
    """Both documents use core.outbox: a deferred intent is claimable at once."""
    from spotorch.core.intents import PublishIntent
    from spotorch.core.moves import claimable, release
    from spotorch.core.sweeps import PublishSweepEvent, SweepIntentDeferred
    from spotorch.core.sweeps import claimable as sweep_claimable

    run_intent = PublishIntent(id="p1", event={}, claimed_until=NOW + 100)
    sweep_intent = PublishSweepEvent(id="s1", event={}, claimed_until=NOW + 100)
    assert not outbox.claimable([run_intent], NOW) and not outbox.claimable([sweep_intent], NOW)
    released_run = release(_run_with(run_intent), "p1", NOW)
    assert [i.id for i in claimable(released_run, NOW)] == ["p1"]
    sweep = _sweep_with(sweep_intent)
    from spotorch.core.sweeps import decide_sweep

    after = decide_sweep(sweep, SweepIntentDeferred("s1", "UNAVAILABLE"), _sweep_ctx(sweep))
    assert [i.id for i in sweep_claimable(after, NOW)] == ["s1"]


def _run_with(intent: Any) -> Any:
    from dataclasses import replace

    from spotorch.core.decide import new_run
    from spotorch.core.pipeline import Pipeline, Trigger

    run = new_run(run_id="r", pipeline=Pipeline(name="p", trigger=Trigger(bucket="b")),
                  now=NOW, data_uri="gs://b/d/", snapshot_id="s")
    return replace(run, outbox=(intent,))


def _sweep_with(intent: Any) -> Any:
    from dataclasses import replace

    from spotorch.core.sweeps import new_sweep

    pipeline = _sweep_pipeline()
    assert pipeline.sweep is not None
    sw = new_sweep(sweep_id="sw", pipeline=pipeline, spec=pipeline.sweep, now=NOW,
                   data_uri="gs://b/d/", snapshot_id="s", register=False, experiments=False)
    return replace(sw, outbox=(intent,))


def _sweep_pipeline() -> Any:
    from spotorch.core.pipeline import Pipeline, Trigger
    from spotorch.core.sweep_spec import Parameter, SweepSpec

    return Pipeline(name="p", trigger=Trigger(bucket="b"),
                    sweep=SweepSpec(metric="loss", parameters=(
                        Parameter(name="lr", values=(0.1, 0.2)),)))


def _sweep_ctx(sw: Any) -> Any:
    from spotorch.core.sweeps import SweepContext

    pipeline = _sweep_pipeline()
    return SweepContext(pipeline, pipeline.sweep, NOW, register=False, experiments=False)
