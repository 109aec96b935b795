"""Run, sweep and arrival readers over any DocumentStore (the in-memory store, tests, small
stacks)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from spotorch.core.model import Run
from spotorch.core.sweeps import Sweep
from spotorch.ports.reads import RunPage, RunQuery, SweepPage, SweepQuery, order_key, page_of, sweep_page_of
from spotorch.ports.store import DocumentStore
from spotorch.settings import COLLECTION_RUNS, COLLECTION_SNAPSHOTS, COLLECTION_SWEEPS, COLLECTION_UNMATCHED


class _DocumentCollection:
    """Every document of one collection of any DocumentStore, active or not (each run and
    sweep document says whether it is active: two queries read them all)."""

    def __init__(self, docs: DocumentStore, collection: str) -> None:
        self.docs = docs
        self.collection = collection

    def _get(self, key: str) -> dict[str, Any] | None:
        data, _ = self.docs.get(self.collection, key)
        return data

    def _all(self) -> list[dict[str, Any]]:
        return [*self.docs.query(self.collection, "active", True),
                *self.docs.query(self.collection, "active", False)]


class DocumentRunReader(_DocumentCollection):
    """Reads runs from any DocumentStore."""

    def __init__(self, docs: DocumentStore, collection: str = COLLECTION_RUNS) -> None:
        super().__init__(docs, collection)

    def get(self, run_id: str) -> Run | None:
        """RunReader.get: the run document, None if absent."""
        data = self._get(run_id)
        return None if data is None else Run.from_dict(data)

    def list(self, query: RunQuery) -> RunPage:
        """RunReader.list: every run document read and sorted here (small stores only)."""
        runs = sorted((Run.from_dict(d) for d in self._all()), key=order_key, reverse=True)
        return page_of(iter(runs), query)


class DocumentSweepReader(_DocumentCollection):
    """Reads sweeps from any DocumentStore (the documents sweep_service writes)."""

    def __init__(self, docs: DocumentStore, collection: str = COLLECTION_SWEEPS) -> None:
        super().__init__(docs, collection)

    def get(self, sweep_id: str) -> Sweep | None:
        """SweepReader.get: the sweep document, None if absent."""
        data = self._get(sweep_id)
        return None if data is None else Sweep.from_dict(data)

    def list(self, query: SweepQuery) -> SweepPage:
        """SweepReader.list: every sweep document read and sorted here (small stores only)."""
        sweeps = sorted((Sweep.from_dict(d) for d in self._all()), key=order_key, reverse=True)
        return sweep_page_of(iter(sweeps), query)


class DocumentArrivalReader:
    """Snapshot and unmatched-upload documents from any DocumentStore (every such document
    carries `format`: one query each), most recently active first."""

    def __init__(self, docs: DocumentStore) -> None:
        self.docs = docs

    def _recent(self, collection: str, limit: int) -> Sequence[Mapping[str, Any]]:
        found = [d for d in self.docs.query(collection, "format", 1) if d.get("last_seen")]
        return sorted(found, key=lambda d: float(d["last_seen"]), reverse=True)[:limit]

    def snapshots(self, limit: int) -> Sequence[Mapping[str, Any]]:
        """ArrivalReader.snapshots: the snapshot documents most recently active first."""
        return self._recent(COLLECTION_SNAPSHOTS, limit)

    def unmatched(self, limit: int) -> Sequence[Mapping[str, Any]]:
        """ArrivalReader.unmatched: the unmatched-upload records most recently active first."""
        return self._recent(COLLECTION_UNMATCHED, limit)
