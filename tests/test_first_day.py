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
