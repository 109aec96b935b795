"""One contract suite for ModelRegistry and ExperimentTracker: the in-memory twins, and the
Vertex adapters over the local emulator (the real aiplatform_v1 clients over gRPC)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from spotorch.adapters.gcp.vertex_calls import RetryPolicy
from spotorch.adapters.memory.registry import MemoryExperimentTracker, MemoryModelRegistry
from spotorch.ports.registry import (
    ALIAS_BEST,
    ALIAS_LATEST,
    ExperimentRun,
    ExperimentTracker,
    ModelRegistry,
    ModelUpload,
    RegistryError,
)

REGION = "us-central1"
PROJECT = "spotorch-test"


def upload(pipeline: str, run_id: str, aliases: tuple[str, ...] = (ALIAS_LATEST,)) -> ModelUpload:
    return ModelUpload(pipeline=pipeline, run_id=run_id, region=REGION, display_name=pipeline,
                       artifact_uri=f"gs://models/{pipeline}/{run_id}",
                       serving_image="us-docker.pkg.dev/vertex-ai/prediction/sklearn-cpu.1-3:latest",
                       labels={"spotorch_run": run_id, "spotorch_pipeline": pipeline,
                               "spotorch_snapshot": "daily-2025-11-29",
                               # provenance labels as spotorch.core.provenance.labels makes them
                               "spotorch_code_hash": "0123456789abcdef",
                               "spotorch_seed": "1234567"},
                       aliases=aliases)


class RegistryContract:
    @pytest.fixture
    def registry(self) -> ModelRegistry:
        raise NotImplementedError

    @pytest.fixture
    def tracker(self) -> ExperimentTracker:
        raise NotImplementedError

    @pytest.fixture
    def pipeline(self) -> str:
        return f"p-{uuid.uuid4().hex[:8]}"

    def test_the_first_upload_creates_the_model_with_its_first_version(
            self, registry: ModelRegistry, pipeline: str) -> None:
        name = registry.upload(upload(pipeline, "r1"))
        assert name == f"projects/{PROJECT}/locations/{REGION}/models/{pipeline}@1"
        version = registry.version(name)
        assert version.artifact_uri == f"gs://models/{pipeline}/r1"
        assert version.serving_image.startswith("us-docker.pkg.dev/")
        assert version.labels["spotorch_run"] == "r1"
        assert version.labels["spotorch_snapshot"] == "daily-2025-11-29"
        assert version.labels["spotorch_code_hash"] == "0123456789abcdef"
        assert set(version.aliases) == {"default", ALIAS_LATEST}

    def test_later_uploads_are_new_versions_and_aliases_move_to_them(
            self, registry: ModelRegistry, pipeline: str) -> None:
        first = registry.upload(upload(pipeline, "r1", (ALIAS_LATEST, ALIAS_BEST)))
        second = registry.upload(upload(pipeline, "r2", (ALIAS_LATEST,)))
        assert second.endswith("@2") and first.endswith("@1")
        assert set(registry.version(first).aliases) == {"default", ALIAS_BEST}
        assert registry.version(second).aliases == (ALIAS_LATEST,)

    def test_a_version_is_found_by_its_alias_as_vertex_resolves_model_at_alias(
            self, registry: ModelRegistry, pipeline: str) -> None:
        first = registry.upload(upload(pipeline, "r1", (ALIAS_LATEST, ALIAS_BEST)))
        second = registry.upload(upload(pipeline, "r2", (ALIAS_LATEST,)))
        model = first.rpartition("@")[0]
        assert registry.version(f"{model}@{ALIAS_LATEST}").name == second  # moved to r2
        assert registry.version(f"{model}@{ALIAS_BEST}").name == first
        assert registry.version(f"{model}@default").name == first
        with pytest.raises(RegistryError) as err:
            registry.version(f"{model}@nosuch")
        assert err.value.code == "NOT_FOUND"

    def test_an_upload_repeated_for_the_same_run_returns_the_same_version(
            self, registry: ModelRegistry, pipeline: str) -> None:
        name = registry.upload(upload(pipeline, "r1"))
        assert registry.upload(upload(pipeline, "r1")) == name
        assert registry.upload(upload(pipeline, "r2")).endswith("@2")

    def test_an_alias_moved_to_a_version_leaves_the_one_holding_it(
            self, registry: ModelRegistry, pipeline: str) -> None:
        first = registry.upload(upload(pipeline, "r1"))
        second = registry.upload(upload(pipeline, "r2"))
        registry.move_alias(first, "production")
        registry.move_alias(first, "production")  # idempotent
        assert set(registry.version(first).aliases) == {"default", "production"}
        registry.move_alias(second, "production")
        assert set(registry.version(first).aliases) == {"default"}
        assert set(registry.version(second).aliases) == {ALIAS_LATEST, "production"}
        with pytest.raises(RegistryError) as err:
            registry.move_alias(f"{second.rsplit('@', 1)[0]}@9", "production")
        assert err.value.permanent and err.value.code == "NOT_FOUND"

    def test_an_unknown_version_is_not_found(self, registry: ModelRegistry, pipeline: str) -> None:
        with pytest.raises(RegistryError) as err:
            registry.version(f"projects/{PROJECT}/locations/{REGION}/models/{pipeline}@9")
        assert err.value.code == "NOT_FOUND"

    def test_an_experiment_run_keeps_params_metrics_and_state_and_is_listed_once(
            self, tracker: ExperimentTracker, pipeline: str) -> None:
        run = ExperimentRun(experiment=pipeline, run_id="sw-t1", region=REGION,
                            params={"lr": 0.01, "opt": "adam"},
                            metrics={"loss": 0.25, "cost": 0.12, "savings": 0.3},
                            provenance={"seed": "1234567", "code_hash": "ab" * 32})
        name = tracker.log_run(run)
        assert name.startswith(f"projects/{PROJECT}/locations/{REGION}/metadataStores/default/contexts/")
        again = tracker.log_run(run)  # redelivered: the same run, listed once
        assert again == name
        got = tracker.read_run(name)
        assert got.params == {"lr": 0.01, "opt": "adam"} and got.metrics == run.metrics
        assert got.state == "COMPLETE" and got.run_id == "sw-t1" and got.experiment == pipeline
        assert got.provenance == {"seed": "1234567", "code_hash": "ab" * 32}
        other = tracker.log_run(ExperimentRun(experiment=pipeline, run_id="sw-t2", region=REGION,
                                              metrics={"loss": 0.5}, state="FAILED"))
        assert tracker.runs_of(pipeline, REGION) == (name, other)
        assert tracker.runs_of(f"{pipeline}-other", REGION) == ()


class TestInMemory(RegistryContract):
    @pytest.fixture
    def registry(self) -> ModelRegistry:
        return MemoryModelRegistry(PROJECT)

    @pytest.fixture
    def tracker(self) -> ExperimentTracker:
        return MemoryExperimentTracker(PROJECT)


@pytest.fixture(scope="module")
def address(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    from spotorch.local.vertex_emulator import VertexEmulator

    emulator = VertexEmulator(PROJECT, workdir=Path(tmp_path_factory.mktemp("vertex")))
    emulator.registry.operation_s = 0.2  # UploadModel's operation is polled, not instant
    yield emulator.start()
    emulator.stop()


@pytest.mark.emulator
class TestVertexOnTheEmulator(RegistryContract):
    @pytest.fixture
    def registry(self, address: str) -> ModelRegistry:
        from spotorch.adapters.gcp.registry import VertexModelRegistry

        return VertexModelRegistry(PROJECT, endpoint=address, retry=RetryPolicy(attempts=2))

    @pytest.fixture
    def tracker(self, address: str) -> ExperimentTracker:
        from spotorch.adapters.gcp.registry import VertexExperimentTracker

        return VertexExperimentTracker(PROJECT, endpoint=address, retry=RetryPolicy(attempts=2))

    def test_the_experiment_context_is_marked_as_the_sdk_marks_it(
            self, address: str, tracker: ExperimentTracker, pipeline: str) -> None:
        """The console lists an experiment whose context says experiment_deleted: false."""
        import grpc
        from google.cloud import aiplatform_v1 as v1
        from google.cloud.aiplatform_v1.services.metadata_service.transports.grpc import (
            MetadataServiceGrpcTransport,
        )

        from spotorch.ports.registry import context_id

        tracker.log_run(ExperimentRun(experiment=pipeline, run_id="r1", region=REGION))
        client = v1.MetadataServiceClient(transport=MetadataServiceGrpcTransport(
            channel=grpc.insecure_channel(address)))
        store = f"projects/{PROJECT}/locations/{REGION}/metadataStores/default"
        got = client.get_context(name=f"{store}/contexts/{context_id(pipeline)}")
        assert got.schema_title == "system.Experiment"
        assert dict(got.metadata) == {"experiment_deleted": False}

    def test_upload_is_a_long_running_operation_done_only_after_its_time(self, address: str,
                                                                         pipeline: str) -> None:
        import grpc
        from google.cloud import aiplatform_v1 as v1
        from google.cloud.aiplatform_v1.services.model_service.transports.grpc import (
            ModelServiceGrpcTransport,
        )

        client = v1.ModelServiceClient(transport=ModelServiceGrpcTransport(
            channel=grpc.insecure_channel(address)))
        op = client.upload_model(parent=f"projects/{PROJECT}/locations/{REGION}", model=v1.Model(
            display_name=pipeline, container_spec=v1.ModelContainerSpec(image_uri="img")))
        assert not op.done()  # the version does not exist yet
        result = op.result(timeout=10)
        assert op.done() and result.model_version_id == "1"
        assert client.get_model(name=result.model).version_id == "1"

    @pytest.mark.parametrize(("labels", "words"), [
        ({"spotorch_code_hash": "ABCDEF0123456789"}, "invalid label"),  # upper case
        ({"spotorch_rerun_of": "r" * 64}, "invalid label"),  # a 64-character value
        ({f"k{i}": "v" for i in range(65)}, "at most 64 labels"),
    ])
    def test_upload_refuses_labels_vertex_refuses(self, address: str, pipeline: str,
                                                  labels: dict[str, str], words: str) -> None:
        """Issue 30: provenance labels must be what Vertex accepts; the emulator refuses the rest
        (the adapter's label_value and core.provenance.labels keep ours inside the rules)."""
        import grpc
        from google.api_core import exceptions
        from google.cloud import aiplatform_v1 as v1
        from google.cloud.aiplatform_v1.services.model_service.transports.grpc import (
            ModelServiceGrpcTransport,
        )

        client = v1.ModelServiceClient(transport=ModelServiceGrpcTransport(
            channel=grpc.insecure_channel(address)))
        with pytest.raises(exceptions.InvalidArgument, match=words):
            client.upload_model(parent=f"projects/{PROJECT}/locations/{REGION}", model=v1.Model(
                display_name=pipeline, labels=labels,
                container_spec=v1.ModelContainerSpec(image_uri="img")))
