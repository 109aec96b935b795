"""The Spark preprocess step on Dataproc Serverless (issue 42): StepLauncher over
google-cloud-dataproc's BatchControllerClient.

A step's launch is one CreateBatch with a deterministic batch id (spotorch.core.spark_batches:
4-63 characters of [a-z0-9-]); Dataproc keeps a batch id taken for as long as the batch exists,
so a create retried after a lost answer is refused ALREADY_EXISTS and read back with GetBatch as
the batch started before (the request_id is the batch id too: a retried create within Dataproc's
idempotency window is answered with the same operation). The batch runs spotorch's PySpark
driver (SPOTORCH_SPARK_DRIVER, a gs:// main file: deploy/spark-driver/) which installs the code
package (file_uris: the package's content-named archives, put in the batch's working directory)
for the driver and the executors and runs MODULE as __main__ with --input --output [--inputs]
--OPTION=V.

A batch is followed with GetBatch by its recorded name (one read; no Eventarc event exists for
a batch's state). Dataproc has no CancelBatch RPC in google.cloud.dataproc.v1: a batch is
cancelled by cancelling its operation (Batch.operation, google.longrunning CancelOperation on
the same client). Clients are made on first use, one per region (Dataproc's regional
endpoints); an endpoint given (the local stack's Dataproc) is used for every region over an
insecure gRPC channel.
"""

from __future__ import annotations

import contextlib
import json
import threading
from typing import Any

from spotorch.adapters.gcp.vertex_calls import emulator_channel
from spotorch.core.preprocess import JobView
from spotorch.core.spark_batches import (
    BATCH_FAILED,
    BATCH_LIVE_STATES,
    BATCH_PENDING,
    BATCH_TERMINAL_STATES,
    valid_batch_id,
)
from spotorch.ports.steps import StepLaunch, StepLaunchError

# INVALID_ARGUMENT, PERMISSION_DENIED, FAILED_PRECONDITION, NOT_FOUND (a bad network, file):
# a retry cannot help. RESOURCE_EXHAUSTED (quota: 200 batch operations a minute) is transient.
PERMANENT_CODES = frozenset({3, 5, 7, 9})
ERROR_TEXT_LIMIT = 4000


def batch_name(project: str, region: str, batch_id: str) -> str:
    """The batch's resource name: projects/P/locations/L/batches/B."""
    return f"projects/{project}/locations/{region}/batches/{batch_id}"


class DataprocStepLauncher:
    """StepLauncher: CreateBatch (idempotent by batch id), GetBatch, ListBatches, cancel by the
    batch's operation, DeleteBatch."""

    def __init__(self, project: str, *, driver_uri: str | None = None,
                 service_account: str | None = None, network: str | None = None,
                 subnetwork: str | None = None, runtime_version: str | None = None,
                 endpoint: str | None = None, token: str | None = None) -> None:
        self.project = project
        self.driver_uri = driver_uri  # SPOTORCH_SPARK_DRIVER: spotorch's PySpark main file
        self.service_account = service_account  # the batch's account, unless the step names one
        self.network = network
        self.subnetwork = subnetwork
        self.runtime_version = runtime_version
        self.endpoint = endpoint
        self.token = token
        self._clients: dict[str, Any] = {}
        self._lock = threading.Lock()

    def _client(self, region: str) -> Any:
        with self._lock:
            key = "" if self.endpoint else region
            if key not in self._clients:
                self._clients[key] = self._make(region)
            return self._clients[key]

    def _make(self, region: str) -> Any:
        from google.cloud import dataproc_v1

        if not self.endpoint:
            return dataproc_v1.BatchControllerClient(
                client_options={"api_endpoint": f"{region}-dataproc.googleapis.com:443"})
        from google.cloud.dataproc_v1.services.batch_controller.transports import (
            BatchControllerGrpcTransport,
        )

        # The local Dataproc checks the caller by its bearer token (the local stack's IAM).
        channel = emulator_channel(self.endpoint.removeprefix("http://"), self.token)
        return dataproc_v1.BatchControllerClient(
            transport=BatchControllerGrpcTransport(channel=channel))

    # --- StepLauncher -----------------------------------------------------------------------

    def launch(self, request: StepLaunch) -> JobView:
        """StepLauncher.launch: CreateBatch under the step's batch id; ALREADY_EXISTS is the
        batch a lost answer hid, read back with GetBatch."""
        if not valid_batch_id(request.job_name):
            raise StepLaunchError(f"batch id {request.job_name!r} is not 4-63 characters of "
                                  "[a-z0-9-]", permanent=True)
        from google.api_core import exceptions
        from google.cloud import dataproc_v1

        batch = self._batch(request)
        parent = f"projects/{self.project}/locations/{request.region}"
        try:
            self._client(request.region).create_batch(request=dataproc_v1.CreateBatchRequest(
                parent=parent, batch=batch, batch_id=request.job_name,
                request_id=request.job_name))
        except exceptions.AlreadyExists:
            found = self.get(request.job_name, request.region)
            if found is not None:
                return found
            raise StepLaunchError(f"batch {request.job_name} exists but cannot be read") \
                from None
        except exceptions.GoogleAPICallError as exc:
            code = getattr(exc, "grpc_status_code", None)
            permanent = bool(code is not None and code.value[0] in PERMANENT_CODES) or \
                exc.code in (400, 403, 404, 412)
            raise StepLaunchError(f"CreateBatch: {exc.message}", permanent=permanent) from exc
        return JobView(job_id=batch_name(self.project, request.region, request.job_name),
                       name=request.job_name, state=BATCH_PENDING)

    def _batch(self, request: StepLaunch) -> Any:
        """The Batch to create: spotorch's driver running the module of the code package."""
        from google.cloud import dataproc_v1

        if not request.python_module:
            raise StepLaunchError("a Spark step runs python_module: none given", permanent=True)
        if not self.driver_uri:
            raise StepLaunchError("a Spark step needs spotorch's PySpark driver: set "
                                  "SPOTORCH_SPARK_DRIVER to its gs:// main file "
                                  "(deploy/spark-driver/)", permanent=True)
        args = ["--module", request.python_module, "--input", request.input_uri,
                "--output", request.output_uri]
        if request.package_uris:
            args += ["--packages", ",".join(request.package_uris)]
        if request.inputs_uri:
            args += ["--inputs", request.inputs_uri]
        if request.options:
            args += ["--options", json.dumps(dict(request.options), sort_keys=True)]
        runtime = dataproc_v1.RuntimeConfig(properties=dict(request.properties))
        version = request.runtime_version or self.runtime_version
        if version:
            runtime.version = version
        execution = dataproc_v1.ExecutionConfig(
            service_account=request.service_account or self.service_account or "")
        network, subnetwork = request.network or self.network, \
            request.subnetwork or self.subnetwork
        if subnetwork:  # network_uri and subnetwork_uri are a oneof: the subnetwork wins
            execution.subnetwork_uri = subnetwork
        elif network:
            execution.network_uri = network
        return dataproc_v1.Batch(
            pyspark_batch=dataproc_v1.PySparkBatch(main_python_file_uri=self.driver_uri,
                                                   args=args,
                                                   file_uris=list(request.package_uris)),
            runtime_config=runtime,
            environment_config=dataproc_v1.EnvironmentConfig(execution_config=execution),
            labels=dict(request.labels))

    def get(self, job_name: str, region: str, job_id: str | None = None) -> JobView | None:
        """StepLauncher.get: one GetBatch by the batch's name; an ended batch's state_message
        (a failure's text) and UsageMetrics come in the same answer."""
        from google.api_core import exceptions

        try:
            batch = self._client(region).get_batch(
                name=batch_name(self.project, region, job_name))
        except exceptions.NotFound:
            return None
        return view_of(batch, job_name)

    def cancel(self, job_name: str, region: str) -> None:
        """StepLauncher.cancel: CancelOperation on the live batch's operation (nothing for an
        ended batch or one that does not exist)."""
        from google.api_core import exceptions

        client = self._client(region)
        try:
            batch = client.get_batch(name=batch_name(self.project, region, job_name))
        except exceptions.NotFound:
            return
        if _state(batch) not in BATCH_LIVE_STATES or not batch.operation:
            return
        with contextlib.suppress(exceptions.FailedPrecondition):  # it ended meanwhile
            client.cancel_operation(request={"name": batch.operation})

    # --- beyond the port --------------------------------------------------------------------

    def list_batches(self, region: str) -> list[JobView]:
        """ListBatches of the region: spotorch's (their id starts spotorch-), newest first."""
        parent = f"projects/{self.project}/locations/{region}"
        found = [view_of(b, b.name.rsplit("/", 1)[-1])
                 for b in self._client(region).list_batches(request={"parent": parent})]
        return [v for v in found if v.name.startswith("spotorch-")]

    def delete(self, job_name: str, region: str) -> None:
        """DeleteBatch: an ended batch's record goes (its id may be taken again); a live one
        is refused by Dataproc (FAILED_PRECONDITION)."""
        from google.api_core import exceptions

        try:
            self._client(region).delete_batch(name=batch_name(self.project, region, job_name))
        except exceptions.NotFound:
            return


def view_of(batch: Any, job_name: str) -> JobView:
    """The JobView of a Batch: its state, a failure's state_message, its usage."""
    state = _state(batch)
    error = str(batch.state_message or "")[-ERROR_TEXT_LIMIT:] if state == BATCH_FAILED else ""
    usage = batch.runtime_info.approximate_usage if state in BATCH_TERMINAL_STATES else None
    rate = float(batch.runtime_info.current_usage.milli_dcu) if usage is None else 0.0
    return JobView(job_id=batch.name, name=job_name, state=state, error=error,
                   milli_dcu_s=float(usage.milli_dcu_seconds) if usage is not None else 0.0,
                   shuffle_gb_s=float(usage.shuffle_storage_gb_seconds)
                   if usage is not None else 0.0, milli_dcu_rate=rate)


def _state(batch: Any) -> str:
    state = batch.state
    name = getattr(state, "name", None)
    return str(name) if name else str(state)
