"""Issue 39 on the local stack: Spot that keeps flapping spends the preemption budget, and the
run moves to standard VMs (which can still finish it by its deadline) instead of failing."""

from __future__ import annotations

import pytest

from spotorch.core.events import kind_of
from spotorch.local.demo import demo_stack
from spotorch.local.demo_flapping import settings
from spotorch.local.demo_scenarios import Scenario

pytestmark = [pytest.mark.emulator, pytest.mark.slow]


def test_a_flapping_spot_run_escalates_on_its_budget_and_succeeds_on_standard() -> None:
    # The story scaled down: Spot flips every 8 s, Spot jobs are preempted after 7 s of
    # running, 3 preemptions allowed (the full story, budget 20 at 15 s / 12 s, is `spotorch
    # demo --scenario flapping`).
    story = Scenario(**settings(budget=3, flip_s=8.0, preempt_s=7.0, total_steps=300,
                                deadline="10m", horizon_s=900.0))
    with demo_stack(story, timeout_s=300.0, quiet=True) as demo:
        run = demo.run
        r = demo.report()
    assert run is not None and run.deadline_at is not None
    assert r["status"] == "SUCCEEDED", r.get("history")
    capacities = [a["capacity"] for a in r["attempts"]]
    assert capacities[-1] == "standard" and capacities[:-1] == ["spot"] * (len(capacities) - 1)
    assert r["preemptions"] == 3 and len(capacities) == 4
    reason = r["escalated"]["reason"]
    assert "preemption budget: 3 of 3 used" in reason, reason
    # Before its deadline, and never ended by the budget.
    assert "run.budget_exceeded" not in [kind_of(t) for t in r["events"]]
    assert run.updated_at is not None and run.updated_at < run.deadline_at
