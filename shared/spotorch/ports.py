"""Ports: the small contracts between the service layer and the outside world, and their vocabulary."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Any, Protocol

from spotorch.pipeline import Capacity, JobTemplate

if TYPE_CHECKING:
    from spotorch.domain import Run


class JobPhase(StrEnum):
    """Where a job is in its life, in Vertex AI's terms (mapped from JobState)."""

    QUEUED = "QUEUED"  # accepted; waiting for capacity (a SPOT job without capacity stays here)
    PENDING = "PENDING"  # capacity found; VMs and containers starting
    RUNNING = "RUNNING"  # workers running
    SUCCEEDED = "SUCCEEDED"  # every worker exited 0
    FAILED = "FAILED"  # ended with an error; see the failure class
    CANCELLING = "CANCELLING"  # cancel requested, workers stopping
    CANCELLED = "CANCELLED"  # stopped by a cancel

    @property
    def terminal(self) -> bool:
        return self in _TERMINAL_PHASES

    @property
    def rank(self) -> int:
        """Order of phases in a job's life; a later report never moves a job backwards."""
        return _PHASE_RANK[self]


_TERMINAL_PHASES = frozenset({JobPhase.SUCCEEDED, JobPhase.FAILED, JobPhase.CANCELLED})
_PHASE_RANK = {JobPhase.QUEUED: 0, JobPhase.PENDING: 1, JobPhase.RUNNING: 2,
               JobPhase.CANCELLING: 3, JobPhase.SUCCEEDED: 4, JobPhase.FAILED: 4,
               JobPhase.CANCELLED: 4}


class FailureClass(StrEnum):
    """Why an attempt ended without success; each class has its own retry budget."""

    PREEMPTED = "preempted"  # Spot VMs taken back while running
    STOCKOUT = "stockout"  # no capacity: a SPOT job queued too long, or a STOCKOUT error at start
    USER_ERROR = "user_error"  # the training code exited non-zero
    INFRA = "infra"  # Google-side internal error, quota, API failure
    TIMEOUT = "timeout"  # the job hit its scheduling timeout
    CANCELLED = "cancelled"  # cancelled (by spotorch or by someone else)
    LAUNCH_REJECTED = "launch_rejected"  # the API refused the job for good (bad spec, permissions)


@dataclass(frozen=True)
class JobStatus:
    """What the launcher knows about one job right now."""

    job_name: str
    phase: JobPhase
    failure: FailureClass | None = None
    exit_code: int | None = None
    message: str = ""
    labels: Mapping[str, str] = field(default_factory=dict)
    create_time: float | None = None
    start_time: float | None = None
    end_time: float | None = None


# Labels that tie a job to its run and attempt: set on every job, used to find (adopt) it.
LABEL_RUN = "spotorch-run"
LABEL_ATTEMPT = "spotorch-attempt"
LABEL_PIPELINE = "spotorch-pipeline"


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


class LaunchError(Exception):
    """A launcher call failed; `permanent` says whether retrying can help."""

    def __init__(self, message: str, *, permanent: bool, code: str = "") -> None:
        super().__init__(message)
        self.permanent = permanent
        self.code = code


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


class ConflictError(Exception):
    """Someone else changed the document since it was read; reload and decide again."""


class RunStore(Protocol):
    """Runs, each read and written as one document with optimistic concurrency."""

    def load(self, run_id: str) -> tuple[Run | None, Any]:
        """The run and an opaque version token (None when absent)."""
        ...

    def save(self, run: Run, version: Any) -> Any:
        """Write the run if its version is still `version` (None: must not exist); return the new one.

        Raises ConflictError when the document changed or (for None) already exists.
        """
        ...

    def active(self) -> Sequence[Run]:
        """Every run that has not reached a terminal status."""
        ...

    def active_for_pipeline(self, pipeline: str) -> Sequence[Run]:
        """The active runs of one pipeline."""
        ...


class DocumentStore(Protocol):
    """Small auxiliary documents (snapshots, dedupe records, rejected events) with versions."""

    def get(self, collection: str, key: str) -> tuple[dict[str, Any] | None, Any]:
        ...

    def put(self, collection: str, key: str, data: Mapping[str, Any], version: Any) -> Any:
        """Conditional write as RunStore.save; raises ConflictError."""
        ...

    def query(self, collection: str, field_name: str, value: Any) -> Sequence[dict[str, Any]]:
        """Documents whose field equals value."""
        ...


@dataclass(frozen=True)
class Checkpoint:
    """A complete checkpoint: its step and where it is."""

    step: int
    uri: str


class CheckpointStore(Protocol):
    """Finds the latest complete checkpoint of a run."""

    def latest(self, checkpoint_uri: str) -> Checkpoint | None:
        ...


class EventPublisher(Protocol):
    """Publishes spotorch's own CloudEvents."""

    def publish(self, event: Mapping[str, Any]) -> None:
        """Publish one event in CloudEvents structured JSON form; raises on failure."""
        ...


class Clock(Protocol):
    def now(self) -> float:
        """Seconds since the epoch."""
        ...
