"""The Cloud Functions through functions-framework's test client, with real CloudEvents."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from cloudevents.conversion import to_structured
from cloudevents.http import CloudEvent

from fakes import fake_deps
from spotorch.adapters.memory.twins import (
    InMemoryCheckpoints,
    InMemoryDocumentStore,
    InMemoryLauncher,
    InMemoryObjectStore,
)
from spotorch.app.deps import Deps
from spotorch.core.model import FailureClass, JobPhase, RunStatus
from spotorch.core.pipeline import BatchMode, EscalationKind, Pipeline, RecoveryPolicy, Trigger
from spotorch.entrypoints import functions as entry

MAIN = str(Path(__file__).resolve().parent.parent / "functions" / "main.py")


@pytest.fixture
def deps(monkeypatch: pytest.MonkeyPatch) -> Iterator[Deps]:
    pipeline = Pipeline(name="demo", trigger=Trigger(bucket="landing", prefix="datasets/",
                                                     batch=BatchMode.EACH_OBJECT),
                        checkpoint_uri="gs://ckpt/demo", output_uri="gs://models/demo",
                        recovery=RecoveryPolicy(escalation=EscalationKind.NEVER))
    fake = fake_deps(pipeline)
    monkeypatch.setattr(entry, "deps", lambda: fake)
    yield fake


def client(target: str) -> Any:
    import functions_framework

    return functions_framework.create_app(target, MAIN, "cloudevent").test_client()


def post(target: str, event: CloudEvent) -> Any:
    headers, body = to_structured(event)
    return client(target).post("/", headers=headers, data=body)


def storage_event(name: str, generation: int = 1, event_id: str = "e1") -> CloudEvent:
    return CloudEvent({"type": "google.cloud.storage.object.v1.finalized", "id": event_id,
                       "source": "//storage.googleapis.com/projects/_/buckets/landing",
                       "subject": f"objects/{name}"},
                      {"bucket": "landing", "name": name, "generation": str(generation),
                       "metageneration": "1", "size": "10", "contentType": "text/csv",
                       "timeCreated": "2026-11-29T10:00:00.000Z",
                       "updated": "2026-11-29T10:00:00.000Z"})


def pubsub_event(payload: bytes, attributes: dict[str, str], event_id: str = "m1") -> CloudEvent:
    return CloudEvent({"type": "google.cloud.pubsub.topic.v1.messagePublished", "id": event_id,
                       "source": "//pubsub.googleapis.com/projects/p/topics/t"},
                      {"message": {"data": base64.b64encode(payload).decode(),
                                   "attributes": attributes, "messageId": event_id,
                                   "publishTime": "2026-11-29T10:00:00.000Z"},
                       "subscription": "projects/p/subscriptions/s"})


def sink_line(job_name: str, text: str, insert_id: str = "i1") -> bytes:
    """A job's service line as a Cloud Logging sink exports it: the job id and text, no labels."""
    project, job_id = job_name.split("/")[1], job_name.rsplit("/", 1)[1]
    return json.dumps({
        "logName": f"projects/{project}/logs/ml.googleapis.com%2F{job_id}",
        "resource": {"type": "ml_job", "labels": {"job_id": job_id, "project_id": "spotorch-test",
                                                  "task_name": "service"}},
        "textPayload": text, "timestamp": "2026-11-29T10:01:00Z", "severity": "INFO",
        "insertId": insert_id}).encode()


def signed(deps: Deps, report: dict[str, Any]) -> tuple[bytes, dict[str, str]]:
    """A trainer report as spotorch_trainer publishes it: signed with its attempt's key."""
    from spotorch_trainer import contract

    run, _ = deps.runs.load(str(report["run_id"]))
    assert run is not None
    attempt = run.attempt(int(report["attempt"]))
    assert attempt is not None and attempt.report_key
    body = json.dumps(report).encode()
    return body, {"spotorch_source": "trainer", "attempt": str(report["attempt"]),
                  contract.ATTR_SIGNATURE: contract.sign_report(attempt.report_key, body)}


def landed(deps: Deps, name: str, generation: int = 1) -> None:
    """The object really exists (an event for one that does not is rejected)."""
    assert isinstance(deps.objects, InMemoryObjectStore)
    deps.objects.put("landing", name, generation, b"x,y\n")


def test_an_upload_starts_exactly_one_run_even_when_redelivered(deps: Deps) -> None:
    landed(deps, "datasets/a.csv")
    for _ in range(3):
        assert post("on_object_finalized", storage_event("datasets/a.csv")).status_code == 200
    runs = deps.runs.active()
    assert len(runs) == 1 and runs[0].status is RunStatus.STARTING
    assert isinstance(deps.launcher, InMemoryLauncher) and deps.launcher.created == 1


def test_job_events_and_trainer_reports_drive_the_run(deps: Deps) -> None:
    landed(deps, "datasets/a.csv")
    post("on_object_finalized", storage_event("datasets/a.csv"))
    run = deps.runs.active()[0]
    assert isinstance(deps.launcher, InMemoryLauncher)
    job = deps.launcher.job_of(run.run_id, 1)
    assert isinstance(deps.checkpoints, InMemoryCheckpoints)
    report = {"event_id": f"{run.run_id}/1/checkpoint/20", "kind": "checkpoint",
              "run_id": run.run_id, "attempt": 1, "step": 20, "total_steps": 100,
              "checkpoint_uri": deps.checkpoints.put(run.checkpoint_uri, 20),
              "time": "2026-11-29T10:00:05Z"}
    resp = post("on_job_event", pubsub_event(*signed(deps, report), "m2"))
    assert resp.status_code == 200
    assert isinstance(deps.launcher, InMemoryLauncher)
    deps.launcher.set_status(job, JobPhase.FAILED, failure=FailureClass.PREEMPTED,
                             message="The Spot VM was preempted.")
    data = sink_line(job, "Job failed. The Spot VM was preempted.")
    assert post("on_job_event", pubsub_event(data, {}, "m3")).status_code == 200
    after, _ = deps.runs.load(run.run_id)
    assert after is not None and after.counters.preemptions == 1
    assert after.attempts[1].resumed_from_step == 20


@pytest.mark.parametrize(("target", "event"), [
    ("on_object_finalized", CloudEvent({"type": "google.cloud.storage.object.v1.finalized",
                                        "id": "bad1", "source": "//x"}, {"bucket": "landing"})),
    ("on_job_event", CloudEvent({"type": "google.cloud.pubsub.topic.v1.messagePublished",
                                 "id": "bad2", "source": "//x"}, {"nothing": "here"})),
    ("on_job_event", pubsub_event(b"{not json", {"spotorch_source": "trainer"}, "bad3")),
])
def test_malformed_events_are_acknowledged_and_recorded(deps: Deps, target: str,
                                                        event: CloudEvent) -> None:
    resp = post(target, event)
    assert resp.status_code == 200  # acknowledged: never redelivered forever
    record, _ = deps.docs.get("rejected_events", event["id"])
    assert record is not None and record["reason"]
    assert deps.runs.active() == []


def test_the_tick_reconciles(deps: Deps) -> None:
    landed(deps, "datasets/a.csv")
    post("on_object_finalized", storage_event("datasets/a.csv"))
    run = deps.runs.active()[0]
    assert isinstance(deps.launcher, InMemoryLauncher)
    deps.launcher.set_status(deps.launcher.job_of(run.run_id, 1), JobPhase.SUCCEEDED)
    assert post("on_tick", pubsub_event(b'{"time": "now"}', {}, "t1")).status_code == 200
    done, _ = deps.runs.load(run.run_id)
    assert done is not None and done.status is RunStatus.SUCCEEDED


def test_a_log_sink_entry_without_run_labels_is_attributed_through_the_job(deps: Deps) -> None:
    landed(deps, "datasets/a.csv")
    post("on_object_finalized", storage_event("datasets/a.csv"))
    run = deps.runs.active()[0]
    assert isinstance(deps.launcher, InMemoryLauncher)
    job = deps.launcher.job_of(run.run_id, 1)
    deps.launcher.set_status(job, JobPhase.RUNNING)  # what Vertex answers when asked
    assert post("on_job_event", pubsub_event(sink_line(job, "Job is running."), {},
                                             "m8")).status_code == 200
    running, _ = deps.runs.load(run.run_id)
    assert running is not None and running.status is RunStatus.RUNNING
    deps.launcher.set_status(job, JobPhase.SUCCEEDED)
    assert post("on_job_event", pubsub_event(sink_line(job, "Job completed successfully."), {},
                                             "m9")).status_code == 200
    done, _ = deps.runs.load(run.run_id)
    assert done is not None and done.status is RunStatus.SUCCEEDED


def test_a_terminal_line_is_a_hint_that_vertex_must_confirm(deps: Deps) -> None:
    """A forged or early "Job failed." while Vertex says RUNNING ends nothing, launches nothing."""
    landed(deps, "datasets/a.csv")
    post("on_object_finalized", storage_event("datasets/a.csv"))
    run = deps.runs.active()[0]
    assert isinstance(deps.launcher, InMemoryLauncher)
    job = deps.launcher.job_of(run.run_id, 1)
    deps.launcher.set_status(job, JobPhase.RUNNING)
    for i in range(20):
        resp = post("on_job_event", pubsub_event(sink_line(job, "Job failed. boom", f"x{i}"), {},
                                                 f"forged-{i}"))
        assert resp.status_code == 200
    after, _ = deps.runs.load(run.run_id)
    assert after is not None and len(after.attempts) == 1 and after.attempts[0].live
    assert deps.launcher.created == 1


def test_lines_of_another_teams_jobs_are_quiet(deps: Deps, caplog: pytest.LogCaptureFixture,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """Another team's Vertex job in the same project: acknowledged and counted, with a debug
    line; no warning, no write (one info line at the first and every NOT_OURS_EVERY-th)."""
    monkeypatch.setattr(entry, "not_ours_seen", 0)
    monkeypatch.setattr(entry, "NOT_OURS_EVERY", 3)
    caplog.set_level("DEBUG", logger="spotorch")
    assert isinstance(deps.docs, InMemoryDocumentStore)
    before = dict(deps.docs._docs)
    for i in range(4):
        data = sink_line("projects/p/locations/us-central1/customJobs/999", "Job is running.",
                         f"i{i}")
        assert post("on_job_event", pubsub_event(data, {}, f"stranger-{i}")).status_code == 200
    assert deps.docs.get("rejected_events", "stranger-0")[0] is None
    assert dict(deps.docs._docs) == before  # no write at all
    assert entry.not_ours_seen == 4
    mine = [r for r in caplog.records if getattr(r, "job_id", None) == "999"]
    assert [r.levelname for r in mine] == ["INFO", "DEBUG", "DEBUG", "INFO"]
    assert not [r for r in caplog.records if r.levelname == "WARNING"]


def test_an_event_for_an_object_that_does_not_exist_starts_nothing(deps: Deps) -> None:
    resp = post("on_object_finalized", storage_event("datasets/ghost.csv", 77, "ghost"))
    assert resp.status_code == 200
    record, _ = deps.docs.get("rejected_events", "ghost")
    assert record is not None and "does not exist" in record["reason"]
    assert deps.runs.active() == [] and isinstance(deps.launcher, InMemoryLauncher) \
        and deps.launcher.created == 0


def test_a_transient_failure_is_redelivered_and_its_reason_kept_for_dead_letters(
        deps: Deps, monkeypatch: pytest.MonkeyPatch) -> None:
    from google.api_core import exceptions as gexc

    from spotorch.app import job_events
    from spotorch.core.ids import message_key

    def unavailable(*args: Any, **kwargs: Any) -> Any:
        raise gexc.ServiceUnavailable("firestore is down")
    monkeypatch.setattr(job_events, "trainer_message", unavailable)
    body = json.dumps({"kind": "progress", "run_id": "demo-x", "attempt": 1, "step": 1}).encode()
    attributes = {"spotorch_source": "trainer"}
    resp = post("on_job_event", pubsub_event(body, attributes, "flaky"))
    assert resp.status_code == 500  # Pub/Sub redelivers; after max attempts it dead-letters
    record, _ = deps.docs.get("delivery_failures", message_key(body, attributes))
    assert record is not None and "firestore is down" in record["reason"]
    # a timestamp for the TTL policy (deploy/firestore.tf), past the dead-letter hold's 7 days
    assert isinstance(record["expires_at"], datetime)
    assert record["expires_at"].timestamp() - record["at"] >= 8 * 24 * 3600
    assert deps.docs.get("rejected_events", "flaky")[0] is None


def test_an_object_that_matches_no_pipeline_is_logged_with_the_rule_it_missed(
        deps: Deps, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("INFO", logger="spotorch")
    landed(deps, "elsewhere/a.csv")
    assert post("on_object_finalized", storage_event("elsewhere/a.csv")).status_code == 200
    lines = [r.getMessage() for r in caplog.records if "matches no pipeline" in r.getMessage()]
    assert lines and "demo: outside the trigger prefix" in lines[0]
    assert deps.runs.active() == []
