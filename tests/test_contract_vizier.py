"""One contract suite for TrialSearch: the in-memory twin, and the Vizier adapter over the local
Vertex emulator's VizierService (the real aiplatform_v1.VizierServiceClient over gRPC)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from spotorch.adapters.gcp.vertex_calls import RetryPolicy
from spotorch.adapters.memory.vizier import MemoryTrialSearch
from spotorch.core.pareto import Objective
from spotorch.core.sweep_spec import Goal, Parameter, Scale
from spotorch.ports.vizier import (
    ACTIVE,
    COMPLETED,
    Measurement,
    SearchError,
    StudyConfig,
    TrialSearch,
)

REGION = "us-central1"
PROJECT = "spotorch-test"
PARAMS = (Parameter("lr", low=1e-4, high=1e-1, scale=Scale.LOG),
          Parameter("batch", values=(16, 32, 64)),
          Parameter("layers", low=1, high=4, integer=True),
          Parameter("opt", values=("adam", "sgd")),
          Parameter("bn", values=(True, False)))
ACC = Objective("accuracy", Goal.MAXIMIZE)
LAT = Objective("latency_p95_ms", Goal.MINIMIZE)


def config(name: str, *objectives: Objective, median: bool = False) -> StudyConfig:
    return StudyConfig(display_name=name, region=REGION, parameters=PARAMS,
                       objectives=objectives or (ACC,), median_stopping=median)


class SearchContract:
    @pytest.fixture
    def search(self) -> TrialSearch:
        raise NotImplementedError

    @pytest.fixture
    def name(self) -> str:
        return f"sweep-{uuid.uuid4().hex[:8]}"

    def test_the_same_display_name_finds_the_same_study(self, search: TrialSearch,
                                                        name: str) -> None:
        study = search.study(config(name))
        assert study.startswith(f"projects/{PROJECT}/locations/{REGION}/studies/")
        assert search.study(config(name)) == study
        assert search.study(config(f"{name}-other")) != study

    def test_suggestions_are_in_the_parameters_own_types_and_ranges(self, search: TrialSearch,
                                                                    name: str) -> None:
        study = search.study(config(name))
        trials = search.suggest(study, "c1", count=3)
        assert len(trials) == 3 and len({t.name for t in trials}) == 3
        for trial in trials:
            p = trial.params
            assert trial.state == ACTIVE and trial.client_id == "c1"
            assert isinstance(p["lr"], float) and 1e-4 <= p["lr"] <= 1e-1
            assert p["batch"] in (16, 32, 64) and isinstance(p["batch"], int)
            assert isinstance(p["layers"], int) and 1 <= p["layers"] <= 4
            assert p["opt"] in ("adam", "sgd") and p["bn"] in (True, False)

    def test_the_same_client_id_gets_its_pending_trial_again(self, search: TrialSearch,
                                                              name: str) -> None:
        study = search.study(config(name))
        first, = search.suggest(study, "sweep-t1")
        again, = search.suggest(study, "sweep-t1")  # redelivered: the same trial
        assert again.name == first.name and again.params == first.params
        other, = search.suggest(study, "sweep-t2")
        assert other.name != first.name
        search.complete(first.name, {"accuracy": 0.5})
        after, = search.suggest(study, "sweep-t1")  # completed: a new trial for the client
        assert after.name not in (first.name, other.name)
        assert len(search.trials(study)) == 3

    def test_measurements_go_on_until_the_trial_is_completed(self, search: TrialSearch,
                                                             name: str) -> None:
        study = search.study(config(name))
        trial, = search.suggest(study, "c")
        assert search.measure(trial.name, Measurement(10, {"accuracy": 0.4}))
        assert search.measure(trial.name, Measurement(20, {"accuracy": 0.6}))  # after a resume
        done = search.complete(trial.name, {"accuracy": 0.7, "latency_p95_ms": 12.0})
        assert done.state == COMPLETED and not done.infeasible
        assert done.final is not None and done.final["accuracy"] == pytest.approx(0.7)
        assert [m.step for m in search.trial(trial.name).measurements] == [10, 20]
        assert not search.measure(trial.name, Measurement(30, {"accuracy": 0.8}))

    def test_completing_twice_keeps_the_first_result(self, search: TrialSearch, name: str) -> None:
        study = search.study(config(name))
        trial, = search.suggest(study, "c")
        search.complete(trial.name, {"accuracy": 0.7})
        again = search.complete(trial.name, {"accuracy": 0.1})
        assert again.final is not None and again.final["accuracy"] == pytest.approx(0.7)

    def test_an_infeasible_trial_keeps_its_reason_and_is_never_optimal(
            self, search: TrialSearch, name: str) -> None:
        study = search.study(config(name))
        bad, good = search.suggest(study, "c", count=2)
        done = search.complete(bad.name, None, infeasible_reason="out of memory on every attempt")
        assert done.infeasible and done.infeasible_reason == "out of memory on every attempt"
        assert done.final is None
        search.complete(good.name, {"accuracy": 0.3})
        assert [t.name for t in search.optimal(study)] == [good.name]

    def test_the_optimal_trials_of_several_objectives_are_the_front(self, search: TrialSearch,
                                                                    name: str) -> None:
        study = search.study(config(name, ACC, LAT))
        a, b, c = search.suggest(study, "c", count=3)
        search.complete(a.name, {"accuracy": 0.9, "latency_p95_ms": 30.0})
        search.complete(b.name, {"accuracy": 0.8, "latency_p95_ms": 10.0})
        search.complete(c.name, {"accuracy": 0.7, "latency_p95_ms": 20.0})  # dominated by b
        assert {t.name for t in search.optimal(study)} == {a.name, b.name}

    def test_the_median_rule_stops_a_trial_worse_than_the_completed_ones(
            self, search: TrialSearch, name: str) -> None:
        study = search.study(config(name, median=True))
        done = search.suggest(study, "done", count=3)
        for trial in done:
            search.measure(trial.name, Measurement(5, {"accuracy": 0.8}))
            search.complete(trial.name, {"accuracy": 0.85})
        poor, fine = search.suggest(study, "running", count=2)
        search.measure(poor.name, Measurement(5, {"accuracy": 0.3}))
        search.measure(fine.name, Measurement(5, {"accuracy": 0.9}))
        assert search.should_stop(poor.name)
        assert not search.should_stop(fine.name)

    def test_without_a_stopping_rule_nothing_is_stopped(self, search: TrialSearch,
                                                        name: str) -> None:
        study = search.study(config(name))
        trial, = search.suggest(study, "c")
        search.measure(trial.name, Measurement(1, {"accuracy": 0.0}))
        assert not search.should_stop(trial.name)

    def test_an_unknown_trial_is_not_found(self, search: TrialSearch, name: str) -> None:
        study = search.study(config(name))
        with pytest.raises(SearchError) as err:
            search.trial(f"{study}/trials/999")
        assert err.value.code == "NOT_FOUND" and err.value.permanent

    def test_the_search_learns_a_known_optimum(self, search: TrialSearch, name: str) -> None:
        """A real optimizer: 24 trials on a bowl in log(lr) find a value near the optimum."""
        import math

        study = search.study(StudyConfig(
            display_name=name, region=REGION, objectives=(Objective("loss", Goal.MINIMIZE),),
            parameters=(Parameter("lr", low=1e-5, high=1.0, scale=Scale.LOG),)))
        best = math.inf
        for i in range(24):
            trial, = search.suggest(study, f"c{i}")
            loss = (math.log10(float(trial.params["lr"])) + 2.5) ** 2
            search.complete(trial.name, {"loss": loss})
            best = min(best, loss)
        assert best < 0.05  # within a factor 10**0.22 of lr = 10**-2.5


class TestInMemory(SearchContract):
    @pytest.fixture
    def search(self) -> TrialSearch:
        return MemoryTrialSearch(PROJECT)


@pytest.fixture(scope="module")
def emulator(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    from spotorch.local.vertex_emulator import VertexEmulator

    emu = VertexEmulator(PROJECT, workdir=Path(tmp_path_factory.mktemp("vertex")), seed=0)
    emu.registry.operation_s = 0.0  # done at once here; the test below makes one wait
    emu.start()
    yield emu
    emu.stop()


@pytest.mark.emulator
class TestVertexOnTheEmulator(SearchContract):
    @pytest.fixture
    def search(self, emulator: object) -> TrialSearch:
        from spotorch.adapters.gcp.vizier import VertexTrialSearch

        return VertexTrialSearch(PROJECT, endpoint=emulator.address,  # type: ignore[attr-defined]
                                 retry=RetryPolicy(attempts=2))

    def test_suggest_trials_is_an_operation_done_only_after_its_time(
            self, emulator: object, name: str) -> None:
        import grpc
        from google.cloud import aiplatform_v1 as v1
        from google.cloud.aiplatform_v1.services.vizier_service.transports.grpc import (
            VizierServiceGrpcTransport,
        )

        client = v1.VizierServiceClient(transport=VizierServiceGrpcTransport(
            channel=grpc.insecure_channel(emulator.address)))  # type: ignore[attr-defined]
        from spotorch.adapters.gcp.vizier import VertexTrialSearch

        study = VertexTrialSearch(PROJECT, endpoint=emulator.address).study(  # type: ignore[attr-defined]
            config(name))
        emulator.registry.operation_s = 0.5  # type: ignore[attr-defined]
        try:
            op = client.suggest_trials(request={"parent": study, "suggestion_count": 1,
                                                "client_id": "x"})
            assert not op.done()
            assert op.metadata.client_id == "x"
            got = op.result(timeout=10)
            assert len(got.trials) == 1 and got.trials[0].client_id == "x"
        finally:
            emulator.registry.operation_s = 0.0  # type: ignore[attr-defined]

    @pytest.mark.parametrize(("change", "words"), [
        ({"display_name": ""}, "display_name is required"),
        ({"metrics": []}, "at least one metric"),
        ({"goal": 0}, "a goal"),
        ({"parameters": []}, "at least one parameter"),
    ])
    def test_create_study_refuses_what_vizier_refuses(self, emulator: object, name: str,
                                                      change: dict[str, object],
                                                      words: str) -> None:
        import grpc
        from google.api_core import exceptions
        from google.cloud import aiplatform_v1 as v1
        from google.cloud.aiplatform_v1.services.vizier_service.transports.grpc import (
            VizierServiceGrpcTransport,
        )

        from spotorch.adapters.gcp.vizier import parameter_spec

        client = v1.VizierServiceClient(transport=VizierServiceGrpcTransport(
            channel=grpc.insecure_channel(emulator.address)))  # type: ignore[attr-defined]
        metrics = change.get("metrics", [v1.StudySpec.MetricSpec(
            metric_id="accuracy", goal=change.get("goal", 1))])
        params = change.get("parameters", [parameter_spec(PARAMS[0])])
        with pytest.raises(exceptions.InvalidArgument, match=words):
            client.create_study(parent=f"projects/{PROJECT}/locations/{REGION}", study=v1.Study(
                display_name=change.get("display_name", name),
                study_spec=v1.StudySpec(metrics=metrics, parameters=params)))

    def test_suggest_without_a_client_id_is_refused(self, emulator: object, name: str) -> None:
        import grpc
        from google.api_core import exceptions
        from google.cloud import aiplatform_v1 as v1
        from google.cloud.aiplatform_v1.services.vizier_service.transports.grpc import (
            VizierServiceGrpcTransport,
        )

        from spotorch.adapters.gcp.vizier import VertexTrialSearch

        study = VertexTrialSearch(PROJECT, endpoint=emulator.address).study(  # type: ignore[attr-defined]
            config(name))
        client = v1.VizierServiceClient(transport=VizierServiceGrpcTransport(
            channel=grpc.insecure_channel(emulator.address)))  # type: ignore[attr-defined]
        with pytest.raises(exceptions.InvalidArgument, match="client_id"):
            client.suggest_trials(request={"parent": study, "suggestion_count": 1})
