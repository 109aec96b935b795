"""The service layer on the Firestore emulator: racing deliveries launch exactly one job."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable
from typing import Any

import pytest

from spotorch.adapters.memory.twins import (
    InMemoryCheckpoints,
    InMemoryLauncher,
    InMemoryObjectStore,
    InMemoryPublisher,
    ManualClock,
)
from spotorch.app import bootstrap
from spotorch.app.deps import Deps
from spotorch.app.job_events import job_changed
from spotorch.app.run_store import DocumentRunStore
from spotorch.app.runs import start_run
from spotorch.core.model import FailureClass, JobPhase
from spotorch.core.pipeline import EscalationKind, Pipeline, RecoveryPolicy, Trigger
from spotorch.ports.store import ConflictError

pytestmark = pytest.mark.emulator


@pytest.fixture
def deps(firestore_emulator: Any) -> Deps:
    from spotorch.adapters.gcp.firestore import FirestoreDocumentStore

    docs = FirestoreDocumentStore(project=firestore_emulator.project)
    p = Pipeline(name="p", trigger=Trigger(bucket="b"), checkpoint_uri="gs://c/p",
                 output_uri="gs://m/p", recovery=RecoveryPolicy(escalation=EscalationKind.NEVER))
    return bootstrap.deps(runs=DocumentRunStore(docs), docs=docs, launcher=InMemoryLauncher(),
                checkpoints=InMemoryCheckpoints(), publisher=InMemoryPublisher(),
                clock=ManualClock(), pipelines={"p": p}, objects=InMemoryObjectStore())


def race(n: int, work: Callable[[int], object]) -> None:
    """Run work(i) in n threads released at once; a ConflictError is redelivered, as Pub/Sub does."""
    barrier = threading.Barrier(n)

    def deliver(i: int) -> None:
        barrier.wait()
        for _ in range(20):
            try:
                work(i)
                return
            except ConflictError:
                continue

    threads = [threading.Thread(target=deliver, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def test_two_deliveries_of_one_snapshot_racing_start_one_run_and_one_job(deps: Deps) -> None:
    run_id = f"r-{uuid.uuid4().hex[:8]}"
    race(2, lambda i: start_run(deps, "p", run_id=run_id, data_uri="gs://b/d/", snapshot_id="s",
                                reason=f"delivery {i}"))
    assert isinstance(deps.launcher, InMemoryLauncher) and deps.launcher.created == 1
    run, _ = deps.runs.load(run_id)
    assert run is not None and len(run.attempts) == 1 and run.outbox == ()


def test_a_racing_storm_of_duplicate_preemptions_relaunches_once(deps: Deps) -> None:
    run_id = f"r-{uuid.uuid4().hex[:8]}"
    start_run(deps, "p", run_id=run_id, data_uri="gs://b/d/", snapshot_id="s", reason="t")
    assert isinstance(deps.launcher, InMemoryLauncher)
    job = deps.launcher.job_of(run_id, 1)
    status = deps.launcher.set_status(job, JobPhase.FAILED, failure=FailureClass.PREEMPTED)
    race(6, lambda i: [job_changed(deps, run_id, 1, status, event_id=f"e{(i + k) % 4}")
                       for k in range(10)] and None)
    assert deps.launcher.created == 2
    run, _ = deps.runs.load(run_id)
    assert run is not None and run.counters.preemptions == 1 and len(run.attempts) == 2
