"""The port for serving a model version: a Vertex AI endpoint (issue 37)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from spotorch.core.canary import Window
from spotorch.core.errors import ServiceCallFailed

NEW_MODEL = "0"  # in a deploy's traffic split: the model being deployed (Vertex's convention)


@dataclass(frozen=True)
class Deployed:
    """One model version deployed on an endpoint."""

    id: str  # the deployed model id (Vertex's, numeric)
    model: str  # projects/P/locations/L/models/M@V
    machine_type: str
    min_replicas: int
    max_replicas: int


@dataclass(frozen=True)
class EndpointState:
    """An endpoint as the service reports it."""

    name: str  # projects/P/locations/L/endpoints/E
    deployed: tuple[Deployed, ...] = ()
    traffic: Mapping[str, int] = field(default_factory=dict)  # deployed id -> percent

    def of_model(self, model: str) -> Deployed | None:
        """The deployment of a version, if it is deployed here."""
        return next((d for d in self.deployed if d.model == model), None)


@dataclass(frozen=True)
class Prediction:
    """One Predict call's answer."""

    predictions: tuple[Any, ...]
    deployed_model_id: str
    latency_ms: float  # measured by the caller, round trip


class ServingError(ServiceCallFailed):
    """An endpoint call failed; `permanent` says whether retrying can help."""


class Endpoints(Protocol):
    """Vertex AI EndpointService and PredictionService, as much as serving needs."""

    def create(self, region: str, endpoint_id: str, display_name: str) -> str:
        """Create the endpoint (or find it: idempotent) and return its name."""
        ...

    def get(self, name: str) -> EndpointState:
        """The endpoint; ServingError(code NOT_FOUND) if absent."""
        ...

    def deploy(self, endpoint: str, model: str, *, machine_type: str, min_replicas: int,
               max_replicas: int, traffic: Mapping[str, int]) -> str:
        """Deploy a version (waiting for the operation) with this traffic split (NEW_MODEL for
        it) and return its deployed model id; a version already deployed there is returned."""
        ...

    def start_deploy(self, endpoint: str, model: str, *, machine_type: str, min_replicas: int,
                     max_replicas: int, traffic: Mapping[str, int]) -> str:
        """Start deploying a version with this split (NEW_MODEL for it), not waiting: the
        DeployModel operation's name. Each call deploys once more: the caller claims first."""
        ...

    def deploy_result(self, operation: str) -> str | None:
        """A DeployModel operation's deployed model id once it is done, None while it runs;
        ServingError (permanent) when the deployment failed, saying why."""
        ...

    def undeploy(self, endpoint: str, deployed_model_id: str, traffic: Mapping[str, int]) -> None:
        """Undeploy a model, the others taking this split (empty: as they are); absent: done."""
        ...

    def set_traffic(self, endpoint: str, traffic: Mapping[str, int]) -> None:
        """Move the endpoint's traffic split (summing to 100)."""
        ...

    def scale(self, endpoint: str, deployed_model_id: str, min_replicas: int,
              max_replicas: int) -> None:
        """Change a deployed model's replica bounds (MutateDeployedModel)."""
        ...

    def predict(self, endpoint: str, instances: Sequence[Any]) -> Prediction:
        """One Predict call."""
        ...


class EndpointTraffic(Protocol):
    """What the endpoint's metrics say of one deployed model's predictions (Cloud Monitoring's
    prediction/online error and latency series on Vertex)."""

    def window(self, endpoint: str, deployed_model_id: str, since: float) -> Window:
        """Predictions, failures and p95 latency since a time (seconds since the epoch)."""
        ...
