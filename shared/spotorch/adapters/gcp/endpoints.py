"""Endpoints on Vertex AI (aiplatform_v1 EndpointService and PredictionService; issue 37).

Clients are built on first use, one per region (one for the emulator); every call goes through
the same retry and classification as the registry's, failures become ServingError. Deploy,
undeploy and scale wait for their long-running operations.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

from spotorch.adapters.gcp.vertex_budgets import RequestBudget
from spotorch.adapters.gcp.vertex_calls import (
    RetryPolicy,
    call_with_retries,
    emulator_channel,
)
from spotorch.ports.budget import CRUD, SUBMIT, Budget
from spotorch.ports.serving import Deployed, EndpointState, Prediction, ServingError

T = TypeVar("T")
OPERATION_TIMEOUT_S = 1800.0  # a deployment can take many minutes on Vertex


def _region(name: str) -> str:
    parts = name.split("/")
    return parts[3] if len(parts) > 3 else ""


def _client(kind: str, endpoint: str | None, region: str, token: str | None) -> Any:
    from google.cloud import aiplatform_v1 as v1

    if kind == "endpoints":
        from google.cloud.aiplatform_v1.services.endpoint_service.transports.grpc import (
            EndpointServiceGrpcTransport,
        )
        if endpoint:
            return v1.EndpointServiceClient(transport=EndpointServiceGrpcTransport(
                channel=emulator_channel(endpoint, token)))
        return v1.EndpointServiceClient(
            client_options={"api_endpoint": f"{region}-aiplatform.googleapis.com"})
    from google.cloud.aiplatform_v1.services.prediction_service.transports.grpc import (
        PredictionServiceGrpcTransport,
    )
    if endpoint:
        return v1.PredictionServiceClient(transport=PredictionServiceGrpcTransport(
            channel=emulator_channel(endpoint, token)))
    return v1.PredictionServiceClient(
        client_options={"api_endpoint": f"{region}-aiplatform.googleapis.com"})


def _state(proto: Any) -> EndpointState:
    return EndpointState(
        name=str(proto.name),
        deployed=tuple(Deployed(id=str(d.id), model=f"{d.model.partition('@')[0]}@"
                                f"{d.model_version_id}" if d.model_version_id else str(d.model),
                                machine_type=str(d.dedicated_resources.machine_spec.machine_type),
                                min_replicas=int(d.dedicated_resources.min_replica_count),
                                max_replicas=int(d.dedicated_resources.max_replica_count))
                       for d in proto.deployed_models),
        traffic={str(k): int(v) for k, v in dict(proto.traffic_split).items()})


class VertexEndpoints:
    """ports.Endpoints on EndpointService and PredictionService."""

    def __init__(self, project: str, *, endpoint: str | None = None,
                 retry: RetryPolicy | None = None, budget: Budget | None = None,
                 call_timeout_s: float = 60.0, operation_timeout_s: float = OPERATION_TIMEOUT_S,
                 token: str | None = None) -> None:
        self.project = project
        self.endpoint = endpoint
        self.retry = retry or RetryPolicy()
        self.budget: Budget = budget or RequestBudget()
        self.call_timeout_s = call_timeout_s
        self.operation_timeout_s = operation_timeout_s
        self._token = token
        self._clients: dict[tuple[str, str], Any] = {}
        self._lock = threading.Lock()

    def _c(self, kind: str, region: str) -> Any:
        key = (kind, "" if self.endpoint else region)
        with self._lock:
            if key not in self._clients:
                self._clients[key] = _client(kind, self.endpoint, region, self._token)
            return self._clients[key]

    def _call(self, what: str, fn: Callable[[], T], *, attempts: int | None = None) -> T:
        return call_with_retries(what, fn, self.retry, ServingError, attempts=attempts)

    def create(self, region: str, endpoint_id: str, display_name: str) -> str:
        """Endpoints.create: GetEndpoint first, CreateEndpoint (an operation) when absent."""
        from google.api_core import exceptions as api
        from google.cloud import aiplatform_v1 as v1

        parent = f"projects/{self.project}/locations/{region}"
        name = f"{parent}/endpoints/{endpoint_id}"

        def find_or_create() -> str:
            client = self._c("endpoints", region)
            self.budget.take(region, (CRUD,))
            try:
                return str(client.get_endpoint(name=name, timeout=self.call_timeout_s).name)
            except api.NotFound:
                pass
            self.budget.take(region, (CRUD, SUBMIT))
            operation = client.create_endpoint(
                parent=parent, endpoint=v1.Endpoint(display_name=display_name),
                endpoint_id=endpoint_id, timeout=self.call_timeout_s)
            return str(operation.result(timeout=self.operation_timeout_s).name)

        return self._call(f"create the endpoint {name}", find_or_create)

    def get(self, name: str) -> EndpointState:
        """Endpoints.get: GetEndpoint."""
        region = _region(name)

        def read() -> EndpointState:
            self.budget.take(region, (CRUD,))
            return _state(self._c("endpoints", region).get_endpoint(
                name=name, timeout=self.call_timeout_s))

        return self._call(f"get {name}", read)

    def deploy(self, endpoint: str, model: str, *, machine_type: str, min_replicas: int,
               max_replicas: int, traffic: Mapping[str, int]) -> str:
        """Endpoints.deploy: DeployModel unless the version is there already, then its
        operation polled until done (operation_timeout_s)."""
        existing = self.get(endpoint).of_model(model)
        if existing is not None:
            return existing.id
        operation = self.start_deploy(endpoint, model, machine_type=machine_type,
                                      min_replicas=min_replicas, max_replicas=max_replicas,
                                      traffic=traffic)
        deadline = time.monotonic() + self.operation_timeout_s
        while (deployed := self.deploy_result(operation)) is None:
            if time.monotonic() > deadline:
                raise ServingError(f"deploy {model} on {endpoint}: {operation} not done after "
                                   f"{self.operation_timeout_s:g}s", permanent=False,
                                   code="DEADLINE_EXCEEDED")
            time.sleep(min(2.0, max(0.05, self.operation_timeout_s / 1000)))
        return deployed

    def start_deploy(self, endpoint: str, model: str, *, machine_type: str, min_replicas: int,
                     max_replicas: int, traffic: Mapping[str, int]) -> str:
        """Endpoints.start_deploy: one DeployModel call (not retried once sent: a retry could
        deploy twice), its operation's name."""
        from google.cloud import aiplatform_v1 as v1

        region = _region(endpoint)

        def start() -> str:
            client = self._c("endpoints", region)
            self.budget.take(region, (CRUD, SUBMIT))
            operation = client.deploy_model(
                endpoint=endpoint,
                deployed_model=v1.DeployedModel(
                    model=model, dedicated_resources=v1.DedicatedResources(
                        machine_spec=v1.MachineSpec(machine_type=machine_type),
                        min_replica_count=min_replicas, max_replica_count=max_replicas)),
                traffic_split=dict(traffic), timeout=self.call_timeout_s)
            return str(operation.operation.name)

        return self._call(f"deploy {model} on {endpoint}", start, attempts=1)

    def deploy_result(self, operation: str) -> str | None:
        """Endpoints.deploy_result: GetOperation of the DeployModel operation."""
        from google.cloud import aiplatform_v1 as v1

        region = _region(operation)

        def poll() -> str | None:
            client = self._c("endpoints", region)
            self.budget.take(region, (CRUD,))
            found = client.get_operation(request={"name": operation},
                                         timeout=self.call_timeout_s)
            if not found.done:
                return None
            if found.HasField("error") and found.error.code:
                raise ServingError(f"deployment {operation} failed: {found.error.message}",
                                   permanent=True, code=str(found.error.code))
            answer = v1.DeployModelResponse.deserialize(found.response.value)
            return str(answer.deployed_model.id)

        return self._call(f"poll {operation}", poll)

    def undeploy(self, endpoint: str, deployed_model_id: str, traffic: Mapping[str, int]) -> None:
        """Endpoints.undeploy: UndeployModel; a model already gone is done."""
        region = _region(endpoint)

        def remove() -> None:
            client = self._c("endpoints", region)
            self.budget.take(region, (CRUD,))
            found = _state(client.get_endpoint(name=endpoint, timeout=self.call_timeout_s))
            if all(d.id != deployed_model_id for d in found.deployed):
                return
            self.budget.take(region, (CRUD, SUBMIT))
            client.undeploy_model(endpoint=endpoint, deployed_model_id=deployed_model_id,
                                  traffic_split=dict(traffic), timeout=self.call_timeout_s
                                  ).result(timeout=self.operation_timeout_s)

        self._call(f"undeploy {deployed_model_id} from {endpoint}", remove)

    def set_traffic(self, endpoint: str, traffic: Mapping[str, int]) -> None:
        """Endpoints.set_traffic: UpdateEndpoint of traffic_split."""
        from google.cloud import aiplatform_v1 as v1
        from google.protobuf import field_mask_pb2

        region = _region(endpoint)

        def update() -> None:
            self.budget.take(region, (CRUD,))
            self._c("endpoints", region).update_endpoint(
                endpoint=v1.Endpoint(name=endpoint, traffic_split=dict(traffic)),
                update_mask=field_mask_pb2.FieldMask(paths=["traffic_split"]),
                timeout=self.call_timeout_s)

        self._call(f"split the traffic of {endpoint}", update)

    def scale(self, endpoint: str, deployed_model_id: str, min_replicas: int,
              max_replicas: int) -> None:
        """Endpoints.scale: MutateDeployedModel of the replica bounds."""
        from google.cloud import aiplatform_v1 as v1
        from google.protobuf import field_mask_pb2

        region = _region(endpoint)

        def mutate() -> None:
            self.budget.take(region, (CRUD, SUBMIT))
            self._c("endpoints", region).mutate_deployed_model(
                endpoint=endpoint,
                deployed_model=v1.DeployedModel(id=deployed_model_id,
                                                dedicated_resources=v1.DedicatedResources(
                                                    min_replica_count=min_replicas,
                                                    max_replica_count=max_replicas)),
                update_mask=field_mask_pb2.FieldMask(paths=[
                    "dedicated_resources.min_replica_count",
                    "dedicated_resources.max_replica_count"]),
                timeout=self.call_timeout_s).result(timeout=self.operation_timeout_s)

        self._call(f"scale {deployed_model_id} on {endpoint}", mutate)

    def predict(self, endpoint: str, instances: Sequence[Any]) -> Prediction:
        """Endpoints.predict: one Predict call, its round trip timed."""
        region = _region(endpoint)

        def ask() -> Prediction:
            start = time.perf_counter()
            answer = self._c("predictions", region).predict(
                endpoint=endpoint, instances=list(instances), timeout=self.call_timeout_s)
            latency = (time.perf_counter() - start) * 1000.0
            return Prediction(tuple(answer.predictions), str(answer.deployed_model_id), latency)

        # Not retried: a failed prediction is what the canary's error rate counts.
        return self._call(f"predict on {endpoint}", ask, attempts=1)
