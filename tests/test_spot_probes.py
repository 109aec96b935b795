"""Spot capacity probes (issue 18): a run on standard VMs looks for Spot without an attempt.

The service on the in-memory adapters: what a probe job is, when one is launched and given up,
how its answer moves a run back to Spot, and that it never counts as an attempt.
"""

from __future__ import annotations

import pytest

from fakes import fake_deps
from spotorch.adapters.memory.twins import InMemoryLauncher, InMemoryPublisher, ManualClock
from spotorch.app.deps import ContradictedLine, Deps
from spotorch.app.job_events import job_line_reported
from spotorch.app.runs import cancel_run, start_run
from spotorch.app.tick import tick
from spotorch.core.context import Context
from spotorch.core.cost import ledger
from spotorch.core.decide import decide
from spotorch.core.events import kind_of
from spotorch.core.intents import CancelIntent
from spotorch.core.model import (
    CANCEL_PROBE_MOVED_ON,
    CANCEL_PROBE_NO_CAPACITY,
    CANCEL_SWITCH,
    AttemptState,
    JobPhase,
    Probe,
    Run,
    RunStatus,
)
from spotorch.core.moves import LAUNCH_LEASE_S
from spotorch.core.observations import CancelRequested, ProbeLaunched
from spotorch.core.pipeline import (
    Capacity,
    EscalationKind,
    JobTemplate,
    Pipeline,
    RecoveryPolicy,
    SpotProbes,
    Trigger,
    WorkerPool,
)
from spotorch.ports.jobs import LABEL_ATTEMPT, LABEL_PROBE, LABEL_RUN

H = 3600.0
PROBE_COMMAND = ("python", "-c", "import time; time.sleep(3600)")


def pipeline(*, probes: bool = True, regions: tuple[str, ...] = ("us-central1",),
             escalation: EscalationKind = EscalationKind.DEADLINE) -> Pipeline:
    pool = WorkerPool(machine_type="n1-standard-8", image_uri="us-docker.pkg.dev/p/r/train:1",
                      command=("python", "-m", "train"), args=("--epochs", "3"),
                      env=(("LR", "0.1"),))
    return Pipeline(
        name="p", trigger=Trigger(bucket="b"), checkpoint_uri="gs://c/p", output_uri="gs://m/p",
        job=JobTemplate(worker_pools=(pool,), regions=regions), deadline_s=30 * H,
        recovery=RecoveryPolicy(escalation=escalation, expected_compute_s=10 * H,
                                stockout_wait_s=900.0, backoff_base_s=1.0, backoff_cap_s=1.0,
                                spot_probes=SpotProbes(enabled=probes, wait_s=600.0)))


def fakes(deps: Deps) -> tuple[InMemoryLauncher, InMemoryPublisher, ManualClock]:
    assert isinstance(deps.launcher, InMemoryLauncher)
    assert isinstance(deps.publisher, InMemoryPublisher)
    assert isinstance(deps.clock, ManualClock)
    return deps.launcher, deps.publisher, deps.clock


def load(deps: Deps) -> Run:
    run, _ = deps.runs.load("r1")
    assert run is not None
    return run


def probe_jobs(launcher: InMemoryLauncher) -> list[str]:
    return [n for n, j in launcher.jobs.items() if j.spec.labels.get(LABEL_PROBE)]


def live_probe_jobs(launcher: InMemoryLauncher) -> list[str]:
    return [n for n in probe_jobs(launcher) if not launcher.jobs[n].status.phase.terminal]


def on_standard(deps: Deps) -> Run:
    """A run whose Spot attempt found no capacity and now runs on standard (attempt 2)."""
    launcher, _, clock = fakes(deps)
    assert start_run(deps, "p", run_id="r1", data_uri="gs://b/d/", snapshot_id="s",
                     reason="t") is not None
    clock.advance(1000.0)  # attempt 1 queued past the stockout wait
    tick(deps)
    tick(deps)  # its cancel is seen: a stockout in the only region -> standard
    clock.advance(5.0)
    tick(deps)
    run = load(deps)
    assert [a.capacity for a in run.attempts] == [Capacity.SPOT, Capacity.STANDARD]
    launcher.set_status(launcher.job_of("r1", 2), JobPhase.RUNNING, start_time=clock.t)
    tick(deps)
    # No probe within the minimum dwell of the move to standard (a yes could not be acted on).
    assert load(deps).counters.probes == 0
    clock.advance(600.0)  # the minimum dwell: one restart overhead (RecoveryPolicy's 600 s)
    tick(deps)
    return load(deps)


def test_a_run_on_standard_probes_spot_with_a_minimal_job_that_is_no_attempt() -> None:
    deps = fake_deps(pipeline())
    launcher, _, _ = fakes(deps)
    run = on_standard(deps)
    assert run.status is RunStatus.RUNNING and len(run.attempts) == 2
    (name,) = probe_jobs(launcher)
    spec = launcher.jobs[name].spec
    assert spec.capacity is Capacity.SPOT and spec.attempt == 0
    assert spec.labels[LABEL_PROBE] == "capacity" and spec.labels[LABEL_ATTEMPT] == "probe-1"
    assert spec.labels[LABEL_RUN] == "r1"
    pool = spec.template.worker_pools[0]
    # The run's shape, but not its training: the probe only has to start.
    assert pool.machine_type == "n1-standard-8" and pool.command == PROBE_COMMAND
    assert pool.args == () and pool.env == () and spec.env == {}
    assert run.counters.probes == 1 and run.probes[0].job_name == name
    assert run.probes[0].state is AttemptState.QUEUED
    # Launching attempt 3 later must never adopt the probe's job.
    assert launcher.find("r1", 3) is None


def test_a_probe_without_capacity_is_given_up_after_its_wait_and_another_follows() -> None:
    deps = fake_deps(pipeline())
    launcher, publisher, clock = fakes(deps)
    on_standard(deps)
    clock.advance(300.0)
    tick(deps)
    assert load(deps).probes[0].found is None  # still within its wait
    clock.advance(400.0)
    tick(deps)
    run = load(deps)
    first = run.probes[0]
    assert first.found is False and first.cancel_reason == CANCEL_PROBE_NO_CAPACITY
    assert launcher.jobs[first.job_name or ""].status.phase is JobPhase.CANCELLED
    assert "run.spot_probed" in [kind_of(t) for t in publisher.types()]
    tick(deps)  # the cancel seen; the next tick may probe again
    tick(deps)
    run = load(deps)
    assert run.counters.probes == 2 and len(live_probe_jobs(launcher)) == 1
    assert [a.capacity for a in run.attempts] == [Capacity.SPOT, Capacity.STANDARD]
    assert run.counters.stockouts == 1  # probes touch no budget


def test_a_probe_that_runs_moves_the_run_back_to_spot_in_its_region() -> None:
    deps = fake_deps(pipeline(regions=("us-central1", "europe-west4")))
    launcher, publisher, clock = fakes(deps)
    assert start_run(deps, "p", run_id="r1", data_uri="gs://b/d/", snapshot_id="s",
                     reason="t") is not None
    for _ in range(2):  # a stockout in each region: then standard
        clock.advance(1000.0)
        tick(deps)
        tick(deps)
        clock.advance(5.0)
        tick(deps)
    run = load(deps)
    assert [a.capacity for a in run.attempts][-1] is Capacity.STANDARD
    standard = run.current
    assert standard is not None
    launcher.set_status(standard.job_name or "", JobPhase.RUNNING, start_time=clock.t)
    clock.advance(600.0)  # past the minimum dwell of the move to standard
    tick(deps)
    (name,) = live_probe_jobs(launcher)
    probe_region = load(deps).probes[0].region
    launcher.set_status(name, JobPhase.RUNNING, start_time=clock.t + 30.0)
    clock.advance(60.0)
    tick(deps)
    run = load(deps)
    assert run.probes[0].found is True and launcher.jobs[name].status.phase is JobPhase.CANCELLED
    assert run.current is not None and run.current.cancel_reason == CANCEL_SWITCH
    tick(deps)  # the standard attempt's cancel is seen: relaunch on Spot
    run = load(deps)
    assert run.current is not None and run.current.capacity is Capacity.SPOT
    assert run.current.region == probe_region and run.next_region is None
    assert len(run.attempts) == standard.number + 1
    assert run.counters.preemptions == 0 and run.counters.probes == 1
    assert live_probe_jobs(launcher) == []
    probed = [e for e in publisher.events if kind_of(e["type"]) == "run.spot_probed"]
    assert probed[-1]["data"]["found"] is True and probed[-1]["data"]["switching"] is True
    # The probe is billed (it ran 30 s) at the Spot price, and only that.
    book = ledger(run, deps.pipeline("p"), clock.t)
    assert book.probes == 1 and 0 < book.probe_cost < 0.01
    assert book.total == pytest.approx(sum(a.cost for a in book.attempts) + book.probe_cost)


def test_never_two_live_probes_and_none_once_the_run_leaves_standard() -> None:
    deps = fake_deps(pipeline())
    launcher, _, clock = fakes(deps)
    on_standard(deps)
    for _ in range(5):
        clock.advance(60.0)
        tick(deps)
        assert len(live_probe_jobs(launcher)) <= 1
    cancel_run(deps, "r1")
    tick(deps)
    run = load(deps)
    assert run.status is RunStatus.CANCELLED
    assert live_probe_jobs(launcher) == [] and all(not p.live for p in run.probes)


def test_a_probe_created_after_its_run_moved_on_is_cancelled_when_it_appears() -> None:
    deps = fake_deps(pipeline())
    launcher, _, clock = fakes(deps)
    run = on_standard(deps)
    # The run ends while the probe's creation is still in flight: the job appears afterwards.
    (name,) = probe_jobs(launcher)
    ended = decide(run, CancelRequested("operator"), Context(
        deps.pipeline("p"), clock.t))
    probe = ended.probes[0]
    assert probe.cancel_reason == CANCEL_PROBE_MOVED_ON
    late = decide(
        Run(**{**vars(ended), "probes": (Probe(1, probe.region, created_at=1.0,
                                                             cancel_reason=probe.cancel_reason),)}),
        ProbeLaunched("x", 1, name), Context(deps.pipeline("p"), clock.t))
    cancels = [i for i in late.outbox if isinstance(i, CancelIntent) and i.probe == 1]
    assert cancels and cancels[0].job_name == name


def test_the_tick_cancels_a_probe_job_its_run_no_longer_knows() -> None:
    deps = fake_deps(pipeline())
    launcher, _, clock = fakes(deps)
    on_standard(deps)
    (name,) = probe_jobs(launcher)
    run, version = deps.runs.load("r1")
    assert run is not None
    deps.runs.save(Run(**{**vars(run), "probes": ()}), version)  # forgotten (a crash)
    clock.advance(2 * LAUNCH_LEASE_S + 1)
    tick(deps)
    assert launcher.jobs[name].status.phase is JobPhase.CANCELLED


def test_a_probe_job_line_is_confirmed_with_vertex_before_it_moves_the_run() -> None:
    deps = fake_deps(pipeline())
    launcher, _, clock = fakes(deps)
    on_standard(deps)
    (name,) = probe_jobs(launcher)
    job_id = name.rsplit("/", 1)[-1]
    # A forged (or early) RUNNING line: Vertex still says QUEUED, so nothing moves.
    with pytest.raises(ContradictedLine):
        job_line_reported(deps, job_id, JobPhase.RUNNING, "Job is running.")
    run = load(deps)
    assert run.probes[0].found is None and run.current is not None
    assert run.current.cancel_reason is None
    launcher.set_status(name, JobPhase.RUNNING, start_time=clock.t)
    job_line_reported(deps, job_id, JobPhase.RUNNING, "Job is running.")
    run = load(deps)
    assert run.probes[0].found is True
    assert run.current is not None and run.current.cancel_reason == CANCEL_SWITCH


@pytest.mark.parametrize("probes,escalation", [(False, EscalationKind.DEADLINE),
                                                (True, EscalationKind.COUNT)])
def test_no_probes_unless_enabled_with_the_deadline_policy(probes: bool,
                                                           escalation: EscalationKind) -> None:
    deps = fake_deps(pipeline(probes=probes, escalation=escalation))
    launcher, _, clock = fakes(deps)
    assert start_run(deps, "p", run_id="r1", data_uri="gs://b/d/", snapshot_id="s",
                     reason="t") is not None
    for _ in range(6):
        clock.advance(1000.0)
        tick(deps)
    assert probe_jobs(launcher) == [] and load(deps).counters.probes == 0


def test_a_probe_is_not_worth_it_when_the_deadline_leaves_no_room_for_spot() -> None:
    tight = pipeline()
    tight = Pipeline(**{**vars(tight), "deadline_s": 10.3 * H})
    deps = fake_deps(tight)
    launcher, _, clock = fakes(deps)
    assert start_run(deps, "p", run_id="r1", data_uri="gs://b/d/", snapshot_id="s",
                     reason="t") is not None
    run = load(deps)
    assert run.current is not None and run.current.capacity is Capacity.STANDARD
    launcher.set_status(run.current.job_name or "", JobPhase.RUNNING, start_time=clock.t)
    for _ in range(4):
        clock.advance(300.0)
        tick(deps)
    assert probe_jobs(launcher) == []


def test_probes_survive_the_run_document_round_trip() -> None:
    deps = fake_deps(pipeline())
    run = on_standard(deps)
    again = Run.from_dict(run.to_dict())
    assert again == run and again.probes[0].state is AttemptState.QUEUED


def test_a_probe_job_vertex_no_longer_knows_ends_without_an_answer_and_the_run_goes_on() -> None:
    deps = fake_deps(pipeline())
    launcher, _, clock = fakes(deps)
    on_standard(deps)
    (name,) = probe_jobs(launcher)
    del launcher.jobs[name]  # vanished: Vertex answers NOT_FOUND
    clock.advance(60.0)
    tick(deps)
    run = load(deps)
    first = run.probes[0]
    assert not first.live and first.found is None and "no longer knows" in (first.end_reason or "")
    assert run.status is RunStatus.RUNNING and run.current is not None
    assert run.current.capacity is Capacity.STANDARD and run.current.cancel_reason is None
    clock.advance(60.0)
    tick(deps)
    assert load(deps).counters.probes == 2  # the next tick may probe again
