"""Smaller things a new user met (issue 41, item 8): `show` prints the final metrics, and its
output into a pipe is as wide as its content, not padded to 220 columns."""

from __future__ import annotations

import io

from rich.console import Console

from operator_runs import PIPELINE, _clock, deps_for, preempted_twice_then_standard
from spotorch.app.views import run_view
from spotorch.operate.cli_session import PIPE_WIDTH, Unpadded
from spotorch.operate.render import show_run


def _shown(width: int = PIPE_WIDTH) -> list[str]:
    deps = deps_for()
    run = preempted_twice_then_standard(deps)
    out = io.StringIO()
    console = Console(file=Unpadded(out), width=width,  # type: ignore[arg-type]
                      force_terminal=False, color_system=None,
                      soft_wrap=False, highlight=False)
    for part in show_run(run_view(run, PIPELINE, _clock(deps).now())):
        console.print(part)
    return out.getvalue().splitlines()


def test_show_prints_the_final_metrics() -> None:
    lines = _shown()
    (line,) = [x for x in lines if x.startswith("final metrics")]
    assert line.split()[2:] == ["loss", "0.166667"]  # the last report of attempt 3: 0.5 / 3


def test_show_into_a_pipe_is_not_padded_to_the_pipe_width() -> None:
    lines = _shown()
    assert "── attempts ──" in lines and "── history ──" in lines
    assert not [x for x in lines if x.endswith(" ")]  # no padding to any width
    assert not [x for x in lines if len(x) >= PIPE_WIDTH]


def test_a_failed_runs_headline_is_its_exception() -> None:
    from operator_runs import failed_run
    from spotorch.operate.ui.pages import _facts

    deps = deps_for()
    view = run_view(failed_run(deps), PIPELINE, _clock(deps).now())
    assert view["reason"].startswith("ValueError: bad column 'label' in part-0.csv "
                                     "(user_errors budget exhausted"), view["reason"]
    assert "<dt>reason</dt><dd>ValueError: bad column" in _facts(view)


def test_sweep_trials_are_folded_into_one_row_on_the_runs_page() -> None:
    from spotorch.operate.ui.pages import runs_page

    def row(run_id: str, sweep: str | None, status: str = "RUNNING") -> dict[str, object]:
        return {"run_id": run_id, "pipeline": "p", "status": status, "active": True,
                "created_at": f"2027-01-15T08:0{run_id[-1]}:00Z", "attempts": 1,
                "preemptions": 0, "step": 1, "total_steps": 10, "cost": 0.5, "savings": None,
                "savings_pct": None, "reason": "", "sweep_id": sweep}

    rows = [row("plain-1", None), row("sw-t1", "sw"), row("sw-t2", "sw", "CANCELLED")]
    html = runs_page(rows, {}, None, target="t", refresh_s=5)
    assert 'data-run-id="plain-1"' in html and 'data-run-id="sw-t1"' not in html
    assert html.count('class="sweep-trials"') == 1 and "2 trials" in html
    assert '<a href="/sweeps/sw">sweep sw</a>' in html and "show them" in html
    unfolded = runs_page(rows, {"trials": "1"}, None, target="t", refresh_s=5)
    assert 'data-run-id="sw-t1"' in unfolded and 'class="sweep-trials"' not in unfolded


def test_the_sweep_chart_legend_keeps_every_parameter_and_fits() -> None:
    import re

    from spotorch.operate.ui.charts import HEIGHT, Series, line_chart

    names = [f"trial {i} (lr=0.0{i} batch_size=128 hidden=256 dropout=0.{i})" for i in range(1, 9)]
    svg = line_chart([Series(n, [(0.0, 1.0), (10.0, 0.5 / i)]) for i, n in enumerate(names, 1)],
                     title="loss by step, each trial", x_label="step", y_label="loss")
    legend = re.findall(r'<g class="legend">.*?</g>', svg)
    assert len(legend) == 8
    for name, entry in zip(names, legend, strict=True):
        shown = " ".join(re.findall(r"<tspan[^>]*>([^<]*)</tspan>", entry))
        assert shown == name, (shown, name)  # whole, every parameter, wrapped not cut
    height = int(re.search(r'viewBox="0 0 \d+ (\d+)"', svg).group(1))  # type: ignore[union-attr]
    last_y = max(float(y) for y in re.findall(r'<rect x="[\d.]+" y="([\d.]+)"', svg))
    assert height > HEIGHT and last_y < height  # grown to hold the legend, nothing below it
