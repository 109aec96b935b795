"""A plain run's model registered in Model Registry: in the outbox after the success write,
named in run.succeeded and its alert, registered once under redelivery and crashes."""

from __future__ import annotations

import pytest

from fakes import fake_deps
from spotorch.adapters.memory.registry import MemoryExperimentTracker, MemoryModelRegistry
from spotorch.adapters.memory.twins import InMemoryLauncher, InMemoryPublisher, ManualClock
from spotorch.app.deps import Deps
from spotorch.app.job_events import job_changed
from spotorch.app.runs import cancel_run, start_run
from spotorch.app.tick import tick
from spotorch.core.alerts import render_alert
from spotorch.core.events import kind_of
from spotorch.core.model import JobPhase, RunStatus
from spotorch.core.pipeline import Pipeline, Trigger
from spotorch.core.sweep_spec import ModelRegistration
from spotorch.ports.registry import RegistryError
from spotorch.spec.event_schemas import validate_event


def make(model: bool = True) -> tuple[Deps, MemoryModelRegistry]:
    p = Pipeline(name="churn", trigger=Trigger(bucket="b"), checkpoint_uri="gs://c/churn",
                 output_uri="gs://m/churn",
                 model=ModelRegistration(serving_image="img", aliases=("latest", "prod"))
                 if model else None)
    deps = fake_deps(p)
    registry = MemoryModelRegistry("proj")
    deps.models = registry
    deps.experiments = MemoryExperimentTracker("proj")
    return deps, registry


def finish(deps: Deps, run_id: str = "r1") -> None:
    launcher = deps.launcher
    assert isinstance(launcher, InMemoryLauncher)
    job_changed(deps, run_id, 1, launcher.set_status(launcher.job_of(run_id, 1),
                                                     JobPhase.SUCCEEDED), event_id="e-success")


def start(deps: Deps, run_id: str = "r1") -> None:
    start_run(deps, "churn", run_id=run_id, data_uri="gs://b/d/", snapshot_id="daily/1",
              reason="t")


def succeeded_event(deps: Deps) -> dict[str, object]:
    publisher = deps.publisher
    assert isinstance(publisher, InMemoryPublisher)
    found = [e for e in publisher.events if kind_of(e["type"]) == "run.succeeded"]
    assert len(found) == 1
    return found[0]


def test_a_succeeded_run_registers_its_model_and_names_it_in_event_and_alert() -> None:
    deps, registry = make()
    start(deps)
    finish(deps)
    run = deps.runs.load("r1")[0]
    assert run is not None and run.status is RunStatus.SUCCEEDED
    assert run.model_name == "projects/proj/locations/us-central1/models/churn@1"
    version = registry.version(run.model_name)
    assert version.artifact_uri == "gs://m/churn/r1"
    prov = run.provenance
    assert prov is not None
    assert version.labels == {"spotorch_pipeline": "churn", "spotorch_run": "r1",
                              "spotorch_snapshot": "daily/1",
                              # issue 30: provenance as label values Vertex accepts
                              "spotorch_pipeline_hash": prov["pipeline"]["hash"][:16],
                              "spotorch_code_hash": prov["code"]["hash"][:16],
                              "spotorch_code_pinned": "false",
                              "spotorch_seed": str(prov["seed"]),
                              "spotorch_data_objects": "0"}
    assert set(version.aliases) == {"default", "latest", "prod"}
    event = succeeded_event(deps)
    assert event["data"]["model_name"] == run.model_name and validate_event(event) == []  # type: ignore[index]
    assert run.model_name in render_alert(event).headline
    tracker = deps.experiments
    assert isinstance(tracker, MemoryExperimentTracker)
    (logged,) = tracker.runs_of("churn", "us-central1")
    assert tracker.read_run(logged).run_id == "r1" and "cost" in tracker.read_run(logged).metrics
    assert tracker.read_run(logged).provenance["seed"] == str(prov["seed"])
    assert tracker.read_run(logged).provenance["code_hash"] == prov["code"]["hash"]
    finish(deps)  # redelivered success
    assert registry.uploads == 1 and len([e for e in deps.publisher.events  # type: ignore[attr-defined]
                                          if kind_of(e["type"]) == "run.succeeded"]) == 1


def test_a_transient_failure_keeps_the_run_registering_until_the_tick_retries() -> None:
    deps, registry = make()
    clock = deps.clock
    assert isinstance(clock, ManualClock)
    registry.fail_next = RegistryError("unavailable", permanent=False, code="UNAVAILABLE")
    start(deps)
    finish(deps)
    run = deps.runs.load("r1")[0]
    assert run is not None and run.status is RunStatus.REGISTERING and run.active
    assert cancel_run(deps, "r1").status is RunStatus.REGISTERING  # the model is trained
    clock.advance(121)  # the writer's claim has expired
    tick(deps)
    run = deps.runs.load("r1")[0]
    assert run is not None and run.status is RunStatus.SUCCEEDED and registry.uploads == 1
    assert succeeded_event(deps)["data"]["model_name"] == run.model_name  # type: ignore[index]


def test_a_refused_registration_ends_the_run_succeeded_without_a_model_and_says_why() -> None:
    deps, registry = make()
    registry.fail_next = RegistryError("bad image", permanent=True, code="INVALID_ARGUMENT")
    start(deps)
    finish(deps)
    run = deps.runs.load("r1")[0]
    assert run is not None and run.status is RunStatus.SUCCEEDED and run.model_name is None
    event = succeeded_event(deps)
    assert "bad image" in str(event["data"]["model_error"]) and validate_event(event) == []  # type: ignore[index]


@pytest.mark.parametrize("model", [False])
def test_without_a_model_section_the_run_succeeds_at_once(model: bool) -> None:
    deps, registry = make(model)
    start(deps)
    finish(deps)
    run = deps.runs.load("r1")[0]
    assert run is not None and run.status is RunStatus.SUCCEEDED and run.model_name is None
    assert registry.uploads == 0
