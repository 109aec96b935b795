"""The operator commands of issue 29 through click's runner and as processes: one way to find the
stack, snapshots, the error of a failed attempt, following a run across attempts, sweeps from
the CLI and the api, the dead letters of the local stack."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from operator_runs import SWEEP_PIPELINE, TRACEBACK, arrivals, sweeps
from spotorch.adapters.memory.twins import InMemoryLauncher
from spotorch.app.deps import Deps
from spotorch.app.job_events import job_changed, trainer_reported
from spotorch.app.queries import DocumentArrivalReader
from spotorch.core.model import FailureClass, JobPhase, Run
from spotorch.core.observations import TrainerReported
from spotorch.local.emulators import free_port
from spotorch.operate.backend import Backend
from test_cli import ApiActions, _worker_log, invoke

ROOT = Path(__file__).resolve().parent.parent
SPOTORCH = [sys.executable, "-m", "spotorch.operate.cli"]
World = tuple[Backend, Deps, dict[str, Run]]


@pytest.fixture(autouse=True)
def quiet_spotorch_logs() -> Iterator[None]:
    """As test_cli: the app code run in-process logs INFO lines into the CLI's captured output."""
    logger = logging.getLogger("spotorch")
    level = logger.level
    logger.setLevel(logging.WARNING)
    yield
    logger.setLevel(level)


@pytest.fixture
def world(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> World:
    """test_cli's world: runs of every kind, actions through the real api handler."""
    from operator_runs import deps_for, every_kind
    from spotorch.app.queries import DocumentRunReader, DocumentSweepReader
    from spotorch.operate.logsource import LocalWorkerLogs

    deps = deps_for()
    runs = every_kind(deps)
    backend = Backend(reader=DocumentRunReader(deps.docs), sweeps=DocumentSweepReader(deps.docs),
                      actions=ApiActions(deps, monkeypatch),
                      logs=LocalWorkerLogs(tmp_path / "vertex", poll_s=0.05),
                      pipelines=deps.pipelines, clock=deps.clock.now)
    return backend, deps, runs


def reply(output: str) -> Any:
    """The command's JSON, among the in-process api's own log lines (one JSON object a line)."""
    start = output.index("{\n") if output.startswith("{\n") else output.index("\n{\n") + 1
    return json.JSONDecoder().raw_decode(output[start:])[0]


def test_show_and_watch_give_the_failed_attempts_stderr_tail(world: World) -> None:
    backend, _, runs = world
    failed = runs["failed"]
    text = invoke(backend, "show", failed.run_id).output
    assert "attempt 2's error (the last lines of its stderr):" in text
    assert f"| {TRACEBACK[-1]}" in text and f"| {TRACEBACK[1]}" in text
    view = json.loads(invoke(backend, "show", failed.run_id, "--json").output)
    assert [a["error"] for a in view["attempts"]] == [TRACEBACK[-1]] * 2
    assert view["attempts"][1]["error_tail"] == list(TRACEBACK)
    watched = invoke(backend, "watch", failed.run_id)
    assert watched.exit_code == 1 and f"  | {TRACEBACK[-1]}" in watched.output
    changes = [json.loads(line) for line in
               invoke(backend, "watch", failed.run_id, "--json").output.splitlines()
               if line.startswith("{")]
    assert any(c["change"] == f"  | {TRACEBACK[-1]}" for c in changes)


def test_snapshots_account_for_every_upload(world: World) -> None:
    backend, deps, _ = world
    folders = arrivals(deps)
    backend.arrivals = DocumentArrivalReader(deps.docs)
    data = json.loads(invoke(backend, "snapshots", "--json").output)
    by_uri = {s["data_uri"]: s for s in data["snapshots"]}
    waiting = by_uri[folders["waiting"]]
    assert waiting["state"] == "open" and "waiting for its marker _DONE" in waiting["summary"]
    started = by_uri[folders["started"]]
    assert started["state"] == "started" and started["started"].startswith("nightly-")
    assert started["run_status"] == "STARTING"
    strays = {u["uri"]: u for u in data["unmatched"]}
    [marker] = strays[folders["wrong marker"]]["objects"]
    assert marker["name"].endswith("/_SUCCESS")
    nightly = next(m for m in marker["misses"] if m["pipeline"] == "nightly")
    assert nightly["expected"]["marker"] == "_DONE" and "marker is _DONE" in nightly["text"]
    typo = strays[folders["wrong prefix"]]["objects"][0]["misses"]
    assert any(m["rule"] == "prefix" and m["expected"]["prefix"] == "nightly/" for m in typo)
    text = invoke(backend, "snapshots").output
    assert "open: waiting for its marker _DONE" in text and "matched no pipeline" in text


def test_logs_follow_the_run_across_its_attempts(world: World) -> None:
    backend, deps, runs = world
    live = runs["live"]
    _worker_log(backend, live, 1, "attempt 1 step 40\n")
    launcher = deps.launcher
    assert isinstance(launcher, InMemoryLauncher)
    backend.poll_s = 0.05
    job = launcher.job_of(live.run_id, 1)

    def preempt_then_finish() -> None:
        time.sleep(0.3)
        job_changed(deps, live.run_id, 1, launcher.set_status(
            job, JobPhase.FAILED, failure=FailureClass.PREEMPTED))
        second = launcher.job_of(live.run_id, 2)
        fresh = deps.runs.load(live.run_id)[0]
        assert fresh is not None
        _worker_log(backend, fresh, 2, "attempt 2 resumed\n")
        job_changed(deps, live.run_id, 2, launcher.set_status(second, JobPhase.RUNNING))
        time.sleep(0.3)
        trainer_reported(deps, live.run_id, TrainerReported(2, "progress", deps.clock.now(),
                                                            step=300, total_steps=300))
        job_changed(deps, live.run_id, 2, launcher.set_status(second, JobPhase.SUCCEEDED))

    worker = threading.Thread(target=preempt_then_finish)
    worker.start()
    result = invoke(backend, "logs", live.run_id, "--follow")
    worker.join()
    assert result.exit_code == 0, result.output
    assert result.output == "attempt 1 step 40\n--- attempt 2 ---\nattempt 2 resumed\n"


def test_sweeps_from_the_cli_through_the_api(world: World) -> None:
    backend, deps, _ = world
    made = sweeps(deps)
    listing = invoke(backend, "sweeps", "--json")
    assert listing.exit_code == 0 and len(json.loads(listing.output)["sweeps"]) == 2
    done = made["done"]
    shown = json.loads(invoke(backend, "sweep", "show", done.sweep_id, "--json").output)
    assert shown == json.loads(invoke(backend, "sweep", done.sweep_id, "--json").output)
    stopped = next(t for t in shown["trials"] if t["stopped_early"])
    assert stopped["stop_reason"].startswith("median stopping: best loss")
    submitted = invoke(backend, "sweep", "submit", SWEEP_PIPELINE.name,
                       "gs://landing/tune/day-9/", "--request-id", "cli", "--json")
    assert submitted.exit_code == 0, submitted.output
    new = reply(submitted.output)
    assert new["status"] in ("RUNNING", "QUEUED") and new["trials_total"] == 4
    again = reply(invoke(backend, "sweep", "submit", SWEEP_PIPELINE.name,
                         "gs://landing/tune/day-9/", "--request-id", "cli", "--json").output)
    assert again["sweep_id"] == new["sweep_id"]  # the same request: the same sweep
    cancelled = invoke(backend, "sweep", "cancel", new["sweep_id"], "--json")
    assert reply(cancelled.output)["status"] in ("CANCELLING", "CANCELLED")
    not_a_sweep = invoke(backend, "sweep", "submit", "ops", "gs://landing/ops/batch-1/")
    assert not_a_sweep.exit_code == 1 and not_a_sweep.output.startswith("spotorch: ")


def test_the_more_line_keeps_the_filters_and_the_page_size(world: World) -> None:
    backend, _, _ = world
    text = invoke(backend, "runs", "--limit", "1", "--status", "active").output
    more = [line for line in text.splitlines() if line.startswith("more:")]
    assert more and more[0].startswith("more: spotorch runs --status active --limit 1 "
                                       "--page-token ")


# ---------------------------------------------------------------- one way to find the stack

def _state(tmp_path: Path, env: dict[str, str], **extra: Any) -> Path:
    state = tmp_path / f"stack-{uuid.uuid4().hex[:6]}.json"
    state.write_text(json.dumps({"status": "ready", "supervisor": {"pid": os.getpid()},
                                 "run_dir": str(tmp_path), "env": env, **extra}))
    return state


def test_the_state_file_is_found_by_option_after_the_command_or_by_spotorch_state(
        tmp_path: Path) -> None:
    port = free_port()  # nothing listens: the message names the emulator the state file gave
    state = _state(tmp_path, {"SPOTORCH_PROJECT": "spotorch-local",
                              "FIRESTORE_EMULATOR_HOST": f"127.0.0.1:{port}",
                              "SPOTORCH_API_URL": "http://127.0.0.1:9/"})
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SPOTORCH_", "FIRESTORE_"))}
    env["XDG_CONFIG_HOME"] = str(tmp_path)
    expected = f"the local stack's Firestore emulator at 127.0.0.1:{port}"
    for argv, extra in (([*SPOTORCH, "runs", "--state", str(state)], {}),
                        ([*SPOTORCH, "--state", str(state), "runs"], {}),
                        ([*SPOTORCH, "runs"], {"SPOTORCH_STATE": str(state)}),
                        ([*SPOTORCH, "show", "x", "--state", str(state)], {})):
        done = subprocess.run(argv, env={**env, **extra}, capture_output=True, text=True,
                              timeout=60, cwd=tmp_path)
        assert done.returncode == 1 and expected in done.stderr, (argv, done.stderr)
        assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1


def test_missing_google_credentials_are_one_sentence_saying_what_to_do(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SPOTORCH_", "FIRESTORE_", "GOOGLE_", "PUBSUB_"))}
    env.update(XDG_CONFIG_HOME=str(tmp_path), GOOGLE_APPLICATION_CREDENTIALS=str(
        tmp_path / "none.json"), SPOTORCH_PROJECT="acme", HOME=str(tmp_path),
        CLOUDSDK_CONFIG=str(tmp_path / "gcloud"))
    for args in (("runs",), ("logs", "r"), ("dead-letters",), ("snapshots",)):
        done = subprocess.run([*SPOTORCH, *args, "--state", str(tmp_path / "none.json")],
                              env=env, capture_output=True, text=True, timeout=120, cwd=tmp_path)
        assert done.returncode == 1, (args, done.stderr)
        assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1, \
            (args, done.stderr)
        assert done.stderr.startswith("spotorch: ") and "gcloud auth application-default login" \
            in done.stderr, (args, done.stderr)


@pytest.mark.emulator
def test_dead_letters_read_the_local_stacks_hold_subscription(emulators: Any,
                                                              tmp_path: Path) -> None:
    from google.cloud import pubsub_v1

    project, tag = emulators.project, uuid.uuid4().hex[:6]
    pub, sub = pubsub_v1.PublisherClient(), pubsub_v1.SubscriberClient()
    topic = pub.topic_path(project, f"dead-{tag}")
    pub.create_topic(name=topic)
    hold = f"hold-{tag}"
    sub.create_subscription(request={"name": sub.subscription_path(project, hold),
                                     "topic": topic})
    state = _state(tmp_path, {**emulators.env(), "SPOTORCH_PROJECT": project,
                              "SPOTORCH_API_URL": "http://127.0.0.1:9/"},
                   observers={"dead_letter": hold})
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SPOTORCH_", "FIRESTORE_", "PUBSUB_"))}
    env.update(XDG_CONFIG_HOME=str(tmp_path), SPOTORCH_STATE=str(state))
    done = subprocess.run([*SPOTORCH, "dead-letters"], env=env, capture_output=True, text=True,
                          timeout=60, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"no dead letters on {hold}"
    pub.publish(topic, b'{"x": 1}').result()
    listed = subprocess.run([*SPOTORCH, "dead-letters", "--json"], env=env, capture_output=True,
                            text=True, timeout=60, cwd=tmp_path)
    assert listed.returncode == 0 and len(json.loads(listed.stdout)) == 1, listed.stderr


@pytest.mark.emulator
def test_the_rest_and_the_client_readers_read_the_same(firestore_emulator: Any) -> None:
    """The CLI reads Firestore's REST API, the api function its Python client: the same runs,
    pages (equal creation times across a page boundary included), sweeps and arrivals."""
    from dataclasses import replace

    from google.cloud import firestore

    from operator_runs import deps_for, every_kind
    from spotorch.adapters.gcp.firestore import FirestoreDocumentStore
    from spotorch.adapters.gcp.firestore_reads import (
        FirestoreArrivalReader,
        FirestoreRunReader,
        FirestoreSweepReader,
        RestSource,
    )
    from spotorch.ports.reads import RunQuery, SweepQuery, parse_statuses

    project = firestore_emulator.project
    deps = deps_for(FirestoreDocumentStore(project=project))
    runs = every_kind(deps)
    for i in range(4):  # four runs created at the same instant
        deps.runs.save(replace(runs["story"], run_id=f"tie-{i}", created_at=1_800_000_100.0),
                       None)
    sweeps(deps)
    arrivals(deps)
    client = firestore.Client(project=project)
    rest = RestSource(project, emulator=os.environ["FIRESTORE_EMULATOR_HOST"])

    def walk(reader: Any, **query: Any) -> list[str]:
        seen, token = [], None
        while True:
            page = reader.list(RunQuery(limit=3, page_token=token, **query))
            seen += [r.run_id for r in page.runs]
            token = page.next_page_token
            if token is None:
                return seen

    by_client, by_rest = FirestoreRunReader(client), FirestoreRunReader(rest)
    everything = walk(by_rest)
    assert everything == walk(by_client) and len(set(everything)) == len(everything)
    assert {f"tie-{i}" for i in range(4)} | {r.run_id for r in runs.values()} <= set(everything)
    ties = [r for r in everything if r.startswith("tie-")]
    first = everything.index(ties[0])
    assert everything[first:first + 4] == ["tie-3", "tie-2", "tie-1", "tie-0"]  # by id, desc
    failed = {"statuses": parse_statuses(["failed"])}
    assert walk(by_rest, **failed) == walk(by_client, **failed) == [runs["failed"].run_id]
    assert by_rest.get(runs["story"].run_id) == by_client.get(runs["story"].run_id)
    assert by_rest.get("nope") is None
    sweeps_rest = FirestoreSweepReader(rest).list(SweepQuery())
    assert sweeps_rest == FirestoreSweepReader(client).list(SweepQuery())
    arrived_rest, arrived_client = FirestoreArrivalReader(rest), FirestoreArrivalReader(client)
    assert [d["key"] for d in arrived_rest.snapshots(10)] == \
        [d["key"] for d in arrived_client.snapshots(10)]
    assert [d["folder"] for d in arrived_rest.unmatched(10)] == \
        [d["folder"] for d in arrived_client.unmatched(10)]
