"""A local Vertex AI JobService: runs custom jobs as local processes, preempts Spot jobs like GCE.

The real aiplatform_v1.JobServiceClient talks to it over insecure gRPC; docs/vertex-emulator.md.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import logging
import os
import random
import re
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from types import TracebackType
from typing import Any

from spotorch import job_events
from spotorch.local._vertex_filter import FilterError, matches, parse_filter
from spotorch.local._vertex_schedule import (
    ScheduleError,
    SpotSchedule,
    SpotTrace,
    Window,
    load_schedule,
    parse_schedule,
)
from spotorch.local._vertex_workers import Replica, SpawnError, kill, spawn
from spotorch.settings import TOPIC_JOB_EVENTS
from spotorch.vertex import JobState

log = logging.getLogger("spotorch.local.vertex_emulator")

SERVICE = "google.cloud.aiplatform.v1.JobService"
READY_LINE = "vertex emulator listening on {address}"
TERMINAL = frozenset({JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED})
DEFAULT_TIMEOUT_S = 7 * 24 * 3600.0

# google.rpc.Code numbers of the errors the emulator puts on jobs.
CODE_CANCELLED = 1
CODE_INVALID_ARGUMENT = 3  # what Vertex reports for a replica that exits non-zero
CODE_DEADLINE_EXCEEDED = 4
CODE_RESOURCE_EXHAUSTED = 8  # our choice for Spot preemption (Vertex: "a STOCKOUT error")


class EmulatorError(RuntimeError):
    """The emulator could not start or was misused."""


class _Invalid(Exception):
    """A request the real service would refuse; carries the gRPC status name."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


def _utc(ts: float) -> datetime:
    return datetime.fromtimestamp(ts, UTC)


@dataclass
class _Stop:
    """A job being stopped: its workers got SIGTERM; at kill_at the rest get SIGKILL."""

    end_state: JobState
    error_code: int
    error_message: str
    kill_at: float


@dataclass
class _Job:
    """The emulator's record of one custom job; `proto` is what Get returns."""

    proto: Any  # aiplatform_v1.CustomJob
    job_id: str
    region: str
    spot: bool
    timeout_s: float
    log_dir: Path
    since: float  # monotonic time of the last state change
    started: float | None = None  # monotonic time it started running
    replicas: list[Replica] = field(default_factory=list)
    stop: _Stop | None = None
    events: itertools.count[int] = field(default_factory=itertools.count)

    @property
    def state(self) -> JobState:
        return JobState(int(self.proto.state))


class _EventSink:
    """Publishes job-state LogEntries to a Pub/Sub topic of the Pub/Sub emulator, dropping some."""

    def __init__(self, project: str, topic: str | None, drop: float, rng: random.Random) -> None:
        self.project = project
        self.topic = topic
        self.drop = drop
        self.rng = rng
        self.published = 0
        self.dropped = 0
        self._client: Any = None
        self._path = ""

    def start(self) -> None:
        if not self.topic:
            return
        if not os.environ.get("PUBSUB_EMULATOR_HOST"):
            # A dev tool must never publish to a real project by accident.
            log.warning("PUBSUB_EMULATOR_HOST is not set: job-state messages are not published")
            self.topic = None
            return
        from google.api_core import exceptions
        from google.api_core.retry import Retry
        from google.cloud.pubsub_v1 import PublisherClient

        client = PublisherClient()
        self._path = (self.topic if self.topic.startswith("projects/")
                      else client.topic_path(self.project, self.topic))
        try:
            with contextlib.suppress(exceptions.AlreadyExists):
                client.create_topic(name=self._path, retry=Retry(timeout=10), timeout=5)
        except exceptions.GoogleAPIError as exc:
            # Polling still works without these messages: say so loudly, keep serving.
            log.error("cannot create %s (%s): job-state messages are not published",
                      self._path, exc)
            return
        self._client = client

    def publish(self, entry: Mapping[str, Any]) -> None:
        if self._client is None:
            return
        if self.drop and self.rng.random() < self.drop:
            self.dropped += 1
            return
        future = self._client.publish(self._path, job_events.encode(entry),
                                      **job_events.message_attributes(entry))
        future.add_done_callback(self._done)
        self.published += 1

    @staticmethod
    def _done(future: Any) -> None:
        if future.exception() is not None:
            log.error("publishing a job-state message failed: %s", future.exception())

    def stop(self) -> None:
        if self._client is not None:
            with contextlib.suppress(Exception):
                self._client.stop()
            self._client = None


_LABEL_KEY = re.compile(r"^[a-z][a-z0-9_-]{0,62}$")
_LABEL_VALUE = re.compile(r"^[a-z0-9_-]{0,63}$")


def _validate_labels(labels: Mapping[str, str]) -> None:
    if len(labels) > 64:
        raise _Invalid("INVALID_ARGUMENT", "at most 64 labels are allowed")
    for k, v in labels.items():
        if not _LABEL_KEY.match(k) or not _LABEL_VALUE.match(v):
            raise _Invalid("INVALID_ARGUMENT", f"invalid label {k}={v!r}: keys and values must "
                           "be lowercase letters, digits, - or _ (at most 63 characters; keys "
                           "start with a letter)")


def _parse_parent(parent: str) -> tuple[str, str]:
    parts = parent.split("/")
    if len(parts) != 4 or parts[0] != "projects" or parts[2] != "locations" \
            or not parts[1] or not parts[3]:
        raise _Invalid("INVALID_ARGUMENT", f"invalid parent {parent!r}: "
                       "expected projects/PROJECT/locations/REGION")
    return parts[1], parts[3]


class VertexEmulator:
    """The emulator: a gRPC JobService on host:port and a thread that moves jobs through states."""

    def __init__(self, project: str | None = None, *, host: str = "127.0.0.1", port: int = 0,
                 schedule: SpotSchedule | Mapping[str, Any] | Sequence[Any] | str | Path
                 | None = None,
                 trace: str | Path | SpotTrace | None = None, trace_speed: float = 1.0,
                 trace_offset: int = 0, stockout_from_s: float | None = None,
                 stockout_for_s: float | None = None, grace_s: float = 30.0,
                 workdir: str | Path | None = None,
                 job_events_topic: str | None = TOPIC_JOB_EVENTS, drop_events: float = 0.0,
                 seed: int | None = None, queued_s: float = 0.5, pending_s: float = 0.5,
                 tick_s: float = 0.05,
                 listener: Callable[[Mapping[str, Any]], None] | None = None) -> None:
        """project None: serve any project. schedule: a SpotSchedule, its JSON form or a JSON file.

        trace: a spot trace file replayed at trace_speed from trace_offset; stockout_from_s /
        stockout_for_s (None: forever): Spot capacity gone in that window. Times count from start().
        listener: called with every job-state LogEntry (dropped ones too), for tests and tools.
        """
        if not 0.0 <= drop_events <= 1.0:
            raise EmulatorError("drop_events is a fraction between 0 and 1")
        self.project = project
        self.host = host
        self.port = port
        self.schedule = self._schedule(schedule, trace, trace_speed, trace_offset,
                                       stockout_from_s, stockout_for_s)
        self.grace_s = grace_s
        self.workdir = Path(workdir) if workdir else None  # None: a new temporary one at start
        self.queued_s = queued_s
        self.pending_s = pending_s
        self.tick_s = tick_s
        self.listener = listener
        self._sink = _EventSink(project or "spotorch-local", job_events_topic or None,
                                drop_events, random.Random(seed))
        self._jobs: dict[str, _Job] = {}
        self._lock = threading.RLock()
        self._outbox: list[dict[str, Any]] = []
        self._ids = itertools.count(time.time_ns() // 1000)
        self._t0 = time.monotonic()
        self._server: Any = None
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()

    @staticmethod
    def _schedule(schedule: Any, trace: Any, speed: float, offset: int,
                  stockout_from_s: float | None, stockout_for_s: float | None) -> SpotSchedule:
        try:
            if schedule is None:
                result = SpotSchedule()
            elif isinstance(schedule, SpotSchedule):
                result = schedule
            elif isinstance(schedule, str | Path):
                result = load_schedule(schedule)
            else:
                result = parse_schedule(schedule)
            if trace is not None:
                result = result.with_trace(trace if isinstance(trace, SpotTrace)
                                           else SpotTrace.load(trace, speed=speed, offset=offset))
            if stockout_from_s is not None or stockout_for_s is not None:
                result = result.with_stockout(Window(stockout_from_s or 0.0, stockout_for_s))
        except ScheduleError as exc:
            raise EmulatorError(str(exc)) from exc
        return result

    # --- lifecycle ------------------------------------------------------------------------------

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def events_published(self) -> int:
        return self._sink.published

    @property
    def events_dropped(self) -> int:
        return self._sink.dropped

    def start(self) -> str:
        """Serve on host:port (port 0: a free one) and return the address."""
        from concurrent import futures

        import grpc

        if self.workdir is None:
            self.workdir = Path(tempfile.mkdtemp(prefix="vertex-emu-"))
        self.workdir.mkdir(parents=True, exist_ok=True)
        self._sink.start()
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=8,
                                                        thread_name_prefix="vertex-emu-rpc"))
        server.add_generic_rpc_handlers((self._handlers(),))
        port = server.add_insecure_port(f"{self.host}:{self.port}")
        if not port:
            raise EmulatorError(f"cannot listen on {self.host}:{self.port}")
        self.port = port
        self._t0 = time.monotonic()
        server.start()
        self._server = server
        self._thread = threading.Thread(target=self._run, name="vertex-emu-jobs", daemon=True)
        self._thread.start()
        log.info("vertex emulator on %s, workdir %s", self.address, self.workdir)
        return self.address

    def stop(self) -> None:
        """Stop serving and kill every worker."""
        self._stopping.set()
        if self._server is not None:
            self._server.stop(grace=0.5).wait(2)
            self._server = None
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
        with self._lock:
            for job in self._jobs.values():
                kill(job.replicas)
        self._sink.stop()

    def __enter__(self) -> VertexEmulator:
        if self._server is None:
            self.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    # --- test and operator helpers --------------------------------------------------------------

    def job(self, job_name: str) -> Any:
        """A copy of a job as Get returns it (KeyError when unknown)."""
        with self._lock:
            return self._copy(self._jobs[job_name].proto)

    def log_dir(self, job_name: str) -> Path:
        """Where a job's replicas write their logs (workerpoolP-I.log)."""
        with self._lock:
            return self._jobs[job_name].log_dir

    def preempt(self, job_name: str) -> bool:
        """Preempt a running job now, whatever its strategy; False if it is not running."""
        with self._lock:
            job = self._jobs[job_name]
            if job.state is not JobState.RUNNING or job.stop is not None:
                return False
            self._begin_stop(job, time.monotonic(), *self._preemption_error(job))
            return True

    # --- the state machine ----------------------------------------------------------------------

    def _run(self) -> None:
        while not self._stopping.wait(self.tick_s):
            try:
                self._tick()
            except Exception:  # one bad tick must not stop every job forever
                log.exception("vertex emulator tick failed")

    def _tick(self) -> None:
        now = time.monotonic()
        spot_ok = self.schedule.spot_available(now - self._t0)
        with self._lock:
            for job in list(self._jobs.values()):
                self._advance(job, now, spot_ok)
            outbox, self._outbox = self._outbox, []
        for entry in outbox:
            try:
                self._sink.publish(entry)
                if self.listener is not None:
                    self.listener(entry)
            except Exception:
                log.exception("publishing a job-state message failed")

    def _advance(self, job: _Job, now: float, spot_ok: bool) -> None:
        state = job.state
        if state in TERMINAL:
            return
        if job.stop is not None:
            self._progress_stop(job, now)
            return
        capacity = spot_ok or not job.spot
        if state is JobState.QUEUED:
            if now - job.since >= self.queued_s and capacity:
                self._set_state(job, JobState.PENDING, now)
        elif state is JobState.PENDING:
            if now - job.since >= self.pending_s and capacity:
                self._start_workers(job, now)
        elif state is JobState.RUNNING:
            self._watch(job, now, spot_ok)

    def _start_workers(self, job: _Job, now: float) -> None:
        try:
            job.replicas = spawn(job.proto.job_spec, job.job_id, job.log_dir, os.environ)
        except SpawnError as exc:
            message = (f"The replica {exc.replica} exited with a non-zero status of 127. "
                       f"Termination reason: ContainerCannotRun. {exc}")
            self._set_state(job, JobState.FAILED, now, CODE_INVALID_ARGUMENT, message)
            return
        job.started = now
        self._set_state(job, JobState.RUNNING, now)

    def _watch(self, job: _Job, now: float, spot_ok: bool) -> None:
        codes = [(r, r.exit_code()) for r in job.replicas]
        failed = next(((r, c) for r, c in codes if c not in (None, 0)), None)
        if failed is not None:
            replica, code = failed
            # Vertex shuts the whole job down when a replica fails for good.
            self._begin_stop(job, now, JobState.FAILED, CODE_INVALID_ARGUMENT,
                             f"The replica {replica.name} exited with a non-zero status of {code}."
                             f" Termination reason: Error. To find out more about why your job "
                             f"exited please check the logs: {replica.log_path}")
            return
        if all(c == 0 for _, c in codes):
            self._set_state(job, JobState.SUCCEEDED, now)
            return
        ran = now - (job.started or now)
        if job.spot:
            after = self.schedule.preempt_after(job.proto.labels)
            if not spot_ok or (after is not None and ran >= after):
                self._begin_stop(job, now, *self._preemption_error(job))
                return
        if ran >= job.timeout_s:
            self._begin_stop(job, now, JobState.FAILED, CODE_DEADLINE_EXCEEDED,
                             f"Job exceeded its scheduling timeout of {job.timeout_s:g} seconds "
                             "and was stopped.")

    def _preemption_error(self, job: _Job) -> tuple[JobState, int, str]:
        names = ", ".join(r.name for r in job.replicas) or "the job"
        return (JobState.FAILED, CODE_RESOURCE_EXHAUSTED,
                f"STOCKOUT: the Spot VMs of {names} were preempted by Compute Engine in "
                f"{job.region} (workers got SIGTERM and {self.grace_s:g}s before SIGKILL).")

    def _begin_stop(self, job: _Job, now: float, end_state: JobState, code: int,
                    message: str) -> None:
        job.stop = _Stop(end_state, code, message, now + self.grace_s)
        log.info("%s: stopping (%s): %s", job.proto.name, end_state.name, message)
        for replica in job.replicas:
            replica.signal(signal.SIGTERM)
        self._progress_stop(job, now)

    def _progress_stop(self, job: _Job, now: float) -> None:
        stop = job.stop
        assert stop is not None
        if any(r.exit_code() is None for r in job.replicas) and now < stop.kill_at:
            return
        kill(job.replicas)
        job.stop = None
        self._set_state(job, stop.end_state, now, stop.error_code, stop.error_message)

    def _set_state(self, job: _Job, state: JobState, now: float, error_code: int = 0,
                   error_message: str = "") -> None:
        previous = job.state
        wall = time.time()
        proto = job.proto
        proto.state = int(state)
        proto.update_time = _utc(wall)
        if state is JobState.RUNNING:
            proto.start_time = _utc(wall)
        if state in TERMINAL:
            proto.end_time = _utc(wall)
            kill(job.replicas)  # whatever the workers left running goes with the VMs
        if error_code or error_message:
            proto.error = {"code": error_code, "message": error_message}
        job.since = now
        log.info("%s: %s -> %s %s", proto.name, previous.name, state.name, error_message)
        self._outbox.append(self._entry(job, previous if previous is not state else None))

    def _entry(self, job: _Job, previous: JobState | None) -> dict[str, Any]:
        proto = job.proto

        def ts(value: datetime | None) -> float | None:
            return None if value is None else value.timestamp()

        return job_events.build_log_entry(
            job_name=proto.name, state=job.state, previous_state=previous,
            display_name=proto.display_name, labels=dict(proto.labels),
            error_code=int(proto.error.code), error_message=str(proto.error.message),
            create_time=ts(proto.create_time), start_time=ts(proto.start_time),
            end_time=ts(proto.end_time), update_time=ts(proto.update_time) or time.time(),
            insert_id=f"{job.job_id}-{next(job.events)}")

    # --- the JobService -------------------------------------------------------------------------

    @staticmethod
    def _copy(proto: Any) -> Any:
        return type(proto).deserialize(type(proto).serialize(proto))

    def _check_project(self, project: str) -> None:
        if self.project is not None and project != self.project:
            raise _Invalid("PERMISSION_DENIED", f"project {project!r} is not served by this "
                           f"emulator (it serves {self.project!r})")

    def _validated(self, request: Any) -> tuple[str, str, Any]:
        project, region = _parse_parent(request.parent)
        self._check_project(project)
        job = request.custom_job
        if not job.display_name:
            raise _Invalid("INVALID_ARGUMENT", "display_name is required")
        pools = list(job.job_spec.worker_pool_specs)
        if not pools or not pools[0].replica_count:
            raise _Invalid("INVALID_ARGUMENT", "worker_pool_specs[0] with replica_count >= 1 "
                           "is required")
        for i, pool in enumerate(pools):
            if pool.replica_count and not pool.machine_spec.machine_type:
                raise _Invalid("INVALID_ARGUMENT", f"worker_pool_specs[{i}].machine_spec."
                               "machine_type is required")
            if pool.replica_count and not (pool.container_spec.command
                                           or pool.container_spec.args
                                           or pool.python_package_spec.python_module):
                raise _Invalid("INVALID_ARGUMENT", f"worker_pool_specs[{i}]: the emulator runs "
                               "commands, not images: set container_spec.command")
        _validate_labels(job.labels)
        return project, region, job

    def create(self, request: Any) -> Any:
        """CreateCustomJob: store the job QUEUED and return it."""
        from google.cloud import aiplatform_v1 as v1

        project, region, job = self._validated(request)
        proto = self._copy(job)
        job_id = str(next(self._ids))
        proto.name = f"projects/{project}/locations/{region}/customJobs/{job_id}"
        proto.state = v1.JobState.JOB_STATE_QUEUED
        now = time.time()
        proto.create_time = _utc(now)
        proto.update_time = _utc(now)
        for key in ("start_time", "end_time", "error"):
            proto._pb.ClearField(key)
        scheduling = job.job_spec.scheduling
        timeout = scheduling.timeout
        record = _Job(proto=proto, job_id=job_id, region=region,
                      spot=scheduling.strategy == v1.Scheduling.Strategy.SPOT,
                      timeout_s=timeout.total_seconds() if timeout else DEFAULT_TIMEOUT_S,
                      log_dir=(self.workdir or Path(".")) / job_id, since=time.monotonic())
        with self._lock:
            self._jobs[proto.name] = record
            self._outbox.append(self._entry(record, None))
            log.info("%s: created (%s) %s", proto.name, "SPOT" if record.spot else "not spot",
                     dict(proto.labels))
            return self._copy(proto)

    def get(self, request: Any) -> Any:
        """GetCustomJob."""
        with self._lock:
            job = self._jobs.get(request.name)
            if job is None:
                raise _Invalid("NOT_FOUND", f"CustomJob {request.name} not found")
            return self._copy(job.proto)

    def cancel(self, request: Any) -> Any:
        """CancelCustomJob: CANCELLING now; CANCELLED once the workers are gone."""
        from google.protobuf import empty_pb2

        with self._lock:
            job = self._jobs.get(request.name)
            if job is None:
                raise _Invalid("NOT_FOUND", f"CustomJob {request.name} not found")
            if job.state in TERMINAL:
                raise _Invalid("FAILED_PRECONDITION", f"CustomJob {request.name} is in state "
                               f"JOB_STATE_{job.state.name} and cannot be cancelled")
            if job.state is not JobState.CANCELLING:
                now = time.monotonic()
                kill_at = job.stop.kill_at if job.stop else now + self.grace_s
                if job.stop is None:
                    for replica in job.replicas:
                        replica.signal(signal.SIGTERM)
                job.stop = _Stop(JobState.CANCELLED, CODE_CANCELLED, "CANCELED", kill_at)
                self._set_state(job, JobState.CANCELLING, now)
        return empty_pb2.Empty()

    def list(self, request: Any) -> Any:
        """ListCustomJobs with the labels/display_name/state filter, newest first, paged."""
        from google.cloud import aiplatform_v1 as v1

        project, _ = _parse_parent(request.parent)
        self._check_project(project)
        try:
            terms = parse_filter(request.filter)
        except FilterError as exc:
            raise _Invalid("INVALID_ARGUMENT", str(exc)) from exc
        prefix = f"{request.parent}/customJobs/"
        with self._lock:
            found = [self._copy(j.proto) for name, j in self._jobs.items()
                     if name.startswith(prefix)
                     and matches(terms, j.proto.labels, j.proto.display_name,
                                 f"JOB_STATE_{j.state.name}")]
        found.reverse()
        size = request.page_size if request.page_size > 0 else 100
        start = int(request.page_token) if request.page_token.isdigit() else 0
        page = found[start:start + size]
        token = str(start + size) if start + size < len(found) else ""
        return v1.ListCustomJobsResponse(custom_jobs=page, next_page_token=token)

    def _handlers(self) -> Any:
        import grpc
        from google.cloud import aiplatform_v1 as v1
        from google.protobuf import empty_pb2

        def rpc(fn: Any, request_type: Any, serialize: Any) -> Any:
            def handle(request: Any, context: Any) -> Any:
                try:
                    return fn(request)
                except _Invalid as exc:
                    context.abort(getattr(grpc.StatusCode, exc.code), str(exc))
            return grpc.unary_unary_rpc_method_handler(
                handle, request_deserializer=request_type.deserialize,
                response_serializer=serialize)

        return grpc.method_handlers_generic_handler(SERVICE, {
            "CreateCustomJob": rpc(self.create, v1.CreateCustomJobRequest, v1.CustomJob.serialize),
            "GetCustomJob": rpc(self.get, v1.GetCustomJobRequest, v1.CustomJob.serialize),
            "CancelCustomJob": rpc(self.cancel, v1.CancelCustomJobRequest,
                                   empty_pb2.Empty.SerializeToString),
            "ListCustomJobs": rpc(self.list, v1.ListCustomJobsRequest,
                                  v1.ListCustomJobsResponse.serialize),
        })


# --- command line ---------------------------------------------------------------------------------

def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m spotorch.local.vertex_emulator",
                                description="Local Vertex AI JobService emulator (gRPC).")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0, help="0: a free port")
    p.add_argument("--project", default=None, help="serve only this project (default: any)")
    p.add_argument("--job-events-topic", default=TOPIC_JOB_EVENTS,
                   help="Pub/Sub topic for job-state messages ('' to disable); needs "
                        "PUBSUB_EMULATOR_HOST")
    p.add_argument("--schedule", help="preemption schedule JSON file")
    p.add_argument("--every-spot-job-after-s", type=float,
                   help="preempt every SPOT job this long after it starts")
    p.add_argument("--trace", help="spot availability trace to replay (0 = no Spot capacity)")
    p.add_argument("--trace-speed", type=float, default=1.0,
                   help="trace seconds per wall-clock second")
    p.add_argument("--trace-offset", type=int, default=0, help="trace tick to start at")
    p.add_argument("--stockout-from-s", type=float,
                   help="Spot capacity gone from this many seconds after start")
    p.add_argument("--stockout-for-s", type=float, help="... for this long (default: forever)")
    p.add_argument("--grace-s", type=float, default=30.0,
                   help="seconds between SIGTERM and SIGKILL on preemption or cancel")
    p.add_argument("--workdir", help="where worker logs go (default: a new temporary directory)")
    p.add_argument("--drop-events", type=float, default=0.0,
                   help="fraction of job-state messages to drop (1: all)")
    p.add_argument("--seed", type=int, help="random seed for --drop-events")
    p.add_argument("--queued-s", type=float, default=0.5, help="least time in QUEUED")
    p.add_argument("--pending-s", type=float, default=0.5, help="least time in PENDING")
    return p


def main(argv: list[str] | None = None) -> int:
    """Run the emulator until SIGTERM or SIGINT; print one ready line to stdout."""
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s vertex-emulator %(levelname)s %(message)s")
    try:
        schedule: Any = args.schedule
        if args.every_spot_job_after_s is not None:
            base = load_schedule(args.schedule) if args.schedule else SpotSchedule()
            schedule = SpotSchedule(base.rules, args.every_spot_job_after_s, base.stockouts)
        emulator = VertexEmulator(
            args.project, host=args.host, port=args.port, schedule=schedule, trace=args.trace,
            trace_speed=args.trace_speed, trace_offset=args.trace_offset,
            stockout_from_s=args.stockout_from_s, stockout_for_s=args.stockout_for_s,
            grace_s=args.grace_s, workdir=args.workdir, job_events_topic=args.job_events_topic,
            drop_events=args.drop_events, seed=args.seed, queued_s=args.queued_s,
            pending_s=args.pending_s)
        address = emulator.start()
    except (EmulatorError, ScheduleError) as exc:
        print(f"vertex emulator: {exc}", file=sys.stderr)
        return 2
    done = threading.Event()

    def on_signal(signum: int, frame: Any) -> None:
        done.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    print(READY_LINE.format(address=address), flush=True)
    try:
        while not done.wait(0.5):
            pass
    finally:
        emulator.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
