"""A local Dataproc Serverless (issue 42): the gRPC BatchController the real google-cloud-dataproc
client talks to, running each PySpark batch with pyspark in local mode; docs/local-stack.md.

    python -m spotorch.local.dataproc_emulator --port P --project PROJ --workdir DIR
        [--spark-python PATH] [--iam FILE] [--events-url URL]

What it serves (google.cloud.dataproc.v1.BatchController): CreateBatch, GetBatch, ListBatches,
DeleteBatch, and google.longrunning.Operations' CancelOperation and GetOperation on a batch's
operation (Dataproc cancels a batch through its operation: there is no CancelBatch RPC).

Dataproc's rules it enforces: a batch id of 4-63 characters of [a-z0-9-] (INVALID_ARGUMENT); an
id taken by an existing batch (ALREADY_EXISTS, whatever its state, until DeleteBatch); a PySpark
batch only, its main file a gs:// .py; Spark properties by name (spark.* and a few dataproc.*
ones; spark.master and spark.submit.deployMode are the service's: INVALID_ARGUMENT) and runtime
versions from a known list (ours: RUNTIME_VERSIONS; the service's list moves); actAs on the
batch's service account (PERMISSION_DENIED, with --iam); DeleteBatch of a live batch
(FAILED_PRECONDITION); Dataproc's quotas per project and region, 200 batch operations and 7,500
reads a minute (RESOURCE_EXHAUSTED).

What a batch does: its main file and file_uris are downloaded from the stack's fake GCS into the
batch's own working directory (as Dataproc puts file_uris there) and the main file runs with the
Spark environment's Python (.venv-spark, `make spark-venv`: pyspark from PyPI on the machine's
Java 17), its args after it, the batch's properties as spark-submit --conf and Spark's master
local[LOCAL_CORES]. Exit 0 is SUCCEEDED; otherwise FAILED with the driver's exception as
state_message ("Job failed with message [...]", the last lines of the driver's stderr). The
driver's output is kept in the working directory (driveroutput.*; Dataproc writes it to the
batch's staging bucket: runtime_info.output_uri is not set here). Usage is what Dataproc would
bill for the configured shapes, not what local mode used: the driver and
spark.executor.instances executors (Dataproc's defaults: 4 cores, 9600m memory plus 10%
overhead each, 2 executors) at Dataproc's DCU rule (spotorch.core.spark_batches.dcus) times
the running seconds, one minute at least; shuffle storage 0 (local mode shuffles on local disk).

When a batch ends, the last Admin Activity audit entry of its CreateBatch operation
(`operation.last`) is POSTed to --events-url as Eventarc delivers google.cloud.audit.log.v1.written
(spotorch.entrypoints.batch_entries): that Dataproc writes it is not verified, so spotorch reads
it as a hint and the tick's GetBatch stays the backstop. The resource type and labels of the
entry (cloud_dataproc_batch: project_id, location, batch_id, batch_uuid) are our reading of
Logging's list, unverified too; spotorch reads only protoPayload and operation.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import subprocess
import sys
import threading
import time
import uuid
from collections import deque
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import click

from spotorch.core.spark_batches import (
    BATCH_CANCELLED,
    BATCH_CANCELLING,
    BATCH_FAILED,
    BATCH_LIVE_STATES,
    BATCH_OPERATIONS_PER_MINUTE,
    BATCH_PENDING,
    BATCH_READS_PER_MINUTE,
    BATCH_RUNNING,
    BATCH_SUCCEEDED,
    dcus,
    milli_dcu_seconds,
    valid_batch_id,
)
from spotorch.local._eventarc import deliver_audit_entry
from spotorch.local._vertex_iam import IamPolicy
from spotorch.local._vertex_jobs import Invalid

log = logging.getLogger("spotorch.local.dataproc_emulator")

READY_LINE = "dataproc emulator listening on {address}"
SERVICE = "google.cloud.dataproc.v1.BatchController"
OPERATIONS_SERVICE = "google.longrunning.Operations"
SERVICE_HOST = "dataproc.googleapis.com"
REPO = Path(__file__).resolve().parents[3]
DEFAULT_SPARK_PYTHON = REPO / ".venv-spark" / "bin" / "python"
DRIVER = REPO / "deploy" / "spark-driver" / "spotorch_spark_main.py"
LOCAL_CORES = 2  # Spark's local[N]: this machine's cores, whatever the batch's shape says
ERROR_LINES = 20
# Runtime versions the local Dataproc accepts (ours: Dataproc's list moves; the batch's runtime
# does not change what local mode runs).
RUNTIME_VERSIONS = ("1.1", "1.2", "2.0", "2.1", "2.2", "2.3", "3.0")
SERVICE_PROPERTIES = ("spark.master", "spark.submit.deployMode")
_PROPERTY = re.compile(r"^(spark|dataproc)\.[A-Za-z0-9_.-]+$")
# Dataproc Serverless's defaults for a node's shape (cores; memory in MB, plus 10% overhead).
DEFAULT_CORES, DEFAULT_MEMORY_MB, DEFAULT_EXECUTORS = 4, 9600, 2
OVERHEAD = 0.10
ACT_AS_DENIED = ("User not authorized to act as service account '{account}'. To act as a "
                 "service account, user must have one of [Owner, Editor, Service Account Actor] "
                 "roles.")
METHOD_PERMISSIONS = {"CreateBatch": "dataproc.batches.create", "GetBatch": "dataproc.batches.get",
                      "ListBatches": "dataproc.batches.list",
                      "DeleteBatch": "dataproc.batches.delete",
                      "CancelOperation": "dataproc.operations.cancel",
                      "GetOperation": "dataproc.operations.get"}
OPERATIONS = ("CreateBatch", "DeleteBatch", "CancelOperation")  # Dataproc's "batch operations"


def spark_available(python: Path = DEFAULT_SPARK_PYTHON) -> bool:
    """Whether the Spark environment is there (`make spark-venv`) and Java can run it."""
    return python.is_file() and shutil.which("java") is not None


@dataclass
class Batch:
    """One batch as the emulator keeps it."""

    name: str  # projects/P/locations/L/batches/B
    uuid: str
    operation: str  # projects/P/regions/L/operations/OP
    request: Any  # the dataproc_v1.Batch created
    state: str = BATCH_PENDING
    state_message: str = ""
    created_at: float = field(default_factory=time.time)
    state_at: float = field(default_factory=time.time)
    started_at: float | None = None
    ended_at: float | None = None
    history: list[tuple[str, float]] = field(default_factory=list)
    process: subprocess.Popen[bytes] | None = None
    cancel_requested: bool = False

    @property
    def live(self) -> bool:
        """Whether the batch may still change."""
        return self.state in BATCH_LIVE_STATES

    @property
    def region(self) -> str:
        """The batch's region (its location)."""
        return self.name.split("/")[3]

    def usage_milli_dcu_s(self) -> int:
        """UsageMetrics.milli_dcu_seconds Dataproc would bill for the batch's shapes."""
        if self.started_at is None:
            return 0
        seconds = (self.ended_at or time.time()) - self.started_at
        return milli_dcu_seconds(self._nodes(), seconds)

    def milli_dcu(self) -> int:
        """UsageSnapshot.milli_dcu: the DCUs the batch's shapes hold while it runs, in milli."""
        return round(1000 * sum(dcus(c, m) for c, m in self._nodes()))

    def _nodes(self) -> list[tuple[float, float]]:
        props = dict(self.request.runtime_config.properties)

        def node(role: str) -> tuple[float, float]:
            cores = float(props.get(f"spark.{role}.cores", DEFAULT_CORES))
            memory = _megabytes(props.get(f"spark.{role}.memory"), DEFAULT_MEMORY_MB)
            return cores, memory * (1 + OVERHEAD) / 1024

        executors = int(props.get("spark.executor.instances", DEFAULT_EXECUTORS))
        return [node("driver")] + [node("executor")] * executors


def _megabytes(text: str | None, default: float) -> float:
    if not text:
        return default
    match = re.fullmatch(r"(\d+(?:\.\d+)?)([kmgt]?)b?", str(text).strip().lower())
    if match is None:
        raise Invalid("INVALID_ARGUMENT", f"invalid memory size {text!r}")
    scale = {"k": 1 / 1024, "": 1 / (1024 * 1024), "m": 1, "g": 1024, "t": 1024 * 1024}
    return float(match.group(1)) * scale[match.group(2)]


class DataprocEmulator:
    """The emulator: a gRPC server and one runner thread per batch."""

    def __init__(self, project: str, *, workdir: Path, host: str = "127.0.0.1", port: int = 0,
                 spark_python: Path = DEFAULT_SPARK_PYTHON, iam: IamPolicy | None = None,
                 operations_per_minute: int = BATCH_OPERATIONS_PER_MINUTE,
                 reads_per_minute: int = BATCH_READS_PER_MINUTE,
                 events_url: str | None = None) -> None:
        import grpc

        self.project = project
        self.events_url = events_url  # where a batch's end audit entry goes (Eventarc's trigger)
        self.workdir = workdir
        self.spark_python = spark_python
        self.iam = iam
        self.limits = {"operations": operations_per_minute, "reads": reads_per_minute}
        self.calls: dict[str, int] = {}  # method -> requests served (tests count them)
        self.batches: dict[str, Batch] = {}
        self._windows: dict[tuple[str, str], deque[float]] = {}
        self._lock = threading.Lock()
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=8,
                                                             thread_name_prefix="dataproc"))
        self.server.add_generic_rpc_handlers(self._handlers())
        self.port = self.server.add_insecure_port(f"{host}:{port}")
        self.host = host

    @property
    def address(self) -> str:
        """host:port it listens on."""
        return f"{self.host}:{self.port}"

    def start(self) -> DataprocEmulator:
        """Serve in the background."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.server.start()
        return self

    def stop(self) -> None:
        """Stop serving and kill running drivers."""
        self.server.stop(grace=None)
        with self._lock:
            for batch in self.batches.values():
                if batch.process is not None and batch.process.poll() is None:
                    batch.process.kill()

    # --- gRPC -------------------------------------------------------------------------------

    def _handlers(self) -> tuple[Any, ...]:
        import grpc
        from google.cloud import dataproc_v1 as v1
        from google.longrunning import operations_pb2
        from google.protobuf import empty_pb2

        def rpc(method: str, fn: Any, request_type: Any, serialize: Any) -> Any:
            def handle(request: Any, context: Any) -> Any:
                try:
                    principal = self._authorize(method, context.invocation_metadata())
                    self._charge(method, request)
                    self.calls[method] = self.calls.get(method, 0) + 1
                    return fn(request, principal)
                except Invalid as exc:
                    context.abort(getattr(grpc.StatusCode, exc.code), str(exc))
            return grpc.unary_unary_rpc_method_handler(
                handle, request_deserializer=request_type, response_serializer=serialize)

        batches = grpc.method_handlers_generic_handler(SERVICE, {
            "CreateBatch": rpc("CreateBatch", self.create, v1.CreateBatchRequest.deserialize,
                               operations_pb2.Operation.SerializeToString),
            "GetBatch": rpc("GetBatch", self.get, v1.GetBatchRequest.deserialize,
                            v1.Batch.serialize),
            "ListBatches": rpc("ListBatches", self.list, v1.ListBatchesRequest.deserialize,
                               v1.ListBatchesResponse.serialize),
            "DeleteBatch": rpc("DeleteBatch", self.delete, v1.DeleteBatchRequest.deserialize,
                               empty_pb2.Empty.SerializeToString),
        })
        operations = grpc.method_handlers_generic_handler(OPERATIONS_SERVICE, {
            "CancelOperation": rpc("CancelOperation", self.cancel_operation,
                                   operations_pb2.CancelOperationRequest.FromString,
                                   empty_pb2.Empty.SerializeToString),
            "GetOperation": rpc("GetOperation", self.get_operation,
                                operations_pb2.GetOperationRequest.FromString,
                                operations_pb2.Operation.SerializeToString),
        })
        return batches, operations

    def _authorize(self, method: str, metadata: Any) -> str | None:
        if self.iam is None:
            return None
        principal = self.iam.principal(metadata)
        permission = METHOD_PERMISSIONS[method]
        if not self.iam.allows(principal, permission):
            raise Invalid("PERMISSION_DENIED", f"Permission '{permission}' denied on resource "
                                               f"'//{SERVICE_HOST}/projects/{self.project}' "
                                               "(or it may not exist).")
        return principal

    def _charge(self, method: str, request: Any) -> None:
        """Dataproc's per-minute quotas per region: RESOURCE_EXHAUSTED over them."""
        text = str(getattr(request, "parent", "") or getattr(request, "name", ""))
        parts = text.split("/")
        region = parts[3] if len(parts) > 3 else ""
        kind = "operations" if method in OPERATIONS else "reads"
        now = time.monotonic()
        with self._lock:
            window = self._windows.setdefault((kind, region), deque())
            while window and now - window[0] > 60:
                window.popleft()
            if len(window) >= self.limits[kind]:
                metric = "batch operation requests" if kind == "operations" else "read requests"
                raise Invalid("RESOURCE_EXHAUSTED",
                              f"Quota exceeded for quota metric '{metric}' and limit "
                              f"'{metric} per minute per region' of service "
                              f"'{SERVICE_HOST}' for consumer 'project_number:"
                              f"{self.project}'.")
            window.append(now)

    # --- the API ----------------------------------------------------------------------------

    def create(self, request: Any, principal: str | None) -> Any:
        """CreateBatch: a new PENDING batch run in the background; its operation."""
        parent = str(request.parent)
        match = re.fullmatch(r"projects/([^/]+)/locations/([^/]+)", parent)
        if match is None:
            raise Invalid("INVALID_ARGUMENT", f"Invalid parent {parent!r}")
        region = match.group(2)
        batch_id = str(request.batch_id) or f"b{uuid.uuid4().hex[:20]}"
        if not valid_batch_id(batch_id):
            raise Invalid("INVALID_ARGUMENT", f"Batch ID '{batch_id}' must conform to "
                                              "^[a-z0-9][a-z0-9\\-]{2,61}[a-z0-9]$ pattern.")
        spec = request.batch
        self._check(spec, principal)
        name = f"{parent}/batches/{batch_id}"
        with self._lock:
            found = self.batches.get(name)
            if found is not None:
                raise Invalid("ALREADY_EXISTS", f"Batch with ID '{batch_id}' already exists "
                                                f"in project '{self.project}' and region "
                                                f"'{region}'.")
            operation = f"projects/{self.project}/regions/{region}/operations/{uuid.uuid4()}"
            batch = Batch(name, str(uuid.uuid4()), operation, spec)
            batch.history.append((BATCH_PENDING, batch.created_at))
            self.batches[name] = batch
        threading.Thread(target=self._run, args=(batch,), daemon=True).start()
        return self._operation(batch)

    def _check(self, spec: Any, principal: str | None) -> None:
        if not spec.pyspark_batch.main_python_file_uri:
            raise Invalid("INVALID_ARGUMENT", "The local Dataproc runs PySpark batches only: "
                                              "pyspark_batch.main_python_file_uri is required")
        main = str(spec.pyspark_batch.main_python_file_uri)
        if not main.startswith("gs://") or not main.endswith(".py"):
            raise Invalid("INVALID_ARGUMENT", f"main_python_file_uri {main!r} must be a gs:// "
                                              ".py file")
        for key in spec.runtime_config.properties:
            if key in SERVICE_PROPERTIES or not _PROPERTY.match(key):
                raise Invalid("INVALID_ARGUMENT", f"Unsupported property: '{key}'")
        for key in ("spark.driver.memory", "spark.executor.memory"):
            _megabytes(spec.runtime_config.properties.get(key), DEFAULT_MEMORY_MB)
        version = str(spec.runtime_config.version or "")
        if version and version not in RUNTIME_VERSIONS:
            raise Invalid("INVALID_ARGUMENT", f"Unsupported runtime version: '{version}'")
        account = str(spec.environment_config.execution_config.service_account or "") or \
            f"{self.project}-compute@developer.gserviceaccount.com"
        if self.iam is not None and principal is not None \
                and not self.iam.may_act_as(principal, account):
            raise Invalid("PERMISSION_DENIED", ACT_AS_DENIED.format(account=account))

    def get(self, request: Any, principal: str | None) -> Any:
        """GetBatch: the batch, its state, a failure's message and its usage."""
        return self._view(self._batch(str(request.name)))

    def list(self, request: Any, principal: str | None) -> Any:
        """ListBatches: the parent's batches, newest first (one page)."""
        from google.cloud import dataproc_v1 as v1

        prefix = f"{request.parent}/batches/"
        with self._lock:
            found = sorted((b for b in self.batches.values() if b.name.startswith(prefix)),
                           key=lambda b: b.created_at, reverse=True)
        return v1.ListBatchesResponse(batches=[self._view(b) for b in found])

    def delete(self, request: Any, principal: str | None) -> Any:
        """DeleteBatch: an ended batch's record (its id may be taken again)."""
        from google.protobuf import empty_pb2

        batch = self._batch(str(request.name))
        with self._lock:
            if batch.live:
                raise Invalid("FAILED_PRECONDITION", f"Batch '{batch.name}' is in state "
                                                     f"{batch.state} and cannot be deleted.")
            del self.batches[batch.name]
        return empty_pb2.Empty()

    def cancel_operation(self, request: Any, principal: str | None) -> Any:
        """CancelOperation on a batch's operation: CANCELLING, its driver stopped, CANCELLED."""
        from google.protobuf import empty_pb2

        batch = self._by_operation(str(request.name))
        with self._lock:
            if not batch.live:
                raise Invalid("FAILED_PRECONDITION", f"Cannot cancel batch in state "
                                                     f"{batch.state}.")
            batch.cancel_requested = True
            process = batch.process
        self._set(batch, BATCH_CANCELLING)
        if process is not None and process.poll() is None:
            process.terminate()
        elif process is None:
            self._set(batch, BATCH_CANCELLED)
        return empty_pb2.Empty()

    def get_operation(self, request: Any, principal: str | None) -> Any:
        """GetOperation: a batch's operation, done once the batch has ended."""
        return self._operation(self._by_operation(str(request.name)))

    def _batch(self, name: str) -> Batch:
        with self._lock:
            batch = self.batches.get(name)
        if batch is None:
            raise Invalid("NOT_FOUND", f"Not found: Batch projects/{name.split('/', 1)[-1]}")
        return batch

    def _by_operation(self, name: str) -> Batch:
        with self._lock:
            batch = next((b for b in self.batches.values() if b.operation == name), None)
        if batch is None:
            raise Invalid("NOT_FOUND", f"Operation {name} not found")
        return batch

    def _operation(self, batch: Batch) -> Any:
        from google.cloud import dataproc_v1 as v1
        from google.longrunning import operations_pb2
        from google.protobuf import any_pb2

        metadata = any_pb2.Any()
        metadata.Pack(v1.BatchOperationMetadata.pb(v1.BatchOperationMetadata(
            batch=batch.name, batch_uuid=batch.uuid,
            operation_type=v1.BatchOperationMetadata.BatchOperationType.BATCH)))
        operation = operations_pb2.Operation(name=batch.operation, metadata=metadata,
                                             done=not batch.live)
        if not batch.live:
            result = any_pb2.Any()
            result.Pack(v1.Batch.pb(self._view(batch)))
            operation.response.CopyFrom(result)
        return operation

    def _view(self, batch: Batch) -> Any:
        from google.cloud import dataproc_v1 as v1
        from google.protobuf import timestamp_pb2

        def ts(value: float) -> Any:
            stamp = timestamp_pb2.Timestamp()
            stamp.FromNanoseconds(int(value * 1e9))
            return stamp

        with self._lock:
            view = v1.Batch(batch.request)
            view.name, view.uuid, view.operation = batch.name, batch.uuid, batch.operation
            view.state = getattr(v1.Batch.State, batch.state)
            view.state_message = batch.state_message
            view.create_time = ts(batch.created_at)
            view.state_time = ts(batch.state_at)
            view.creator = "local"
            view.state_history = [v1.Batch.StateHistory(state=getattr(v1.Batch.State, s),
                                                        state_start_time=ts(t))
                                  for s, t in batch.history[:-1]]
            if batch.live:  # UsageSnapshot while it runs (none before its driver starts)
                view.runtime_info = v1.RuntimeInfo(current_usage=v1.UsageSnapshot(
                    milli_dcu=batch.milli_dcu() if batch.started_at else 0,
                    snapshot_time=ts(time.time())))
            else:
                view.runtime_info = v1.RuntimeInfo(approximate_usage=v1.UsageMetrics(
                    milli_dcu_seconds=batch.usage_milli_dcu_s(), shuffle_storage_gb_seconds=0))
        return view

    # --- running a batch --------------------------------------------------------------------

    def _set(self, batch: Batch, state: str, message: str = "") -> None:
        with self._lock:
            if batch.state == state or not batch.live:
                return
            batch.state, batch.state_at = state, time.time()
            batch.history.append((state, batch.state_at))
            if message:
                batch.state_message = message
            if state == BATCH_RUNNING:
                batch.started_at = batch.state_at
            if state not in BATCH_LIVE_STATES:
                batch.ended_at = batch.state_at
        log.info("batch %s: %s", batch.name, state)
        if state not in BATCH_LIVE_STATES and self.events_url:
            threading.Thread(target=deliver_audit_entry, args=(self.events_url, _end_entry(batch)),
                             daemon=True, name="dataproc-audit").start()

    def _run(self, batch: Batch) -> None:
        try:
            where = self.workdir / "batches" / batch.uuid
            where.mkdir(parents=True, exist_ok=True)
            spec = batch.request.pyspark_batch
            main = _download(str(spec.main_python_file_uri), where)
            for uri in [*spec.file_uris, *spec.python_file_uris]:
                _download(str(uri), where)
            if batch.cancel_requested:
                self._set(batch, BATCH_CANCELLED)
                return
            self._set(batch, BATCH_RUNNING)
            code, stderr = self._driver(batch, main, where)
            if batch.cancel_requested:
                self._set(batch, BATCH_CANCELLED)
            elif code != 0:
                self._set(batch, BATCH_FAILED, f"Job failed with message [{_exception(stderr)}]. "
                                               f"Driver output: {where / 'driveroutput.err'}")
            else:
                self._set(batch, BATCH_SUCCEEDED)
        except Exception as exc:  # the service's own failure: an infrastructure error
            log.exception("batch %s failed in the emulator", batch.name)
            self._set(batch, BATCH_FAILED, f"Internal error: {exc}")

    def _driver(self, batch: Batch, main: Path, where: Path) -> tuple[int, str]:
        props = dict(batch.request.runtime_config.properties)
        confs = [f"--conf {k}={v}" for k, v in sorted(props.items())
                 if not k.startswith(("dataproc.", "spark.executor.instances",
                                      "spark.driver.memory", "spark.executor.memory"))]
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("SPOTORCH_", "PYTHON", "PYSPARK", "SPARK_"))}
        env["PYSPARK_PYTHON"] = str(self.spark_python)
        env["PYSPARK_SUBMIT_ARGS"] = " ".join([f"--master local[{LOCAL_CORES}]", *confs,
                                               "--conf spark.ui.enabled=false",
                                               "pyspark-shell"])
        argv = [str(self.spark_python), str(main), *batch.request.pyspark_batch.args]
        out, err = where / "driveroutput.out", where / "driveroutput.err"
        with out.open("wb") as fo, err.open("wb") as fe:
            process = subprocess.Popen(argv, stdout=fo, stderr=fe, stdin=subprocess.DEVNULL,
                                       cwd=where, env=env)
            with self._lock:
                batch.process = process
            code = process.wait()
        return code, err.read_text(errors="replace")


def _end_entry(batch: Batch) -> dict[str, Any]:
    """The last audit entry of a batch's CreateBatch operation (module docstring)."""
    from spotorch.entrypoints.batch_entries import CREATE_BATCH, DATAPROC_SERVICE

    parts = batch.name.split("/")  # projects/P/locations/L/batches/B
    failed = batch.state != BATCH_SUCCEEDED
    at = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(batch.state_at)) + \
        f".{int(batch.state_at % 1 * 1e6):06d}Z"
    return {
        "protoPayload": {
            "@type": "type.googleapis.com/google.cloud.audit.AuditLog",
            "serviceName": DATAPROC_SERVICE, "methodName": CREATE_BATCH,
            "resourceName": batch.name,
            "status": {"code": 9, "message": batch.state_message} if failed else {}},
        "insertId": f"{batch.uuid}-end",
        "resource": {"type": "cloud_dataproc_batch",
                     "labels": {"project_id": parts[1], "location": parts[3],
                                "batch_id": parts[5], "batch_uuid": batch.uuid}},
        "timestamp": at, "receiveTimestamp": at, "severity": "ERROR" if failed else "NOTICE",
        "logName": f"projects/{parts[1]}/logs/cloudaudit.googleapis.com%2Factivity",
        "operation": {"id": batch.operation, "producer": DATAPROC_SERVICE, "last": True},
    }


def _exception(stderr: str) -> str:
    """The driver's exception: its traceback's last lines (the exception last)."""
    lines = [line for line in stderr.splitlines() if line.strip()]
    start = max((i for i, line in enumerate(lines)
                 if line.startswith("Traceback (most recent call last)")), default=None)
    picked = lines[start:] if start is not None else lines
    return "\n".join(picked[-ERROR_LINES:]) or "the driver exited without output"


def _download(uri: str, into: Path) -> Path:
    """A gs:// object into the folder, by its base name (as Dataproc stages file_uris)."""
    from google.cloud import storage

    bucket, _, name = uri.removeprefix("gs://").partition("/")
    target = into / name.rsplit("/", 1)[-1]
    blob = storage.Client.create_anonymous_client().bucket(bucket).blob(name)
    try:
        blob.download_to_filename(str(target))
    except Exception as exc:
        raise RuntimeError(f"cannot read {uri}: {exc}") from exc
    return target


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", type=int, default=0, show_default=True)
@click.option("--project", required=True)
@click.option("--workdir", type=click.Path(path_type=Path), required=True)
@click.option("--spark-python", type=click.Path(path_type=Path), default=DEFAULT_SPARK_PYTHON,
              show_default=True, help="Python of the Spark environment (make spark-venv).")
@click.option("--iam", "iam_file", type=click.Path(path_type=Path), default=None,
              help="tokens and grants (the local stack's file): check every call.")
@click.option("--events-url", default=None,
              help="Where a batch's end audit entry is POSTed (Eventarc's trigger).")
def main(host: str, port: int, project: str, workdir: Path, spark_python: Path,
         iam_file: Path | None, events_url: str | None) -> None:
    """Run the local Dataproc until interrupted."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    if not spark_available(spark_python):
        raise click.ClickException(f"no Spark environment at {spark_python} (or no java): "
                                   "make spark-venv")
    emulator = DataprocEmulator(project, workdir=workdir, host=host, port=port,
                                spark_python=spark_python,
                                iam=IamPolicy.load(iam_file) if iam_file else None,
                                events_url=events_url).start()
    print(READY_LINE.format(address=emulator.address), flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        emulator.stop()
        shutil.rmtree(workdir / "batches", ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
