"""CheckpointStore on the trainer helper's own reader, so both sides agree on what 'complete' means."""

from __future__ import annotations

from spotorch.domain import Checkpoint


class StorageCheckpointStore:
    """Finds the latest complete checkpoint under a gs:// or local checkpoint root."""

    def latest(self, checkpoint_uri: str) -> Checkpoint | None:
        from spotorch_trainer.checkpoints import latest_checkpoint

        found = latest_checkpoint(checkpoint_uri)
        return None if found is None else Checkpoint(step=found.step, uri=found.uri)
