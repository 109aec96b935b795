"""The trainer's side of training health: what it reports, how the entry point decodes it."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from spotorch.core.context import Context
from spotorch.core.decide import decide, new_run
from spotorch.core.errors import InvalidEvent
from spotorch.core.model import RunStatus
from spotorch.core.pipeline import Pipeline, Trigger
from spotorch.entrypoints.functions import parse_trainer_message
from spotorch_trainer import ListReporter, Run, TrainerEnv, contract, event_message
from spotorch_trainer.checkpoints import write_checkpoint
from spotorch_trainer.run import resume_point


def env(tmp_path: Path, **overrides: object) -> TrainerEnv:
    fields: dict[str, object] = {"run_id": "r1", "attempt": 1, "pipeline": "p",
                                 "checkpoint_uri": str(tmp_path / "ckpt"),
                                 "model_uri": str(tmp_path / "model"), "managed": True}
    return TrainerEnv(**{**fields, **overrides})  # type: ignore[arg-type]


def test_a_nan_loss_is_named_in_nonfinite_and_decodes_as_nan() -> None:
    data, _ = event_message(TrainerEnv(run_id="r1"), "progress", now=1.8e9, step=7,
                            metrics={"loss": math.nan, "acc": 0.5, "grad": math.inf})
    payload = json.loads(data)
    assert payload["metrics"] == {"loss": None, "acc": 0.5, "grad": None}
    assert payload["nonfinite"] == ["grad", "loss"]
    report, run_id, _ = parse_trainer_message(data)
    assert run_id == "r1" and report.metrics == {"acc": 0.5}
    assert report.nonfinite == ("grad", "loss")


def test_health_fields_only_appear_when_they_have_a_value() -> None:
    data, _ = event_message(TrainerEnv(), "progress", now=0.0, step=1, metrics={"loss": 1.0})
    assert set(json.loads(data)) == set(contract.EVENT_DATA_FIELDS)
    data, _ = event_message(TrainerEnv(), "started", now=0.0, step=0, report_interval_s=10.0)
    report, _, _ = parse_trainer_message(data)
    assert report.report_interval_s == 10.0 and report.checkpoint_s is None


def test_replica_step_times_travel_from_the_chief_to_the_observation() -> None:
    data, _ = event_message(TrainerEnv(run_id="r1"), "progress", now=0.0, step=3,
                            replica_step_s=[0.1, 0.3333333333])
    assert json.loads(data)["replica_step_s"] == [0.1, 0.333333]
    report, _, _ = parse_trainer_message(data)
    assert report.replica_step_s == (0.1, 0.333333)


@pytest.mark.parametrize("body", [
    {"metrics": {"loss": None}},  # null without naming it non-finite: still malformed
    {"metrics": {"loss": None}, "nonfinite": "loss"},
    {"nonfinite": [1, 2]},
    {"nonfinite": ["x" * 500]},
    {"report_interval_s": -1},
    {"checkpoint_s": "fast"},
    {"report_interval_s": True},
    {"replica_step_s": 0.1},
    {"replica_step_s": [0.1, -1]},
    {"replica_step_s": [0.1, "slow"]},
    {"replica_step_s": [0.1] * 513},
])
def test_malformed_health_fields_are_rejected(body: dict[str, object]) -> None:
    base = {"kind": "progress", "run_id": "r1", "attempt": 1, "step": 1, **body}
    with pytest.raises(InvalidEvent):
        parse_trainer_message(json.dumps(base).encode())


def test_run_reports_its_interval_checkpoint_time_and_a_nan_at_once(tmp_path: Path) -> None:
    reporter = ListReporter()
    with Run(total_steps=20, checkpoint_every=5, env=env(tmp_path), reporter=reporter,
             progress_interval_s=3600) as run:
        for step in run.steps():
            run.log_metrics(loss=1.0 if step < 12 else math.nan)
            if run.checkpoint_due():
                run.checkpoint({"step": step})
            if step == 13:
                break
    started = reporter.messages[0][0]
    assert started["kind"] == "started" and started["report_interval_s"] == 3600
    ckpts = [d for d, _ in reporter.messages if d["kind"] == "checkpoint"]
    assert ckpts and all(d["checkpoint_s"] >= 0 for d in ckpts)
    # The throttle holds progress for an hour, but the NaN is reported at once, once.
    nan_reports = [d for d, _ in reporter.messages if d.get("nonfinite") == ["loss"]
                   and d["kind"] == "progress"]
    assert len(nan_reports) == 1 and nan_reports[0]["step"] == 12


def test_resume_exact_ignores_newer_checkpoints(tmp_path: Path) -> None:
    root = str(tmp_path / "ckpt")
    for step in (10, 20, 30):
        write_checkpoint(root, step, {"w": b"x"})
    named = f"{root}/step-0000000020"
    assert resume_point(env(tmp_path, resume_from=named)).step == 30  # type: ignore[union-attr]
    exact = env(tmp_path, resume_from=named, resume_exact=True)
    assert resume_point(exact).step == 20  # type: ignore[union-attr]
    assert resume_point(env(tmp_path, resume_exact=True)) is None  # nothing named: fresh
    parsed = TrainerEnv.from_env({contract.ENV_RUN_ID: "r", contract.ENV_RESUME_FROM: named,
                                  contract.ENV_RESUME_EXACT: "1"})
    assert parsed.resume_exact and not TrainerEnv.from_env({}).resume_exact


def test_a_nan_from_the_trainer_ends_the_run_diverged_through_decide(tmp_path: Path) -> None:
    """Trainer message -> entry decoding -> decide: the whole path a NaN loss takes."""
    p = Pipeline(name="p", trigger=Trigger(bucket="b"), checkpoint_uri="gs://c/p",
                 output_uri="gs://m/p")
    t0 = 1.8e9
    run = new_run(run_id="r1", pipeline=p, now=t0, data_uri="d", snapshot_id=None)
    e = TrainerEnv(run_id="r1", attempt=1, pipeline="p")
    for at, step, loss in ((t0 + 1, 1, 1.0), (t0 + 2, 2, math.nan)):
        data, _ = event_message(e, "progress", now=at, step=step, metrics={"loss": loss})
        report, _, _ = parse_trainer_message(data)
        run = decide(run, report, Context(p, at))
    assert run.status is RunStatus.CANCELLING and run.stop_status is RunStatus.FAILED_DIVERGED
    assert run.end_reason is not None and "nonfinite_loss" in run.end_reason


def test_a_nan_right_after_a_report_goes_out_with_the_next_step(tmp_path: Path) -> None:
    """A second progress event for a step would share its event id (a 'redelivery'): defer."""
    reporter = ListReporter()
    with Run(total_steps=5, env=env(tmp_path), reporter=reporter,
             progress_interval_s=3600) as run:
        for step in run.steps():
            run.log_metrics(loss=math.nan if step >= 1 else 1.0)
    progress = [(d["step"], d.get("nonfinite")) for d, _ in reporter.messages
                if d["kind"] == "progress"]
    assert progress == [(1, None), (2, ["loss"])]
    ids = [d["event_id"] for d, _ in reporter.messages]
    assert len(ids) == len(set(ids))
