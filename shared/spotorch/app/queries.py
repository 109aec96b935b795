"""Run and sweep readers over any DocumentStore (the in-memory store, tests, small stacks)."""

from __future__ import annotations

from typing import Any

from spotorch.core.model import Run
from spotorch.core.sweeps import Sweep
from spotorch.ports.reads import RunPage, RunQuery, SweepPage, SweepQuery, order_key, page_of, sweep_page_of
from spotorch.ports.store import DocumentStore
from spotorch.settings import COLLECTION_RUNS, COLLECTION_SWEEPS


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
        data = self._get(run_id)
        return None if data is None else Run.from_dict(data)

    def list(self, query: RunQuery) -> RunPage:
        runs = sorted((Run.from_dict(d) for d in self._all()), key=order_key, reverse=True)
        return page_of(iter(runs), query)


class DocumentSweepReader(_DocumentCollection):
    """Reads sweeps from any DocumentStore (the documents sweep_service writes)."""

    def __init__(self, docs: DocumentStore, collection: str = COLLECTION_SWEEPS) -> None:
        super().__init__(docs, collection)

    def get(self, sweep_id: str) -> Sweep | None:
        data = self._get(sweep_id)
        return None if data is None else Sweep.from_dict(data)

    def list(self, query: SweepQuery) -> SweepPage:
        sweeps = sorted((Sweep.from_dict(d) for d in self._all()), key=order_key, reverse=True)
        return sweep_page_of(iter(sweeps), query)
