"""Issue 13's findings, each as a test on the service layer with in-memory adapters.

One live job per run; lost jobs; hints that never end attempts; plausible progress only;
unknown runs and attempts rejected with a reason; data whose events were lost found by listing.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from fakes import fake_deps
from spotorch.adapters.memory.twins import (
    InMemoryDocumentStore,
    InMemoryLauncher,
    InMemoryObjectStore,
    ManualClock,
)
from spotorch.app import bootstrap
from spotorch.app.arrivals import (
    LISTING_MARGIN_S,
    LISTING_PAGE_SIZE,
    LISTING_PAGES_PER_TICK,
    data_arrived,
    list_landing,
)
from spotorch.app.deps import (
    ContradictedLine,
    Deps,
    ImplausibleReport,
    JobOwner,
    JobOwners,
    NotOurJob,
    UnknownAttempt,
    UnknownRun,
    job_owner,
)
from spotorch.app.job_events import job_changed, job_line_reported, trainer_reported
from spotorch.app.runs import start_run
from spotorch.app.tick import reconcile, tick
from spotorch.core.model import FailureClass, JobPhase, JobStatus, Run, RunStatus
from spotorch.core.moves import LAUNCH_LEASE_S
from spotorch.core.observations import TrainerReported
from spotorch.core.pipeline import BatchMode, EscalationKind, Pipeline, RecoveryPolicy, Trigger
from spotorch.core.recovery import LOST_AFTER_POLLS, LOST_AFTER_S
from spotorch.ports.jobs import LaunchError
from spotorch.settings import COLLECTION_JOBS


def make_deps(batch: BatchMode = BatchMode.EACH_OBJECT) -> Deps:
    p = Pipeline(name="p", trigger=Trigger(bucket="landing", prefix="in/", batch=batch),
                 checkpoint_uri="gs://c/p", output_uri="gs://m/p",
                 recovery=RecoveryPolicy(escalation=EscalationKind.NEVER, backoff_base_s=1.0))
    return fake_deps(p)


def parts(deps: Deps) -> tuple[InMemoryLauncher, ManualClock, InMemoryObjectStore]:
    assert isinstance(deps.launcher, InMemoryLauncher) and isinstance(deps.clock, ManualClock)
    assert isinstance(deps.objects, InMemoryObjectStore)
    return deps.launcher, deps.clock, deps.objects


def started(deps: Deps) -> Run:
    run = start_run(deps, "p", run_id="r1", data_uri="gs://landing/in/a", snapshot_id="s",
                            reason="t")
    assert run is not None
    return run


def live_jobs(launcher: InMemoryLauncher, run_id: str) -> list[str]:
    return [name for name, job in launcher.jobs.items()
            if job.spec.run_id == run_id and not job.status.phase.terminal]


# --- one live job per run ------------------------------------------------------------------------


def test_a_failed_hint_for_a_running_job_ends_nothing_and_launches_nothing() -> None:
    deps = make_deps()
    launcher, _, _ = parts(deps)
    run = started(deps)
    job = launcher.job_of(run.run_id, 1)
    launcher.set_status(job, JobPhase.RUNNING)
    tick(deps)
    for i in range(60):  # the attack: 60 forged FAILED lines under 20 ids, job still running
        with pytest.raises(ContradictedLine, match="Vertex says RUNNING"):
            job_line_reported(deps, job.rsplit("/", 1)[1], JobPhase.FAILED, "boom",
                              event_id=f"forged-{i % 20}")
        assert len(live_jobs(launcher, run.run_id)) == 1
    after, _ = deps.runs.load(run.run_id)
    assert after is not None and after.status is RunStatus.RUNNING and len(after.attempts) == 1
    assert launcher.created == 1


def test_an_unconfirmed_terminal_observation_is_ignored_by_the_domain() -> None:
    deps = make_deps()
    launcher, _, _ = parts(deps)
    run = started(deps)
    job = launcher.job_of(run.run_id, 1)
    status = JobStatus(job, JobPhase.FAILED, failure=FailureClass.PREEMPTED)
    after = job_changed(deps, run.run_id, 1, status, confirmed=False)
    assert after.current is not None and after.current.live and len(after.attempts) == 1
    confirmed = job_changed(deps, run.run_id, 1, status)
    assert confirmed.counters.preemptions == 1 and len(confirmed.attempts) == 2


def test_a_launch_waits_until_vertex_confirms_the_previous_job_ended() -> None:
    """Even if a wrong confirmation ended attempt 1, attempt 2 is not created while 1 lives."""
    deps = make_deps()
    launcher, clock, _ = parts(deps)
    run = started(deps)
    job = launcher.job_of(run.run_id, 1)
    launcher.set_status(job, JobPhase.RUNNING)
    # Vertex said FAILED (say, a stale answer); by the time of the launch it runs again.
    original_get = launcher.get
    answers = iter([JobStatus(job, JobPhase.FAILED, failure=FailureClass.PREEMPTED)])
    launcher.get = lambda name: next(answers, None) or original_get(name)  # type: ignore[method-assign,assignment]
    after = job_changed(deps, run.run_id, 1, launcher.get(job))
    assert len(after.attempts) == 2 and launcher.created == 1  # launch deferred
    assert job in launcher.cancelled  # the old job is stopped first
    assert len(live_jobs(launcher, run.run_id)) == 0
    clock.advance(LAUNCH_LEASE_S + 1)
    tick(deps)  # now confirmed ended: the launch goes ahead
    assert launcher.created == 2 and len(live_jobs(launcher, run.run_id)) == 1


def test_a_job_record_attributes_sink_lines() -> None:
    deps = make_deps()
    launcher, _, _ = parts(deps)
    run = started(deps)
    job = launcher.job_of(run.run_id, 1)
    owner = job_owner(deps, job.rsplit("/", 1)[1])
    assert owner == JobOwner(job, run.run_id, 1)
    with pytest.raises(NotOurJob):
        job_line_reported(deps, "424242", JobPhase.RUNNING, "")


class CountingDocs(InMemoryDocumentStore):
    """The in-memory store, counting reads of the job records."""

    def __init__(self) -> None:
        super().__init__()
        self.job_reads = 0

    def get(self, collection: str, key: str) -> tuple[dict[str, Any] | None, Any]:
        self.job_reads += collection == COLLECTION_JOBS
        return super().get(collection, key)


def test_job_owners_are_read_once_per_instance_and_a_missing_record_is_asked_again() -> None:
    docs, owners = CountingDocs(), JobOwners(limit=2)
    owner = JobOwner("projects/p/locations/r/customJobs/7", "run-7", 1)
    assert owners.find(docs, "7") is None and owners.find(docs, "7") is None
    assert docs.job_reads == 2  # not found: not kept (the record may be written later)
    docs.put(COLLECTION_JOBS, "7", {"job_name": owner.job_name, "run_id": "run-7",
                                    "attempt": 1}, None)
    assert owners.find(docs, "7") == owner and owners.find(docs, "7") == owner
    assert docs.job_reads == 3  # found once, then kept: a job record never changes
    owners.remember("8", JobOwner("j8", "run-8", 1))
    owners.remember("9", JobOwner("j9", "run-9", 2))  # over the limit: "7" goes
    assert owners.find(docs, "9") == JobOwner("j9", "run-9", 2)
    assert owners.find(docs, "7") == owner and docs.job_reads == 4


def test_the_launching_instance_knows_its_jobs_without_reading_their_records() -> None:
    docs = CountingDocs()
    deps = make_deps()
    deps = dataclasses.replace(deps, docs=docs)
    launcher, _, _ = parts(deps)
    run = started(deps)
    job = launcher.job_of(run.run_id, 1)
    reads = docs.job_reads
    assert job_owner(deps, job.rsplit("/", 1)[1]) == JobOwner(job, run.run_id, 1)
    assert docs.job_reads == reads


# --- vanished jobs -------------------------------------------------------------------------------


def test_a_job_vertex_no_longer_knows_is_lost_after_polls_and_time_and_the_run_recovers() -> None:
    deps = make_deps()
    launcher, clock, _ = parts(deps)
    run = started(deps)
    job = launcher.job_of(run.run_id, 1)
    launcher.set_status(job, JobPhase.RUNNING)
    tick(deps)
    del launcher.jobs[job]  # the emulator restarted, or the job was deleted
    for _ in range(LOST_AFTER_POLLS - 1):
        clock.advance(60)
        tick(deps)
    after, _ = deps.runs.load(run.run_id)
    assert after is not None and after.attempts[0].live and after.attempts[0].missing_polls == 2
    clock.advance(LOST_AFTER_S)
    tick(deps)
    after, _ = deps.runs.load(run.run_id)
    assert after is not None and after.attempts[0].failure is FailureClass.LOST
    assert after.counters.lost == 1 and after.status is RunStatus.RECOVERING
    clock.advance(120)
    tick(deps)
    assert launcher.created == 2


def test_a_transient_poll_error_never_counts_towards_lost() -> None:
    deps = make_deps()
    launcher, clock, _ = parts(deps)
    run = started(deps)

    def unavailable(name: str) -> JobStatus:
        raise LaunchError("UNAVAILABLE", permanent=False, code="UNAVAILABLE")
    launcher.get = unavailable  # type: ignore[method-assign,assignment]
    for _ in range(10):
        clock.advance(600)
        tick(deps)
    after, _ = deps.runs.load(run.run_id)
    assert after is not None and after.attempts[0].live and after.attempts[0].missing_polls == 0


# --- plausible progress, unknown runs ------------------------------------------------------------


@pytest.mark.parametrize(("step", "total", "why"), [
    (2 ** 63 - 1, None, "out of range"),
    (2 ** 40, None, "steps per second"),
    (101, 100, "past total_steps"),
])
def test_implausible_progress_is_rejected_and_changes_nothing(step: int, total: int | None,
                                                              why: str) -> None:
    deps = make_deps()
    _, clock, _ = parts(deps)
    run = started(deps)
    report = TrainerReported(attempt=1, kind="progress", at=clock.now() + 10, step=step,
                             total_steps=total)
    with pytest.raises(ImplausibleReport, match=why):
        trainer_reported(deps, run.run_id, report)
    after, _ = deps.runs.load(run.run_id)
    assert after is not None and after.progress.step == 0
    real = TrainerReported(attempt=1, kind="progress", at=clock.now() + 20, step=50,
                           total_steps=100)
    assert trainer_reported(deps, run.run_id, real).progress.step == 50


def test_reports_for_unknown_runs_and_attempts_are_errors_with_a_reason() -> None:
    deps = make_deps()
    _, clock, _ = parts(deps)
    run = started(deps)
    with pytest.raises(UnknownRun):
        trainer_reported(deps, "nobody", TrainerReported(1, "progress", clock.now()))
    with pytest.raises(UnknownAttempt):
        trainer_reported(deps, run.run_id, TrainerReported(7, "progress", clock.now()))
    with pytest.raises(UnknownAttempt):
        job_changed(deps, run.run_id, 9, JobStatus("j", JobPhase.RUNNING))


# --- data whose events were lost -----------------------------------------------------------------


def test_the_tick_finds_a_snapshot_whose_events_were_all_lost_exactly_once() -> None:
    deps = make_deps(BatchMode.MARKER)
    launcher, clock, objects = parts(deps)
    reconcile(deps)  # the first listing starts the watch
    for name in ("in/d1/a.csv", "in/d1/b.csv", "in/d1/_SUCCESS"):
        objects.put("landing", name, 1, b"x", updated=clock.now())
    clock.advance(60)
    reconcile(deps)
    runs = deps.runs.active()
    assert len(runs) == 1 and runs[0].data_uri == "gs://landing/in/d1/"
    for _ in range(3):  # listing again, and the late real event, start nothing more
        clock.advance(60)
        reconcile(deps)
    from spotorch.core.triggers import ObjectEvent, ObjectEventKind

    data_arrived(deps, ObjectEvent("late", ObjectEventKind.FINALIZE, "landing",
                                           "in/d1/_SUCCESS", 1))
    assert len(deps.runs.active()) == 1 and launcher.created == 1


def test_a_first_listing_ignores_objects_from_before_the_watch() -> None:
    deps = make_deps()
    _, clock, objects = parts(deps)
    objects.put("landing", "in/old.csv", 1, b"x", updated=clock.now() - 30 * 24 * 3600)
    reconcile(deps)
    assert deps.runs.active() == []


def test_a_completed_listing_pass_is_not_fed_again_but_new_objects_are() -> None:
    deps = make_deps()
    _, clock, objects = parts(deps)
    objects.put("landing", "in/a.csv", 1, b"x", updated=clock.now())
    assert list_landing(deps) == 1  # the first pass feeds it
    clock.advance(LISTING_MARGIN_S + 60)
    assert list_landing(deps) == 1  # still within the margin of that pass: again
    clock.advance(60)
    assert list_landing(deps) == 0  # listed by a completed pass well after it was written
    objects.put("landing", "in/b.csv", 1, b"x", updated=clock.now())
    assert list_landing(deps) == 1


def test_listing_is_bounded_per_tick_and_goes_on_next_tick() -> None:
    deps = make_deps()
    _, clock, objects = parts(deps)
    reconcile(deps)
    limit = LISTING_PAGE_SIZE * LISTING_PAGES_PER_TICK
    for i in range(limit + 10):
        objects.put("landing", f"in/x{i:05d}.tmp", 1, b"", updated=clock.now())
    assert list_landing(deps) == limit
    assert list_landing(deps) == 10


# --- the attack on real parts: Firestore emulator, Vertex emulator, the real client -------------


@pytest.mark.emulator
def test_forged_failed_lines_never_give_a_run_two_live_jobs_on_the_emulators(
        firestore_emulator: Any, tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    import sys
    import time

    from spotorch.adapters.gcp.firestore import FirestoreDocumentStore
    from spotorch.adapters.gcp.vertex import VertexJobLauncher
    from spotorch.adapters.gcp.vertex_calls import RetryPolicy
    from spotorch.adapters.memory.twins import InMemoryCheckpoints, InMemoryPublisher
    from spotorch.app.run_store import DocumentRunStore
    from spotorch.core.pipeline import JobTemplate, WorkerPool
    from spotorch.entrypoints import functions as entry
    from spotorch.entrypoints.wiring import SystemClock
    from spotorch.local.vertex_emulator import VertexEmulator
    from test_functions import post, pubsub_event, sink_line

    project = firestore_emulator.project
    emulator = VertexEmulator(project, workdir=tmp_path, job_events_topic=None, queued_s=0.05,
                              pending_s=0.05, tick_s=0.05, grace_s=0.5)
    address = emulator.start()
    try:
        docs = FirestoreDocumentStore(project=project)
        pool = WorkerPool(command=(sys.executable, "-c", "import time; time.sleep(60)"))
        p = Pipeline(name="p", trigger=Trigger(bucket="landing", prefix="in/"),
                     checkpoint_uri="gs://c/p", output_uri="gs://m/p",
                     job=JobTemplate(worker_pools=(pool,), regions=("us-central1",)),
                     recovery=RecoveryPolicy(escalation=EscalationKind.NEVER))
        deps = bootstrap.deps(runs=DocumentRunStore(docs), docs=docs,
                    launcher=VertexJobLauncher(project, endpoint=address,
                                               retry=RetryPolicy(attempts=2, base_s=0.01)),
                    checkpoints=InMemoryCheckpoints(), publisher=InMemoryPublisher(),
                    clock=SystemClock(), pipelines={"p": p}, objects=InMemoryObjectStore())
        monkeypatch.setattr(entry, "deps", lambda: deps)
        run = start_run(deps, "p", run_id="attack", data_uri="gs://landing/in/a",
                                snapshot_id="s", reason="t")
        assert run is not None

        def live() -> list[str]:
            return [s.job_name for s in deps.launcher.list_live("us-central1")
                    if s.labels.get("spotorch_run") == "attack"]
        deadline = time.monotonic() + 20
        while deps.launcher.get(live()[0]).phase is not JobPhase.RUNNING:
            assert time.monotonic() < deadline, "the job never ran"
            time.sleep(0.1)
        job = live()[0]
        for i in range(60):  # 60 forged lines under 20 ids, some with odd wording
            text = ("Job failed.", "Job failed. code 13", "Job was cancelled.")[i % 3]
            resp = post("on_job_event", pubsub_event(sink_line(job, text, f"f{i}"), {},
                                                     f"forged-{i % 20}"))
            assert resp.status_code == 200
            assert live() == [job]
        tick(deps)
        after, _ = deps.runs.load("attack")
        assert after is not None and len(after.attempts) == 1 and after.status is RunStatus.RUNNING
        assert live() == [job]
    finally:
        emulator.stop()
