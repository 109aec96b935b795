"""In-memory adapters for fast tests; tests/test_contract_*.py proves they behave like the real ones."""

from __future__ import annotations

import copy
import itertools
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from spotorch.core.model import Checkpoint, JobPhase, JobStatus
from spotorch.ports.job_logs import LogReadError
from spotorch.ports.jobs import LaunchError, LaunchSpec
from spotorch.ports.storage import ObjectInfo, ObjectNotFound, ObjectPage, StoredCheckpoint
from spotorch.ports.store import MAX_DOCUMENT_BYTES, AddTo, ConflictError, InvalidDocument, batch_problem
from spotorch_trainer import contract


def _document_bytes(value: Any) -> int:
    """Firestore's storage size of a value, as its documentation counts it (strings: UTF-8 bytes
    + 1; numbers, booleans, timestamps: 8; maps: the keys' sizes plus the values')."""
    if isinstance(value, str):
        return len(value.encode()) + 1
    if isinstance(value, bytes):
        return len(value)
    if isinstance(value, Mapping):
        return sum(len(str(k).encode()) + 1 + _document_bytes(v) for k, v in value.items())
    if isinstance(value, list | tuple):
        return sum(_document_bytes(v) for v in value)
    return 8


class InMemoryDocumentStore:
    """Documents in dicts, versioned by a counter; conditional writes as Firestore's preconditions."""

    def __init__(self) -> None:
        self._docs: dict[tuple[str, str], tuple[dict[str, Any], int]] = {}
        self._versions = itertools.count(1)
        self._lock = threading.Lock()
        self.round_trips = 0

    def get(self, collection: str, key: str) -> tuple[dict[str, Any] | None, Any]:
        """DocumentStore.get: a deep copy of the document and its version, or (None, None)."""
        with self._lock:
            self.round_trips += 1
            found = self._docs.get((collection, key))
            return (None, None) if found is None else (copy.deepcopy(found[0]), found[1])

    def put(self, collection: str, key: str, data: Mapping[str, Any], version: Any,
            adds: Sequence[AddTo] = ()) -> Any:
        """DocumentStore.put: written only if the version still matches, the adds with it, all or nothing."""
        too_many = batch_problem(collection, key, adds)
        if too_many:
            raise InvalidDocument(too_many)
        size = _document_bytes(data)
        if size > MAX_DOCUMENT_BYTES:  # as Firestore: refused whole, nothing written
            raise InvalidDocument(f"{collection}/{key}: document of about {size} bytes is over "
                                  f"Firestore's {MAX_DOCUMENT_BYTES}")
        with self._lock:
            self.round_trips += 1
            found = self._docs.get((collection, key))
            current = None if found is None else found[1]
            if current != version:
                raise ConflictError(f"{collection}/{key}: version {version!r} is stale")
            added = [(a, self._added(a)) for a in adds]  # all checked before anything is kept
            new_version = next(self._versions)
            self._docs[(collection, key)] = (copy.deepcopy(dict(data)), new_version)
            for a, doc in added:
                self._docs[(a.collection, a.key)] = (doc, next(self._versions))
            return new_version

    def _added(self, add: AddTo) -> dict[str, Any]:
        """The document `add` would leave (lock held); InvalidDocument if Firestore refused it."""
        found = self._docs.get((add.collection, add.key))
        doc = copy.deepcopy(found[0]) if found else {}
        for m, values in add.counters.items():
            target = doc.setdefault(m, {})
            for n, v in values.items():
                target[n] = target.get(n, 0) + v
        doc.update(copy.deepcopy(dict(add.fields)))
        if _document_bytes(doc) > MAX_DOCUMENT_BYTES:
            raise InvalidDocument(f"{add.collection}/{add.key}: over Firestore's "
                                  f"{MAX_DOCUMENT_BYTES}")
        return doc

    def query(self, collection: str, field_name: str, value: Any) -> Sequence[dict[str, Any]]:
        """DocumentStore.query: copies of the collection's documents whose field equals the value."""
        with self._lock:
            self.round_trips += 1
            return [copy.deepcopy(doc) for (coll, _), (doc, _) in self._docs.items()
                    if coll == collection and doc.get(field_name) == value]


@dataclass
class InMemoryPublisher:
    """Keeps published events in a list; can be told to fail, like Pub/Sub briefly unavailable."""

    events: list[dict[str, Any]] = field(default_factory=list)
    fail_next: int = 0

    def publish(self, event: Mapping[str, Any]) -> None:
        """EventPublisher.publish: kept in `events`, unless told to fail first."""
        if self.fail_next > 0:
            self.fail_next -= 1
            raise ConnectionError("publisher unavailable (simulated)")
        self.events.append(dict(event))

    def types(self) -> list[str]:
        """The types of the events published so far, in order."""
        return [str(e["type"]) for e in self.events]


@dataclass
class FakeJob:
    """A job held by the fake launcher; tests move it through phases."""

    spec: LaunchSpec
    status: JobStatus


class InMemoryLauncher:
    """A JobLauncher whose jobs are records that tests drive by hand."""

    def __init__(self) -> None:
        self.jobs: dict[str, FakeJob] = {}
        self.created = 0
        self.cancelled: list[str] = []
        self.listings = 0
        self.gets = 0
        self.fail_launch: LaunchError | None = None
        self._ids = itertools.count(1)
        self._lock = threading.Lock()

    def launch(self, spec: LaunchSpec) -> str:
        """JobLauncher.launch: idempotent by run and attempt, as the real launcher's job key makes it."""
        with self._lock:
            existing = self._find_locked(spec.run_id, spec.job_key)
            if existing is not None:
                return existing.job_name
            if self.fail_launch is not None:
                raise self.fail_launch
            name = f"projects/p/locations/{spec.region}/customJobs/{next(self._ids)}"
            self.jobs[name] = FakeJob(spec, JobStatus(name, JobPhase.QUEUED, labels=spec.labels))
            self.created += 1
            return name

    def _find_locked(self, run_id: str, key: int | str) -> JobStatus | None:
        for job in self.jobs.values():
            if job.spec.run_id == run_id and job.spec.job_key == str(key):
                return job.status
        return None

    def find(self, run_id: str, attempt: int) -> JobStatus | None:
        """JobLauncher.find: the job launched for this run's attempt, if any."""
        with self._lock:
            return self._find_locked(run_id, attempt)

    def get(self, job_name: str) -> JobStatus:
        """JobLauncher.get: the job's status; NOT_FOUND (permanent) for a job never launched."""
        with self._lock:
            self.gets += 1
            if job_name not in self.jobs:
                raise LaunchError(f"job {job_name} not found", permanent=True, code="NOT_FOUND")
            return self.jobs[job_name].status

    def cancel(self, job_name: str) -> None:
        """JobLauncher.cancel: recorded, and a live job ends CANCELLED at once."""
        with self._lock:
            self.cancelled.append(job_name)
            job = self.jobs.get(job_name)
            if job is not None and not job.status.phase.terminal:
                job.status = JobStatus(job_name, JobPhase.CANCELLED, labels=job.spec.labels)

    def list_live(self, region: str) -> Iterator[JobStatus]:
        """JobLauncher.list_live: the region's jobs not yet ended."""
        with self._lock:
            self.listings += 1
            live = [job.status for name, job in self.jobs.items()
                    if f"/locations/{region}/" in name and not job.status.phase.terminal]
        yield from live

    def set_status(self, job_name: str, phase: JobPhase, **kwargs: Any) -> JobStatus:
        """Move a job to a phase (test helper)."""
        with self._lock:
            job = self.jobs[job_name]
            job.status = JobStatus(job_name, phase, labels=job.spec.labels, **kwargs)
            return job.status

    def job_of(self, run_id: str, attempt: int) -> str:
        """The job name launched for a run's attempt (test helper); KeyError if none."""
        status = self.find(run_id, attempt)
        if status is None:
            raise KeyError(f"no job for {run_id} attempt {attempt}")
        return status.job_name


@dataclass
class InMemoryCheckpoints:
    """Checkpoints by root: `latest_by_uri` set by tests, or directories added with `put`."""

    latest_by_uri: dict[str, Checkpoint] = field(default_factory=dict)
    # root -> step -> (complete, bytes)
    stored: dict[str, dict[int, tuple[bool, int]]] = field(default_factory=dict)
    deleted: list[str] = field(default_factory=list)
    reports: dict[str, bytes] = field(default_factory=dict)  # uri -> bytes (probe reports)

    def read_report(self, uri: str, max_bytes: int) -> bytes | None:
        """CheckpointStore.read_report: the report tests put in `reports`; ValueError when too large."""
        data = self.reports.get(uri)
        if data is not None and len(data) > max_bytes:
            raise ValueError(f"{uri}: {len(data)} bytes, more than {max_bytes}")
        return data

    def put(self, checkpoint_uri: str, step: int, *, complete: bool = True,
            size: int = 0) -> str:
        """Add one checkpoint directory (test helper); returns its URI."""
        self.stored.setdefault(checkpoint_uri.rstrip("/"), {})[step] = (complete, size)
        return contract.checkpoint_uri(checkpoint_uri, step)

    def complete_step(self, uri: str) -> int | None:
        """CheckpointStore.complete_step: the step a complete checkpoint's URI names, or None."""
        root, _, name = uri.rstrip("/").rpartition("/")
        step = contract.parse_checkpoint_step(name)
        if step is not None and self.stored.get(root, {}).get(step, (False, 0))[0] \
                and uri.rstrip("/") == contract.checkpoint_uri(root, step):
            return step
        named = [c.step for c in self.latest_by_uri.values() if c.uri.rstrip("/") == uri.rstrip("/")]
        return named[0] if named else None

    def latest(self, checkpoint_uri: str) -> Checkpoint | None:
        """CheckpointStore.latest: the step tests set for the root, else its newest complete directory."""
        root = checkpoint_uri.rstrip("/")
        if root in self.latest_by_uri:
            return self.latest_by_uri[root]
        complete = [c for c in self.list(root) if c.complete]
        return Checkpoint(complete[-1].step, complete[-1].uri) if complete else None

    def list(self, checkpoint_uri: str) -> list[StoredCheckpoint]:
        """CheckpointStore.list: the root's checkpoint directories, oldest step first."""
        root = checkpoint_uri.rstrip("/")
        return [StoredCheckpoint(step, contract.checkpoint_uri(root, step), complete, size)
                for step, (complete, size) in sorted(self.stored.get(root, {}).items())]

    def delete(self, uri: str) -> int:
        """CheckpointStore.delete: forgets the directory and returns the bytes it held."""
        root, _, name = uri.rstrip("/").rpartition("/")
        step = contract.parse_checkpoint_step(name)
        found = self.stored.get(root, {}).pop(step, None) if step is not None else None
        self.deleted.append(uri)
        return found[1] if found else 0


@dataclass
class ManualClock:
    """A clock tests move by hand."""

    t: float = 1_800_000_000.0

    def now(self) -> float:
        """Clock.now: the time tests set."""
        return self.t

    def advance(self, seconds: float) -> None:
        """Move the time forward (test helper)."""
        self.t += seconds


class InMemoryObjectStore:
    """Objects in a dict, for tests; lists in name order, pages as GCS does."""

    def __init__(self) -> None:
        self.objects: dict[tuple[str, str, int], bytes] = {}
        self.updated: dict[tuple[str, str, int], float | None] = {}
        self.reads = 0
        self.stats = 0

    def put(self, bucket: str, name: str, generation: int, data: bytes,
            updated: float | None = None) -> None:
        """Store an object's generation (test helper), with the update time a listing reports."""
        self.objects[(bucket, name, generation)] = data
        self.updated[(bucket, name, generation)] = updated

    def read(self, bucket: str, name: str, generation: int, max_bytes: int) -> bytes:
        """ObjectStore.read: the generation's first max_bytes; ObjectNotFound if absent."""
        self.reads += 1
        try:
            return self.objects[(bucket, name, generation)][:max_bytes]
        except KeyError:
            raise ObjectNotFound(f"gs://{bucket}/{name}#{generation}") from None

    def exists(self, bucket: str, name: str, generation: int) -> bool:
        """ObjectStore.exists: whether that generation is stored (counted, as a GCS stat)."""
        self.stats += 1
        return (bucket, name, generation) in self.objects

    def ensure_file(self, uri: str, path: str) -> bool:
        """ObjectStore.ensure_file: uploads the file unless the object exists; True if it uploaded."""
        bucket, _, name = uri.removeprefix("gs://").partition("/")
        if any(b == bucket and n == name for b, n, _ in self.objects):
            return False
        with open(path, "rb") as fh:
            self.put(bucket, name, 1, fh.read())
        return True

    def list_page(self, bucket: str, prefix: str, page_token: str | None,
                  page_size: int) -> ObjectPage:
        """ObjectStore.list_page: the newest generation of each name under the prefix, a page at a time."""
        live: dict[str, int] = {}
        for b, name, generation in self.objects:
            if b == bucket and name.startswith(prefix):
                live[name] = max(generation, live.get(name, 0))
        names = sorted(n for n in live if page_token is None or n > page_token)
        page = names[:page_size]
        objects = tuple(ObjectInfo(bucket, n, live[n], len(self.objects[(bucket, n, live[n])]),
                                   self.updated.get((bucket, n, live[n]))) for n in page)
        return ObjectPage(objects, page[-1] if len(names) > page_size else None)


@dataclass
class InMemoryShardDispatcher:
    """Collects the tick's shard messages; a test hands them to reconcile_shard."""

    shards: list[Mapping[str, Any]] = field(default_factory=list)

    def dispatch(self, shard: Mapping[str, Any]) -> None:
        """ShardDispatcher.dispatch: kept in `shards` for the test to hand on."""
        self.shards.append(copy.deepcopy(dict(shard)))


@dataclass
class InMemoryJobLogs:
    """ports.JobLogs: each job's stderr lines as a test writes them, with their times (what
    Cloud Logging would hold at severity ERROR); can be told to fail, as over quota."""

    stderr: dict[str, list[tuple[float, str]]] = field(default_factory=dict)  # oldest first
    fail_next: int = 0
    reads: int = 0

    def write(self, job_name: str, *lines: str, at: float = 0.0) -> None:
        """Add stderr lines for a job at a time (test helper)."""
        self.stderr.setdefault(job_name, []).extend((at, line) for line in lines)

    def error_tail(self, job_name: str, *, since: float | None, limit: int) -> tuple[str, ...]:
        """JobLogs.error_tail: the job's last lines since a time; can fail as over quota."""
        self.reads += 1
        if self.fail_next:
            self.fail_next -= 1
            raise LogReadError("RESOURCE_EXHAUSTED: read requests per minute")
        lines = [line for at, line in self.stderr.get(job_name, [])
                 if since is None or at >= since]
        return tuple(lines[-limit:]) if limit > 0 else ()
