"""The demo's flapping story (issue 39): Spot capacity that keeps coming and going.

Spot capacity flips every 15 s (gone for 15 s, back for 15 s) and every Spot job is preempted
12 s after it starts running. The pipeline escalates on its deadline (`escalation: deadline`)
with a generous deadline, so the deadline policy alone would stay on Spot; its preemption budget
is 20. With the budget spent, one more preemption would end a run standard VMs can still finish
by its deadline: the escalation rule moves the run to standard instead, where it succeeds.

`settings(budget, flip_s, preempt_s)` scales the story down (tests/test_flapping.py runs it with
a smaller budget and shorter times); SETTINGS is the story as the issue told it.

Registered in demo_scenarios.SCENARIOS by name; plain values, so that importing this module
needs nothing of the demo's.
"""

from __future__ import annotations

from typing import Any


def settings(budget: int = 20, flip_s: float = 15.0, preempt_s: float = 12.0,
             total_steps: int = 1500, deadline: str = "30m",
             horizon_s: float = 3600.0) -> dict[str, Any]:
    """The story's Scenario fields: Spot gone every other flip_s, Spot jobs preempted after
    preempt_s of running, a preemption budget of `budget`."""
    windows = [{"from_s": start, "for_s": flip_s}
               for start in _starts(flip_s, horizon_s)]
    return dict(
        name="flapping",
        title="Spot flips every 15 s: the preemption budget escalates to standard",
        setup=f"Spot capacity is gone every other {flip_s:.0f} s and every Spot job is preempted "
              f"{preempt_s:.0f} s after it starts running; the pipeline escalates on its "
              f"deadline ({deadline}) and allows {budget} preemptions.",
        expected_status="SUCCEEDED",
        recovery={"escalation": "deadline", "max_preemptions": budget,
                  "max_no_progress_attempts": 99, "restart_overhead": "5s",
                  "backoff_base": "1s", "stockout_wait": "10m", "decision_interval": "2s",
                  "expected_compute": f"{total_steps * 0.1:.0f}s"},
        vertex_schedule={"every_spot_job_after_s": preempt_s, "stockouts": windows},
        trainer_env={"EXAMPLE_TOTAL_STEPS": str(total_steps), "EXAMPLE_STEP_SLEEP": "0.1",
                     "EXAMPLE_CHECKPOINT_EVERY": "10", "EXAMPLE_PROGRESS_INTERVAL": "1"},
        deadline=deadline,
    )


def _starts(flip_s: float, horizon_s: float) -> list[float]:
    out, t = [], flip_s
    while t < horizon_s:
        out.append(t)
        t += 2 * flip_s
    return out


SETTINGS = settings()
