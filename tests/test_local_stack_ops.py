"""The local stack as a person uses it: their own pipelines (bad files left out and reported),
buckets, alert receivers, exact readiness, restart of one piece, reload, durable data, and the
`dev up/restart/reload/alerts/down` functions. Stand-in functions: tests/fixtures/echo_functions.py.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml

from spotorch import settings as S
from spotorch.local import emulators
from spotorch.local._stack_pipelines import activate, check_pipelines
from spotorch.local._stack_procs import (
    ProcError,
    group_members,
    http_probe,
    is_same_process,
    owned_probe,
    owns_port,
    spawn,
    stop_groups,
    wait_ready,
)
from spotorch.local.dev import (
    alerts_main,
    down_main,
    reload_main,
    restart_main,
    up_main,
    upload_main,
)
from spotorch.local.stack import DevStack
from spotorch.spec.compiled import read_compiled

ROOT = Path(__file__).resolve().parent.parent
ECHO = ROOT / "tests" / "fixtures" / "echo_functions.py"
DEMO = ROOT / "examples" / "pipelines" / "demo.yaml"
PROJECT = "spotorch-ops-test"


def wait_for(predicate: Callable[[], Any], timeout: float = 20.0, what: str = "it") -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def pipeline(name: str, bucket: str, **changes: Any) -> str:
    """The demo pipeline renamed, with its buckets replaced, as YAML."""
    doc = yaml.safe_load(DEMO.read_text())
    doc["name"] = name
    doc["trigger"]["bucket"] = f"{bucket}-landing"
    doc["checkpoint_uri"] = f"gs://{bucket}-ckpt/{name}"
    doc["output_uri"] = f"gs://{bucket}-models/{name}"
    package = doc["job"]["worker_pools"][0]["python_package"]  # written elsewhere: absolute
    package["source"] = str((DEMO.parent / package["source"]).resolve())
    doc["routes"] = [{"channel": "chat", "events": ["*"]},
                     {"channel": "slack", "events": ["run.failed"], "target": "TEAM_SLACK_URL"}]
    doc.update(changes)
    return yaml.safe_dump(doc)


BAD = "version: 1\nname: broken\ntrigger: {bucket: x}\nrecovery: {max_preemptions: -3}\n"


def api_env(stack: DevStack) -> dict[str, str]:
    with urllib.request.urlopen(stack.function_url("api") + "env", timeout=10) as response:
        return dict(json.loads(response.read())["env"])


def _answers(stack: DevStack) -> dict[str, str] | None:
    """The api's env, or None while it is being restarted."""
    try:
        return api_env(stack)
    except OSError:
        return None


def bucket_names(stack: DevStack) -> set[str]:
    url = f"http://{stack.emulator_address('gcs')}/storage/v1/b?project={PROJECT}"
    with urllib.request.urlopen(url, timeout=10) as response:
        return {b["name"] for b in json.loads(response.read()).get("items", [])}


def still_running(processes: dict[str, Any]) -> list[str]:
    return [name for name, rec in processes.items()
            if is_same_process(rec["pid"], rec["start_time"]) or group_members(rec["pgid"])]


# ------------------------------------------------------------------ pipelines (no stack)

def test_each_pipeline_file_is_checked_alone_and_only_valid_ones_are_served(
        tmp_path: Path) -> None:
    source = tmp_path / "pipelines"
    (source / "team").mkdir(parents=True)
    (source / "a.yaml").write_text(pipeline("alpha", "aa"))
    (source / "team" / "b.yaml").write_text(pipeline("beta", "bb"))
    (source / "broken.yaml").write_text(BAD)
    (source / "dupe.yml").write_text(pipeline("alpha", "cc"))
    found = check_pipelines(source)
    assert [p.name for p in found.loaded] == ["alpha", "beta"]
    assert set(found.rejected) == {str(source / "broken.yaml"), str(source / "dupe.yml")}
    broken = found.rejected[str(source / "broken.yaml")]
    assert len(broken) >= 2 and all(str(source / "broken.yaml") in p for p in broken)
    assert "already defined" in found.rejected[str(source / "dupe.yml")][0]
    assert found.buckets == ("aa-ckpt", "aa-landing", "aa-models", "bb-ckpt", "bb-landing",
                             "bb-models", "spotorch-staging")
    active = tmp_path / "active"
    activate(found, active)
    served = sorted(str(p.relative_to(active)) for p in active.rglob("*.y*ml"))
    assert served == ["a.yaml", "team/b.yaml"]
    from spotorch.spec.loader import load_pipelines

    assert sorted(p.name for p in load_pipelines(active)) == ["alpha", "beta"]  # loads clean
    assert check_pipelines(tmp_path / "nowhere").rejected


# ------------------------------------------------------------------ readiness (no stack)

class _Impostor(ThreadingHTTPServer):
    """An HTTP server in this process that answers every GET the way `answer` says."""

    def __init__(self, status: int, body: bytes) -> None:
        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                self.send_response(status)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        super().__init__(("127.0.0.1", 0), Handler)
        self.port = int(self.server_address[1])
        threading.Thread(target=self.serve_forever, args=(0.05,), daemon=True).start()

    def close(self) -> None:
        self.shutdown()
        self.server_close()


@pytest.fixture
def impostor() -> Iterator[_Impostor]:
    server = _Impostor(200, b"Ok")
    yield server
    server.close()


def test_a_child_is_ready_only_when_it_holds_the_port_itself(tmp_path: Path,
                                                             impostor: _Impostor) -> None:
    port = emulators.free_port()
    server = spawn("server", [sys.executable, "-m", "http.server", str(port), "--bind",
                              "127.0.0.1"], tmp_path / "server.log", dict(os.environ))
    sleeper = spawn("sleeper", [sys.executable, "-c", "import time; time.sleep(30)"],
                    tmp_path / "sleeper.log", dict(os.environ))
    try:
        ok = http_probe(f"http://127.0.0.1:{port}/")
        assert wait_ready({"server": (server, owned_probe(server, port, ok))}, 20) == []
        assert owns_port(server.pid, port)
        # The impostor answers exactly as wanted, but the sleeper does not hold its port.
        fooled = http_probe(f"http://127.0.0.1:{impostor.port}/", lambda s, b: b == b"Ok")
        assert fooled()
        assert not owns_port(sleeper.pid, impostor.port)
        with pytest.raises(ProcError, match="not ready"):
            wait_ready({"sleeper": (sleeper, owned_probe(sleeper, impostor.port, fooled))}, 1.0)
        # A child that dies is reported dead, even while something answers on its port.
        sleeper.process.kill()
        sleeper.process.wait()
        assert wait_ready({"sleeper": (sleeper, fooled)}, 5) == ["sleeper"]
    finally:
        stop_groups([server.pid, sleeper.pid], 5, owned=[server.process, sleeper.process])


@pytest.mark.emulator
@pytest.mark.slow  # a stack of its own, and gunicorn retries a taken port for ~5 s
def test_a_function_port_taken_by_an_impostor_is_not_mistaken_for_the_function(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    impostor = _Impostor(404, b"")  # answers /robots.txt as functions-framework does
    calls = {"n": 0}
    real = emulators.free_port

    def free_port() -> int:
        calls["n"] += 1
        return impostor.port if calls["n"] == 4 else real()  # the 4th: the function's port

    monkeypatch.setattr(emulators, "free_port", free_port)
    try:
        with DevStack(project=PROJECT, run_dir=tmp_path / "run", functions_source=ECHO,
                      functions={"api": "http"}, vertex=False, tick_seconds=None,
                      extra_env={"ECHO_DIR": str(tmp_path)}) as stack:
            assert calls["n"] > 4, "the stack did not start again on new ports"
            assert stack.function_url("api") != f"http://127.0.0.1:{impostor.port}/"
            assert api_env(stack)["ECHO_DIR"] == str(tmp_path)  # it is the function
    finally:
        impostor.close()


# ------------------------------------------------------------------ one stack: pipelines,
# receivers, reload, restart

@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("own-pipelines")
    (directory / "alpha.yaml").write_text(pipeline("alpha", "ops"))
    (directory / "broken.yaml").write_text(BAD)
    return directory


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, source: Path) -> Iterator[DevStack]:
    run_dir = tmp_path_factory.mktemp("ops-stack")
    echo = tmp_path_factory.mktemp("ops-echo")
    with DevStack(project=PROJECT, run_dir=run_dir, functions_source=ECHO, vertex=False,
                  functions={"on_tick": "cloudevent", "api": "http"}, pipelines_dir=source,
                  tick_seconds=None, receivers=True, durable=True, pipeline_reload_s=0.3,
                  extra_env={"ECHO_DIR": str(echo)}) as started:
        yield started


@pytest.mark.emulator
def test_the_stack_serves_the_valid_pipelines_and_creates_their_buckets(
        stack: DevStack, source: Path) -> None:
    described = stack.describe()
    pipelines = described["pipelines"]
    assert [p["name"] for p in pipelines["loaded"]] == ["alpha"]
    assert list(pipelines["rejected"]) == [str(source / "broken.yaml")]
    assert {"ops-landing", "ops-ckpt", "ops-models"} <= bucket_names(stack)
    env = api_env(stack)
    active = Path(env[S.ENV_PIPELINES])
    assert active != source and [p.name for p in active.glob("*.yaml")] == ["alpha.yaml"]
    # validated: the functions read pipelines.json, the package built beside it
    assert [p.name for p in read_compiled(active) or ()] == ["alpha"]
    assert {"ops-landing", "ops-ckpt", "ops-models", "spotorch-staging"} <= bucket_names(stack)
    # A durable stack's fake-gcs-server (filesystem backend) refuses object versioning: the
    # landing bucket is made all the same, and known to be without it (docs/reproducibility.md).
    assert stack.unversioned_buckets == {"ops-landing"}


@pytest.mark.emulator
def test_alert_channels_reach_the_receivers_and_are_recorded(stack: DevStack) -> None:
    env = api_env(stack)
    receivers = stack.describe()["receivers"]
    assert env["SPOTORCH_CHAT_WEBHOOK_URL"] == f"{receivers['webhook']}/chat"
    assert env["TEAM_SLACK_URL"] == f"{receivers['webhook']}/slack/TEAM_SLACK_URL"
    assert env["SPOTORCH_SMTP_PORT"] == receivers["smtp"].rsplit(":", 1)[1]
    assert env["ECHO_DIR"]  # what the user set is still there
    body = json.dumps({"text": "dev.spotorch.run.failed.v1 run r1"}).encode()
    urllib.request.urlopen(urllib.request.Request(env["TEAM_SLACK_URL"], data=body,
                                                  method="POST"), timeout=10).close()
    import smtplib
    from email.message import EmailMessage

    mail = EmailMessage()
    mail["From"], mail["To"] = env["SPOTORCH_SMTP_FROM"], env["SPOTORCH_EMAIL_TO"]
    mail["Subject"], mail["X-Spotorch-Event-Type"] = "run r1 succeeded", \
        "dev.spotorch.run.succeeded.v1"
    mail.set_content("done")
    with smtplib.SMTP(env["SPOTORCH_SMTP_HOST"], int(env["SPOTORCH_SMTP_PORT"]),
                      timeout=10) as smtp:
        smtp.send_message(mail)
    alerts = wait_for(lambda: len(stack.alerts()) >= 2 and stack.alerts(), what="alerts")
    assert [(a["channel"], a["event_type"]) for a in alerts[-2:]] == [
        ("slack", "dev.spotorch.run.failed.v1"), ("email", "dev.spotorch.run.succeeded.v1")]
    assert alerts[-1]["to"] == [env["SPOTORCH_EMAIL_TO"]]


@pytest.mark.emulator
def test_restarting_one_piece_keeps_its_port_and_the_wiring(stack: DevStack) -> None:
    before = stack.describe()["processes"]
    assert stack.restart("on_tick") == "function:on_tick"
    assert stack.restart("pubsub") == "emulator:pubsub"
    after = stack.describe()["processes"]
    for key in ("function:on_tick", "emulator:pubsub"):
        assert after[key]["pid"] != before[key]["pid"] and after[key]["port"] == \
            before[key]["port"]
        assert not is_same_process(before[key]["pid"], before[key]["start_time"])
    assert after["function:api"]["pid"] == before["function:api"]["pid"]  # left alone
    # Topics and push subscriptions were made again: a tick reaches on_tick.
    echo = Path(api_env(stack)["ECHO_DIR"])
    message_id = stack.tick()
    wait_for(lambda: any(json.loads(line)["attributes"]["id"] == message_id
                         for line in (echo / "on_tick.jsonl").read_text().splitlines())
             if (echo / "on_tick.jsonl").exists() else False, what="the tick")
    with pytest.raises(Exception, match="no piece"):
        stack.restart("on_nothing")


@pytest.mark.emulator
def test_pipeline_files_reload_when_they_change(stack: DevStack, source: Path) -> None:
    api_pid = stack.describe()["processes"]["function:api"]["pid"]
    (source / "broken.yaml").write_text(pipeline("beta", "ops2"))
    wait_for(lambda: [p["name"] for p in stack.describe()["pipelines"]["loaded"]]
             == ["alpha", "beta"], what="the reload")
    wait_for(lambda: stack.describe()["processes"]["function:api"]["pid"] != api_pid,
             what="the functions to restart")
    assert "ops2-landing" in wait_for(lambda: "ops2-landing" in bucket_names(stack)
                                      and bucket_names(stack), what="the new bucket")
    active = Path(wait_for(lambda: _answers(stack), what="the api again")[S.ENV_PIPELINES])
    assert sorted(p.name for p in active.glob("*.yaml")) == ["alpha.yaml", "broken.yaml"]
    (source / "alpha.yaml").write_text("name: [")  # broken now: beta keeps working
    wait_for(lambda: [p["name"] for p in stack.describe()["pipelines"]["loaded"]] == ["beta"],
             what="the second reload")
    assert list(stack.describe()["pipelines"]["rejected"]) == [str(source / "alpha.yaml")]


# ------------------------------------------------------------------ durable data

def _write_doc(stack: DevStack, doc_id: str) -> None:
    url = (f"http://{stack.emulator_address('firestore')}/v1/projects/{PROJECT}/databases/"
           f"(default)/documents/runs?documentId={doc_id}")
    body = json.dumps({"fields": {"status": {"stringValue": "RUNNING"}}}).encode()
    urllib.request.urlopen(urllib.request.Request(
        url, data=body, headers={"Content-Type": "application/json"}, method="POST"),
        timeout=10).close()


def _has_doc(stack: DevStack, doc_id: str) -> bool:
    url = (f"http://{stack.emulator_address('firestore')}/v1/projects/{PROJECT}/databases/"
           f"(default)/documents/runs/{doc_id}")
    try:
        urllib.request.urlopen(url, timeout=10).close()
        return True
    except urllib.error.HTTPError as exc:
        assert exc.code == 404
        return False


def _vertex_jobs(stack: DevStack) -> list[Any]:
    from google.cloud.aiplatform_v1 import JobServiceClient
    from google.cloud.aiplatform_v1.services.job_service.transports.grpc import (
        JobServiceGrpcTransport,
    )

    from spotorch.adapters.gcp.vertex_calls import emulator_channel

    client = JobServiceClient(transport=JobServiceGrpcTransport(channel=emulator_channel(
        stack.env[S.ENV_VERTEX_ENDPOINT], stack.env[S.ENV_VERTEX_TOKEN])))
    return list(client.list_custom_jobs(parent=f"projects/{PROJECT}/locations/us-central1"))


def _create_job(stack: DevStack) -> str:
    from spotorch.adapters.gcp.vertex import VertexJobLauncher
    from spotorch.core.pipeline import Capacity, JobTemplate, WorkerPool
    from spotorch.ports.jobs import LaunchSpec

    launcher = VertexJobLauncher(PROJECT, endpoint=stack.env[S.ENV_VERTEX_ENDPOINT],
                                 token=stack.env[S.ENV_VERTEX_TOKEN])
    template = JobTemplate(worker_pools=(WorkerPool(command=("sleep", "60")),))
    return launcher.launch(LaunchSpec(run_id="r-durable", pipeline="p", attempt=1,
                                      capacity=Capacity.STANDARD, region="us-central1",
                                      template=template, env={}, labels={},
                                      display_name="r-durable attempt 1"))


@pytest.mark.emulator
@pytest.mark.slow  # three stacks, one after the other
def test_data_survives_a_restart_of_the_stack_unless_fresh(tmp_path: Path) -> None:
    options: dict[str, Any] = {"project": PROJECT, "run_dir": tmp_path / "run", "functions": {},
                               "tick_seconds": None, "durable": True, "vertex_grace_s": 0.5}
    with DevStack(**options) as first:
        _write_doc(first, "kept")
        first.upload("keep-bucket", "a/b.csv", b"1,2\n")
        job = _create_job(first)
        wait_for(lambda: [j.state.name for j in _vertex_jobs(first)] == ["JOB_STATE_RUNNING"],
                 what="the job to run")
        first.restart("firestore")  # one piece: exported, then imported again
        assert _has_doc(first, "kept")
        processes = first.describe()["processes"]
    assert still_running(processes) == []
    with DevStack(**options) as second:
        assert _has_doc(second, "kept")
        blob = second._gcs.client().bucket("keep-bucket").blob("a/b.csv")
        assert blob.download_as_bytes() == b"1,2\n"
        [lost] = _vertex_jobs(second)
        assert lost.name == job and lost.state.name == "JOB_STATE_FAILED"
        assert "lost" in lost.error.message
    with DevStack(**options, fresh=True) as third:
        assert not _has_doc(third, "kept")
        assert _vertex_jobs(third) == []
        assert "keep-bucket" not in bucket_names(third)


# ------------------------------------------------------------------ the commands

@pytest.mark.emulator
@pytest.mark.slow
def test_dev_commands_on_a_background_stack(tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    mine, other = tmp_path / "mine", tmp_path / "other"
    mine.mkdir()
    other.mkdir()
    (mine / "alpha.yaml").write_text(pipeline("alpha", "cli"))
    (mine / "broken.yaml").write_text(BAD)
    (other / "gamma.yaml").write_text(pipeline("gamma", "cli3"))
    state = tmp_path / "stack.json"
    argv = ["--state", str(state), "--run-dir", str(tmp_path / "run"), "--project", PROJECT,
            "--functions-source", str(ECHO), "--function", "api", "--no-vertex",
            "--tick-s", "0", "--no-reload", "--pipelines", str(mine),
            "--env", f"ECHO_DIR={tmp_path}"]
    assert up_main(argv) == 0
    err = capsys.readouterr().err
    assert f"pipelines from {mine}: 1 loaded" in err and "alpha" in err
    assert f"LEFT OUT {mine / 'broken.yaml'}" in err and "max_preemptions" in err
    assert "buckets (created): cli-ckpt, cli-landing, cli-models" in err
    assert "alerts: webhook http://127.0.0.1:" in err and "API: http://127.0.0.1:" in err
    assert "data: kept across" in err
    recorded = json.loads(state.read_text())
    # Again with other pipelines: switched, not ignored.
    assert up_main([*argv[:-4], "--pipelines", str(other), *argv[-2:]]) == 0
    err = capsys.readouterr().err
    assert f"switching to {other}" in err and "gamma" in err
    assert [p["name"] for p in json.loads(state.read_text())["pipelines"]["loaded"]] == \
        ["gamma"]
    # Restart one piece.
    assert restart_main(["--state", str(state), "api"]) == 0
    assert "restarted function:api" in capsys.readouterr().err
    now = json.loads(state.read_text())
    assert now["processes"]["function:api"]["pid"] != \
        recorded["processes"]["function:api"]["pid"]
    assert now["supervisor"] == recorded["supervisor"]
    assert restart_main(["--state", str(state), "nothing"]) == 1
    assert "no piece 'nothing'" in capsys.readouterr().err
    # Reload back onto the directory with a bad file: exit 1, every problem listed.
    assert reload_main(["--state", str(state), "--pipelines", str(mine)]) == 1
    err = capsys.readouterr().err
    assert "LEFT OUT" in err and "alpha" in err
    # An option the running stack was not started with: refused, exit 1 (not ignored).
    schedule = tmp_path / "schedule.json"
    schedule.write_text("{}")
    assert up_main([*argv, "--schedule", str(schedule)]) == 1
    assert "running without --schedule" in capsys.readouterr().err
    # Data in by `dev upload`: a folder's files in name order, the marker alpha waits for last.
    storage_before = os.environ.get("STORAGE_EMULATOR_HOST")
    batch = tmp_path / "batch"
    (batch / "part").mkdir(parents=True)
    (batch / "b.csv").write_text("x\n1\n")
    (batch / "part" / "a.csv").write_text("x\n2\n")
    (batch / ".hidden").write_text("no")
    assert upload_main(["--state", str(state), str(batch), "gs://cli-landing/datasets/demo/b1/"]) \
        == 0
    captured = capsys.readouterr()
    assert captured.out.split() == ["gs://cli-landing/datasets/demo/b1/b.csv",
                                    "gs://cli-landing/datasets/demo/b1/part/a.csv",
                                    "gs://cli-landing/datasets/demo/b1/_SUCCESS"]
    assert "wrote the marker _SUCCESS last (pipeline alpha waits for it" in captured.err
    assert upload_main(["--state", str(state), str(batch / "b.csv"), "gs://cli-landing/x/"]) == 0
    assert capsys.readouterr().out.split() == ["gs://cli-landing/x/b.csv"]
    assert upload_main(["--state", str(state), str(batch), "gs://no-such-bucket/p/"]) == 1
    assert "no such bucket" in capsys.readouterr().err
    # The caller's own Cloud Storage is untouched (a leak once sent later tests to this stack).
    assert os.environ.get("STORAGE_EMULATOR_HOST") == storage_before
    # Alerts: a POST to the routed chat URL shows up.
    chat = now["function_env"]["SPOTORCH_CHAT_WEBHOOK_URL"]
    urllib.request.urlopen(urllib.request.Request(
        chat, data=b'{"text": "dev.spotorch.run.created.v1"}', method="POST"), timeout=10).close()
    wait_for(lambda: alerts_main(["--state", str(state), "--json"]) == 0
             and capsys.readouterr().out.strip(), what="the alert")
    assert down_main(["--state", str(state)]) == 0
    assert still_running(now["processes"]) == []
    assert alerts_main(["--run-dir", str(tmp_path / "run"), "--json"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert json.loads(lines[-1])["event_type"] == "dev.spotorch.run.created.v1"
    assert restart_main(["--state", str(state), "api"]) == 1  # nothing runs


def test_nothing_is_left_in_a_copied_tree(tmp_path: Path) -> None:
    """activate() replaces what an earlier activation left (a removed file is not served)."""
    source = tmp_path / "src"
    source.mkdir()
    (source / "a.yaml").write_text(pipeline("alpha", "x"))
    (source / "b.yaml").write_text(pipeline("beta", "y"))
    active = tmp_path / "active"
    activate(check_pipelines(source), active)
    (source / "b.yaml").unlink()
    activate(check_pipelines(source), active)
    assert [p.name for p in active.glob("*.yaml")] == ["a.yaml"]
    assert [p.name for p in read_compiled(active) or ()] == ["alpha"]
    shutil.rmtree(source)
    activate(check_pipelines(source), active)
    assert list(active.glob("*.yaml")) == [] and read_compiled(active) == ()


def test_port_helper_sees_no_owner_for_a_closed_port() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    assert not owns_port(os.getpid(), port)
