"""The operator API (function `api`) through functions-framework's HTTP test client."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from fakes import fake_deps
from spotorch import entry
from spotorch.domain import Checkpoint
from spotorch.memory import InMemoryCheckpoints, InMemoryLauncher
from spotorch.pipeline import Pipeline, Trigger
from spotorch.service import Deps

MAIN = str(Path(__file__).resolve().parent.parent / "functions" / "main.py")


@pytest.fixture
def api(monkeypatch: pytest.MonkeyPatch) -> tuple[Any, Deps]:
    import functions_framework

    deps = fake_deps(Pipeline(name="demo", trigger=Trigger(bucket="landing"),
                              checkpoint_uri="gs://c/demo", output_uri="gs://m/demo"))
    monkeypatch.setattr(entry, "deps", lambda: deps)
    return functions_framework.create_app("api", MAIN, "http").test_client(), deps


def test_submit_status_cancel_retry(api: tuple[Any, Deps]) -> None:
    client, deps = api
    resp = client.post("/submit", json={"pipeline": "demo", "data_uri": "gs://landing/x/",
                                        "request_id": "r1"})
    assert resp.status_code == 201
    run_id = resp.get_json()["run_id"]
    again = client.post("/submit", json={"pipeline": "demo", "data_uri": "gs://landing/x/",
                                         "request_id": "r1"})
    assert again.get_json()["run_id"] == run_id  # the same request id gives the same run
    assert client.get(f"/run?run_id={run_id}").get_json()["status"] == "STARTING"
    assert [r["run_id"] for r in client.get("/runs").get_json()["active"]] == [run_id]
    cancelled = client.post("/cancel", json={"run_id": run_id, "reason": "bad data"})
    assert cancelled.get_json()["status"] == "CANCELLING"
    assert isinstance(deps.launcher, InMemoryLauncher)
    job = deps.launcher.job_of(run_id, 1)
    from spotorch.service import job_changed

    job_changed(deps, run_id, 1, deps.launcher.get(job))
    assert isinstance(deps.checkpoints, InMemoryCheckpoints)
    deps.checkpoints.latest_by_uri[f"gs://c/demo/{run_id}"] = Checkpoint(5, "gs://c/x/step-5")
    retried = client.post("/retry", json={"run_id": run_id})
    assert retried.status_code == 201
    assert retried.get_json()["attempts"][0]["resumed_from_step"] == 5


@pytest.mark.parametrize(("method", "path", "body", "status", "words"), [
    ("GET", "/nope", None, 404, "no route"),
    ("POST", "/cancel", {}, 400, "missing field"),
    ("POST", "/submit", {"pipeline": "nope", "data_uri": "gs://b/x/"}, 409, "no pipeline"),
    ("POST", "/retry", {"run_id": "nope"}, 409, "no run"),
    ("GET", "/run?run_id=nope", None, 404, "no such run"),
])
def test_bad_requests_get_clear_errors(api: tuple[Any, Deps], method: str, path: str,
                                       body: Any, status: int, words: str) -> None:
    client, _ = api
    resp = client.open(path, method=method, json=body)
    assert resp.status_code == status
    assert words in resp.get_json()["error"]
