"""Every operator command against a real run on the local stack (the demo's story: preempted
twice, escalated, succeeded), and the run's page from the local stack in headless Chromium."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from spotorch.domain import Run

pytestmark = [pytest.mark.emulator, pytest.mark.slow]
ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def stack_run() -> Iterator[tuple[dict[str, str], Path, Run]]:
    """The local stack with the demo pipeline and one finished run; a state file like `dev up`'s."""
    from spotorch.local import demo
    from spotorch.local.stack import DevStack
    from spotorch.store_firestore import FirestoreDocumentStore

    sys.path.insert(0, str(ROOT / "examples"))
    from make_data import make_dataset, to_csv

    scenario = demo.SCENARIOS["default"]
    work = Path(tempfile.mkdtemp(prefix="spotorch-cli-stack-"))
    (work / "pipelines").mkdir()
    # demo.pipeline_document(scenario), with the repository found from here (demo.REPO is one
    # level short since the move to spotorch/local).
    pipeline = yaml.safe_load((ROOT / "examples" / "pipelines" / "demo.yaml").read_text())
    pipeline["recovery"] = {**pipeline.get("recovery", {}), **scenario.recovery}
    pipeline["deadline"] = scenario.deadline
    pool = pipeline["job"]["worker_pools"][0]
    pool["env"] = {**(pool.get("env") or {}), **scenario.trainer_env}
    (work / "pipelines" / "demo.yaml").write_text(yaml.safe_dump(pipeline))
    schedule = work / "schedule.json"
    schedule.write_text(json.dumps(dict(scenario.vertex_schedule)))
    with DevStack(pipelines_dir=work / "pipelines", run_dir=work / "stack", tick_seconds=2.0,
                  vertex_schedule=schedule, vertex_grace_s=3.0) as stack:
        saved = dict(os.environ)
        os.environ.update(stack.env)
        try:
            stack.create_buckets([demo.LANDING, demo.CHECKPOINTS, demo.MODELS])
            x, y = make_dataset(rows=3000, features=16, classes=3, seed=0)
            for i in range(3):
                rows = slice(i * 1000, (i + 1) * 1000)
                stack.upload(demo.LANDING, f"{demo.DATA_PREFIX}b1/part-{i}.csv",
                             to_csv(x[rows], y[rows]))
            stack.upload(demo.LANDING, f"{demo.DATA_PREFIX}b1/_SUCCESS", b"")
            docs = FirestoreDocumentStore(project=stack.project)
            deadline = time.monotonic() + 180
            run: Run | None = None
            while time.monotonic() < deadline:
                found = [Run.from_dict(d) for d in docs.query("runs", "pipeline", "demo")]
                run = found[0] if found else None
                if run is not None and not run.active:
                    break
                time.sleep(1)
            assert run is not None and run.status == "SUCCEEDED", run
            state = work / "stack.json"
            state.write_text(json.dumps({**stack.describe(), "status": "ready",
                                         "supervisor": {"pid": os.getpid()}}))
            env = {k: v for k, v in os.environ.items()
                   if k not in ("SPOTORCH_API_URL", "FIRESTORE_EMULATOR_HOST", "SPOTORCH_PROJECT",
                                "SPOTORCH_PIPELINES")}
            yield {**env, "COLUMNS": "200", "XDG_CONFIG_HOME": str(work)}, state, run
        finally:
            os.environ.clear()
            os.environ.update(saved)


def spotorch(env: dict[str, str], state: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """The CLI finding the local stack by its state file alone (no env exports)."""
    return subprocess.run([sys.executable, "-m", "spotorch.cli", "--stack-state", str(state), *args],
                          env=env, capture_output=True, text=True, timeout=120, cwd=ROOT)


def test_reads_on_the_local_stack(stack_run: tuple[dict[str, str], Path, Run]) -> None:
    env, state, run = stack_run
    listed = json.loads(spotorch(env, state, "runs", "--json").stdout)
    row = next(r for r in listed["runs"] if r["run_id"] == run.run_id)
    assert row["status"] == "SUCCEEDED" and row["attempts"] == 3 and row["cost"] > 0
    view = json.loads(spotorch(env, state, "show", run.run_id, "--json").stdout)
    assert [a["capacity"] for a in view["attempts"]] == ["spot", "spot", "standard"]
    assert view["model_uri"].startswith("gs://spotorch-models/") and view["model_ready"]
    # Priced from the stack's own pipeline file (its restart overhead is 5 s).
    # The demo's attempts last seconds and most of its work is lost to the two preemptions, so
    # its saving rounds to about zero; it must never come out as a loss, and never unpriced.
    assert view["cost"]["preemptions"] == 2 and view["cost"]["total"] > 0, view["cost"]
    assert view["cost"]["standard_equivalent"] >= view["cost"]["total"], view["cost"]
    assert "pipeline unknown" not in " ".join(view["cost"]["basis"])
    text = spotorch(env, state, "show", run.run_id)
    assert text.returncode == 0 and "standard VMs" in text.stdout
    watched = spotorch(env, state, "watch", run.run_id)
    assert watched.returncode == 0 and "saved" in watched.stdout


def test_logs_are_the_workers_own_output(stack_run: tuple[dict[str, str], Path, Run]) -> None:
    env, state, run = stack_run
    first = spotorch(env, state, "logs", run.run_id, "--attempt", "1")
    assert first.returncode == 0, first.stderr
    assert f"run {run.run_id} attempt 1:" in first.stdout
    last = spotorch(env, state, "logs", run.run_id)
    assert "done: test accuracy" in last.stdout and "resuming from" in last.stdout


def test_actions_through_the_stacks_api_function(
        stack_run: tuple[dict[str, str], Path, Run]) -> None:
    env, state, _ = stack_run
    submitted = spotorch(env, state, "submit", "demo", "gs://spotorch-landing/datasets/demo/b1/",
                         "--request-id", "by-hand", "--json")
    assert submitted.returncode == 0, submitted.stderr
    run_id = json.loads(submitted.stdout)["run_id"]
    cancelled = spotorch(env, state, "cancel", run_id, "--json")
    assert cancelled.returncode == 0, cancelled.stderr
    assert json.loads(cancelled.stdout)["status"] in ("CANCELLING", "CANCELLED")
    deadline = time.monotonic() + 60
    while True:
        view = json.loads(spotorch(env, state, "show", run_id, "--json").stdout)
        if view["status"] == "CANCELLED":
            break
        assert time.monotonic() < deadline, view["status"]
        time.sleep(1)
    history = [h["what"] for h in view["history"]]
    assert history[0] == "created" and "status CANCELLED" in history


def test_the_run_page_of_a_local_stack_run_in_chromium(
        stack_run: tuple[dict[str, str], Path, Run]) -> None:
    from playwright.sync_api import sync_playwright

    from spotorch.operate.backend import backend_for
    from spotorch.operate.target import resolve
    from spotorch.ui.server import UIServer
    from test_ui import CHROMIUM_FLAGS, _ensure_chromium, _shot

    env, state, run = stack_run
    target = resolve(stack_state=state, environ=env)
    assert target.local
    server = UIServer(backend_for(target), port=0, refresh_s=600).start()
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=_ensure_chromium(), headless=True,
                                        args=CHROMIUM_FLAGS)
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.goto(f"{server.url}runs/{run.run_id}")
            lanes = page.locator("svg.timeline g.lane")
            assert [lanes.nth(i).get_attribute("data-capacity") for i in range(lanes.count())] \
                == ["spot", "spot", "standard"]
            assert page.locator("svg.timeline g.preemption").count() == 2
            assert page.locator("svg.timeline g.checkpoint").count() >= 2
            assert "saved against standard VMs" in page.locator(".ledger").inner_text()
            _shot(page, "stack-run")
            page.goto(server.url)
            assert page.locator(f'tr.run[data-run-id="{run.run_id}"]').count() == 1
            _shot(page, "stack-runs")
            browser.close()
    finally:
        server.close()
