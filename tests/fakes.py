"""Service dependencies built from the in-memory adapters, for unit tests."""

from __future__ import annotations

from spotorch.memory import (
    InMemoryCheckpoints,
    InMemoryDocumentStore,
    InMemoryLauncher,
    InMemoryObjectStore,
    InMemoryPublisher,
    ManualClock,
)
from spotorch.pipeline import Pipeline
from spotorch.service import Deps
from spotorch.store import DocumentRunStore


def fake_deps(*pipelines: Pipeline, events_topic: str = "") -> Deps:
    """Deps on fresh in-memory adapters, knowing the given pipelines."""
    docs = InMemoryDocumentStore()
    return Deps(runs=DocumentRunStore(docs), docs=docs, launcher=InMemoryLauncher(),
                checkpoints=InMemoryCheckpoints(), publisher=InMemoryPublisher(),
                clock=ManualClock(), pipelines={p.name: p for p in pipelines},
                objects=InMemoryObjectStore(),
                events_topic=events_topic)
