"""A sweep end to end on real emulators: Firestore, Pub/Sub (trainer events) and the Vertex
emulator running examples/train.py per trial, preempting one trial; the winner registered and
every trial logged through the real aiplatform_v1 clients."""

from __future__ import annotations

import re
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from spotorch.adapters.gcp.checkpoints import StorageCheckpointStore
from spotorch.adapters.gcp.vertex_calls import RetryPolicy
from spotorch.adapters.memory.twins import InMemoryObjectStore, InMemoryPublisher
from spotorch.app import bootstrap
from spotorch.app.job_events import trainer_message
from spotorch.app.sweeps import load_sweep, start_sweep, sweep_summary
from spotorch.app.tick import tick
from spotorch.core.pipeline import EscalationKind, JobTemplate, Pipeline, RecoveryPolicy, Trigger, WorkerPool
from spotorch.core.sweep_spec import Goal, MedianStopping, ModelRegistration, Parameter, SweepSpec
from spotorch.core.sweeps import SweepStatus, TrialStatus, trial_run_id
from spotorch.core.trust import SignedMessage
from spotorch.entrypoints.functions import parse_trainer_message
from spotorch_trainer import contract

pytestmark = [pytest.mark.emulator, pytest.mark.slow, pytest.mark.extended]

ROOT = Path(__file__).resolve().parent.parent
REGION = "us-central1"


class SystemClock:
    def now(self) -> float:
        return time.time()


def test_a_sweep_runs_its_trials_stops_one_early_resumes_a_preempted_one_and_registers_the_best(
        firestore_emulator: Any, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    from google.cloud import pubsub_v1

    from spotorch.adapters.gcp.firestore import FirestoreDocumentStore
    from spotorch.adapters.gcp.registry import VertexExperimentTracker, VertexModelRegistry
    from spotorch.adapters.gcp.vertex import VertexJobLauncher
    from spotorch.app.run_store import DocumentRunStore
    from spotorch.local.vertex_emulator import VertexEmulator

    project = firestore_emulator.project
    data = tmp_path / "data"
    subprocess.run([sys.executable, str(ROOT / "examples" / "make_data.py"), str(data),
                    "--rows", "600"], check=True, capture_output=True, timeout=60)
    publisher, subscriber = pubsub_v1.PublisherClient(), pubsub_v1.SubscriberClient()
    name = f"trainer-{uuid.uuid4().hex[:8]}"
    topic, subscription = (publisher.topic_path(project, name),
                           subscriber.subscription_path(project, name))
    publisher.create_topic(name=topic)
    subscriber.create_subscription(name=subscription, topic=topic)

    sweep_id = f"sw-{uuid.uuid4().hex[:6]}"
    preempted = trial_run_id(sweep_id, 1)
    vertex = VertexEmulator(project, workdir=tmp_path / "vertex", grace_s=2.0, queued_s=0.2,
                            pending_s=0.2, job_events_topic=None,
                            schedule={"preempt": [{"run": preempted, "attempt": 1,
                                                   "after_s": 4.0}]})
    address = vertex.start()
    request.addfinalizer(vertex.stop)
    pool = WorkerPool(command=(sys.executable, str(ROOT / "examples" / "train.py")),
                      env=(("EXAMPLE_TOTAL_STEPS", "240"), ("EXAMPLE_STEP_SLEEP", "0.03"),
                           ("EXAMPLE_CHECKPOINT_EVERY", "20"),
                           ("EXAMPLE_PROGRESS_INTERVAL", "1"),
                           ("OPENBLAS_NUM_THREADS", "1"), ("OMP_NUM_THREADS", "1")))
    pipeline = Pipeline(
        name="sweepdemo", trigger=Trigger(bucket="b"),
        job=JobTemplate(worker_pools=(pool,), regions=(REGION,)),
        checkpoint_uri=str(tmp_path / "ckpt"), output_uri=str(tmp_path / "models"),
        recovery=RecoveryPolicy(escalation=EscalationKind.NEVER, backoff_base_s=0.5,
                                decision_interval_s=1.0),
        sweep=SweepSpec(parameters=(Parameter("lr", values=(0.3, 0.1, 0.00001, 0.03)),),
                        parallelism=4, metric="loss", goal=Goal.MINIMIZE,
                        early_stopping=MedianStopping(min_trials=2, min_step=40)),
        model=ModelRegistration(serving_image="us-docker.pkg.dev/vertex-ai/prediction/"
                                              "sklearn-cpu.1-3:latest"))
    docs = FirestoreDocumentStore(project=project)
    retry = RetryPolicy(attempts=2, base_s=0.1)
    deps = bootstrap.deps(
        runs=DocumentRunStore(docs), docs=docs,
        launcher=VertexJobLauncher(project, endpoint=address, retry=retry),
        checkpoints=StorageCheckpointStore(), publisher=InMemoryPublisher(),
        clock=SystemClock(), pipelines={pipeline.name: pipeline},
        objects=InMemoryObjectStore(), events_topic=topic,
        models=VertexModelRegistry(project, endpoint=address, retry=retry),
        experiments=VertexExperimentTracker(project, endpoint=address, retry=retry))
    start_sweep(deps, pipeline.name, sweep_id=sweep_id, data_uri=str(data),
                snapshot_id="batch-1")
    deadline = time.monotonic() + 150
    sw = None
    next_tick = 0.0
    rejected: list[str] = []
    while time.monotonic() < deadline:
        response = subscriber.pull(subscription=subscription, max_messages=100, timeout=2)
        for received in response.received_messages:
            try:  # as on_job_event does: the trainer's signature is checked
                data, attributes = received.message.data, dict(received.message.attributes)
                report, run_id, event_id = parse_trainer_message(data)
                signed = SignedMessage(data, attributes.get(contract.ATTR_SIGNATURE, ""),
                                       attributes.get(contract.ATTR_ATTEMPT, ""))
                trainer_message(deps, run_id, report, signed, event_id=event_id or None)
            except Exception as exc:  # what entry.guarded would record as rejected
                print("rejected trainer event:", exc)
                rejected.append(str(exc))
        if response.received_messages:
            subscriber.acknowledge(subscription=subscription,
                                   ack_ids=[m.ack_id for m in response.received_messages])
        if time.monotonic() >= next_tick:
            tick(deps)
            next_tick = time.monotonic() + 1.0
        sw = load_sweep(deps, sweep_id)[0]
        if sw is not None and not sw.active:
            break
    assert sw is not None, "no sweep"
    summary = sweep_summary(sw)
    print(summary)
    assert sw.status is SweepStatus.SUCCEEDED, summary
    assert len(sw.trials) == 4
    assert any(t.stopped_early and t.status is TrialStatus.STOPPED for t in sw.trials), summary
    run, _ = deps.runs.load(preempted)
    assert run is not None and run.counters.preemptions >= 1 and len(run.attempts) >= 2
    assert run.attempts[1].resumed_from_step is not None  # resumed from its checkpoint
    assert not any("sign" in r or "checkpoint" in r for r in rejected), rejected
    assert sw.best is not None and sw.trial(sw.best).status is TrialStatus.SUCCEEDED
    assert sw.model_name and re.fullmatch(
        rf"projects/{project}/locations/{REGION}/models/sweepdemo@\d+", sw.model_name)
    version = deps.models.version(sw.model_name)  # type: ignore[union-attr]
    assert "best" in version.aliases and version.labels["spotorch_run"] == sw.trial(sw.best).run_id
    names = deps.experiments.runs_of("sweepdemo", REGION)  # type: ignore[union-attr]
    assert len(names) == 4 and {t.experiment_run for t in sw.trials} == set(names)
