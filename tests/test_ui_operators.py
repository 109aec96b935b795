"""The web view an operator lives in, in headless Chromium at 1,280 px on runs the service layer
wrote to the Firestore emulator: totals, metric charts, a failed attempt's error and logs,
cancel and retry through the real api handler, snapshots, pipelines, a sweep's trials and its
stopping decisions. Screenshots go to build/test-artifacts/ui/, or to docs/img/ with
SPOTORCH_DOC_SCREENSHOTS=1 (how the pictures in docs/operating.md are made)."""

from __future__ import annotations

import os
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from operator_runs import TRACEBACK, arrivals, deps_for, every_kind, sweeps
from spotorch.app.deps import Deps
from spotorch.core.model import Run, RunStatus
from spotorch.operate.backend import Backend
from spotorch.operate.logsource import LocalWorkerLogs
from spotorch.operate.ui.server import UIServer
from test_cli import ApiActions
from test_ui import ARTIFACTS, CHROMIUM_FLAGS, ROOT, _ensure_chromium, backend_of

pytestmark = pytest.mark.emulator
DOCS_IMG = ROOT / "docs" / "img"
WIDTH = 1280


def shot(page: Any, name: str) -> Path:
    """A full-page PNG, into docs/img when asked (SPOTORCH_DOC_SCREENSHOTS=1)."""
    folder = DOCS_IMG if os.environ.get("SPOTORCH_DOC_SCREENSHOTS") == "1" else ARTIFACTS
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"ui-{name}.png"
    page.screenshot(path=str(path), full_page=True)
    assert path.stat().st_size > 10_000  # a real rendering, not a blank page
    return path


def no_sideways_scroll(page: Any) -> None:
    """Usable at 1,280 px: nothing wider than the window, every table inside its section."""
    assert page.evaluate("document.documentElement.scrollWidth") <= WIDTH
    widths = page.evaluate("[...document.querySelectorAll('table')].map("
                           "t => [t.scrollWidth, t.parentElement.clientWidth])")
    assert all(table <= room for table, room in widths), widths


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=_ensure_chromium(), headless=True,
                                     args=CHROMIUM_FLAGS)
        try:
            yield chromium
        finally:
            chromium.close()


@pytest.fixture
def operated(firestore_emulator: Any, monkeypatch: pytest.MonkeyPatch,
             tmp_path: Path) -> Iterator[tuple[Deps, dict[str, Run], Backend, UIServer]]:
    """Runs, sweeps and uploads in the Firestore emulator; the UI on a backend whose actions go
    through the real api handler (functions/main.py's api, on these deps)."""
    from google.cloud import firestore

    from spotorch.adapters.gcp.firestore import FirestoreDocumentStore
    from spotorch.adapters.gcp.firestore_reads import (
        FirestoreArrivalReader,
        FirestoreRunReader,
        FirestoreSweepReader,
    )

    deps = deps_for(FirestoreDocumentStore(project=firestore_emulator.project))
    runs = every_kind(deps)
    client = firestore.Client(project=firestore_emulator.project)
    backend = backend_of(deps, FirestoreRunReader(client), FirestoreSweepReader(client))
    backend.actions = ApiActions(deps, monkeypatch)
    backend.arrivals = FirestoreArrivalReader(client)
    backend.logs = LocalWorkerLogs(tmp_path / "vertex")
    server = UIServer(backend, port=0, refresh_s=600).start()  # no reload while we click
    try:
        yield deps, runs, backend, server
    finally:
        server.close()


def _worker_files(backend: Backend, run: Run, attempt: int) -> None:
    job_name = run.attempts[attempt - 1].job_name
    assert isinstance(backend.logs, LocalWorkerLogs) and job_name
    folder = backend.logs.workdir / job_name.rsplit("/", 1)[-1]
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "workerpool0-0.log").write_text("epoch 1 of 3\n")
    (folder / "workerpool0-0.stderr").write_text("\n".join(TRACEBACK) + "\n")


def test_the_runs_page_totals_and_a_failed_runs_error_logs_and_retry(
        browser: Any, operated: tuple[Deps, dict[str, Run], Backend, UIServer]) -> None:
    deps, runs, backend, server = operated
    failed = runs["failed"]
    _worker_files(backend, failed, 2)
    page = browser.new_page(viewport={"width": WIDTH, "height": 900})
    page.goto(server.url)
    totals = page.locator(".totals")
    assert "runs4" in totals.inner_text().replace("\n", "")
    assert page.locator(".totals .by-status .status").count() == 4  # one run of each status
    no_sideways_scroll(page)
    shot(page, "runs")

    page.goto(f"{server.url}runs/{failed.run_id}")
    no_sideways_scroll(page)  # the attempts table of a failed run fits
    tail = page.locator("tr.attempt[data-attempt='2'] details.error-tail")
    assert tail.locator("summary").inner_text() == TRACEBACK[-1]
    tail.locator("summary").click()
    assert "Traceback (most recent call last):" in tail.locator("pre.tail").inner_text()
    assert page.locator("details.confirm").count() == 0  # it ended: nothing to cancel
    shot(page, "run-failed")

    page.click("tr.attempt[data-attempt='2'] a[href*='/logs']")
    page.wait_for_selector("pre.log")
    log = page.locator("pre.log")
    assert "epoch 1 of 3" in log.inner_text() and TRACEBACK[-1] in log.inner_text()
    assert page.locator("pre.log span.stderr").count() == len(TRACEBACK)
    shot(page, "logs")

    page.goto(f"{server.url}runs/{failed.run_id}")
    page.click("text=Retry from the latest checkpoint")
    page.wait_for_url(f"**/runs/{failed.run_id}-retry-1?done=*")
    assert "retry of " + failed.run_id in page.locator(".notice").inner_text()
    retried = deps.runs.load(f"{failed.run_id}-retry-1")[0]
    assert retried is not None and retried.retry_of == failed.run_id  # written by the api


def test_a_runs_provenance_and_a_rerun_through_the_api(
        browser: Any, operated: tuple[Deps, dict[str, Run], Backend, UIServer]) -> None:
    """Issue 30: the run page shows what the run trained on and with; its rerun button starts
    one run on those inputs, through the real api handler."""
    deps, runs, _, server = operated
    story = runs["story"]
    assert story.provenance is not None
    page = browser.new_page(viewport={"width": WIDTH, "height": 900})
    page.goto(f"{server.url}runs/{story.run_id}")
    section = page.locator("section.provenance")
    assert section.locator(".seed").inner_text() == str(story.provenance["seed"])
    assert story.provenance["code"]["hash"][:16] in section.inner_text()
    assert "not pinned" in section.inner_text()  # a tag, and a submit by hand of a folder
    no_sideways_scroll(page)
    shot(page, "run-provenance")
    page.click("text=Rerun on the same inputs")
    page.wait_for_url("**-rerun-*?done=*")
    assert "rerun of " + story.run_id in page.locator(".notice").inner_text()
    rerun_id = urllib.parse.urlparse(page.url).path.rsplit("/", 1)[-1]
    rerun = deps.runs.load(rerun_id)[0]
    assert rerun is not None and rerun.rerun_of == story.run_id  # written by the api
    assert rerun.provenance is not None
    assert rerun.provenance["seed"] == story.provenance["seed"]
    assert page.locator("dl.facts dd a[href='/runs/" + story.run_id + "']").count() == 1


def test_cancel_goes_through_the_api_and_a_forged_post_is_refused(
        browser: Any, operated: tuple[Deps, dict[str, Run], Backend, UIServer]) -> None:
    deps, runs, _, server = operated
    live = runs["live"]
    form = urllib.parse.urlencode({"token": "guessed", "reason": "x"}).encode()
    request = urllib.request.Request(f"{server.url}runs/{live.run_id}/cancel", data=form,
                                     headers={"Origin": "http://evil.example"})
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=10)
    assert refused.value.code == 403
    assert deps.runs.load(live.run_id)[0].status is RunStatus.RUNNING  # type: ignore[union-attr]

    page = browser.new_page(viewport={"width": WIDTH, "height": 900})
    page.goto(f"{server.url}runs/{live.run_id}")
    page.click("details.confirm summary")
    page.fill("details.confirm input[name=reason]", "wrong data")
    page.click("details.confirm button.danger")
    page.wait_for_url(f"**/runs/{live.run_id}?done=*")
    assert "cancel asked" in page.locator(".notice").inner_text()
    after = deps.runs.load(live.run_id)[0]
    assert after is not None and after.status in (RunStatus.CANCELLING, RunStatus.CANCELLED)
    assert any("wrong data" in h.reason for h in after.history)


def test_a_runs_metric_charts_and_the_cost_scale(
        browser: Any, operated: tuple[Deps, dict[str, Run], Backend, UIServer]) -> None:
    _, runs, _, server = operated
    page = browser.new_page(viewport={"width": WIDTH, "height": 900})
    page.goto(f"{server.url}runs/{runs['story'].run_id}")
    chart = page.locator("section.metrics svg.metric")
    assert chart.count() == 1 and chart.get_attribute("aria-label") == "loss"
    assert chart.locator(".ytick").count() >= 3 and chart.locator(".xtick").count() >= 3
    assert [m.text_content() for m in chart.locator("g.mark text").all()] == ["attempt 2",
                                                                            "attempt 3"]
    assert page.locator("svg.timeline g.cost-tick").count() == 4  # the cost curve has a scale
    no_sideways_scroll(page)
    shot(page, "run")


def test_the_snapshots_and_pipelines_pages(
        browser: Any, operated: tuple[Deps, dict[str, Run], Backend, UIServer]) -> None:
    deps, _, _, server = operated
    folders = arrivals(deps)
    page = browser.new_page(viewport={"width": WIDTH, "height": 900})
    page.goto(server.url)
    page.click('header nav a[href="/snapshots"]')
    page.wait_for_url("**/snapshots")
    waiting = page.locator(f'tr.snapshot[data-uri="{folders["waiting"]}"]')
    assert waiting.get_attribute("data-state") == "open"
    assert "waiting for its marker _DONE" in waiting.locator("td.reason").inner_text()
    started = page.locator(f'tr.snapshot[data-uri="{folders["started"]}"]')
    assert started.locator("a").inner_text().startswith("nightly-")
    stray = page.locator(f'tr.unmatched[data-uri="{folders["wrong marker"]}"]')
    assert "this pipeline's marker is _DONE" in stray.inner_text()
    no_sideways_scroll(page)
    shot(page, "snapshots")

    page.click('header nav a[href="/pipelines"]')
    page.wait_for_url("**/pipelines")
    nightly = page.locator('tr.pipeline[data-pipeline="nightly"]')
    assert "objects ending .csv in gs://landing/nightly/<folder>/; marker _DONE" in \
        nightly.inner_text()
    assert page.locator("tr.pipeline").count() == len(deps.pipelines)
    no_sideways_scroll(page)
    shot(page, "pipelines")


def test_a_sweeps_trial_curves_stopping_decisions_and_cancel(
        browser: Any, operated: tuple[Deps, dict[str, Run], Backend, UIServer]) -> None:
    deps, _, _, server = operated
    made = sweeps(deps)
    done, running = made["done"], made["running"]
    page = browser.new_page(viewport={"width": WIDTH, "height": 900})
    page.goto(f"{server.url}sweeps/{done.sweep_id}")
    curves = page.locator("svg.sweep-curves g.series")
    assert curves.count() == 4
    stopped = page.locator('table.trials tr[data-trial="3"] details.stop')
    stopped.locator("summary").click()
    assert "median stopping: best loss" in stopped.inner_text()
    assert page.locator("details.confirm").count() == 0  # it ended
    no_sideways_scroll(page)
    shot(page, "sweep")

    page.goto(f"{server.url}sweeps/{running.sweep_id}")
    page.click("details.confirm summary")
    page.click("details.confirm button.danger")
    page.wait_for_url(f"**/sweeps/{running.sweep_id}?done=*")
    assert "cancel asked" in page.locator(".notice").inner_text()


def test_the_json_views_behind_the_pages(
        operated: tuple[Deps, dict[str, Run], Backend, UIServer]) -> None:
    import json

    deps, runs, _, server = operated
    arrivals(deps)
    totals = json.loads(server.respond("/api/totals", {"period": "30d"})[2])
    assert totals["runs"] == 5 and totals["period"] == "30d"  # every_kind's 4 and nightly's
    assert json.loads(server.respond("/api/snapshots", {})[2])["unmatched"]
    assert {p["name"] for p in json.loads(server.respond("/api/pipelines", {})[2])["pipelines"]} \
        == set(deps.pipelines)
    view = json.loads(server.respond(f"/api/runs/{runs['failed'].run_id}", {})[2])
    assert view["attempts"][1]["error"] == TRACEBACK[-1] and view["can_retry"]
