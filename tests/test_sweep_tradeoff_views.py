"""Issue 38: `spotorch sweep SWEEP` shows the trade-off of a Vizier sweep: each trial on the
objectives, the Pareto front, the constraints each trial misses, and why the chosen trial was
chosen; `--json` carries the same."""

from __future__ import annotations

import json
import re
from pathlib import Path

from click.testing import CliRunner

from spotorch.app.queries import DocumentRunReader, DocumentSweepReader
from spotorch.app.sweeps import start_sweep
from spotorch.operate.backend import Backend
from spotorch.operate.cli import cli
from spotorch.operate.logsource import LocalWorkerLogs
from test_sweep_vizier import finish, make


def backend(tmp_path: Path) -> tuple[Backend, str]:
    deps = make()
    sw = start_sweep(deps, "p", sweep_id="sw", data_uri="gs://b/d/", snapshot_id="d")
    finish(deps, "sw-t1", accuracy=0.95, latency_p95_ms=35.0)
    finish(deps, "sw-t2", accuracy=0.90, latency_p95_ms=12.0)
    finish(deps, "sw-t3", accuracy=0.80, latency_p95_ms=15.0)
    return Backend(reader=DocumentRunReader(deps.docs), sweeps=DocumentSweepReader(deps.docs),
                   actions=None,  # type: ignore[arg-type]  # nothing is steered here
                   logs=LocalWorkerLogs(tmp_path / "vertex"), pipelines=deps.pipelines,
                   clock=deps.clock.now), sw.sweep_id


def test_the_json_view_carries_the_front_the_constraints_and_the_choice(tmp_path: Path) -> None:
    found, sweep_id = backend(tmp_path)
    done = CliRunner().invoke(cli, ["sweep", sweep_id, "--json"], obj=found, prog_name="spotorch")
    assert done.exit_code == 0, done.output
    view = json.loads(done.output)
    made = view["trade_off"]
    assert made["search"] == "vizier" and made["chosen"] == 2 and made["pareto"] == [1, 2]
    assert made["constraints"] == {"latency_p95_ms": {"max": 20.0}}
    assert made["misses"] == {"1": ["latency_p95_ms 35 > max 20"]}
    assert [o["name"] for o in made["objectives"]] == ["accuracy", "latency_p95_ms", "cost"]
    assert view["study"].startswith("projects/proj/locations/us-central1/studies/")
    assert view["trials"][0]["metrics"]["latency_p95_ms"] == 35.0


def test_the_table_marks_the_front_and_says_why_the_chosen_trial_was_chosen(
        tmp_path: Path) -> None:
    found, sweep_id = backend(tmp_path)
    done = CliRunner().invoke(cli, ["sweep", sweep_id], obj=found, prog_name="spotorch",
                              env={"COLUMNS": "160"})
    assert done.exit_code == 0, done.output
    out = done.output
    assert "trade-off" in out and "latency_p95_ms (↓, max 20)" in out
    assert "Pareto front on accuracy, latency_p95_ms, cost: trials 1, 2 (search vizier)" in out
    assert "chosen: trial 2: best accuracy (0.9) among the 2 of 3 trials that meet the" in out
    assert "accuracy 0.9, lr=" in out  # the head names the quality metric
    assert "latency_p95_ms 35 > max 20" in out
    row = next(line for line in out.splitlines() if line.lstrip().startswith("2 ←"))
    assert "yes" in row and "met" in row


# --- the web view: quality against cost and latency, in headless Chromium -------------------------

from test_ui import browser  # noqa: E402,F401  # the module's Chromium (Debian's, Playwright)


def _ui_backend(tmp_path: Path) -> tuple[Backend, str]:
    found, sweep_id = backend(tmp_path)
    from test_ui import NoActions

    return Backend(reader=found.reader, sweeps=found.sweeps, actions=NoActions(),
                   logs=found.logs, pipelines=found.pipelines, clock=found.clock), sweep_id


def test_the_trade_off_plots_are_svg_with_the_front_and_the_choice(tmp_path: Path) -> None:
    from xml.etree import ElementTree

    from spotorch.app.views import sweep_view
    from spotorch.operate.ui.tradeoff_chart import tradeoff_section

    found, sweep_id = backend(tmp_path)
    sw = found.sweep(sweep_id)
    html = tradeoff_section(sweep_view(sw, found.pipeline(sw.pipeline)))
    svgs = [ElementTree.fromstring(m) for m in re.findall(r"<svg.*?</svg>", html, re.S)]
    assert [s.get("class") for s in svgs] == ["chart tradeoff tradeoff-cost",
                                              "chart tradeoff tradeoff-latency-p95-ms"]
    ns = "{http://www.w3.org/2000/svg}"
    latency = svgs[1]
    points = {g.get("data-trial"): g.get("class") for g in latency.iter(f"{ns}g")
              if (g.get("class") or "").startswith("point")}
    assert points == {"1": "point front misses", "2": "point front chosen", "3": "point other"}
    limits = [g.get("data-limit") for g in latency.iter(f"{ns}g") if g.get("class") == "limit-x"]
    assert limits == ["max 20"]


def test_the_sweep_page_plots_the_trade_off_in_chromium(browser: object, tmp_path: Path) -> None:  # noqa: F811
    from spotorch.operate.ui.server import UIServer

    found, sweep_id = _ui_backend(tmp_path)
    server = UIServer(found, port=0, refresh_s=600).start()
    try:
        page = browser.new_page(viewport={"width": 1280, "height": 900})  # type: ignore[attr-defined]
        page.goto(f"{server.url}sweeps/{sweep_id}")
        page.wait_for_selector("section.tradeoff svg.tradeoff-latency-p95-ms")
        chosen = page.locator("svg.tradeoff-latency-p95-ms g.point.chosen")
        assert chosen.count() == 1 and chosen.get_attribute("data-trial") == "2"
        assert page.locator("svg.tradeoff-cost g.point.front").count() == 2
        box = page.locator("svg.tradeoff-latency-p95-ms").bounding_box()
        assert box is not None and box["width"] > 300 and box["height"] > 100  # drawn, visible
        assert "chosen: trial 2" in page.locator("section.tradeoff p.choice").inner_text()
        assert "misses" in (page.locator(
            'svg.tradeoff-latency-p95-ms g.point[data-trial="1"]').get_attribute("class") or "")
        page.locator("section.tradeoff").scroll_into_view_if_needed()
        page.screenshot(path=str(tmp_path / "tradeoff.png"))
    finally:
        server.close()
