"""Registration refuses an artifact its prebuilt serving container cannot load (issue 37)."""

from __future__ import annotations

import pytest

from fakes import fake_deps
from spotorch.adapters.memory.registry import MemoryModelRegistry
from spotorch.adapters.memory.twins import InMemoryLauncher, InMemoryObjectStore, InMemoryPublisher
from spotorch.app.job_events import job_changed
from spotorch.app.runs import start_run
from spotorch.core.events import kind_of
from spotorch.core.model import JobPhase, RunStatus
from spotorch.core.pipeline import Pipeline, Trigger
from spotorch.core.servable import framework_of, servable_problem
from spotorch.core.sweep_spec import ModelRegistration

SKLEARN = "us-docker.pkg.dev/vertex-ai/prediction/sklearn-cpu.1-3:latest"
XGBOOST = "europe-docker.pkg.dev/vertex-ai/prediction/xgboost-cpu.1-7:latest"
TF = "us-docker.pkg.dev/vertex-ai/prediction/tf2-gpu.2-15:latest"


@pytest.mark.parametrize(("image", "framework"), [
    (SKLEARN, "sklearn"), (XGBOOST, "xgboost"), (TF, "tf2"),
    ("gcr.io/me/my-server:1", None), ("us-docker.pkg.dev/vertex-ai/training/sklearn-cpu.1-0", None),
    ("", None)])
def test_prebuilt_images_are_known_by_their_framework(image: str, framework: str | None) -> None:
    assert framework_of(image) == framework


@pytest.mark.parametrize(("image", "names", "problem"), [
    (SKLEARN, ["model.joblib", "metrics.json"], None),
    (SKLEARN, ["model.pkl"], None),
    (SKLEARN, ["model.npz", "metrics.json"], "loads model.joblib or model.pkl"),
    (SKLEARN, [], "which holds nothing"),
    (SKLEARN, ["model.joblib", "model.pkl"], "exactly one model file"),
    (XGBOOST, ["model.bst"], None),
    (XGBOOST, ["model.npz"], "model.bst or model.joblib or model.pkl"),
    (TF, ["saved_model.pb"], None),
    (TF, ["model.joblib"], "saved_model.pb"),
    ("gcr.io/me/my-server:1", ["anything"], None),  # a custom container: not ours to judge
])
def test_servable_problem(image: str, names: list[str], problem: str | None) -> None:
    found = servable_problem(image, "gs://m/churn/r1", names)
    assert (found is None) if problem is None else (found is not None and problem in found
                                                    and "gs://m/churn/r1" in found)


def run_to_registration(files: dict[str, bytes]) -> tuple[RunStatus, str | None, object]:
    p = Pipeline(name="churn", trigger=Trigger(bucket="b"), checkpoint_uri="gs://c/churn",
                 output_uri="gs://m/churn", model=ModelRegistration(serving_image=SKLEARN))
    deps = fake_deps(p)
    registry = MemoryModelRegistry("proj")
    deps.models = registry
    objects = deps.objects
    assert isinstance(objects, InMemoryObjectStore)
    for name, data in files.items():
        objects.put("m", f"churn/r1/{name}", 1, data)
    objects.put("m", "churn/r10/model.joblib", 1, b"x")  # another run's folder: not r1's
    start_run(deps, "churn", run_id="r1", data_uri="gs://b/d/", snapshot_id="1", reason="t")
    launcher = deps.launcher
    assert isinstance(launcher, InMemoryLauncher)
    job_changed(deps, "r1", 1, launcher.set_status(launcher.job_of("r1", 1), JobPhase.SUCCEEDED),
                event_id="ok")
    run = deps.runs.load("r1")[0]
    assert run is not None
    publisher = deps.publisher
    assert isinstance(publisher, InMemoryPublisher)
    (event,) = [e for e in publisher.events if kind_of(e["type"]) == "run.succeeded"]
    return run.status, run.model_name, event["data"].get("model_error")


def test_registration_refuses_a_model_the_serving_container_cannot_load() -> None:
    status, name, error = run_to_registration({"model.npz": b"x", "metrics.json": b"{}"})
    assert status is RunStatus.SUCCEEDED and name is None
    assert "cannot serve gs://m/churn/r1" in str(error) and "model.npz" in str(error)


def test_registration_takes_a_model_the_serving_container_loads() -> None:
    status, name, error = run_to_registration({"model.joblib": b"x", "model.npz": b"x"})
    assert status is RunStatus.SUCCEEDED and name is not None and error is None
