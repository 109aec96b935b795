"""The `spotorch` CLI through click's test runner, on runs written by the service layer."""

from __future__ import annotations

import json
import logging
import re
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import click
import pytest
from click.testing import CliRunner, Result

from operator_runs import (
    CHECKPOINT_WRITE_S,
    HW_PIPELINE,
    OOM_MESSAGE,
    TOTAL_STEPS,
    deps_for,
    every_kind,
    hardware_run,
    sweeps,
)
from spotorch.adapters.memory.twins import InMemoryLauncher
from spotorch.app.deps import Deps
from spotorch.app.job_events import job_changed, trainer_reported
from spotorch.app.queries import DocumentRunReader, DocumentSweepReader
from spotorch.core.model import JobPhase, Run
from spotorch.core.observations import TrainerReported
from spotorch.operate import cli as cli_module
from spotorch.operate.backend import Backend, HttpActions, OperatorError
from spotorch.operate.cli import cli
from spotorch.operate.logsource import CloudLoggingSource, LocalWorkerLogs
from spotorch.operate.target import TargetError, check_url, resolve

ISO = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ")



@pytest.fixture(autouse=True)
def quiet_spotorch_logs() -> Iterator[None]:
    """The app code these tests run in-process logs INFO lines (a run's end, for Cloud
    Monitoring) to whatever stdout is: here the CLI's captured output. Only warnings, then."""
    logger = logging.getLogger("spotorch")
    level = logger.level
    logger.setLevel(logging.WARNING)
    yield
    logger.setLevel(level)

class ApiActions:
    """Actions through the real api handler (functions-framework's test client)."""

    def __init__(self, deps: Deps, monkeypatch: pytest.MonkeyPatch) -> None:
        import functions_framework

        from spotorch.entrypoints import functions as entry

        monkeypatch.setattr(entry, "deps", lambda: deps)
        main = str(Path(__file__).resolve().parent.parent / "functions" / "main.py")
        self.client = functions_framework.create_app("api", main, "http").test_client()

    def post(self, action: str, body: Mapping[str, Any]) -> dict[str, Any]:
        resp = self.client.post(f"/{action}", json=dict(body))
        if resp.status_code >= 400:
            raise OperatorError(resp.get_json()["error"])
        reply: dict[str, Any] = resp.get_json()
        return reply


@pytest.fixture
def world(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> tuple[Backend, Deps, dict[str, Run]]:
    deps = deps_for()
    runs = every_kind(deps)
    backend = Backend(reader=DocumentRunReader(deps.docs), sweeps=DocumentSweepReader(deps.docs),
                      actions=ApiActions(deps, monkeypatch),
                      logs=LocalWorkerLogs(tmp_path / "vertex", poll_s=0.05),
                      pipelines=deps.pipelines, clock=deps.clock.now)
    return backend, deps, runs


def invoke(backend: Backend | None, *args: str) -> Result:
    return CliRunner().invoke(cli, list(args), obj=backend, prog_name="spotorch")


def walk(group: click.Group, prefix: str = "") -> Iterator[tuple[str, click.Command]]:
    """Every command of the tree, the lazily imported ones too (dev, demo, simulate, ...)."""
    ctx = click.Context(group)
    for name in group.list_commands(ctx):
        command = group.get_command(ctx, name)
        assert command is not None, name
        yield f"{prefix}{name}", command
        if isinstance(command, click.Group):
            yield from walk(command, f"{prefix}{name} ")


def test_every_command_and_option_has_help_in_one_dialect_with_defaults() -> None:
    names = []
    for name, command in walk(cli):
        names.append(name)
        assert command.help, name
        for param in command.params:
            if isinstance(param, click.Option):
                assert param.help, f"{name} {param.opts}"
        if command.hidden:
            continue
        result = invoke(None, *name.split(), "--help")
        assert result.exit_code == 0 and result.output.startswith(f"Usage: spotorch {name}"), \
            (name, result.output[:200])
        listed = result.output.split("Commands:")[-1] if isinstance(command, click.Group) else ""
        assert not any(line.rstrip().endswith("...") for line in listed.splitlines()), name
        defaults = [p for p in command.params if isinstance(p, click.Option)
                    and p.default not in (None, False, (), "") and not p.is_flag
                    and p.show_default is not False]
        if defaults:
            assert "default:" in result.output, name
    assert {"dev up", "dev down", "dev restart", "dev reload", "dev alerts", "dev vertex", "dev upload",
            "validate", "demo", "simulate", "dead-letters", "advise", "snapshots",
            "sweep show", "sweep submit", "sweep cancel"} <= set(names)
    result = invoke(None, "runs", "--help")
    assert result.exit_code == 0 and "[default: 20; 1<=x<=500]" in result.output
    demo = invoke(None, "demo", "--help").output
    assert all(f"  {scenario} " in demo for scenario in ("default", "stockout", "user-error",
                                                         "hardware", "sweep", "hang",
                                                         "diverge", "oom"))


def test_version_typos_and_usage_errors() -> None:
    assert invoke(None, "--version").output.strip() == "spotorch, version 0.1.0"
    typo = invoke(None, "rnus")
    assert typo.exit_code == 2 and "Did you mean 'runs'" in typo.output
    assert invoke(None, "dev", "dwon").exit_code == 2
    assert invoke(None, "runs", "--limit", "0").exit_code == 2


def test_runs_lists_everything_newest_first(world: tuple[Backend, Deps, dict[str, Run]]) -> None:
    backend, _, runs = world
    result = invoke(backend, "runs")
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    order = [next(i for i, line in enumerate(lines) if r.run_id in line)
             for r in (runs["queued"], runs["live"], runs["failed"], runs["story"])]
    assert order == sorted(order)
    assert "SUCCEEDED" in result.output and "FAILED" in result.output and "(10%)" in result.output
    assert "\x1b[" not in result.output  # not a terminal: no colours
    data = json.loads(invoke(backend, "runs", "--json", "--status", "failed").output)
    assert [r["run_id"] for r in data["runs"]] == [runs["failed"].run_id]
    assert ISO.fullmatch(data["runs"][0]["created_at"])
    page = json.loads(invoke(backend, "runs", "--json", "--limit", "3").output)
    assert len(page["runs"]) == 3 and page["next_page_token"]
    rest = json.loads(invoke(backend, "runs", "--json", "--page-token",
                             page["next_page_token"]).output)
    assert [r["run_id"] for r in rest["runs"]] == [runs["story"].run_id]
    since = json.loads(invoke(backend, "runs", "--json", "--since", "2027-01-15T09:00:00Z").output)
    assert {r["run_id"] for r in since["runs"]} == {runs["live"].run_id, runs["queued"].run_id}


@pytest.mark.parametrize(("args", "words"), [
    (("runs", "--status", "weird"), "unknown status 'weird'"),
    (("runs", "--since", "last tuesday"), "ISO 8601"),
    (("runs", "--page-token", "%%"), "bad page token"),
    (("submit", "ops", "/tmp/data"), "not a gs:// URI"),
])
def test_bad_input_exits_2_naming_the_problem(world: tuple[Backend, Deps, dict[str, Run]],
                                              args: tuple[str, ...], words: str) -> None:
    result = invoke(world[0], *args)
    assert result.exit_code == 2 and words in result.output
    assert "Traceback" not in result.output


def test_show_tells_everything_about_a_run(world: tuple[Backend, Deps, dict[str, Run]]) -> None:
    backend, _, runs = world
    story = runs["story"]
    result = invoke(backend, "show", story.run_id)
    assert result.exit_code == 0, result.output
    for words in ("SUCCEEDED", "gs://landing/ops/batch-1/", f"gs://models/ops/{story.run_id}",
                  "step 290", "standard VMs", "(10%)", "30 steps redone", "2027-01-15T08:00:00Z",
                  "preempted", "escalated to standard", "attempt 3 ended"):
        assert words in result.output, words
    view = json.loads(invoke(backend, "show", story.run_id, "--json").output)
    assert [a["capacity"] for a in view["attempts"]] == ["spot", "spot", "standard"]
    assert view["cost"]["lost_steps"] == 30
    # issue 30: what it ran on and with; a submit by hand pins the folder's objects as listed
    # (issue 39: a submit needs something there).
    prov = view["provenance"]
    assert prov["seed"] == story.provenance["seed"]  # type: ignore[index]
    assert prov["data"]["pinned"] is True and len(prov["code"]["hash"]) == 64
    assert "provenance" in result.output and f"seed      {prov['seed']}" in result.output
    assert "not pinned: no object generations recorded" not in result.output


def test_show_prints_the_hardware_table_the_run_chose_from(
        world: tuple[Backend, Deps, dict[str, Run]]) -> None:
    backend, deps, _ = world
    run = hardware_run(deps)
    result = invoke(backend, "show", run.run_id)
    assert result.exit_code == 0, result.output
    rows = {line.split()[0]: line for line in result.output.splitlines()
            if line.split() and line.split()[0] in ("cpu", "l4", "small")}
    assert rows["l4"].split()[1] == "*" and rows["l4"].rstrip().endswith("chosen")
    assert "misses deadline" in rows["cpu"] and "5.17" in rows["cpu"]  # 36,000 steps at 2/s
    assert " no " in rows["small"]
    # an unfit candidate's reason is read whole (wrapped, not cut), whatever the width
    flat = " ".join(result.output.split())
    assert f"out of memory ({OOM_MESSAGE})" in flat
    assert "chosen: l4: cheapest expected Spot cost" in result.output
    view = json.loads(invoke(backend, "show", run.run_id, "--json").output)
    table = {r["candidate"]: r for r in view["hardware"]["rows"]}
    assert view["hardware"]["chosen"] == "l4" and table["l4"]["chosen"]
    assert not table["small"]["fit"] and table["small"]["reason"].startswith("out of memory")
    assert not view["hardware"]["warning"] and "warning:" not in result.output
    rush = hardware_run(deps, replace(HW_PIPELINE, name="rush", deadline_s=3600.0))
    late = invoke(backend, "show", rush.run_id).output
    assert "chosen: l4: the fastest fit candidate" in late
    assert "warning: no candidate is expected to meet the deadline" in " ".join(late.split())


def test_show_gives_checkpoint_advice_from_the_runs_own_history(
        world: tuple[Backend, Deps, dict[str, Run]]) -> None:
    backend, deps, runs = world
    story = runs["story"]
    view = json.loads(invoke(backend, "show", story.run_id, "--json").output)
    advice = view["checkpoint_advice"]
    # Spot ran 2 x 20 min for 2 preemptions: 20 min per preemption; 12 s to write a checkpoint.
    assert advice["mtbf_s"] == 1200.0 and advice["checkpoint_cost_s"] == CHECKPOINT_WRITE_S
    assert advice["optimal_s"] == pytest.approx((2 * CHECKPOINT_WRITE_S * 1200.0) ** 0.5)
    assert advice["interval_s"] > 2 * advice["optimal_s"]  # one checkpoint per ~20 min attempt
    assert advice["verdict"] == "checkpoint more often" and advice["missing"] == []
    text = invoke(backend, "show", story.run_id).output
    assert "checkpoint more often: every 19m 20s; 12s to write one; 20m 00s on Spot per " \
           "preemption; optimum every 2m 50s" in " ".join(text.split())
    fresh = json.loads(invoke(backend, "show", hardware_run(deps).run_id, "--json").output)
    assert fresh["checkpoint_advice"]["verdict"] == "not enough history"
    assert len(fresh["checkpoint_advice"]["missing"]) == 3
    assert "not enough history: needs two checkpoints" in invoke(
        backend, "show", runs["live"].run_id).output


def test_sweeps_and_one_sweeps_trials(world: tuple[Backend, Deps, dict[str, Run]]) -> None:
    backend, deps, _ = world
    made = sweeps(deps)
    done, running = made["done"], made["running"]
    listing = invoke(backend, "sweeps")
    assert listing.exit_code == 0, listing.output
    lines = [line.split() for line in listing.output.splitlines()]
    assert [line[0] for line in lines[1:]] == [running.sweep_id, done.sweep_id]  # newest first
    assert lines[2][2:3] == ["SUCCEEDED"] and "4/4" in lines[2] and "loss 0.2" in \
        " ".join(lines[2])
    assert lines[1][2] == "RUNNING" and "0/4" in lines[1]
    data = json.loads(invoke(backend, "sweeps", "--json", "--status", "ended").output)
    assert [(r["sweep_id"], r["best_trial"], r["best_metric"], r["trials_done"])
            for r in data["sweeps"]] == [(done.sweep_id, 2, 0.2, 4)]
    assert data["sweeps"][0]["model_name"] == "projects/proj/locations/us-central1/models/tune@1"
    page = json.loads(invoke(backend, "sweeps", "--json", "--limit", "1").output)
    rest = json.loads(invoke(backend, "sweeps", "--json", "--page-token",
                             page["next_page_token"]).output)
    assert [r["sweep_id"] for r in page["sweeps"] + rest["sweeps"]] == [running.sweep_id,
                                                                       done.sweep_id]

    shown = invoke(backend, "sweep", done.sweep_id)
    assert shown.exit_code == 0, shown.output
    trial_lines = {line.split()[0]: line for line in shown.output.splitlines()
                   if line[:1].isdigit()}
    assert "*" in trial_lines["2"] and "lr=0.01" in trial_lines["2"]
    assert "STOPPED" in trial_lines["3"] and "stopped early" in trial_lines["3"]
    assert "best      trial 2" in shown.output and "tune@1" in shown.output
    view = json.loads(invoke(backend, "sweep", done.sweep_id, "--json").output)
    assert [(t["trial"], t["status"], t["metric"], t["step"], t["stopped_early"])
            for t in view["trials"]] == [(1, "SUCCEEDED", 0.3, 100, False),
                                         (2, "SUCCEEDED", 0.2, 100, False),
                                         (3, "STOPPED", 0.9, 10, True),
                                         (4, "SUCCEEDED", 0.25, 100, False)]
    assert view["best"]["trial"] == 2 and view["best"]["params"] == {"lr": 0.01}
    assert view["metric"] == "loss" and view["goal"] == "minimize"
    live = json.loads(invoke(backend, "sweep", running.sweep_id, "--json").output)
    assert [t["status"] for t in live["trials"]] == ["RUNNING", "RUNNING", "RUNNING", "PENDING"]
    assert live["trials"][0]["step"] == 10 and live["best"] is None
    unknown = invoke(backend, "sweep", "nope")
    assert unknown.exit_code == 1 and unknown.output.strip() == (
        "spotorch: no sweep 'nope' (list them with `spotorch sweeps`)")
    bad = invoke(backend, "sweeps", "--status", "PREEMPTED")
    assert bad.exit_code == 2 and "unknown sweep status 'PREEMPTED'" in bad.output


def test_an_unknown_run_is_one_line_and_exit_1(world: tuple[Backend, Deps, dict[str, Run]]) -> None:
    for command in ("show", "watch", "logs"):
        result = invoke(world[0], command, "nope")
        assert result.exit_code == 1
        assert result.output.strip().splitlines() == [
            "spotorch: no run 'nope' (list them with `spotorch runs`)"]


def test_watch_follows_a_live_run_until_it_succeeds(
        world: tuple[Backend, Deps, dict[str, Run]]) -> None:
    backend, deps, runs = world
    live = runs["live"]
    assert isinstance(deps.launcher, InMemoryLauncher)
    job = deps.launcher.job_of(live.run_id, 1)

    def finish() -> None:
        time.sleep(0.5)
        trainer_reported(deps, live.run_id, TrainerReported(1, "progress", deps.clock.now(),
                                                            step=TOTAL_STEPS))
        time.sleep(0.5)
        assert isinstance(deps.launcher, InMemoryLauncher)
        job_changed(deps, live.run_id, 1, deps.launcher.set_status(job, JobPhase.SUCCEEDED))

    worker = threading.Thread(target=finish)
    worker.start()
    result = invoke(backend, "watch", live.run_id, "--interval", "0.2", "--json")
    worker.join()
    assert result.exit_code == 0, result.output
    changes = [json.loads(line) for line in result.output.splitlines()]
    assert changes[0]["change"].startswith("status RUNNING")
    assert changes[-1]["status"] == "SUCCEEDED"
    assert any(c["change"].startswith("attempt 1 (spot, us-central1) SUCCEEDED") for c in changes)
    assert changes[-1]["step"] == TOTAL_STEPS


def test_watch_of_an_ended_run_says_how_it_ended(
        world: tuple[Backend, Deps, dict[str, Run]]) -> None:
    backend, _, runs = world
    ok = invoke(backend, "watch", runs["story"].run_id)
    assert ok.exit_code == 0 and "saved" in ok.output and "status SUCCEEDED" in ok.output
    failed = invoke(backend, "watch", runs["failed"].run_id)
    assert failed.exit_code == 1 and "ended FAILED: ValueError: bad column 'label' in " \
        "part-0.csv (user_errors budget exhausted" in failed.output  # the exception first


def _worker_log(backend: Backend, run: Run, attempt: int, text: str) -> Path:
    assert isinstance(backend.logs, LocalWorkerLogs)
    job_name = run.attempts[attempt - 1].job_name
    assert job_name
    folder = backend.logs.workdir / job_name.rsplit("/", 1)[-1]
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "workerpool0-0.log"
    path.write_text(text)
    return path


def test_logs_print_the_workers_output(world: tuple[Backend, Deps, dict[str, Run]]) -> None:
    backend, _, runs = world
    story = runs["story"]
    _worker_log(backend, story, 3, "resuming from step 200\nstep 300 loss 0.17\n")
    _worker_log(backend, story, 1, "starting fresh\nSIGTERM: checkpointing\n")
    latest = invoke(backend, "logs", story.run_id)
    assert latest.exit_code == 0 and latest.output == "resuming from step 200\nstep 300 loss 0.17\n"
    first = invoke(backend, "logs", story.run_id, "--attempt", "1", "--json")
    assert [json.loads(line)["text"] for line in first.output.splitlines()] == [
        "starting fresh", "SIGTERM: checkpointing"]
    missing = invoke(backend, "logs", story.run_id, "--attempt", "2")
    assert missing.exit_code == 1 and "no worker logs" in missing.output
    beyond = invoke(backend, "logs", story.run_id, "--attempt", "9")
    assert beyond.exit_code == 1 and "has no attempt 9 (it has 3)" in beyond.output


def test_logs_follow_until_the_attempt_ends(world: tuple[Backend, Deps, dict[str, Run]]) -> None:
    backend, deps, runs = world
    live = runs["live"]
    path = _worker_log(backend, live, 1, "step 40\n")
    assert isinstance(deps.launcher, InMemoryLauncher)
    job = deps.launcher.job_of(live.run_id, 1)

    def train_on() -> None:
        for step in (50, 60):
            time.sleep(0.2)
            with path.open("a") as f:
                f.write(f"step {step}\n")
        with path.open("a") as f:
            f.write("done")  # no newline: still printed once the attempt ended
        time.sleep(0.2)
        assert isinstance(deps.launcher, InMemoryLauncher)
        job_changed(deps, live.run_id, 1, deps.launcher.set_status(job, JobPhase.SUCCEEDED))

    worker = threading.Thread(target=train_on)
    worker.start()
    result = invoke(backend, "logs", live.run_id, "--follow")
    worker.join()
    assert result.exit_code == 0
    assert result.output == "step 40\nstep 50\nstep 60\ndone\n"


def test_cloud_logs_use_gclouds_filter_oldest_first() -> None:
    calls: list[dict[str, Any]] = []

    class Entry:
        def __init__(self, text: str, task: str) -> None:
            from datetime import UTC, datetime

            self.payload = {"message": text}
            self.timestamp = datetime(2027, 1, 15, 8, 0, tzinfo=UTC)
            self.resource = type("R", (), {"labels": {"task_name": task}})()

    class Client:
        def list_entries(self, **kwargs: Any) -> list[Entry]:
            calls.append(kwargs)
            return [Entry("Job is running.", "service"), Entry("epoch 1", "workerpool0-0")]

    source = CloudLoggingSource("proj", client=Client())
    lines = list(source.lines("projects/proj/locations/us-central1/customJobs/123",
                              follow=False, ended=lambda: True))
    assert [(line.replica, line.text) for line in lines] == [
        ("service", "Job is running."), ("workerpool0-0", "epoch 1")]
    assert calls[0]["filter_"] == 'resource.type="ml_job" AND resource.labels.job_id="123"'
    # through deploy/'s job-log view (roles/logging.viewAccessor there, deploy/logs.tf)
    assert calls[0]["resource_names"] == [
        "projects/proj/locations/global/buckets/_Default/views/spotorch-job-logs"]
    assert lines[0].at == "2027-01-15T08:00:00Z"


def test_submit_cancel_retry_through_the_api(world: tuple[Backend, Deps, dict[str, Run]]) -> None:
    backend, _, runs = world
    submitted = json.loads(invoke(backend, "submit", "ops", "gs://landing/ops/batch-9/",
                                  "--request-id", "x", "--json").output)
    assert submitted["status"] == "QUEUED"  # the live run of the pipeline is still active
    cancelled = invoke(backend, "cancel", submitted["run_id"], "--reason", "wrong batch")
    assert cancelled.exit_code == 0 and "CANCELLED" in cancelled.output
    retried = json.loads(invoke(backend, "retry", runs["failed"].run_id, "--json").output)
    assert retried["retry_of"] == runs["failed"].run_id
    refused = invoke(backend, "retry", runs["story"].run_id)
    assert refused.exit_code == 1 and "only a run that failed or was cancelled" in refused.output
    unknown = invoke(backend, "submit", "nope", "gs://b/x/")
    assert unknown.exit_code == 1 and "no pipeline named 'nope'" in unknown.output
    rerun = json.loads(invoke(backend, "rerun", runs["story"].run_id, "--request-id", "q",
                              "--json").output)
    assert rerun["rerun_of"] == runs["story"].run_id
    assert rerun["provenance"]["seed"] == runs["story"].provenance["seed"]  # type: ignore[index]
    again = json.loads(invoke(backend, "rerun", runs["story"].run_id, "--request-id", "q",
                              "--json").output)
    assert again["run_id"] == rerun["run_id"]
    assert invoke(backend, "rerun", "nope").exit_code == 1


# ---------------------------------------------------------------- HTTP and targets

class _Recorder(BaseHTTPRequestHandler):
    status = 200
    seen: list[dict[str, str]] = []

    def do_POST(self) -> None:
        type(self).seen.append(dict(self.headers))
        body = json.dumps({"run_id": "r", "status": "CANCELLING"}).encode()
        self.send_response(type(self).status)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def http_server() -> Iterator[tuple[str, type[_Recorder]]]:
    handler = type("Handler", (_Recorder,), {"seen": [], "status": 200})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/", handler
    server.shutdown()
    server.server_close()


def test_actions_send_an_identity_token_when_asked(
        http_server: tuple[str, type[_Recorder]]) -> None:
    url, handler = http_server
    audiences: list[str] = []

    def token(audience: str) -> str:
        audiences.append(audience)
        return "id-token-123"

    assert HttpActions(url, token).post("cancel", {"run_id": "r"})["status"] == "CANCELLING"
    assert handler.seen[-1]["Authorization"] == "Bearer id-token-123"
    assert audiences == [url.rstrip("/")]  # the service URL as Cloud Run checks it
    HttpActions(url).post("cancel", {"run_id": "r"})
    assert "Authorization" not in handler.seen[-1]


@pytest.mark.parametrize("status", [401, 403])
def test_unauthorised_is_one_clear_line(http_server: tuple[str, type[_Recorder]],
                                        status: int) -> None:
    url, handler = http_server
    handler.status = status
    with pytest.raises(OperatorError, match=f"not authorised to call .*HTTP {status}"):
        HttpActions(url).post("cancel", {"run_id": "r"})


def test_an_unreachable_api_is_one_line_and_exit_1(world: tuple[Backend, Deps, dict[str, Run]]
                                                   ) -> None:
    from spotorch.local.emulators import free_port

    backend = world[0]
    backend.actions = HttpActions(f"http://127.0.0.1:{free_port()}/", timeout_s=5)
    result = invoke(backend, "cancel", "r")
    assert result.exit_code == 1
    assert result.output.startswith("spotorch: cannot reach the api at http://127.0.0.1:")
    assert len(result.output.strip().splitlines()) == 1


def test_targets_follow_options_env_stack_and_config(tmp_path: Path) -> None:
    import os

    state = tmp_path / "stack.json"
    state.write_text(json.dumps({
        "status": "ready", "supervisor": {"pid": os.getpid()}, "run_dir": str(tmp_path),
        "env": {"SPOTORCH_PROJECT": "spotorch-local", "FIRESTORE_EMULATOR_HOST": "127.0.0.1:9",
                "SPOTORCH_API_URL": "http://127.0.0.1:7/"},
        "function_env": {"SPOTORCH_PIPELINES": "/p"}}))
    local = resolve(stack_state=state, environ={"XDG_CONFIG_HOME": str(tmp_path)})
    assert local.local and local.api_url == "http://127.0.0.1:7/" and not local.needs_token
    assert local.vertex_workdir == tmp_path / "vertex" and local.pipelines == "/p"
    deployed = resolve(project="acme", stack_state=state, environ={})
    assert not deployed.local and deployed.needs_token
    assert deployed.api_url == "https://us-central1-acme.cloudfunctions.net/spotorch-api/"
    (tmp_path / "spotorch").mkdir()
    (tmp_path / "spotorch" / "config.toml").write_text('project = "team"\nregion = "europe-west4"\n')
    configured = resolve(stack_state=tmp_path / "none.json",
                         environ={"XDG_CONFIG_HOME": str(tmp_path)})
    assert configured.api_url == "https://europe-west4-team.cloudfunctions.net/spotorch-api/"
    assert configured.source == "config file"
    dead = tmp_path / "dead.json"
    dead.write_text(json.dumps({"status": "ready", "supervisor": {"pid": 2**22 + 12345}}))
    assert not resolve(stack_state=dead, environ={}).local
    with pytest.raises(TargetError, match="'notaurl' is not an http"):
        check_url("notaurl")


def test_main_turns_expected_failures_into_exit_codes(monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_module.main(["--api-url", "notaurl", "cancel", "r"]) == 2
    assert capsys.readouterr().err.startswith("spotorch: api URL 'notaurl' is not")
    assert cli_module.main(["nope"]) == 2
    assert cli_module.main(["--version"]) == 0


def test_delegated_commands_keep_their_own_options_and_exit_codes(
        capsys: pytest.CaptureFixture[str]) -> None:
    examples = str(Path(__file__).resolve().parent.parent / "examples" / "pipelines")
    assert cli_module.main(["validate", examples]) == 0
    assert "OK" in capsys.readouterr().out
    assert cli_module.main(["validate", "/nonexistent/pipelines"]) == 1
    assert cli_module.main(["demo", "--help"]) == 0  # the demo's own help (a click command)
    assert "--scenario" in capsys.readouterr().out
    assert cli_module.main(["dev", "up", "--help"]) == 0
    assert "--no-vertex" in capsys.readouterr().out
