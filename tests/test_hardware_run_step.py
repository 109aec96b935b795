"""Hardware probes as a run's first step (issue 19), in the service on the in-memory adapters.

A run of a pipeline with candidates and no fresh cached results probes them itself: one Spot job
per candidate, all at once, running the training code for probe_steps steps; the tick (or a job
line) sees each end, the report is read, and once all are in the choice is made and the first
attempt launches on it. No process waits: each step is an event or a tick.
"""

from __future__ import annotations

import json

from fakes import fake_deps
from spotorch.adapters.memory.twins import (
    InMemoryCheckpoints,
    InMemoryLauncher,
    InMemoryPublisher,
    ManualClock,
)
from spotorch.app.deps import Deps
from spotorch.app.hardware_probes import load_cache
from spotorch.app.job_events import job_line_reported
from spotorch.app.runs import cancel_run, start_run
from spotorch.app.tick import tick
from spotorch.core.events import kind_of
from spotorch.core.hardware import cache_key
from spotorch.core.model import JobPhase, Run, RunStatus
from spotorch.core.pipeline import (
    EscalationKind,
    HardwareCandidate,
    HardwareSearch,
    JobTemplate,
    OnActiveRun,
    Pipeline,
    RecoveryPolicy,
    Trigger,
    WorkerPool,
)
from spotorch.ports.jobs import LABEL_ATTEMPT, LABEL_PROBE, LABEL_RUN
from spotorch.spec.event_schemas import validate_event

CPU = HardwareCandidate("cpu", "n1-standard-8")
L4 = HardwareCandidate("l4", "g2-standard-8", "NVIDIA_L4", 1)
SMALL = HardwareCandidate("small", "n1-highcpu-2")


def pipeline(*candidates: HardwareCandidate, timeout_s: float = 1200.0) -> Pipeline:
    return Pipeline(
        name="p", trigger=Trigger(bucket="b", on_active_run=OnActiveRun.PARALLEL), checkpoint_uri="gs://c/p", output_uri="gs://m/p",
        job=JobTemplate(worker_pools=(WorkerPool(image_uri="img", command=("python", "t.py")),)),
        deadline_s=3 * 3600.0,
        recovery=RecoveryPolicy(escalation=EscalationKind.DEADLINE, expected_compute_s=600.0),
        hardware=HardwareSearch(candidates=candidates or (CPU, L4, SMALL), total_steps=36_000,
                                probe_steps=20, probe_timeout_s=timeout_s))


def parts(deps: Deps) -> tuple[InMemoryLauncher, InMemoryCheckpoints, ManualClock]:
    assert isinstance(deps.launcher, InMemoryLauncher)
    assert isinstance(deps.checkpoints, InMemoryCheckpoints)
    assert isinstance(deps.clock, ManualClock)
    return deps.launcher, deps.checkpoints, deps.clock


def start(deps: Deps) -> Run:
    run = start_run(deps, "p", run_id="r1", data_uri="gs://b/d/", snapshot_id="s", reason="t")
    assert run is not None
    return run


def load(deps: Deps) -> Run:
    run, _ = deps.runs.load("r1")
    assert run is not None
    return run


def probe_job(deps: Deps, candidate: str) -> str:
    launcher, _, _ = parts(deps)
    return next(n for n, j in launcher.jobs.items()
                if j.spec.labels.get("spotorch_candidate") == candidate)


def report(deps: Deps, candidate: str, **fields: object) -> None:
    """What the trainer helper writes at the end of a probe (spotorch_trainer.Run.steps)."""
    _, checkpoints, _ = parts(deps)
    uri = f"gs://c/p/r1-probes/{candidate}/checkpoints/probe.json"
    checkpoints.reports[uri] = json.dumps({"steps": 20, "oom": False, "error": None,
                                           **fields}).encode()


def finish(deps: Deps, candidate: str, phase: JobPhase = JobPhase.SUCCEEDED, **kw: object) -> None:
    launcher, _, clock = parts(deps)
    launcher.set_status(probe_job(deps, candidate), phase, start_time=clock.t - 60,
                        end_time=clock.t, **kw)


def test_a_run_probes_every_candidate_at_once_with_the_training_code() -> None:
    deps = fake_deps(pipeline())
    launcher, _, _ = parts(deps)
    run = start(deps)
    assert run.status is RunStatus.PROBING and run.attempts == ()
    assert len(launcher.jobs) == 3 and run.counters.probes == 3
    job = launcher.jobs[probe_job(deps, "l4")]
    spec = job.spec
    assert spec.labels[LABEL_PROBE] == "hardware" and spec.labels[LABEL_RUN] == "r1"
    assert spec.labels[LABEL_ATTEMPT].startswith("probe-") and spec.capacity.value == "spot"
    (pool,) = spec.template.worker_pools
    assert (pool.machine_type, pool.accelerator_type) == ("g2-standard-8", "NVIDIA_L4")
    assert spec.env["SPOTORCH_PROBE_STEPS"] == "20" and spec.env["SPOTORCH_EVENTS_TOPIC"] == ""
    assert spec.env["SPOTORCH_CHECKPOINT_URI"] == "gs://c/p/r1-probes/l4/checkpoints"
    assert spec.env["SPOTORCH_DATA_URI"] == "gs://b/d/"
    assert spec.template.timeout_s == 1200.0
    assert launcher.find("r1", 1) is None  # no probe is ever taken for attempt 1


def test_the_choice_waits_for_every_candidate_then_the_first_attempt_runs_on_it() -> None:
    deps = fake_deps(pipeline())
    launcher, _, clock = parts(deps)
    start(deps)
    clock.advance(120.0)
    report(deps, "cpu", steps_per_s=2.0)
    finish(deps, "cpu")
    tick(deps)
    run = load(deps)
    assert run.status is RunStatus.PROBING and set(run.hardware_results) == {"cpu"}
    report(deps, "l4", steps_per_s=4.0)
    finish(deps, "l4")
    report(deps, "small", oom=True, error="CUDA out of memory")
    finish(deps, "small", JobPhase.FAILED, exit_code=1, message="exit 1")
    tick(deps)
    run = load(deps)
    assert run.status is RunStatus.STARTING and run.hardware is not None
    assert run.hardware["chosen"] == "l4"  # cpu needs 5 h: misses the 3 h deadline
    rows = {r["candidate"]: r for r in run.hardware["rows"]}
    assert not rows["small"]["fit"] and "out of memory" in rows["small"]["reason"]
    (attempt,) = run.attempts
    spec = launcher.jobs[attempt.job_name or ""].spec
    assert spec.template.worker_pools[0].accelerator_type == "NVIDIA_L4"
    assert "SPOTORCH_PROBE_STEPS" not in spec.env
    assert isinstance(deps.publisher, InMemoryPublisher)
    (chosen,) = [e for e in deps.publisher.events if kind_of(e["type"]) == "run.hardware_chosen"]
    assert validate_event(chosen) == [] and chosen["data"]["chosen"] == "l4"
    # the measurements are cached for the next run of the same code
    cache = load_cache(deps.docs, "p")
    assert cache["l4"].steps_per_s == 4.0 and cache["l4"].key == cache_key(deps.pipeline("p"),
                                                                           L4, 20)
    assert all(not p.live for p in run.probes)


def test_the_next_run_reuses_the_cached_measurements_and_probes_nothing() -> None:
    deps = fake_deps(pipeline(CPU, L4))
    launcher, _, _ = parts(deps)
    start(deps)
    for name, rate in (("cpu", 2.0), ("l4", 4.0)):
        report(deps, name, steps_per_s=rate)
        finish(deps, name)
    tick(deps)
    assert load(deps).hardware is not None
    created = launcher.created
    second = start_run(deps, "p", run_id="r2", data_uri="gs://b/e/", snapshot_id="s2",
                       reason="t")
    assert second is not None and second.status is RunStatus.STARTING
    assert second.hardware is not None and second.hardware["chosen"] == "l4"
    assert launcher.created == created + 1 and second.probes == ()


def test_a_probe_past_its_time_limit_is_cancelled_and_unfit() -> None:
    deps = fake_deps(pipeline(CPU, L4, timeout_s=600.0))
    launcher, _, clock = parts(deps)
    start(deps)
    report(deps, "cpu", steps_per_s=50.0)
    finish(deps, "cpu")
    clock.advance(1000.0)  # l4 still queued past probe_timeout + a tick
    tick(deps)
    run = load(deps)
    assert not run.hardware_results["l4"]["fit"]
    assert "timed out" in run.hardware_results["l4"]["reason"]
    assert launcher.jobs[probe_job(deps, "l4")].status.phase is JobPhase.CANCELLED
    assert run.hardware is not None and run.hardware["chosen"] == "cpu"
    assert run.status is RunStatus.STARTING


def test_no_fit_candidate_runs_on_the_pipelines_own_pools() -> None:
    deps = fake_deps(pipeline(CPU, L4))
    launcher, _, _ = parts(deps)
    start(deps)
    for name in ("cpu", "l4"):
        finish(deps, name, JobPhase.FAILED, exit_code=137, message="OOMKilled")
    tick(deps)
    run = load(deps)
    assert run.hardware is None and run.status is RunStatus.STARTING
    assert any(h.what == "no hardware chosen" for h in run.history)
    (attempt,) = run.attempts
    assert launcher.jobs[attempt.job_name or ""].spec.template.worker_pools[0].machine_type == \
        "n1-standard-4"


def test_a_probe_without_a_report_is_unfit_and_says_why() -> None:
    deps = fake_deps(pipeline(CPU, L4))
    start(deps)
    report(deps, "l4", steps_per_s=4.0)
    finish(deps, "l4")
    finish(deps, "cpu")  # succeeded, but the code never used Run.steps(): no report
    tick(deps)
    run = load(deps)
    assert "no measurement" in run.hardware_results["cpu"]["reason"]


def test_a_job_line_of_a_probe_is_confirmed_and_measured() -> None:
    deps = fake_deps(pipeline(CPU, L4))
    start(deps)
    report(deps, "cpu", steps_per_s=2.0)
    finish(deps, "cpu")
    job_line_reported(deps, probe_job(deps, "cpu").rsplit("/", 1)[-1], JobPhase.SUCCEEDED,
                      "Job completed successfully.")
    assert load(deps).hardware_results["cpu"]["steps_per_s"] == 2.0


def test_cancelling_a_probing_run_cancels_its_probes() -> None:
    deps = fake_deps(pipeline())
    launcher, _, _ = parts(deps)
    start(deps)
    run = cancel_run(deps, "r1")
    assert run.status is RunStatus.CANCELLED
    assert all(j.status.phase is JobPhase.CANCELLED for j in launcher.jobs.values())
    assert run.attempts == ()


def test_an_oversized_or_garbled_report_is_no_measurement_and_breaks_nothing() -> None:
    deps = fake_deps(pipeline(CPU, L4))
    _, checkpoints, _ = parts(deps)
    start(deps)
    checkpoints.reports["gs://c/p/r1-probes/cpu/checkpoints/probe.json"] = b"{" * (1 << 17)
    finish(deps, "cpu")
    checkpoints.reports["gs://c/p/r1-probes/l4/checkpoints/probe.json"] = b"not json"
    finish(deps, "l4")
    tick(deps)
    run = load(deps)
    assert all("no measurement" in run.hardware_results[n]["reason"] for n in ("cpu", "l4"))
    assert run.hardware is None and run.status is RunStatus.STARTING  # the pipeline's own pools
