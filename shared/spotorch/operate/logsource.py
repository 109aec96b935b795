"""The training job's own output: Cloud Logging entries in a project, worker files on the local stack."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

FOLLOW_POLL_S = 1.0
CLOUD_FOLLOW_POLL_S = 5.0  # Cloud Logging reads are quota-bound (60 per minute per project)


@dataclass(frozen=True)
class LogLine:
    """One line of a job's output: which replica wrote it, when (ISO 8601, if known), the text,
    and the stream (stdout, stderr; Cloud Logging: INFO and ERROR entries; "service" for
    Vertex's own lines)."""

    replica: str
    text: str
    at: str | None = None
    stream: str = "stdout"


class LogSource(Protocol):
    """Where a job's training output is read from: Cloud Logging, or the local stack's files."""
    def lines(self, job_name: str, *, follow: bool, ended: Callable[[], bool]) -> Iterator[LogLine]:
        """The job's lines so far; with follow, new ones until `ended()` says the attempt is over."""
        ...


def job_id_of(job_name: str) -> str:
    """The job's id: the last part of its resource name."""
    return job_name.rstrip("/").rsplit("/", 1)[-1]


class LogsUnavailable(Exception):
    """The job's logs cannot be read (no such folder, no access)."""


STREAM_FILES = ((".log", "stdout"), (".stderr", "stderr"))  # the emulator's files per replica


class LocalWorkerLogs:
    """The local Vertex AI emulator's worker output: WORKDIR/JOB_ID/workerpoolP-I.log (stdout)
    and workerpoolP-I.stderr. Each replica's new stdout lines come before its new stderr lines
    of the same read: the files keep no time per line."""

    def __init__(self, workdir: Path, poll_s: float = FOLLOW_POLL_S) -> None:
        self.workdir = workdir
        self.poll_s = poll_s

    def lines(self, job_name: str, *, follow: bool, ended: Callable[[], bool]) -> Iterator[LogLine]:
        """LogSource.lines: the worker files as they grow, read from where the last read ended."""
        folder = self.workdir / job_id_of(job_name)
        if not folder.is_dir() and not follow:
            raise LogsUnavailable(f"no worker logs for {job_name} in {folder} (the local stack "
                                  "keeps them only while its run folder exists)")
        offsets: dict[Path, int] = {}
        partial: dict[Path, bytes] = {}
        while True:
            finished = ended() if follow else True  # read once more after the end is seen
            for path, replica, stream in _stream_files(folder):
                with path.open("rb") as f:
                    f.seek(offsets.get(path, 0))
                    chunk = partial.pop(path, b"") + f.read()
                    offsets[path] = f.tell()
                *complete, rest = chunk.split(b"\n")
                if rest:
                    if finished:
                        complete.append(rest)
                    else:
                        partial[path] = rest
                for raw in complete:
                    yield LogLine(replica, raw.decode(errors="replace").rstrip("\r"),
                                  stream=stream)
            if finished:
                return
            time.sleep(self.poll_s)


def _stream_files(folder: Path) -> list[tuple[Path, str, str]]:
    """(file, replica, stream) of a job folder, replica by replica, stdout first."""
    if not folder.is_dir():
        return []
    found = [(path, path.name[:-len(suffix)], stream) for suffix, stream in STREAM_FILES
             for path in folder.glob(f"*{suffix}")]
    order = {stream: i for i, (_, stream) in enumerate(STREAM_FILES)}
    return sorted(found, key=lambda f: (f[1], order[f[2]]))


class CloudLoggingSource:
    """Cloud Logging entries of a Vertex AI job (gcloud's own filter), oldest first."""

    def __init__(self, project: str, client: Any = None, poll_s: float = CLOUD_FOLLOW_POLL_S) -> None:
        self.project = project
        self._client = client
        self.poll_s = poll_s

    @property
    def client(self) -> Any:
        """The Cloud Logging client, built on first use (no client at import time)."""
        if self._client is None:
            from google.cloud import logging as cloud_logging

            self._client = cloud_logging.Client(project=self.project)
        return self._client

    @staticmethod
    def log_filter(job_name: str, after: str | None = None) -> str:
        """The entries filter of a job's output (after: only entries newer than that timestamp)."""
        text = f'resource.type="ml_job" AND resource.labels.job_id="{job_id_of(job_name)}"'
        return text + (f' AND timestamp>"{after}"' if after else "")

    def lines(self, job_name: str, *, follow: bool, ended: Callable[[], bool]) -> Iterator[LogLine]:
        """As LogSource; the client's refusals (no credentials, no permission) are
        LogsUnavailable, one line that says what to do."""
        from google.api_core import exceptions as api
        from google.auth import exceptions as auth

        from spotorch.adapters.gcp.job_logs import JOB_LOG_VIEW

        try:
            yield from self._lines(job_name, follow=follow, ended=ended)
        except auth.DefaultCredentialsError:
            raise LogsUnavailable(f"no Google credentials to read the job's logs from Cloud "
                                  f"Logging of project {self.project} (run `gcloud auth "
                                  "application-default login`)") from None
        except (api.GoogleAPICallError, auth.GoogleAuthError) as exc:
            first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise LogsUnavailable(f"cannot read the job's logs from Cloud Logging of project "
                                  f"{self.project}: {first} (reading needs "
                                  "roles/logging.viewAccessor on the log view "
                                  f"{JOB_LOG_VIEW}, deploy/logs.tf)") from None

    def _lines(self, job_name: str, *, follow: bool,
               ended: Callable[[], bool]) -> Iterator[LogLine]:
        from google.cloud import logging as cloud_logging

        from spotorch.adapters.gcp.job_logs import job_log_view

        last: str | None = None
        while True:
            finished = ended() if follow else True
            entries = self.client.list_entries(resource_names=[job_log_view(self.project)],
                                               filter_=self.log_filter(job_name, last),
                                               order_by=cloud_logging.ASCENDING, page_size=1000)
            for entry in entries:
                at = entry.timestamp.isoformat().replace("+00:00", "Z") if entry.timestamp else None
                last = at or last
                labels = (entry.resource.labels if entry.resource else None) or {}
                task = str(labels.get("task_name") or "job")
                stream = "service" if task == "service" else \
                    "stderr" if _severity_at_least_error(entry) else "stdout"
                yield LogLine(task, _text_of(entry.payload), at, stream)
            if finished:
                return
            time.sleep(self.poll_s)


def _severity_at_least_error(entry: Any) -> bool:
    """Vertex logs a replica's stderr lines as ERROR (its stdout as INFO)."""
    name = str(getattr(entry, "severity", "") or "").upper()
    return name in ("ERROR", "CRITICAL", "ALERT", "EMERGENCY")


def _text_of(payload: Any) -> str:
    """jsonPayload.message or textPayload, as gcloud reads them."""
    if isinstance(payload, dict):
        return str(payload.get("message", payload))
    return str(payload if payload is not None else "")
