"""Issue 27's findings, each as a test: trust nothing unproven (job-state lines, ids, endings,
claims, hysteresis). Trainer signatures and checkpoints: tests/test_trainer_auth.py."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from fakes import PROJECT, fake_deps
from spotorch.adapters.memory.twins import InMemoryLauncher, ManualClock
from spotorch.app.deps import Deps
from spotorch.app.runs import start_run
from spotorch.app.tick import tick
from spotorch.core.context import Context
from spotorch.core.decide import decide, new_run
from spotorch.core.model import AttemptState, JobPhase, JobStatus, Run, RunStatus
from spotorch.core.observations import JobObserved
from spotorch.core.pipeline import BatchMode, EscalationKind, Pipeline, RecoveryPolicy, Trigger
from test_functions import deps as functions_deps  # noqa: F401  (the "deps" fixture)
from test_functions import landed, post, pubsub_event, sink_line, storage_event

T0 = 1_800_000_000.0


def pipeline(**recovery: Any) -> Pipeline:
    return Pipeline(name="p", trigger=Trigger(bucket="landing", prefix="in/",
                                              batch=BatchMode.EACH_OBJECT),
                    checkpoint_uri="gs://c/p", output_uri="gs://m/p",
                    recovery=RecoveryPolicy(**{"escalation": EscalationKind.NEVER,
                                               "backoff_base_s": 1.0, **recovery}))


def parts(deps: Deps) -> tuple[InMemoryLauncher, ManualClock]:
    assert isinstance(deps.launcher, InMemoryLauncher) and isinstance(deps.clock, ManualClock)
    return deps.launcher, deps.clock


def started(deps: Deps, run_id: str = "r1") -> Run:
    run = start_run(deps, "p", run_id=run_id, data_uri="gs://landing/in/a", snapshot_id=run_id,
                    reason="t")
    assert run is not None
    return run


def load(deps: Deps, run_id: str = "r1") -> Run:
    run, _ = deps.runs.load(run_id)
    assert run is not None
    return run


# --- lines are hints, everywhere ------------------------------------------------------------------


def test_an_unconfirmed_cancelling_moves_no_attempt_in_the_domain() -> None:
    p = pipeline()
    run = new_run(run_id="r", pipeline=p, now=T0, data_uri="gs://b/", snapshot_id=None)
    ctx = Context(p, T0 + 1)
    job = "projects/p/locations/us-central1/customJobs/1"
    run = decide(run, JobObserved(1, JobStatus(job, JobPhase.RUNNING)), ctx)
    assert run.current is not None and run.current.state is AttemptState.RUNNING
    for phase in (JobPhase.CANCELLING, JobPhase.FAILED, JobPhase.SUCCEEDED, JobPhase.CANCELLED):
        hinted = decide(run, JobObserved(1, JobStatus(job, phase), confirmed=False), ctx)
        assert hinted == run, phase


def test_ten_cancel_lines_for_a_running_job_change_nothing_and_are_recorded(
        functions_deps: Deps) -> None:  # noqa: F811 (a fixture)
    """Finding: ten real-shaped "Job is being cancelled." entries held the attempt CANCELLING
    while Vertex said RUNNING, and the tick never corrected it."""
    deps = functions_deps
    landed(deps, "datasets/a.csv")
    post("on_object_finalized", storage_event("datasets/a.csv"))
    run = deps.runs.active()[0]
    launcher, clock = parts(deps)
    job = launcher.job_of(run.run_id, 1)
    launcher.set_status(job, JobPhase.RUNNING)
    tick(deps)
    before = load(deps, run.run_id)
    assert before.status is RunStatus.RUNNING
    for i in range(10):
        resp = post("on_job_event", pubsub_event(sink_line(job, "Job is being cancelled.",
                                                           f"c{i}"), {}, f"cancel-{i}"))
        assert resp.status_code == 200
        record, _ = deps.docs.get("rejected_events", f"cancel-{i}")
        assert record is not None and "Vertex says RUNNING" in record["reason"]
    after = load(deps, run.run_id)
    assert after.current is not None and after.current.state is AttemptState.RUNNING
    assert after.status is RunStatus.RUNNING and launcher.cancelled == []
    clock.advance(30.0)
    tick(deps)
    assert load(deps, run.run_id).current.state is AttemptState.RUNNING  # type: ignore[union-attr]


def test_a_cancel_line_after_spotorch_asked_is_applied_as_vertex_answers(
        functions_deps: Deps) -> None:  # noqa: F811 (a fixture)
    """spotorch's own cancel: Vertex answers CANCELLED, and that is what the run records."""
    from spotorch.app.runs import cancel_run

    deps = functions_deps
    landed(deps, "datasets/a.csv")
    post("on_object_finalized", storage_event("datasets/a.csv"))
    run = deps.runs.active()[0]
    launcher, _ = parts(deps)
    job = launcher.job_of(run.run_id, 1)
    launcher.set_status(job, JobPhase.RUNNING)
    cancel_run(deps, run.run_id, "stop")  # the fake launcher cancels at once
    resp = post("on_job_event", pubsub_event(sink_line(job, "Job was cancelled."), {}, "c"))
    assert resp.status_code == 200 and deps.docs.get("rejected_events", "c")[0] is None
    assert load(deps, run.run_id).status is RunStatus.CANCELLED


def test_an_entry_of_another_project_is_rejected_and_recorded(
        functions_deps: Deps) -> None:  # noqa: F811 (a fixture)
    """Finding: entries whose resource.labels.project_id is another project were attributed
    to our job (the job id is only unique within a project)."""
    import json

    deps = functions_deps
    landed(deps, "datasets/a.csv")
    post("on_object_finalized", storage_event("datasets/a.csv"))
    run = deps.runs.active()[0]
    launcher, _ = parts(deps)
    job = launcher.job_of(run.run_id, 1)
    launcher.set_status(job, JobPhase.FAILED, message="boom")  # ours failed; theirs says so
    entry = json.loads(sink_line(job, "Job failed."))
    entry["resource"]["labels"]["project_id"] = "someone-else"
    before = load(deps, run.run_id)
    resp = post("on_job_event", pubsub_event(json.dumps(entry).encode(), {}, "other"))
    assert resp.status_code == 200
    record, _ = deps.docs.get("rejected_events", "other")
    assert record is not None and "someone-else" in record["reason"] and PROJECT in record["reason"]
    assert load(deps, run.run_id) == before and launcher.gets == 0
    # The same entry from our own project is applied (Vertex's answer: failed).
    resp = post("on_job_event", pubsub_event(sink_line(job, "Job failed."), {}, "ours"))
    assert resp.status_code == 200
    assert load(deps, run.run_id).current.state is AttemptState.FAILED  # type: ignore[union-attr]


@pytest.mark.parametrize("line", ["Job is running.", "Job is preparing.", "Job is queued."])
def test_a_forward_line_is_not_applied_before_vertex_says_so(
        functions_deps: Deps, line: str) -> None:  # noqa: F811 (a fixture)
    """A RUNNING line for a queued Spot job would disarm the stockout rule: not applied."""
    deps = functions_deps
    landed(deps, "datasets/a.csv")
    post("on_object_finalized", storage_event("datasets/a.csv"))
    run = deps.runs.active()[0]
    launcher, _ = parts(deps)
    job = launcher.job_of(run.run_id, 1)
    before = load(deps, run.run_id)
    assert before.current is not None and before.current.state is AttemptState.QUEUED
    assert post("on_job_event", pubsub_event(sink_line(job, line), {}, "fwd")).status_code == 200
    after = load(deps, run.run_id)
    assert after.current is not None and after.current.state is AttemptState.QUEUED
    assert after.current.started_at is None


# --- precedence of endings --------------------------------------------------------------------------


def _reporting(deps: Deps) -> tuple[Run, str]:
    """A running attempt whose trainer reports (so the hang rule watches it)."""
    from spotorch.app.job_events import trainer_reported
    from spotorch.core.observations import TrainerReported

    launcher, clock = parts(deps)
    run = started(deps)
    job = launcher.job_of(run.run_id, 1)
    launcher.set_status(job, JobPhase.RUNNING, start_time=clock.t)
    tick(deps)
    trainer_reported(deps, run.run_id, TrainerReported(1, "started", clock.t, step=0,
                                                       report_interval_s=1.0))
    clock.advance(1.0)
    trainer_reported(deps, run.run_id, TrainerReported(1, "progress", clock.t, step=5))
    return load(deps, run.run_id), job


def _health_pipeline() -> Pipeline:
    import dataclasses

    from spotorch.core.health import HealthPolicy

    return dataclasses.replace(pipeline(), health=HealthPolicy(hang_after_s=30.0))


def test_a_vanished_job_ends_lost_not_hung() -> None:
    """Finding: a job Vertex no longer knows ended as `hung` (the hang rule fired first), so the
    hang budget paid for an infrastructure loss."""
    from spotorch.core.model import FailureClass

    deps = fake_deps(_health_pipeline())
    launcher, clock = parts(deps)
    _, job = _reporting(deps)
    del launcher.jobs[job]  # Vertex forgets the job: NOT_FOUND from now on
    for _ in range(8):
        clock.advance(45.0)  # each tick is past hang_after (30 s) since the last report
        tick(deps)
        if len(load(deps).attempts) > 1:
            break
    after = load(deps)
    first = after.attempts[0]
    assert first.failure is FailureClass.LOST and first.end_reason.startswith("lost")  # type: ignore[union-attr]
    assert after.counters.lost == 1 and after.counters.hangs == 0
    assert not any("hung" in h.what for h in after.history)
    assert len(after.attempts) == 2 and launcher.cancelled == []


def test_not_found_after_a_hang_cancel_still_counts_as_lost() -> None:
    """The hang rule fired and asked for a cancel; then Vertex answered NOT_FOUND: lost wins."""
    from spotorch.core.model import CANCEL_HUNG, FailureClass

    deps = fake_deps(_health_pipeline())
    launcher, clock = parts(deps)
    _, job = _reporting(deps)
    def never(job_name: str) -> None:  # the cancel never lands
        pass

    launcher.cancel = never  # type: ignore[method-assign]
    clock.advance(45.0)
    tick(deps)  # hung: cancel asked
    assert load(deps).current.cancel_reason == CANCEL_HUNG  # type: ignore[union-attr]
    del launcher.jobs[job]
    for _ in range(8):
        clock.advance(45.0)
        tick(deps)
    after = load(deps)
    assert after.attempts[0].failure is FailureClass.LOST
    assert after.counters.lost == 1 and after.counters.hangs == 0


@pytest.mark.parametrize(("message", "failure"), [
    ("The replica workerpool0-0 exited with a non-zero status of 137. Termination reason: "
     "Error.", "infra"),
    ("The replica workerpool0-0 exited with a non-zero status of 137. Termination reason: "
     "OOMKilled.", "out_of_memory"),
    ("The replica workerpool0-0 exited with a non-zero status of 1. Termination reason: "
     "Error.", "user_error"),
    ("The replica workerpool0-0 exited with a non-zero status of 143.", "preempted"),
])
def test_exit_137_without_an_out_of_memory_signal_is_infrastructure(message: str,
                                                                     failure: str) -> None:
    """Finding: a worker killed with exit 137 (SIGKILL: the VM, the kernel) counted as a user
    error, the smallest budget."""
    from classifying import classify

    phase, found, _ = classify("JOB_STATE_FAILED", 3, message)
    assert phase is JobPhase.FAILED and str(found) == failure


def test_exit_137_the_trainer_chose_is_a_user_error() -> None:
    from spotorch.core.model import FailureClass
    from spotorch.core.observations import TrainerReported

    p = pipeline()
    run = new_run(run_id="r", pipeline=p, now=T0, data_uri="gs://b/", snapshot_id=None)
    ctx = Context(p, T0 + 1)
    job = "projects/p/locations/us-central1/customJobs/1"
    run = decide(run, JobObserved(1, JobStatus(job, JobPhase.RUNNING)), ctx)
    killed = JobStatus(job, JobPhase.FAILED, failure=FailureClass.INFRA, exit_code=137)
    infra = decide(run, JobObserved(1, killed), ctx)
    assert infra.attempts[0].failure is FailureClass.INFRA and infra.counters.user_errors == 0
    said = decide(run, TrainerReported(1, "failed", T0 + 1, step=3, exit_code=137), ctx)
    user = decide(said, JobObserved(1, killed), ctx)
    assert user.attempts[0].failure is FailureClass.USER_ERROR and user.counters.user_errors == 1


# --- relaunch after a Vertex outage -------------------------------------------------------------------


class Outage:
    """Vertex AI down: every call of the in-memory launcher answers UNAVAILABLE while `down`."""

    def __init__(self, launcher: InMemoryLauncher) -> None:
        from spotorch.ports.jobs import LaunchError

        self.down = False
        self.calls = 0
        real_get, real_launch = launcher.get, launcher.launch

        def unavailable() -> LaunchError:
            self.calls += 1
            return LaunchError("503 Vertex AI is unavailable", permanent=False,
                               code="UNAVAILABLE")

        def get(job_name: str) -> JobStatus:
            if self.down:
                raise unavailable()
            return real_get(job_name)

        def launch(spec: Any) -> str:
            if self.down:
                raise unavailable()
            return real_launch(spec)

        launcher.get = get  # type: ignore[method-assign]
        launcher.launch = launch  # type: ignore[method-assign]


@pytest.mark.parametrize("outage_from", ["confirm", "create"])
def test_the_relaunch_after_an_outage_goes_within_one_tick_of_vertex_answering(
        outage_from: str) -> None:
    """Finding: after Vertex came back the relaunch waited 122 s for a claim to expire.

    confirm: the preemption is known, then Vertex cannot confirm that attempt 1's job ended;
    create: Vertex confirms it, then refuses the creation (UNAVAILABLE)."""
    from spotorch.app.job_events import job_changed
    from spotorch.core.model import FailureClass
    from spotorch.core.moves import LAUNCH_LEASE_S

    deps = fake_deps(pipeline())
    launcher, clock = parts(deps)
    run = started(deps)
    job = launcher.job_of(run.run_id, 1)
    launcher.set_status(job, JobPhase.RUNNING, start_time=clock.t)
    tick(deps)
    preempted = launcher.set_status(job, JobPhase.FAILED, failure=FailureClass.PREEMPTED,
                                    message="The Spot VM was preempted.")
    outage = Outage(launcher)
    if outage_from == "create":
        original_get = launcher.get

        def confirmed(job_name: str) -> JobStatus:  # Vertex answers for attempt 1's job
            return preempted if job_name == job else original_get(job_name)

        launcher.get = confirmed  # type: ignore[method-assign]
    outage.down = True
    after = job_changed(deps, run.run_id, 1, preempted)  # a confirmed line, then the outage
    assert len(after.attempts) == 2 and launcher.created == 1 and outage.calls >= 1
    for _ in range(3):  # ticks during the outage: nothing launched, nothing broken
        clock.advance(5.0)
        tick(deps)
    assert launcher.created == 1
    outage.down = False  # Vertex answers again
    clock.advance(5.0)  # one tick period: far less than a claim (LAUNCH_LEASE_S)
    tick(deps)
    assert launcher.created == 2, "the relaunch waited for a claim to expire"
    assert clock.t - after.attempts[1].created_at < LAUNCH_LEASE_S
    relaunched = load(deps)
    assert relaunched.current is not None and relaunched.current.job_name is not None
    assert any(h.what == "launch of attempt 2 waits" or "failed, will retry" in h.what
               for h in relaunched.history)


def test_a_confirm_refused_by_a_spent_budget_is_taken_again_by_the_ticks_retry_pass() -> None:
    """Seen at 10,000 runs: a relaunch whose check of attempt 1's job was refused because the
    request budget was spent gave up its claim as merely "waiting", so the tick's quick retry
    pass (for refusals that the budget's refill lifts) tried it once and moved on to the next,
    each try waiting for the budget: one tick ran for as many tries as there were runs."""
    from spotorch.app.job_events import job_changed
    from spotorch.core.intents import LaunchIntent
    from spotorch.core.model import FailureClass
    from spotorch.core.observations import QUOTA_REFUSED
    from spotorch.ports.budget import spent

    deps = fake_deps(pipeline())
    launcher, clock = parts(deps)
    run = started(deps)
    job = launcher.job_of(run.run_id, 1)
    launcher.set_status(job, JobPhase.RUNNING, start_time=clock.t)
    tick(deps)
    preempted = launcher.set_status(job, JobPhase.FAILED, failure=FailureClass.PREEMPTED,
                                    message="The Spot VM was preempted.")
    real_get = launcher.get
    budget_spent = [True]

    def get(job_name: str) -> JobStatus:
        if budget_spent[0]:
            raise spent("us-central1", ["resource_management"], 13.0)
        return real_get(job_name)

    launcher.get = get  # type: ignore[method-assign]
    after = job_changed(deps, run.run_id, 1, preempted)
    assert len(after.attempts) == 2 and launcher.created == 1
    waiting = [i for i in load(deps).outbox if isinstance(i, LaunchIntent)]
    assert [i.deferred for i in waiting] == [QUOTA_REFUSED]
    assert waiting[0].claimed_until <= clock.t  # its claim given up: the next try takes it
    budget_spent[0] = False  # the budget refills
    clock.advance(5.0)
    tick(deps)
    assert launcher.created == 2


# --- hysteresis: the minimum dwell ------------------------------------------------------------------


def _flapping_pipeline() -> Pipeline:
    """A deadline run whose Spot attempts never get capacity while every probe finds it: the
    policy leaves a Spot queue for standard (little slack to wait with) and leaves standard
    whenever a probe says Spot is back (slack enough for a round trip)."""
    import dataclasses

    from spotorch.core.pipeline import SpotProbes

    base = pipeline(escalation=EscalationKind.DEADLINE, expected_compute_s=10 * 3600.0,
                    restart_overhead_s=600.0, decision_interval_s=300.0,
                    stockout_wait_s=10 * 3600.0, spot_cooldown_s=0.0,
                    spot_probes=SpotProbes(enabled=True, wait_s=600.0))
    return dataclasses.replace(base, deadline_s=12 * 3600.0)


def _changes(run: Run) -> list[float]:
    """When the run moved between capacities: launches of attempts on another capacity."""
    return [b.created_at for a, b in itertools.pairwise(run.attempts) if a.capacity != b.capacity]


def test_a_run_never_switches_capacity_within_the_minimum_dwell() -> None:
    """Finding: under load one run flapped Spot -> standard -> Spot 8 times in 58 s (4 switches,
    4 probes); each switch costs a restart. Now a move is never reversed within the policy's
    minimum dwell (policy.min_dwell_s: one restart overhead, at least one decision interval)."""
    from spotorch.core.pipeline import Capacity
    from spotorch.core.policy import PolicyView, min_dwell_s
    from spotorch.ports.jobs import LABEL_PROBE

    deps = fake_deps(_flapping_pipeline())
    launcher, clock = parts(deps)
    started(deps)
    t0 = clock.t
    while clock.t - t0 < 4 * 3600:
        for name, job in list(launcher.jobs.items()):
            probe = bool(job.spec.labels.get(LABEL_PROBE))
            if job.status.phase is JobPhase.QUEUED and (
                    probe or job.spec.capacity is Capacity.STANDARD):
                launcher.set_status(name, JobPhase.RUNNING, start_time=clock.t)
        clock.advance(30.0)
        tick(deps)
    run = load(deps)
    dwell = min_dwell_s(PolicyView(now_s=0, deadline_s=None, work_total_s=None, work_done_s=0,
                                   restart_overhead_s=600.0, current=None,
                                   spot_available=True, preemptions=0, tick_s=300.0))
    changes = _changes(run)
    assert dwell == 600.0 and len(changes) >= 4, changes  # it does switch, back and forth
    gaps = [b - a for a, b in itertools.pairwise(changes)]
    assert min(gaps) >= dwell, gaps
    assert len(changes) <= 4 * 3600 / dwell + 1


def test_the_deadline_forces_standard_through_the_dwell() -> None:
    from spotorch.core.pipeline import Capacity
    from spotorch.core.policy import PolicyView, may_switch

    view = PolicyView(now_s=3000.0, deadline_s=20_000.0, work_total_s=9_000.0, work_done_s=2000.0,
                      restart_overhead_s=600.0, current=Capacity.SPOT, spot_available=False,
                      preemptions=0, tick_s=300.0, changed_at_s=2900.0)
    assert not may_switch(view, Capacity.STANDARD)  # 100 s after the last move: not yet
    tight = PolicyView(**{**vars(view), "deadline_s": 10_700.0})  # slack 700 s
    assert may_switch(tight, Capacity.STANDARD)  # slack - overhead < tick: must run standard
    assert not may_switch(tight, Capacity.SPOT)
    assert may_switch(PolicyView(**{**vars(view), "now_s": 3500.0}), Capacity.SPOT)
    assert may_switch(PolicyView(**{**vars(view), "changed_at_s": None}), Capacity.SPOT)


def test_the_simulator_applies_the_same_dwell_in_the_production_view() -> None:
    """Both call policy.may_switch: in production's view no two moves are closer than the
    minimum dwell; without it (min_dwell=False: only to measure its cost) they are."""
    import dataclasses

    import numpy as np

    from spotorch.core.pipeline import Capacity
    from spotorch.core.policy import PolicyView, min_dwell_s
    from spotorch.sim.simulate import Probes, Scenario, View, Window, run_online

    def flapper(view: PolicyView) -> Capacity:  # the worst a policy could ask: always move
        return Capacity.STANDARD if view.current is Capacity.SPOT else Capacity.SPOT

    always = np.ones(600, dtype=bool)
    win = Window("t.json", "fam", 0.0, always, np.ones(len(always)), 3.0)
    sc = Scenario(task_s=36 * 3600, deadline_s=50 * 3600, overhead_s=900, step_s=300,
                  view=View.PRODUCTION, spot_cooldown_s=0.0, probes=Probes(latency_s=0.0))
    moves: dict[bool, list[float]] = {}
    outcomes = {}
    for dwell in (True, False):
        seen: list[PolicyView] = []

        def policy(view: PolicyView, seen: list[PolicyView] = seen) -> Capacity:
            seen.append(view)
            return flapper(view)
        outcomes[dwell] = run_online(win, dataclasses.replace(sc, min_dwell=dwell), policy)
        # The first 10 h: later the flapping has eaten the slack, and the deadline forces
        # standard through the dwell (test_the_deadline_forces_standard_through_the_dwell).
        moves[dwell] = sorted({v.changed_at_s for v in seen
                               if v.changed_at_s is not None and v.changed_at_s < 10 * 3600})
    limit = min_dwell_s(PolicyView(now_s=0, deadline_s=None, work_total_s=None, work_done_s=0,
                                   restart_overhead_s=900.0, current=None, spot_available=True,
                                   preemptions=0, tick_s=300.0))
    gaps_with = [b - a for a, b in itertools.pairwise(moves[True])]
    gaps_without = [b - a for a, b in itertools.pairwise(moves[False])]
    assert gaps_with and min(gaps_with) >= limit, gaps_with
    assert gaps_without and min(gaps_without) < limit, gaps_without
    assert outcomes[True].changeovers < outcomes[False].changeovers
