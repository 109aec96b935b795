"""CheckpointStore contract (latest, list, delete, complete_step): in memory, local files, GCS.

The service's retention and rollback passes run on top of it (test_health_domain.py); here the
adapters must agree on what is listed, what is complete, what a delete removes and its bytes.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from spotorch.adapters.gcp.checkpoints import StorageCheckpointStore
from spotorch.adapters.memory.twins import InMemoryCheckpoints
from spotorch.core.model import Checkpoint
from spotorch.ports.storage import CheckpointStore
from spotorch_trainer import contract
from spotorch_trainer.checkpoints import write_checkpoint
from spotorch_trainer.storage import GcsStorage, LocalStorage, Storage

# A fixture gives: the store, its root, and put(step, size, complete) that writes a checkpoint.
Put = Callable[[int, int, bool], None]


def _writer(root: str, storage: Storage) -> Put:
    def put(step: int, size: int, complete: bool) -> None:
        if complete:
            write_checkpoint(root, step, {"w.bin": b"x" * size}, storage=storage)
        else:  # cut off before the marker: files only
            storage.write(f"{contract.checkpoint_uri(root, step)}/w.bin", b"x" * size)
    return put


@pytest.fixture(params=["memory", "local", pytest.param("gcs", marks=pytest.mark.emulator)])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[CheckpointStore, str, Put]]:
    if request.param == "memory":
        mem = InMemoryCheckpoints()
        root = "gs://c/p/r1"

        def put(step: int, size: int, complete: bool) -> None:
            # The real adapters count the marker's bytes too; the fake is told sizes directly.
            mem.put(root, step, complete=complete, size=size)
        yield mem, root, put
    elif request.param == "local":
        root = str(tmp_path / "ckpt")
        yield StorageCheckpointStore(), root, _writer(root, LocalStorage())
    else:
        request.getfixturevalue("emulators")
        from google.cloud import storage

        client = storage.Client()
        bucket = client.create_bucket(f"health-{uuid.uuid4().hex[:8]}")
        root = f"gs://{bucket.name}/runs/r1"
        yield StorageCheckpointStore(), root, _writer(root, GcsStorage(client))


def test_list_shows_complete_and_incomplete_checkpoints_oldest_first(
        store: tuple[CheckpointStore, str, Put]) -> None:
    checkpoints, root, put = store
    assert checkpoints.list(root) == []
    assert checkpoints.latest(root) is None
    put(200, 10, True)
    put(100, 10, True)
    put(300, 7, False)
    listed = checkpoints.list(root)
    assert [(c.step, c.complete) for c in listed] == [(100, True), (200, True), (300, False)]
    assert [c.uri for c in listed] == [contract.checkpoint_uri(root, s) for s in (100, 200, 300)]
    assert all(c.bytes >= 10 for c in listed[:2]) and listed[2].bytes >= 7
    assert checkpoints.latest(root) == Checkpoint(200, contract.checkpoint_uri(root, 200))


def test_delete_removes_one_checkpoint_and_reports_its_bytes(
        store: tuple[CheckpointStore, str, Put]) -> None:
    checkpoints, root, put = store
    put(100, 1000, True)
    put(200, 10, True)
    before = {c.step: c.bytes for c in checkpoints.list(root)}
    reclaimed = checkpoints.delete(contract.checkpoint_uri(root, 100))
    assert reclaimed == before[100] and reclaimed >= 1000
    assert [c.step for c in checkpoints.list(root)] == [200]
    assert checkpoints.delete(contract.checkpoint_uri(root, 100)) == 0  # already gone: fine
    assert checkpoints.latest(root) == Checkpoint(200, contract.checkpoint_uri(root, 200))


def test_complete_step_reads_the_marker_of_one_checkpoint(
        store: tuple[CheckpointStore, str, Put]) -> None:
    """What a reported checkpoint is checked against (issue 27): complete at that step, here."""
    checkpoints, root, put = store
    put(100, 10, True)
    put(200, 10, False)  # files, no marker yet
    assert checkpoints.complete_step(contract.checkpoint_uri(root, 100)) == 100
    assert checkpoints.complete_step(contract.checkpoint_uri(root, 100) + "/") == 100
    assert checkpoints.complete_step(contract.checkpoint_uri(root, 200)) is None
    assert checkpoints.complete_step(contract.checkpoint_uri(root, 300)) is None  # not there
    checkpoints.delete(contract.checkpoint_uri(root, 100))
    assert checkpoints.complete_step(contract.checkpoint_uri(root, 100)) is None


def test_gcs_sizes_match_the_objects(emulators: Any) -> None:
    """GcsStorage.sizes (one listing) agrees with what was written, marker included."""
    from google.cloud import storage

    client = storage.Client()
    bucket = client.create_bucket(f"sizes-{uuid.uuid4().hex[:8]}")
    root = f"gs://{bucket.name}/r"
    gcs = GcsStorage(client)
    write_checkpoint(root, 5, {"a.bin": b"a" * 300, "sub/b.bin": b"b" * 20}, storage=gcs)
    sizes = gcs.sizes(f"{root}/step-0000000005")
    assert sizes["a.bin"] == 300 and sizes["sub/b.bin"] == 20
    assert set(sizes) == {"a.bin", "sub/b.bin", contract.COMPLETION_MARKER}


test_gcs_sizes_match_the_objects = pytest.mark.emulator(test_gcs_sizes_match_the_objects)
