"""The simulator's production view (probes, the domain's cooldown) and FLEX_START."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from spotorch.core.pipeline import Capacity
from spotorch.core.policy import PolicyView, RegionRecord, deadline_policy, rank_regions, uniform_progress
from spotorch.sim.simulate import (
    Flex,
    FlexWait,
    Probes,
    RegionChoice,
    Scenario,
    ScenarioError,
    View,
    Window,
    main,
    run_online,
)

H = 3600
SPOT, STANDARD, FLEX = Capacity.SPOT, Capacity.STANDARD, Capacity.FLEX_START


def window(avail: list[int], od: float = 3.0) -> Window:
    return Window("t.json", "fam", 0.0, np.array(avail, dtype=bool), np.ones(len(avail)), od)


def recording(seen: list[PolicyView]) -> Callable[[PolicyView], Capacity]:
    """A policy that records what it saw: Spot when it is seen available, else standard."""
    def policy(view: PolicyView) -> Capacity:
        seen.append(view)
        return SPOT if view.spot_available else STANDARD
    return policy


BASE = dict(task_s=12 * 600, deadline_s=30 * 600, overhead_s=0, step_s=600)


def test_production_first_launch_assumes_spot_and_a_relaunch_after_preemption_does_not() -> None:
    seen: list[PolicyView] = []
    scenario = Scenario(**BASE, view=View.PRODUCTION, spot_cooldown_s=0.0)  # type: ignore[arg-type]
    run_online(window([0, 1, 0] + [1] * 27), scenario, recording(seen))
    assert seen[0].current is None and seen[0].spot_available  # the trace says no: unseen
    visible: list[PolicyView] = []
    run_online(window([0, 1, 0] + [1] * 27), Scenario(**BASE), recording(visible))  # type: ignore[arg-type]
    assert not visible[0].spot_available


def test_probes_find_spot_back_and_cost_billed_time_at_the_spot_price() -> None:
    """On standard, Spot is seen only through a probe's answer, latency after capacity."""
    seen: list[PolicyView] = []
    avail = [1, 0, 0, 0, 0, 1] + [1] * 24  # preempted at 10 min; Spot back at 50 min
    probes = Probes(billed_s=300.0, latency_s=600.0, wait_s=1200.0)
    scenario = Scenario(**BASE, view=View.PRODUCTION, spot_cooldown_s=0.0,  # type: ignore[arg-type]
                        probes=probes)

    out = run_online(window(avail), scenario, recording(seen))
    # probe_worth asks the same policy what it would do if Spot were back: keep the real call,
    # which comes first at each step.
    first = {round(v.now_s / 600): v for v in reversed(seen)}
    on_standard = [(step, v.spot_available, v.spot_assumed) for step, v in sorted(first.items())
                   if v.current is STANDARD]
    # Probes at 20 min (waits 20 min: no capacity, answer at 40), at 40 min (capacity at 50,
    # answer 10 min later at 60): Spot seen at 60 min only, never assumed.
    assert on_standard == [(2, False, False), (3, False, False), (4, False, False),
                           (5, False, False), (6, True, False)]
    assert out.probes == 2
    assert out.probe_cost == pytest.approx(300 / 3600 * 1.0)  # one hit, at Spot price 1.0
    # 10 min Spot, 50 min standard (10..60 min), then 60 min of Spot to the end.
    assert out.cost == pytest.approx(out.probe_cost + (10 + 50 * 3 + 60) / 60)
    assert out.finished_s == 12 * 600


def test_without_probes_standard_assumes_spot_back_after_the_domains_cooldown() -> None:
    seen: list[PolicyView] = []
    scenario = Scenario(**BASE, view=View.PRODUCTION, spot_cooldown_s=1800.0)  # type: ignore[arg-type]
    out = run_online(window([1, 0] + [1] * 28), scenario, recording(seen))
    assumed = [(round(v.now_s / 600), v.spot_available, v.spot_assumed)
               for v in seen if v.current is STANDARD]
    assert assumed == [(2, False, True), (3, False, True), (4, True, True)]
    assert out.probes == 0 and out.probe_cost == 0.0


def test_probes_stop_when_the_run_leaves_standard_and_never_overlap() -> None:
    """The deadline policy with probes on a long outage: probes one after another only."""
    avail = [1] * 6 + [0] * 60 + [1] * 150
    scenario = Scenario(task_s=30 * H, deadline_s=36 * H, overhead_s=600, step_s=600,
                        view=View.PRODUCTION, probes=Probes(wait_s=1800.0, latency_s=600.0))
    out = run_online(window(avail), scenario, deadline_policy)
    assert out.met_deadline
    # While on standard through the outage, at most one probe per 30 min wait (3 steps).
    assert 0 < out.probes <= 60 // 3 + 2
    visible = run_online(window(avail), dataclasses.replace(scenario, view=View.VISIBLE),
                         deadline_policy)
    assert visible.probes == 0
    assert out.cost <= visible.cost * 1.05


def test_same_policy_functions_in_both_views() -> None:
    """Both views call the policy function itself; on an always-up trace they agree."""
    scenario = Scenario(task_s=4 * H, deadline_s=8 * H, overhead_s=600, step_s=600)
    for policy in (deadline_policy, uniform_progress):
        a = run_online(window([1] * 48), scenario, policy)
        b = run_online(window([1] * 48), dataclasses.replace(
            scenario, view=View.PRODUCTION, probes=Probes()), policy)
        assert a == b


def test_flex_waits_then_runs_unpreempted_at_its_price() -> None:
    flex = Flex(price_ratio=0.5, max_wait_s=4 * H, mean_wait_s=1200.0, wait=FlexWait.FIXED)
    scenario = Scenario(task_s=2 * H, deadline_s=5 * H, overhead_s=600, step_s=600, flex=flex)

    def flex_now(view: PolicyView) -> Capacity:
        return FLEX

    out = run_online(window([0] * 30), scenario, flex_now)
    # Waits 20 min, then 10 min overhead + 2 h of work at 0.5 x 3.0 per hour, no preemption.
    assert out.finished_s == pytest.approx(20 * 60 + 600 + 2 * H)
    assert out.cost == pytest.approx(1.5 * (600 + 2 * H) / H)
    assert out.preemptions == 0


def test_flex_gives_up_at_its_max_wait_and_the_policy_decides_again() -> None:
    flex = Flex(max_wait_s=1800.0, mean_wait_s=10 * H, wait=FlexWait.FIXED)
    scenario = Scenario(task_s=2 * H, deadline_s=6 * H, overhead_s=0, step_s=600, flex=flex)
    asked: list[tuple[float, Capacity | None]] = []

    def flex_then_standard(view: PolicyView) -> Capacity:
        asked.append((view.now_s, view.current))
        return FLEX if len(asked) == 1 else STANDARD

    out = run_online(window([0] * 36), scenario, flex_then_standard)
    # Not consulted while flex waits; again once it gave up at its max wait, 30 min.
    assert asked[:2] == [(0.0, None), (1800.0, None)]
    assert out.finished_s == pytest.approx(1800 + 2 * H)
    assert out.cost == pytest.approx(3.0 * 2)


def test_flex_waits_are_reproducible_per_window() -> None:
    flex = Flex(mean_wait_s=1800.0, seed=5)
    scenario = Scenario(task_s=8 * H, deadline_s=16 * H, overhead_s=600, step_s=300, flex=flex)
    win = window([0] * scenario.steps)
    a = run_online(win, scenario, deadline_policy)
    assert a == run_online(win, scenario, deadline_policy)
    assert a.met_deadline


def test_a_policy_asking_for_flex_without_it_gets_standard() -> None:
    scenario = Scenario(task_s=H, deadline_s=2 * H, overhead_s=0, step_s=600)
    out = run_online(window([0] * 12), scenario, lambda _view: FLEX)
    assert out.cost == pytest.approx(3.0)


def test_bad_probe_and_flex_settings_list_every_problem() -> None:
    with pytest.raises(ScenarioError) as err:
        Scenario(**BASE, probes=Probes(billed_s=-1, wait_s=0),  # type: ignore[arg-type]
                 flex=Flex(price_ratio=0.0))
    message = str(err.value)
    assert "billed_s" in message and "wait_s" in message and "price_ratio" in message


def test_cli_views(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rng = np.random.default_rng(3)
    folder = tmp_path / "availability" / "1-node" / "a"
    folder.mkdir(parents=True)
    for k in range(2):
        data = (rng.random(400) < 0.6).astype(int).tolist()
        (folder / f"z{k}.json").write_text(json.dumps({"metadata": {"gap_seconds": 300},
                                                       "data": data}))
    small = [str(tmp_path), "--task-hours", "6", "--deadline-hours", "9",
             "--restart-overhead-hours", "0.1", "--window-stride-hours", "6", "--json",
             "--policies", "deadline,uniform_progress,optimal"]
    payloads = {}
    for extra in ([], ["--view", "visible"], ["--no-probes"], ["--flex"],
                  ["--probe-billed-seconds", "60", "--probe-latency-seconds", "0"]):
        assert main([*small, *extra]) == 0
        payloads[" ".join(extra)] = json.loads(capsys.readouterr().out)
    assert payloads[""]["view"] == "production"
    assert payloads["--view visible"]["view"] == "visible"
    assert payloads["--view visible"]["policies"]["deadline"]["mean_probes"] == 0
    assert payloads[""]["policies"]["deadline"]["mean_probes"] > 0
    assert payloads["--no-probes"]["policies"]["deadline"]["mean_probes"] == 0
    for payload in payloads.values():
        assert payload["policies"]["deadline"]["deadline_met_fraction"] == 1.0
        assert payload["policies"]["optimal"]["mean_cost_ratio_to_optimal"] == pytest.approx(1.0)
    assert main([*small, "--probe-wait-seconds", "0"]) == 2
    assert "wait_s" in capsys.readouterr().err


def zone_window(zones: list[list[int]], past: list[list[int]]) -> Window:
    z = np.array(zones, dtype=bool)
    return Window("fam", "fam", 0.0, z[0], np.ones(z.shape[1]), 3.0, zones=z,
                  zone_past=np.array(past, dtype=bool).reshape(len(zones), -1))


def test_fixed_order_moves_on_after_a_stockout_and_history_goes_to_the_best_zone() -> None:
    """Zone 0 down, zone 1 down, zone 2 up; the record has seen the same the day before."""
    n = 24
    zones = [[0] * n, [0] * n, [1] * n]
    past = [[0] * 6, [0] * 6, [1] * 6]
    scenario = Scenario(task_s=2 * H, deadline_s=4 * H, overhead_s=0, step_s=600,
                        stockout_wait_s=1200.0)

    def spot(view: PolicyView) -> Capacity:
        return SPOT

    fixed = run_online(zone_window(zones, past), scenario, spot)
    # Two steps queued in zone 0, stockout; two in zone 1, stockout; then 2 h in zone 2.
    assert fixed.finished_s == pytest.approx(4 * 600 + 2 * H)
    history = run_online(zone_window(zones, past),
                         dataclasses.replace(scenario, regions=RegionChoice.HISTORY), spot)
    assert history.finished_s == pytest.approx(2 * H)
    assert history.cost == pytest.approx(2.0)


def test_history_ranks_by_capacity_share_then_preemptions() -> None:
    records = [RegionRecord(observed_s=24 * H, available_s=6 * H, preemptions=1),
               RegionRecord(observed_s=24 * H, available_s=20 * H, preemptions=9),
               RegionRecord(observed_s=24 * H, available_s=20 * H, preemptions=2),
               RegionRecord(observed_s=0.0, available_s=0.0)]
    assert rank_regions(records) == [2, 1, 3, 0]  # unobserved: the prior's 0.5


def test_the_age_of_spots_return_is_seen_in_both_views_and_probes_chain_it() -> None:
    """Visible: the trace's age; production: since a probe found capacity, across probes that
    follow one another without a gap (their VMs saw it without a break)."""
    seen: list[PolicyView] = []

    def after_two_ticks(view: PolicyView) -> Capacity:
        seen.append(view)
        if not view.spot_available:
            return STANDARD
        young = view.current is STANDARD and view.spot_up_s is not None \
            and view.spot_up_s < 600.0
        return STANDARD if young else SPOT

    avail = [1, 0, 0] + [1] * 40  # preempted at step 1; Spot back from step 3
    base = dict(task_s=18 * 300, deadline_s=43 * 300, overhead_s=720, step_s=300)

    def ages() -> list[tuple[int, float | None, Capacity]]:
        first = {round(v.now_s / 300): v for v in reversed(seen)}  # the real call per step
        return [(step, v.spot_up_s, after_two_ticks(v)) for step, v in sorted(first.items())
                if v.current is STANDARD and v.spot_available]

    run_online(window(avail), Scenario(**base), after_two_ticks)  # type: ignore[arg-type]
    assert ages()[:3] == [(3, 0.0, STANDARD), (4, 300.0, STANDARD), (5, 600.0, SPOT)]
    seen.clear()
    probes = Probes(billed_s=300.0, latency_s=300.0, wait_s=600.0)
    # (The minimum dwell would hold the first probe back: tests/test_trust.py measures it.)
    out = run_online(window(avail), Scenario(**base, view=View.PRODUCTION,  # type: ignore[arg-type]
                                             spot_cooldown_s=0.0, probes=probes,
                                             min_dwell=False),
                     after_two_ticks)
    # A probe at step 2 finds capacity at 3 (answer at 4: 300 s old); the next, launched at 4,
    # finds it at once and answers at 5: 600 s since the first found it.
    assert ages()[:2] == [(4, 300.0, STANDARD), (5, 600.0, SPOT)]
    assert out.probes == 2 and out.probe_cost == pytest.approx(2 * 300 / 3600)


def test_the_age_of_an_outage_is_seen_in_the_visible_view_only() -> None:
    """spot_down_s: how long the trace has shown Spot gone; production never learns it."""
    seen: list[PolicyView] = []

    def record(view: PolicyView) -> Capacity:
        seen.append(view)
        return SPOT

    avail = [1, 1, 0, 0, 0] + [1] * 30  # Spot gone at steps 2-4
    base = dict(task_s=10 * 300, deadline_s=35 * 300, overhead_s=300, step_s=300)
    run_online(window(avail), Scenario(**base), record)  # type: ignore[arg-type]
    by_step = {round(v.now_s / 300): v.spot_down_s for v in seen}
    assert [by_step[s] for s in range(6)] == [None, None, 0.0, 300.0, 600.0, None]
    seen.clear()
    run_online(window(avail), Scenario(**base, view=View.PRODUCTION), record)  # type: ignore[arg-type]
    assert seen and all(v.spot_down_s is None for v in seen)
