"""ports.JobLogs on Cloud Logging: a failed Vertex AI job's replicas' last error lines.

One ListLogEntries call per failed attempt: the filter gcloud uses for a job's logs
(`resource.type="ml_job" AND resource.labels.job_id="ID"`), Vertex's own lines left out
(task_name "service"), severity>=ERROR (stderr), newest first, one page of `limit` entries, since
the attempt started. The message is in jsonPayload.message or textPayload (FACTS.md, "Vertex AI
log entries as they really are"). It reads through deploy/'s log view on the job logs
(job_log_view: the _Default bucket's entries of resource.type "ml_job"), so the caller needs
logging.views.access on that view (roles/logging.viewAccessor, deploy/logs.tf), not
roles/logging.viewer on the project. The read quota (60 per minute per project
by default) is why only failures the code caused are looked up (core.recovery.WORKER_FAILURES).
"""

from __future__ import annotations

import threading
from typing import Any

from spotorch.adapters.gcp.vertex_calls import emulator_channel
from spotorch.ports.job_logs import LogReadError

SERVICE_TASK = "service"  # resource.labels.task_name of Vertex's own lines
JOB_LOG_VIEW = "spotorch-job-logs"  # deploy/logs.tf: the _Default bucket's ml_job entries
VIEW_ACCESS = "logging.views.access"  # what reading through a view needs (viewAccessor)


def job_log_view(project: str) -> str:
    """The resource name ListLogEntries reads Vertex AI's job entries through (deploy/logs.tf)."""
    return f"projects/{project}/locations/global/buckets/_Default/views/{JOB_LOG_VIEW}"
CALL_TIMEOUT_S = 10.0  # a job's end must not wait long for its error lines


def job_id_of(job_name: str) -> str:
    """The job's id: the last part of its resource name."""
    return job_name.rstrip("/").rsplit("/", 1)[-1]


def rfc3339(ts: float) -> str:
    """An epoch time as Cloud Logging's filters write it (UTC, microseconds)."""
    from datetime import UTC, datetime

    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def error_filter(job_name: str, since: float | None) -> str:
    """The Logging query language filter of a job's replicas' error lines."""
    text = (f'resource.type="ml_job" AND resource.labels.job_id="{job_id_of(job_name)}" '
            f'AND resource.labels.task_name!="{SERVICE_TASK}" AND severity>=ERROR')
    return text + (f' AND timestamp>="{rfc3339(since)}"' if since is not None else "")


def entry_text(entry: Any) -> str:
    """jsonPayload.message or textPayload of a LogEntry (proto-plus), as gcloud reads them."""
    if entry.text_payload:
        return str(entry.text_payload)
    payload = entry.json_payload
    if payload:
        message = payload.get("message") if hasattr(payload, "get") else None
        return str(message if message is not None else dict(payload))
    return ""


class CloudLoggingJobLogs:
    """The error lines of Vertex AI jobs, from Cloud Logging (or its local stand-in at endpoint)."""

    def __init__(self, project: str, *, endpoint: str | None = None, token: str | None = None,
                 client: Any = None, timeout_s: float = CALL_TIMEOUT_S) -> None:
        """endpoint: None for logging.googleapis.com, or host:port of the local Vertex emulator
        (which serves ListLogEntries from its workers' output); token: the local caller's
        bearer token there (the emulator checks logging.views.access on the view)."""
        self.project = project
        self.endpoint = endpoint
        self.token = token
        self.timeout_s = timeout_s
        self._client = client
        self._lock = threading.Lock()

    def _real_client(self) -> Any:
        from google.cloud.logging_v2.services.logging_service_v2 import LoggingServiceV2Client

        if self.endpoint:
            from google.cloud.logging_v2.services.logging_service_v2.transports import (
                LoggingServiceV2GrpcTransport,
            )

            channel = emulator_channel(self.endpoint, self.token)
            return LoggingServiceV2Client(transport=LoggingServiceV2GrpcTransport(channel=channel))
        return LoggingServiceV2Client()

    @property
    def client(self) -> Any:
        """The Logging client, built on first use under the lock."""
        with self._lock:
            if self._client is None:
                self._client = self._real_client()
            return self._client

    def error_tail(self, job_name: str, *, since: float | None, limit: int) -> tuple[str, ...]:
        """JobLogs.error_tail: one ListLogEntries page, newest first, returned oldest first."""
        request = {"resource_names": [job_log_view(self.project)],
                   "filter": error_filter(job_name, since), "order_by": "timestamp desc",
                   "page_size": limit}
        try:
            pager = self.client.list_log_entries(request=request, timeout=self.timeout_s)
            # One page only: the newest `limit` entries (bounded whatever the job printed).
            entries = list(next(iter(pager.pages)).entries) if limit > 0 else []
        except StopIteration:
            return ()
        except Exception as exc:
            from google.api_core import exceptions as api
            from google.auth import exceptions as auth

            if isinstance(exc, api.GoogleAPICallError | auth.GoogleAuthError):
                raise LogReadError(f"{type(exc).__name__}: {exc}") from exc
            raise
        lines: list[str] = []
        for entry in reversed(entries[:limit]):  # oldest first
            lines.extend(entry_text(entry).splitlines() or [""])
        return tuple(lines[-limit:])
