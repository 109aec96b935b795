"""`spotorch ui`: the timeline SVG, the server's pages, and the pages in a real headless Chromium
(Debian's chromium driven by Playwright) on runs the service layer wrote to the Firestore emulator.

Screenshots go to build/test-artifacts/ui/ (or $SPOTORCH_TEST_ARTIFACTS).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from xml.etree import ElementTree

import pytest

from operator_runs import TOTAL_STEPS, deps_for, every_kind
from spotorch.domain import Run, TrainerReported
from spotorch.ledger import ledger
from spotorch.operate.backend import Backend
from spotorch.operate.reads import DocumentRunReader
from spotorch.service import Deps, trainer_reported
from spotorch.ui.server import UIServer
from spotorch.ui.timeline import timeline_svg

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


def backend_of(deps: Deps, reader: Any = None) -> Backend:
    return Backend(reader=reader or DocumentRunReader(deps.docs), actions=NoActions(),
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
    fills = {lane.get("data-capacity"): lane.find(f"{SVG_NS}rect[@class='run']").get("fill")
             for lane in lanes}
    assert fills["spot"] != fills["standard"]


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

    from spotorch.operate.reads import FirestoreRunReader
    from spotorch.store_firestore import FirestoreDocumentStore

    deps = deps_for(FirestoreDocumentStore(project=firestore_emulator.project))
    runs = every_kind(deps)
    reader = FirestoreRunReader(firestore.Client(project=firestore_emulator.project))
    return deps, runs, backend_of(deps, reader)


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
        assert "(28%)" in story_row.locator("td.savings").inner_text()
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
def test_firestore_listing_pages_and_filters(
        firestore_world: tuple[Deps, dict[str, Run], Backend]) -> None:
    from spotorch.operate.reads import RunQuery, parse_statuses

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
    proc = subprocess.Popen([sys.executable, "-m", "spotorch.cli", "--stack-state", str(state),
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
