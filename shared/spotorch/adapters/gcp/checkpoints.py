"""CheckpointStore on the trainer helper's own reader, so both sides agree on what 'complete' means."""

from __future__ import annotations

from spotorch.core.model import Checkpoint
from spotorch.ports.storage import StoredCheckpoint


class StorageCheckpointStore:
    """Finds, lists and deletes checkpoints under a gs:// or local checkpoint root."""

    def latest(self, checkpoint_uri: str) -> Checkpoint | None:
        """CheckpointStore.latest: the newest complete checkpoint, as the trainer's resume finds it."""
        from spotorch_trainer.checkpoints import latest_checkpoint

        found = latest_checkpoint(checkpoint_uri)
        return None if found is None else Checkpoint(step=found.step, uri=found.uri)

    def list(self, checkpoint_uri: str) -> list[StoredCheckpoint]:
        """CheckpointStore.list: every checkpoint directory under the root, complete or not."""
        from spotorch_trainer.checkpoints import scan_checkpoints

        return [StoredCheckpoint(c.step, c.uri, c.complete, c.bytes)
                for c in scan_checkpoints(checkpoint_uri)]

    def delete(self, uri: str) -> int:
        """CheckpointStore.delete: removes the directory and returns the bytes it held."""
        from spotorch_trainer.checkpoints import delete_checkpoint

        return delete_checkpoint(uri)

    def complete_step(self, uri: str) -> int | None:
        """CheckpointStore.complete_step: the step of a complete checkpoint's URI, by its marker."""
        from spotorch_trainer.checkpoints import marker_step

        return marker_step(uri)

    def read_report(self, uri: str, max_bytes: int) -> bytes | None:
        """CheckpointStore.read_report: None when absent; ValueError when over max_bytes."""
        from spotorch_trainer.storage import read_bytes

        try:
            data = read_bytes(uri)
        except FileNotFoundError:  # the storage layer's "absent", for local paths and gs://
            return None
        if len(data) > max_bytes:
            raise ValueError(f"{uri}: {len(data)} bytes, more than {max_bytes}")
        return data
