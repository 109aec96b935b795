"""The local stack: wiring from GCS and topics to functions, retries and dead letters, the ticker,
clean shutdown, `spotorch dev up/down`; with stand-in functions (tests/fixtures/echo_functions.py).
"""

from __future__ import annotations

import base64
import datetime as dt
import itertools
import json
import os
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from spotorch import settings as S
from spotorch.local import _push_adapter as adapter
from spotorch.local._stack_procs import group_members, is_same_process
from spotorch.local._stack_state import write_json
from spotorch.local.dev import down_main, exports, up_exports, up_main
from spotorch.local.stack import DEAD_LETTER_SUBSCRIPTION, DevStack, StackConfig, StackError, vertex_available

ECHO = Path(__file__).parent / "fixtures" / "echo_functions.py"
PROJECT = "spotorch-stack-test"
Record = dict[str, Any]


def records(echo_dir: Path, function: str) -> list[Record]:
    path = echo_dir / f"{function}.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def wait_for(echo_dir: Path, function: str, match: Callable[[Record], bool],
             count: int = 1, timeout: float = 20.0) -> list[Record]:
    """The records of function that match, once there are at least count of them."""
    deadline = time.monotonic() + timeout
    while True:
        found = [r for r in records(echo_dir, function) if match(r)]
        if len(found) >= count or time.monotonic() > deadline:
            return found
        time.sleep(0.1)


def message_of(record: Record) -> dict[str, Any]:
    return dict(record["data"]["message"])


def has_attribute(key: str, value: str) -> Callable[[Record], bool]:
    def match(record: Record) -> bool:
        message = record["data"].get("message") if isinstance(record["data"], dict) else None
        return isinstance(message, dict) and (message.get("attributes") or {}).get(key) == value
    return match


def still_running(processes: dict[str, Any]) -> list[str]:
    """Names of recorded processes (or members of their groups) that are still alive."""
    return [name for name, rec in processes.items()
            if is_same_process(rec["pid"], rec["start_time"]) or group_members(rec["pgid"])]


# ------------------------------------------------------------------ pure: the Eventarc stand-in

PUSH = {"subscription": "projects/p/subscriptions/s1",
        "message": {"data": base64.b64encode(b'{"a": 1}').decode(), "attributes": {"k": "v"},
                    "messageId": "42", "message_id": "42",
                    "publishTime": "2026-01-02T03:04:05.678Z",
                    "publish_time": "2026-01-02T03:04:05.678Z"}}


def test_push_becomes_eventarc_message_published_cloudevent() -> None:
    event = adapter.published_event(PUSH, "projects/p/topics/t1")
    assert event.headers == {
        "ce-specversion": "1.0", "ce-id": "42", "ce-type": adapter.PUBSUB_PUBLISHED,
        "ce-source": "//pubsub.googleapis.com/projects/p/topics/t1",
        "ce-time": "2026-01-02T03:04:05.678Z", "Content-Type": "application/json"}
    body = json.loads(event.body)
    assert body["subscription"] == "projects/p/subscriptions/s1"
    assert body["message"]["attributes"] == {"k": "v"}
    assert base64.b64decode(body["message"]["data"]) == b'{"a": 1}'


def test_push_without_data_still_converts() -> None:
    push = {"subscription": "s", "message": {"attributes": {"x": "1"}, "messageId": "7"}}
    body = json.loads(adapter.published_event(push, "projects/p/topics/t").body)
    assert body["message"] == {"attributes": {"x": "1"}, "messageId": "7"}


def test_push_without_message_id_is_rejected() -> None:
    with pytest.raises(adapter.PushError):
        adapter.published_event({"message": {"data": ""}}, "projects/p/topics/t")


def _notification(event_type: str) -> dict[str, Any]:
    obj = {"kind": "storage#object", "bucket": "landing", "name": "a/b.csv",
           "generation": "17", "size": "3", "updated": "2026-01-02T03:04:05Z"}
    return {"subscription": "s", "message": {
        "data": base64.b64encode(json.dumps(obj).encode()).decode(), "messageId": "9",
        "attributes": {"eventType": event_type, "bucketId": "landing", "objectId": "a/b.csv",
                       "objectGeneration": "17", "payloadFormat": "JSON_API_V1"}}}


def test_gcs_notification_becomes_eventarc_storage_cloudevent() -> None:
    event = adapter.convert(_notification("OBJECT_FINALIZE"), "projects/p/topics/gcs", ["gcs"])
    assert event is not None
    assert event.headers["ce-type"] == adapter.STORAGE_FINALIZED
    assert event.headers["ce-source"] == "//storage.googleapis.com/projects/_/buckets/landing"
    assert event.headers["ce-subject"] == "objects/a/b.csv"
    assert json.loads(event.body)["generation"] == "17"


def test_storage_events_other_than_finalize_are_filtered_out() -> None:
    assert adapter.convert(_notification("OBJECT_DELETE"), "projects/p/topics/gcs", ["gcs"]) is None
    # From other topics the same message is an ordinary messagePublished event.
    other = adapter.convert(_notification("OBJECT_DELETE"), "projects/p/topics/x", ["gcs"])
    assert other is not None and other.headers["ce-type"] == adapter.PUBSUB_PUBLISHED


# ------------------------------------------------------------------ pure: configuration

def test_config_round_trips_through_json(tmp_path: Path) -> None:
    config = StackConfig(project="p1", run_dir=tmp_path, pipelines_dir=tmp_path / "pl",
                         functions={"on_tick": "cloudevent"}, extra_env={"A": "b"},
                         tick_seconds=None, vertex_grace_s=2.5, min_backoff_s=None,
                         vertex_args=("--seed", "3"))
    assert StackConfig.from_json(json.loads(json.dumps(config.to_json()))) == config


@pytest.mark.parametrize("overrides", [
    {"max_delivery_attempts": 3},  # Pub/Sub's minimum is 5
    {"push": "carrier-pigeon"},
    {"gcs_events": "storage", "push": "direct"},
    {"functions": {"on_tick": "event"}},
    {"no_such_option": 1},
])
def test_bad_configuration_is_refused(overrides: dict[str, Any]) -> None:
    with pytest.raises(StackError):
        DevStack(**overrides)


def test_dev_up_prints_no_token_and_its_state_file_is_the_users_alone(tmp_path: Path) -> None:
    state = {"env": {S.ENV_VERTEX_TOKEN: "local-secret", "PUBSUB_EMULATOR_HOST": "127.0.0.1:1"}}
    printed = up_exports(state, tmp_path / "stack.json")
    assert "local-secret" not in printed and S.ENV_VERTEX_TOKEN not in printed
    assert "export PUBSUB_EMULATOR_HOST=127.0.0.1:1\n" in printed
    write_json(tmp_path / "stack.json", state)
    assert (tmp_path / "stack.json").stat().st_mode & 0o777 == 0o600


def test_exports_are_shell_quoted() -> None:
    assert exports({"B": "x y", "A": "1"}) == "export A=1\nexport B='x y'\n"


# ------------------------------------------------------------------ one stack for the wiring

@pytest.fixture(scope="module")
def echo_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("echo")


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, echo_dir: Path) -> Iterator[DevStack]:
    run_dir = tmp_path_factory.mktemp("stack")
    with DevStack(project=PROJECT, run_dir=run_dir, functions_source=ECHO, vertex=False,
                  pipelines_dir=run_dir / "pipelines", tick_seconds=1.0, min_backoff_s=None,
                  extra_env={"ECHO_DIR": str(echo_dir)}) as started:
        yield started


@pytest.mark.emulator
def test_stack_describes_itself_and_logs_every_process(stack: DevStack) -> None:
    described = json.loads(json.dumps(stack.describe()))
    assert described["running"] and described["startup_s"] < 60
    assert set(described["emulators"]) == {"firestore", "pubsub", "gcs"}
    assert set(described["functions"]) == {"on_object_finalized", "on_job_event", "on_tick",
                                           "on_run_event", "api"}
    assert described["env"]["STORAGE_EMULATOR_HOST"].startswith("http://127.0.0.1:")
    for name, rec in described["processes"].items():
        assert is_same_process(rec["pid"], rec["start_time"]), name
        assert Path(rec["log"]).exists(), name


@pytest.mark.emulator
def test_functions_get_the_stack_env_and_extra_env(stack: DevStack, echo_dir: Path) -> None:
    with urllib.request.urlopen(stack.function_url("api") + "status", timeout=10) as response:
        body = json.loads(response.read())
    assert body["path"] == "/status"
    env = body["env"]
    for key in ("FIRESTORE_EMULATOR_HOST", "PUBSUB_EMULATOR_HOST", "STORAGE_EMULATOR_HOST",
                S.ENV_PIPELINES, S.ENV_PROJECT, "GOOGLE_CLOUD_PROJECT"):
        assert env[key] == stack.env[key], key
    assert env["ECHO_DIR"] == str(echo_dir)
    assert env[S.ENV_PROJECT] == PROJECT


@pytest.mark.emulator
def test_upload_reaches_on_object_finalized_with_notification_attributes(
        stack: DevStack, echo_dir: Path) -> None:
    uri = stack.upload("landing", "runs/snap-1/part-0.csv", b"a,b\n1,2\n", "text/csv")
    assert uri == "gs://landing/runs/snap-1/part-0.csv"
    [record] = wait_for(echo_dir, "on_object_finalized",
                        has_attribute("objectId", "runs/snap-1/part-0.csv"))
    assert record["attributes"]["type"] == adapter.PUBSUB_PUBLISHED
    assert record["attributes"]["source"] == \
        f"//pubsub.googleapis.com/projects/{PROJECT}/topics/{S.TOPIC_GCS_NOTIFICATIONS}"
    message = message_of(record)
    assert message["attributes"]["eventType"] == "OBJECT_FINALIZE"
    assert message["attributes"]["bucketId"] == "landing"
    obj = json.loads(base64.b64decode(message["data"]))
    assert (obj["bucket"], obj["name"], obj["size"]) == ("landing", "runs/snap-1/part-0.csv", "8")


@pytest.mark.emulator
@pytest.mark.parametrize("topic, function", [
    (S.TOPIC_JOB_EVENTS, "on_job_event"),
    (S.TOPIC_TRAINER_EVENTS, "on_job_event"),
    (S.TOPIC_EVENTS, "on_run_event"),
    (S.TOPIC_TICK, "on_tick"),
])
def test_each_topic_reaches_its_function_as_eventarc_would_deliver(
        stack: DevStack, echo_dir: Path, topic: str, function: str) -> None:
    marker = f"{topic}-{time.monotonic_ns()}"
    message_id = stack.publish(topic, {"hello": topic}, marker=marker)
    [record] = wait_for(echo_dir, function, has_attribute("marker", marker))
    ce = record["attributes"]
    assert ce["type"] == adapter.PUBSUB_PUBLISHED
    assert ce["id"] == message_id
    assert ce["source"] == f"//pubsub.googleapis.com/projects/{PROJECT}/topics/{topic}"
    assert ce["time"].endswith("Z")
    assert record["data"]["subscription"] == \
        f"projects/{PROJECT}/subscriptions/{stack.subscription_name(topic, function)}"
    assert json.loads(base64.b64decode(message_of(record)["data"])) == {"hello": topic}


@pytest.mark.emulator
def test_observer_subscription_sees_what_was_published(stack: DevStack) -> None:
    stack.pull_published(timeout_s=0)  # whatever earlier tests left there
    stack.publish(S.TOPIC_EVENTS, b'{"id": "e1"}', ordering_key="run-1")
    stack.publish(S.TOPIC_EVENTS, b'{"id": "e2"}', ordering_key="run-1")
    assert sorted(stack.pull_published(max_messages=10)) == [b'{"id": "e1"}', b'{"id": "e2"}']
    assert stack.pull_published(timeout_s=0.3) == []  # acknowledged


@pytest.mark.emulator
def test_ticker_delivers_ticks_with_an_rfc3339_time(stack: DevStack, echo_dir: Path) -> None:
    ticks = wait_for(echo_dir, "on_tick", lambda r: not message_of(r).get("attributes"), count=2)
    assert len(ticks) >= 2
    body = json.loads(base64.b64decode(message_of(ticks[-1])["data"]))
    assert dt.datetime.fromisoformat(body["time"].replace("Z", "+00:00")).tzinfo is not None


@pytest.mark.emulator
@pytest.mark.slow
def test_failing_function_is_redelivered_then_dead_lettered(
        stack: DevStack, echo_dir: Path) -> None:
    marker = f"fail-{time.monotonic_ns()}"
    message_id = stack.publish(S.TOPIC_JOB_EVENTS, b"boom", fail="1", marker=marker)
    attempts = stack.config.max_delivery_attempts
    deadline = time.monotonic() + 40
    dead: list[Any] = []
    while time.monotonic() < deadline and not dead:
        dead = [m for m in stack.pull_messages(DEAD_LETTER_SUBSCRIPTION, timeout_s=0.5)
                if m.attributes.get("marker") == marker]
    assert dead, "the message never reached the dead-letter topic"
    assert dead[0].data == b"boom"
    assert dead[0].attributes["CloudPubSubDeadLetterSourceDeliveryCount"] == str(attempts)
    assert dead[0].attributes["CloudPubSubDeadLetterSourceSubscription"] == \
        stack.subscription_name(S.TOPIC_JOB_EVENTS, "on_job_event")
    delivered = records(echo_dir, "on_job_event")
    tries = [r for r in delivered if has_attribute("marker", marker)(r)]
    assert len(tries) == attempts
    assert {r["attributes"]["id"] for r in tries} == {message_id}  # the same event each time


# ------------------------------------------------------------------ lifecycle

@pytest.mark.emulator
@pytest.mark.slow  # a stack of its own
def test_with_block_stops_everything_on_error_and_stop_is_idempotent(tmp_path: Path) -> None:
    """Also: push="direct" feeds functions-framework the raw push, as deploy/pubsub.tf does
    (the push adapter delivers it, with the subscription's retry policy)."""
    echo = tmp_path / "echo"
    echo.mkdir()
    processes: dict[str, Any] = {}
    with pytest.raises(RuntimeError, match="boom"), \
            DevStack(project=PROJECT, run_dir=tmp_path / "run", functions_source=ECHO,
                     functions={"on_tick": "cloudevent"}, vertex=False, push="direct",
                     tick_seconds=0.5, extra_env={"ECHO_DIR": str(echo)}) as stack:
        processes = stack.describe()["processes"]
        assert "push-adapter" in processes
        ticks = wait_for(echo, "on_tick", lambda r: True)
        assert ticks, "no tick arrived"
        tick = ticks[0]
        # functions-framework's own conversion: source from the URL path, no subscription.
        assert tick["attributes"]["source"] == \
            f"//pubsub.googleapis.com/projects/{PROJECT}/topics/{S.TOPIC_TICK}"
        assert "subscription" not in tick["data"]
        sub = stack._pubsub("subscriber").get_subscription(
            subscription=stack.subscription_path(stack.subscription_name(S.TOPIC_TICK,
                                                                          "on_tick")))
        assert sub.dead_letter_policy.max_delivery_attempts == 5
        # Pulled and pushed by the adapter, which holds the retry policy (the emulator loses
        # messages with one: spotorch.local._push_adapter).
        assert not sub.push_config.push_endpoint and not sub.retry_policy.minimum_backoff
        raise RuntimeError("boom")
    assert len(processes) == 5  # three emulators, the function and the push adapter
    assert still_running(processes) == []
    assert not stack.running
    stack.stop()  # again: nothing to do, no error


@pytest.mark.emulator
@pytest.mark.slow
def test_dev_up_and_down(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`spotorch dev up` leaves a supervised stack behind; `down` removes every process."""
    echo = tmp_path / "echo"
    echo.mkdir()
    state = tmp_path / "stack.json"
    argv = ["--state", str(state), "--run-dir", str(tmp_path / "run"), "--project", PROJECT,
            "--functions-source", str(ECHO), "--function", "on_object_finalized",
            "--function", "api", "--no-vertex", "--tick-s", "0", "--gcs-events", "storage",
            "--env", f"ECHO_DIR={echo}"]
    assert up_main(argv) == 0
    out = capsys.readouterr().out
    recorded = json.loads(state.read_text())
    assert recorded["status"] == "ready"
    assert f"export PUBSUB_EMULATOR_HOST={recorded['env']['PUBSUB_EMULATOR_HOST']}\n" in out
    processes = recorded["processes"]
    assert still_running(processes) == list(processes)
    # The background stack works: an upload arrives as Eventarc's storage CloudEvent.
    env = recorded["env"]
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import storage

    client = storage.Client(project=PROJECT, credentials=AnonymousCredentials(),
                            client_options={"api_endpoint": env["STORAGE_EMULATOR_HOST"]})
    client.create_bucket("landing").blob("x/_SUCCESS").upload_from_string(b"")
    [record] = wait_for(echo, "on_object_finalized", lambda r: True)
    assert record["attributes"]["type"] == adapter.STORAGE_FINALIZED
    assert record["attributes"]["subject"] == "objects/x/_SUCCESS"
    # up again: reports the running stack, starts nothing new.
    assert up_main(argv) == 0
    assert json.loads(state.read_text())["supervisor"] == recorded["supervisor"]
    assert down_main(["--state", str(state)]) == 0
    assert not state.exists()
    assert still_running({**processes, "supervisor": {**recorded["supervisor"],
                                                 "pgid": recorded["supervisor"]["pid"]}}) == []
    assert down_main(["--state", str(state)]) == 0  # idempotent


@pytest.mark.emulator
@pytest.mark.slow  # a stack of its own
@pytest.mark.skipif(not vertex_available(),
                    reason="spotorch.local.vertex_emulator (a colleague's module) is not there yet")
def test_vertex_emulator_runs_with_the_stack_env(tmp_path: Path) -> None:
    with DevStack(project=PROJECT, run_dir=tmp_path / "run", functions={}, tick_seconds=None,
                  vertex=True, vertex_grace_s=1.0, vertex_args=("--queued-s", "0.1")) as stack:
        endpoint = stack.env[S.ENV_VERTEX_ENDPOINT]
        processes = stack.describe()["processes"]
        assert is_same_process(processes["vertex"]["pid"], processes["vertex"]["start_time"])
        assert processes["vertex"]["argv"][-2:] == ["--queued-s", "0.1"]
        environ = Path(f"/proc/{processes['vertex']['pid']}/environ")
        if environ.exists():
            variables = dict(v.split("=", 1) for v in environ.read_text().split("\0") if "=" in v)
            assert variables["PUBSUB_EMULATOR_HOST"] == stack.env["PUBSUB_EMULATOR_HOST"]
        from google.cloud.aiplatform_v1 import JobServiceClient
        from google.cloud.aiplatform_v1.services.job_service.transports.grpc import (
            JobServiceGrpcTransport,
        )

        from spotorch.adapters.gcp.vertex_calls import emulator_channel

        # As the operator (the stack's env carries their token; the emulator checks IAM).
        client = JobServiceClient(transport=JobServiceGrpcTransport(
            channel=emulator_channel(endpoint, stack.env[S.ENV_VERTEX_TOKEN])))
        jobs = list(client.list_custom_jobs(parent=f"projects/{PROJECT}/locations/us-central1"))
        assert jobs == []
    assert still_running(processes) == []


def test_environment_is_not_modified_by_a_stack_object() -> None:
    before = dict(os.environ)
    DevStack(project="other")
    assert dict(os.environ) == before


# ------------------------------------------------------------------ the push adapter is no kinder

@pytest.mark.emulator
@pytest.mark.slow
def test_a_refused_push_comes_back_with_the_retry_policys_backoff_then_dead_letters(
        emulators: Any) -> None:
    """Pub/Sub push, as the adapter does it: exponential backoff between the retry policy's
    minimum and maximum, max_delivery_attempts, then the dead-letter topic (the emulator's own
    push gave up after two or three quick tries and dead-lettered nothing)."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from google.cloud import pubsub_v1
    from google.pubsub_v1.types import DeadLetterPolicy

    from spotorch.local.emulators import free_port

    arrivals: dict[str, list[tuple[float, int]]] = {}
    succeed_after = {"ok": 2}  # message "ok" is accepted at its third delivery

    class Function(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            push = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            name = base64.b64decode(push["message"]["data"]).decode()
            seen = arrivals.setdefault(name, [])
            seen.append((time.monotonic(), int(push["deliveryAttempt"])))
            status = 204 if len(seen) > succeed_after.get(name, 99) else 503
            self.send_response(status)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    port = free_port()
    server = ThreadingHTTPServer(("127.0.0.1", port), Function)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    project, tag = emulators.project, f"pump{time.monotonic_ns()}"
    publisher, subscriber = pubsub_v1.PublisherClient(), pubsub_v1.SubscriberClient()
    topic, dead = (f"projects/{project}/topics/{tag}", f"projects/{project}/topics/{tag}-dl")
    sub, hold = (f"projects/{project}/subscriptions/{tag}",
                 f"projects/{project}/subscriptions/{tag}-hold")
    for t in (topic, dead):
        publisher.create_topic(name=t)
    subscriber.create_subscription(name=hold, topic=dead)
    subscriber.create_subscription(request={
        "name": sub, "topic": topic, "ack_deadline_seconds": 10,
        "dead_letter_policy": DeadLetterPolicy(dead_letter_topic=dead, max_delivery_attempts=5)})
    pump = adapter.Pump(emulators.env()["PUBSUB_EMULATOR_HOST"],
                        [adapter.Route(sub, topic, f"http://127.0.0.1:{port}/", "f")],
                        adapter.Policy(min_backoff_s=1.0, max_backoff_s=3.0,
                                       max_delivery_attempts=5, ack_deadline_s=10),
                        mode="direct")
    pump.start()
    try:
        for name in ("refused", "ok"):
            publisher.publish(topic, name.encode()).result()
        deadline = time.monotonic() + 40
        dead_letters: list[Any] = []
        while time.monotonic() < deadline and not dead_letters:
            response = subscriber.pull(request={"subscription": hold, "max_messages": 5},
                                       timeout=10)
            dead_letters = list(response.received_messages)
        assert [m.message.data for m in dead_letters] == [b"refused"]
        assert dead_letters[0].message.attributes["CloudPubSubDeadLetterSourceDeliveryCount"] \
            == "5"
        refused = arrivals["refused"]
        assert [n for _, n in refused] == [1, 2, 3, 4, 5]
        gaps = [b[0] - a[0] for a, b in itertools.pairwise(refused)]
        for gap, wanted in zip(gaps, (1.0, 2.0, 3.0, 3.0), strict=True):
            assert wanted - 0.05 <= gap <= wanted + 1.0, gaps  # min x 2^(n-1), at most max
        time.sleep(2.0)
        assert [n for _, n in arrivals["ok"]] == [1, 2, 3]  # accepted once: never again
    finally:
        pump.stop()
        server.shutdown()


@pytest.mark.emulator
@pytest.mark.slow  # a stack of its own
def test_nothing_is_lost_while_a_function_is_down(tmp_path: Path) -> None:
    """Stop a function, publish, bring it back: every message applied or dead-lettered (the
    emulator's push lost 62 of them: 503s, two or three tries in 3 s, never again)."""
    echo = tmp_path / "echo"
    echo.mkdir()
    with DevStack(project=PROJECT, run_dir=tmp_path / "run", functions_source=ECHO,
                  functions={"on_job_event": "cloudevent"}, vertex=False, tick_seconds=None,
                  min_backoff_s=1.0, max_backoff_s=8.0, max_delivery_attempts=5,
                  extra_env={"ECHO_DIR": str(echo)}) as stack:
        stack.stop_piece("on_job_event")
        sent = set()
        for i in range(40):
            stack.publish(S.TOPIC_JOB_EVENTS, {"n": i}, marker=f"down-{i}")
            sent.add(f"down-{i}")
        time.sleep(4.0)  # a few refused deliveries each, well inside the retries' 15 s
        stack.start_piece("on_job_event")
        deadline = time.monotonic() + 40
        applied: set[str] = set()
        dead: set[str] = set()
        while time.monotonic() < deadline and applied | dead != sent:
            applied = {str((message_of(r).get("attributes") or {}).get("marker"))
                       for r in records(echo, "on_job_event")}
            dead |= {m.attributes.get("marker", "")
                     for m in stack.pull_messages(DEAD_LETTER_SUBSCRIPTION, timeout_s=0.2)}
            time.sleep(0.2)
        assert applied | dead >= sent, f"lost: {len(sent - applied - dead)} of {len(sent)}"
        assert sent <= applied  # back within the retries' window: none had to be dead-lettered
        log = (stack.run_dir / "push-adapter.log").read_text()
        assert "-> 503" in log and "again in 1s" in log
