"""The trainer helper measures what serving will see: latency per request at batch 1 and at a
batch, after a warm-up, and the model's size; the figures ride on the signed reports."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from spotorch_trainer import ListReporter, Run, TrainerEnv
from spotorch_trainer.latency import (
    BATCH_ENV,
    model_size_bytes,
    percentile,
    request_latencies,
    serving_metrics,
)


class FakeModel:
    """A model whose predict takes 1 ms per row on a fake clock, 50 ms on its first call."""

    def __init__(self) -> None:
        self.now = 0.0
        self.calls: list[int] = []

    def clock(self) -> float:
        return self.now

    def predict(self, rows: Sequence[Any]) -> list[int]:
        self.now += (0.050 if not self.calls else 0.001 * len(rows))
        self.calls.append(len(rows))
        return [0] * len(rows)


def test_percentiles_are_values_that_were_measured() -> None:
    samples = [float(i) for i in range(1, 101)]
    assert percentile(samples, 50) == 50.0 and percentile(samples, 95) == 95.0
    assert percentile([3.0], 95) == 3.0
    with pytest.raises(ValueError):
        percentile([], 50)


def test_the_warm_up_is_not_counted_and_batches_go_round_the_rows() -> None:
    model = FakeModel()
    got = request_latencies(model.predict, list(range(5)), batch_size=8, warmup=2, requests=3,
                            clock=model.clock)
    assert model.calls == [8] * 5  # 2 warm-up calls, 3 measured, each of 8 rows from 5
    assert got == pytest.approx([8.0, 8.0, 8.0])  # the slow first call was a warm-up


def test_serving_metrics_at_batch_one_and_at_the_configured_batch(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    model = FakeModel()
    monkeypatch.setenv(BATCH_ENV, "16")
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "weights.npz").write_bytes(b"x" * 1000)
    (tmp_path / "model" / "meta.json").write_bytes(b"{}")
    got = serving_metrics(model.predict, list(range(100)), model_path=tmp_path / "model",
                          clock=model.clock)
    assert got["latency_p50_ms"] == pytest.approx(1.0) and got["latency_p95_ms"] == pytest.approx(1.0)
    assert got["latency_batch_p95_ms"] == pytest.approx(16.0)
    assert got["latency_batch_size"] == 16.0 and got["model_size_bytes"] == 1002.0
    assert model_size_bytes(tmp_path / "model" / "weights.npz") == 1000


def test_no_held_out_rows_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="no held-out rows"):
        serving_metrics(lambda rows: rows, [])


def test_the_figures_ride_on_the_signed_completed_report(tmp_path: Path) -> None:
    reporter = ListReporter()
    env = TrainerEnv(run_id="run-1", attempt=1, pipeline="p", checkpoint_uri=str(tmp_path / "c"),
                     model_uri=str(tmp_path / "m"), managed=True)
    with Run(total_steps=3, checkpoint_every=None, env=env, reporter=reporter,
             progress_interval_s=3600) as run:
        for _ in run.steps():
            run.log_metrics(loss=0.5)
        run.log_metrics(accuracy=0.9, **serving_metrics(lambda rows: rows, list(range(10)),
                                                        batch_size=4, requests=5, warmup=1,
                                                        model_bytes=2048))
    data, _ = reporter.messages[-1]
    assert data["kind"] == "completed"
    assert {"latency_p50_ms", "latency_p95_ms", "latency_batch_p95_ms",
            "model_size_bytes", "accuracy", "loss"} <= set(data["metrics"])
    assert data["metrics"]["model_size_bytes"] == 2048.0
