"""The service layer with in-memory adapters: end state after events, crashes, duplicates and races."""

from __future__ import annotations

import threading
from dataclasses import replace

import pytest

from fakes import fake_deps
from spotorch.adapters.memory.twins import (
    InMemoryCheckpoints,
    InMemoryDocumentStore,
    InMemoryLauncher,
    InMemoryPublisher,
    ManualClock,
)
from spotorch.app.deps import Deps, NotRetryable
from spotorch.app.job_events import job_changed
from spotorch.app.runs import cancel_run, retry_run, start_run
from spotorch.app.tick import tick
from spotorch.app.unit_of_work import apply
from spotorch.core.decide import new_run
from spotorch.core.intents import LaunchIntent
from spotorch.core.model import Checkpoint, FailureClass, JobPhase, Run, RunStatus
from spotorch.core.moves import LAUNCH_LEASE_S
from spotorch.core.pipeline import Capacity, EscalationKind, OnActiveRun, Pipeline, RecoveryPolicy, Trigger
from spotorch.ports.jobs import LaunchError


def make_deps(on_active: OnActiveRun = OnActiveRun.QUEUE, **recovery: object) -> Deps:
    p = Pipeline(name="p", trigger=Trigger(bucket="b", on_active_run=on_active),
                 checkpoint_uri="gs://c/p", output_uri="gs://m/p",
                 recovery=RecoveryPolicy(**{"escalation": EscalationKind.NEVER,  # type: ignore[arg-type]
                                            "backoff_base_s": 1.0, **recovery}))
    return fake_deps(p, events_topic="projects/x/topics/t")


def fakes(deps: Deps) -> tuple[InMemoryLauncher, InMemoryPublisher, ManualClock]:
    assert isinstance(deps.launcher, InMemoryLauncher)
    assert isinstance(deps.publisher, InMemoryPublisher)
    assert isinstance(deps.clock, ManualClock)
    return deps.launcher, deps.publisher, deps.clock


def start(deps: Deps, run_id: str = "r1") -> Run:
    run = start_run(deps, "p", run_id=run_id, data_uri="gs://b/d/", snapshot_id="s", reason="t")
    assert run is not None
    return run


def short_types(publisher: InMemoryPublisher) -> list[str]:
    from spotorch.core.events import kind_of

    return [kind_of(t) for t in publisher.types()]


def test_a_run_launches_one_job_with_the_trainer_env_and_publishes() -> None:
    deps = make_deps()
    launcher, publisher, _ = fakes(deps)
    run = start(deps)
    assert launcher.created == 1
    job = next(iter(launcher.jobs.values()))
    assert job.spec.env["SPOTORCH_RUN_ID"] == "r1"
    assert job.spec.env["SPOTORCH_CHECKPOINT_URI"] == "gs://c/p/r1"
    assert job.spec.labels["spotorch_attempt"] == "1"
    assert short_types(publisher) == ["run.created", "attempt.launched"]
    assert run.outbox == () and run.attempts[0].job_name == job.status.job_name
    assert start(deps).run_id == "r1" and launcher.created == 1


def test_preemption_relaunches_from_the_checkpoint_and_succeeds() -> None:
    deps = make_deps()
    launcher, publisher, clock = fakes(deps)
    start(deps)
    job1 = launcher.job_of("r1", 1)
    job_changed(deps, "r1", 1, launcher.set_status(job1, JobPhase.RUNNING))
    assert isinstance(deps.checkpoints, InMemoryCheckpoints)
    deps.checkpoints.latest_by_uri["gs://c/p/r1"] = Checkpoint(30, "gs://c/p/r1/step-0000000030")
    clock.advance(60)
    run = job_changed(deps, "r1", 1, launcher.set_status(job1, JobPhase.FAILED,
                                                        failure=FailureClass.PREEMPTED))
    assert run is not None and run.status is RunStatus.STARTING
    assert launcher.created == 2
    spec2 = launcher.jobs[launcher.job_of("r1", 2)].spec
    assert spec2.env["SPOTORCH_RESUME_STEP"] == "30"
    job2 = launcher.job_of("r1", 2)
    run = job_changed(deps, "r1", 2, launcher.set_status(job2, JobPhase.SUCCEEDED))
    assert run is not None and run.status is RunStatus.SUCCEEDED
    assert short_types(publisher) == ["run.created", "attempt.launched", "attempt.preempted",
                                      "attempt.launched", "attempt.ended", "run.succeeded"]
    ids = [e["id"] for e in publisher.events]
    assert len(set(ids)) == len(ids)


def test_lost_job_events_are_repaired_by_the_tick() -> None:
    deps = make_deps()
    launcher, _, clock = fakes(deps)
    start(deps)
    launcher.set_status(launcher.job_of("r1", 1), JobPhase.SUCCEEDED)  # no event arrives
    clock.advance(300)
    tick(deps)
    run, _ = deps.runs.load("r1")
    assert run is not None and run.status is RunStatus.SUCCEEDED


def test_a_publish_that_fails_is_retried_by_the_tick_with_the_same_event_id() -> None:
    deps = make_deps()
    _, publisher, clock = fakes(deps)
    publisher.fail_next = 1
    start(deps)
    run, _ = deps.runs.load("r1")
    assert run is not None and [i.kind for i in run.outbox] == ["publish"]
    # The executor that failed gave its claim up: the next tick publishes it (issue 27: not
    # after the claim would have expired).
    clock.advance(1.0)
    tick(deps)
    assert sorted(short_types(publisher)) == ["attempt.launched", "run.created"]
    assert [e["id"] for e in publisher.events if e["type"].endswith("run.created.v1")] == ["r1:1"]


def test_a_crash_after_deciding_a_launch_is_finished_by_the_tick_once() -> None:
    deps = make_deps()
    launcher, _, clock = fakes(deps)
    p = deps.pipelines["p"]
    run = new_run(run_id="r1", pipeline=p, now=clock.now(), data_uri="d", snapshot_id=None)
    deps.runs.save(run, None)  # decided and committed, then the function died
    tick(deps)
    assert launcher.created == 0  # the dead executor's claim is still valid
    clock.advance(LAUNCH_LEASE_S + 1)
    tick(deps)
    tick(deps)
    assert launcher.created == 1
    run2, _ = deps.runs.load("r1")
    assert run2 is not None and run2.attempts[0].job_name is not None and run2.outbox == ()


def test_a_job_created_but_never_recorded_is_adopted() -> None:
    deps = make_deps()
    launcher, _, clock = fakes(deps)
    p = deps.pipelines["p"]
    run = new_run(run_id="r1", pipeline=p, now=clock.now(), data_uri="d", snapshot_id=None)
    deps.runs.save(run, None)
    intent = run.outbox[-1]
    assert isinstance(intent, LaunchIntent)
    from spotorch.app.launch_specs import launch_spec

    launcher.launch(launch_spec(deps, run, intent))  # created, then the function died
    clock.advance(LAUNCH_LEASE_S + 1)
    tick(deps)
    assert launcher.created == 1
    run2, _ = deps.runs.load("r1")
    assert run2 is not None and run2.attempts[0].job_name == launcher.job_of("r1", 1)


def test_permanent_launch_error_fails_the_run_with_the_reason() -> None:
    deps = make_deps()
    launcher, publisher, _ = fakes(deps)
    launcher.fail_launch = LaunchError("PERMISSION_DENIED: no access", permanent=True)
    run = start(deps)
    assert run.status is RunStatus.FAILED_LAUNCH
    assert "PERMISSION_DENIED" in (run.end_reason or "")
    assert short_types(publisher)[-1] == "run.failed"


def test_duplicated_events_in_threads_launch_nothing_extra() -> None:
    deps = make_deps()
    launcher, _, _ = fakes(deps)
    start(deps)
    job1 = launcher.job_of("r1", 1)
    preempted = launcher.set_status(job1, JobPhase.FAILED, failure=FailureClass.PREEMPTED)

    def deliver(n: int) -> None:
        for i in range(n):
            job_changed(deps, "r1", 1, preempted, event_id=f"evt-{i % 7}")

    threads = [threading.Thread(target=deliver, args=(50,)) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert launcher.created == 2
    run, _ = deps.runs.load("r1")
    assert run is not None and run.counters.preemptions == 1 and len(run.attempts) == 2


def test_a_redelivered_event_costs_one_read_and_no_write() -> None:
    deps = make_deps()
    launcher, _, _ = fakes(deps)
    start(deps)
    status = launcher.set_status(launcher.job_of("r1", 1), JobPhase.RUNNING)
    job_changed(deps, "r1", 1, status, event_id="e1")
    assert isinstance(deps.docs, InMemoryDocumentStore)
    before = deps.docs.round_trips
    job_changed(deps, "r1", 1, status, event_id="e1")
    assert deps.docs.round_trips - before == 1


def test_cancel_stops_the_job_and_retry_resumes_from_the_checkpoint() -> None:
    deps = make_deps()
    launcher, _, _ = fakes(deps)
    start(deps)
    job1 = launcher.job_of("r1", 1)
    run = cancel_run(deps, "r1", "wrong data")
    assert run.status is RunStatus.CANCELLING and launcher.cancelled == [job1]
    run2 = job_changed(deps, "r1", 1, launcher.get(job1))
    assert run2 is not None and run2.status is RunStatus.CANCELLED
    assert isinstance(deps.checkpoints, InMemoryCheckpoints)
    deps.checkpoints.latest_by_uri["gs://c/p/r1"] = Checkpoint(12, "gs://c/p/r1/step-12")
    retried = retry_run(deps, "r1")
    assert retried.run_id == "r1-retry-1" and retried.attempts[0].resumed_from_step == 12
    assert retried.checkpoint_uri == "gs://c/p/r1"
    assert launcher.jobs[launcher.job_of("r1-retry-1", 1)].spec.env["SPOTORCH_RESUME_FROM"] \
        == "gs://c/p/r1/step-12"
    with pytest.raises(NotRetryable):
        retry_run(deps, "r1-retry-1")


@pytest.mark.parametrize(("rule", "second_status", "first_status"), [
    (OnActiveRun.QUEUE, RunStatus.QUEUED, RunStatus.STARTING),
    (OnActiveRun.SUPERSEDE, RunStatus.STARTING, RunStatus.CANCELLING),
    (OnActiveRun.SKIP, None, RunStatus.STARTING),
])
def test_a_new_snapshot_while_a_run_is_active(rule: OnActiveRun, second_status: RunStatus | None,
                                              first_status: RunStatus) -> None:
    deps = make_deps(on_active=rule)
    launcher, _, _ = fakes(deps)
    start(deps, "r1")
    second = start_run(deps, "p", run_id="r2", data_uri="gs://b/e/", snapshot_id="s2", reason="t")
    assert (second.status if second else None) == second_status
    first, _ = deps.runs.load("r1")
    assert first is not None and first.status is first_status
    if rule is OnActiveRun.QUEUE:
        job_changed(deps, "r1", 1, launcher.set_status(launcher.job_of("r1", 1),
                                                       JobPhase.SUCCEEDED))
        r2, _ = deps.runs.load("r2")
        assert r2 is not None and r2.status is RunStatus.STARTING and launcher.created == 2


def test_stockout_wait_then_next_region_through_the_tick() -> None:
    deps = make_deps(stockout_wait_s=100.0)
    deps.pipelines = {"p": replace(deps.pipelines["p"], job=replace(
        deps.pipelines["p"].job, regions=("us-central1", "us-east1")))}
    launcher, _, clock = fakes(deps)
    start(deps)
    clock.advance(101)
    tick(deps)  # queued too long: cancel
    job_changed(deps, "r1", 1, launcher.get(launcher.job_of("r1", 1)))
    clock.advance(10)
    tick(deps)  # backoff elapsed: relaunch elsewhere
    run, _ = deps.runs.load("r1")
    assert run is not None and run.counters.stockouts == 1
    assert [a.region for a in run.attempts] == ["us-central1", "us-east1"]
    assert run.attempts[1].capacity is Capacity.SPOT


def test_apply_on_unknown_run_returns_none() -> None:
    assert apply(make_deps(), "nope", []) is None
