"""Sweeps searched by Vizier through the service layer, on the in-memory twins: each suggestion is
a trial run, its progress goes to its Vizier trial (after a resume too), it is completed with its
objectives or as infeasible with the reason, and the choice is the best quality within the
constraints (or nothing registered, saying so)."""

from __future__ import annotations

import json

import pytest

from fakes import fake_deps
from spotorch.adapters.memory.registry import MemoryExperimentTracker, MemoryModelRegistry
from spotorch.adapters.memory.twins import InMemoryCheckpoints, InMemoryLauncher, ManualClock
from spotorch.adapters.memory.vizier import MemoryTrialSearch
from spotorch.app import sweeps as sweep_service
from spotorch.app.deps import Deps
from spotorch.app.job_events import job_changed, trainer_reported
from spotorch.app.sweeps import NotASweepPipeline, load_sweep, start_sweep
from spotorch.app.tick import tick
from spotorch.core.model import FailureClass, JobPhase
from spotorch.core.observations import TrainerReported
from spotorch.core.pipeline import EscalationKind, OnActiveRun, Pipeline, RecoveryPolicy, Trigger
from spotorch.core.sweep_spec import (
    Bound,
    Goal,
    MetricGoal,
    ModelRegistration,
    Parameter,
    Scale,
    SearchKind,
    SweepSpec,
)
from spotorch.core.sweeps import SuggestTrial, SweepIntentDone, SweepStatus, TrialStatus, trade_off
from spotorch.ports.vizier import COMPLETED

SPEC = SweepSpec(parameters=(Parameter("lr", low=1e-4, high=1e-1, scale=Scale.LOG),
                             Parameter("width", values=(16, 64, 256))),
                 search=SearchKind.VIZIER, trials=3, parallelism=2,
                 metrics=(MetricGoal("accuracy", Goal.MAXIMIZE),
                          MetricGoal("latency_p95_ms", Goal.MINIMIZE),
                          MetricGoal("cost", Goal.MINIMIZE)),
                 constraints=(("latency_p95_ms", Bound(max=20.0)),))


def make(spec: SweepSpec = SPEC, *, search: bool = True) -> Deps:
    p = Pipeline(name="p", trigger=Trigger(bucket="b", on_active_run=OnActiveRun.QUEUE),
                 checkpoint_uri="gs://c/p", output_uri="gs://m/p",
                 recovery=RecoveryPolicy(escalation=EscalationKind.NEVER, backoff_base_s=1.0,
                                         max_user_errors=0),
                 sweep=spec, model=ModelRegistration(serving_image="img"))
    deps = fake_deps(p)
    deps.models = MemoryModelRegistry("proj")
    deps.experiments = MemoryExperimentTracker("proj")
    deps.search = MemoryTrialSearch("proj") if search else None
    return deps


def parts(deps: Deps) -> tuple[InMemoryLauncher, ManualClock, MemoryTrialSearch]:
    assert isinstance(deps.launcher, InMemoryLauncher) and isinstance(deps.clock, ManualClock)
    assert isinstance(deps.search, MemoryTrialSearch)
    return deps.launcher, deps.clock, deps.search


def report(deps: Deps, run_id: str, step: int, attempt: int = 1, kind: str = "progress",
           **metrics: float) -> None:
    _, clock, _ = parts(deps)
    clock.advance(2)
    trainer_reported(deps, run_id, TrainerReported(attempt, kind, clock.now(), step=step,
                                                   total_steps=100, metrics=metrics))


def finish(deps: Deps, run_id: str, attempt: int = 1, **metrics: float) -> None:
    launcher, _, _ = parts(deps)
    report(deps, run_id, 100, attempt, "progress", **metrics)
    report(deps, run_id, 100, attempt, "completed", **metrics)
    job_changed(deps, run_id, attempt, launcher.set_status(launcher.job_of(run_id, attempt),
                                                           JobPhase.SUCCEEDED))


def study_trials(deps: Deps) -> dict[str, object]:
    _, _, search = parts(deps)
    (name, book), = search.books.items()
    return {t.client_id: search.trial(f"{name}/trials/{t.id}") for t in book.trials}


def test_each_suggestion_becomes_a_trial_run_with_its_parameters() -> None:
    deps = make()
    launcher, _, search = parts(deps)
    sw = start_sweep(deps, "p", sweep_id="sw", data_uri="gs://b/d/", snapshot_id="d")
    assert launcher.created == 2 and sw.outbox == () and sw.study is not None
    trials = study_trials(deps)
    assert set(trials) == {"sw-t1", "sw-t2"}  # client id: the trial's run id
    for number in (1, 2):
        run = deps.runs.load(f"sw-t{number}")[0]
        vizier = trials[f"sw-t{number}"]
        assert run is not None and run.params == vizier.params  # type: ignore[attr-defined]
        assert sw.trial(number).study_trial == vizier.name  # type: ignore[attr-defined]
        env = next(j.spec.env for j in launcher.jobs.values() if j.spec.run_id == f"sw-t{number}")
        assert json.loads(env["SPOTORCH_PARAMS"]) == run.params
    assert sw.trial(3).status is TrialStatus.PENDING and sw.trial(3).params == {}
    book, = search.books.values()
    assert book.config.display_name == "sw" and len(book.config.objectives) == 3


def test_a_redelivered_suggestion_gets_the_same_vizier_trial() -> None:
    deps = make()
    _, _, search = parts(deps)
    sw = start_sweep(deps, "p", sweep_id="sw", data_uri="gs://b/d/", snapshot_id="d")
    again = sweep_service._perform(deps, sw, SuggestTrial(id="sw/99", trial=1))
    assert isinstance(again, SweepIntentDone) and again.study_trial == sw.trial(1).study_trial
    assert again.params == sw.trial(1).params
    assert len(next(iter(search.books.values())).trials) == 2  # nothing new was suggested


def test_a_preempted_trial_keeps_its_vizier_trial_and_is_measured_after_the_resume() -> None:
    deps = make()
    launcher, clock, search = parts(deps)
    start_sweep(deps, "p", sweep_id="sw", data_uri="gs://b/d/", snapshot_id="d")
    report(deps, "sw-t1", 10, accuracy=0.5)
    tick(deps)
    run = deps.runs.load("sw-t1")[0]
    assert run is not None and isinstance(deps.checkpoints, InMemoryCheckpoints)
    written = deps.checkpoints.put(run.checkpoint_uri, 10)
    trainer_reported(deps, "sw-t1", TrainerReported(1, "checkpoint", clock.now(), step=10,
                                                    checkpoint_uri=written))
    job_changed(deps, "sw-t1", 1, launcher.set_status(launcher.job_of("sw-t1", 1), JobPhase.FAILED,
                                                      failure=FailureClass.PREEMPTED))
    clock.advance(30)
    tick(deps)
    run = deps.runs.load("sw-t1")[0]
    assert run is not None and len(run.attempts) == 2 and run.attempts[1].resumed_from_step == 10
    report(deps, "sw-t1", 30, attempt=2, accuracy=0.7)
    tick(deps)
    sw = load_sweep(deps, "sw")[0]
    assert sw is not None
    vizier = search.trial(sw.trial(1).study_trial or "")
    assert [m.step for m in vizier.measurements] == [10, 30]  # the same Vizier trial, resumed
    assert len(study_trials(deps)) == 2


def test_the_choice_is_the_best_quality_within_the_constraints() -> None:
    deps = make()
    _, _, search = parts(deps)
    start_sweep(deps, "p", sweep_id="sw", data_uri="gs://b/d/", snapshot_id="d")
    finish(deps, "sw-t1", accuracy=0.95, latency_p95_ms=35.0)  # best, but too slow
    finish(deps, "sw-t2", accuracy=0.90, latency_p95_ms=12.0)
    finish(deps, "sw-t3", accuracy=0.80, latency_p95_ms=15.0)  # dominated by t2
    sw = load_sweep(deps, "sw")[0]
    assert sw is not None and sw.status is SweepStatus.SUCCEEDED and sw.best == 2
    assert sw.model_name is not None
    assert all(t.state == COMPLETED and not t.infeasible  # type: ignore[attr-defined]
               for t in study_trials(deps).values())
    final = search.trial(sw.trial(2).study_trial or "").final
    assert final is not None and set(final) == {"accuracy", "latency_p95_ms", "cost"}
    made = trade_off(sw, SPEC)
    assert made["chosen"] == 2 and made["pareto"] == [1, 2]
    assert made["constraints"] == {"latency_p95_ms": {"max": 20.0}}
    assert made["misses"] == {"1": ["latency_p95_ms 35 > max 20"]}
    assert "best accuracy (0.9) among the 2 of 3 trials" in made["why"]
    from spotorch.adapters.memory.twins import InMemoryPublisher
    from spotorch.spec.event_schemas import validate_event

    assert isinstance(deps.publisher, InMemoryPublisher)
    final = deps.publisher.events[-1]
    assert final["type"].endswith("sweep.succeeded.v1") and final["data"]["trade_off"]["chosen"] == 2
    assert all(validate_event(e) == [] for e in deps.publisher.events)


def test_no_trial_meeting_the_constraints_registers_nothing_and_says_so() -> None:
    deps = make()
    start_sweep(deps, "p", sweep_id="sw", data_uri="gs://b/d/", snapshot_id="d")
    for run_id in ("sw-t1", "sw-t2", "sw-t3"):
        finish(deps, run_id, accuracy=0.9, latency_p95_ms=40.0)
    sw = load_sweep(deps, "sw")[0]
    assert sw is not None and sw.status is SweepStatus.FAILED and sw.model_name is None
    assert sw.end_reason is not None and sw.end_reason.startswith("no trial meets the constraints")
    assert "latency_p95_ms 40 > max 20" in sw.end_reason
    assert isinstance(deps.models, MemoryModelRegistry) and deps.models.uploads == 0


def test_a_trial_failed_for_good_is_completed_infeasible_with_its_reason() -> None:
    deps = make()
    launcher, _, search = parts(deps)
    start_sweep(deps, "p", sweep_id="sw", data_uri="gs://b/d/", snapshot_id="d")
    job_changed(deps, "sw-t1", 1, launcher.set_status(launcher.job_of("sw-t1", 1), JobPhase.FAILED,
                                                      failure=FailureClass.USER_ERROR))
    sw = load_sweep(deps, "sw")[0]
    assert sw is not None and sw.trial(1).status is TrialStatus.FAILED
    vizier = search.trial(sw.trial(1).study_trial or "")
    assert vizier.infeasible and vizier.infeasible_reason.startswith("run FAILED")
    assert sw.trial(3).status is TrialStatus.RUNNING  # its slot went to the next suggestion


def test_a_succeeded_trial_missing_an_objective_is_infeasible() -> None:
    deps = make()
    _, _, search = parts(deps)
    start_sweep(deps, "p", sweep_id="sw", data_uri="gs://b/d/", snapshot_id="d")
    finish(deps, "sw-t1", accuracy=0.9)  # no latency reported
    sw = load_sweep(deps, "sw")[0]
    assert sw is not None
    vizier = search.trial(sw.trial(1).study_trial or "")
    assert vizier.infeasible and "latency_p95_ms" in vizier.infeasible_reason


def test_experiments_log_every_reported_metric_cost_and_latency() -> None:
    deps = make()
    start_sweep(deps, "p", sweep_id="sw", data_uri="gs://b/d/", snapshot_id="d")
    finish(deps, "sw-t1", accuracy=0.9, latency_p95_ms=12.0, latency_p50_ms=8.0,
           model_size_bytes=4096.0)
    tracker = deps.experiments
    assert isinstance(tracker, MemoryExperimentTracker)
    logged, = tracker.runs.values()
    assert logged.metrics["latency_p95_ms"] == 12.0 and logged.metrics["model_size_bytes"] == 4096
    assert logged.metrics["accuracy"] == 0.9 and "cost" in logged.metrics
    assert set(logged.params) == {"lr", "width"}


def test_a_vizier_sweep_without_a_vizier_client_is_refused() -> None:
    deps = make(search=False)
    with pytest.raises(NotASweepPipeline, match="vizier"):
        start_sweep(deps, "p", sweep_id="sw", data_uri="gs://b/d/", snapshot_id="d")


def test_single_metric_sweeps_keep_their_keys_and_choice() -> None:
    spec = SweepSpec(parameters=(Parameter("lr", values=(0.1, 0.01)),), metric="loss",
                     goal=Goal.MINIMIZE, parallelism=2)
    deps = make(spec)
    start_sweep(deps, "p", sweep_id="sw", data_uri="gs://b/d/", snapshot_id="d")
    finish(deps, "sw-t1", loss=0.4)
    finish(deps, "sw-t2", loss=0.2)
    sw = load_sweep(deps, "sw")[0]
    assert sw is not None and sw.status is SweepStatus.SUCCEEDED and sw.best == 2
    assert sw.study is None and all(t.study_trial is None for t in sw.trials)


# --- the file format -----------------------------------------------------------------------------

PIPELINE = """\
name: tradeoff
trigger: {bucket: landing, prefix: data/}
job:
  worker_pools:
    - {machine_type: n1-standard-4, image_uri: python:3.11-slim}
checkpoint_uri: gs://ckpt/t
output_uri: gs://models/t
sweep:
  search: vizier
  trials: 8
  parameters:
    - {name: lr, low: 0.0001, high: 0.1, scale: log}
  %s
"""


def load(tmp_path: object, body: str) -> object:
    from pathlib import Path

    from spotorch.spec.loader import load_pipeline

    path = Path(str(tmp_path)) / "p.yaml"
    path.write_text(PIPELINE % body)
    return load_pipeline(path)


def test_a_file_names_several_objectives_and_constraints(tmp_path: object) -> None:
    pipeline = load(tmp_path, "metrics: [{name: accuracy, goal: maximize}, "
                              "{name: latency_p95_ms, goal: minimize}]\n"
                              "  constraints: {latency_p95_ms: {max: 20}, cost: {max: 5.0}}")
    spec = pipeline.sweep  # type: ignore[attr-defined]
    assert spec.search is SearchKind.VIZIER and spec.quality == "accuracy"
    assert spec.quality_goal is Goal.MAXIMIZE
    assert spec.constraints == (("latency_p95_ms", Bound(max=20.0)), ("cost", Bound(max=5.0)))
    assert hash(pipeline)


@pytest.mark.parametrize(("body", "where", "words"), [
    ("metric: loss\n  metrics: [{name: accuracy, goal: maximize}]", "sweep.metrics",
     "replaces metric and goal"),
    ("metrics: [{name: a, goal: maximize}, {name: a, goal: minimize}]", "sweep.metrics",
     "names a twice"),
    ("constraints: {latency_p95_ms: {}}", "sweep.constraints.latency_p95_ms", "needs max, min"),
    ("constraints: {cost: {max: 1, min: 2}}", "sweep.constraints.cost", "min is above max"),
    ("metrics: [{name: accuracy}]", "sweep.metrics[0].goal", ""),
])
def test_a_file_with_a_wrong_sweep_is_refused_naming_what(tmp_path: object, body: str,
                                                          where: str, words: str) -> None:
    from spotorch.core.errors import ConfigError

    with pytest.raises(ConfigError) as caught:
        load(tmp_path, body)
    found = {p.path: p.message for p in caught.value.problems}
    assert where in found and words in found[where], found


def test_a_vizier_search_needs_a_trial_budget(tmp_path: object) -> None:
    from pathlib import Path

    from spotorch.core.errors import ConfigError
    from spotorch.spec.loader import load_pipeline

    path = Path(str(tmp_path)) / "p.yaml"
    path.write_text((PIPELINE % "").replace("  trials: 8\n", ""))
    with pytest.raises(ConfigError) as caught:
        load_pipeline(path)
    assert [(p.path, p.message) for p in caught.value.problems] == [
        ("sweep.trials", "a vizier search needs a number of trials (its budget) (line 9)")]


def test_a_suggestion_vizier_refuses_for_good_fails_its_trial_and_is_not_retried() -> None:
    from spotorch.ports.vizier import SearchError

    deps = make()
    _, _, search = parts(deps)
    search.fail_next = SearchError("study spec refused: INVALID_ARGUMENT", permanent=True,
                                   code="INVALID_ARGUMENT")
    sw = start_sweep(deps, "p", sweep_id="sw", data_uri="gs://b/d/", snapshot_id="d")
    assert sw.trial(1).status is TrialStatus.FAILED and sw.outbox == ()
    assert "Vizier refused suggest_trial" in (sw.trial(1).end_reason or "")
    assert [t.status for t in sw.trials[1:]] == [TrialStatus.RUNNING, TrialStatus.RUNNING]


def test_a_transient_refusal_stays_in_the_outbox_for_the_tick() -> None:
    from spotorch.ports.vizier import SearchError

    deps = make()
    _, clock, search = parts(deps)
    search.fail_next = SearchError("UNAVAILABLE after 5 attempts", permanent=False,
                                   code="UNAVAILABLE")
    sw = start_sweep(deps, "p", sweep_id="sw", data_uri="gs://b/d/", snapshot_id="d")
    assert sw.trial(1).status is TrialStatus.SUGGESTING
    assert [i.kind for i in sw.outbox] == ["suggest_trial"]
    clock.advance(200)  # past the intent's lease
    tick(deps)
    after = load_sweep(deps, "sw")[0]
    assert after is not None and after.trial(1).status is TrialStatus.RUNNING
    assert after.outbox == ()


def test_a_trial_cancelled_while_suggested_completes_its_vizier_trial_infeasible() -> None:
    from spotorch.app.sweeps import cancel_sweep
    from spotorch.ports.vizier import SearchError

    deps = make()
    _, clock, search = parts(deps)
    search.fail_next = SearchError("UNAVAILABLE", permanent=False, code="UNAVAILABLE")
    start_sweep(deps, "p", sweep_id="sw", data_uri="gs://b/d/", snapshot_id="d")
    sw = cancel_sweep(deps, "sw")
    assert sw.trial(1).status is TrialStatus.CANCELLED
    clock.advance(200)
    tick(deps)  # the suggestion's retry comes back: its Vizier trial is not left active
    after = load_sweep(deps, "sw")[0]
    assert after is not None and after.trial(1).study_trial is not None
    assert after.status is SweepStatus.CANCELLED  # once the suggestion was answered
    vizier = search.trial(after.trial(1).study_trial or "")
    assert vizier.infeasible and vizier.infeasible_reason == "trial cancelled before it started"


def test_the_event_schemas_know_every_search() -> None:
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent / "schemas" / "events"
    created = json.loads((root / "sweep.created.v1.schema.json").read_text())
    assert set(created["properties"]["data"]["properties"]["search"]["enum"]) == {
        str(k) for k in SearchKind}
    for kind in ("succeeded", "failed", "cancelled"):
        schema = json.loads((root / f"sweep.{kind}.v1.schema.json").read_text())
        trade = schema["properties"]["data"]["properties"]["trade_off"]["properties"]
        assert set(trade["search"]["enum"]) == {str(k) for k in SearchKind}
