"""Issue 39's table of inputs: ids Firestore would refuse, JSON nested thousands of levels deep,
data URIs that escape their folder or name nothing. Never a 5xx; a 400 (or 404) naming what is
wrong from the api, an acknowledgement from an event function; every refusal recorded; no run
changed and no job launched."""

from __future__ import annotations

import base64
import json
import urllib.parse
from collections.abc import Mapping, Sequence
from typing import Any

import pytest

from spotorch.adapters.memory.twins import InMemoryLauncher, InMemoryObjectStore
from spotorch.app.deps import Deps
from spotorch.entrypoints.depth import MAX_JSON_DEPTH, json_depth, too_deep
from test_functions import client
from test_functions import deps as functions_deps  # noqa: F401  (the "deps" fixture it needs)
from test_hostile_input import (  # noqa: F401  (fixtures)
    api_client,
    deps,
    running,
)

# Ids Firestore refuses as document ids, each with the rule the answer must name.
FIRESTORE_IDS = [("a/b", "forward slash"), ("runs/x", "forward slash"), (".", "period"),
                 ("..", "period"), ("__x__", "reserve"), ("x" * 1501, "1500 bytes"),
                 ("é" * 751, "1500 bytes")]
ID_CASES: list[tuple[str, str, dict[str, str] | None, str]] = [
    case for i, rule in FIRESTORE_IDS for case in (
        ("GET", f"/sweep?sweep_id={urllib.parse.quote(i, safe='')}", None, rule),
        ("POST", "/cancel-sweep", {"sweep_id": i}, rule))]


def refused(stack: Deps, method: str, action: str) -> Sequence[Mapping[str, Any]]:
    return stack.docs.query("rejected_events", "event_type", f"api {method} /{action}")


@pytest.mark.parametrize(("method", "path", "body", "rule"), ID_CASES,
                         ids=[f"{c[0]} {c[1][:30]}" for c in ID_CASES])
def test_ids_firestore_refuses_answer_400_naming_the_rule(
        running: tuple[Deps, str], method: str, path: str, body: Any, rule: str) -> None:  # noqa: F811
    stack, run_id = running
    before, _ = stack.runs.load(run_id)
    resp = api_client().open(path, method=method, json=body)
    assert resp.status_code == 400, (resp.status_code, resp.data[:300])
    assert rule in resp.get_json()["error"], resp.get_json()
    assert refused(stack, method, path.split("?")[0].strip("/"))
    assert stack.runs.load(run_id)[0] == before


def test_submit_sweep_checks_its_pipeline_and_request_ids(running: tuple[Deps, str]) -> None:  # noqa: F811
    stack, _ = running
    for body in ({"pipeline": "a/b", "data_uri": "gs://landing/datasets/"},
                 {"pipeline": "demo", "data_uri": "gs://landing/datasets/", "request_id": "__x__"}):
        resp = api_client().post("/submit-sweep", json=body)
        assert resp.status_code == 400, resp.data[:300]
    assert len(refused(stack, "POST", "submit-sweep")) == 2


def deep(levels: int) -> str:
    return '{"a":' * levels + "1" + "}" * levels


@pytest.mark.parametrize("levels", [3000, 50_000])
def test_deep_json_gets_400_from_the_api_and_is_recorded(running: tuple[Deps, str],  # noqa: F811
                                                         levels: int) -> None:
    stack, _ = running
    for action in ("submit", "cancel", "submit-sweep"):
        resp = api_client().post(f"/{action}", data=deep(levels),
                                 headers={"Content-Type": "application/json"})
        assert resp.status_code == 400, (action, resp.status_code, resp.data[:200])
        assert f"nested {levels} levels deep" in resp.get_json()["error"]
    assert isinstance(stack.launcher, InMemoryLauncher) and stack.launcher.created == 1


def _binary(target: str, body: str, event_id: str) -> Any:
    headers = {"ce-specversion": "1.0", "ce-id": event_id, "ce-source": "//x",
               "ce-type": "google.cloud.audit.log.v1.written", "Content-Type": "application/json"}
    return client(target).post("/", headers=headers, data=body)


@pytest.mark.parametrize("levels", [3000, 50_000])
@pytest.mark.parametrize("target", ["on_table_changed", "on_job_event", "on_object_finalized",
                                    "on_tick", "on_run_event"])
def test_deep_json_is_acknowledged_and_recorded_by_every_event_function(
        running: tuple[Deps, str], target: str, levels: int) -> None:  # noqa: F811
    stack, run_id = running
    before, _ = stack.runs.load(run_id)
    resp = _binary(target, deep(levels), f"deep-{target}")
    assert resp.status_code < 300, (resp.status_code, resp.data[:200])  # no redelivery
    record, _ = stack.docs.get("rejected_events", f"deep-{target}")
    assert record is not None and "levels deep" in record["reason"]
    # The same nesting inside a Pub/Sub message's data.
    message = {"message": {"data": base64.b64encode(deep(levels).encode()).decode(),
                           "attributes": {}, "messageId": "m"}, "subscription": "s"}
    headers = {"ce-specversion": "1.0", "ce-id": f"deep-msg-{target}", "ce-source": "//p",
               "ce-type": "google.cloud.pubsub.topic.v1.messagePublished",
               "Content-Type": "application/json"}
    resp = client(target).post("/", headers=headers, data=json.dumps(message))
    assert resp.status_code < 500, (resp.status_code, resp.data[:200])
    assert stack.runs.load(run_id)[0] == before


def test_json_depth_reads_the_bytes_without_parsing() -> None:
    assert json_depth(b'{"a": [1, {"b": "[[[[{{{{"}]}') == 3  # brackets in strings do not count
    assert json_depth(b'"\\"[[["') == 0 and json_depth(b"12") == 0
    assert json_depth(b'["]\\"["]') == 1  # an escaped quote does not end a string
    assert too_deep("[" * (MAX_JSON_DEPTH + 1)) is not None and too_deep("[" * 5) is None


def test_json_depth_is_linear_in_an_unterminated_run_of_escaped_quotes() -> None:
    # A first version retried its string pattern from every quote: 14 s for 40 kB of this;
    # 400 kB would take hours. Linear, it is a fraction of a second (the bound is generous).
    import time

    started = time.perf_counter()
    assert json_depth(b'["' + b'\\"' * 200_000) == 1
    assert time.perf_counter() - started < 10.0


URI_CASES = [
    ("gs://landing/../../x/", 400, "'..' segment"),
    ("gs://landing/datasets/../../x/", 400, "'..' segment"),
    ("gs://landing/./datasets/", 400, "'.' segment"),
    ("gs://landing/datasets//a.csv", 400, "empty segment"),
    ("gs://elsewhere/datasets/", 400, "not in the bucket pipeline 'demo' watches"),
    ("gs:///datasets/", 400, "gs://bucket/path"),
    ("gs://landing/empty/", 404, "nothing at"),
    ("gs://landing/datasets/a.cs", 404, "nothing at"),
]


@pytest.mark.parametrize(("uri", "status", "words"), URI_CASES, ids=[c[0] for c in URI_CASES])
@pytest.mark.parametrize("action", ["submit", "submit-sweep"])
def test_submit_refuses_escaping_empty_and_foreign_data_uris(
        running: tuple[Deps, str], action: str, uri: str, status: int, words: str) -> None:  # noqa: F811
    stack, _ = running
    resp = api_client().post(f"/{action}", json={"pipeline": "demo", "data_uri": uri})
    assert resp.status_code == status, (resp.status_code, resp.data[:300])
    assert words in resp.get_json()["error"]
    assert refused(stack, "POST", action)
    assert isinstance(stack.launcher, InMemoryLauncher) and stack.launcher.created == 1


def test_submit_for_a_bucket_that_does_not_exist_answers_404(
        running: tuple[Deps, str], monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    stack, _ = running

    class NotFound(Exception):  # google.api_core's NotFound carries code 404
        code = 404

    def missing(*_args: Any) -> Any:
        raise NotFound("404 GET https://storage.googleapis.com/storage/v1/b/landing/o: The "
                       "specified bucket does not exist.")

    assert isinstance(stack.objects, InMemoryObjectStore)
    monkeypatch.setattr(stack.objects, "list_page", missing)
    resp = api_client().post("/submit", json={"pipeline": "demo", "data_uri": "gs://landing/x/"})
    assert resp.status_code == 404, resp.data[:300]
    assert "bucket gs://landing/ does not exist" in resp.get_json()["error"]


def test_submit_with_data_there_still_starts_a_run(running: tuple[Deps, str]) -> None:  # noqa: F811
    _, _ = running
    resp = api_client().post("/submit", json={"pipeline": "demo",
                                              "data_uri": "gs://landing/datasets/"})
    assert resp.status_code == 201, resp.data[:300]


def test_every_refused_call_is_recorded_also_an_unknown_route_and_a_body_not_an_object(
        running: tuple[Deps, str]) -> None:  # noqa: F811
    stack, _ = running
    assert api_client().post("/launch-everything", json={}).status_code == 404
    assert refused(stack, "POST", "launch-everything")
    resp = api_client().post("/cancel", data="[1, 2]", headers={"Content-Type": "application/json"})
    assert resp.status_code == 400 and "JSON object" in resp.get_json()["error"]
    assert any("JSON object" in r["reason"] for r in refused(stack, "POST", "cancel"))
