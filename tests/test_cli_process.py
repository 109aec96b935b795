"""The `spotorch` CLI as a process: reads from the Firestore emulator, actions through a real
HTTP api serving functions/main.py, failures as one line and an exit code."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from operator_runs import deps_for, every_kind
from spotorch.core.model import Run
from spotorch.local.emulators import free_port

pytestmark = pytest.mark.emulator
ROOT = Path(__file__).resolve().parent.parent
SPOTORCH = [sys.executable, "-m", "spotorch.operate.cli"]


@pytest.fixture
def served(firestore_emulator: Any, monkeypatch: pytest.MonkeyPatch,
           tmp_path: Path) -> Iterator[tuple[dict[str, str], dict[str, Run]]]:
    """Runs in the Firestore emulator, and the api function on a real port writing there."""
    import functions_framework
    from werkzeug.serving import make_server

    from spotorch.adapters.gcp.firestore import FirestoreDocumentStore
    from spotorch.entrypoints import functions as entry

    deps = deps_for(FirestoreDocumentStore(project=firestore_emulator.project))
    runs = every_kind(deps)
    monkeypatch.setattr(entry, "deps", lambda: deps)
    app = functions_framework.create_app("api", str(ROOT / "functions" / "main.py"), "http")
    server = make_server("127.0.0.1", 0, app, threaded=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    env = {**os.environ, "SPOTORCH_PROJECT": firestore_emulator.project,
           "SPOTORCH_API_URL": f"http://127.0.0.1:{server.server_port}/",
           "XDG_CONFIG_HOME": str(tmp_path), "COLUMNS": "200"}
    env.pop("SPOTORCH_PIPELINES", None)
    try:
        yield env, runs
    finally:
        server.shutdown()


def spotorch(env: dict[str, str], *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*SPOTORCH, "--state", "/nonexistent/stack.json", *args],
                          env=env, capture_output=True, text=True, timeout=timeout, cwd=ROOT)


def test_reads_and_actions_as_a_process(served: tuple[dict[str, str], dict[str, Run]]) -> None:
    env, runs = served
    listed = spotorch(env, "runs", "--json")
    assert listed.returncode == 0, listed.stderr
    assert [r["run_id"] for r in json.loads(listed.stdout)["runs"]] == [
        runs[k].run_id for k in ("queued", "live", "failed", "story")]
    shown = spotorch(env, "show", runs["story"].run_id)
    assert shown.returncode == 0 and "SUCCEEDED" in shown.stdout and "standard VMs" in shown.stdout
    assert "\x1b[" not in shown.stdout  # a pipe, not a terminal: no colours
    submitted = spotorch(env, "submit", "ops", "gs://landing/ops/batch-7/", "--json")
    assert submitted.returncode == 0, submitted.stderr
    new_id = json.loads(submitted.stdout)["run_id"]
    queued = json.loads(spotorch(env, "runs", "--status", "QUEUED", "--json").stdout)
    assert new_id in [r["run_id"] for r in queued["runs"]]  # written by the api, read from Firestore
    cancelled = spotorch(env, "cancel", new_id, "--json")
    assert json.loads(cancelled.stdout)["status"] == "CANCELLED"


def test_expected_failures_are_one_line_and_an_exit_code(
        served: tuple[dict[str, str], dict[str, Run]]) -> None:
    env, _ = served
    cases = [
        (("show", "nope"), 1, "spotorch: no run 'nope'"),
        (("--api-url", f"http://127.0.0.1:{free_port()}/", "cancel", "r"), 1,
         "spotorch: cannot reach the api at"),
        (("--api-url", "notaurl", "runs"), 2, "spotorch: api URL 'notaurl' is not an http(s) URL"),
        (("retry", "nope"), 1, "spotorch: no run 'nope'"),
        (("rnus",), 2, "Did you mean 'runs'?"),
    ]
    for args, code, words in cases:
        result = spotorch(env, *args)
        assert result.returncode == code, (args, result.stderr)
        assert words in result.stderr, (args, result.stderr)
        assert "Traceback" not in result.stderr


def test_an_unreachable_firestore_is_one_line(served: tuple[dict[str, str], dict[str, Run]]) -> None:
    env, _ = served
    started = time.monotonic()
    result = spotorch({**env, "FIRESTORE_EMULATOR_HOST": f"127.0.0.1:{free_port()}"}, "runs",
                      timeout=120)
    assert result.returncode == 1
    assert result.stderr.startswith("spotorch: cannot read runs from the local stack's Firestore "
                                    "emulator at 127.0.0.1:")
    assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.stderr
    assert time.monotonic() - started < 60


def test_a_closed_pipe_ends_quietly(served: tuple[dict[str, str], dict[str, Run]]) -> None:
    env, _ = served
    result = subprocess.run(f"{' '.join(SPOTORCH)} --state /x.json runs --json --limit 500 "
                            "| head -c 10", shell=True, env=env, capture_output=True, text=True,
                            timeout=60, cwd=ROOT)
    assert result.returncode == 0 and len(result.stdout) == 10
    assert "Traceback" not in result.stderr and "BrokenPipe" not in result.stderr
    # The process itself, reading nothing: it stops at the first write, silently, with 1.
    proc = subprocess.Popen([*SPOTORCH, "--state", "/x.json", "runs", "--json"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT)
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()
    assert proc.wait(timeout=60) == 1
    assert b"Traceback" not in proc.stderr.read()


def test_the_cli_starts_without_cloud_clients() -> None:
    """`spotorch --help` imports neither Rich nor any Google client (it must start fast)."""
    code = ("import sys; from spotorch.operate import cli; cli.main(['--help']); "
            "heavy = sorted(m for m in sys.modules if m.startswith(('google.', 'rich', 'grpc'))"
            " and m != 'google.cloud');"  # the namespace packages site's .pth files import
            "print(heavy, file=sys.stderr)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=60, cwd=ROOT)
    assert result.returncode == 0 and result.stderr.strip() == "[]", result.stderr
