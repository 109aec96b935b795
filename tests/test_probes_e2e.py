"""Probes end to end through the local Vertex AI emulator (issue 19): each probe a real process
running examples/train.py for N steps; the faster-and-cheaper CPU candidate is chosen."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from spotorch.adapters.gcp.vertex import VertexJobLauncher
from spotorch.adapters.gcp.vertex_calls import RetryPolicy
from spotorch.app.hardware_probes import ProbeSession, run_probes
from spotorch.core.hardware import choose, table_lines
from spotorch.core.pipeline import (
    HardwareCandidate,
    HardwareSearch,
    JobTemplate,
    Pipeline,
    Trigger,
    WorkerPool,
)
from spotorch.local._vertex_quota import QuotaLimits
from spotorch.local.vertex_emulator import VertexEmulator
from spotorch_trainer.storage import read_bytes

ROOT = Path(__file__).resolve().parents[1]
pytestmark = [pytest.mark.slow, pytest.mark.extended]


def _read(uri: str) -> bytes | None:
    try:
        return read_bytes(uri)
    except OSError:
        return None


def test_probes_run_as_processes_and_the_faster_cheaper_candidate_wins(tmp_path: Path) -> None:
    data = tmp_path / "data"
    subprocess.run([sys.executable, str(ROOT / "examples" / "make_data.py"), str(data)],
                   check=True, capture_output=True, timeout=120)
    # The step sleep stands in for a slower machine: the emulator runs every shape at the speed
    # of this one, so the candidates differ by what they are told to do per step.
    fast = HardwareCandidate("fast", "n1-standard-4", env=(("EXAMPLE_STEP_SLEEP", "0.002"),))
    slow = HardwareCandidate("slow", "n1-standard-8", env=(("EXAMPLE_STEP_SLEEP", "0.04"),))
    broken = HardwareCandidate("broken", "n1-standard-4", env=(("EXAMPLE_FAIL_AT_STEP", "3"),))
    # The same workload on a machine the emulator OOM-kills past 400 MiB resident (slow steps
    # give its memory watch time to see it).
    small = HardwareCandidate("small", "n1-highcpu-2", env=(("EXAMPLE_STEP_SLEEP", "0.2"),))
    pool = WorkerPool(image_uri="local", command=(sys.executable, str(ROOT / "examples" /
                                                                     "train.py")),
                      env=(("EXAMPLE_TOTAL_STEPS", "100000"), ("EXAMPLE_CHECKPOINT_EVERY", "0"),
                           ("EXAMPLE_WORKING_MEMORY_MB", "500"), ("OPENBLAS_NUM_THREADS", "1")))
    pipeline = Pipeline(name="hw", trigger=Trigger(bucket="landing"),
                        checkpoint_uri=str(tmp_path / "ckpt"), output_uri=str(tmp_path / "out"),
                        job=JobTemplate(worker_pools=(pool,)),
                        hardware=HardwareSearch(candidates=(slow, fast, broken, small),
                                                total_steps=100_000, probe_steps=40,
                                                probe_timeout_s=120.0))
    emulator = VertexEmulator("spotorch-test", workdir=tmp_path / "vertex", grace_s=0.5,
                              queued_s=0.05, pending_s=0.05, job_events_topic=None,
                              quotas=QuotaLimits.unlimited(),
                              memory_limits_mb={"n1-highcpu-2": 400})
    address = emulator.start()
    try:
        launcher = VertexJobLauncher("spotorch-test", endpoint=address,
                                     retry=RetryPolicy(attempts=2, base_s=0.01))
        session = ProbeSession("probe-hw-e2e", str(tmp_path / "probes"), str(data),
                               "us-central1")
        results = run_probes(pipeline, session, launcher, _read, poll_s=0.2)
    finally:
        emulator.stop()
    print("\n".join(f"{r.candidate}: {r}" for r in results.values()))
    assert results["fast"].fit and results["slow"].fit, results
    assert results["fast"].steps_per_s > 2 * results["slow"].steps_per_s  # type: ignore[operator]
    assert results["slow"].steps_per_s < 30  # type: ignore[operator]  # 0.04 s a step at least
    assert results["fast"].peak_host_rss_mb > 20  # type: ignore[operator]
    assert results["fast"].samples_per_s == pytest.approx(
        64 * (results["fast"].steps_per_s or 0.0))
    assert not results["broken"].fit
    assert results["broken"].reason.startswith("failed (DeliberateFailure: failing at step 3")
    assert not results["small"].fit and results["small"].reason.startswith("out of memory"), \
        results["small"]
    choice = choose(pipeline, results, deadline_s=24 * 3600.0)
    print("\n".join(table_lines(choice)))
    assert choice.chosen == "fast"
    row = choice.row("fast")
    assert row is not None and row.spot_cost is not None
    slow_row = choice.row("slow")
    assert slow_row is not None and (slow_row.spot_cost or 0) > row.spot_cost
