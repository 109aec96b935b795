"""The run store on top of any DocumentStore: one document per run, optimistic concurrency."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from spotorch.core.model import Run
from spotorch.ports.store import AddTo, DocumentStore
from spotorch.settings import COLLECTION_RUNS


class DocumentRunStore:
    """RunStore over a DocumentStore; the same code serves Firestore and the in-memory fake."""

    def __init__(self, docs: DocumentStore, collection: str = COLLECTION_RUNS) -> None:
        self.docs = docs
        self.collection = collection

    def load(self, run_id: str) -> tuple[Run | None, Any]:
        """RunStore.load: the run and its document's version, or (None, None)."""
        data, version = self.docs.get(self.collection, run_id)
        return (None, None) if data is None else (Run.from_dict(data), version)

    def save(self, run: Run, version: Any, adds: Sequence[AddTo] = ()) -> Any:
        """RunStore.save: a conditional write of the run's document, with the adds in the same commit."""
        return self.docs.put(self.collection, run.run_id, run.to_dict(), version, adds)

    def active(self) -> Sequence[Run]:
        """RunStore.active: the active runs, oldest first."""
        # Only active runs are read: the tick scales with them, not with every run ever.
        return sorted((Run.from_dict(d) for d in self.docs.query(self.collection, "active", True)),
                      key=lambda r: (r.created_at, r.run_id))

    def active_in_buckets(self, buckets: Sequence[int]) -> Sequence[Run]:
        """RunStore.active_in_buckets: the active runs of these reconcile buckets, oldest first."""
        runs = [Run.from_dict(d) for b in buckets
                for d in self.docs.query(self.collection, "active_bucket", b)]
        return sorted(runs, key=lambda r: (r.created_at, r.run_id))

    def active_for_pipeline(self, pipeline: str) -> Sequence[Run]:
        """RunStore.active_for_pipeline: the pipeline's active runs, oldest first."""
        return [r for r in self.active() if r.pipeline == pipeline]
