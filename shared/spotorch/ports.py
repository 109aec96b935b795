"""Ports: the small contracts between the service layer and the outside world.

They speak the domain's vocabulary (spotorch.domain); the domain never imports them."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from spotorch.domain import Checkpoint, JobStatus, Run
from spotorch.errors import SpotorchError
from spotorch.hardware import PROBE_LABEL
from spotorch.pipeline import Capacity, JobTemplate

# Labels that tie a job to its run and attempt: set on every job, used to find (adopt) it.
LABEL_RUN = "spotorch_run"
LABEL_ATTEMPT = "spotorch_attempt"
LABEL_PIPELINE = "spotorch_pipeline"
LABEL_BUCKET = "spotorch_bucket"  # the run's reconcile bucket: the tick's fan-out groups by it
LABEL_PROBE = PROBE_LABEL  # on every probe job (capacity or hardware); never an attempt
LIST_PAGE_SIZE = 100


MAX_LABEL_LEN = 63
_LABEL_BAD = re.compile(r"[^a-z0-9_-]")


def label_value(value: str) -> str:
    """A Vertex-valid label value (lowercase letters, digits, - and _; at most 63 characters).

    A value that had to change gets a short hash of the original, so two different run ids never
    map to one label (find() depends on it); valid values pass through unchanged.
    """
    clean = _LABEL_BAD.sub("-", value.lower())
    if clean == value and len(value) <= MAX_LABEL_LEN:
        return value
    digest = hashlib.sha256(value.encode()).hexdigest()[:8]
    return f"{clean[:MAX_LABEL_LEN - 9]}-{digest}"


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

    def list_live(self, region: str) -> Iterator[JobStatus]:
        """Every job of spotorch's in a region that has not ended (paged: about one request per
        LIST_PAGE_SIZE jobs). The reconcile tick reads these instead of one GetCustomJob each."""
        ...


class ConflictError(Exception):
    """Someone else changed the document since it was read; reload and decide again."""


class RunStore(Protocol):
    """Runs, each read and written as one document with optimistic concurrency."""

    def load(self, run_id: str) -> tuple[Run | None, Any]:
        """The run and an opaque version token (None when absent)."""
        ...

    def save(self, run: Run, version: Any, adds: Sequence[AddTo] = ()) -> Any:
        """Write the run if its version is still `version` (None: must not exist); return the new one.

        Raises ConflictError when the document changed or (for None) already exists. `adds`
        (blind counter writes, e.g. the shared Spot record's) commit with the run or not at all.
        """
        ...

    def active(self) -> Sequence[Run]:
        """Every run that has not reached a terminal status."""
        ...

    def active_for_pipeline(self, pipeline: str) -> Sequence[Run]:
        """The active runs of one pipeline."""
        ...

    def active_in_buckets(self, buckets: Sequence[int]) -> Sequence[Run]:
        """The active runs whose reconcile bucket is one of these (one indexed query each)."""
        ...


class ShardDispatcher(Protocol):
    """Hands one shard of the reconcile tick to an invocation of its own (Pub/Sub)."""

    def dispatch(self, shard: Mapping[str, Any]) -> None:
        ...


class InvalidDocument(SpotorchError):
    """A document Firestore refuses for good (over its 1 MiB size, a field it cannot hold)."""


# Firestore's limit on one document; the in-memory store enforces it too.
MAX_DOCUMENT_BYTES = 1_048_576
# Writes in one commit (a put and its adds). The client libraries document 500 per batch; the
# emulator takes more, and whether the service still refuses more is not in FACTS.md: both
# stores refuse more than this before sending, so no environment is kinder than another.
MAX_BATCH_WRITES = 500


@dataclass(frozen=True)
class AddTo:
    """A blind write that commits with a conditional put (see put): no read, no precondition
    (so writers never conflict); adds each counters[m][n] to the number at map m, key n
    (created at 0), and sets `fields`."""

    collection: str
    key: str
    counters: Mapping[str, Mapping[str, float]]
    fields: Mapping[str, Any]


def batch_problem(collection: str, key: str, adds: Sequence[AddTo]) -> str | None:
    """Why a put with these adds cannot commit as one batch; None when it can."""
    if 1 + len(adds) > MAX_BATCH_WRITES:
        return (f"{collection}/{key}: {1 + len(adds)} writes in one commit, over the "
                f"{MAX_BATCH_WRITES} a Firestore batch takes")
    return None


class DocumentStore(Protocol):
    """Small auxiliary documents (snapshots, dedupe records, rejected events) with versions."""

    def get(self, collection: str, key: str) -> tuple[dict[str, Any] | None, Any]:
        ...

    def put(self, collection: str, key: str, data: Mapping[str, Any], version: Any,
            adds: Sequence[AddTo] = ()) -> Any:
        """Conditional write as RunStore.save; raises ConflictError, or InvalidDocument when
        Firestore would refuse the document (nothing is written then). `adds` commit with it in
        one round trip (a Firestore batch): all of them or, on any error, none."""
        ...

    def query(self, collection: str, field_name: str, value: Any) -> Sequence[dict[str, Any]]:
        """Documents whose field equals value."""
        ...


@dataclass(frozen=True)
class StoredCheckpoint:
    """One checkpoint directory under a run's root, as a listing shows it."""

    step: int
    uri: str
    complete: bool  # its completion marker exists
    bytes: int  # total size of its objects


class CheckpointStore(Protocol):
    """Finds, lists and deletes the checkpoints under a run's checkpoint root."""

    def latest(self, checkpoint_uri: str) -> Checkpoint | None:
        ...

    def list(self, checkpoint_uri: str) -> Sequence[StoredCheckpoint]:
        """Every checkpoint directory under the root (complete or not), oldest first."""
        ...

    def delete(self, uri: str) -> int:
        """Delete one checkpoint (its marker first, so no reader sees it half gone); its bytes."""
        ...

    def read_report(self, uri: str, max_bytes: int) -> bytes | None:
        """A small file under a checkpoint root (a probe's report); None when it is not there.
        More than max_bytes is an error (ValueError): a report is never that large."""
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


class ObjectNotFound(SpotorchError):
    """No object at that bucket, name and generation."""


@dataclass(frozen=True)
class ObjectInfo:
    """One object generation as a listing shows it."""

    bucket: str
    name: str
    generation: int
    size: int | None = None
    updated: float | None = None  # seconds since the epoch


@dataclass(frozen=True)
class ObjectPage:
    objects: tuple[ObjectInfo, ...]
    next_page_token: str | None = None


class ObjectStore(Protocol):
    """The landing buckets, as much as intake needs of them."""

    def read(self, bucket: str, name: str, generation: int, max_bytes: int) -> bytes:
        """Up to max_bytes of one generation; ObjectNotFound when that generation is gone."""
        ...

    def exists(self, bucket: str, name: str, generation: int) -> bool:
        """Whether that generation of the object exists (one metadata read)."""
        ...

    def list_page(self, bucket: str, prefix: str, page_token: str | None,
                  page_size: int) -> ObjectPage:
        """One page of the live objects under a prefix, in name order."""
        ...
