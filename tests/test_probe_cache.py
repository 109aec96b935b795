"""A probe that gave no answer (not launched, job lost, never got a machine) is no verdict on its
candidate (issue 41): kept in the run and shown, never cached, probed again next time; and when
cached results merely expired the choice says so rather than "every candidate failed"."""

from __future__ import annotations

from fakes import fake_deps
from spotorch.adapters.memory.twins import InMemoryDocumentStore, InMemoryLauncher, ManualClock
from spotorch.app.hardware_probes import ProbeSession, load_cache, run_probes, save_cache
from spotorch.app.runs import start_run
from spotorch.core.hardware import ProbeResult, cache_key, choose, fresh, plan_probes
from spotorch.core.model import RunStatus
from spotorch.core.pipeline import (
    HardwareCandidate,
    HardwareSearch,
    JobTemplate,
    Pipeline,
    Trigger,
    WorkerPool,
)
from spotorch.operate.advise import advise, expired
from spotorch.ports.jobs import LaunchError

CPU = HardwareCandidate("cpu", "n1-standard-8")
L4 = HardwareCandidate("l4", "g2-standard-8", "NVIDIA_L4", 1)


def _pipeline() -> Pipeline:
    return Pipeline(
        name="p", trigger=Trigger(bucket="b"), checkpoint_uri="gs://c/p", output_uri="gs://m/p",
        job=JobTemplate(worker_pools=(WorkerPool(image_uri="img", command=("python", "t.py")),)),
        hardware=HardwareSearch(candidates=(CPU, L4), total_steps=36_000, probe_steps=20,
                                cache_ttl_s=3600.0))


def test_an_infrastructure_failure_is_never_cached_nor_reused() -> None:
    pipeline = _pipeline()
    docs = InMemoryDocumentStore()
    launcher = InMemoryLauncher()
    launcher.fail_launch = LaunchError("python_package has no package_uris", permanent=True)
    session = ProbeSession("probe-p-1", "gs://c/p", "gs://b/d/", "us-central1")
    results = run_probes(pipeline, session, launcher, lambda uri: None, clock=lambda: 100.0,
                         sleep=lambda s: None, poll_s=0.0)
    assert {n: (r.fit, r.infra) for n, r in results.items()} == {
        "cpu": (False, True), "l4": (False, True)}
    assert "could not launch" in results["cpu"].reason
    save_cache(docs, "p", results, 100.0)
    assert load_cache(docs, "p") == {}  # nothing held against the candidates
    # Even one stored by an older version is not reused: both are probed again.
    stored = {"cpu": ProbeResult("cpu", False, reason="could not launch: x", measured_at=100.0,
                                 key=cache_key(pipeline, CPU, 20), infra=True)}
    assert not fresh(stored["cpu"], cache_key(pipeline, CPU, 20), 100.0, 3600.0)
    assert [c.name for c in plan_probes(pipeline, stored, 100.0).probe] == ["cpu", "l4"]
    # A real verdict is cached as before.
    verdict = ProbeResult("l4", False, reason="out of memory (HBM)", measured_at=100.0,
                          key=cache_key(pipeline, L4, 20))
    save_cache(docs, "p", {**results, "l4": verdict}, 100.0)
    assert set(load_cache(docs, "p")) == {"l4"}


def test_expired_results_are_called_expired_not_failed() -> None:
    pipeline = _pipeline()
    cache = {c.name: ProbeResult(c.name, True, steps_per_s=2.0, measured_at=0.0,
                                 key=cache_key(pipeline, c, 20)) for c in (CPU, L4)}
    choice = advise(pipeline, cache, 7200.0, None)  # two hours later, ttl one hour
    assert choice.chosen is None
    assert "every candidate failed" not in choice.warning
    assert "not probed (no fresh result: never probed, or expired): cpu, l4" in choice.warning
    assert expired(pipeline, cache, 7200.0) == ["cpu", "l4"]
    failed = {c.name: ProbeResult(c.name, False, reason="failed (exit 1)", measured_at=7000.0,
                                  key=cache_key(pipeline, c, 20)) for c in (CPU, L4)}
    assert "every candidate failed its probe" in choose(pipeline, failed).warning


def test_a_run_whose_probe_could_not_launch_keeps_it_out_of_the_cache() -> None:
    pipeline = _pipeline()
    deps = fake_deps(pipeline)
    assert isinstance(deps.launcher, InMemoryLauncher) and isinstance(deps.clock, ManualClock)
    deps.launcher.fail_launch = LaunchError("refused for good", permanent=True)
    run = start_run(deps, "p", run_id="r1", data_uri="gs://b/d/", snapshot_id="s", reason="t")
    assert run is not None
    stored, _ = deps.runs.load("r1")
    assert stored is not None
    results = stored.hardware_results
    assert set(results) == {"cpu", "l4"}, stored.history
    assert all(r["infra"] and "could not launch" in r["reason"] for r in results.values())
    assert stored.status is not RunStatus.PROBING
    assert load_cache(deps.docs, "p") == {}
