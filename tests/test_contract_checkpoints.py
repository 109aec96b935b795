"""One contract suite for the CheckpointStore port (issue 36): the in-memory twin and the adapter
on the trainer's own storage layer against fake-gcs-server. It carries the resume invariant: a
run resumes only from a complete checkpoint (its marker written last), the newest one."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import pytest

from spotorch.adapters.memory.twins import InMemoryCheckpoints
from spotorch.core.model import Checkpoint
from spotorch.ports.storage import CheckpointStore
from spotorch_trainer import contract

# (root, step, complete) -> the checkpoint's bytes
Make = Callable[[str, int, bool], int]


class CheckpointStoreContract:
    """What every CheckpointStore must do; subclasses provide `store`, `root`, `make` and
    `put_report`."""

    @pytest.fixture
    def store(self) -> CheckpointStore:
        raise NotImplementedError

    @pytest.fixture
    def root(self) -> str:
        raise NotImplementedError

    @pytest.fixture
    def make(self, store: CheckpointStore) -> Make:
        raise NotImplementedError

    @pytest.fixture
    def put_report(self, store: CheckpointStore) -> Callable[[str, bytes], None]:
        raise NotImplementedError

    def test_an_empty_root_has_no_checkpoint(self, store: CheckpointStore, root: str) -> None:
        assert store.latest(root) is None and list(store.list(root)) == []

    def test_latest_is_the_newest_complete_checkpoint_never_an_incomplete_one(
            self, store: CheckpointStore, root: str, make: Make) -> None:
        make(root, 10, True)
        make(root, 20, True)
        make(root, 30, False)  # preempted before its marker: resuming from it would be wrong
        assert store.latest(root) == Checkpoint(20, contract.checkpoint_uri(root, 20))
        assert store.latest(root + "/") == store.latest(root)

    def test_list_is_every_directory_oldest_first_with_its_completeness(
            self, store: CheckpointStore, root: str, make: Make) -> None:
        sizes = {step: make(root, step, step != 3) for step in (2, 3, 1)}
        listed = list(store.list(root))
        assert [(c.step, c.complete) for c in listed] == [(1, True), (2, True), (3, False)]
        assert [c.uri for c in listed] == [contract.checkpoint_uri(root, s) for s in (1, 2, 3)]
        assert listed[0].bytes == sizes[1]

    def test_complete_step_reads_the_marker(self, store: CheckpointStore, root: str,
                                            make: Make) -> None:
        make(root, 5, True)
        make(root, 6, False)
        assert store.complete_step(contract.checkpoint_uri(root, 5)) == 5
        assert store.complete_step(contract.checkpoint_uri(root, 6)) is None
        assert store.complete_step(contract.checkpoint_uri(root, 7)) is None

    def test_delete_removes_a_checkpoint_and_says_how_many_bytes(
            self, store: CheckpointStore, root: str, make: Make) -> None:
        make(root, 1, True)
        size = make(root, 2, True)
        assert store.delete(contract.checkpoint_uri(root, 2)) == size
        assert [c.step for c in store.list(root)] == [1]
        assert store.latest(root) == Checkpoint(1, contract.checkpoint_uri(root, 1))
        assert store.complete_step(contract.checkpoint_uri(root, 2)) is None

    def test_a_report_reads_back_is_none_when_absent_and_refused_when_too_large(
            self, store: CheckpointStore, root: str,
            put_report: Callable[[str, bytes], None]) -> None:
        uri = f"{root}/checkpoints/probe.json"
        assert store.read_report(uri, 100) is None
        put_report(uri, b'{"steps_per_s": 2.0}')
        assert store.read_report(uri, 100) == b'{"steps_per_s": 2.0}'
        with pytest.raises(ValueError):
            store.read_report(uri, 5)


class TestInMemoryCheckpoints(CheckpointStoreContract):
    @pytest.fixture
    def store(self) -> CheckpointStore:
        return InMemoryCheckpoints()

    @pytest.fixture
    def root(self) -> str:
        return "gs://ckpt/run-1"

    @pytest.fixture
    def make(self, store: CheckpointStore) -> Make:
        assert isinstance(store, InMemoryCheckpoints)

        def make(root: str, step: int, complete: bool) -> int:
            store.put(root, step, complete=complete, size=100 + step)
            return 100 + step
        return make

    @pytest.fixture
    def put_report(self, store: CheckpointStore) -> Callable[[str, bytes], None]:
        assert isinstance(store, InMemoryCheckpoints)
        return store.reports.__setitem__


@pytest.mark.emulator
class TestStorageCheckpointsOnFakeGcs(CheckpointStoreContract):
    """StorageCheckpointStore (the functions' adapter) on fake-gcs-server; checkpoints written
    by the trainer helper itself (spotorch_trainer.checkpoints)."""

    @pytest.fixture
    def store(self, emulators: Any) -> CheckpointStore:
        from spotorch.adapters.gcp.checkpoints import StorageCheckpointStore

        return StorageCheckpointStore()

    @pytest.fixture
    def root(self, emulators: Any) -> str:
        from google.cloud import storage

        bucket = f"ckpt-{uuid.uuid4().hex[:8]}"
        storage.Client(project=emulators.project).create_bucket(bucket)
        return f"gs://{bucket}/run-1"

    @pytest.fixture
    def make(self, store: CheckpointStore) -> Make:
        from spotorch_trainer.checkpoints import write_checkpoint
        from spotorch_trainer.storage import storage_for

        def make(root: str, step: int, complete: bool) -> int:
            data = b"w" * (50 + step)
            uri = contract.checkpoint_uri(root, step)
            if not complete:  # its files written, the marker not yet: what a preemption leaves
                storage_for(root).write(f"{uri}/model.bin", data)
                return len(data)
            write_checkpoint(root, step, {"model.bin": data})
            marker = storage_for(root).read(f"{uri}/{contract.COMPLETION_MARKER}")
            return len(data) + len(marker)  # the directory's bytes, its marker's included
        return make

    @pytest.fixture
    def put_report(self, store: CheckpointStore) -> Callable[[str, bytes], None]:
        from spotorch_trainer.storage import storage_for

        def put(uri: str, data: bytes) -> None:
            storage_for(uri).write(uri, data)
        return put
