"""The Vertex emulator's EndpointService and PredictionService (issue 37): models served for real.

CreateEndpoint, DeployModel, UndeployModel and MutateDeployedModel are long-running operations
(polled through the registry's google.longrunning.Operations, as the real client does);
GetEndpoint, UpdateEndpoint (traffic_split) and Predict answer at once. Each deployed model is a
local prediction server process (spotorch.local._prediction_server) that loads the version's
artifact as Vertex's prebuilt container does; DeployModel's operation is done once it loaded
(or failed, saying why). Predict picks a deployed model by the endpoint's traffic split and
hands it `{"instances": [...]}`; its latency is measured, not assumed.

As Vertex documents them: a traffic_split names deployed model ids ("0": the model being
deployed) and sums to 100; an empty split on DeployModel gives a first model 100 and a later one
0; a model with traffic cannot be undeployed unless the request gives the rest a new split;
dedicated_resources need min_replica_count >= 1 and max >= min. Not known (kept simple, say so):
Predict's status code when the serving container fails (INTERNAL here) or when no deployed model
has traffic (FAILED_PRECONDITION here). Replicas are not simulated: one process per deployed
model whatever min/max say.

Faults for rollback tests: `inject(endpoint, deployed_model_id, error_rate=, delay_s=)`.
What Cloud Monitoring would report of the endpoint's traffic (error count, latencies per
deployed model): `traffic(endpoint, since)`.
"""

from __future__ import annotations

import itertools
import math
import random
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from spotorch.core.servable import framework_of
from spotorch.local._vertex_jobs import Invalid, utc
from spotorch.local._vertex_service import copy

if TYPE_CHECKING:
    from spotorch.local._vertex_registry import RegistryServices

ENDPOINT_SERVICE = "google.cloud.aiplatform.v1.EndpointService"
PREDICTION_SERVICE = "google.cloud.aiplatform.v1.PredictionService"
LOAD_TIMEOUT_S = 120.0
PREDICT_TIMEOUT_S = 30.0
# The HTTP status a failed Predict answers with (google.rpc code -> HTTP), as Monitoring's
# response_code label counts it.
HTTP_STATUS = {"INVALID_ARGUMENT": "400", "FAILED_PRECONDITION": "400", "NOT_FOUND": "404",
               "INTERNAL": "500", "UNAVAILABLE": "503", "DEADLINE_EXCEEDED": "504"}
TRAFFIC_KEPT = 10_000  # predictions remembered per deployed model (Monitoring's stand-in)


@dataclass
class Fault:
    error_rate: float = 0.0
    delay_s: float = 0.0


@dataclass
class _Server:
    """One deployed model's prediction server process."""

    process: subprocess.Popen[str] | None = None
    port: int | None = None
    error: str | None = None
    ready: threading.Event = field(default_factory=threading.Event)


@dataclass(frozen=True)
class Served:
    """One prediction as Monitoring would count it."""

    at: float  # time.time()
    deployed_model_id: str
    latency_ms: float
    ok: bool
    response_code: str = "200"  # the HTTP status the caller saw (Monitoring's response_code)


class EndpointServices:
    """EndpointService and PredictionService over the registry's state and operations."""

    def __init__(self, registry: RegistryServices, *, seed: int | None = None,
                 python: str = sys.executable) -> None:
        self.registry = registry
        self.python = python
        self.endpoints: dict[str, Any] = {}  # name -> Endpoint (proto-plus)
        self.servers: dict[tuple[str, str], _Server] = {}  # (endpoint, deployed id) -> process
        self.faults: dict[tuple[str, str], Fault] = {}
        self.served: dict[str, list[Served]] = {}  # endpoint -> predictions, oldest first
        self._ids = itertools.count(int(time.time()) % 10**6 * 1000 + 1)
        self._random = random.Random(seed)

    @property
    def _lock(self) -> Any:
        return self.registry.state.lock

    # --- EndpointService ------------------------------------------------------------------------

    def create_endpoint(self, request: Any) -> Any:
        from google.cloud import aiplatform_v1 as v1

        self.registry._check_project(request.parent)
        if not request.endpoint.display_name:
            raise Invalid("INVALID_ARGUMENT", "endpoint.display_name is required")
        eid = request.endpoint_id or str(next(self._ids))
        if not eid.isdigit() and not (eid[:1].isalpha() and eid.replace("-", "").isalnum()):
            raise Invalid("INVALID_ARGUMENT", f"invalid endpoint_id {eid!r}")
        name = f"{request.parent}/endpoints/{eid}"
        with self._lock:
            if name in self.endpoints:
                raise Invalid("ALREADY_EXISTS", f"endpoint {name} already exists")

            def finish() -> Any:
                proto = copy(request.endpoint)
                proto.name = name
                proto.create_time = proto.update_time = utc(time.time())
                self.endpoints[name] = proto
                return copy(proto)

            metadata = v1.CreateEndpointOperationMetadata(
                generic_metadata=v1.GenericOperationMetadata(create_time=utc(time.time())))
            return self.registry._operation(name, finish, metadata)

    def _endpoint(self, name: str) -> Any:
        self.registry._settle()
        endpoint = self.endpoints.get(name)
        if endpoint is None:
            raise Invalid("NOT_FOUND", f"endpoint {name} not found")
        return endpoint

    def get_endpoint(self, request: Any) -> Any:
        with self._lock:
            return copy(self._endpoint(request.name))

    @staticmethod
    def _check_split(split: dict[str, int], known: set[str]) -> None:
        if any(k not in known for k in split):
            raise Invalid("INVALID_ARGUMENT", f"traffic_split names deployed models that are not "
                                              f"there: {sorted(set(split) - known)}")
        if any(v < 0 for v in split.values()) or sum(split.values()) != 100:
            raise Invalid("INVALID_ARGUMENT", f"traffic_split must sum to 100, got "
                                              f"{sum(split.values())}")

    def deploy_model(self, request: Any) -> Any:
        from google.cloud import aiplatform_v1 as v1

        wanted = request.deployed_model
        resources = wanted.dedicated_resources
        if not resources.machine_spec.machine_type:
            raise Invalid("INVALID_ARGUMENT", "deployed_model.dedicated_resources.machine_spec."
                                              "machine_type is required")
        if resources.min_replica_count < 1 or (resources.max_replica_count and
                                               resources.max_replica_count <
                                               resources.min_replica_count):
            raise Invalid("INVALID_ARGUMENT", "min_replica_count must be at least 1 and "
                                              "max_replica_count at least min_replica_count")
        with self._lock:
            endpoint = self._endpoint(request.endpoint)
            version = self.registry._version(wanted.model)
            framework = framework_of(version.container_spec.image_uri)
            if framework is None:
                raise Invalid("FAILED_PRECONDITION", f"{version.container_spec.image_uri} is not "
                                                     "a prebuilt prediction container the "
                                                     "emulator can stand in for")
            deployed_id = str(next(self._ids))
            split = {(deployed_id if k == "0" else k): int(v)
                     for k, v in dict(request.traffic_split).items()}
            known = {d.id for d in endpoint.deployed_models} | {deployed_id}
            if split:
                self._check_split(split, known)
            elif not endpoint.deployed_models:
                split = {deployed_id: 100}
            server = _Server()
            self.servers[(request.endpoint, deployed_id)] = server
            model_name = f"{version.name}"

            def finish() -> Any:
                if server.error is not None:
                    self.servers.pop((request.endpoint, deployed_id), None)
                    raise Invalid("FAILED_PRECONDITION", f"the model server of {model_name}@"
                                                         f"{version.version_id} failed to start: "
                                                         f"{server.error}")
                target = self.endpoints[request.endpoint]
                deployed = v1.DeployedModel(
                    id=deployed_id, model=model_name, model_version_id=version.version_id,
                    display_name=wanted.display_name or version.display_name,
                    dedicated_resources=copy(resources), create_time=utc(time.time()))
                if not deployed.dedicated_resources.max_replica_count:
                    deployed.dedicated_resources.max_replica_count = resources.min_replica_count
                target.deployed_models.append(deployed)
                if split:
                    target.traffic_split.clear()
                    target.traffic_split.update(split)
                target.update_time = utc(time.time())
                return v1.DeployModelResponse(deployed_model=copy(deployed))

            metadata = v1.DeployModelOperationMetadata(
                generic_metadata=v1.GenericOperationMetadata(create_time=utc(time.time())))
            proto = self.registry._operation(request.endpoint, finish, metadata)
            op = self.registry.state.operations[proto.name]
            op.ready_at = math.inf  # done once the server loaded the model (or failed)
        threading.Thread(target=self._start_server, name=f"model-server-{deployed_id}",
                         args=(server, version.artifact_uri, framework, op), daemon=True).start()
        return proto

    def _start_server(self, server: _Server, artifact_uri: str, framework: str, op: Any) -> None:
        try:
            process = subprocess.Popen(
                [self.python, "-m", "spotorch.local._prediction_server", "--artifact-uri",
                 artifact_uri, "--framework", framework],
                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
            server.process = process
            assert process.stdout is not None
            line = process.stdout.readline().strip()
            if line.startswith("READY "):
                server.port = int(line.split()[1])
            else:
                server.error = line.removeprefix("ERROR ") or \
                    f"exited with {process.wait(LOAD_TIMEOUT_S)}"
        except Exception as exc:
            server.error = f"{type(exc).__name__}: {exc}"
        server.ready.set()
        with self._lock:
            op.ready_at = self.registry._clock()

    def undeploy_model(self, request: Any) -> Any:
        from google.cloud import aiplatform_v1 as v1

        with self._lock:
            endpoint = self._endpoint(request.endpoint)
            ids = [d.id for d in endpoint.deployed_models]
            if request.deployed_model_id not in ids:
                raise Invalid("NOT_FOUND", f"deployed model {request.deployed_model_id} not found "
                                           f"on {request.endpoint}")
            rest = set(ids) - {request.deployed_model_id}
            split = {k: int(v) for k, v in dict(request.traffic_split).items()}
            if split:
                self._check_split(split, rest)
            elif endpoint.traffic_split.get(request.deployed_model_id, 0) > 0 and rest:
                raise Invalid("FAILED_PRECONDITION", f"deployed model {request.deployed_model_id} "
                                                     "has traffic: give the others a "
                                                     "traffic_split summing to 100")

            def finish() -> Any:
                target = self.endpoints[request.endpoint]
                kept = [d for d in target.deployed_models if d.id != request.deployed_model_id]
                del target.deployed_models[:]
                target.deployed_models.extend(kept)
                new = split or {k: int(v) for k, v in dict(target.traffic_split).items()
                                if k != request.deployed_model_id}
                target.traffic_split.clear()
                target.traffic_split.update(new)
                target.update_time = utc(time.time())
                self._stop_server(request.endpoint, request.deployed_model_id)
                return v1.UndeployModelResponse()

            metadata = v1.UndeployModelOperationMetadata(
                generic_metadata=v1.GenericOperationMetadata(create_time=utc(time.time())))
            return self.registry._operation(request.endpoint, finish, metadata)

    def mutate_deployed_model(self, request: Any) -> Any:
        from google.cloud import aiplatform_v1 as v1

        wanted = request.deployed_model
        with self._lock:
            endpoint = self._endpoint(request.endpoint)
            current = next((d for d in endpoint.deployed_models if d.id == wanted.id), None)
            if current is None:
                raise Invalid("NOT_FOUND", f"deployed model {wanted.id} not found")
            paths = set(request.update_mask.paths)
            allowed = {"dedicated_resources.min_replica_count",
                       "dedicated_resources.max_replica_count"}
            if not paths or paths - allowed:
                raise Invalid("INVALID_ARGUMENT", f"update_mask may name only {sorted(allowed)}")
            low = wanted.dedicated_resources.min_replica_count \
                if "dedicated_resources.min_replica_count" in paths \
                else current.dedicated_resources.min_replica_count
            high = wanted.dedicated_resources.max_replica_count \
                if "dedicated_resources.max_replica_count" in paths \
                else current.dedicated_resources.max_replica_count
            if low < 1 or high < low:
                raise Invalid("INVALID_ARGUMENT", "min_replica_count must be at least 1 and "
                                                  "max_replica_count at least min_replica_count")

            def finish() -> Any:
                current.dedicated_resources.min_replica_count = low
                current.dedicated_resources.max_replica_count = high
                return v1.MutateDeployedModelResponse(deployed_model=copy(current))

            metadata = v1.MutateDeployedModelOperationMetadata(
                generic_metadata=v1.GenericOperationMetadata(create_time=utc(time.time())))
            return self.registry._operation(request.endpoint, finish, metadata)

    def update_endpoint(self, request: Any) -> Any:
        paths = set(request.update_mask.paths)
        if paths != {"traffic_split"}:
            raise Invalid("INVALID_ARGUMENT", "the emulator updates traffic_split only")
        with self._lock:
            endpoint = self._endpoint(request.endpoint.name)
            split = {k: int(v) for k, v in dict(request.endpoint.traffic_split).items()}
            self._check_split(split, {d.id for d in endpoint.deployed_models})
            endpoint.traffic_split.clear()
            endpoint.traffic_split.update(split)
            endpoint.update_time = utc(time.time())
            return copy(endpoint)

    # --- PredictionService ------------------------------------------------------------------------

    def predict(self, request: Any) -> Any:
        from google.cloud import aiplatform_v1 as v1
        from google.protobuf import json_format

        raw = v1.PredictRequest.pb(request)
        instances = [json_format.MessageToDict(v) for v in raw.instances]
        if not instances:
            raise Invalid("INVALID_ARGUMENT", "instances must not be empty")
        with self._lock:
            endpoint = self._endpoint(request.endpoint)
            split = [(k, int(v)) for k, v in sorted(dict(endpoint.traffic_split).items()) if v]
            if not split:
                raise Invalid("FAILED_PRECONDITION", f"endpoint {request.endpoint} has no "
                                                     "deployed model with traffic")
            pick = self._random.uniform(0, sum(v for _, v in split))
            chosen = next(k for k, v in itertools.accumulate(
                split, lambda acc, kv: (kv[0], acc[1] + kv[1])) if pick <= v)
            deployed = next(d for d in endpoint.deployed_models if d.id == chosen)
            server = self.servers.get((request.endpoint, chosen))
            fault = self.faults.get((request.endpoint, chosen), Fault())
        start = time.perf_counter()
        try:
            if fault.delay_s:
                time.sleep(fault.delay_s)
            if fault.error_rate and self._random.random() < fault.error_rate:
                raise Invalid("INTERNAL", "the model server failed (injected fault)")
            if server is None or server.port is None:
                raise Invalid("UNAVAILABLE", f"deployed model {chosen} is not serving")
            predictions = self._post(server.port, instances)
        except Invalid as exc:
            self._count(request.endpoint, chosen, start, code=HTTP_STATUS.get(exc.code, "500"))
            raise
        self._count(request.endpoint, chosen, start, code="200")
        out = v1.PredictResponse.pb()(deployed_model_id=chosen, model=deployed.model,
                                      model_version_id=deployed.model_version_id,
                                      model_display_name=deployed.display_name)
        for value in predictions:
            json_format.ParseDict(value, out.predictions.add())
        return v1.PredictResponse.wrap(out)

    @staticmethod
    def _post(port: int, instances: list[Any]) -> list[Any]:
        import json

        body = json.dumps({"instances": instances}).encode()
        request = urllib.request.Request(f"http://127.0.0.1:{port}/predict", data=body,
                                         headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=PREDICT_TIMEOUT_S) as answer:
                return list(json.loads(answer.read())["predictions"])
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode(errors="replace")[:500]
            code = "INVALID_ARGUMENT" if exc.code == 400 else "INTERNAL"
            raise Invalid(code, f"the model server answered {exc.code}: {detail}") from exc
        except OSError as exc:
            raise Invalid("UNAVAILABLE", f"the model server is not answering: {exc}") from exc

    def _count(self, endpoint: str, deployed_id: str, start: float, *, code: str) -> None:
        seen = Served(time.time(), deployed_id, (time.perf_counter() - start) * 1000.0,
                      code == "200", code)
        with self._lock:
            kept = self.served.setdefault(endpoint, [])
            kept.append(seen)
            del kept[:-TRAFFIC_KEPT]

    # --- for tests and the demo -----------------------------------------------------------------

    def inject(self, endpoint: str, deployed_model_id: str, *, error_rate: float = 0.0,
               delay_s: float = 0.0) -> None:
        """Make a deployed model fail a share of its predictions, or answer late."""
        with self._lock:
            self.faults[(endpoint, deployed_model_id)] = Fault(error_rate, delay_s)

    def traffic(self, endpoint: str, since: float = 0.0) -> list[Served]:
        """The endpoint's predictions since a time (time.time()), oldest first."""
        with self._lock:
            return [s for s in self.served.get(endpoint, []) if s.at >= since]

    def all_traffic(self) -> dict[str, list[Served]]:
        """Every endpoint's predictions, oldest first (what Monitoring is sent)."""
        with self._lock:
            return {name: list(served) for name, served in self.served.items()}

    def _stop_server(self, endpoint: str, deployed_id: str) -> None:
        server = self.servers.pop((endpoint, deployed_id), None)
        if server is not None and server.process is not None and server.process.poll() is None:
            server.process.terminate()
            try:
                server.process.wait(5)
            except subprocess.TimeoutExpired:
                server.process.kill()

    def stop(self) -> None:
        """Stop every model server."""
        with self._lock:
            keys = list(self.servers)
        for endpoint, deployed_id in keys:
            self._stop_server(endpoint, deployed_id)

    # --- gRPC -----------------------------------------------------------------------------------

    def handlers(self) -> list[Any]:
        """The two services' handlers, callers checked by the registry's IAM policy."""
        import grpc
        from google.cloud import aiplatform_v1 as v1

        def rpc(fn: Callable[[Any], Any], request_type: Any, serialize: Any,
                method: str) -> Any:
            def handle(request: Any, context: Any) -> Any:
                try:
                    if self.registry.iam is not None:
                        self.registry.iam.check(method, context.invocation_metadata(), request)
                    return fn(request)
                except Invalid as exc:
                    context.abort(getattr(grpc.StatusCode, exc.code), str(exc))
            return grpc.unary_unary_rpc_method_handler(
                handle, request_deserializer=request_type.deserialize,
                response_serializer=serialize)

        def op_out(message: Any) -> bytes:
            return bytes(message.SerializeToString())

        def service(name: str, methods: dict[str, tuple[Callable[[Any], Any], Any, Any]]) -> Any:
            short = name.rsplit(".", 1)[1]
            return grpc.method_handlers_generic_handler(name, {
                method: rpc(fn, request_type, out, f"{short}/{method}")
                for method, (fn, request_type, out) in methods.items()})

        return [
            service(ENDPOINT_SERVICE, {
                "CreateEndpoint": (self.create_endpoint, v1.CreateEndpointRequest, op_out),
                "GetEndpoint": (self.get_endpoint, v1.GetEndpointRequest, v1.Endpoint.serialize),
                "DeployModel": (self.deploy_model, v1.DeployModelRequest, op_out),
                "UndeployModel": (self.undeploy_model, v1.UndeployModelRequest, op_out),
                "MutateDeployedModel": (self.mutate_deployed_model,
                                        v1.MutateDeployedModelRequest, op_out),
                "UpdateEndpoint": (self.update_endpoint, v1.UpdateEndpointRequest,
                                   v1.Endpoint.serialize),
            }),
            service(PREDICTION_SERVICE, {
                "Predict": (self.predict, v1.PredictRequest, v1.PredictResponse.serialize),
            }),
        ]
