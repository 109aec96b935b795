"""The operator API (function `api`) through functions-framework's HTTP test client."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from fakes import fake_deps
from operator_runs import deps_for, every_kind
from spotorch.adapters.memory.twins import InMemoryCheckpoints, InMemoryLauncher, InMemoryObjectStore
from spotorch.app.deps import Deps
from spotorch.core.model import Checkpoint
from spotorch.core.pipeline import Pipeline, Trigger
from spotorch.entrypoints import functions as entry

MAIN = str(Path(__file__).resolve().parent.parent / "functions" / "main.py")
ISO = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$")


def _client(monkeypatch: pytest.MonkeyPatch, deps: Deps) -> Any:
    import functions_framework

    monkeypatch.setattr(entry, "deps", lambda: deps)
    return functions_framework.create_app("api", MAIN, "http").test_client()


@pytest.fixture
def api(monkeypatch: pytest.MonkeyPatch) -> tuple[Any, Deps]:
    deps = fake_deps(Pipeline(name="demo", trigger=Trigger(bucket="landing"),
                              checkpoint_uri="gs://c/demo", output_uri="gs://m/demo"))
    assert isinstance(deps.objects, InMemoryObjectStore)
    deps.objects.put("landing", "x/part-0.csv", 1, b"x,y\n")  # a submit needs data there
    return _client(monkeypatch, deps), deps


@pytest.fixture
def stocked(monkeypatch: pytest.MonkeyPatch) -> tuple[Any, Deps, dict[str, Any]]:
    deps = deps_for()
    runs = every_kind(deps)
    return _client(monkeypatch, deps), deps, runs


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
    assert [r["run_id"] for r in client.get("/runs?status=active").get_json()["runs"]] == [run_id]
    cancelled = client.post("/cancel", json={"run_id": run_id, "reason": "bad data"})
    assert cancelled.get_json()["status"] == "CANCELLING"
    assert isinstance(deps.launcher, InMemoryLauncher)
    job = deps.launcher.job_of(run_id, 1)
    from spotorch.app.job_events import job_changed

    job_changed(deps, run_id, 1, deps.launcher.get(job))
    assert isinstance(deps.checkpoints, InMemoryCheckpoints)
    deps.checkpoints.latest_by_uri[f"gs://c/demo/{run_id}"] = Checkpoint(5, "gs://c/x/step-5")
    retried = client.post("/retry", json={"run_id": run_id})
    assert retried.status_code == 201
    assert retried.get_json()["attempts"][0]["resumed_from_step"] == 5
    # Finished runs are listed too: the cancelled one and its retry, newest first.
    assert [r["run_id"] for r in client.get("/runs").get_json()["runs"]] == \
        [retried.get_json()["run_id"], run_id]


def test_a_run_reads_with_iso_times_uris_and_its_ledger(
        stocked: tuple[Any, Deps, dict[str, Any]]) -> None:
    client, _, runs = stocked
    view = client.get(f"/run?run_id={runs['story'].run_id}").get_json()
    assert view["created_at"] == "2027-01-15T08:00:00Z"
    for attempt in view["attempts"]:
        assert ISO.match(attempt["started_at"]) and ISO.match(attempt["ended_at"])
    assert all(ISO.match(h["at"]) for h in view["history"])
    assert view["data_uri"] == "gs://landing/ops/batch-1/"
    assert view["model_uri"] == f"gs://models/ops/{runs['story'].run_id}" and view["model_ready"]
    assert view["cost"]["savings_pct"] == 10.2 and view["cost"]["lost_steps"] == 30
    assert [a["resumed_from_step"] for a in view["attempts"]] == [None, 100, 200]
    assert view["latest_checkpoint"]["step"] == 290


def test_every_run_is_listed_newest_first_with_filters(
        stocked: tuple[Any, Deps, dict[str, Any]]) -> None:
    client, _, runs = stocked
    ids = {k: r.run_id for k, r in runs.items()}

    def listed(query: str) -> list[str]:
        resp = client.get(f"/runs{query}")
        assert resp.status_code == 200, resp.get_json()
        return [r["run_id"] for r in resp.get_json()["runs"]]

    assert listed("") == [ids["queued"], ids["live"], ids["failed"], ids["story"]]
    assert listed("?status=failed") == [ids["failed"]]
    assert listed("?status=SUCCEEDED,queued") == [ids["queued"], ids["story"]]
    assert listed("?status=active") == [ids["queued"], ids["live"]]
    assert listed("?pipeline=nope") == []
    assert listed("?since=2027-01-15T09:00:00Z") == [ids["queued"], ids["live"]]
    row = client.get("/runs?status=SUCCEEDED").get_json()["runs"][0]
    assert row["cost"] > 0 and row["savings_pct"] == 10.2 and ISO.match(row["created_at"])


def test_listing_pages_through_every_run_once(stocked: tuple[Any, Deps, dict[str, Any]]) -> None:
    client, _, runs = stocked
    seen: list[str] = []
    token = ""
    for _ in range(10):
        body = client.get(f"/runs?limit=3&page_token={token}").get_json()
        seen += [r["run_id"] for r in body["runs"]]
        token = body["next_page_token"]
        if token is None:
            break
    assert len(seen) == len(set(seen)) == len(runs)


def test_rerun_starts_one_run_on_the_recorded_inputs(api: tuple[Any, Deps]) -> None:
    client, deps = api
    run_id = client.post("/submit", json={"pipeline": "demo", "data_uri": "gs://landing/x/",
                                          "request_id": "r1"}).get_json()["run_id"]
    client.post("/cancel", json={"run_id": run_id})
    assert isinstance(deps.launcher, InMemoryLauncher)
    from spotorch.app.job_events import job_changed

    job_changed(deps, run_id, 1, deps.launcher.get(deps.launcher.job_of(run_id, 1)))
    first = client.get(f"/run?run_id={run_id}").get_json()
    assert first["can_rerun"] and first["provenance"]["seed"] >= 0
    rerun = client.post("/rerun", json={"run_id": run_id, "request_id": "a"})
    assert rerun.status_code == 201
    view = rerun.get_json()
    assert view["rerun_of"] == run_id and view["run_id"] != run_id
    assert view["provenance"]["seed"] == first["provenance"]["seed"]
    again = client.post("/rerun", json={"run_id": run_id, "request_id": "a"}).get_json()
    assert again["run_id"] == view["run_id"]  # the same request: the same run
    assert deps.launcher.created == 2


@pytest.mark.parametrize(("method", "path", "body", "status", "words"), [
    ("GET", "/nope", None, 404, "no route"),
    ("POST", "/cancel", {}, 400, "missing field 'run_id'"),
    ("POST", "/cancel", [1, 2], 400, "must be a JSON object"),
    ("POST", "/submit", {"pipeline": "nope", "data_uri": "gs://b/x/"}, 409, "no pipeline"),
    ("POST", "/retry", {"run_id": "nope"}, 409, "no run"),
    ("POST", "/rerun", {"run_id": "nope"}, 409, "no run"),
    ("POST", "/rerun", {}, 400, "missing field 'run_id'"),
    ("GET", "/run?run_id=nope", None, 404, "no such run 'nope'"),
    ("GET", "/run", None, 400, "missing field 'run_id'"),
    ("GET", "/runs?status=WEIRD", None, 400, "unknown status 'WEIRD'"),
    ("GET", "/runs?since=yesterdayish", None, 400, "ISO 8601"),
    ("GET", "/runs?limit=0", None, 400, "limit must be between 1 and 500"),
    ("GET", "/runs?limit=ten", None, 400, "whole number"),
    ("GET", "/runs?page_token=%25%25", None, 400, "bad page token"),
])
def test_bad_requests_get_clear_errors(api: tuple[Any, Deps], method: str, path: str,
                                       body: Any, status: int, words: str) -> None:
    client, _ = api
    resp = client.open(path, method=method, json=body)
    assert resp.status_code == status
    assert words in resp.get_json()["error"]
