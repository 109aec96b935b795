"""An in-memory twin of the Spark step's launcher (issue 42): Dataproc Serverless batches that
tests drive by hand, with Dataproc's rules: a batch id of 4-63 [a-z0-9-] characters, taken
for as long as its batch exists (a second create of it is the batch started before)."""

from __future__ import annotations

import threading
from dataclasses import dataclass, replace

from spotorch.core.preprocess import JobView
from spotorch.core.spark_batches import (
    BATCH_CANCELLED,
    BATCH_LIVE_STATES,
    BATCH_PENDING,
    valid_batch_id,
)
from spotorch.ports.steps import StepLaunch, StepLaunchError


@dataclass
class FakeBatch:
    """A batch held by the twin: its request and what GetBatch answers."""

    request: StepLaunch
    view: JobView


class InMemoryBatches:
    """A StepLauncher whose Dataproc batches are records, keyed by (region, batch id)."""

    def __init__(self, project: str = "p") -> None:
        self.project = project
        self.batches: dict[tuple[str, str], FakeBatch] = {}
        self.created = 0
        self.cancelled: list[str] = []
        self.reads = 0  # GetBatch calls (the quota counts them)
        self.fail_launch: StepLaunchError | None = None
        self._lock = threading.Lock()

    def launch(self, request: StepLaunch) -> JobView:
        """StepLauncher.launch: a new PENDING batch, or the batch of that id in any state (its
        id is taken); a malformed id is refused for good, as Dataproc's INVALID_ARGUMENT."""
        with self._lock:
            if not valid_batch_id(request.job_name):
                raise StepLaunchError(f"CreateBatch: batch id {request.job_name!r} must be "
                                      "4-63 characters of [a-z0-9-]", permanent=True)
            found = self.batches.get((request.region, request.job_name))
            if found is not None:
                return found.view
            if self.fail_launch is not None:
                raise self.fail_launch
            name = f"projects/{self.project}/locations/{request.region}/batches/" \
                   f"{request.job_name}"
            view = JobView(job_id=name, name=request.job_name, state=BATCH_PENDING)
            self.batches[(request.region, request.job_name)] = FakeBatch(request, view)
            self.created += 1
            return view

    def get(self, job_name: str, region: str, job_id: str | None = None) -> JobView | None:
        """StepLauncher.get: the batch of that id in the region, None if there is none."""
        with self._lock:
            self.reads += 1
            found = self.batches.get((region, job_name))
            return found.view if found is not None else None

    def cancel(self, job_name: str, region: str) -> None:
        """StepLauncher.cancel: a live batch ends CANCELLED at once (Dataproc passes through
        CANCELLING); an ended or unknown one is left as it is."""
        with self._lock:
            self.cancelled.append(job_name)
            found = self.batches.get((region, job_name))
            if found is not None and found.view.state in BATCH_LIVE_STATES:
                found.view = replace(found.view, state=BATCH_CANCELLED)

    def delete(self, job_name: str, region: str) -> None:
        """DeleteBatch: an ended batch's record goes; a live one is refused."""
        with self._lock:
            found = self.batches.get((region, job_name))
            if found is None:
                return
            if found.view.state in BATCH_LIVE_STATES:
                raise StepLaunchError(f"batch {job_name} is {found.view.state}: cancel it first",
                                      permanent=True)
            del self.batches[(region, job_name)]

    def set_state(self, job_name: str, state: str, error: str = "", *, region: str = "",
                  milli_dcu_s: float = 0.0, shuffle_gb_s: float = 0.0,
                  milli_dcu_rate: float = 0.0) -> JobView:
        """Move a batch to a state, with its usage so far (test helper)."""
        with self._lock:
            found = next((b for (r, n), b in self.batches.items()
                          if n == job_name and (not region or r == region)), None)
            if found is None:
                raise KeyError(job_name)
            found.view = replace(found.view, state=state, error=error, milli_dcu_s=milli_dcu_s,
                                 shuffle_gb_s=shuffle_gb_s, milli_dcu_rate=milli_dcu_rate)
            return found.view
