"""End to end on the local stack: `spotorch demo --scenario distributed --json` (issue 32).

Two replicas train over torch.distributed (gloo); the worker's Spot VM alone is preempted mid-run
(the emulator's default: the job fails with STOCKOUT); the run resumes from the chief's
checkpoint on both replicas and ends with the parameters of a run never preempted."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.emulator, pytest.mark.slow]
ROOT = Path(__file__).resolve().parent.parent
pytest.importorskip("torch")


def test_the_distributed_story_survives_losing_one_replica_and_matches_an_unpreempted_run(
) -> None:
    done = subprocess.run([sys.executable, "-m", "spotorch.local.demo", "--scenario",
                           "distributed", "--json", "--timeout", "150"],
                          capture_output=True, text=True, timeout=240, cwd=ROOT,
                          env={**os.environ})
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout)
    assert report["status"] == "SUCCEEDED", report["history"]
    first, *rest = report["attempts"]
    assert all(a["replicas"] >= 2 and len(a["pools"]) == 2 for a in report["attempts"])
    # One replica's VM was taken back, and that was a preemption to spotorch.
    assert report["single_replica_preemptions"] == [{"attempt": 1, "replica": "workerpool1-0"}]
    assert first["failure_class"] == "preempted" and report["preemptions"] == 1
    # The chief's checkpoint was the resume point of both replicas of the next attempt.
    assert rest and rest[-1]["state"] == "SUCCEEDED"
    resumed = rest[0]["resumed_from_step"]
    assert resumed and 0 < resumed < 600 and report["resumed_from_chief_checkpoint"]
    assert report["metrics"]["resumed_from_step"] == rest[-1]["resumed_from_step"]
    assert report["metrics"]["world_size"] == 2
    # The same model as a run never preempted, within the stated tolerance (bit for bit).
    assert report["tolerance"] == {"params_sha256": "equal", "test_accuracy": 0.0}
    assert report["comparison"]["within_tolerance"] and report["comparison"]["params_equal"]
    assert report["reference"]["resumed_from_step"] == 0
    assert report["metrics"]["params_sha256"] == report["reference"]["params_sha256"]
    # The worker's steps were slower than the chief's: the straggler rule named it, by the
    # step times the chief reported for both ranks.
    assert any("workerpool1-0 is a straggler" in str(h) for h in report["history"]), \
        report["history"]
