"""Job-state messages on Pub/Sub: the Cloud Logging LogEntry they carry, parsed into JobStatus.

Two producers, one shape (a LogEntry for resource.type="ml_job", as a log sink publishes it):
- the local Vertex emulator (spotorch.local.vertex_emulator) builds its messages with
  `build_log_entry` / `message_attributes` below: jsonPayload carries the job's state, labels and
  error as CustomJob fields (camelCase), plus the previous state and a text line;
- a production log sink on resource.type="ml_job" to Pub/Sub. What Vertex writes there is
  unverified: we expect the service's state lines ("Job is running.", "Job failed. <error>", ...)
  as textPayload or jsonPayload.message, resource.labels {job_id, project_id, task_name}, no job
  labels and no custom attributes. So those messages give a job id but no run id, attempt, error
  code or location: parse_job_message raises UnattributedJobUpdate (an InvalidEvent carrying the
  job id and status) so a caller can look the attempt up by job id or just acknowledge it; the
  reconciler's GetCustomJob polling stays the source of truth.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from spotorch.domain import JobStatus
from spotorch.errors import InvalidEvent
from spotorch.ports import LABEL_ATTEMPT, LABEL_RUN
from spotorch.vertex import (
    Classifier,
    JobState,
    classify,
    parse_job_name,
    parse_job_state,
)
from spotorch_trainer.contract import ATTR_SOURCE, SOURCE_JOB, parse_rfc3339, rfc3339

RESOURCE_TYPE = "ml_job"
LOG_ID = "spotorch-vertex-emulator%2Fjob_state"  # emulator only; Vertex's own log id is unverified
ATTR_RUN_ID = "run_id"
ATTR_ATTEMPT = "attempt"
ATTR_JOB_NAME = "job_name"
ATTR_STATE = "state"
ATTR_LOG_TIMESTAMP = "logging.googleapis.com/timestamp"  # what a log sink sets on each message

# The service's state lines, as the emulator writes them and as we expect Vertex's (unverified).
STATE_LINES: Mapping[JobState, str] = {
    JobState.QUEUED: "Job is queued.",
    JobState.PENDING: "Waiting for job to be provisioned.",
    JobState.RUNNING: "Job is running.",
    JobState.SUCCEEDED: "Job completed successfully.",
    JobState.FAILED: "Job failed.",
    JobState.CANCELLING: "Job is being cancelled.",
    JobState.CANCELLED: "Job was cancelled.",
}
_TEXT_STATES: tuple[tuple[re.Pattern[str], JobState], ...] = (
    (re.compile(r"(?i)^job completed successfully"), JobState.SUCCEEDED),
    (re.compile(r"(?i)^job failed"), JobState.FAILED),
    (re.compile(r"(?i)^job is being cancel+ed"), JobState.CANCELLING),
    (re.compile(r"(?i)^job (?:was |has been )?cancel+ed"), JobState.CANCELLED),
    (re.compile(r"(?i)^job is running"), JobState.RUNNING),
    (re.compile(r"(?i)^(?:job is preparing|waiting for job to be provisioned)"), JobState.PENDING),
    (re.compile(r"(?i)^job is queued"), JobState.QUEUED),
)
_SEVERITIES: Mapping[JobState, str] = {JobState.FAILED: "ERROR", JobState.CANCELLED: "WARNING"}


class NotAJobStateChange(InvalidEvent):
    """A well-formed ml_job log entry that reports no state change (e.g. a worker's log line)."""


class UnattributedJobUpdate(InvalidEvent):
    """A job state change that names no run or attempt (a production log-sink entry, as far as
    we know); it carries what it does say, for a lookup by job id."""

    def __init__(self, reason: str, *, job_id: str, status: JobStatus, observed_at: float) -> None:
        super().__init__(reason)
        self.job_id = job_id
        self.status = status
        self.observed_at = observed_at


@dataclass(frozen=True)
class JobUpdate:
    """One observed job state: which attempt it belongs to, the status, and when."""

    run_id: str
    attempt: int
    job_id: str  # the numeric id at the end of the job name
    status: JobStatus
    observed_at: float  # seconds since the epoch: the entry's timestamp






def build_log_entry(*, job_name: str, state: JobState, previous_state: JobState | None,
                    display_name: str, labels: Mapping[str, str], error_code: int,
                    error_message: str, create_time: float | None, start_time: float | None,
                    end_time: float | None, update_time: float, insert_id: str) -> dict[str, Any]:
    """The LogEntry (JSON form) the emulator publishes for one state change of a job."""
    project, _, job_id = parse_job_name(job_name)
    line = STATE_LINES.get(state, f"Job state is {state.name}.")
    payload: dict[str, Any] = {
        "message": f"{line} {error_message}".strip() if error_message else line,
        "name": job_name,
        "displayName": display_name,
        "state": f"JOB_STATE_{state.name}",
        "labels": dict(labels),
        "updateTime": rfc3339(update_time, "microseconds"),
    }
    if previous_state is not None:
        payload["previousState"] = f"JOB_STATE_{previous_state.name}"
    if error_code or error_message:
        payload["error"] = {"code": error_code, "message": error_message}
    for key, ts in (("createTime", create_time), ("startTime", start_time), ("endTime", end_time)):
        if ts is not None:
            payload[key] = rfc3339(ts, "microseconds")
    return {
        "logName": f"projects/{project}/logs/{LOG_ID}",
        "resource": {"type": RESOURCE_TYPE,
                     "labels": {"job_id": job_id, "project_id": project, "task_name": "service"}},
        "timestamp": rfc3339(update_time, "microseconds"),
        "receiveTimestamp": rfc3339(update_time, "microseconds"),
        "severity": _SEVERITIES.get(state, "INFO"),
        "insertId": insert_id,
        "jsonPayload": payload,
    }


def message_attributes(entry: Mapping[str, Any]) -> dict[str, str]:
    """Pub/Sub attributes of an emulator job-state message: source, run, attempt, job, state."""
    payload = entry["jsonPayload"]
    labels = payload.get("labels", {})
    return {
        ATTR_SOURCE: SOURCE_JOB,
        ATTR_RUN_ID: labels.get(LABEL_RUN, ""),
        ATTR_ATTEMPT: labels.get(LABEL_ATTEMPT, ""),
        ATTR_JOB_NAME: payload["name"],
        ATTR_STATE: payload["state"],
        ATTR_LOG_TIMESTAMP: entry["timestamp"],
    }


def encode(entry: Mapping[str, Any]) -> bytes:
    return json.dumps(entry, sort_keys=True).encode()


# --- parsing ------------------------------------------------------------------------------------

def _object(value: Any, what: str) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise InvalidEvent(f"{what} is not an object")
    return value


def _time(value: Any, what: str) -> float | None:
    if value in (None, ""):
        return None
    try:
        return parse_rfc3339(str(value))
    except ValueError:
        raise InvalidEvent(f"{what} is not an RFC 3339 timestamp: {value!r}") from None


def _state_of(payload: Mapping[str, Any], text: str) -> tuple[JobState, str]:
    """The reported state and the error message a text line carries."""
    if "state" in payload:
        try:
            return parse_job_state(payload["state"]), ""
        except ValueError:
            raise InvalidEvent(f"unknown job state {payload['state']!r}") from None
    for pattern, state in _TEXT_STATES:
        found = pattern.match(text)
        if found:
            return state, text[found.end():].lstrip(" .:").strip()
    raise NotAJobStateChange(f"not a job state line: {text[:80]!r}")


def _job_name(payload: Mapping[str, Any], resource_labels: Mapping[str, Any]) -> str:
    name = payload.get("name")
    if isinstance(name, str) and name.count("/") == 5:
        return name
    job_id, project = resource_labels.get("job_id"), resource_labels.get("project_id")
    if not job_id or not project:
        raise InvalidEvent("the entry names no job (jsonPayload.name or resource.labels.job_id)")
    # ml_job resources carry no region (as far as we know): "-" marks it unknown.
    location = resource_labels.get("location") or resource_labels.get("region") or "-"
    return f"projects/{project}/locations/{location}/customJobs/{job_id}"


def _attempt(value: str | None) -> int | None:
    if value in (None, ""):
        return None
    try:
        attempt = int(str(value))
    except ValueError:
        raise InvalidEvent(f"attempt is not an integer: {value!r}") from None
    if attempt < 1:
        raise InvalidEvent(f"attempt must be at least 1, got {attempt}")
    return attempt


def parse_job_message(data: bytes, attributes: Mapping[str, str],
                      classifier: Classifier | None = None) -> JobUpdate:
    """The job update carried by a job-state Pub/Sub message (emulator or log-sink LogEntry).

    Raises InvalidEvent with the reason for a malformed message, and two subclasses a consumer
    may treat quietly: NotAJobStateChange (an ml_job entry that reports no state) and
    UnattributedJobUpdate (a state change without run id / attempt).
    """
    source = attributes.get(ATTR_SOURCE)
    if source not in (None, "", SOURCE_JOB):
        raise InvalidEvent(f"not a job-state message ({ATTR_SOURCE}={source!r})")
    try:
        entry = json.loads(data)
    except (ValueError, UnicodeDecodeError):
        raise InvalidEvent("message data is not JSON") from None
    entry = _object(entry, "message data")
    resource = _object(entry.get("resource"), "resource")
    if resource.get("type") != RESOURCE_TYPE:
        raise InvalidEvent(f"not an {RESOURCE_TYPE} log entry (resource.type "
                           f"{resource.get('type')!r})")
    payload = _object(entry.get("jsonPayload"), "jsonPayload")
    text = str(entry.get("textPayload") or payload.get("message") or "")
    state, text_error = _state_of(payload, text)
    job_name = _job_name(payload, _object(resource.get("labels"), "resource.labels"))
    error = _object(payload.get("error"), "jsonPayload.error")
    try:
        error_code = int(error.get("code") or 0)
    except (TypeError, ValueError):
        raise InvalidEvent(f"error.code is not an integer: {error.get('code')!r}") from None
    error_message = str(error.get("message") or text_error)
    labels = {str(k): str(v) for k, v in _object(payload.get("labels") or entry.get("labels"),
                                                    "labels").items()}
    start_time = _time(payload.get("startTime"), "startTime")
    # A full payload says whether the job ever ran; a bare text line does not.
    started = (start_time is not None) if "state" in payload else None
    phase, failure, exit_code = classify(state, error_code, error_message, classifier,
                                         started=started)
    observed_at = (_time(entry.get("timestamp"), "timestamp")
                   or _time(attributes.get(ATTR_LOG_TIMESTAMP), ATTR_LOG_TIMESTAMP)
                   or _time(payload.get("updateTime"), "updateTime"))
    if observed_at is None:
        raise InvalidEvent("the entry has no timestamp")
    status = JobStatus(
        job_name=job_name, phase=phase, failure=failure, exit_code=exit_code,
        message=error_message, labels=labels,
        create_time=_time(payload.get("createTime"), "createTime"), start_time=start_time,
        end_time=_time(payload.get("endTime"), "endTime"),
    )
    job_id = job_name.rsplit("/", 1)[1]
    run_id = attributes.get(ATTR_RUN_ID) or labels.get(LABEL_RUN)
    attempt = _attempt(attributes.get(ATTR_ATTEMPT) or labels.get(LABEL_ATTEMPT))
    if not run_id or attempt is None:
        raise UnattributedJobUpdate(f"job {job_name} {status.phase}: the message names no run "
                                    "id and attempt", job_id=job_id, status=status,
                                    observed_at=observed_at)
    return JobUpdate(run_id=run_id, attempt=attempt, job_id=job_id, status=status,
                     observed_at=observed_at)
