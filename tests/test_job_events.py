"""Job-state Pub/Sub messages: the emulator's LogEntry round trip, log-sink entries, bad ones."""

from __future__ import annotations

import json
from typing import Any

import pytest

from spotorch.domain import FailureClass, JobPhase
from spotorch.errors import InvalidEvent
from spotorch.job_events import (
    ATTR_LOG_TIMESTAMP,
    NotAJobStateChange,
    UnattributedJobUpdate,
    build_log_entry,
    encode,
    message_attributes,
    parse_job_message,
    parse_rfc3339,
)
from spotorch.pipeline import RecoveryPolicy
from spotorch.ports import LABEL_ATTEMPT, LABEL_RUN
from spotorch.vertex import Classifier, JobState
from spotorch_trainer.contract import ATTR_SOURCE, SOURCE_JOB

JOB = "projects/spotorch-test/locations/us-central1/customJobs/1234567890"
T0 = 1_800_000_000.0


def entry(state: JobState = JobState.FAILED, *, previous: JobState | None = JobState.RUNNING,
          code: int = 8, message: str = "Job failed due to STOCKOUT: preempted",
          start: float | None = T0 + 5, labels: dict[str, str] | None = None) -> dict[str, Any]:
    return build_log_entry(
        job_name=JOB, state=state, previous_state=previous, display_name="demo attempt 2",
        labels={LABEL_RUN: "demo-r1", LABEL_ATTEMPT: "2", "team": "ml"} if labels is None
        else labels,
        error_code=code, error_message=message, create_time=T0, start_time=start,
        end_time=T0 + 60 if state in (JobState.FAILED, JobState.SUCCEEDED) else None,
        update_time=T0 + 60.25, insert_id="1234567890-3")


def test_emulator_entries_round_trip() -> None:
    e = entry()
    attributes = message_attributes(e)
    assert attributes[ATTR_SOURCE] == SOURCE_JOB
    assert (attributes["run_id"], attributes["attempt"]) == ("demo-r1", "2")
    assert attributes["state"] == "JOB_STATE_FAILED" and attributes["job_name"] == JOB
    update = parse_job_message(encode(e), attributes, Classifier.default())
    assert (update.run_id, update.attempt, update.job_id) == ("demo-r1", 2, "1234567890")
    assert update.observed_at == pytest.approx(T0 + 60.25)
    status = update.status
    assert (status.job_name, status.phase, status.failure) == \
        (JOB, JobPhase.FAILED, FailureClass.PREEMPTED)
    assert status.message == "Job failed due to STOCKOUT: preempted"
    assert status.labels["team"] == "ml"
    assert (status.create_time, status.start_time, status.end_time) == \
        pytest.approx((T0, T0 + 5, T0 + 60))


def test_the_entry_looks_like_a_cloud_logging_entry() -> None:
    e = entry()
    assert e["resource"] == {"type": "ml_job", "labels": {
        "job_id": "1234567890", "project_id": "spotorch-test", "task_name": "service"}}
    assert e["severity"] == "ERROR" and e["logName"].startswith("projects/spotorch-test/logs/")
    payload = e["jsonPayload"]
    assert payload["state"] == "JOB_STATE_FAILED" and payload["previousState"] == \
        "JOB_STATE_RUNNING"
    assert payload["error"] == {"code": 8, "message": "Job failed due to STOCKOUT: preempted"}
    assert payload["message"].startswith("Job failed.")
    assert json.loads(encode(e)) == e


def test_a_job_that_never_started_is_a_stockout_not_a_preemption() -> None:
    e = entry(message="Job failed due to STOCKOUT.", start=None)
    update = parse_job_message(encode(e), message_attributes(e))
    assert update.status.failure is FailureClass.STOCKOUT


def test_the_callers_classifier_is_used() -> None:
    classifier = Classifier.from_policy(RecoveryPolicy(preemption_patterns=("(?i)reclaimed",)))
    e = entry(code=0, message="VM reclaimed")
    assert parse_job_message(encode(e), message_attributes(e),
                             classifier).status.failure is FailureClass.PREEMPTED
    assert parse_job_message(encode(e), message_attributes(e)).status.failure is \
        FailureClass.INFRA


def test_run_and_attempt_fall_back_to_the_job_labels() -> None:
    e = entry(JobState.RUNNING, code=0, message="")
    update = parse_job_message(encode(e), {})
    assert (update.run_id, update.attempt, update.status.phase) == ("demo-r1", 2, JobPhase.RUNNING)
    assert update.status.failure is None and update.status.message == ""


def sink_entry(text: str, **extra: Any) -> dict[str, Any]:
    """What we expect a log sink on resource.type="ml_job" to publish (unverified)."""
    return {"logName": "projects/spotorch-prod/logs/ml.googleapis.com%2F1234567890",
            "resource": {"type": "ml_job", "labels": {"job_id": "1234567890",
                                                      "project_id": "spotorch-prod",
                                                      "task_name": "service"}},
            "timestamp": "2027-01-15T08:00:00.123456789Z", "severity": "INFO",
            "textPayload": text, **extra}


@pytest.mark.parametrize(("text", "phase", "failure", "exit_code"), [
    ("Job is running.", JobPhase.RUNNING, None, None),
    ("Waiting for job to be provisioned.", JobPhase.PENDING, None, None),
    ("Job completed successfully.", JobPhase.SUCCEEDED, None, None),
    ("Job failed. The replica workerpool0-0 exited with a non-zero status of 1. Termination "
     "reason: Error.", JobPhase.FAILED, FailureClass.USER_ERROR, 1),
    ("Job was cancelled.", JobPhase.CANCELLED, FailureClass.CANCELLED, None),
])
def test_log_sink_state_lines_without_labels_are_unattributed(
        text: str, phase: JobPhase, failure: FailureClass | None, exit_code: int | None) -> None:
    with pytest.raises(UnattributedJobUpdate) as err:
        parse_job_message(json.dumps(sink_entry(text)).encode(),
                          {ATTR_LOG_TIMESTAMP: "2027-01-15T08:00:00Z"})
    assert isinstance(err.value, InvalidEvent) and err.value.job_id == "1234567890"
    status = err.value.status
    assert status.job_name == "projects/spotorch-prod/locations/-/customJobs/1234567890"
    assert (status.phase, status.failure, status.exit_code) == (phase, failure, exit_code)
    assert err.value.observed_at == pytest.approx(parse_rfc3339("2027-01-15T08:00:00.123456Z"))


def test_a_log_sink_entry_with_attributes_is_an_update() -> None:
    data = json.dumps(sink_entry("Job completed successfully.", timestamp=None)).encode()
    update = parse_job_message(data, {"run_id": "r9", "attempt": "4",
                                      ATTR_LOG_TIMESTAMP: "2027-01-15T08:00:01Z"})
    assert (update.run_id, update.attempt, update.status.phase) == ("r9", 4, JobPhase.SUCCEEDED)
    assert update.observed_at == parse_rfc3339("2027-01-15T08:00:01Z")


def test_a_worker_log_line_is_not_a_state_change() -> None:
    data = json.dumps(sink_entry("epoch 3 loss 0.12")).encode()
    with pytest.raises(NotAJobStateChange):
        parse_job_message(data, {})


def _with(path: str, value: Any) -> bytes:
    e = entry()
    target = e
    *parents, last = path.split(".")
    for key in parents:
        target = target[key]
    if value is DELETE:
        del target[last]
    else:
        target[last] = value
    return encode(e)


DELETE = object()


@pytest.mark.parametrize(("data", "attributes", "reason"), [
    (b"{not json", {}, "not JSON"),
    (b"\xff\xfe", {}, "not JSON"),
    (b"[1, 2]", {}, "not an object"),
    (_with("resource.type", "gce_instance"), {}, "ml_job"),
    (_with("resource", DELETE), {}, "ml_job"),
    (_with("jsonPayload.state", "JOB_STATE_EXPLODED"), {}, "unknown job state"),
    (_with("jsonPayload.error", "boom"), {}, "error is not an object"),
    (_with("jsonPayload.error", {"code": "x", "message": ""}), {}, "error.code"),
    (_with("jsonPayload.startTime", "yesterday"), {}, "startTime"),
    (_with("jsonPayload.name", None), {}, None),  # falls back to resource.labels: fine
    (_with("timestamp", DELETE), {}, None),  # falls back to updateTime: fine
    (encode(entry()), {"attempt": "two"}, "attempt is not an integer"),
    (encode(entry()), {"attempt": "0"}, "at least 1"),
    (encode(entry()), {ATTR_SOURCE: "trainer"}, "not a job-state message"),
])
def test_malformed_messages_raise_invalid_event(data: bytes, attributes: dict[str, str],
                                                reason: str | None) -> None:
    if reason is None:
        assert parse_job_message(data, attributes).job_id == "1234567890"
        return
    with pytest.raises(InvalidEvent) as err:
        parse_job_message(data, attributes)
    assert reason in err.value.reason


def test_an_entry_without_any_time_is_invalid() -> None:
    e = entry()
    del e["timestamp"], e["jsonPayload"]["updateTime"]
    with pytest.raises(InvalidEvent, match="no timestamp"):
        parse_job_message(encode(e), {})


def test_an_entry_naming_no_job_is_invalid() -> None:
    e = entry()
    del e["jsonPayload"]["name"], e["resource"]["labels"]["job_id"]
    with pytest.raises(InvalidEvent, match="names no job"):
        parse_job_message(encode(e), {})


def test_rfc3339_parsing() -> None:
    assert parse_rfc3339("1970-01-01T00:00:01Z") == 1.0
    assert parse_rfc3339("1970-01-01T00:00:01.5+00:00") == 1.5
    assert parse_rfc3339("1970-01-01T00:00:01.123456789Z") == pytest.approx(1.123456)
