"""One contract suite for the ObjectStore port (the landing buckets); one subclass per adapter:
the in-memory twin, and GCS through google-cloud-storage on fake-gcs-server."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from spotorch.adapters.gcp.storage import GcsObjectStore
from spotorch.adapters.memory.twins import InMemoryObjectStore
from spotorch.local.emulators import EmulatorSet
from spotorch.ports.storage import ObjectNotFound, ObjectStore

Seed = Callable[[str, bytes], int]  # (name, data) -> the generation written


class ObjectStoreContract:
    """What every ObjectStore must do; subclasses provide `store`, `bucket` and `seed`."""

    @pytest.fixture
    def store(self) -> ObjectStore:
        raise NotImplementedError

    @pytest.fixture
    def bucket(self) -> str:
        raise NotImplementedError

    @pytest.fixture
    def seed(self, store: ObjectStore, bucket: str) -> Seed:
        raise NotImplementedError

    def test_a_generation_reads_back_cut_to_the_limit(self, store: ObjectStore, bucket: str,
                                                      seed: Seed) -> None:
        generation = seed("d/a.csv", b"0123456789")
        assert store.read(bucket, "d/a.csv", generation, 1 << 20) == b"0123456789"
        assert store.read(bucket, "d/a.csv", generation, 4) == b"0123"

    def test_a_generation_that_is_not_there_is_not_found(self, store: ObjectStore, bucket: str,
                                                          seed: Seed) -> None:
        generation = seed("d/b.csv", b"x")
        assert store.exists(bucket, "d/b.csv", generation)
        assert not store.exists(bucket, "d/b.csv", generation + 12345)
        assert not store.exists(bucket, "d/none.csv", 1)
        with pytest.raises(ObjectNotFound):
            store.read(bucket, "d/b.csv", generation + 12345, 10)

    def test_listing_pages_in_name_order_under_the_prefix(self, store: ObjectStore, bucket: str,
                                                          seed: Seed) -> None:
        written = {name: seed(name, name.encode()) for name in
                   ("p/c.csv", "p/a.csv", "p/b.csv", "q/z.csv")}
        first = store.list_page(bucket, "p/", None, 2)
        assert [o.name for o in first.objects] == ["p/a.csv", "p/b.csv"]
        assert first.next_page_token is not None
        rest = store.list_page(bucket, "p/", first.next_page_token, 2)
        assert [o.name for o in rest.objects] == ["p/c.csv"] and rest.next_page_token is None
        for info in (*first.objects, *rest.objects):
            assert info.bucket == bucket and info.generation == written[info.name]
            assert info.size == len(info.name) and info.updated is not None
            assert abs(info.updated - time.time()) < 600

    def test_an_overwrite_lists_its_newest_generation_and_keeps_reading_the_old(
            self, store: ObjectStore, bucket: str, seed: Seed) -> None:
        old = seed("o/x.csv", b"old")
        new = seed("o/x.csv", b"newer")
        assert new != old
        (listed,) = store.list_page(bucket, "o/", None, 10).objects
        assert listed.generation == new and listed.size == 5
        assert store.read(bucket, "o/x.csv", new, 100) == b"newer"

    def test_ensure_file_uploads_once_and_never_overwrites(
            self, store: ObjectStore, bucket: str, tmp_path: Path) -> None:
        first, second = tmp_path / "a.tar.gz", tmp_path / "b.tar.gz"
        first.write_bytes(b"package one")
        second.write_bytes(b"something else")
        uri = f"gs://{bucket}/packages/0123456789abcdef/a.tar.gz"
        assert store.ensure_file(uri, str(first))
        assert not store.ensure_file(uri, str(second))  # there already: left as it was
        (listed,) = store.list_page(bucket, "packages/", None, 10).objects
        assert store.read(bucket, listed.name, listed.generation, 100) == b"package one"


class TestInMemoryObjectStore(ObjectStoreContract):
    @pytest.fixture
    def store(self) -> InMemoryObjectStore:
        return InMemoryObjectStore()

    @pytest.fixture
    def bucket(self) -> str:
        return "landing"

    @pytest.fixture
    def seed(self, store: ObjectStore, bucket: str) -> Seed:
        assert isinstance(store, InMemoryObjectStore)
        counter = iter(range(1_700_000_000_000_000, 1 << 62, 1000))

        def seed(name: str, data: bytes) -> int:
            generation = next(counter)
            store.put(bucket, name, generation, data, updated=time.time())
            return generation
        return seed


@pytest.mark.emulator
class TestGcsObjectStore(ObjectStoreContract):
    """google-cloud-storage against fake-gcs-server, as the functions run it."""

    @pytest.fixture
    def store(self, emulators: EmulatorSet) -> GcsObjectStore:
        return GcsObjectStore(project=emulators.project)

    @pytest.fixture
    def bucket(self, store: ObjectStore) -> str:
        assert isinstance(store, GcsObjectStore)
        name = f"landing-{uuid.uuid4().hex[:8]}"
        store._storage().create_bucket(name)
        return name

    @pytest.fixture
    def seed(self, store: ObjectStore, bucket: str) -> Seed:
        assert isinstance(store, GcsObjectStore)

        def seed(name: str, data: bytes) -> int:
            blob = store._storage().bucket(bucket).blob(name)
            blob.upload_from_string(data)
            return int(blob.generation)
        return seed


def test_the_functions_share_one_storage_client_made_on_first_use(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Objects and preprocess outputs read Cloud Storage through one client (one auth session
    and connection pool per instance), and wiring builds none until it is used."""
    from spotorch.entrypoints import wiring
    from spotorch.settings import Settings

    monkeypatch.setattr("spotorch.spec.compiled.function_pipelines", lambda path: ())
    deps = wiring.production_deps(Settings(project="p"))
    objects, outputs = deps.objects, deps.step_outputs
    assert objects._clients is outputs._clients  # type: ignore[attr-defined,union-attr]
    assert objects._clients._client is None  # type: ignore[attr-defined]
