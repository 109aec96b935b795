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
    """One line of a job's output: which replica wrote it, when (ISO 8601, if known), the text."""

    replica: str
    text: str
    at: str | None = None


class LogSource(Protocol):
    def lines(self, job_name: str, *, follow: bool, ended: Callable[[], bool]) -> Iterator[LogLine]:
        """The job's lines so far; with follow, new ones until `ended()` says the attempt is over."""
        ...


def job_id_of(job_name: str) -> str:
    return job_name.rstrip("/").rsplit("/", 1)[-1]


class LogsUnavailable(Exception):
    """The job's logs cannot be read (no such folder, no access)."""


class LocalWorkerLogs:
    """The local Vertex AI emulator's worker output: WORKDIR/JOB_ID/workerpoolP-I.log."""

    def __init__(self, workdir: Path, poll_s: float = FOLLOW_POLL_S) -> None:
        self.workdir = workdir
        self.poll_s = poll_s

    def lines(self, job_name: str, *, follow: bool, ended: Callable[[], bool]) -> Iterator[LogLine]:
        folder = self.workdir / job_id_of(job_name)
        if not folder.is_dir() and not follow:
            raise LogsUnavailable(f"no worker logs for {job_name} in {folder} (the local stack "
                                  "keeps them only while its run folder exists)")
        offsets: dict[Path, int] = {}
        partial: dict[Path, bytes] = {}
        while True:
            finished = ended() if follow else True  # read once more after the end is seen
            for path in sorted(folder.glob("*.log")) if folder.is_dir() else ():
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
                    yield LogLine(path.stem, raw.decode(errors="replace").rstrip("\r"))
            if finished:
                return
            time.sleep(self.poll_s)


class CloudLoggingSource:
    """Cloud Logging entries of a Vertex AI job (gcloud's own filter), oldest first."""

    def __init__(self, project: str, client: Any = None, poll_s: float = CLOUD_FOLLOW_POLL_S) -> None:
        self.project = project
        self._client = client
        self.poll_s = poll_s

    @property
    def client(self) -> Any:
        if self._client is None:
            from google.cloud import logging as cloud_logging

            self._client = cloud_logging.Client(project=self.project)
        return self._client

    @staticmethod
    def log_filter(job_name: str, after: str | None = None) -> str:
        text = f'resource.type="ml_job" AND resource.labels.job_id="{job_id_of(job_name)}"'
        return text + (f' AND timestamp>"{after}"' if after else "")

    def lines(self, job_name: str, *, follow: bool, ended: Callable[[], bool]) -> Iterator[LogLine]:
        from google.cloud import logging as cloud_logging

        last: str | None = None
        while True:
            finished = ended() if follow else True
            entries = self.client.list_entries(resource_names=[f"projects/{self.project}"],
                                               filter_=self.log_filter(job_name, last),
                                               order_by=cloud_logging.ASCENDING, page_size=1000)
            for entry in entries:
                at = entry.timestamp.isoformat().replace("+00:00", "Z") if entry.timestamp else None
                last = at or last
                labels = (entry.resource.labels if entry.resource else None) or {}
                yield LogLine(str(labels.get("task_name") or "job"), _text_of(entry.payload), at)
            if finished:
                return
            time.sleep(self.poll_s)


def _text_of(payload: Any) -> str:
    """jsonPayload.message or textPayload, as gcloud reads them."""
    if isinstance(payload, dict):
        return str(payload.get("message", payload))
    return str(payload if payload is not None else "")
