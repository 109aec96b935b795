"""Probing candidates (issue 19): probe jobs per candidate, on Spot, labelled, bounded in time."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from spotorch.adapters.memory.twins import InMemoryLauncher
from spotorch.app.hardware_probes import ProbeSession, probe_root, probe_spec, run_probes
from spotorch.core.hardware import PROBE_LABEL, ProbeResult, cache_key, choose
from spotorch.core.model import JobPhase, JobStatus
from spotorch.core.pipeline import (
    Capacity,
    HardwareCandidate,
    HardwareSearch,
    JobTemplate,
    Pipeline,
    Trigger,
    WorkerPool,
)
from spotorch.ports.jobs import LABEL_RUN
from spotorch_trainer import contract

FAST = HardwareCandidate("fast", "n1-standard-4", env=(("EXAMPLE_STEP_SLEEP", "0"),))
SLOW = HardwareCandidate("slow", "n1-standard-8", env=(("EXAMPLE_STEP_SLEEP", "0.05"),))
GPU = HardwareCandidate("l4", "g2-standard-8", "NVIDIA_L4", 1)


def _pipeline(*candidates: HardwareCandidate, **search: Any) -> Pipeline:
    pool = WorkerPool(image_uri="img", command=("python", "train.py"))
    return Pipeline(name="hw", trigger=Trigger(bucket="landing"), checkpoint_uri="gs://c/hw",
                    output_uri="gs://m/hw", job=JobTemplate(worker_pools=(pool,)),
                    hardware=HardwareSearch(candidates=candidates, total_steps=10_000,
                                            probe_steps=20, **search))


SESSION = ProbeSession("probe-hw-1", "/tmp/probes", "gs://landing/d/1/", "us-central1")


def test_a_probe_job_is_spot_labelled_as_a_probe_and_runs_n_steps() -> None:
    spec = probe_spec(_pipeline(SLOW, probe_timeout_s=600.0), SESSION, SLOW)
    assert spec.capacity is Capacity.SPOT and spec.attempt == 0
    assert spec.labels[PROBE_LABEL] == "1" and LABEL_RUN not in spec.labels
    assert spec.env[contract.ENV_PROBE_STEPS] == "20"
    assert spec.env[contract.ENV_EVENTS_TOPIC] == ""  # a probe is not a run: no trainer events
    assert spec.env[contract.ENV_CHECKPOINT_URI] == "/tmp/probes/probe-hw-1/slow/checkpoints"
    assert spec.template.timeout_s == 600.0
    (pool,) = spec.template.worker_pools
    assert pool.machine_type == "n1-standard-8" and dict(pool.env)["EXAMPLE_STEP_SLEEP"] == "0.05"


class _Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t

    def sleep(self, s: float) -> None:
        self.t += s


def test_probes_run_in_parallel_and_each_ends_fit_unfit_or_timed_out() -> None:
    pipeline = _pipeline(FAST, SLOW, GPU, probe_timeout_s=60.0)
    launcher, clock = InMemoryLauncher(), _Clock()
    reports: dict[str, bytes] = {
        f"{probe_root(SESSION, FAST)}/checkpoints/{contract.PROBE_REPORT}":
            json.dumps({"steps": 20, "steps_per_s": 50.0, "samples_per_s": 3200.0,
                        "peak_host_rss_mb": 120.0}).encode(),
        f"{probe_root(SESSION, SLOW)}/checkpoints/{contract.PROBE_REPORT}":
            json.dumps({"steps": 3, "oom": True, "error": "MemoryError: Unable to allocate"})
            .encode(),
    }

    def sleep(s: float) -> None:
        clock.sleep(s)
        assert launcher.created == 3  # all three were launched before any wait: in parallel
        for name, job in launcher.jobs.items():
            who = job.spec.labels["spotorch_candidate"]
            phase = {"fast": JobPhase.SUCCEEDED, "slow": JobPhase.FAILED}.get(who)
            if phase is not None and not job.status.phase.terminal:
                job.status = JobStatus(name, phase, exit_code=None if who == "fast" else 1,
                                       labels=job.spec.labels)

    results = run_probes(pipeline, SESSION, launcher, reports.get, clock=clock, sleep=sleep,
                         poll_s=20.0)
    assert results["fast"].fit and results["fast"].steps_per_s == 50.0
    assert results["fast"].key == cache_key(pipeline, FAST, 20)
    assert not results["slow"].fit and results["slow"].reason.startswith("out of memory")
    assert not results["l4"].fit and results["l4"].reason.startswith("timed out")
    assert len(launcher.cancelled) == 1  # the one still queued at the time limit
    choice = choose(pipeline, results, deadline_s=3600.0)
    assert choice.chosen == "fast"


def test_cached_results_are_not_probed_again(tmp_path: Path) -> None:
    pipeline = _pipeline(FAST, SLOW)
    launcher, clock = InMemoryLauncher(), _Clock()
    cache = {c.name: ProbeResult(c.name, True, steps_per_s=5.0, measured_at=clock(),
                                 key=cache_key(pipeline, c, 20)) for c in (FAST, SLOW)}
    results = run_probes(pipeline, SESSION, launcher, lambda uri: None, cache=cache,
                         clock=clock, sleep=lambda s: pytest.fail(f"slept {s}s"))
    assert launcher.created == 0 and results == cache
    stale = replace(pipeline, hardware=replace(pipeline.hardware, probe_steps=30))  # type: ignore[type-var]
    assert cache_key(stale, FAST, 30) != cache["fast"].key
