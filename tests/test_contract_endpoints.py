"""One contract suite for the Endpoints port (issue 37): the in-memory twin, and the Vertex
adapter over the local emulator (the real aiplatform_v1 clients over gRPC, a local prediction
server loading a real scikit-learn model.joblib)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from spotorch.adapters.gcp.vertex_calls import RetryPolicy
from spotorch.adapters.memory.endpoints import MemoryEndpoints
from spotorch.ports.serving import NEW_MODEL, Endpoints, EndpointTraffic, ServingError

REGION = "us-central1"
PROJECT = "spotorch-test"
SKLEARN = "us-docker.pkg.dev/vertex-ai/prediction/sklearn-cpu.1-3:latest"
ROWS = [[2.0, 0.0, 0.0], [-2.0, 0.0, 0.0]]
METRICS_PERIOD_S = 0.5  # the emulator's Monitoring sampling period here


def write_model(folder: Path, flip: bool) -> None:
    """A real scikit-learn model.joblib: class 1 for a positive first feature (or the reverse)."""
    import joblib
    import numpy as np
    from sklearn.linear_model import LogisticRegression

    x = np.random.default_rng(0).normal(size=(200, 3))
    y = (x[:, 0] > 0).astype(int)
    folder.mkdir(parents=True, exist_ok=True)
    joblib.dump(LogisticRegression().fit(x, 1 - y if flip else y), folder / "model.joblib")


class EndpointsContract:
    @pytest.fixture
    def endpoints(self) -> Endpoints:
        raise NotImplementedError

    @pytest.fixture
    def versions(self) -> tuple[str, str]:
        raise NotImplementedError

    def test_deploy_predict_canary_split_then_all_traffic_and_undeploy(
            self, endpoints: Endpoints, versions: tuple[str, str]) -> None:
        first, second = versions
        name = endpoints.create(REGION, f"e{uuid.uuid4().hex[:8]}", "churn")
        assert endpoints.create(REGION, name.rsplit("/", 1)[1], "churn") == name  # idempotent
        one = endpoints.deploy(name, first, machine_type="n1-standard-2", min_replicas=1,
                               max_replicas=2, traffic={NEW_MODEL: 100})
        assert endpoints.deploy(name, first, machine_type="n1-standard-2", min_replicas=1,
                                max_replicas=2, traffic={NEW_MODEL: 100}) == one  # redelivered
        answer = endpoints.predict(name, ROWS)
        assert [float(p) for p in answer.predictions] == [1.0, 0.0]
        assert answer.deployed_model_id == one and answer.latency_ms > 0
        two = endpoints.deploy(name, second, machine_type="n1-standard-2", min_replicas=1,
                               max_replicas=1, traffic={one: 80, NEW_MODEL: 20})
        state = endpoints.get(name)
        assert state.traffic == {one: 80, two: 20}
        assert {d.model for d in state.deployed} == {first, second}
        seen = {endpoints.predict(name, ROWS[:1]).deployed_model_id for _ in range(40)}
        assert seen == {one, two}  # both take traffic
        with pytest.raises(ServingError) as err:
            endpoints.undeploy(name, one, {})  # it still has traffic
        assert err.value.permanent
        endpoints.set_traffic(name, {two: 100})
        endpoints.undeploy(name, one, {})
        endpoints.undeploy(name, one, {})  # already gone: done
        state = endpoints.get(name)
        assert [d.id for d in state.deployed] == [two] and state.traffic == {two: 100}
        assert [float(p) for p in endpoints.predict(name, ROWS).predictions] == [0.0, 1.0]
        endpoints.scale(name, two, 2, 3)
        (deployed,) = endpoints.get(name).deployed
        assert (deployed.min_replicas, deployed.max_replicas) == (2, 3)

    def test_a_started_deployment_is_polled_until_done(
            self, endpoints: Endpoints, versions: tuple[str, str]) -> None:
        name = endpoints.create(REGION, f"e{uuid.uuid4().hex[:8]}", "churn")
        operation = endpoints.start_deploy(name, versions[0], machine_type="n1-standard-2",
                                           min_replicas=1, max_replicas=1,
                                           traffic={NEW_MODEL: 100})
        assert operation.startswith(name)
        deadline = time.monotonic() + 60
        while (deployed := endpoints.deploy_result(operation)) is None:
            assert time.monotonic() < deadline
            time.sleep(0.1)
        assert endpoints.deploy_result(operation) == deployed  # asked again: the same
        state = endpoints.get(name)
        assert [d.id for d in state.deployed] == [deployed] and state.traffic == {deployed: 100}
        with pytest.raises(ServingError) as err:
            endpoints.deploy_result(f"{name}/operations/999999")
        assert err.value.permanent

    @pytest.fixture
    def traffic(self) -> EndpointTraffic:
        raise NotImplementedError

    @pytest.fixture
    def fail_all(self) -> Callable[[str, str], None]:
        """Make a deployed model fail every prediction (endpoint, deployed model id)."""
        raise NotImplementedError

    @pytest.fixture
    def settle(self) -> Callable[[], None]:
        """Wait until what was served is in the traffic's metrics."""
        return lambda: None

    def test_the_traffic_window_counts_a_deployed_models_predictions_failures_and_p95(
            self, endpoints: Endpoints, versions: tuple[str, str], traffic: EndpointTraffic,
            fail_all: Callable[[str, str], None], settle: Callable[[], None]) -> None:
        name = endpoints.create(REGION, f"e{uuid.uuid4().hex[:8]}", "churn")
        since = time.time() - 1.0
        one = endpoints.deploy(name, versions[0], machine_type="n1-standard-2", min_replicas=1,
                               max_replicas=1, traffic={NEW_MODEL: 100})
        for _ in range(5):
            endpoints.predict(name, ROWS)
        fail_all(name, one)
        for _ in range(2):
            with pytest.raises(ServingError):
                endpoints.predict(name, ROWS)
        settle()
        window = traffic.window(name, one, since)
        assert (window.count, window.errors) == (7, 2)
        assert window.p95_ms is not None and window.p95_ms > 0
        assert traffic.window(name, "999999", since).count == 0  # another deployed model's
        assert traffic.window(name, one, time.time() + 5).count == 0  # nothing since then

    def test_bad_splits_and_unknown_endpoints_are_refused(
            self, endpoints: Endpoints, versions: tuple[str, str]) -> None:
        name = endpoints.create(REGION, f"e{uuid.uuid4().hex[:8]}", "churn")
        with pytest.raises(ServingError) as err:
            endpoints.predict(name, ROWS)  # nothing deployed
        assert err.value.code == "FAILED_PRECONDITION"
        with pytest.raises(ServingError) as err:
            endpoints.deploy(name, versions[0], machine_type="n1-standard-2", min_replicas=1,
                             max_replicas=1, traffic={NEW_MODEL: 60})
        assert err.value.permanent and err.value.code == "INVALID_ARGUMENT"
        with pytest.raises(ServingError) as err:
            endpoints.get(name.replace(name.rsplit("/", 1)[1], "nope"))
        assert err.value.code == "NOT_FOUND"


class TestMemoryEndpoints(EndpointsContract):
    @pytest.fixture
    def endpoints(self, versions: tuple[str, str]) -> Endpoints:
        memory = MemoryEndpoints(PROJECT)
        memory.predictors[versions[0]] = lambda rows: [1.0 if r[0] > 0 else 0.0 for r in rows]
        memory.predictors[versions[1]] = lambda rows: [0.0 if r[0] > 0 else 1.0 for r in rows]
        return memory

    @pytest.fixture
    def traffic(self, endpoints: Endpoints) -> EndpointTraffic:
        assert isinstance(endpoints, MemoryEndpoints)
        return endpoints

    @pytest.fixture
    def fail_all(self, endpoints: Endpoints) -> Callable[[str, str], None]:
        assert isinstance(endpoints, MemoryEndpoints)
        return lambda name, deployed: endpoints.errors.__setitem__(deployed, 1.0)

    @pytest.fixture
    def versions(self) -> tuple[str, str]:
        model = f"projects/{PROJECT}/locations/{REGION}/models/churn"
        return f"{model}@1", f"{model}@2"


@pytest.fixture(scope="module")
def emulator(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from spotorch.local.vertex_emulator import VertexEmulator

    emu = VertexEmulator(PROJECT, workdir=Path(tmp_path_factory.mktemp("vertex")))
    emu.registry.operation_s = 0.1
    emu.monitoring.sample_period_s = METRICS_PERIOD_S  # Vertex: 60 s
    emu.start()
    yield emu
    emu.stop()


@pytest.fixture(scope="module")
def emulator_versions(emulator: Any, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    """Two versions of a real scikit-learn model registered in the emulator."""
    from spotorch.adapters.gcp.registry import VertexModelRegistry
    from spotorch.ports.registry import ModelUpload

    registry = VertexModelRegistry(PROJECT, endpoint=emulator.address)
    out = []
    for run, flip in (("r1", False), ("r2", True)):
        folder = tmp_path_factory.mktemp(run)
        write_model(folder, flip)
        out.append(registry.upload(ModelUpload(
            pipeline="churn", run_id=run, region=REGION, display_name="churn",
            artifact_uri=str(folder), serving_image=SKLEARN, labels={"spotorch_run": run})))
    return out[0], out[1]


@pytest.mark.emulator
class TestVertexEndpoints(EndpointsContract):
    @pytest.fixture
    def endpoints(self, emulator: Any) -> Endpoints:
        from spotorch.adapters.gcp.endpoints import VertexEndpoints

        return VertexEndpoints(PROJECT, endpoint=emulator.address,
                               retry=RetryPolicy(attempts=2, base_s=0.01, cap_s=0.02))

    @pytest.fixture
    def versions(self, emulator_versions: tuple[str, str]) -> tuple[str, str]:
        return emulator_versions

    @pytest.fixture
    def traffic(self, emulator: Any) -> EndpointTraffic:
        from spotorch.adapters.gcp.endpoint_traffic import MonitoringEndpointTraffic

        return MonitoringEndpointTraffic(PROJECT, endpoint=emulator.address)

    @pytest.fixture
    def fail_all(self, emulator: Any) -> Callable[[str, str], None]:
        return lambda name, deployed: emulator.endpoints.inject(name, deployed, error_rate=1.0)

    @pytest.fixture
    def settle(self) -> Callable[[], None]:
        return lambda: time.sleep(METRICS_PERIOD_S * 2 + 0.2)  # the last period closes

    def test_monitoring_shows_a_period_only_once_it_closed_and_refuses_what_it_cannot_read(
            self, endpoints: Endpoints, emulator: Any, versions: tuple[str, str]) -> None:
        from google.api_core import exceptions

        from spotorch.adapters.gcp.endpoint_traffic import MonitoringEndpointTraffic

        traffic = MonitoringEndpointTraffic(PROJECT, endpoint=emulator.address)
        name = endpoints.create(REGION, f"e{uuid.uuid4().hex[:8]}", "churn")
        one = endpoints.deploy(name, versions[0], machine_type="n1-standard-2", min_replicas=1,
                               max_replicas=1, traffic={NEW_MODEL: 100})
        emulator.monitoring.sample_period_s = 3600.0  # Vertex samples every 60 s: not yet
        try:
            since = time.time() - 1.0
            endpoints.predict(name, ROWS)
            assert traffic.window(name, one, since).count == 0
        finally:
            emulator.monitoring.sample_period_s = METRICS_PERIOD_S
        client = traffic._c()
        with pytest.raises(exceptions.InvalidArgument, match="does not understand"):
            list(client.list_time_series(request={
                "name": f"projects/{PROJECT}", "filter": 'metric.type = starts_with("x")',
                "interval": {"end_time": {"seconds": int(time.time())}}}))

    def test_a_model_server_that_cannot_load_fails_the_deploy_saying_why(
            self, endpoints: Endpoints, emulator: Any, tmp_path: Path) -> None:
        from spotorch.adapters.gcp.registry import VertexModelRegistry
        from spotorch.ports.registry import ModelUpload

        (tmp_path / "model.joblib").write_bytes(b"not a model")
        version = VertexModelRegistry(PROJECT, endpoint=emulator.address).upload(ModelUpload(
            pipeline="broken", run_id="r1", region=REGION, display_name="broken",
            artifact_uri=str(tmp_path), serving_image=SKLEARN, labels={"spotorch_run": "r1"}))
        name = endpoints.create(REGION, f"e{uuid.uuid4().hex[:8]}", "broken")
        with pytest.raises(ServingError, match="failed to start"):
            endpoints.deploy(name, version, machine_type="n1-standard-2", min_replicas=1,
                             max_replicas=1, traffic={NEW_MODEL: 100})

    def test_injected_errors_fail_predictions_and_are_counted(
            self, endpoints: Endpoints, emulator: Any, versions: tuple[str, str]) -> None:
        name = endpoints.create(REGION, f"e{uuid.uuid4().hex[:8]}", "churn")
        one = endpoints.deploy(name, versions[0], machine_type="n1-standard-2", min_replicas=1,
                               max_replicas=1, traffic={NEW_MODEL: 100})
        emulator.endpoints.inject(name, one, error_rate=1.0)
        with pytest.raises(ServingError) as err:
            endpoints.predict(name, ROWS)
        assert err.value.code == "INTERNAL"
        served = emulator.endpoints.traffic(name)
        assert [s.ok for s in served] == [False]
