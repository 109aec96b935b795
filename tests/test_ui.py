"""`spotorch ui`: the timeline SVG, the server's pages, and the pages in a real headless Chromium
(Debian's chromium driven by Playwright) on runs and sweeps the service layer wrote to the
Firestore emulator.

Screenshots go to build/test-artifacts/ui/ (or $SPOTORCH_TEST_ARTIFACTS).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any
from xml.etree import ElementTree

import pytest

from operator_runs import (
    HW_PIPELINE,
    OOM_MESSAGE,
    TOTAL_STEPS,
    deps_for,
    every_kind,
    hardware_run,
    sweeps,
)
from spotorch.app.deps import Deps
from spotorch.app.job_events import trainer_reported
from spotorch.app.queries import DocumentRunReader, DocumentSweepReader
from spotorch.core.cost import ledger
from spotorch.core.model import Run
from spotorch.core.observations import TrainerReported
from spotorch.operate.backend import Backend
from spotorch.operate.ui.server import UIServer
from spotorch.operate.ui.timeline import timeline_svg

ROOT = Path(__file__).resolve().parent.parent
ARTIFACTS = Path(os.environ.get("SPOTORCH_TEST_ARTIFACTS") or ROOT / "build" / "test-artifacts") / "ui"
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--no-first-run"]
SVG_NS = "{http://www.w3.org/2000/svg}"


class NoActions:
    def post(self, action: str, body: Any) -> dict[str, Any]:
        raise AssertionError("the UI only reads")


class NoLogs:
    def lines(self, job_name: str, *, follow: bool, ended: Any) -> Iterator[Any]:
        return iter(())


def backend_of(deps: Deps, reader: Any = None, sweep_reader: Any = None) -> Backend:
    return Backend(reader=reader or DocumentRunReader(deps.docs),
                   sweeps=sweep_reader or DocumentSweepReader(deps.docs), actions=NoActions(),
                   logs=NoLogs(), pipelines=deps.pipelines, clock=deps.clock.now)


# ---------------------------------------------------------------- the SVG, without a browser

def _marks(svg: str, cls: str) -> list[ElementTree.Element]:
    tree = ElementTree.fromstring(svg)
    return [e for e in tree.iter() if cls in (e.get("class") or "").split()]


def test_the_timeline_draws_attempts_waits_preemptions_checkpoints_and_cost() -> None:
    deps = deps_for()
    story = every_kind(deps)["story"]
    now = deps.clock.now()
    svg = timeline_svg(story, ledger(story, deps.pipelines["ops"], now), now)
    lanes = _marks(svg, "lane")
    assert [(lane.get("data-attempt"), lane.get("data-capacity")) for lane in lanes] == [
        ("1", "spot"), ("2", "spot"), ("3", "standard")]
    assert len(_marks(svg, "wait")) == 3  # each attempt queued 30 s
    assert len(_marks(svg, "preemption")) == 2 and len(_marks(svg, "succeeded")) == 1
    assert [c.get("data-step") for c in _marks(svg, "checkpoint")] == ["100", "200", "290"]
    assert _marks(svg, "progress") and _marks(svg, "cost")
    assert _marks(svg, "deadline") and not _marks(svg, "now")  # finished: no "now" line
    # The 4 h deadline is far beyond a 1 h run: named at the edge, not drawn to scale.
    assert _marks(svg, "offscale")
    # Spot and standard lanes have their own colours.
    runs = {lane.get("data-capacity"): lane.find(f"{SVG_NS}rect[@class='run']") for lane in lanes}
    fills = {capacity: rect.get("fill") for capacity, rect in runs.items() if rect is not None}
    assert fills["spot"] != fills["standard"]


def test_the_timeline_names_the_replicas_of_each_attempt() -> None:
    from dataclasses import replace

    from spotorch.core.pipeline import JobTemplate, PoolRole, WorkerPool

    deps = deps_for()
    story = every_kind(deps)["story"]
    now = deps.clock.now()
    single = timeline_svg(story, ledger(story, deps.pipelines["ops"], now), now)
    assert {lane.get("data-replicas") for lane in _marks(single, "lane")} == {"1"}
    pools = (WorkerPool(), WorkerPool(role=PoolRole.WORKERS, replica_count=3))
    cluster = replace(deps.pipelines["ops"], job=JobTemplate(worker_pools=pools))
    svg = timeline_svg(story, ledger(story, cluster, now), now)
    lanes = _marks(svg, "lane")
    assert {lane.get("data-replicas") for lane in lanes} == {"4"}
    label = lanes[0].find(f"{SVG_NS}text")
    assert label is not None and "\u00d74" in "".join(label.itertext())


def test_pages_and_errors_from_the_server() -> None:
    deps = deps_for()
    runs = every_kind(deps)
    server = UIServer(backend_of(deps), port=0, refresh_s=3)
    try:
        status, kind, body = server.respond("/", {})
        html = body.decode()
        assert status == 200 and kind.startswith("text/html")
        assert html.count('class="run"') == 4 and 'http-equiv="refresh" content="3"' in html
        status, _, body = server.respond("/", {"status": "SUCCEEDED"})
        assert body.decode().count('class="run"') == 1
        assert 'http-equiv="refresh"' not in body.decode()  # nothing live on this page
        status, _, body = server.respond(f"/runs/{runs['live'].run_id}", {})
        assert status == 200 and 'http-equiv="refresh"' in body.decode()
        status, _, body = server.respond(f"/runs/{runs['story'].run_id}", {})
        assert status == 200 and 'http-equiv="refresh"' not in body.decode()
        assert server.respond("/runs/nope", {})[0] == 404
        status, _, body = server.respond("/", {"status": "weird"})
        assert status == 400 and "unknown status" in body.decode()
        status, kind, body = server.respond(f"/runs/{runs['story'].run_id}/timeline.svg", {})
        assert kind == "image/svg+xml" and body.startswith(b"<svg")
        assert server.respond("/api/runs", {"limit": "2"})[2].count(b'"run_id"') == 2
    finally:
        server.close()


def test_sweep_and_hardware_pages_from_the_server() -> None:
    import json

    deps = deps_for()
    hw = hardware_run(deps)
    made = sweeps(deps)
    done, running = made["done"], made["running"]
    server = UIServer(backend_of(deps), port=0, refresh_s=3)
    try:
        status, _, body = server.respond("/sweeps", {})
        html = body.decode()
        assert status == 200 and html.count('class="sweep"') == 2
        assert 'http-equiv="refresh"' in html  # one sweep is still running
        assert server.respond("/sweeps", {"status": "ended"})[2].decode().count(
            'class="sweep"') == 1
        status, _, body = server.respond("/sweeps", {"status": "weird"})
        assert status == 400 and "unknown sweep status" in body.decode()
        status, _, body = server.respond(f"/sweeps/{done.sweep_id}", {})
        html = body.decode()
        assert status == 200 and html.count('<tr class="trial') == 4
        assert 'class="trial best" data-trial="2"' in html and "stopped early" in html
        assert 'http-equiv="refresh"' not in html  # it ended
        assert server.respond("/sweeps/nope", {})[0] == 404
        listing = json.loads(server.respond("/api/sweeps", {})[2])
        assert [r["sweep_id"] for r in listing["sweeps"]] == [running.sweep_id, done.sweep_id]
        one = json.loads(server.respond(f"/api/sweeps/{done.sweep_id}", {})[2])
        assert one["best"]["trial"] == 2 and len(one["trials"]) == 4
        status, _, body = server.respond(f"/runs/{hw.run_id}", {})
        html = body.decode()
        assert 'class="candidate chosen" data-candidate="l4"' in html
        assert 'class="candidate unfit" data-candidate="small"' in html
        assert "chosen: l4: cheapest expected Spot cost" in html and 'class="warning"' not in html
        rush = hardware_run(deps, replace(HW_PIPELINE, name="rush", deadline_s=3600.0))
        html = server.respond(f"/runs/{rush.run_id}", {})[2].decode()
        assert '<p class="warning">no candidate is expected to meet the deadline' in html
        trial_run = server.respond(f"/runs/{done.trials[1].run_id}", {})[2].decode()
        assert f'href="/sweeps/{done.sweep_id}"' in trial_run and "lr=0.01" in trial_run
        story = server.respond(f"/runs/{every_kind(deps)['story'].run_id}", {})[2].decode()
        assert "checkpoint more often" in story
    finally:
        server.close()


# ---------------------------------------------------------------- in Chromium, on Firestore

def _ensure_chromium() -> str:
    """Debian's chromium; installed with apt-get when missing and we are root (CI)."""
    if not Path(CHROMIUM).exists() and os.geteuid() == 0 and shutil.which("apt-get"):
        subprocess.run(["apt-get", "update", "-qq"], check=False, timeout=600)
        subprocess.run(["apt-get", "install", "-y", "-qq", "chromium"], check=False, timeout=900,
                       env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"})
    if not Path(CHROMIUM).exists():
        pytest.fail("these tests need Debian's chromium: apt-get update && apt-get install -y "
                    "chromium")
    return CHROMIUM


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    executable = _ensure_chromium()
    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=executable, headless=True, args=CHROMIUM_FLAGS)
        try:
            yield chromium
        finally:
            chromium.close()


@pytest.fixture
def firestore_world(firestore_emulator: Any) -> tuple[Deps, dict[str, Run], Backend]:
    from google.cloud import firestore

    from spotorch.adapters.gcp.firestore import FirestoreDocumentStore
    from spotorch.adapters.gcp.firestore_reads import FirestoreRunReader, FirestoreSweepReader

    deps = deps_for(FirestoreDocumentStore(project=firestore_emulator.project))
    runs = every_kind(deps)
    client = firestore.Client(project=firestore_emulator.project)
    return deps, runs, backend_of(deps, FirestoreRunReader(client), FirestoreSweepReader(client))


def _shot(page: Any, name: str) -> Path:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    assert path.stat().st_size > 10_000  # a real rendering, not a blank page
    return path


@pytest.mark.emulator
def test_the_runs_page_and_a_run_page_in_chromium(
        browser: Any, firestore_world: tuple[Deps, dict[str, Run], Backend]) -> None:
    _, runs, backend = firestore_world
    server = UIServer(backend, port=0, refresh_s=600).start()  # no reload while we click
    try:
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        page.goto(server.url)
        rows = page.locator("tr.run")
        assert rows.count() == 4
        assert [rows.nth(i).get_attribute("data-status") for i in range(4)] == [
            "QUEUED", "RUNNING", "FAILED", "SUCCEEDED"]
        story_row = page.locator(f'tr.run[data-run-id="{runs["story"].run_id}"]')
        assert "(10%)" in story_row.locator("td.savings").inner_text()
        failed_badge = page.locator(f'tr.run[data-run-id="{runs["failed"].run_id}"] .status')
        assert "rgb(153, 27, 27)" in failed_badge.evaluate("e => getComputedStyle(e).color")
        _shot(page, "runs")

        page.select_option("select[name=status]", "failed")
        page.click("form.filters button")
        page.wait_for_url("**status=failed**")
        assert page.locator("tr.run").count() == 1

        page.goto(server.url)
        page.click(f'a[href="/runs/{runs["story"].run_id}"]')
        page.wait_for_selector("svg.timeline")
        lanes = page.locator("svg.timeline g.lane")
        assert [lanes.nth(i).get_attribute("data-capacity") for i in range(lanes.count())] == [
            "spot", "spot", "standard"]
        assert page.locator("svg.timeline g.preemption").count() == 2
        assert page.locator("svg.timeline g.checkpoint").count() == 3
        box = page.locator("svg.timeline").bounding_box()
        assert box is not None and box["width"] > 900 and box["height"] > 250
        ledger_text = page.locator(".ledger").inner_text()
        assert "saved against standard VMs" in ledger_text and "30 steps redone" in ledger_text
        assert page.locator("table.history tr.event").count() == len(runs["story"].history)
        assert page.locator("meta[http-equiv=refresh]").count() == 0  # it ended
        _shot(page, "run")
    finally:
        server.close()


@pytest.mark.emulator
def test_a_live_run_page_refreshes_itself(
        browser: Any, firestore_world: tuple[Deps, dict[str, Run], Backend]) -> None:
    deps, runs, backend = firestore_world
    live = runs["live"]
    server = UIServer(backend, port=0, refresh_s=1).start()
    try:
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        page.goto(f"{server.url}runs/{live.run_id}")
        facts = page.locator(".facts")
        assert f"40 / {TOTAL_STEPS}" in facts.inner_text()
        assert page.locator("svg.timeline line.now").count() == 1
        _shot(page, "run-live")
        trainer_reported(deps, live.run_id, TrainerReported(1, "progress", deps.clock.now(),
                                                            step=120, total_steps=TOTAL_STEPS))
        deadline = time.monotonic() + 15
        while f"120 / {TOTAL_STEPS}" not in page.locator(".facts").inner_text():
            assert time.monotonic() < deadline, "the page did not refresh itself"
            time.sleep(0.3)
    finally:
        server.close()


@pytest.mark.emulator
def test_a_runs_hardware_table_in_chromium(
        browser: Any, firestore_world: tuple[Deps, dict[str, Run], Backend]) -> None:
    deps, _, backend = firestore_world
    run = hardware_run(deps)
    server = UIServer(backend, port=0, refresh_s=600).start()
    try:
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        page.goto(f"{server.url}runs/{run.run_id}")
        chosen = page.locator("table.hardware tr.chosen")
        assert chosen.count() == 1 and chosen.get_attribute("data-candidate") == "l4"
        assert chosen.locator("td.reason").inner_text() == "chosen"
        assert chosen.is_visible()
        # the chosen row stands out: its own background, not the table's white
        background = chosen.locator("td").first.evaluate("e => getComputedStyle(e).backgroundColor")
        assert background == "rgb(220, 252, 231)"
        unfit = page.locator('table.hardware tr.unfit[data-candidate="small"]')
        assert unfit.locator("td.fits").inner_text() == "no"
        assert unfit.locator("td.reason").inner_text() == f"out of memory ({OOM_MESSAGE})"
        assert unfit.locator("td.reason").is_visible()
        cpu = page.locator('table.hardware tr[data-candidate="cpu"]')
        assert cpu.locator("td.fits").inner_text() == "misses deadline"
        assert page.locator("section.hardware p.choice").inner_text().startswith(
            "chosen: l4: cheapest expected Spot cost")
        assert "not enough history" in page.locator(".facts .advice").inner_text()
        page.locator("section.hardware").scroll_into_view_if_needed()
        _shot(page, "run-hardware")
    finally:
        server.close()


@pytest.mark.emulator
def test_the_sweeps_page_and_a_sweeps_trials_in_chromium(
        browser: Any, firestore_world: tuple[Deps, dict[str, Run], Backend]) -> None:
    deps, _, backend = firestore_world
    made = sweeps(deps)
    done, running = made["done"], made["running"]
    server = UIServer(backend, port=0, refresh_s=600).start()
    try:
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        page.goto(server.url)
        page.click('header nav a[href="/sweeps"]')
        page.wait_for_url("**/sweeps")
        rows = page.locator("tr.sweep")
        assert [rows.nth(i).get_attribute("data-sweep-id") for i in range(rows.count())] == [
            running.sweep_id, done.sweep_id]
        row = page.locator(f'tr.sweep[data-sweep-id="{done.sweep_id}"]')
        assert row.locator("td.trials").inner_text() == "4/4"
        assert row.locator("td.best").inner_text() == "2"
        assert row.locator("td.metric").inner_text() == "loss 0.2"
        _shot(page, "sweeps")

        page.select_option("select[name=status]", "active")
        page.click("form.filters button")
        page.wait_for_url("**status=active**")
        assert page.locator("tr.sweep").count() == 1

        page.goto(f"{server.url}sweeps")
        page.click(f'a[href="/sweeps/{done.sweep_id}"]')
        page.wait_for_selector("table.trials")
        trials = page.locator("table.trials tr.trial")
        assert [trials.nth(i).get_attribute("data-status") for i in range(4)] == [
            "SUCCEEDED", "SUCCEEDED", "STOPPED", "SUCCEEDED"]
        best = page.locator("table.trials tr.best")
        assert best.count() == 1 and best.get_attribute("data-trial") == "2"
        assert best.locator("td.params").inner_text() == "lr=0.01"
        assert best.locator("td.metric").inner_text() == "0.2"
        stopped = page.locator('table.trials tr[data-trial="3"]')
        assert stopped.locator("td.early").inner_text() == "stopped early"
        assert stopped.locator("td.step").inner_text() == "10"
        facts = page.locator(".facts").inner_text()
        assert "tune@1" in facts and "loss (minimize)" in facts and "1 stopped early" in facts
        _shot(page, "sweep")

        page.click(f'a[href="/runs/{done.trials[1].run_id}"]')  # a trial is a run
        page.wait_for_selector("svg.timeline")
        assert page.locator(f'.facts a[href="/sweeps/{done.sweep_id}"]').count() == 1
    finally:
        server.close()


@pytest.mark.emulator
def test_firestore_listing_pages_and_filters(
        firestore_world: tuple[Deps, dict[str, Run], Backend]) -> None:
    from spotorch.ports.reads import RunQuery, parse_statuses

    _, runs, backend = firestore_world
    newest_first = [runs[k].run_id for k in ("queued", "live", "failed", "story")]
    seen: list[str] = []
    token = None
    while True:
        page = backend.reader.list(RunQuery(limit=3, page_token=token))
        seen += [r.run_id for r in page.runs]
        token = page.next_page_token
        if token is None:
            break
    assert seen == newest_first
    failed = backend.reader.list(RunQuery(statuses=parse_statuses(["failed"])))
    assert [r.run_id for r in failed.runs] == [runs["failed"].run_id]
    recent = backend.reader.list(RunQuery(since=runs["live"].created_at))
    assert [r.run_id for r in recent.runs] == newest_first[:2]


def test_the_ui_command_serves_until_stopped(tmp_path: Path) -> None:
    """`spotorch ui` as a process: it says where it listens, serves, and stops on SIGINT."""
    import signal
    import sys

    from spotorch.local.emulators import free_port

    port = free_port()
    state = tmp_path / "none.json"
    env = {**os.environ, "SPOTORCH_API_URL": "http://127.0.0.1:9/",
           "FIRESTORE_EMULATOR_HOST": "127.0.0.1:9"}
    proc = subprocess.Popen([sys.executable, "-m", "spotorch.operate.cli", "--state", str(state),
                             "ui", "--port", str(port)], env=env, stderr=subprocess.PIPE,
                            text=True)
    try:
        assert proc.stderr is not None
        line = proc.stderr.readline()
        assert f"http://127.0.0.1:{port}/" in line
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=10) as reply:
            assert reply.read() == b"ok"
    finally:
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=10) == 0
