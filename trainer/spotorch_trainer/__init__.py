"""spotorch's trainer helper: resume, atomic checkpoints, SIGTERM handling, events.

Only the standard library is imported here; google-cloud-storage (gs:// URIs) and
google-cloud-pubsub (event reporting) are imported when first used. See docs/trainer-guide.md.
"""

from __future__ import annotations

from spotorch_trainer.checkpoints import (
    STATE_FILE,
    CheckpointError,
    CheckpointRef,
    LoadedCheckpoint,
    latest_checkpoint,
    list_checkpoints,
    load_checkpoint,
    prune_checkpoints,
    write_checkpoint,
)
from spotorch_trainer.cluster import Cluster, ClusterError, shard_range
from spotorch_trainer.env import EnvError, TrainerEnv, params
from spotorch_trainer.events import ListReporter, LogReporter, PubSubReporter, event_message
from spotorch_trainer.run import Preempted, ProbeDone, Run, resume_point
from spotorch_trainer.storage import (
    GcsStorage,
    LocalStorage,
    SnapshotObject,
    Storage,
    StorageError,
    join,
    list_files,
    read_at,
    read_bytes,
    snapshot_objects,
    write_bytes,
)
from spotorch_trainer.tabular import parquet_files, read_parquet

__all__ = [
    "STATE_FILE",
    "CheckpointError",
    "CheckpointRef",
    "Cluster",
    "ClusterError",
    "EnvError",
    "GcsStorage",
    "ListReporter",
    "LoadedCheckpoint",
    "LocalStorage",
    "LogReporter",
    "Preempted",
    "ProbeDone",
    "PubSubReporter",
    "Run",
    "SnapshotObject",
    "Storage",
    "StorageError",
    "TrainerEnv",
    "event_message",
    "join",
    "latest_checkpoint",
    "list_checkpoints",
    "list_files",
    "load_checkpoint",
    "params",
    "parquet_files",
    "prune_checkpoints",
    "read_at",
    "read_bytes",
    "read_parquet",
    "resume_point",
    "shard_range",
    "snapshot_objects",
    "write_bytes",
    "write_checkpoint",
]
