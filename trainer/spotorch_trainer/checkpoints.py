"""Checkpoints in the contract's layout: {root}/step-{step:010d}/<files>, then the _COMPLETE marker.

A directory without the marker (cut off mid-write) is never listed, loaded or counted as the latest.
Needs only the standard library (plus google-cloud-storage for gs:// roots, imported when used).
"""

from __future__ import annotations

import json
import pickle
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from spotorch_trainer import contract
from spotorch_trainer.contract import rfc3339
from spotorch_trainer.storage import Payload, Storage, join, storage_for

STATE_FILE = "state.pkl"  # where Run.checkpoint(state) pickles the state object


class CheckpointError(Exception):
    """A checkpoint is incomplete, malformed, or a file name is not allowed."""


class CheckpointRef(NamedTuple):
    """A complete checkpoint: its step and its directory URI (unpacks as (step, uri))."""

    step: int
    uri: str




def marker_bytes(step: int, names: Sequence[str], now: float) -> bytes:
    """Content of the completion marker: step, the files it vouches for, and when it was written."""
    return json.dumps({contract.MARKER_STEP: step, contract.MARKER_FILES: sorted(names),
                       contract.MARKER_TIME: rfc3339(now)}, sort_keys=True).encode()


def check_name(name: str) -> str:
    """A checkpoint file name: relative, no '..', not the marker; '/' makes sub-directories."""
    parts = name.split("/")
    if not name or name.startswith("/") or any(p in ("", ".", "..") for p in parts):
        raise CheckpointError(f"bad checkpoint file name {name!r}")
    if name == contract.COMPLETION_MARKER:
        raise CheckpointError(f"{name!r} is reserved for the completion marker")
    return name


def prune_plan(complete: Sequence[int], present: Sequence[int], keep: int) -> list[int]:
    """Steps to delete so that the newest `keep` complete checkpoints remain (never fewer than one).

    Incomplete directories older than the oldest kept checkpoint go too (leftovers of killed
    writes); newer incomplete ones are left alone, as a writer may still be busy with them.
    """
    kept = sorted(complete)[-max(keep, 1):]
    if not kept:
        return []
    return sorted(s for s in set(present) if s < kept[0])


def _steps(root: str, storage: Storage) -> list[int]:
    steps = (contract.parse_checkpoint_step(name) for name in storage.list_dirs(root))
    return sorted(s for s in steps if s is not None)


def _is_complete(root: str, step: int, storage: Storage) -> bool:
    return storage.exists(join(contract.checkpoint_uri(root, step), contract.COMPLETION_MARKER))


def marker_step(uri: str, *, storage: Storage | None = None) -> int | None:
    """The step the completion marker of the checkpoint directory at `uri` records; None when
    there is no marker (or it is not one). Other storage errors raise."""
    storage = storage or storage_for(uri)
    try:
        marker = json.loads(storage.read(join(uri.rstrip("/"), contract.COMPLETION_MARKER)))
    except FileNotFoundError:
        return None
    except ValueError:
        return None  # not JSON: not a marker this helper wrote
    step = marker.get(contract.MARKER_STEP) if isinstance(marker, dict) else None
    return step if isinstance(step, int) and not isinstance(step, bool) else None


def list_checkpoints(root: str, *, storage: Storage | None = None) -> list[CheckpointRef]:
    """Every complete checkpoint under a run's checkpoint root, oldest first."""
    storage = storage or storage_for(root)
    return [CheckpointRef(s, contract.checkpoint_uri(root, s)) for s in _steps(root, storage)
            if _is_complete(root, s, storage)]


def latest_checkpoint(root: str, *, storage: Storage | None = None) -> CheckpointRef | None:
    """The newest complete checkpoint under a run's checkpoint root, or None when there is none."""
    storage = storage or storage_for(root)
    for step in reversed(_steps(root, storage)):
        if _is_complete(root, step, storage):
            return CheckpointRef(step, contract.checkpoint_uri(root, step))
    return None


def write_checkpoint(root: str, step: int, files: Mapping[str, Payload], *,
                     storage: Storage | None = None,
                     clock: Callable[[], float] = time.time) -> CheckpointRef:
    """Write the files, then the marker; a crash before the marker leaves no complete checkpoint."""
    if step < 0:
        raise CheckpointError(f"negative step {step}")
    names = [check_name(n) for n in files]
    storage = storage or storage_for(root)
    uri = contract.checkpoint_uri(root, step)
    marker = join(uri, contract.COMPLETION_MARKER)
    # Rewriting a step that is already complete: withdraw the marker first, or a crash mid-rewrite
    # would leave a "complete" checkpoint with a mix of old and new files.
    storage.delete(marker)
    for name in names:
        storage.write(join(uri, name), files[name])
    storage.write(marker, marker_bytes(step, names, clock()))
    return CheckpointRef(step, uri)


def _sizes(uri: str, storage: Storage) -> dict[str, int]:
    """Name -> bytes under uri; a storage without sizes() (older or custom) reports names only."""
    sizes = getattr(storage, "sizes", None)
    if callable(sizes):
        return {str(k): int(v) for k, v in sizes(uri).items()}
    return dict.fromkeys(storage.list_files(uri), 0)


class ScannedCheckpoint(NamedTuple):
    """A checkpoint directory under a root, complete or not, with its total size."""

    step: int
    uri: str
    complete: bool
    bytes: int


def scan_checkpoints(root: str, *, storage: Storage | None = None) -> list[ScannedCheckpoint]:
    """Every checkpoint directory under a root (complete or not) with its size, oldest first."""
    storage = storage or storage_for(root)
    found: dict[int, dict[str, int]] = {}
    for name, size in _sizes(root, storage).items():
        head, _, rest = name.partition("/")
        step = contract.parse_checkpoint_step(head)
        if step is not None and rest:
            found.setdefault(step, {})[rest] = size
    return [ScannedCheckpoint(step, contract.checkpoint_uri(root, step),
                              contract.COMPLETION_MARKER in files, sum(files.values()))
            for step, files in sorted(found.items())]


def delete_checkpoint(uri: str, *, storage: Storage | None = None) -> int:
    """Delete one checkpoint directory, marker first so that no reader sees it half-deleted.

    Returns the bytes it held (0 for each object when the storage cannot tell sizes).
    """
    storage = storage or storage_for(uri)
    sizes = _sizes(uri, storage)
    storage.delete(join(uri, contract.COMPLETION_MARKER))
    for name in sizes:
        if name != contract.COMPLETION_MARKER:
            storage.delete(join(uri, name))
    return sum(sizes.values())


def prune_checkpoints(root: str, keep: int, *, storage: Storage | None = None) -> list[int]:
    """Keep the newest `keep` complete checkpoints (at least one); return the deleted steps."""
    storage = storage or storage_for(root)
    present = _steps(root, storage)
    complete = [s for s in present if _is_complete(root, s, storage)]
    doomed = prune_plan(complete, present, keep)
    for step in doomed:
        delete_checkpoint(contract.checkpoint_uri(root, step), storage=storage)
    return doomed


@dataclass(frozen=True)
class LoadedCheckpoint:
    """A complete checkpoint opened for reading; files are fetched only when asked for."""

    step: int
    uri: str
    files: tuple[str, ...]
    time: str
    storage: Storage

    def read(self, name: str) -> bytes:
        """The bytes of one file of the checkpoint."""
        if name not in self.files:
            raise CheckpointError(f"{self.uri} has no file {name!r} (it has {list(self.files)})")
        return self.storage.read(join(self.uri, name))

    @property
    def state(self) -> Any:
        """The object saved with Run.checkpoint(state), unpickled; None when none was saved.

        Unpickling runs code from the checkpoint: only load checkpoints your own jobs wrote.
        """
        return pickle.loads(self.read(STATE_FILE)) if STATE_FILE in self.files else None

    def download(self, directory: str | Path | None = None) -> Path:
        """Copy every file to a local directory (a new temporary one by default) and return it."""
        dest = Path(directory) if directory is not None else Path(tempfile.mkdtemp(prefix="ckpt-"))
        for name in self.files:
            self.storage.download(join(self.uri, name), dest / name)
        return dest


def load_checkpoint(uri: str, *, storage: Storage | None = None) -> LoadedCheckpoint:
    """Open the checkpoint at uri; CheckpointError if it has no completion marker."""
    storage = storage or storage_for(uri)
    uri = uri.rstrip("/")
    try:
        marker = json.loads(storage.read(join(uri, contract.COMPLETION_MARKER)))
    except FileNotFoundError as exc:
        raise CheckpointError(f"{uri} is not a complete checkpoint (no marker)") from exc
    except ValueError as exc:
        raise CheckpointError(f"{uri}: unreadable marker") from exc
    try:
        step = int(marker[contract.MARKER_STEP])
        files = tuple(str(n) for n in marker[contract.MARKER_FILES])
        written = str(marker.get(contract.MARKER_TIME, ""))
    except (KeyError, TypeError, ValueError) as exc:
        raise CheckpointError(f"{uri}: malformed marker {marker!r}") from exc
    return LoadedCheckpoint(step=step, uri=uri, files=files, time=written, storage=storage)
