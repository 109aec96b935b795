"""Issue 27's findings, each as a test: trust nothing unproven (job-state lines, ids, endings,
claims, hysteresis). Trainer signatures and checkpoints: tests/test_trainer_auth.py."""

from __future__ import annotations

from typing import Any

import pytest

from fakes import PROJECT
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
