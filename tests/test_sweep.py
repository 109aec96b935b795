"""The sweep core: trial planning, the median stopping rule, and sweep decisions as tables."""

from __future__ import annotations

from dataclasses import replace

import pytest

from spotorch.core.context import Context
from spotorch.core.decide import decide, new_run
from spotorch.core.events import kind_of
from spotorch.core.model import RunStatus
from spotorch.core.observations import TrainerReported
from spotorch.core.pipeline import Pipeline, Trigger
from spotorch.core.sweep_spec import (
    Goal,
    MedianStopping,
    ModelRegistration,
    Parameter,
    Scale,
    SearchKind,
    SweepSpec,
)
from spotorch.core.sweeps import (
    SWEEP_TRANSITIONS,
    LogTrial,
    PublishSweepEvent,
    RegisterModel,
    StartTrial,
    StopTrial,
    Sweep,
    SweepCancelRequested,
    SweepContext,
    SweepError,
    SweepEvaluate,
    SweepIntentDone,
    SweepStatus,
    Trial,
    TrialSeen,
    TrialStatus,
    decide_sweep,
    median_verdict,
    new_sweep,
    trial_params,
)
from spotorch.spec.event_schemas import validate_event

T0 = 1_800_000_000.0
GRID = SweepSpec(parameters=(Parameter("lr", values=(0.1, 0.01)), Parameter("bs", values=(32, 64))),
                 parallelism=2, metric="loss", goal=Goal.MINIMIZE,
                 early_stopping=MedianStopping(min_trials=2, min_step=10))


def pipeline(spec: SweepSpec = GRID, model: bool = False) -> Pipeline:
    return Pipeline(name="p", trigger=Trigger(bucket="b"), checkpoint_uri="gs://c/p",
                    output_uri="gs://m/p", sweep=spec,
                    model=ModelRegistration(serving_image="img") if model else None)


def ctx(spec: SweepSpec = GRID, now: float = T0, register: bool = False,
        experiments: bool = False) -> SweepContext:
    return SweepContext(pipeline(spec, register), spec, now, register, experiments)


def fresh(spec: SweepSpec = GRID, **kw: bool) -> Sweep:
    c = ctx(spec, **kw)
    return new_sweep(sweep_id="sw", pipeline=c.pipeline, spec=spec, now=T0, data_uri="gs://b/d/",
                     snapshot_id="d", register=c.register, experiments=c.experiments)


def kinds(sweep: Sweep) -> list[str]:
    return [kind_of(i.event["type"]) for i in sweep.outbox if isinstance(i, PublishSweepEvent)]


def seen(n: int, status: RunStatus, *points: tuple[int, float], cost: float = 0.0) -> TrialSeen:
    return TrialSeen(n, status, step=points[-1][0] if points else None,
                     metric=points[-1][1] if points else None, curve=tuple(points), cost=cost)


# ---------------------------------------------------------------- planning

def test_a_grid_is_the_cartesian_product_in_order_and_trials_cut_it() -> None:
    assert trial_params(GRID) == ({"lr": 0.1, "bs": 32}, {"lr": 0.1, "bs": 64},
                                  {"lr": 0.01, "bs": 32}, {"lr": 0.01, "bs": 64})
    assert len(trial_params(replace(GRID, trials=3))) == 3


def test_random_search_is_reproducible_from_its_seed_and_stays_in_range() -> None:
    spec = SweepSpec(parameters=(Parameter("lr", low=1e-4, high=1e-1, scale=Scale.LOG),
                                 Parameter("layers", low=1, high=4, integer=True),
                                 Parameter("opt", values=("adam", "sgd"))),
                     search=SearchKind.RANDOM, seed=7, trials=20)
    a, b = trial_params(spec), trial_params(spec)
    assert a == b and len(a) == 20
    assert a != trial_params(replace(spec, seed=8))
    assert all(1e-4 <= float(t["lr"]) <= 1e-1 for t in a)
    assert {t["layers"] for t in a} <= {1, 2, 3, 4} and all(isinstance(t["layers"], int) for t in a)
    assert {t["opt"] for t in a} == {"adam", "sgd"}


@pytest.mark.parametrize("spec", [
    SweepSpec(parameters=()),
    SweepSpec(parameters=(Parameter("lr", low=0.1, high=1.0),)),  # a grid needs values
    SweepSpec(parameters=(Parameter("lr", values=(1,)),), search=SearchKind.RANDOM),  # no trials
    SweepSpec(parameters=(Parameter("lr", low=0.0, high=1.0, scale=Scale.LOG),),
              search=SearchKind.RANDOM, trials=2),
])
def test_specs_that_cannot_plan_trials_are_refused(spec: SweepSpec) -> None:
    with pytest.raises(SweepError):
        trial_params(spec)


# ---------------------------------------------------------------- decisions

def test_a_new_sweep_starts_parallelism_trials_and_announces_them() -> None:
    sweep = fresh()
    assert [t.status for t in sweep.trials] == [TrialStatus.RUNNING] * 2 + [TrialStatus.PENDING] * 2
    assert [i.trial for i in sweep.outbox if isinstance(i, StartTrial)] == [1, 2]
    assert kinds(sweep) == ["sweep.created", "sweep.trial_started", "sweep.trial_started"]
    assert [t.run_id for t in sweep.trials] == ["sw-t1", "sw-t2", "sw-t3", "sw-t4"]
    for intent in sweep.outbox:
        if isinstance(intent, PublishSweepEvent):
            assert validate_event(intent.event) == []


def test_a_trial_that_ends_frees_its_slot_and_becomes_best_so_far() -> None:
    sweep = decide_sweep(fresh(), seen(1, RunStatus.SUCCEEDED, (10, 0.5), (20, 0.3)), ctx())
    assert sweep.trial(1).status is TrialStatus.SUCCEEDED and sweep.best == 1
    assert sweep.trial(3).status is TrialStatus.RUNNING
    assert [i.trial for i in sweep.outbox if isinstance(i, StartTrial)] == [1, 2, 3]
    assert kinds(sweep)[-2:] == ["sweep.trial_ended", "sweep.trial_started"]


# (trial 1's curve, trial 2's curve, trial 3's curve) -> is trial 3 stopped?
MEDIAN_TABLE = [
    # worse than the median of the two others at the same step: stopped
    (((10, 0.5),), ((10, 0.4),), ((10, 0.9),), True),
    # better than the median: goes on
    (((10, 0.5),), ((10, 0.4),), ((10, 0.3),), False),
    # the others reported other steps: nothing to compare at step 10
    (((11, 0.5),), ((12, 0.4),), ((10, 0.9),), False),
    # the others' last values at or before step 10, since both got past it: stopped
    (((8, 0.5), (12, 0.45)), ((9, 0.4), (11, 0.3)), ((10, 0.9),), True),
    # one other has not reached step 10 yet: it does not count, so too few (min_trials 2)
    (((8, 0.5), (12, 0.45)), ((9, 0.4),), ((10, 0.9),), False),
    # only one other trial at that step (min_trials 2): not yet
    (((10, 0.5),), (), ((10, 0.9),), False),
    # before min_step (warm-up): never
    (((5, 0.5),), ((5, 0.4),), ((5, 0.9),), False),
    # its best value up to the step counts, not only the last one
    (((10, 0.5), (20, 0.5)), ((10, 0.4), (20, 0.5)), ((10, 0.2), (20, 0.9)), False),
]


@pytest.mark.parametrize("c1,c2,c3,stopped", MEDIAN_TABLE)
def test_the_median_stopping_rule(c1: tuple[tuple[int, float], ...], c2: tuple[tuple[int, float], ...],
                                  c3: tuple[tuple[int, float], ...], stopped: bool) -> None:
    spec = replace(GRID, parallelism=3)
    sweep = fresh(spec)
    sweep = decide_sweep(sweep, seen(1, RunStatus.RUNNING, *c1), ctx(spec))
    sweep = decide_sweep(sweep, seen(2, RunStatus.RUNNING, *c2), ctx(spec))
    sweep = decide_sweep(sweep, seen(3, RunStatus.RUNNING, *c3), ctx(spec))
    stops = [i for i in sweep.outbox if isinstance(i, StopTrial)]
    assert (sweep.trial(3).status is TrialStatus.STOPPING) is stopped
    assert [s.trial for s in stops if s.trial == 3] == ([3] if stopped else [])
    stopped_events = [i.event["data"]["trial"] for i in sweep.outbox
                      if isinstance(i, PublishSweepEvent)
                      and kind_of(i.event["type"]) == "sweep.trial_stopped"]
    assert (3 in stopped_events) is stopped


def test_median_rule_for_maximize_goals() -> None:
    trial = Trial(3, {}, "r3", TrialStatus.RUNNING, curve=((10, 0.2),))
    others = [Trial(1, {}, "r1", curve=((10, 0.8),)), Trial(2, {}, "r2", curve=((10, 0.6),))]
    assert median_verdict(trial, others, Goal.MAXIMIZE, MedianStopping(2, 1)) == (10, 0.2, 0.7)
    assert median_verdict(trial, others, Goal.MINIMIZE, MedianStopping(2, 1)) is None


def test_a_stopped_trial_ends_stopped_when_its_run_is_cancelled_and_is_never_best() -> None:
    spec = replace(GRID, parallelism=3)
    sweep = fresh(spec)
    for n, v in ((1, 0.5), (2, 0.4), (3, 0.9)):
        sweep = decide_sweep(sweep, seen(n, RunStatus.RUNNING, (10, v)), ctx(spec))
    sweep = decide_sweep(sweep, seen(3, RunStatus.CANCELLING, (10, 0.9)), ctx(spec))
    assert sweep.trial(3).status is TrialStatus.STOPPING
    sweep = decide_sweep(sweep, seen(3, RunStatus.CANCELLED, (10, 0.9)), ctx(spec))
    assert sweep.trial(3).status is TrialStatus.STOPPED and sweep.trial(3).stopped_early
    assert sweep.best is None  # a stopped trial did not succeed


def finish_all(sweep: Sweep, c: SweepContext, results: dict[int, tuple[RunStatus, float]]) -> Sweep:
    for n, (status, value) in results.items():
        if sweep.trial(n).status is TrialStatus.PENDING:
            continue
        sweep = decide_sweep(sweep, seen(n, status, (100, value), cost=0.1), c)
    return sweep


def run_through(sweep: Sweep, c: SweepContext, results: dict[int, tuple[RunStatus, float]]) -> Sweep:
    for _ in range(len(results)):
        sweep = finish_all(sweep, c, results)
    return sweep


# (trial results, register) -> (sweep status, best trial, pending register intent)
END_TABLE = [
    ({1: (RunStatus.SUCCEEDED, 0.5), 2: (RunStatus.SUCCEEDED, 0.2), 3: (RunStatus.FAILED, 0.1),
      4: (RunStatus.SUCCEEDED, 0.3)}, False, SweepStatus.SUCCEEDED, 2, False),
    ({1: (RunStatus.SUCCEEDED, 0.5), 2: (RunStatus.SUCCEEDED, 0.2), 3: (RunStatus.FAILED, 0.1),
      4: (RunStatus.SUCCEEDED, 0.3)}, True, SweepStatus.REGISTERING, 2, True),
    ({1: (RunStatus.FAILED, 0.5), 2: (RunStatus.FAILED_PREEMPTED, 0.2),
      3: (RunStatus.CANCELLED, 0.1), 4: (RunStatus.FAILED_BUDGET, 0.3)}, True,
     SweepStatus.FAILED, None, False),
]


@pytest.mark.parametrize("results,register,status,best,registering", END_TABLE)
def test_a_sweep_ends_when_its_trials_end(results: dict[int, tuple[RunStatus, float]],
                                          register: bool, status: SweepStatus, best: int | None,
                                          registering: bool) -> None:
    c = ctx(register=register)
    sweep = run_through(fresh(register=register), c, results)
    assert sweep.status is status and sweep.best == best
    regs = [i for i in sweep.outbox if isinstance(i, RegisterModel)]
    assert bool(regs) is registering
    if registering:
        assert regs[0].run_id == "sw-t2" and regs[0].artifact_uri == "gs://m/p/sw-t2"
        name = "projects/p/locations/us-central1/models/p@3"
        done = decide_sweep(sweep, SweepIntentDone(regs[0].id, model_name=name), c)
        assert done.status is SweepStatus.SUCCEEDED and done.model_name == name
        final = [i.event for i in done.outbox if isinstance(i, PublishSweepEvent)][-1]
        assert final["data"]["model_name"] == name and final["data"]["best"]["trial"] == 2
        assert validate_event(final) == []
        # the result delivered twice changes nothing more
        assert decide_sweep(done, SweepIntentDone(regs[0].id, model_name=name), c) == done


def test_cancelling_stops_running_trials_cancels_pending_ones_and_ends_when_they_end() -> None:
    sweep = decide_sweep(fresh(), SweepCancelRequested("operator"), ctx())
    assert sweep.status is SweepStatus.CANCELLING
    assert [t.status for t in sweep.trials] == [TrialStatus.STOPPING] * 2 + \
        [TrialStatus.CANCELLED] * 2
    assert [i.trial for i in sweep.outbox if isinstance(i, StopTrial)] == [1, 2]
    sweep = decide_sweep(sweep, seen(1, RunStatus.CANCELLED), ctx())
    assert sweep.status is SweepStatus.CANCELLING
    assert not any(isinstance(i, StartTrial) and i.trial > 2 for i in sweep.outbox)
    sweep = decide_sweep(sweep, seen(2, RunStatus.SUCCEEDED, (100, 0.1)), ctx())
    assert sweep.status is SweepStatus.CANCELLED and kinds(sweep)[-1] == "sweep.cancelled"
    assert decide_sweep(sweep, SweepCancelRequested("again"), ctx()) == sweep


def test_ended_trials_never_change_and_a_repeated_observation_writes_nothing() -> None:
    sweep = decide_sweep(fresh(), seen(1, RunStatus.SUCCEEDED, (10, 0.5)), ctx())
    assert decide_sweep(sweep, seen(1, RunStatus.SUCCEEDED, (10, 0.5)), ctx()) == sweep
    assert decide_sweep(sweep, seen(1, RunStatus.FAILED, (10, 0.9)), ctx()) == sweep
    running = decide_sweep(sweep, seen(2, RunStatus.RUNNING, (5, 0.5)), ctx())
    assert decide_sweep(running, seen(2, RunStatus.RUNNING, (5, 0.5)), ctx()) == running
    assert decide_sweep(running, SweepEvaluate(), ctx()) == running


def test_every_ended_trial_is_logged_to_experiments_when_asked() -> None:
    c = ctx(experiments=True)
    sweep = decide_sweep(fresh(experiments=True), seen(1, RunStatus.SUCCEEDED, (10, 0.5)), c)
    logs = [i for i in sweep.outbox if isinstance(i, LogTrial)]
    assert [i.trial for i in logs] == [1]
    sweep = decide_sweep(sweep, SweepIntentDone(logs[0].id, experiment_run="p-sw-t1"), c)
    assert sweep.trial(1).experiment_run == "p-sw-t1"


def test_every_status_has_its_transitions_and_terminal_ones_have_none() -> None:
    assert set(SWEEP_TRANSITIONS) == set(SweepStatus)
    assert all(not SWEEP_TRANSITIONS[s] for s in SweepStatus if s.terminal)


def test_the_sweep_document_round_trips() -> None:
    sweep = decide_sweep(fresh(), seen(1, RunStatus.RUNNING, (10, 0.5), (20, 0.4)), ctx())
    doc = sweep.to_dict()
    assert doc["active"] is True
    assert doc["trials"][0]["curve"] == [{"step": 10, "value": 0.5}, {"step": 20, "value": 0.4}]
    assert Sweep.from_dict(doc) == sweep


def test_a_trial_run_records_the_sweep_metric_by_step_and_a_resume_rewrites_repeated_steps() -> None:
    p = pipeline()
    run = new_run(run_id="sw-t1", pipeline=p, now=T0, data_uri="gs://b/d/", snapshot_id="d",
                  sweep_id="sw", params={"lr": 0.1})
    c = Context(p, T0)
    for step, loss in ((10, 0.9), (20, 0.7), (30, 0.6)):
        run = decide(run, TrainerReported(1, "progress", T0 + step, step=step,
                                          metrics={"loss": loss}), c)
    run = decide(run, TrainerReported(1, "progress", T0 + 40, step=20, metrics={"loss": 0.65}), c)
    assert [(pt.step, pt.value) for pt in run.curve] == [(10, 0.9), (20, 0.65)]
    assert run.params == {"lr": 0.1}
    plain = new_run(run_id="r", pipeline=p, now=T0, data_uri="gs://b/d/", snapshot_id="d")
    plain = decide(plain, TrainerReported(1, "progress", T0, step=10, metrics={"loss": 1.0}), c)
    assert plain.curve == ()


def test_a_trial_reads_its_parameters_and_they_override_the_pipeline_env() -> None:
    import sys
    from pathlib import Path

    from spotorch_trainer import EnvError, params

    assert params({}) == {} and params({"SPOTORCH_PARAMS": '{"lr": 0.05}'}) == {"lr": 0.05}
    with pytest.raises(EnvError):
        params({"SPOTORCH_PARAMS": "[1, 2]"})
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))
    import train  # examples/train.py

    env = {"SPOTORCH_PARAMS": '{"lr": 0.05}', "EXAMPLE_LR": "0.2", "EXAMPLE_TOTAL_STEPS": "30"}
    cfg = train.parse_config([], env)
    assert cfg.lr == 0.05 and cfg.total_steps == 30
    assert train.parse_config(["--lr", "0.3"], env).lr == 0.3
