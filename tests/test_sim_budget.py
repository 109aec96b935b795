"""Issue 39 in the simulator: the preemption budget is replayed as production applies it (the
same choose_capacity): once spent, count and deadline stay off Spot; no budget, no limit."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from spotorch.sim.model import Scenario, View, Window
from spotorch.sim.replay import online_policies, run_online


def flapping(steps: int) -> Window:
    """Spot up for two steps, down for one, over and over: a preemption every three steps."""
    avail = np.array([i % 3 != 2 for i in range(steps)], dtype=bool)
    return Window(trace="flap", family="flap", start_s=0.0, avail=avail,
                  spot_price=np.ones(steps), od_price=3.0)


def test_the_deadline_policy_leaves_spot_when_its_budget_is_spent() -> None:
    scenario = Scenario(task_s=30 * 300, deadline_s=200 * 300, overhead_s=60, step_s=300,
                        checkpoint_s=300, view=View.VISIBLE, max_preemptions=4)
    window = flapping(scenario.steps)
    for name in ("deadline", "count"):
        policy = online_policies(replace(scenario, count_after=99))[name]
        budgeted = run_online(window, scenario, policy)
        assert budgeted.met_deadline and budgeted.preemptions <= 4, (name, budgeted)
    unlimited = replace(scenario, max_preemptions=None)
    free = run_online(window, unlimited, online_policies(unlimited)["deadline"])
    assert free.preemptions > 4  # without a budget the policy rides the flapping Spot
