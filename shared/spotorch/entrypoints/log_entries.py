"""Job-state messages on Pub/Sub: a Cloud Logging LogEntry of resource.type="ml_job", as a log sink
exports it, parsed into the one thing it tells: which job said which state line, and when.

A real entry carries resource.labels {job_id, project_id, task_name} and a line of text in
textPayload or jsonPayload.message; no run id, attempt, region or error code. It may carry the
job's state as the label ml.googleapis.com/job_state: that is read first, the text otherwise. spotorch
attributes it through the job record it wrote when it created the job (service.job_line_reported),
and confirms a terminal line with GetCustomJob before it ends an attempt.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from spotorch.core.errors import InvalidEvent
from spotorch.core.model import JobPhase
from spotorch_trainer.contract import ATTR_SOURCE, SOURCE_JOB, parse_rfc3339

RESOURCE_TYPE = "ml_job"
ATTR_LOG_TIMESTAMP = "logging.googleapis.com/timestamp"  # what a log sink sets on each message
# A label real entries may carry (FACTS.md: seen as "SUCCEEDED" on "Job completed successfully.";
# on which lines it appears is not known): read when present, the line's text otherwise.
JOB_STATE_LABEL = "ml.googleapis.com/job_state"


@dataclass(frozen=True)
class StateLines:
    """Which service lines mean which job phase; the first pattern that matches wins.

    Verified wording (real transcripts, gcloud's stream-logs): the provisioning, preparing,
    running and "completed successfully" lines. The failure and cancellation wording is NOT
    verified: those patterns are guesses, kept here to be overridden (SPOTORCH_JOB_STATE_LINES).
    A wrong guess only delays a run: terminal lines are confirmed with GetCustomJob, and the
    reconcile tick polls every live job anyway.
    """

    patterns: tuple[tuple[re.Pattern[str], JobPhase], ...]

    @classmethod
    def from_table(cls, table: Sequence[tuple[str, str]]) -> StateLines:
        """Compile a (pattern, phase) table, e.g. from SPOTORCH_JOB_STATE_LINES."""
        return cls(tuple((re.compile(p), JobPhase(phase)) for p, phase in table))


STATE_LINE_TABLE: tuple[tuple[str, str], ...] = (
    (r"(?i)^job completed successfully", "SUCCEEDED"),  # verified
    (r"(?i)^job (?:has )?failed", "FAILED"),  # unverified
    (r"(?i)^job is being cancel+ed", "CANCELLING"),  # unverified
    (r"(?i)^job (?:was |has been )?cancel+ed", "CANCELLED"),  # unverified
    (r"(?i)^job is running", "RUNNING"),  # verified
    (r"(?i)^(?:job is preparing|waiting for job to be provisioned|vertex ai is setting up this job)",
     "PENDING"),  # verified
    (r"(?i)^job is queued", "QUEUED"),  # unverified
)
DEFAULT_STATE_LINES = StateLines.from_table(STATE_LINE_TABLE)


class NotAJobStateChange(InvalidEvent):
    """A well-formed ml_job log entry that reports no state change (e.g. a worker's log line)."""


# --- parsing ------------------------------------------------------------------------------------
#
# A real sink entry says only which job (resource.labels.job_id, project_id), that the line is the
# service's (task_name "service"), when, and a line of text. Nothing else is read from it, even
# when present: whatever the entry claims beyond that is a hint that Vertex itself must confirm.

MAX_ENTRY_BYTES = 256 * 1024  # Cloud Logging's entry limit; a larger message is not a sink entry
_JOB_ID = re.compile(r"[0-9]{1,30}")
_PROJECT_ID = re.compile(r"[a-z][a-z0-9-]{4,61}[a-z0-9]|[0-9]{1,20}")
SERVICE_TASK = "service"


@dataclass(frozen=True)
class JobLogLine:
    """One service line of a job's log, as a sink delivers it: which job, what it says, when."""

    job_id: str
    project: str
    phase: JobPhase  # what the line suggests; terminal phases are confirmed with Vertex
    message: str  # the rest of the line (an error text, if the wording carries one)
    observed_at: float  # the entry's timestamp


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
        raise InvalidEvent(f"{what} is not an RFC 3339 timestamp: {str(value)[:40]!r}") from None


def _phase_of(text: str, lines: StateLines) -> tuple[JobPhase, str]:
    for pattern, phase in lines.patterns:
        found = pattern.match(text)
        if found:
            return phase, text[found.end():].lstrip(" .:").strip()
    raise NotAJobStateChange(f"not a job state line: {text[:80]!r}")


def _labelled_phase(value: Any) -> JobPhase | None:
    """The phase of a job_state label's value (SUCCEEDED, JOB_STATE_FAILED, 4); None if unknown."""
    if not isinstance(value, str | int) or isinstance(value, bool) or len(str(value)) > 40:
        return None
    from spotorch.adapters.gcp.vertex import STATE_PHASES, parse_job_state

    try:
        return STATE_PHASES[parse_job_state(value)]
    except ValueError:
        return None


def parse_log_entry(data: bytes, attributes: Mapping[str, str],
                    lines: StateLines | None = None) -> JobLogLine:
    """The job state line a log-sink message carries.

    Raises InvalidEvent (with the reason) for a malformed message, and NotAJobStateChange for a
    well-formed ml_job entry that reports no state (a worker's output, a teardown line).
    """
    lines = lines or DEFAULT_STATE_LINES
    source = attributes.get(ATTR_SOURCE)
    if source not in (None, "", SOURCE_JOB):
        raise InvalidEvent(f"not a job-state message ({ATTR_SOURCE}={source!r})")
    if len(data) > MAX_ENTRY_BYTES:
        raise InvalidEvent(f"message data is {len(data)} bytes, more than a log entry can be")
    try:
        entry = json.loads(data)
    except (ValueError, UnicodeDecodeError, RecursionError):
        raise InvalidEvent("message data is not JSON") from None
    entry = _object(entry, "message data")
    resource = _object(entry.get("resource"), "resource")
    if resource.get("type") != RESOURCE_TYPE:
        raise InvalidEvent(f"not an {RESOURCE_TYPE} log entry (resource.type "
                           f"{str(resource.get('type'))[:40]!r})")
    labels = _object(resource.get("labels"), "resource.labels")
    job_id, project = str(labels.get("job_id") or ""), str(labels.get("project_id") or "")
    if not _JOB_ID.fullmatch(job_id):
        raise InvalidEvent(f"resource.labels.job_id is not a Vertex job id: {job_id[:40]!r}")
    if not _PROJECT_ID.fullmatch(project):
        raise InvalidEvent(f"resource.labels.project_id is not a project id: {project[:40]!r}")
    if labels.get("task_name") != SERVICE_TASK:
        raise NotAJobStateChange(f"a replica's output ({str(labels.get('task_name'))[:40]})")
    payload = _object(entry.get("jsonPayload"), "jsonPayload")
    text = entry.get("textPayload") or payload.get("message") or ""
    if not isinstance(text, str):
        raise InvalidEvent("the entry's text is not a string")
    labelled = _labelled_phase(_object(entry.get("labels"), "labels").get(JOB_STATE_LABEL))
    try:
        phase, message = _phase_of(text.strip(), lines)
    except NotAJobStateChange:
        if labelled is None:
            raise
        phase, message = labelled, text.strip()
    phase = labelled or phase
    observed_at = (_time(entry.get("timestamp"), "timestamp")
                   or _time(attributes.get(ATTR_LOG_TIMESTAMP), ATTR_LOG_TIMESTAMP))
    if observed_at is None:
        raise InvalidEvent("the entry has no timestamp")
    return JobLogLine(job_id=job_id, project=project, phase=phase, message=message[:1000],
                      observed_at=observed_at)
