"""In-memory twins of the preprocess step's ports (issue 31): Dataflow jobs tests drive by hand,
and a storage of folders' checksums and completion markers."""

from __future__ import annotations

import itertools
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from spotorch.core.preprocess import LIVE_STATES, JobView, folder_digest
from spotorch.core.triggers import split_gs_uri
from spotorch.ports.steps import StepLaunch, StepLaunchError


@dataclass
class FakeDataflowJob:
    """A job held by the twin: its request and what GetJob answers."""

    request: StepLaunch
    view: JobView


class InMemorySteps:
    """A StepLauncher whose Dataflow jobs are records: like Dataflow, a second job of a live
    job's name is refused and the create is answered with that job (the adapter's contract)."""

    def __init__(self) -> None:
        self.jobs: list[FakeDataflowJob] = []
        self.created = 0
        self.cancelled: list[str] = []
        self.reads: list[str] = []  # "by_id" or "by_name", one per get (tests count them)
        self.fail_launch: StepLaunchError | None = None
        self._ids = itertools.count(1)
        self._lock = threading.Lock()

    def _newest(self, name: str) -> FakeDataflowJob | None:
        return next((j for j in reversed(self.jobs) if j.view.name == name), None)

    def launch(self, request: StepLaunch) -> JobView:
        """StepLauncher.launch: the live job of that name, else a new JOB_STATE_QUEUED one (a
        finished job of that name is not reused: Dataflow takes the name again)."""
        with self._lock:
            existing = self._newest(request.job_name)
            if existing is not None and existing.view.state in LIVE_STATES:
                return existing.view
            if self.fail_launch is not None:
                raise self.fail_launch
            view = JobView(job_id=f"2026-12-02_00_00_00-{next(self._ids)}",
                           name=request.job_name, state="JOB_STATE_QUEUED")
            self.jobs.append(FakeDataflowJob(request, view))
            self.created += 1
            return view

    def get(self, job_name: str, region: str, job_id: str | None = None) -> JobView | None:
        """StepLauncher.get: the job of that id and name, else the newest of the name; None if
        there is none."""
        with self._lock:
            job = next((j for j in self.jobs if job_id and j.view.job_id == job_id
                        and j.view.name == job_name), None)
            self.reads.append("by_id" if job is not None else "by_name")
            job = job or self._newest(job_name)
            return job.view if job is not None and job.request.region == region else None

    def cancel(self, job_name: str, region: str) -> None:
        """StepLauncher.cancel: recorded; a live job ends JOB_STATE_CANCELLED at once."""
        with self._lock:
            self.cancelled.append(job_name)
            job = self._newest(job_name)
            if job is not None and job.view.state in LIVE_STATES:
                job.view = replace(job.view, state="JOB_STATE_CANCELLED")

    def set_state(self, job_name: str, state: str, error: str = "", *, vcpu_s: float = 0.0,
                  memory_gb_s: float = 0.0, pd_gb_s: float = 0.0) -> JobView:
        """Move a job to a state, with its billed resources so far (test helper)."""
        with self._lock:
            job = self._newest(job_name)
            if job is None:
                raise KeyError(job_name)
            job.view = replace(job.view, state=state, error=error, vcpu_s=vcpu_s,
                               memory_gb_s=memory_gb_s, pd_gb_s=pd_gb_s)
            return job.view


@dataclass
class InMemoryStepOutputs:
    """StepOutputs over dicts: folders' objects (name below the folder -> (size, crc32c)) and
    the completion markers written."""

    folders: dict[str, dict[str, tuple[int, str | None]]] = field(default_factory=dict)
    markers: dict[str, Mapping[str, Any]] = field(default_factory=dict)
    # (object name in its bucket, generation) -> (size, crc32c): every generation still kept
    versions: dict[tuple[str, int], tuple[int, str | None]] = field(default_factory=dict)

    def content_digest(self, data_uri: str,
                       pinned: Sequence[tuple[str, int]] | None = None) -> str | None:
        """StepOutputs.content_digest, by the same rule as the Cloud Storage adapter."""
        if pinned is not None:
            folder = split_gs_uri(data_uri)[1]
            kept = [(n, self.versions.get((n, int(g)))) for n, g in pinned]
            if not kept or any(v is None or v[1] is None for _, v in kept):
                return None
            return folder_digest((n.removeprefix(folder), v[0], v[1] or "")
                                 for n, v in kept if v is not None)
        objects = self.folders.get(data_uri)
        if not objects or any(crc is None for _, crc in objects.values()):
            return None
        return folder_digest((name, size, crc or "") for name, (size, crc) in objects.items())

    def read_manifest(self, uri: str) -> Mapping[str, Any] | None:
        """StepOutputs.read_manifest (manifests are kept with the markers: JSON by URI)."""
        return self.markers.get(uri)

    def read_marker(self, uri: str) -> Mapping[str, Any] | None:
        """StepOutputs.read_marker."""
        return self.markers.get(uri)

    def write_marker(self, uri: str, doc: Mapping[str, Any]) -> None:
        """StepOutputs.write_marker."""
        self.markers[uri] = dict(doc)

