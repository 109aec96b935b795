"""The document and run store ports: one conditional write per change, Firestore's limits."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from spotorch.core.errors import SpotorchError
from spotorch.core.model import Run


class ConflictError(Exception):
    """Someone else changed the document since it was read; reload and decide again."""


class RunStore(Protocol):
    """Runs, each read and written as one document with optimistic concurrency."""

    def load(self, run_id: str) -> tuple[Run | None, Any]:
        """The run and an opaque version token (None when absent)."""
        ...

    def save(self, run: Run, version: Any, adds: Sequence[AddTo] = ()) -> Any:
        """Write the run if its version is still `version` (None: must not exist); return the new one.

        Raises ConflictError when the document changed or (for None) already exists. `adds`
        (blind counter writes, e.g. the shared Spot record's) commit with the run or not at all.
        """
        ...

    def active(self) -> Sequence[Run]:
        """Every run that has not reached a terminal status."""
        ...

    def active_for_pipeline(self, pipeline: str) -> Sequence[Run]:
        """The active runs of one pipeline."""
        ...

    def active_in_buckets(self, buckets: Sequence[int]) -> Sequence[Run]:
        """The active runs whose reconcile bucket is one of these (one indexed query each)."""
        ...


class InvalidDocument(SpotorchError):
    """A document Firestore refuses for good (over its 1 MiB size, a field it cannot hold)."""


# Firestore's limit on one document; the in-memory store enforces it too.
MAX_DOCUMENT_BYTES = 1_048_576
# Writes in one commit (a put and its adds). The client libraries document 500 per batch; the
# emulator takes more, and whether the service still refuses more is not in FACTS.md: both
# stores refuse more than this before sending, so no environment is kinder than another.
MAX_BATCH_WRITES = 500


@dataclass(frozen=True)
class AddTo:
    """A blind write that commits with a conditional put (see put): no read, no precondition
    (so writers never conflict); adds each counters[m][n] to the number at map m, key n
    (created at 0), and sets `fields`."""

    collection: str
    key: str
    counters: Mapping[str, Mapping[str, float]]
    fields: Mapping[str, Any]


def batch_problem(collection: str, key: str, adds: Sequence[AddTo]) -> str | None:
    """Why a put with these adds cannot commit as one batch; None when it can."""
    if 1 + len(adds) > MAX_BATCH_WRITES:
        return (f"{collection}/{key}: {1 + len(adds)} writes in one commit, over the "
                f"{MAX_BATCH_WRITES} a Firestore batch takes")
    return None


class DocumentStore(Protocol):
    """Small auxiliary documents (snapshots, dedupe records, rejected events) with versions."""

    def get(self, collection: str, key: str) -> tuple[dict[str, Any] | None, Any]:
        """The document and its version, or (None, None) if there is none."""
        ...

    def put(self, collection: str, key: str, data: Mapping[str, Any], version: Any,
            adds: Sequence[AddTo] = ()) -> Any:
        """Conditional write as RunStore.save; raises ConflictError, or InvalidDocument when
        Firestore would refuse the document (nothing is written then). `adds` commit with it in
        one round trip (a Firestore batch): all of them or, on any error, none."""
        ...

    def query(self, collection: str, field_name: str, value: Any) -> Sequence[dict[str, Any]]:
        """Documents whose field equals value."""
        ...
