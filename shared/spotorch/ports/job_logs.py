"""The job log port: what a failed job's replicas wrote to stderr, its last lines.

On Google Cloud, Vertex AI writes each line a replica prints as a Cloud Logging entry of
resource.type ml_job (labels job_id, project_id, task_name = the replica, e.g. workerpool0-0);
lines on stderr come with severity ERROR, lines on stdout with INFO (vertex-ai-samples#242:
tqdm's stderr bars logged as ERROR). So the error tail is the replicas' entries with
severity>=ERROR, newest first, a bounded number (adapters.gcp.job_logs; the function needs
logging.logEntries.list, roles/logging.viewer).
"""

from __future__ import annotations

from typing import Protocol


class LogReadError(Exception):
    """The job's log entries could not be read (quota, permission, unreachable)."""


class JobLogs(Protocol):
    """The error lines of a job's replicas."""

    def error_tail(self, job_name: str, *, since: float | None, limit: int) -> tuple[str, ...]:
        """The last `limit` lines its replicas wrote at severity ERROR or above (stderr), oldest
        first; `since` (epoch seconds, when known) bounds the search. LogReadError when they
        cannot be read."""
        ...
