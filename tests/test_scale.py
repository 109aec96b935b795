"""Reconciling many runs: one listing per region instead of a call per job, a tick that fans out
by bucket, and trainer reports coalesced to Firestore's write rate (issue 17)."""

from __future__ import annotations

import json
import time

import pytest

from fakes import fake_deps
from spotorch.adapters.memory.twins import (
    InMemoryCheckpoints,
    InMemoryLauncher,
    InMemoryShardDispatcher,
    ManualClock,
)
from spotorch.app import tick as reconcile_tick
from spotorch.app.deps import Deps
from spotorch.app.job_events import trainer_reported
from spotorch.app.runs import start_run
from spotorch.app.tick import RECONCILE_SHARDS, reconcile, reconcile_shard, tick
from spotorch.core.model import FailureClass, JobPhase, RunStatus
from spotorch.core.observations import TrainerReported
from spotorch.core.pipeline import EscalationKind, JobTemplate, OnActiveRun, Pipeline, RecoveryPolicy, Trigger
from spotorch.ports.jobs import LaunchError


def make_deps(runs: int, regions: tuple[str, ...] = ("us-central1",)) -> Deps:
    p = Pipeline(name="p", trigger=Trigger(bucket="b", on_active_run=OnActiveRun.PARALLEL),
                 checkpoint_uri="gs://c/p", output_uri="gs://m/p",
                 job=JobTemplate(regions=regions),
                 recovery=RecoveryPolicy(escalation=EscalationKind.NEVER))
    deps = fake_deps(p)
    for i in range(runs):
        start_run(deps, "p", run_id=f"r{i:04d}", data_uri=f"gs://b/{i}", snapshot_id=None,
                          reason="t")
    return deps


def launcher_of(deps: Deps) -> InMemoryLauncher:
    assert isinstance(deps.launcher, InMemoryLauncher)
    return deps.launcher


def test_the_tick_lists_once_per_region_and_asks_nothing_of_listed_jobs() -> None:
    deps = make_deps(120)
    launcher = launcher_of(deps)
    for name in launcher.jobs:
        launcher.set_status(name, JobPhase.RUNNING)
    launcher.gets = 0
    touched = reconcile(deps)
    assert len(touched) == 120 and all(r.status is RunStatus.RUNNING for r in touched)
    assert launcher.listings == 1 and launcher.gets == 0


def test_a_job_missing_from_the_listing_is_asked_once() -> None:
    deps = make_deps(10)
    launcher = launcher_of(deps)
    ended = launcher.job_of("r0003", 1)
    launcher.set_status(ended, JobPhase.SUCCEEDED)
    launcher.gets = 0
    reconcile(deps)
    assert launcher.gets == 1
    run, _ = deps.runs.load("r0003")
    assert run is not None and run.status is RunStatus.SUCCEEDED


def test_a_failed_listing_falls_back_to_asking_each_job() -> None:
    deps = make_deps(5)
    launcher = launcher_of(deps)

    def broken(region: str):  # type: ignore[no-untyped-def]
        raise LaunchError("UNAVAILABLE", permanent=False, code="UNAVAILABLE")
        yield  # pragma: no cover
    launcher.list_live = broken  # type: ignore[method-assign]
    launcher.gets = 0
    assert len(reconcile(deps)) == 5 and launcher.gets == 5


def test_a_big_tick_fans_out_by_bucket_and_every_run_is_reconciled_once(
        monkeypatch: pytest.MonkeyPatch) -> None:
    deps = make_deps(200)
    dispatcher = InMemoryShardDispatcher()
    deps.shards = dispatcher
    launcher = launcher_of(deps)
    for name in launcher.jobs:
        launcher.set_status(name, JobPhase.RUNNING)
    monkeypatch.setattr(reconcile_tick, "FANOUT_AFTER_JOBS", 50)
    launcher.gets = 0
    assert reconcile(deps) == []  # the parent reconciles nothing itself
    assert len(dispatcher.shards) == RECONCILE_SHARDS
    assert sum(len(s["statuses"]) for s in dispatcher.shards) == 200
    assert all(len(json.dumps(s)) < 10 * 1024 * 1024 for s in dispatcher.shards)  # Pub/Sub limit
    touched = [r for s in dispatcher.shards for r in reconcile_shard(deps, s)]
    assert sorted(r.run_id for r in touched) == [f"r{i:04d}" for i in range(200)]
    assert all(r.status is RunStatus.RUNNING for r in touched)
    assert launcher.listings == 1 and launcher.gets == 0  # requests: pages per region, no gets


def test_progress_reports_closer_than_a_second_are_acknowledged_without_a_write() -> None:
    deps = make_deps(1)
    clock = deps.clock
    assert isinstance(clock, ManualClock)
    t = clock.now()
    trainer_reported(deps, "r0000", TrainerReported(1, "progress", t, step=10))
    _, version = deps.runs.load("r0000")
    trainer_reported(deps, "r0000", TrainerReported(1, "progress", t + 0.3, step=11))
    run, same = deps.runs.load("r0000")
    assert same == version and run is not None and run.progress.step == 10
    assert isinstance(deps.checkpoints, InMemoryCheckpoints)
    written = deps.checkpoints.put(run.checkpoint_uri, 11)
    trainer_reported(deps, "r0000", TrainerReported(1, "checkpoint", t + 0.4, step=11,
                                                    checkpoint_uri=written))
    run, _ = deps.runs.load("r0000")
    assert run is not None and run.latest_checkpoint is not None  # never coalesced away
    trainer_reported(deps, "r0000", TrainerReported(1, "progress", t + 1.5, step=12))
    run, _ = deps.runs.load("r0000")
    assert run is not None and run.progress.step == 12


def test_the_request_budget_waits_then_refuses_as_resource_exhausted() -> None:
    from spotorch.adapters.gcp.vertex_budgets import RequestBudget
    from spotorch.ports.budget import CRUD, SUBMIT

    now = [0.0]
    slept: list[float] = []

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        now[0] += seconds
    budget = RequestBudget({CRUD: 3.0, SUBMIT: 1.0}, max_wait_s=2.0, clock=lambda: now[0],
                           sleep=sleep)
    budget.take("r1", (CRUD, SUBMIT))
    budget.take("r2", (CRUD, SUBMIT))  # regions have budgets of their own
    budget.take("r1", (CRUD,))
    with pytest.raises(LaunchError) as err:  # a second submission this minute
        budget.take("r1", (CRUD, SUBMIT))
    assert err.value.code == "RESOURCE_EXHAUSTED" and not err.value.permanent
    now[0] = 59.0
    budget.take("r1", (CRUD,))  # the third call of the minute
    budget.take("r1", (CRUD,))  # waits for the first call to leave the window
    assert now[0] >= 60.0 and slept


def test_launches_the_budget_refuses_are_retried_by_the_same_tick(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A mass preemption asks for more submissions than the quota allows at once: the tick
    retries the refused launches as the budget refills, instead of leaving them a whole tick."""
    from spotorch.ports.jobs import LaunchError, LaunchSpec

    class PacedLauncher(InMemoryLauncher):
        """One submission per budget refill (each of the tick's pauses)."""

        tokens = 1

        def launch(self, spec: LaunchSpec) -> str:
            if self._find_locked(spec.run_id, spec.job_key) is None:
                if self.tokens <= 0:
                    raise LaunchError("request budget for create in us-central1 is spent",
                                      permanent=False, code="RESOURCE_EXHAUSTED")
                self.tokens -= 1
            return super().launch(spec)

    launcher = PacedLauncher()
    pauses: list[float] = []

    def refill(seconds: float) -> None:
        pauses.append(seconds)
        launcher.tokens += 1

    monkeypatch.setattr(time, "sleep", refill)  # the tick waits for the budget to refill
    deps = make_deps(0)
    deps.launcher = launcher
    launcher.tokens = 100
    for i in range(4):
        assert start_run(deps, "p", run_id=f"r{i}", data_uri="gs://b/d/",
                                 snapshot_id=f"s{i}", reason="t") is not None
    for name in list(launcher.jobs):
        launcher.set_status(name, JobPhase.FAILED, failure=FailureClass.PREEMPTED)
    launcher.tokens = 1
    tick(deps)
    runs = [deps.runs.load(f"r{i}")[0] for i in range(4)]
    assert all(r is not None and len(r.attempts) == 2 and r.attempts[1].job_name for r in runs)
    assert len(pauses) == 3  # one launch went at once, three after a refill each
