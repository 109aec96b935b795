"""Cloud Logging's ListLogEntries for the Vertex emulator's jobs, so the real client reads them.

What it serves is what Vertex writes for a custom job, as far as it is known (FACTS.md, "Vertex
AI log entries as they really are"): resource ml_job with labels job_id, project_id and
task_name; a replica's lines under task_name workerpoolP-I, stdout at severity INFO and stderr
at ERROR (vertex-ai-samples#242); Vertex's own lines under task_name service, as the emulator
publishes them to the log sink. The text is in textPayload. Two things are the emulator's own:
the log name of replica lines (real entries' is not recorded in FACTS.md; the service lines'
one is used), and their timestamps, which are the time the replica's file last changed (the
files keep no time per line), so every line of a file has the same one.

The filter language is Logging's, but only its conjunctions of comparisons on the fields below
are understood; anything else is refused with INVALID_ARGUMENT, never ignored.
"""

from __future__ import annotations

import re
import threading
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from spotorch.local._vertex_iam import IamPolicy
from spotorch.local._vertex_jobs import Invalid
from spotorch.local._vertex_workers import STDERR_SUFFIX

SERVICE = "google.logging.v2.LoggingServiceV2"
LIST_PERMISSION = "logging.logEntries.list"  # roles/logging.viewer grants it
VIEW_PERMISSION = "logging.views.access"  # reading through a log view (roles/logging.viewAccessor)
# projects/P/locations/L/buckets/B/views/V: a log view (the emulator's entries are all ml_job
# entries of the _Default bucket, which any view on ml_job shows)
_VIEW = re.compile(r"^projects/([^/]+)/locations/[^/]+/buckets/[^/]+/views/[^/]+$")
RESOURCE_TYPE = "ml_job"
SERVICE_TASK = "service"
SEVERITIES: Mapping[str, int] = {"DEFAULT": 0, "DEBUG": 100, "INFO": 200, "NOTICE": 300,
                                 "WARNING": 400, "ERROR": 500, "CRITICAL": 600, "ALERT": 700,
                                 "EMERGENCY": 800}
STREAMS = ((".log", "INFO"), (STDERR_SUFFIX, "ERROR"))  # a replica's files and their severity
DEFAULT_PAGE = 50
MAX_PAGE = 1000
SERVICE_LINES_KEPT = 200  # Vertex's own lines remembered per job


class FilterError(ValueError):
    """A filter the emulator does not understand (INVALID_ARGUMENT)."""


@dataclass(frozen=True)
class Entry:
    """One log entry, as the emulator holds it before it becomes a LogEntry message."""

    job_id: str
    project: str
    task: str
    severity: str
    text: str
    at: float  # seconds since the epoch
    insert_id: str
    log_name: str

    def field(self, name: str) -> str | float | int:
        values: dict[str, str | float | int] = {
                "resource.type": RESOURCE_TYPE, "resource.labels.job_id": self.job_id,
                "resource.labels.project_id": self.project,
                "resource.labels.task_name": self.task, "logName": self.log_name,
                "severity": SEVERITIES[self.severity], "timestamp": self.at,
                "textPayload": self.text}
        return values[name]


# --- the filter ----------------------------------------------------------------------------------

_TERM = re.compile(r'^\s*(?P<field>[A-Za-z_.]+)\s*(?P<op>>=|<=|!=|=|>|<|:)\s*'
                   r'(?P<value>"(?:[^"\\]|\\.)*"|[^\s"]+)\s*$')
_FIELDS = frozenset({"resource.type", "resource.labels.job_id", "resource.labels.project_id",
                     "resource.labels.task_name", "logName", "severity", "timestamp",
                     "textPayload"})


def _value(field: str, raw: str) -> str | float | int:
    text = raw[1:-1].replace('\\"', '"') if raw.startswith('"') else raw
    if field == "severity":
        if text.upper() not in SEVERITIES:
            raise FilterError(f"unknown severity {text!r}")
        return SEVERITIES[text.upper()]
    if field == "timestamp":
        try:
            return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
        except ValueError:
            raise FilterError(f"timestamp {text!r} is not RFC 3339") from None
    return text


_OPS: Mapping[str, Callable[[Any, Any], bool]] = {
    "=": lambda a, b: a == b, "!=": lambda a, b: a != b, ">": lambda a, b: a > b,
    ">=": lambda a, b: a >= b, "<": lambda a, b: a < b, "<=": lambda a, b: a <= b,
    ":": lambda a, b: str(b) in str(a)}


def parse_filter(text: str) -> list[tuple[str, str, str | float | int]]:
    """(field, operator, value) of each term of `A AND B AND ...`; FilterError otherwise."""
    terms: list[tuple[str, str, str | float | int]] = []
    for part in (p for p in re.split(r"\s+AND\s+", text.strip()) if p) if text.strip() else ():
        found = _TERM.match(part)
        if found is None or found["field"] not in _FIELDS:
            raise FilterError(f"the emulator does not understand {part.strip()!r} (it takes "
                              f"comparisons of {', '.join(sorted(_FIELDS))} joined by AND)")
        terms.append((found["field"], found["op"], _value(found["field"], found["value"])))
    return terms


# --- the entries ---------------------------------------------------------------------------------

class JobLogEntries:
    """Every job's entries: its replicas' files in the workdir, and Vertex's own lines."""

    def __init__(self, project: str | None, workdir: Callable[[], Path]) -> None:
        self.project = project
        self._workdir = workdir
        self._service: dict[str, deque[Entry]] = {}
        self._lock = threading.Lock()

    def remember(self, entry: Mapping[str, Any]) -> None:
        """A service line the emulator published (the log sink's JSON form)."""
        labels = (entry.get("resource") or {}).get("labels") or {}
        job_id = str(labels.get("job_id", ""))
        text = entry.get("textPayload")
        if text is None:
            text = (entry.get("jsonPayload") or {}).get("message", "")
        at = datetime.fromisoformat(str(entry["timestamp"]).replace("Z", "+00:00")).timestamp()
        item = Entry(job_id, str(labels.get("project_id", "")), SERVICE_TASK,
                     str(entry.get("severity") or "INFO"), str(text), at,
                     str(entry.get("insertId") or ""), str(entry.get("logName") or ""))
        with self._lock:
            self._service.setdefault(job_id, deque(maxlen=SERVICE_LINES_KEPT)).append(item)

    def _job_ids(self, wanted: str | None) -> list[str]:
        root = self._workdir()
        if wanted is not None:
            return [wanted] if (root / wanted).is_dir() or wanted in self._service else []
        ids = {p.name for p in root.iterdir() if p.is_dir()} if root.is_dir() else set()
        return sorted(ids | set(self._service))

    def entries(self, project: str, job_id: str | None) -> Iterator[Entry]:
        for jid in self._job_ids(job_id):
            with self._lock:
                yield from list(self._service.get(jid, ()))
            yield from self._worker_entries(project, jid)

    def _worker_entries(self, project: str, job_id: str) -> Iterable[Entry]:
        folder = self._workdir() / job_id
        log_name = f"projects/{project}/logs/ml.googleapis.com%2F{job_id}"
        for suffix, severity in STREAMS:
            for path in sorted(folder.glob(f"*{suffix}")) if folder.is_dir() else ():
                task = path.name[:-len(suffix)]
                try:
                    at = path.stat().st_mtime
                    text = path.read_bytes().decode("utf-8", "replace")
                except OSError:
                    continue
                for n, line in enumerate(text.splitlines()):
                    yield Entry(job_id, project, task, severity, line.rstrip("\r"), at,
                                f"{task}{suffix}-{n:08d}", log_name)


# --- the RPC -------------------------------------------------------------------------------------

class LoggingService:
    """LoggingServiceV2.ListLogEntries over the emulator's jobs."""

    def __init__(self, project: str | None, workdir: Callable[[], Path],
                 iam: IamPolicy | None = None) -> None:
        self.project = project
        self.entries = JobLogEntries(project, workdir)
        self.iam = iam  # None: callers are not checked

    def handle(self, request: Any, metadata: Any) -> Any:
        """ListLogEntries as Cloud Logging answers it: the caller's logging.logEntries.list
        on the project first (UNAUTHENTICATED, PERMISSION_DENIED), then the page."""
        if self.iam is not None:
            try:
                principal = self.iam.principal(metadata)
            except Invalid as exc:
                raise _Refused(exc.code, str(exc)) from None
            names = list(request.resource_names)
            needed = VIEW_PERMISSION if names and _VIEW.match(names[0]) else LIST_PERMISSION
            if not self.iam.allows(principal, needed):
                # Cloud Logging's wording is not documented; this is the Vertex form on its host.
                raise _Refused("PERMISSION_DENIED", f"Permission '{needed}' denied on "
                               f"resource '//logging.googleapis.com/{names[0] if names else ''}' "
                               "(or it may not exist).")
        return self.list_log_entries(request)

    def list_log_entries(self, request: Any) -> Any:
        """The matching entries, one page; Invalid-like errors as (code, message)."""
        from google.cloud.logging_v2.types import ListLogEntriesResponse

        names = list(request.resource_names)
        if len(names) != 1 or not names[0].startswith("projects/"):
            raise _Refused("INVALID_ARGUMENT", "resource_names: give exactly one projects/P "
                                               "or one of its log views")
        view = _VIEW.match(names[0])
        project = view.group(1) if view else names[0].split("/", 1)[1]
        if not view and "/" in project:
            raise _Refused("INVALID_ARGUMENT", f"resource_names: {names[0]} is neither projects/P "
                                               "nor a log view")
        if self.project is not None and project != self.project:
            raise _Refused("PERMISSION_DENIED", f"this emulator serves project {self.project}")
        try:
            terms = parse_filter(request.filter)
        except FilterError as exc:
            raise _Refused("INVALID_ARGUMENT", str(exc)) from None
        job_id = next((str(v) for f, op, v in terms if f == "resource.labels.job_id" and op == "="),
                      None)
        found = [e for e in self.entries.entries(project, job_id)
                 if all(_OPS[op](e.field(f), v) for f, op, v in terms)]
        order = (request.order_by or "timestamp asc").strip().lower()
        if order not in ("timestamp asc", "timestamp desc", "timestamp"):
            raise _Refused("INVALID_ARGUMENT", f"order_by {request.order_by!r}: timestamp asc "
                                               "or timestamp desc")
        found.sort(key=lambda e: (e.at, e.insert_id), reverse=order.endswith("desc"))
        size = min(request.page_size or DEFAULT_PAGE, MAX_PAGE)
        start = int(request.page_token or 0)
        page = found[start:start + size]
        token = str(start + size) if start + size < len(found) else ""
        return ListLogEntriesResponse(entries=[_message(e) for e in page], next_page_token=token)

    def handlers(self) -> Any:
        import grpc
        from google.cloud.logging_v2.types import ListLogEntriesRequest, ListLogEntriesResponse

        def handle(request: Any, context: Any) -> Any:
            try:
                return self.handle(request, context.invocation_metadata())
            except _Refused as exc:
                context.abort(getattr(grpc.StatusCode, exc.code), exc.message)

        return grpc.method_handlers_generic_handler(SERVICE, {
            "ListLogEntries": grpc.unary_unary_rpc_method_handler(
                handle, request_deserializer=ListLogEntriesRequest.deserialize,
                response_serializer=ListLogEntriesResponse.serialize)})


class _Refused(Exception):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code, self.message = code, message


def _message(entry: Entry) -> Any:
    from google.api import monitored_resource_pb2
    from google.cloud.logging_v2.types import LogEntry
    from google.logging.type import log_severity_pb2

    resource = monitored_resource_pb2.MonitoredResource(
        type=RESOURCE_TYPE, labels={"job_id": entry.job_id, "project_id": entry.project,
                                    "task_name": entry.task})
    return LogEntry(log_name=entry.log_name, resource=resource, text_payload=entry.text,
                    timestamp=datetime.fromtimestamp(entry.at, UTC),
                    severity=log_severity_pb2.LogSeverity.Value(entry.severity),
                    insert_id=entry.insert_id)
