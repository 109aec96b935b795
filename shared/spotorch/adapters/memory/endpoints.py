"""In-memory twin of the Endpoints port: deployments and traffic splits as Vertex keeps them,
predictions answered by a function per model version (tests)."""

from __future__ import annotations

import itertools
import random
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from spotorch.core.canary import Window
from spotorch.ports.serving import NEW_MODEL, Deployed, EndpointState, Prediction, ServingError

Predictor = Callable[[Sequence[Any]], list[Any]]


class MemoryEndpoints:
    """Endpoints in memory; `predictors` answer Predict per version, `errors` fail a share."""

    def __init__(self, project: str = "local", *, seed: int = 0) -> None:
        self.project = project
        self.endpoints: dict[str, EndpointState] = {}
        self.predictors: dict[str, Predictor] = {}  # model version -> its predict
        self.default: Predictor | None = None  # for versions without their own
        self.errors: dict[str, float] = {}  # deployed id -> error rate
        self.deploys = 0
        self.operations: dict[str, str] = {}  # DeployModel operation -> deployed model id
        # Tests: DeployModel operations still running (deploy_result None), or failed (why)
        self.running = False
        self.failing: str | None = None
        self.served: list[tuple[float, str, str, float, bool]] = []  # at, endpoint, id, ms, ok
        self.latency_ms: dict[str, float] = {}  # deployed id -> latency it adds (injected)
        self.clock: Callable[[], float] = time.time
        self._ids = itertools.count(1000)
        self._random = random.Random(seed)
        self._lock = threading.RLock()

    def _get(self, name: str) -> EndpointState:
        found = self.endpoints.get(name)
        if found is None:
            raise ServingError(f"endpoint {name} not found", permanent=True, code="NOT_FOUND")
        return found

    @staticmethod
    def _check(traffic: Mapping[str, int], known: set[str]) -> dict[str, int]:
        split = {str(k): int(v) for k, v in traffic.items()}
        if set(split) - known or sum(split.values()) != 100 or min(split.values()) < 0:
            raise ServingError(f"invalid traffic_split {split}", permanent=True,
                               code="INVALID_ARGUMENT")
        return split

    def create(self, region: str, endpoint_id: str, display_name: str) -> str:
        """Endpoints.create."""
        name = f"projects/{self.project}/locations/{region}/endpoints/{endpoint_id}"
        with self._lock:
            self.endpoints.setdefault(name, EndpointState(name))
        return name

    def get(self, name: str) -> EndpointState:
        """Endpoints.get."""
        with self._lock:
            return self._get(name)

    def deploy(self, endpoint: str, model: str, *, machine_type: str, min_replicas: int,
               max_replicas: int, traffic: Mapping[str, int]) -> str:
        """Endpoints.deploy."""
        with self._lock:
            existing = self._get(endpoint).of_model(model)
            if existing is not None:
                return existing.id
            operation = self.start_deploy(endpoint, model, machine_type=machine_type,
                                          min_replicas=min_replicas, max_replicas=max_replicas,
                                          traffic=traffic)
            return self.operations[operation]

    def start_deploy(self, endpoint: str, model: str, *, machine_type: str, min_replicas: int,
                     max_replicas: int, traffic: Mapping[str, int]) -> str:
        """Endpoints.start_deploy: deployed at once (every call once more, as on Vertex), its
        result kept under an operation name."""
        with self._lock:
            state = self._get(endpoint)
            if min_replicas < 1 or max_replicas < min_replicas:
                raise ServingError("min_replica_count must be at least 1 and max at least min",
                                   permanent=True, code="INVALID_ARGUMENT")
            new_id = str(next(self._ids))
            split = {(new_id if k == NEW_MODEL else k): v for k, v in traffic.items()}
            known = {d.id for d in state.deployed} | {new_id}
            split = self._check(split, known) if split else \
                ({new_id: 100} if not state.deployed else dict(state.traffic))
            self.deploys += 1
            operation = f"{endpoint}/operations/{len(self.operations) + 1}"
            if self.failing is not None:  # a failed deployment changes nothing on the endpoint
                self.operations[operation] = ""
                return operation
            self.endpoints[endpoint] = EndpointState(
                endpoint, (*state.deployed, Deployed(new_id, model, machine_type, min_replicas,
                                                     max_replicas)), split)
            self.operations[operation] = new_id
            return operation

    def deploy_result(self, operation: str) -> str | None:
        """Endpoints.deploy_result: done at once; an unknown operation is NOT_FOUND."""
        with self._lock:
            if operation not in self.operations:
                raise ServingError(f"no operation {operation}", permanent=True, code="NOT_FOUND")
            if not self.operations[operation]:
                raise ServingError(f"deployment {operation} failed: {self.failing or 'failed'}",
                                   permanent=True, code="9")
            return None if self.running else self.operations[operation]

    def undeploy(self, endpoint: str, deployed_model_id: str, traffic: Mapping[str, int]) -> None:
        """Endpoints.undeploy."""
        with self._lock:
            state = self._get(endpoint)
            if all(d.id != deployed_model_id for d in state.deployed):
                return
            rest = tuple(d for d in state.deployed if d.id != deployed_model_id)
            if traffic:
                split = self._check(traffic, {d.id for d in rest})
            elif state.traffic.get(deployed_model_id, 0) > 0 and rest:
                raise ServingError(f"deployed model {deployed_model_id} has traffic",
                                   permanent=True, code="FAILED_PRECONDITION")
            else:
                split = {k: v for k, v in state.traffic.items() if k != deployed_model_id}
            self.endpoints[endpoint] = EndpointState(endpoint, rest, split)

    def set_traffic(self, endpoint: str, traffic: Mapping[str, int]) -> None:
        """Endpoints.set_traffic."""
        with self._lock:
            state = self._get(endpoint)
            split = self._check(traffic, {d.id for d in state.deployed})
            self.endpoints[endpoint] = EndpointState(endpoint, state.deployed, split)

    def scale(self, endpoint: str, deployed_model_id: str, min_replicas: int,
              max_replicas: int) -> None:
        """Endpoints.scale."""
        with self._lock:
            state = self._get(endpoint)
            if min_replicas < 1 or max_replicas < min_replicas:
                raise ServingError("min_replica_count must be at least 1 and max at least min",
                                   permanent=True, code="INVALID_ARGUMENT")
            if all(d.id != deployed_model_id for d in state.deployed):
                raise ServingError(f"deployed model {deployed_model_id} not found",
                                   permanent=True, code="NOT_FOUND")
            deployed = tuple(Deployed(d.id, d.model, d.machine_type, min_replicas, max_replicas)
                             if d.id == deployed_model_id else d for d in state.deployed)
            self.endpoints[endpoint] = EndpointState(endpoint, deployed, state.traffic)

    def predict(self, endpoint: str, instances: Sequence[Any]) -> Prediction:
        """Endpoints.predict: a deployed model by the split, its version's predictor."""
        start = time.perf_counter()
        with self._lock:
            state = self._get(endpoint)
            split = [(k, v) for k, v in sorted(state.traffic.items()) if v]
            if not split:
                raise ServingError(f"endpoint {endpoint} has no deployed model with traffic",
                                   permanent=True, code="FAILED_PRECONDITION")
            pick, chosen = self._random.uniform(0, sum(v for _, v in split)), split[-1][0]
            for key, share in split:
                pick -= share
                if pick <= 0:
                    chosen = key
                    break
            model = next(d.model for d in state.deployed if d.id == chosen)
            failing = self._random.random() < self.errors.get(chosen, 0.0)
        extra = self.latency_ms.get(chosen, 0.0)
        predictor = self.predictors.get(model) or self.default
        if failing or predictor is None:
            self.served.append((self.clock(), endpoint, chosen, extra, False))
            raise ServingError("the model server failed (injected)" if failing else
                               f"no predictor for {model}", permanent=False,
                               code="INTERNAL" if failing else "UNAVAILABLE")
        out = predictor(list(instances))
        latency = (time.perf_counter() - start) * 1000.0 + extra
        self.served.append((self.clock(), endpoint, chosen, latency, True))
        return Prediction(tuple(out), chosen, latency)

    def window(self, endpoint: str, deployed_model_id: str, since: float) -> Window:
        """EndpointTraffic.window over the predictions this twin answered."""
        with self._lock:
            seen = [(ms, ok) for at, e, d, ms, ok in self.served
                    if e == endpoint and d == deployed_model_id and at >= since]
        if not seen:
            return Window()
        times = sorted(ms for ms, _ in seen)
        return Window(len(seen), sum(1 for _, ok in seen if not ok),
                      times[min(len(times) - 1, max(0, -(-95 * len(times) // 100) - 1))])
