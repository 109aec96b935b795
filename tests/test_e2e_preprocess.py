"""End to end on the local stack: `spotorch demo --scenario preprocess --json` (issue 31).

The run preprocesses its snapshot with a real Beam pipeline on the local Dataflow, trains on the
step's output through a Spot preemption, and a second snapshot of the same files reuses that
output; `preprocess-error`: a failing Beam transform ends the run as a user error with its text.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from spotorch.local.dataflow_emulator import beam_available

pytestmark = [pytest.mark.emulator, pytest.mark.slow,
              pytest.mark.skipif(not beam_available(), reason="no Beam environment: "
                                                              "make beam-venv")]
ROOT = Path(__file__).resolve().parent.parent


def demo(scenario: str) -> dict[str, Any]:
    done = subprocess.run([sys.executable, "-m", "spotorch.local.demo", "--scenario", scenario,
                           "--json", "--timeout", "200"], capture_output=True, text=True,
                          timeout=420, cwd=ROOT, env={**os.environ})
    report: dict[str, Any] = json.loads(done.stdout)
    assert done.returncode == 0, done.stderr[-3000:]
    return report


def test_the_preprocess_story_trains_on_the_output_and_reuses_it() -> None:
    report = demo("preprocess")
    assert report["status"] == "SUCCEEDED", report["history"]
    step = report["preprocess"]
    assert step["job_name"] and step["job_name"].endswith("-pre1") and step["launches"] == 1
    assert step["state"] == step["dataflow_state"] == "JOB_STATE_DONE"
    assert step["output_uri"].startswith("gs://spotorch-preprocess/demo/")
    assert step["output_files"] == ["part-00000-of-00002.csv", "part-00001-of-00002.csv"]
    assert step["cache_hit"] is False and step["trained_on_output"] is True
    assert step["billed"]["vcpu_s"] > 0
    # the training after the step survived a preemption
    assert report["preemptions"] >= 1 and report["attempts"][0]["failure_class"] == "preempted"
    kinds = report["events"]
    assert kinds.index("dev.spotorch.run.preprocess_ended.v1") < \
        kinds.index("dev.spotorch.attempt.launched.v1")
    assert "preprocess step cost" in report["cost"]["summary"]
    second = report["second_run"]
    assert second["status"] == "SUCCEEDED"
    assert second["preprocess"]["cache_hit"] is True and second["preprocess"]["launches"] == 0
    assert second["preprocess"]["output_uri"] == step["output_uri"]


def test_a_failing_beam_transform_ends_the_run_as_a_user_error() -> None:
    report = demo("preprocess-error")
    assert report["status"] == "FAILED", report["history"]
    assert report["attempts"] == []  # no training was launched
    step = report["preprocess"]
    assert step["state"] == "JOB_STATE_FAILED" and step["failure_class"] == "user_error"
    assert "the model takes 8 (--expected_features)" in step["error"]
    assert "Parse rows" in step["error"]
    assert "the model takes 8" in report["end_reason"]
