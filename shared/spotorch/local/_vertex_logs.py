"""The Cloud Logging entries the Vertex emulator publishes, shaped as a log sink exports them.

Only what a real sink delivers: logName, resource (ml_job: job_id, project_id, task_name
"service"), the service's text line (textPayload or jsonPayload.message), timestamp,
receiveTimestamp, severity, insertId; and one message attribute,
logging.googleapis.com/timestamp. No run labels, no state enum, no region, no error code:
production has none of them (FACTS.md, "Vertex AI log entries as they really are").

Which line Vertex writes at which state is known for the lines in KNOWN_LINES; the failure and
cancellation lines are not, so every line is configurable (LogFormat.from_json) and the defaults
for those states are listed as unverified in docs/vertex-emulator.md.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from spotorch.adapters.gcp.vertex import JobState
from spotorch_trainer.contract import rfc3339

RESOURCE_TYPE = "ml_job"
SERVICE_TASK = "service"  # resource.labels.task_name of Vertex's own lines
ATTR_LOG_TIMESTAMP = "logging.googleapis.com/timestamp"  # the only attribute a sink sets
PAYLOADS = ("textPayload", "jsonPayload.message")


class LogFormatError(ValueError):
    """A log format (lines per state, payload field) that cannot be used."""


@dataclass(frozen=True)
class Line:
    """One service line: its text (may name {error_message}) and its severity."""

    text: str
    severity: str = "INFO"


# Lines seen in real Vertex output (gcloud ai custom-jobs stream-logs transcripts); which state
# change each one accompanies is our reading of those transcripts.
KNOWN_LINES: Mapping[JobState, tuple[Line, ...]] = {
    JobState.QUEUED: (Line("Waiting for job to be provisioned."),),
    JobState.PENDING: (Line("Vertex AI is setting up this job."), Line("Job is preparing.")),
    JobState.RUNNING: (Line("Job is running."),),
    JobState.SUCCEEDED: (Line("Tearing down training program."),
                         Line("Finished tearing down training program."),
                         Line("Job completed successfully.")),
}
# Not found in any real output: guesses, configurable, listed as unverified in the docs.
UNVERIFIED_LINES: Mapping[JobState, tuple[Line, ...]] = {
    JobState.FAILED: (Line("Job failed.", "ERROR"),),
    JobState.CANCELLING: (Line("Job is being cancelled."),),
    JobState.CANCELLED: (Line("Job was cancelled.", "WARNING"),),
}
DEFAULT_LINES: Mapping[JobState, tuple[Line, ...]] = {**KNOWN_LINES, **UNVERIFIED_LINES}
_SEVERITIES = frozenset({"DEFAULT", "DEBUG", "INFO", "NOTICE", "WARNING", "ERROR", "CRITICAL",
                         "ALERT", "EMERGENCY"})


@dataclass(frozen=True)
class Transition:
    """One state change of a job, as the emulator saw it (wall-clock time)."""

    project: str
    job_id: str
    state: JobState
    at: float
    error_message: str = ""
    # The job's labels: what the emulator's schedule matches on (never written into an entry:
    # a real Vertex log entry has no labels).
    labels: Mapping[str, str] = field(default_factory=dict, compare=False)


@dataclass(frozen=True)
class LogFormat:
    """Which lines each state change writes, and in which payload field."""

    lines: Mapping[JobState, tuple[Line, ...]] = field(default_factory=lambda: dict(DEFAULT_LINES))
    payload: str = "textPayload"

    def __post_init__(self) -> None:
        if self.payload not in PAYLOADS:
            raise LogFormatError(f"payload must be one of {PAYLOADS}, not {self.payload!r}")

    def entries(self, change: Transition, received_at: float) -> list[dict[str, Any]]:
        """The LogEntries (JSON form) of one state change, in the order Vertex writes them."""
        return [self._entry(change, line, received_at)
                for line in self.lines.get(change.state, ())]

    def _entry(self, change: Transition, line: Line, received_at: float) -> dict[str, Any]:
        text = line.text.format(error_message=change.error_message).strip()
        entry: dict[str, Any] = {
            "logName": f"projects/{change.project}/logs/ml.googleapis.com%2F{change.job_id}",
            "resource": {"type": RESOURCE_TYPE,
                         "labels": {"job_id": change.job_id, "project_id": change.project,
                                    "task_name": SERVICE_TASK}},
            "timestamp": rfc3339(change.at, "microseconds"),
            "receiveTimestamp": rfc3339(max(received_at, change.at), "microseconds"),
            "severity": line.severity,
            "insertId": secrets.token_hex(8),  # opaque, unique per entry, as Cloud Logging's
        }
        if self.payload == "textPayload":
            entry["textPayload"] = text
        else:
            entry["jsonPayload"] = {"message": text}
        return entry

    @classmethod
    def from_json(cls, data: Any) -> LogFormat:
        """{"payload": "textPayload"|"jsonPayload.message", "lines": {"FAILED": ["Job failed.",
        {"text": "...", "severity": "ERROR"}], ...}}; states not named keep their default lines,
        an empty list writes nothing for that state."""
        if not isinstance(data, Mapping):
            raise LogFormatError("log format: expected an object")
        unknown = set(data) - {"payload", "lines"}
        if unknown:
            raise LogFormatError(f"log format: unknown keys {sorted(unknown)}")
        raw_lines = data.get("lines", {})
        if not isinstance(raw_lines, Mapping):
            raise LogFormatError("log format: lines must map state names to lists")
        lines = dict(DEFAULT_LINES)
        for name, items in raw_lines.items():
            lines[_state(str(name))] = tuple(_line(item, f"lines.{name}") for item in
                                             _list(items, f"lines.{name}"))
        return cls(lines=lines, payload=str(data.get("payload", "textPayload")))

    @classmethod
    def load(cls, path: str | Path) -> LogFormat:
        try:
            return cls.from_json(json.loads(Path(path).read_text()))
        except (OSError, ValueError) as exc:
            raise LogFormatError(f"{path}: {exc}") from exc


def _state(name: str) -> JobState:
    try:
        return JobState[name.upper().removeprefix("JOB_STATE_")]
    except KeyError:
        raise LogFormatError(f"log format: unknown job state {name!r}") from None


def _list(items: Any, where: str) -> Sequence[Any]:
    if not isinstance(items, list):
        raise LogFormatError(f"log format: {where} must be a list")
    return items


def _line(item: Any, where: str) -> Line:
    if isinstance(item, str):
        item = {"text": item}
    if not (isinstance(item, Mapping) and isinstance(item.get("text"), str)
            and set(item) <= {"text", "severity"}):
        raise LogFormatError(f"log format: {where}: a line is a string or {{text, severity}}")
    severity = str(item.get("severity", "INFO")).upper()
    if severity not in _SEVERITIES:
        raise LogFormatError(f"log format: {where}: unknown severity {severity!r}")
    try:
        item["text"].format(error_message="")
    except (KeyError, IndexError, ValueError) as exc:
        raise LogFormatError(f"log format: {where}: the only placeholder is {{error_message}} "
                             f"({exc!r})") from None
    return Line(item["text"], severity)


def encode(entry: Mapping[str, Any]) -> bytes:
    """The message data: the LogEntry as JSON."""
    return json.dumps(entry, sort_keys=True).encode()


def attributes(entry: Mapping[str, Any]) -> dict[str, str]:
    """The message attributes a sink sets: only the entry's timestamp."""
    return {ATTR_LOG_TIMESTAMP: str(entry["timestamp"])}
