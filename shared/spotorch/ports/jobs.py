"""The job launcher port: launch, find, cancel and list Vertex AI jobs; the labels that name a run's jobs."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Protocol

from spotorch.core.errors import ServiceCallFailed
from spotorch.core.hardware import PROBE_LABEL

# The label rules are the core's (core.ids); the port names them for its adapters.
from spotorch.core.ids import MAX_LABEL_LEN as MAX_LABEL_LEN
from spotorch.core.ids import label_value as label_value
from spotorch.core.model import JobStatus
from spotorch.core.pipeline import Capacity, JobTemplate

# Labels that tie a job to its run and attempt: set on every job, used to find (adopt) it.
LABEL_RUN = "spotorch_run"
LABEL_ATTEMPT = "spotorch_attempt"
LABEL_PIPELINE = "spotorch_pipeline"
LABEL_BUCKET = "spotorch_bucket"  # the run's reconcile bucket: the tick's fan-out groups by it
LABEL_PROBE = PROBE_LABEL  # on every probe job (capacity or hardware); never an attempt
LIST_PAGE_SIZE = 100




@dataclass(frozen=True)
class LaunchSpec:
    """Everything needed to create the job of one attempt."""

    run_id: str
    pipeline: str
    attempt: int
    capacity: Capacity
    region: str
    template: JobTemplate
    env: Mapping[str, str]  # spotorch's trainer env (spotorch_trainer.contract), added to every pool
    labels: Mapping[str, str]  # identify run and attempt; the launcher adds them to the job
    display_name: str

    @property
    def job_key(self) -> str:
        """What tells this job apart among its run's jobs: the attempt label (or number)."""
        return self.labels.get(LABEL_ATTEMPT) or str(self.attempt)


class LaunchError(ServiceCallFailed):
    """A launcher call failed; `permanent` says whether retrying can help."""


class JobLauncher(Protocol):
    """Creates, observes and cancels the training jobs of attempts."""

    def launch(self, spec: LaunchSpec) -> str:
        """Create the job and return its name; if one with the spec's labels exists, return that."""
        ...

    def find(self, run_id: str, attempt: int) -> JobStatus | None:
        """Find the job of a run's attempt by its labels (to adopt one whose creation was lost)."""
        ...

    def get(self, job_name: str) -> JobStatus:
        """Current status of a job."""
        ...

    def cancel(self, job_name: str) -> None:
        """Ask for a job to stop; cancelling an ended job is not an error."""
        ...

    def list_live(self, region: str) -> Iterator[JobStatus]:
        """Every job of spotorch's in a region that has not ended (paged: about one request per
        LIST_PAGE_SIZE jobs). The reconcile tick reads these instead of one GetCustomJob each."""
        ...
