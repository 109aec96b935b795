"""The service on a hardware choice (issue 19): a run starts on the chosen candidate, records the
table, and the deadline policy works from the measured compute instead of the pipeline's guess."""

from __future__ import annotations

import pytest

from fakes import fake_deps
from spotorch.adapters.memory.twins import InMemoryLauncher, ManualClock
from spotorch.app.hardware_probes import load_cache, save_cache
from spotorch.app.runs import start_run
from spotorch.core.context import Context
from spotorch.core.escalation import policy_view
from spotorch.core.hardware import ProbeResult, cache_key
from spotorch.core.model import Run, RunStatus
from spotorch.core.pipeline import (
    EscalationKind,
    HardwareCandidate,
    HardwareSearch,
    JobTemplate,
    Pipeline,
    RecoveryPolicy,
    Trigger,
    WorkerPool,
)

CPU = HardwareCandidate("cpu", "n1-standard-8")
L4 = HardwareCandidate("l4", "g2-standard-8", "NVIDIA_L4", 1)


def _pipeline() -> Pipeline:
    return Pipeline(
        name="p", trigger=Trigger(bucket="b"), checkpoint_uri="gs://c/p", output_uri="gs://m/p",
        job=JobTemplate(worker_pools=(WorkerPool(image_uri="img", command=("python", "t.py")),)),
        deadline_s=3 * 3600.0,
        recovery=RecoveryPolicy(escalation=EscalationKind.DEADLINE, expected_compute_s=600.0),
        hardware=HardwareSearch(candidates=(CPU, L4), total_steps=36_000, probe_steps=20))


def _start(deps: object) -> Run:
    run = start_run(deps, "p", run_id="r1", data_uri="gs://b/d/", snapshot_id="s",  # type: ignore[arg-type]
                    reason="t")
    assert run is not None
    return run


def test_a_run_starts_on_the_candidate_chosen_from_cached_probes() -> None:
    pipeline = _pipeline()
    deps = fake_deps(pipeline)
    assert isinstance(deps.clock, ManualClock) and isinstance(deps.launcher, InMemoryLauncher)
    now = deps.clock.now()
    save_cache(deps.docs, "p", {
        "cpu": ProbeResult("cpu", True, steps_per_s=2.0, measured_at=now,
                           key=cache_key(pipeline, CPU, 20)),
        "l4": ProbeResult("l4", True, steps_per_s=4.0, measured_at=now,
                          key=cache_key(pipeline, L4, 20))}, now)
    assert set(load_cache(deps.docs, "p")) == {"cpu", "l4"}
    run = _start(deps)
    # cpu needs 5 h: misses the 3 h deadline; l4 2.5 h + 10 min
    assert run.hardware is not None and run.hardware["chosen"] == "l4"
    assert [r["candidate"] for r in run.hardware["rows"]] == ["cpu", "l4"]
    assert any(h.what == "hardware chosen" for h in run.history)
    from spotorch.adapters.memory.twins import InMemoryPublisher
    from spotorch.spec.event_schemas import validate_event

    assert isinstance(deps.publisher, InMemoryPublisher)
    (event,) = [e for e in deps.publisher.events if e["type"].endswith("run.hardware_chosen.v1")]
    assert validate_event(event) == []
    assert event["data"]["chosen"] == "l4" and len(event["data"]["rows"]) == 2
    (job,) = deps.launcher.jobs.values()
    (pool,) = job.spec.template.worker_pools
    assert (pool.machine_type, pool.accelerator_type) == ("g2-standard-8", "NVIDIA_L4")
    # the deadline policy sees the measured 2.5 h, not the pipeline's 600 s guess
    view = policy_view(run, Context(pipeline, now), current=None,
                              spot_available=True)
    assert view.work_total_s == 2.5 * 3600.0


def test_without_fresh_probes_the_run_probes_first_and_launches_no_attempt_yet() -> None:
    pipeline = _pipeline()
    deps = fake_deps(pipeline)
    assert isinstance(deps.launcher, InMemoryLauncher)
    save_cache(deps.docs, "p", {"cpu": ProbeResult("cpu", True, steps_per_s=2.0,
                                                   key="other-code")}, 0.0)
    run = _start(deps)
    assert run.hardware is None and run.status is RunStatus.PROBING
    assert run.attempts == () and {p.candidate for p in run.probes} == {"cpu", "l4"}
    assert all(j.spec.env["SPOTORCH_PROBE_STEPS"] == "20" for j in deps.launcher.jobs.values())


def test_the_ledger_prices_the_chosen_shape() -> None:
    from spotorch.core.cost import hourly_rate, ledger

    pipeline = _pipeline()
    deps = fake_deps(pipeline)
    assert isinstance(deps.clock, ManualClock)
    now = deps.clock.now()
    save_cache(deps.docs, "p", {
        c.name: ProbeResult(c.name, True, steps_per_s=rate, measured_at=now,
                            key=cache_key(pipeline, c, 20)) for c, rate in ((CPU, 2.0), (L4, 4.0))},
        now)
    run = _start(deps)
    book = ledger(run, pipeline, now)
    own = hourly_rate(pipeline, run.attempts[0].capacity, "us-central1").per_hour
    assert own == pytest.approx(4 * 0.011149 + 15 * 0.001494)  # the pipeline's n1-standard-4
    # the first attempt is billed as g2-standard-8 (G2's rates) + its L4, not n1-standard-4
    assert book.attempts[0].per_hour == pytest.approx(8 * 0.021856 + 32 * 0.002560 + 0.2231)


def test_spotorch_show_has_the_hardware_table() -> None:
    from rich.console import Console

    from spotorch.app.views import run_view
    from spotorch.operate.render import show_run

    pipeline = _pipeline()
    deps = fake_deps(pipeline)
    assert isinstance(deps.clock, ManualClock)
    now = deps.clock.now()
    save_cache(deps.docs, "p", {
        c.name: ProbeResult(c.name, True, steps_per_s=rate, measured_at=now,
                            key=cache_key(pipeline, c, 20)) for c, rate in ((CPU, 2.0), (L4, 4.0))},
        now)
    view = run_view(_start(deps), pipeline, now)
    assert view["hardware"]["chosen"] == "l4"
    console = Console(width=200, record=True, color_system=None)
    for part in show_run(view):
        console.print(part)
    text = console.export_text()
    assert "hardware" in text and "l4 *" in text and "misses deadline" in text
    assert "chosen: l4: cheapest expected Spot cost" in text
