"""Sweeps through the service layer on the in-memory adapters: trials are runs, the median rule
stops trials through their runs, the winner is registered once, everything logged once."""

from __future__ import annotations

import json
from dataclasses import replace

from fakes import fake_deps
from spotorch.adapters.memory.registry import MemoryExperimentTracker, MemoryModelRegistry
from spotorch.adapters.memory.twins import (
    InMemoryCheckpoints,
    InMemoryLauncher,
    InMemoryPublisher,
    ManualClock,
)
from spotorch.app import sweeps as sweep_service
from spotorch.app.deps import Deps
from spotorch.app.job_events import job_changed, trainer_reported
from spotorch.app.snapshots import SnapshotReady
from spotorch.app.sweeps import cancel_sweep, load_sweep, start_sweep
from spotorch.app.tick import tick
from spotorch.core.events import kind_of
from spotorch.core.model import FailureClass, JobPhase, RunStatus
from spotorch.core.observations import TrainerReported
from spotorch.core.pipeline import EscalationKind, OnActiveRun, Pipeline, RecoveryPolicy, Trigger
from spotorch.core.sweep_spec import Goal, MedianStopping, ModelRegistration, Parameter, SweepSpec
from spotorch.core.sweeps import TrialStatus
from spotorch.ports.registry import RegistryError
from spotorch.spec.event_schemas import validate_event

SPEC = SweepSpec(parameters=(Parameter("lr", values=(0.1, 0.01, 0.001, 0.0001)),),
                 parallelism=3, metric="loss", goal=Goal.MINIMIZE,
                 early_stopping=MedianStopping(min_trials=2, min_step=10))


def make(model: bool = True, spec: SweepSpec = SPEC) -> Deps:
    p = Pipeline(name="p", trigger=Trigger(bucket="b", on_active_run=OnActiveRun.QUEUE),
                 checkpoint_uri="gs://c/p", output_uri="gs://m/p",
                 recovery=RecoveryPolicy(escalation=EscalationKind.NEVER, backoff_base_s=1.0),
                 sweep=spec,
                 model=ModelRegistration(serving_image="img", labels=(("team", "ml"),))
                 if model else None)
    deps = fake_deps(p)
    deps.models = MemoryModelRegistry("proj")
    deps.experiments = MemoryExperimentTracker("proj")
    return deps


def parts(deps: Deps) -> tuple[InMemoryLauncher, InMemoryPublisher, ManualClock]:
    assert isinstance(deps.launcher, InMemoryLauncher)
    assert isinstance(deps.publisher, InMemoryPublisher)
    assert isinstance(deps.clock, ManualClock)
    return deps.launcher, deps.publisher, deps.clock


def kinds(publisher: InMemoryPublisher) -> list[str]:
    return [kind_of(t) for t in publisher.types()]


def report(deps: Deps, run_id: str, step: int, loss: float, attempt: int = 1) -> None:
    _, _, clock = parts(deps)
    clock.advance(2)
    trainer_reported(deps, run_id, TrainerReported(attempt, "progress", clock.now(), step=step,
                                                   total_steps=100, metrics={"loss": loss}))


def succeed(deps: Deps, run_id: str, attempt: int = 1) -> None:
    launcher, _, _ = parts(deps)
    job_changed(deps, run_id, attempt, launcher.set_status(launcher.job_of(run_id, attempt),
                                                           JobPhase.SUCCEEDED))


def test_a_sweep_starts_parallelism_trial_runs_with_their_parameters() -> None:
    deps = make()
    launcher, publisher, _ = parts(deps)
    sw = start_sweep(deps, "p", sweep_id="sw", data_uri="gs://b/d/", snapshot_id="d")
    assert launcher.created == 3 and sw.outbox == ()
    envs = {j.spec.run_id: j.spec.env for j in launcher.jobs.values()}
    assert json.loads(envs["sw-t2"]["SPOTORCH_PARAMS"]) == {"lr": 0.01}
    run = deps.runs.load("sw-t1")[0]
    assert run is not None and run.sweep_id == "sw" and run.params == {"lr": 0.1}
    assert kinds(publisher).count("sweep.trial_started") == 3
    assert all(validate_event(e) == [] for e in publisher.events)
    # the same sweep started again (a redelivered snapshot) changes nothing
    assert start_sweep(deps, "p", sweep_id="sw", data_uri="gs://b/d/", snapshot_id="d") == sw
    assert launcher.created == 3


def test_median_stopping_cancels_a_trial_run_and_the_next_trial_takes_its_slot() -> None:
    deps = make()
    launcher, publisher, _ = parts(deps)
    start_sweep(deps, "p", sweep_id="sw", data_uri="gs://b/d/", snapshot_id="d")
    for run_id, loss in (("sw-t1", 0.5), ("sw-t2", 0.4), ("sw-t3", 0.9)):
        report(deps, run_id, 10, loss)
    tick(deps)
    sw = load_sweep(deps, "sw")[0]
    assert sw is not None and sw.trial(3).status is TrialStatus.STOPPING
    assert kinds(publisher).count("sweep.trial_stopped") == 1
    run3 = deps.runs.load("sw-t3")[0]
    assert run3 is not None and run3.status is RunStatus.CANCELLING
    job3 = launcher.job_of("sw-t3", 1)
    assert launcher.get(job3).phase in (JobPhase.CANCELLING, JobPhase.CANCELLED)  # asked to stop
    job_changed(deps, "sw-t3", 1, launcher.set_status(job3, JobPhase.CANCELLED,
                                                      failure=FailureClass.CANCELLED))
    sw = load_sweep(deps, "sw")[0]
    assert sw is not None and sw.trial(3).status is TrialStatus.STOPPED
    assert sw.trial(4).status is TrialStatus.RUNNING and launcher.created == 4


def test_a_preempted_trial_resumes_as_a_run_does_and_stays_in_its_sweep() -> None:
    deps = make()
    launcher, _, clock = parts(deps)
    start_sweep(deps, "p", sweep_id="sw", data_uri="gs://b/d/", snapshot_id="d")
    trial = deps.runs.load("sw-t1")[0]
    assert trial is not None and isinstance(deps.checkpoints, InMemoryCheckpoints)
    written = deps.checkpoints.put(trial.checkpoint_uri, 10)
    trainer_reported(deps, "sw-t1", TrainerReported(1, "checkpoint", clock.now(), step=10,
                                                    checkpoint_uri=written))
    job = launcher.job_of("sw-t1", 1)
    job_changed(deps, "sw-t1", 1, launcher.set_status(job, JobPhase.FAILED,
                                                      failure=FailureClass.PREEMPTED))
    run = deps.runs.load("sw-t1")[0]
    assert run is not None and run.counters.preemptions == 1 and len(run.attempts) == 2
    second = next(j for j in launcher.jobs.values()
                  if j.spec.run_id == "sw-t1" and j.spec.attempt == 2)
    assert second.spec.env["SPOTORCH_RESUME_STEP"] == "10"
    assert json.loads(second.spec.env["SPOTORCH_PARAMS"]) == {"lr": 0.1}
    sw = load_sweep(deps, "sw")[0]
    assert sw is not None and sw.trial(1).status is TrialStatus.RUNNING


def run_all(deps: Deps, losses: dict[str, float]) -> None:
    for _ in range(3):
        for run_id, loss in losses.items():
            run = deps.runs.load(run_id)[0]
            if run is not None and run.active:
                report(deps, run_id, 100, loss)
                succeed(deps, run_id)


def test_the_best_trial_is_registered_once_and_named_in_the_final_event() -> None:
    deps = make()
    _, publisher, _ = parts(deps)
    start_sweep(deps, "p", sweep_id="sw", data_uri="gs://b/d/", snapshot_id="d")
    run_all(deps, {"sw-t1": 0.5, "sw-t2": 0.2, "sw-t3": 0.3, "sw-t4": 0.4})
    sw = load_sweep(deps, "sw")[0]
    assert sw is not None and str(sw.status) == "SUCCEEDED" and sw.best == 2
    assert sw.model_name == "projects/proj/locations/us-central1/models/p@1"
    registry = deps.models
    assert isinstance(registry, MemoryModelRegistry) and registry.uploads == 1
    version = registry.version(sw.model_name)
    assert version.artifact_uri == "gs://m/p/sw-t2" and version.serving_image == "img"
    assert version.labels["spotorch_run"] == "sw-t2" and version.labels["team"] == "ml"
    assert version.labels["spotorch_snapshot"] == "d" and version.labels["spotorch_sweep"] == "sw"
    assert set(version.aliases) >= {"latest", "best"}
    final = publisher.events[-1]
    assert kind_of(final["type"]) == "sweep.succeeded" and validate_event(final) == []
    assert final["data"]["model_name"] == sw.model_name
    assert final["data"]["best"]["trial_run_id"] == "sw-t2"
    tracker = deps.experiments
    assert isinstance(tracker, MemoryExperimentTracker)
    names = tracker.runs_of("p", "us-central1")
    assert len(names) == 4 and [t.experiment_run for t in sw.trials] == list(names)
    logged = tracker.read_run(names[1])
    assert logged.params == {"lr": 0.01} and logged.metrics["loss"] == 0.2
    # everything again (redelivered ends, ticks): nothing more registered, logged or published
    published = len(publisher.events)
    for run_id in ("sw-t1", "sw-t2", "sw-t3", "sw-t4"):
        run = deps.runs.load(run_id)[0]
        assert run is not None
        sweep_service.trial_ended(deps, run)
    tick(deps)
    assert registry.uploads == 1 and len(publisher.events) == published
    assert len(tracker.runs_of("p", "us-central1")) == 4


def test_a_failed_registration_is_retried_by_the_tick_and_registers_once() -> None:
    deps = make()
    _, _, clock = parts(deps)
    registry = deps.models
    assert isinstance(registry, MemoryModelRegistry)
    registry.fail_next = RegistryError("unavailable", permanent=False, code="UNAVAILABLE")
    start_sweep(deps, "p", sweep_id="sw", data_uri="gs://b/d/", snapshot_id="d")
    run_all(deps, {"sw-t1": 0.5, "sw-t2": 0.2, "sw-t3": 0.3, "sw-t4": 0.4})
    sw = load_sweep(deps, "sw")[0]
    assert sw is not None and str(sw.status) == "REGISTERING" and registry.uploads == 0
    # deferred: its claim was released (core.outbox, as a run's intent), so the next tick
    # takes it at once rather than when the claim would have run out
    assert sw.outbox and all(i.claimed_until <= clock.now() for i in sw.outbox)
    tick(deps)
    sw = load_sweep(deps, "sw")[0]
    assert sw is not None and str(sw.status) == "SUCCEEDED" and registry.uploads == 1


def test_cancelling_a_sweep_cancels_its_running_trials_and_starts_no_more() -> None:
    deps = make()
    launcher, publisher, _ = parts(deps)
    start_sweep(deps, "p", sweep_id="sw", data_uri="gs://b/d/", snapshot_id="d")
    sw = cancel_sweep(deps, "sw", "operator")
    assert str(sw.status) == "CANCELLING"
    for n in (1, 2, 3):
        run = deps.runs.load(f"sw-t{n}")[0]
        assert run is not None and run.status is RunStatus.CANCELLING
        job = launcher.job_of(f"sw-t{n}", 1)
        job_changed(deps, f"sw-t{n}", 1, launcher.set_status(job, JobPhase.CANCELLED,
                                                             failure=FailureClass.CANCELLED))
    sw2 = load_sweep(deps, "sw")[0]
    assert sw2 is not None and str(sw2.status) == "CANCELLED"
    assert deps.runs.load("sw-t4")[0] is None and launcher.created == 3
    assert kinds(publisher)[-1] == "sweep.cancelled"


def test_without_a_model_section_nothing_is_registered() -> None:
    deps = make(model=False)
    start_sweep(deps, "p", sweep_id="sw", data_uri="gs://b/d/", snapshot_id="d")
    run_all(deps, {"sw-t1": 0.5, "sw-t2": 0.2, "sw-t3": 0.3, "sw-t4": 0.4})
    sw = load_sweep(deps, "sw")[0]
    assert sw is not None and str(sw.status) == "SUCCEEDED" and sw.model_name is None
    assert isinstance(deps.models, MemoryModelRegistry) and deps.models.uploads == 0


def test_every_trial_trains_on_the_snapshots_generations_even_one_started_after_an_overwrite(
        ) -> None:
    from spotorch.adapters.memory.twins import InMemoryObjectStore
    from spotorch.app.sweeps import start_snapshot_sweep, submit_sweep

    deps = make(spec=replace(SPEC, parallelism=1, early_stopping=None))
    objects = deps.objects
    assert isinstance(objects, InMemoryObjectStore)
    objects.put("b", "d/a.csv", 11, b"first")
    snap = SnapshotReady(pipeline="p", snapshot_id="0123456789abcdef", data_uri="gs://b/d/",
                         objects=("d/a.csv",), generations=(11,), completed_at=1.0)
    sw = start_snapshot_sweep(deps, snap, "complete")
    assert sw.objects == (("d/a.csv", 11),)
    objects.put("b", "d/a.csv", 12, b"overwritten while trial 1 trains")
    succeed(deps, sw.trials[0].run_id)  # trial 1 ends: trial 2 starts now
    second = deps.runs.load(sw.trials[1].run_id)[0]
    assert second is not None and second.provenance is not None
    assert second.provenance["data"]["objects"] == [{"name": "d/a.csv", "generation": 11}]
    first = deps.runs.load(sw.trials[0].run_id)[0]
    assert first is not None and first.provenance is not None
    assert first.provenance["data"]["objects_hash"] == second.provenance["data"]["objects_hash"]
    stored = load_sweep(deps, sw.sweep_id)[0]  # the pinned objects survive the document
    assert stored is not None and stored.objects == (("d/a.csv", 11),)
    # A sweep submitted by hand pins its folder as listed at the request.
    by_hand = submit_sweep(deps, "p", "gs://b/d/", request_id="one")
    assert by_hand.objects == (("d/a.csv", 12),)


def test_a_snapshot_too_large_for_the_sweeps_document_is_not_pinned_for_its_trials() -> None:
    from spotorch.core.provenance import INLINE_OBJECTS_BYTES

    deps = make(spec=replace(SPEC, parallelism=1, early_stopping=None))
    many = tuple((f"d/{i:06d}-{'x' * 40}.csv", 1) for i in range(INLINE_OBJECTS_BYTES // 50))
    sw = start_sweep(deps, "p", sweep_id="big", data_uri="gs://b/d/", snapshot_id="d",
                     objects=many)
    assert sw.objects == ()  # the document stays small; the trials read the folder as it is
    run = deps.runs.load(sw.trials[0].run_id)[0]
    assert run is not None and run.provenance is not None
    assert run.provenance["data"]["pinned"] is False
