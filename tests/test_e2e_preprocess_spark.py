"""End to end on the local stack: `spotorch demo --scenario preprocess-spark --json` (issue 42).

The run preprocesses its snapshot with a real PySpark job on the local Dataproc (the real
google-cloud-dataproc client over gRPC), followed by the tick's GetBatch, trains on the step's
output, is billed in DCUs, and a second snapshot of the same files reuses that output;
`preprocess-spark-error`: a Spark exception ends the run as a user error with its text.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from spotorch.local.dataproc_emulator import spark_available

pytestmark = [pytest.mark.emulator, pytest.mark.slow,
              pytest.mark.skipif(not spark_available(), reason="no Spark environment: "
                                                               "make spark-venv")]
ROOT = Path(__file__).resolve().parent.parent


def demo(scenario: str) -> dict[str, Any]:
    done = subprocess.run([sys.executable, "-m", "spotorch.local.demo", "--scenario", scenario,
                           "--json", "--timeout", "240"], capture_output=True, text=True,
                          timeout=480, cwd=ROOT, env={**os.environ})
    report: dict[str, Any] = json.loads(done.stdout)
    assert done.returncode == 0, done.stderr[-3000:]
    return report


def test_the_spark_story_trains_on_the_output_bills_dcus_and_reuses_it() -> None:
    report = demo("preprocess-spark")
    assert report["status"] == "SUCCEEDED", report["history"]
    step = report["preprocess"]
    assert step["kind"] == "spark" and step["launches"] == 1
    assert step["batch"].startswith("projects/") and "/locations/us-central1/batches/" \
        in step["batch"] and step["batch"].endswith(step["batch_id"])
    assert step["state"] == step["dataproc_state"] == "SUCCEEDED"
    assert step["output_files"] == ["part-00000-of-00002.csv", "part-00001-of-00002.csv"]
    assert step["cache_hit"] is False and step["trained_on_output"] is True
    assert step["usage"]["milli_dcu_seconds"] > 0 and step["cost"]["usd"] > 0
    assert report["cost"]["preprocess_cost"] > 0
    assert any(b.startswith("Dataproc:") for b in report["cost"]["basis"])
    second = report["second_run"]
    assert second["status"] == "SUCCEEDED"
    assert second["preprocess"]["cache_hit"] is True and second["preprocess"]["launches"] == 0
    assert second["preprocess"]["output_uri"] == step["output_uri"]


def test_a_spark_exception_ends_the_run_as_a_user_error() -> None:
    report = demo("preprocess-spark-error")
    assert report["status"] == "FAILED", report["history"]
    assert report["attempts"] == []  # no training was launched
    step = report["preprocess"]
    assert step["state"] == "FAILED" and step["failure_class"] == "user_error"
    assert "the model takes 8 (--expected_features)" in step["error"]
    assert "the model takes 8" in report["end_reason"]
