"""The trainer helper in a probe (issue 19): N steps, a report of rate and memory, a clean exit."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from spotorch_trainer import ListReporter, ProbeDone, Run, TrainerEnv, contract
from spotorch_trainer.probe import StepTimer, is_oom

ROOT = Path(__file__).resolve().parents[1]


def _env(tmp_path: Path, steps: str) -> TrainerEnv:
    return TrainerEnv.from_env({contract.ENV_RUN_ID: "probe-r", contract.ENV_PROBE_STEPS: steps,
                                contract.ENV_CHECKPOINT_URI: str(tmp_path / "ckpt")})


def test_a_probe_runs_its_steps_reports_and_stops_cleanly(tmp_path: Path) -> None:
    env = _env(tmp_path, "6")
    assert env.probe_steps == 6
    reporter = ListReporter()
    done: list[int] = []
    with (pytest.raises(ProbeDone) as stopped,
          Run(total_steps=1000, env=env, reporter=reporter, samples_per_step=32) as run):
        for step in run.steps():
            time.sleep(0.02)
            done.append(step)
        pytest.fail("the loop's end is not reached in a probe")  # pragma: no cover
    assert stopped.value.code == 0 and done == list(range(6))
    report = json.loads((tmp_path / "ckpt" / contract.PROBE_REPORT).read_text())
    assert set(report) == set(contract.PROBE_FIELDS)
    assert report["steps"] == 6 and report["oom"] is False and report["error"] is None
    assert 20 < report["steps_per_s"] < 50  # 0.02 s a step, the first not timed
    assert report["samples_per_s"] == pytest.approx(32 * report["steps_per_s"])
    assert report["peak_host_rss_mb"] > 10 and report["peak_accelerator_mb"] is None
    assert [m["kind"] for m, _ in reporter.messages][-1] == contract.EVENT_COMPLETED


def test_an_out_of_memory_step_is_reported_as_such(tmp_path: Path) -> None:
    env = _env(tmp_path, "5")
    with (pytest.raises(MemoryError),
          Run(total_steps=100, env=env, reporter=ListReporter()) as run):
        for step in run.steps():
            if step == 2:
                raise MemoryError("Unable to allocate 40.0 GiB for an array")
    report = json.loads((tmp_path / "ckpt" / contract.PROBE_REPORT).read_text())
    assert report["oom"] is True and "Unable to allocate" in report["error"]
    assert report["steps"] == 2


def test_oom_wordings_and_rates() -> None:
    assert is_oom(RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB"))
    assert is_oom(RuntimeError("RESOURCE_EXHAUSTED: Out of memory while trying to allocate"))
    assert not is_oom(ValueError("bad shape"))
    timer = StepTimer(samples_per_step=10)
    for seconds in (5.0, 0.1, 0.3, 0.1, 0.3):  # the first is warm-up
        timer.record(seconds)
    report = timer.report(now=0.0)
    assert report["steps_per_s"] == pytest.approx(4 / 0.8)
    assert report["samples_per_s"] == pytest.approx(50.0)
    assert report["step_time_cv"] == pytest.approx(0.5773, rel=1e-3)


def test_without_the_variable_nothing_changes(tmp_path: Path) -> None:
    env = TrainerEnv.from_env({contract.ENV_CHECKPOINT_URI: str(tmp_path / "ckpt")})
    assert env.probe_steps is None
    with Run(total_steps=4, env=env, reporter=ListReporter()) as run:
        assert list(run.steps()) == [0, 1, 2, 3]
    assert not (tmp_path / "ckpt" / contract.PROBE_REPORT).exists()


def test_the_example_trainer_probes_as_a_real_process(tmp_path: Path) -> None:
    data = tmp_path / "data"
    subprocess.run([sys.executable, str(ROOT / "examples" / "make_data.py"), str(data)],
                   check=True, capture_output=True, timeout=120)
    ckpt, model = tmp_path / "ckpt", tmp_path / "model"
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": f"{ROOT / 'trainer'}",
           contract.ENV_RUN_ID: "probe-x", contract.ENV_PROBE_STEPS: "30",
           contract.ENV_CHECKPOINT_URI: str(ckpt), contract.ENV_MODEL_URI: str(model),
           contract.ENV_DATA_URI: str(data), "EXAMPLE_TOTAL_STEPS": "100000",
           "EXAMPLE_STEP_SLEEP": "0.01"}
    done = subprocess.run([sys.executable, str(ROOT / "examples" / "train.py")], env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads((ckpt / contract.PROBE_REPORT).read_text())
    assert report["steps"] == 30 and 10 < report["steps_per_s"] < 100
    assert report["samples_per_s"] == pytest.approx(64 * report["steps_per_s"])
    assert not model.exists()  # a probe trains no model
