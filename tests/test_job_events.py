"""Job-state Pub/Sub messages: LogEntry JSON as a Cloud Logging sink exports it, and bad ones.

A real entry has resource.labels {job_id, project_id, task_name} and a line of text; nothing
else is read, even when an entry claims more (a forged state, labels or a region).
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from spotorch.core.errors import InvalidEvent
from spotorch.core.model import JobPhase
from spotorch.entrypoints.log_entries import (
    ATTR_LOG_TIMESTAMP,
    NotAJobStateChange,
    StateLines,
    parse_log_entry,
)
from spotorch_trainer.contract import ATTR_SOURCE, parse_rfc3339


def sink_entry(text: str | None = "Job is running.", *, task: str = "service",
               **extra: Any) -> dict[str, Any]:
    """A LogEntry for resource.type="ml_job" as a sink publishes it (FACTS.md: no run labels)."""
    entry: dict[str, Any] = {
        "logName": "projects/spotorch-prod/logs/ml.googleapis.com%2F1234567890",
        "resource": {"type": "ml_job", "labels": {"job_id": "1234567890",
                                                  "project_id": "spotorch-prod",
                                                  "task_name": task}},
        "timestamp": "2027-01-15T08:00:00.123456789Z",
        "receiveTimestamp": "2027-01-15T08:00:01.5Z", "severity": "INFO",
        "insertId": "abc123", **extra}
    if text is not None:
        entry["textPayload"] = text
    return entry


def encode(entry: dict[str, Any]) -> bytes:
    return json.dumps(entry).encode()


@pytest.mark.parametrize(("text", "phase", "message"), [
    ("Job is running.", JobPhase.RUNNING, ""),
    ("Waiting for job to be provisioned.", JobPhase.PENDING, ""),
    ("Vertex AI is setting up this job.", JobPhase.PENDING, ""),
    ("Job is preparing.", JobPhase.PENDING, ""),
    ("Job completed successfully.", JobPhase.SUCCEEDED, ""),
    ("Job failed. The replica workerpool0-0 exited with a non-zero status of 1.",
     JobPhase.FAILED, "The replica workerpool0-0 exited with a non-zero status of 1."),
    ("Job was cancelled.", JobPhase.CANCELLED, ""),
])
def test_service_lines_name_the_job_and_a_phase(text: str, phase: JobPhase, message: str) -> None:
    line = parse_log_entry(encode(sink_entry(text)), {ATTR_LOG_TIMESTAMP: "2027-01-15T08:00:00Z"})
    assert (line.job_id, line.project, line.phase, line.message) == \
        ("1234567890", "spotorch-prod", phase, message)
    assert line.observed_at == pytest.approx(parse_rfc3339("2027-01-15T08:00:00.123456Z"))


def test_the_text_may_be_in_json_payload_message() -> None:
    entry = sink_entry(None, jsonPayload={"message": "Job completed successfully."})
    assert parse_log_entry(encode(entry), {}).phase is JobPhase.SUCCEEDED


def test_claims_beyond_the_real_shape_are_not_read() -> None:
    """A forged entry with a state enum, labels and a region says no more than its text line."""
    entry = sink_entry("Job is running.", jsonPayload={
        "state": "JOB_STATE_FAILED", "labels": {"spotorch_run": "r1", "spotorch_attempt": "1"},
        "name": "projects/p/locations/us-central1/customJobs/1234567890"})
    line = parse_log_entry(encode(entry), {"run_id": "r1", "attempt": "1"})
    assert line.phase is JobPhase.RUNNING and line.job_id == "1234567890"
    assert not hasattr(line, "run_id")


@pytest.mark.parametrize(("label", "text", "phase", "message"), [
    ("SUCCEEDED", "Job completed successfully.", JobPhase.SUCCEEDED, ""),
    ("JOB_STATE_FAILED", "Job failed. The replica workerpool0-0 exited with a non-zero status "
     "of 1.", JobPhase.FAILED, "The replica workerpool0-0 exited with a non-zero status of 1."),
    ("RUNNING", "Tearing down training program.", JobPhase.RUNNING,
     "Tearing down training program."),  # a line the text table does not know
    ("CANCELLED", "Job is running.", JobPhase.CANCELLED, ""),  # the label wins over the text
    ("NOT_A_STATE", "Job is running.", JobPhase.RUNNING, ""),  # unknown label: the text decides
])
def test_the_job_state_label_is_read_first(label: str, text: str, phase: JobPhase,
                                           message: str) -> None:
    """labels["ml.googleapis.com/job_state"] when an entry has it (FACTS.md), else the text."""
    entry = sink_entry(text, labels={"ml.googleapis.com/job_state": label})
    line = parse_log_entry(encode(entry), {})
    assert (line.phase, line.message) == (phase, message)


def test_an_unknown_label_on_a_line_without_state_is_no_state() -> None:
    entry = sink_entry("epoch 3 loss 0.12", labels={"ml.googleapis.com/job_state": "WEIRD"})
    with pytest.raises(NotAJobStateChange):
        parse_log_entry(encode(entry), {})


def test_the_timestamp_falls_back_to_the_sink_attribute() -> None:
    entry = sink_entry("Job is running.")
    del entry["timestamp"]
    line = parse_log_entry(encode(entry), {ATTR_LOG_TIMESTAMP: "2027-01-15T08:00:01Z"})
    assert line.observed_at == parse_rfc3339("2027-01-15T08:00:01Z")


@pytest.mark.parametrize("entry", [
    sink_entry("epoch 3 loss 0.12"),
    sink_entry("Tearing down training program."),
    sink_entry("Job is running.", task="workerpool0-0"),  # a replica's own output
])
def test_lines_that_report_no_state(entry: dict[str, Any]) -> None:
    with pytest.raises(NotAJobStateChange):
        parse_log_entry(encode(entry), {})


def _with(path: str, value: Any) -> bytes:
    entry = sink_entry()
    target = entry
    *parents, last = path.split(".")
    for key in parents:
        target = target[key]
    if value is DELETE:
        del target[last]
    else:
        target[last] = value
    return encode(entry)


DELETE = object()


@pytest.mark.parametrize(("data", "attributes", "reason"), [
    (b"{not json", {}, "not JSON"),
    (b"\xff\xfe", {}, "not JSON"),
    (b"[1, 2]", {}, "not an object"),
    (b"[" * 100_000, {}, "not JSON"),
    (b" " * (300 * 1024), {}, "more than a log entry"),
    (_with("resource.type", "gce_instance"), {}, "ml_job"),
    (_with("resource", DELETE), {}, "ml_job"),
    (_with("resource.labels", "x"), {}, "resource.labels is not an object"),
    (_with("resource.labels.job_id", DELETE), {}, "job_id"),
    (_with("resource.labels.job_id", "../x"), {}, "job_id"),
    (_with("resource.labels.job_id", "1" * 31), {}, "job_id"),
    (_with("resource.labels.project_id", "a/b"), {}, "project_id"),
    (_with("textPayload", 12), {}, "not a string"),
    (_with("timestamp", "yesterday"), {}, "timestamp"),
    (_with("timestamp", DELETE), {}, "no timestamp"),
    (encode(sink_entry()), {ATTR_SOURCE: "trainer"}, "not a job-state message"),
])
def test_malformed_messages_raise_invalid_event(data: bytes, attributes: dict[str, str],
                                                reason: str) -> None:
    with pytest.raises(InvalidEvent) as err:
        parse_log_entry(data, attributes)
    assert reason in err.value.reason


def test_state_lines_are_configurable() -> None:
    lines = StateLines.from_table([(r"(?i)^training exploded", "FAILED")])
    assert parse_log_entry(encode(sink_entry("Training exploded: OOM")), {},
                           lines).phase is JobPhase.FAILED
    with pytest.raises(NotAJobStateChange):
        parse_log_entry(encode(sink_entry("Job is running.")), {}, lines)


def test_rfc3339_parsing() -> None:
    assert parse_rfc3339("1970-01-01T00:00:01Z") == 1.0
    assert parse_rfc3339("1970-01-01T00:00:01.5+00:00") == 1.5
