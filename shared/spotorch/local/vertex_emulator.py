"""A local Vertex AI JobService: runs custom jobs as local processes, preempts Spot jobs like GCE.

The real aiplatform_v1.JobServiceClient talks to it over insecure gRPC; docs/vertex-emulator.md.
"""

from __future__ import annotations

import json
import logging
import random
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import SimpleNamespace, TracebackType
from typing import Any

import click

from spotorch.adapters.gcp.vertex import JobState
from spotorch.commandline import CONTEXT, run
from spotorch.local import _vertex_logs as logs
from spotorch.local._vertex_endpoints import EndpointServices
from spotorch.local._vertex_iam import IamPolicy
from spotorch.local._vertex_jobs import JobStore
from spotorch.local._vertex_logging import LoggingService
from spotorch.local._vertex_logs import LogFormat, LogFormatError
from spotorch.local._vertex_monitoring import MonitoringService
from spotorch.local._vertex_publisher import LogPublisher
from spotorch.local._vertex_quota import QuotaLimits, QuotaMeter
from spotorch.local._vertex_registry import RegistryServices
from spotorch.local._vertex_resources import ResourceQuotas
from spotorch.local._vertex_runner import FAIL_JOB, REPLICA_PREEMPTION, JobRunner
from spotorch.local._vertex_schedule import (
    ScheduleError,
    SpotSchedule,
    SpotTrace,
    Window,
    load_schedule,
    parse_schedule,
)
from spotorch.local._vertex_service import SERVICE, JobService, copy
from spotorch.local._vertex_vizier import VizierService
from spotorch.local._vertex_workers import kill
from spotorch.settings import TOPIC_JOB_EVENTS

log = logging.getLogger("spotorch.local.vertex_emulator")

__all__ = ["READY_LINE", "SERVICE", "EmulatorError", "IamPolicy", "LogFormat", "QuotaLimits",
           "VertexEmulator", "main"]

READY_LINE = "vertex emulator listening on {address}"
JOBS_FILE = "jobs.json"  # in the workdir, with persist=True


class EmulatorError(RuntimeError):
    """The emulator could not start or was misused."""


class VertexEmulator:
    """The emulator: a gRPC JobService on host:port and a thread that moves jobs through states.

    It composes a JobStore (the jobs), a JobRunner (states, workers, preemption), a JobService
    (the RPCs, with quotas) and a LogPublisher (the log sink's messages).
    """

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
                 listener: Callable[[Mapping[str, Any]], None] | None = None,
                 log_format: LogFormat | None = None, quotas: QuotaLimits | None = None,
                 persist: bool = False, synthetic_run_s: float | None = None,
                 memory_limits_mb: Mapping[str, float] | None = None,
                 iam: IamPolicy | None = None,
                 resource_quotas: ResourceQuotas | Mapping[str, Any] | None = None,
                 replica_preemption: str = FAIL_JOB, metrics_period_s: float = 60.0,
                 metrics_delay_s: float = 0.0) -> None:
        """project None: serve any project. schedule: a SpotSchedule, its JSON form or a JSON file.

        trace: a spot trace file replayed at trace_speed from trace_offset; stockout_from_s /
        stockout_for_s (None: forever): Spot capacity gone in that window. Times count from start().
        listener: called with every log entry (dropped ones too), for tests and tools.
        log_format: which service lines each state writes (default: Vertex's, as far as known).
        quotas: requests per minute per region (default Vertex's; QuotaLimits.unlimited()).
        persist: keep the jobs in WORKDIR/jobs.json and take them up again at the next start.
        synthetic_run_s: run no worker processes; each job runs this long and succeeds (unless
        preempted). For scale benchmarks: thousands of jobs on two cores.
        memory_limits_mb: machine type -> MiB; a replica past its machine's memory is OOM-killed.
        iam: callers' tokens and grants; every call is then checked as Vertex checks it
        (UNAUTHENTICATED, PERMISSION_DENIED). None: nobody is checked.
        resource_quotas: GPUs, TPUs and CPUs per region ({"us-central1": {"custom_model_training_
        nvidia_l4_gpus": 0}, "*": {...}}); CreateCustomJob past one is RESOURCE_EXHAUSTED.
        replica_preemption: what a schedule rule preempting one replica's VM does, which Google
        does not document: "fail_job" (the job fails with STOCKOUT; the default) or
        "restart_replica" (that replica restarts in place, the job runs on).
        metrics_period_s, metrics_delay_s: Cloud Monitoring's endpoint metrics are one point per
        period (Vertex: 60 s), visible this long after their period closed (_vertex_monitoring).
        """
        if not 0.0 <= drop_events <= 1.0:
            raise EmulatorError("drop_events is a fraction between 0 and 1")
        if persist and workdir is None:
            raise EmulatorError("persist needs a workdir")
        self.project = project
        self.host = host
        self.port = port
        self.schedule = self._schedule(schedule, trace, trace_speed, trace_offset,
                                       stockout_from_s, stockout_for_s)
        self.workdir = Path(workdir) if workdir else None  # None: a new temporary one at start
        self.tick_s = tick_s
        self.listener = listener
        self.log_format = log_format or LogFormat()
        self._publisher = LogPublisher(project or "spotorch-local", job_events_topic or None,
                                       drop_events, random.Random(seed))
        self._store = JobStore(self.workdir / JOBS_FILE if persist and self.workdir else None)
        self._runner = JobRunner(grace_s=grace_s, queued_s=queued_s, pending_s=pending_s,
                                 on_change=lambda record: self._store.save(),
                                 synthetic_run_s=synthetic_run_s,
                                 memory_limits_mb=memory_limits_mb,
                                 replica_preemption=replica_preemption)
        self._service = JobService(project, self._store, self._runner,
                                   QuotaMeter(quotas or QuotaLimits()),
                                   lambda: self.workdir or Path("."), iam=iam,
                                   resources=self._resources(resource_quotas))
        # Model Registry and Experiments (ModelService, MetadataService, operations): in memory.
        self.registry = RegistryServices(project, iam=iam)
        # Endpoints and predictions (issue 37): each deployed model a local prediction server.
        self.endpoints = EndpointServices(self.registry, seed=seed)
        # Vizier: studies and trials in memory, suggestions from Optuna (its operations: the registry's).
        self.vizier = VizierService(project, self.registry, seed=seed, iam=iam)
        # Cloud Logging's ListLogEntries over the jobs' output (the error tail of a failed job).
        self.logging = LoggingService(project, lambda: self.workdir or Path("."), iam=iam)
        # Cloud Monitoring's ListTimeSeries over the endpoints' predictions (a canary's traffic).
        self.monitoring = MonitoringService(project, self.endpoints, iam=iam,
                                            sample_period_s=metrics_period_s,
                                            visible_after_s=metrics_delay_s)
        self._t0 = time.monotonic()
        self._server: Any = None
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()

    @staticmethod
    def _resources(quotas: ResourceQuotas | Mapping[str, Any] | None) -> ResourceQuotas | None:
        try:
            return quotas if quotas is None or isinstance(quotas, ResourceQuotas) \
                else ResourceQuotas.parse(quotas)
        except ValueError as exc:
            raise EmulatorError(str(exc)) from exc

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
        """host:port the emulator serves on (a client's endpoint)."""
        return f"{self.host}:{self.port}"

    @property
    def grace_s(self) -> float:
        """Seconds between SIGTERM and SIGKILL of a preempted or cancelled replica."""
        return self._runner.grace_s

    @property
    def events_published(self) -> int:
        """Job-state messages published to Pub/Sub so far."""
        return self._publisher.published

    @property
    def events_dropped(self) -> int:
        """Job-state messages the schedule dropped (a lossy log sink)."""
        return self._publisher.dropped

    @property
    def quotas(self) -> QuotaLimits:
        """The request quotas enforced now."""
        return self._service.quota.limits

    @quotas.setter
    def quotas(self, limits: QuotaLimits) -> None:
        """Change the limits while serving (a benchmark sets up without them, measures with)."""
        self._service.quota.limits = limits

    @property
    def resource_quotas(self) -> ResourceQuotas | None:
        """The GPU, TPU and CPU quotas per region, or None (unlimited)."""
        return self._service.resources

    @resource_quotas.setter
    def resource_quotas(self, quotas: ResourceQuotas | None) -> None:
        """Change the resource quotas while serving (raise one, as an operator would)."""
        self._service.resources = quotas

    def start(self) -> str:
        """Serve on host:port (port 0: a free one) and return the address."""
        from concurrent import futures

        import grpc

        if self.workdir is None:
            self.workdir = Path(tempfile.mkdtemp(prefix="vertex-emu-"))
        self.workdir.mkdir(parents=True, exist_ok=True)
        self._publisher.start()
        self._recover()
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=8,
                                                        thread_name_prefix="vertex-emu-rpc"))
        server.add_generic_rpc_handlers((self._service.handlers(), *self.registry.handlers(),
                                         self.logging.handlers(), *self.endpoints.handlers(),
                                         self.vizier.handlers(), self.monitoring.handlers()))
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

    def _recover(self) -> None:
        """Take up the saved jobs: those whose workers died with the last emulator end."""
        now = time.monotonic()
        with self._store.lock:
            loaded = self._store.load(now)
            for record in loaded:
                self._runner.recover(record, now)
            if loaded:
                log.info("took up %d saved jobs from %s", len(loaded), self._store.path)
                self._store.save()

    def stop(self) -> None:
        """Stop serving and kill every worker."""
        self._stopping.set()
        if self._server is not None:
            self._server.stop(grace=0.5).wait(2)
            self._server = None
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
        with self._store.lock:
            for job in self._store:
                kill(job.replicas)
        self.endpoints.stop()
        self._publisher.stop()

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
        with self._store.lock:
            return copy(self._store[job_name].proto)

    def jobs(self) -> list[Any]:
        """Copies of every job, oldest first."""
        with self._store.lock:
            return [copy(r.proto) for r in self._store]

    def states(self, job_name: str) -> list[JobState]:
        """Every state a job went through, in order (KeyError when unknown)."""
        with self._store.lock:
            return list(self._store[job_name].states)

    def log_dir(self, job_name: str) -> Path:
        """Where a job's replicas write their logs (workerpoolP-I.log)."""
        with self._store.lock:
            return self._store[job_name].log_dir

    def preempt(self, job_name: str) -> bool:
        """Preempt a running job now, whatever its strategy; False if it is not running."""
        with self._store.lock:
            return self._runner.preempt(self._store[job_name], time.monotonic())

    # --- the state machine ----------------------------------------------------------------------

    def _run(self) -> None:
        while not self._stopping.wait(self.tick_s):
            try:
                self._tick()
            except Exception:  # one bad tick must not stop every job forever
                log.exception("vertex emulator tick failed")

    def _tick(self) -> None:
        now = time.monotonic()
        schedule = self.schedule
        spot_ok = schedule.spot_available(now - self._t0)
        with self._store.lock:
            for job in self._store:
                self._runner.advance(job, now, spot_ok, schedule)
            changes = self._runner.drain()
        for change in changes:
            lost = schedule.drops_events_of(change.labels)
            for entry in self.log_format.entries(change, time.time()):
                self.logging.entries.remember(entry)  # Logging has it, whatever the sink loses
                self._publish(entry, lost=lost)

    def _publish(self, entry: Mapping[str, Any], *, lost: bool = False) -> None:
        try:
            if lost:
                self._publisher.dropped += 1  # the schedule loses this job's messages
            else:
                self._publisher.publish(entry)
            if self.listener is not None:
                self.listener(entry)
        except Exception:
            log.exception("publishing a job-state message failed")


# --- command line ---------------------------------------------------------------------------------

_DEFAULT_QUOTAS = QuotaLimits()


@click.command(name="vertex", context_settings=CONTEXT)
@click.option("--host", default="127.0.0.1", help="Address to listen on.")
@click.option("--port", type=click.IntRange(0, 65535), default=0, help="0: a free port.")
@click.option("--project", default=None, help="Serve only this project  [default: any]")
@click.option("--job-events-topic", default=TOPIC_JOB_EVENTS,
              help="Pub/Sub topic for job-state messages ('' to disable); needs "
                   "PUBSUB_EMULATOR_HOST.")
@click.option("--schedule", type=click.Path(dir_okay=False),
              help="Preemption schedule JSON file (docs/vertex-emulator.md).")
@click.option("--every-spot-job-after-s", type=float,
              help="Preempt every SPOT job this long after it starts.")
@click.option("--trace", type=click.Path(dir_okay=False),
              help="Spot availability trace to replay (0 = no Spot capacity).")
@click.option("--trace-speed", default=1.0, help="Trace seconds per wall-clock second.")
@click.option("--trace-offset", default=0, help="Trace tick to start at.")
@click.option("--stockout-from-s", type=float,
              help="Spot capacity gone from this many seconds after start.")
@click.option("--stockout-for-s", type=float, help="... for this long  [default: forever]")
@click.option("--grace-s", default=30.0,
              help="Seconds between SIGTERM and SIGKILL on preemption or cancel.")
@click.option("--workdir", type=click.Path(file_okay=False),
              help="Where worker logs go  [default: a new temporary directory]")
@click.option("--drop-events", type=click.FloatRange(0, 1), default=0.0,
              help="Fraction of job-state messages to drop (1: all).")
@click.option("--seed", type=int, help="Random seed for --drop-events and Vizier's suggestions.")
@click.option("--queued-s", default=0.5, help="Least time in QUEUED.")
@click.option("--pending-s", default=0.5, help="Least time in PENDING.")
@click.option("--log-format", type=click.Path(dir_okay=False),
              help="JSON file: service lines per state and the payload field "
                   "(docs/vertex-emulator.md).")
@click.option("--log-payload", type=click.Choice(logs.PAYLOADS),
              help="Where the line goes  [default: textPayload, or the --log-format file's]")
@click.option("--quota-resource-management", default=_DEFAULT_QUOTAS.resource_management,
              help="Resource-management requests per minute per region (0: unlimited).")
@click.option("--quota-job-submissions", default=_DEFAULT_QUOTAS.job_submission,
              help="Job submissions per minute per region (0: unlimited).")
@click.option("--no-quotas", is_flag=True, help="No request quotas at all.")
@click.option("--memory-limits-mb", default=None, metavar="JSON",
              help='{"MACHINE_TYPE": MiB}: replicas past it are OOM-killed (exit 137).')
@click.option("--resource-quotas", default=None, metavar="JSON|FILE",
              help='GPUs, TPUs, CPUs per region: JSON or a JSON file, '
                   '{"us-central1": {"custom_model_training_nvidia_l4_gpus": 0}, "*": {...}}.')
@click.option("--iam", type=click.Path(dir_okay=False),
              help="JSON file of callers' tokens and grants: every call is checked "
                   "(UNAUTHENTICATED, PERMISSION_DENIED)  [default: none is]")
@click.option("--replica-preemption", type=click.Choice(REPLICA_PREEMPTION), default=FAIL_JOB,
              help="What a schedule rule preempting one replica does (undocumented by Google): "
                   "the job fails with STOCKOUT, or the replica restarts in place.")
@click.option("--metrics-period-s", default=60.0, type=click.FloatRange(min=0.1),
              help="Cloud Monitoring's sampling period of the endpoint metrics (Vertex: 60).")
@click.option("--metrics-delay-s", default=0.0, type=click.FloatRange(min=0),
              help="How long after its period closes a metric point becomes visible.")
@click.option("--persist", is_flag=True,
              help=f"Keep jobs in WORKDIR/{JOBS_FILE}; at start, take up the saved ones.")
def vertex(**options: Any) -> None:
    """Run the local Vertex AI emulator (JobService, Model Registry, Experiments, endpoints,
    Vizier, Cloud Logging's ListLogEntries and Cloud Monitoring's ListTimeSeries over gRPC)
    until SIGTERM or SIGINT; print one ready line."""
    code = _serve(SimpleNamespace(**options))
    if code:
        raise click.exceptions.Exit(code)


def _log_format(args: SimpleNamespace) -> LogFormat:
    base = LogFormat.load(args.log_format) if args.log_format else LogFormat()
    return LogFormat(base.lines, args.log_payload) if args.log_payload else base


def _quotas(args: SimpleNamespace) -> QuotaLimits:
    if args.no_quotas:
        return QuotaLimits.unlimited()
    return QuotaLimits(resource_management=args.quota_resource_management or None,
                       job_submission=args.quota_job_submissions or None)


def main(argv: list[str] | None = None) -> int:
    """`python -m spotorch.local.vertex_emulator`: the `spotorch dev vertex` command."""
    return run(vertex, argv, prog_name="spotorch dev vertex")


def _serve(args: SimpleNamespace) -> int:
    """Run the emulator until SIGTERM or SIGINT; print one ready line to stdout."""
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s vertex-emulator %(levelname)s %(message)s")
    try:
        memory = json.loads(args.memory_limits_mb) if args.memory_limits_mb else None
    except ValueError as exc:
        print(f"vertex emulator: --memory-limits-mb: not JSON: {exc}", file=sys.stderr)
        return 2
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
            pending_s=args.pending_s, log_format=_log_format(args), quotas=_quotas(args),
            persist=args.persist, memory_limits_mb=memory,
            iam=IamPolicy.load(args.iam) if args.iam else None,
            resource_quotas=ResourceQuotas.load(args.resource_quotas)
            if args.resource_quotas else None,
            replica_preemption=args.replica_preemption,
            metrics_period_s=args.metrics_period_s, metrics_delay_s=args.metrics_delay_s)
        address = emulator.start()
    except (EmulatorError, ScheduleError, LogFormatError, OSError, ValueError) as exc:
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
