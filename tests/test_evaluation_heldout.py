"""Held-out evaluation, pinned (issue 37): the pipeline names its evaluation data, the attempt's
environment tells the trainer, the trainer helper splits by a stable hash and reports eval_*
metrics on its signed completed report, and the run's provenance and model labels record it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fakes import fake_deps
from spotorch.adapters.memory.registry import MemoryModelRegistry
from spotorch.adapters.memory.twins import InMemoryLauncher
from spotorch.app.runs import start_run
from spotorch.core.pipeline import Pipeline, Trigger
from spotorch.core.promotion import Evaluation, HashSplit, PromotionPolicy
from spotorch.core.sweep_spec import ModelRegistration
from spotorch_trainer import ListReporter, Run, TrainerEnv, contract
from spotorch_trainer.evaluation import (
    ENV_EVAL_DATA_URI,
    ENV_EVAL_SPLIT,
    EvaluationError,
    bucket_of,
    held_out,
    p95_ms,
    report_evaluation,
)


def pipeline(evaluation: Evaluation) -> Pipeline:
    return Pipeline(name="churn", trigger=Trigger(bucket="b"), checkpoint_uri="gs://c/churn",
                    output_uri="gs://m/churn",
                    model=ModelRegistration(serving_image="img", evaluation=evaluation,
                                            promote=PromotionPolicy(metric="accuracy")))


@pytest.mark.parametrize(("evaluation", "env_key", "identity_part"), [
    (Evaluation(data_uri="gs://b/holdout/"), ENV_EVAL_DATA_URI, "folder gs://b/holdout/"),
    (Evaluation(split=HashSplit(key="user_id", percent=20)), ENV_EVAL_SPLIT, "split user_id/20%"),
])
def test_the_attempt_is_told_its_held_out_data_and_provenance_records_it(
        evaluation: Evaluation, env_key: str, identity_part: str) -> None:
    deps = fake_deps(pipeline(evaluation))
    deps.models = MemoryModelRegistry("proj")
    run = start_run(deps, "churn", run_id="r1", data_uri="gs://b/d/1/", snapshot_id="1",
                    reason="t")
    assert run is not None
    prov = run.provenance or {}
    assert identity_part in prov["evaluation"]["identity"]
    launcher = deps.launcher
    assert isinstance(launcher, InMemoryLauncher)
    spec = launcher.jobs[launcher.job_of("r1", 1)].spec
    assert env_key in spec.env
    told = held_out(spec.env)
    assert told is not None
    if evaluation.data_uri:
        assert told.data_uri == "gs://b/holdout/" and ENV_EVAL_SPLIT not in spec.env
    else:
        assert (told.key, told.percent) == ("user_id", 20)
    from spotorch.core.provenance import labels
    assert len(labels(prov)["spotorch_eval"]) == 16


def test_without_evaluation_nothing_is_told_or_recorded() -> None:
    p = Pipeline(name="churn", trigger=Trigger(bucket="b"), checkpoint_uri="gs://c/churn",
                 output_uri="gs://m/churn")
    deps = fake_deps(p)
    run = start_run(deps, "churn", run_id="r1", data_uri="gs://b/d/1/", snapshot_id="1",
                    reason="t")
    assert run is not None
    assert "evaluation" not in (run.provenance or {})
    launcher = deps.launcher
    assert isinstance(launcher, InMemoryLauncher)
    env = launcher.jobs[launcher.job_of("r1", 1)].spec.env
    assert ENV_EVAL_DATA_URI not in env and ENV_EVAL_SPLIT not in env


def test_the_split_is_stable_near_its_percent_and_never_trains_on_held_out_rows() -> None:
    told = held_out({ENV_EVAL_SPLIT: json.dumps({"key": "id", "percent": 10})})
    assert told is not None
    rows = [{"id": i, "x": i * 0.5} for i in range(5000)]
    train, held = told.split(rows)
    assert 400 < len(held) < 600 and len(train) + len(held) == 5000
    assert not {r["id"] for r in train} & {r["id"] for r in held}
    _, again_held = told.split(list(reversed(rows)))  # order does not matter
    assert {r["id"] for r in again_held} == {r["id"] for r in held}
    assert bucket_of(42) == bucket_of("42")  # the key's text is hashed
    assert [bucket_of(i, "a") for i in range(20)] != [bucket_of(i, "b") for i in range(20)]
    with pytest.raises(EvaluationError, match="no 'id' column"):
        told.split([{"x": 1}])


@pytest.mark.parametrize("raw", ["not json", json.dumps({"percent": 10}),
                                 json.dumps({"key": "id", "percent": 0})])
def test_bad_split_settings_are_refused_clearly(raw: str) -> None:
    with pytest.raises(EvaluationError, match="SPOTORCH_EVAL_SPLIT"):
        held_out({ENV_EVAL_SPLIT: raw})


def test_p95_ms_of_a_prediction() -> None:
    ticks = iter([float(x) for pair in ((i, i + (0.001 if i < 19 else 0.05)) for i in range(20))
                  for x in pair])
    assert p95_ms(lambda x: x, [1, 2], repeats=20, clock=lambda: next(ticks)) == \
        pytest.approx(1.0)
    with pytest.raises(EvaluationError):
        p95_ms(lambda x: x, [])


def test_evaluation_metrics_ride_on_the_signed_completed_report(tmp_path: Path) -> None:
    reporter = ListReporter()
    env = TrainerEnv(run_id="run-1", attempt=1, pipeline="p", checkpoint_uri=str(tmp_path / "c"),
                     model_uri=str(tmp_path / "m"), managed=True, report_key="k" * 32)
    with Run(total_steps=2, env=env, reporter=reporter, handle_sigterm=False) as run:
        for _ in run.steps():
            run.log_metrics(loss=0.5)
        logged = report_evaluation(run, {"accuracy": 0.91}, latency_p95_ms=12.5)
    assert logged == {"eval_accuracy": 0.91, "eval_latency_p95_ms": 12.5}
    data, attributes = next((d, a) for d, a in reporter.messages if d["kind"] == "completed")
    assert data["metrics"]["eval_accuracy"] == 0.91
    assert data["metrics"]["eval_latency_p95_ms"] == 12.5
    assert attributes[contract.ATTR_SIGNATURE].startswith("v1=")
