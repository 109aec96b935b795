"""Builds the production dependencies from the environment; every client is created on first use."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from spotorch.service import Deps
from spotorch.settings import Settings


class SystemClock:
    def now(self) -> float:
        return time.time()


@dataclass
class ProductionDeps(Deps):
    """Deps plus what only the production entry points need."""

    classifier: Any = None
    settings: Settings | None = None


def production_deps(settings: Settings | None = None) -> ProductionDeps:
    """Firestore, Vertex AI, GCS and Pub/Sub adapters configured from SPOTORCH_* variables."""
    from spotorch.checkpoints import StorageCheckpointStore
    from spotorch.config import cached_pipelines
    from spotorch.pipeline import RecoveryPolicy
    from spotorch.publisher import PubSubPublisher
    from spotorch.store import DocumentRunStore
    from spotorch.store_firestore import FirestoreDocumentStore
    from spotorch.vertex import Classifier, VertexJobLauncher

    settings = settings or Settings.from_env()
    docs = FirestoreDocumentStore(project=settings.project, database=settings.firestore_database)
    classifier = Classifier.from_policy(RecoveryPolicy())
    pipelines = {p.name: p for p in cached_pipelines(settings.pipelines)}
    regions = tuple(sorted({r for p in pipelines.values() for r in p.job.regions}))
    return ProductionDeps(
        runs=DocumentRunStore(docs),
        docs=docs,
        launcher=VertexJobLauncher(settings.project, endpoint=settings.vertex_endpoint,
                                   classify=classifier, regions=regions or (settings.region,)),
        checkpoints=StorageCheckpointStore(),
        publisher=PubSubPublisher(settings.topic_path(settings.events_topic)),
        clock=SystemClock(),
        pipelines=pipelines,
        events_topic=settings.topic_path(settings.trainer_events_topic),
        classifier=classifier,
        settings=settings,
    )
