"""A preemption during start-up (issue 41): an attempt preempted before its trainer reported
anything lost no checkpoint; the next attempt's "fresh start" says why, and `show` and the web
view say it of the attempt, with how long after its start it came."""

from __future__ import annotations

from rich.console import Console

from operator_runs import PIPELINE, _clock, deps_for
from spotorch.adapters.memory.twins import InMemoryLauncher
from spotorch.app.job_events import job_changed
from spotorch.app.runs import submit
from spotorch.app.tick import tick
from spotorch.app.views import run_view
from spotorch.core.model import FailureClass, JobPhase
from spotorch.operate.render import show_run
from spotorch.operate.ui.pages import _attempts


def test_a_preemption_before_the_first_report_is_said_in_history_show_and_the_ui() -> None:
    deps = deps_for()
    launcher, clock = deps.launcher, _clock(deps)
    assert isinstance(launcher, InMemoryLauncher)
    run = submit(deps, "ops", "gs://landing/ops/batch-9/", request_id="startup")
    assert run is not None
    job = launcher.job_of(run.run_id, 1)
    job_changed(deps, run.run_id, 1, launcher.set_status(job, JobPhase.RUNNING))
    clock.advance(40)  # installing the package, importing: no report yet
    job_changed(deps, run.run_id, 1, launcher.set_status(job, JobPhase.FAILED,
                                                          failure=FailureClass.PREEMPTED))
    for _ in range(5):
        clock.advance(30)
        tick(deps)
    stored, _ = deps.runs.load(run.run_id)
    assert stored is not None and len(stored.attempts) >= 2, stored
    said = "attempt 1 was preempted 40 s after start, during start-up"
    launch = [h for h in stored.history if h.what.startswith("launch attempt 2")]
    assert launch and "fresh start (" + said in launch[0].reason, launch
    view = run_view(stored, PIPELINE, clock.now())
    first, second = view["attempts"][:2]
    assert first["startup_loss"].startswith(said) and "no checkpoint yet" in first["startup_loss"]
    assert second["startup_loss"] is None  # still running: nothing to say
    console = Console(width=250, record=True, color_system=None)
    for part in show_run(view):
        console.print(part)
    text = " ".join(console.export_text().split())
    assert "preempted; during start-up, no checkpoint yet" in text, text
    assert said + ", during start-up" not in text and said in text
    # REASON while STARTING: what it waits for, never a job's resource name
    assert view["reason"] == "attempt 2 job created; waiting for a machine", view["reason"]
    assert 'class="startup-loss"' in _attempts(view) and "40 s after start" in _attempts(view)


def test_an_attempt_that_reported_is_not_a_startup_loss() -> None:
    from operator_runs import preempted_twice_then_standard

    deps = deps_for()
    run = preempted_twice_then_standard(deps)
    view = run_view(run, PIPELINE, _clock(deps).now())
    assert [a["startup_loss"] for a in view["attempts"]] == [None, None, None]
