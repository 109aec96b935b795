"""Hostile input through functions-framework's test client: never a 5xx for input that can never
succeed, every rejection recorded, no run changed (issue 13, finding 5 and 6).

A table of known attacks plus hypothesis-generated payloads, posted as real CloudEvents.
"""

from __future__ import annotations

import base64
import json
import urllib.parse
from dataclasses import replace
from typing import Any

import pytest
from cloudevents.http import CloudEvent
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from spotorch.adapters.memory.twins import InMemoryLauncher
from spotorch.app.deps import Deps
from spotorch.core.model import RunStatus
from test_functions import deps as functions_deps  # noqa: F401  (the "deps" fixture)
from test_functions import landed, post, pubsub_event, signed, sink_line, storage_event

BIG = 2 ** 63


@pytest.fixture(params=["memory", pytest.param("firestore", marks=pytest.mark.emulator)])
def deps(request: pytest.FixtureRequest, functions_deps: Deps,  # noqa: F811 (a fixture)
         monkeypatch: pytest.MonkeyPatch) -> Deps:
    """The functions' dependencies: in memory (test_functions' fixture), and with runs and
    records on Google's Firestore emulator, which refuses what real Firestore refuses (bad ids,
    nested arrays, oversized documents): a rejection must happen before it, not by it."""
    if request.param == "memory":
        return functions_deps
    from spotorch.adapters.gcp.firestore import FirestoreDocumentStore
    from spotorch.app.run_store import DocumentRunStore
    from spotorch.entrypoints import functions as entry

    emulators = request.getfixturevalue("firestore_emulator")
    docs = FirestoreDocumentStore(project=emulators.project)
    on_firestore = replace(functions_deps, runs=DocumentRunStore(docs), docs=docs)
    monkeypatch.setattr(entry, "deps", lambda: on_firestore)
    return on_firestore


@pytest.fixture
def memory_deps(functions_deps: Deps) -> Deps:  # noqa: F811 (a fixture parameter, by pytest)
    """In memory only: for the generated examples (hundreds; the table runs on both)."""
    return functions_deps


def trainer(**fields: Any) -> bytes:
    base: dict[str, Any] = {"kind": "progress", "run_id": "demo-x", "attempt": 1, "step": 1}
    base.update(fields)
    return json.dumps({k: v for k, v in base.items() if v is not ...}).encode()


TRAINER_ATTACKS: list[bytes] = [
    *(trainer(run_id=rid) for rid in ("a/b", ".", "..", "__x__", "runs/../x", "", "x" * 2000,
                                      None, 7, ["r"], {"a": 1})),
    *(trainer(step=v) for v in ("Infinity", 1e400, BIG, -1, 1.5, True, "12a", [1])),
    *(trainer(attempt=v) for v in (0, -3, BIG, "two", 1e400, None)),
    *(trainer(metrics=v) for v in ("loss=1", [1, 2], {"loss": "NaN"}, {"x" * 500: 1},
                                   {str(i): i for i in range(100)}, {"loss": 1e400})),
    trainer(total_steps=0), trainer(exit_code=BIG), trainer(time="yesterday"),
    trainer(checkpoint_uri=12), trainer(event_id="a b"), trainer(kind="explode"),
    b"Infinity", b"[1,2]", b"\xff\xfe", b"{" * 50_000, b'{"run_id": "x"}', b"",
    # "Infinity" and 1e400 as JSON literals, not strings
    b'{"kind": "progress", "run_id": "demo-x", "attempt": 1, "step": Infinity}',
    b'{"kind": "progress", "run_id": "demo-x", "attempt": 1, "step": 1e400}',
    b'{"kind": "progress", "run_id": "demo-x", "attempt": 1e400, "step": 1}',
    b'{"kind": "progress", "run_id": "demo-x", "attempt": 1, "step": 1, "metrics": {"l": NaN}}',
]

# Lines of a job spotorch did not create (another team's, or forged): acknowledged, counted,
# nothing recorded or changed (entrypoints.functions._not_ours).
NOT_OURS: list[bytes] = [
    sink_line("projects/p/locations/us-central1/customJobs/999", "Job failed."),
    sink_line("projects/p/locations/us-central1/customJobs/999", "Job is running."),
]

JOB_ATTACKS: list[bytes] = [
    json.dumps({"resource": {"type": "ml_job", "labels": {"job_id": "../../x",
                                                          "project_id": "p-12345",
                                                          "task_name": "service"}},
                "textPayload": "Job failed.", "timestamp": "2026-11-29T10:00:00Z"}).encode(),
    json.dumps({"resource": {"type": "ml_job", "labels": {"job_id": "1", "project_id": "p-123",
                                                          "task_name": "service"}},
                "textPayload": "Job failed.", "timestamp": 1e400}).encode(),
    json.dumps({"resource": "ml_job", "textPayload": "Job failed."}).encode(),
    b"null", b"0", b'"text"', b"{}",
]


def object_attack(**data: Any) -> CloudEvent:
    base: dict[str, Any] = {"bucket": "landing", "name": "datasets/a.csv", "generation": "1",
            "metageneration": "1", "size": "1", "updated": "2026-11-29T10:00:00.000Z"}
    base.update(data)
    return CloudEvent({"type": "google.cloud.storage.object.v1.finalized", "id": "obj-attack",
                       "source": "//storage.googleapis.com/projects/_/buckets/landing"},
                      {k: v for k, v in base.items() if v is not ...})


OBJECT_ATTACKS: list[CloudEvent] = [
    object_attack(generation=str(BIG)), object_attack(generation="-1"),
    object_attack(generation="1e400"), object_attack(generation="Infinity"),
    object_attack(name="datasets/" + "x" * (1 << 20)), object_attack(name=...),
    object_attack(bucket=["landing"]), object_attack(size="huge"), object_attack(generation="77"),
    object_attack(updated="not a time"),
]


def assert_rejected_and_nothing_changed(deps: Deps, resp: Any, event_id: str) -> None:
    assert resp.status_code < 500, resp.data[:300]
    record, _ = deps.docs.get("rejected_events", event_id)
    assert record is not None and record["reason"], event_id
    assert isinstance(deps.launcher, InMemoryLauncher)


@pytest.fixture
def running(deps: Deps) -> tuple[Deps, str]:
    landed(deps, "datasets/a.csv")
    post("on_object_finalized", storage_event("datasets/a.csv"))
    run = deps.runs.active()[0]
    return deps, run.run_id


@pytest.mark.parametrize("payload", TRAINER_ATTACKS, ids=lambda b: repr(b[:60]))
def test_hostile_trainer_reports(running: tuple[Deps, str], payload: bytes) -> None:
    deps, run_id = running
    before, _ = deps.runs.load(run_id)
    resp = post("on_job_event", pubsub_event(payload, {"spotorch_source": "trainer"}, "attack"))
    assert_rejected_and_nothing_changed(deps, resp, "attack")
    after, _ = deps.runs.load(run_id)
    assert after == before


@pytest.mark.parametrize("payload", JOB_ATTACKS, ids=lambda b: repr(b[:60]))
def test_hostile_job_lines(running: tuple[Deps, str], payload: bytes) -> None:
    deps, run_id = running
    before, _ = deps.runs.load(run_id)
    resp = post("on_job_event", pubsub_event(payload, {}, "attack"))
    assert_rejected_and_nothing_changed(deps, resp, "attack")
    assert deps.runs.load(run_id)[0] == before


@pytest.mark.parametrize("payload", NOT_OURS, ids=lambda b: repr(b[-60:]))
def test_lines_of_jobs_spotorch_did_not_create_change_nothing(running: tuple[Deps, str],
                                                              payload: bytes) -> None:
    deps, run_id = running
    before, _ = deps.runs.load(run_id)
    resp = post("on_job_event", pubsub_event(payload, {}, "stranger"))
    assert resp.status_code < 500
    assert deps.docs.get("rejected_events", "stranger")[0] is None  # quiet: no write per line
    assert deps.runs.load(run_id)[0] == before


@pytest.mark.parametrize("event", OBJECT_ATTACKS, ids=range(len(OBJECT_ATTACKS)))
def test_hostile_object_events(deps: Deps, event: CloudEvent) -> None:
    resp = post("on_object_finalized", event)
    assert_rejected_and_nothing_changed(deps, resp, "obj-attack")
    assert deps.runs.active() == [] and isinstance(deps.launcher, InMemoryLauncher) \
        and deps.launcher.created == 0


@pytest.mark.parametrize("envelope", [
    {"message": {"data": "!!!not base64"}}, {"message": "x"}, {"message": {"data": 12}},
    {"message": {"data": base64.b64encode(b"{}").decode(), "attributes": ["a"]}}, [1], "text",
])
def test_hostile_pubsub_envelopes(deps: Deps, envelope: Any) -> None:
    event = CloudEvent({"type": "google.cloud.pubsub.topic.v1.messagePublished", "id": "env",
                        "source": "//pubsub.googleapis.com/projects/p/topics/t"}, envelope)
    for target in ("on_job_event", "on_tick", "on_run_event"):
        resp = post(target, event)
        assert resp.status_code < 500, (target, resp.data[:300])


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=40),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner,
                                                                max_size=6),
    max_leaves=20)
trainer_like = st.fixed_dictionaries(
    {}, optional={"kind": st.sampled_from(["progress", "checkpoint", "started", "x"]) | json_values,
                  "run_id": st.just("demo-x") | json_values, "attempt": json_values,
                  "step": json_values, "total_steps": json_values, "metrics": json_values,
                  "time": json_values, "exit_code": json_values, "event_id": json_values,
                  "checkpoint_uri": json_values})


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=trainer_like)
def test_generated_trainer_reports_never_answer_5xx(memory_deps: Deps,
                                                    body: dict[str, Any]) -> None:
    payload = json.dumps(body, allow_nan=True).encode()
    resp = post("on_job_event", pubsub_event(payload, {"spotorch_source": "trainer"}, "gen"))
    assert resp.status_code < 500, (body, resp.data[:300])


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=st.dictionaries(st.sampled_from(["resource", "textPayload", "jsonPayload",
                                             "timestamp", "labels"]), json_values, max_size=5))
def test_generated_job_entries_never_answer_5xx(memory_deps: Deps,
                                                body: dict[str, Any]) -> None:
    payload = json.dumps(body, allow_nan=True).encode()
    resp = post("on_job_event", pubsub_event(payload, {}, "gen"))
    assert resp.status_code < 500, (body, resp.data[:300])


# --- the operator api (function `api`): ids checked before they name a document ------------------

HOSTILE_IDS = ("a/b", "../x", "__x__", ".", "..", "runs/../x", "x" * 2000, "a b", "é", "-x",
               "x.", "a..b")
API_ATTACKS: list[tuple[str, str, Any]] = [
    *((method, path, body) for rid in HOSTILE_IDS for method, path, body in (
        ("GET", f"/run?run_id={urllib.parse.quote(rid)}", None),
        ("POST", "/cancel", {"run_id": rid}),
        ("POST", "/retry", {"run_id": rid}),
        ("POST", "/submit", {"pipeline": rid, "data_uri": "gs://landing/x/"}),
        ("GET", f"/runs?pipeline={urllib.parse.quote(rid)}", None))),
    *(("POST", "/cancel", {"run_id": v}) for v in (["a"], {"a": 1}, True, 1e400, None)),
    ("POST", "/retry", {"run_id": "demo-x", "request_id": "a/b"}),
    ("POST", "/retry", {"run_id": "demo-x", "request_id": "__x__"}),
    ("POST", "/submit", {"pipeline": "demo", "data_uri": "gs://landing/x/",
                         "request_id": "../../x"}),
    ("POST", "/submit", {"pipeline": "demo", "data_uri": "x" * 5000}),
    ("POST", "/submit", {"pipeline": "demo", "data_uri": {"a": 1}}),
    ("POST", "/cancel", {"run_id": "demo-x", "reason": "x" * 5000}),
    ("GET", "/runs?page_token=../../x", None), ("GET", "/runs?limit=1e400", None),
    ("GET", "/runs?limit=-1", None), ("GET", "/runs?since=9999-99-99", None),
    ("GET", "/runs?status=__x__", None),
]


def api_client() -> Any:
    import functions_framework

    from test_functions import MAIN

    return functions_framework.create_app("api", MAIN, "http").test_client()


@pytest.mark.parametrize(("method", "path", "body"), API_ATTACKS,
                         ids=lambda v: repr(v)[:50] if not isinstance(v, str) else v[:50])
def test_hostile_api_requests(running: tuple[Deps, str], method: str, path: str,
                              body: Any) -> None:
    """Finding: the api answered 500 for run ids a/b, ../x, __x__ on /cancel, /retry, GET /run
    (Firestore: "A document must have an even number of path elements", "Resource id __x__ is
    reserved"). Now: 4xx with a message, a refused request recorded, no run changed."""
    deps, run_id = running
    before, _ = deps.runs.load(run_id)
    resp = api_client().open(path, method=method, json=body)
    assert 400 <= resp.status_code < 500, (resp.status_code, resp.data[:300])
    assert resp.get_json()["error"]
    if resp.status_code == 400:
        action = path.split("?")[0].strip("/")
        records = deps.docs.query("rejected_events", "event_type", f"api {method} /{action}")
        assert records and records[0]["reason"], (method, path)
    assert deps.runs.load(run_id)[0] == before
    assert isinstance(deps.launcher, InMemoryLauncher) and deps.launcher.created == 1


def test_the_run_still_works_after_the_attacks(running: tuple[Deps, str]) -> None:
    deps, run_id = running
    for i, payload in enumerate(TRAINER_ATTACKS + NOT_OURS + JOB_ATTACKS):
        post("on_job_event", pubsub_event(payload, {"spotorch_source": "trainer"}, f"a{i}"))
    report = json.loads(trainer(run_id=run_id, step=5, total_steps=100))
    assert post("on_job_event", pubsub_event(*signed(deps, report), "real")).status_code == 200
    after, _ = deps.runs.load(run_id)
    assert after is not None and after.progress.step == 5 and after.status is RunStatus.STARTING
