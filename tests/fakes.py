"""Service dependencies built from the in-memory adapters, for unit tests."""

from __future__ import annotations

from spotorch.adapters.memory.twins import (
    InMemoryCheckpoints,
    InMemoryDocumentStore,
    InMemoryJobLogs,
    InMemoryLauncher,
    InMemoryObjectStore,
    InMemoryPublisher,
    ManualClock,
)
from spotorch.app import bootstrap
from spotorch.app.deps import Deps
from spotorch.app.run_store import DocumentRunStore
from spotorch.core.pipeline import Pipeline

PROJECT = "spotorch-test"  # the project of the fake deployment (log entries name it)


def fake_deps(*pipelines: Pipeline, events_topic: str = "") -> Deps:
    """Deps on fresh in-memory adapters, knowing the given pipelines."""
    docs = InMemoryDocumentStore()
    return bootstrap.deps(runs=DocumentRunStore(docs), docs=docs, launcher=InMemoryLauncher(),
                checkpoints=InMemoryCheckpoints(), publisher=InMemoryPublisher(),
                clock=ManualClock(), pipelines={p.name: p for p in pipelines},
                objects=InMemoryObjectStore(), job_logs=InMemoryJobLogs(),
                events_topic=events_topic, project=PROJECT)
