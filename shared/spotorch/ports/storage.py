"""The object storage ports: landing buckets (ObjectStore) and checkpoints (CheckpointStore)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from spotorch.core.errors import SpotorchError
from spotorch.core.model import Checkpoint


@dataclass(frozen=True)
class StoredCheckpoint:
    """One checkpoint directory under a run's root, as a listing shows it."""

    step: int
    uri: str
    complete: bool  # its completion marker exists
    bytes: int  # total size of its objects


class CheckpointStore(Protocol):
    """Finds, lists and deletes the checkpoints under a run's checkpoint root."""

    def latest(self, checkpoint_uri: str) -> Checkpoint | None:
        """The newest complete checkpoint under the root, None if there is none."""
        ...

    def list(self, checkpoint_uri: str) -> Sequence[StoredCheckpoint]:
        """Every checkpoint directory under the root (complete or not), oldest first."""
        ...

    def delete(self, uri: str) -> int:
        """Delete one checkpoint (its marker first, so no reader sees it half gone); its bytes."""
        ...

    def complete_step(self, uri: str) -> int | None:
        """The step the completion marker of the checkpoint directory at `uri` records; None
        when it has none (not complete, or not there). Transient storage errors raise."""
        ...

    def read_report(self, uri: str, max_bytes: int) -> bytes | None:
        """A small file under a checkpoint root (a probe's report); None when it is not there.
        More than max_bytes is an error (ValueError): a report is never that large."""
        ...


class ObjectNotFound(SpotorchError):
    """No object at that bucket, name and generation."""


@dataclass(frozen=True)
class ObjectInfo:
    """One object generation as a listing shows it."""

    bucket: str
    name: str
    generation: int
    size: int | None = None
    updated: float | None = None  # seconds since the epoch


@dataclass(frozen=True)
class ObjectPage:
    """One page of a listing and the token of the next (None: the last page)."""
    objects: tuple[ObjectInfo, ...]
    next_page_token: str | None = None


class ObjectStore(Protocol):
    """The landing buckets, as much as intake needs of them."""

    def read(self, bucket: str, name: str, generation: int, max_bytes: int) -> bytes:
        """Up to max_bytes of one generation; ObjectNotFound when that generation is gone."""
        ...

    def ensure_file(self, uri: str, path: str) -> bool:
        """Upload a local file to gs:// uri unless an object is there already (the names of
        built packages are content hashes: one there holds these bytes); True if it uploaded."""
        ...

    def exists(self, bucket: str, name: str, generation: int) -> bool:
        """Whether that generation of the object exists (one metadata read)."""
        ...

    def list_page(self, bucket: str, prefix: str, page_token: str | None,
                  page_size: int) -> ObjectPage:
        """One page of the live objects under a prefix, in name order."""
        ...
