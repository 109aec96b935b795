"""The trace simulator: resampling, replay semantics, the offline optimum and the CLI."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from spotorch.core.pipeline import Capacity
from spotorch.core.policy import PolicyView, always_spot, always_standard, deadline_policy
from spotorch.sim.replay import VIEW_FIELDS, fast_view
from spotorch.sim.simulate import (
    POLICIES,
    TRACES_ENV,
    Scenario,
    ScenarioError,
    Trace,
    View,
    Window,
    brute_force,
    evaluate,
    load_trace,
    main,
    optimal,
    optimal_at,
    resample,
    run_online,
    run_standard,
    windows_of,
)

H = 3600


def window(avail: list[int], prices: list[float] | None = None, od: float = 3.0) -> Window:
    n = len(avail)
    return Window("t.json", "fam", 0.0, np.array(avail, dtype=bool),
                  np.array(prices if prices is not None else [1.0] * n), od)


def random_case(rng: np.random.Generator) -> tuple[Window, Scenario] | None:
    step = int(rng.choice([60, 120, 300]))
    overhead = int(rng.choice([0, 60, 120, 180, 300, 360, 600]))
    n = int(rng.integers(2, 9))
    unit = int(np.gcd(step, overhead)) or step
    task = int(rng.integers(1, n * step // unit + 1)) * unit
    if task + overhead > n * step:
        return None
    scenario = Scenario(task_s=task, deadline_s=n * step, overhead_s=overhead, step_s=step)
    avail = rng.random(n) < rng.random()
    prices = rng.choice([0.5, 0.9, 1.0, 1.5], size=n)
    return Window("t", "f", 0.0, avail, prices, float(rng.choice([1.2, 2.0, 3.0]))), scenario


def test_optimal_equals_brute_force_on_small_traces() -> None:
    """Every sequence of idle/Spot/standard per step, against the DP, on random tiny cases."""
    rng = np.random.default_rng(2024)
    checked = 0
    while checked < 150:
        case = random_case(rng)
        if case is None:
            continue
        win, scenario = case
        assert optimal([win], scenario)[0].cost == pytest.approx(brute_force(win, scenario))
        checked += 1


def test_optimal_batches_windows_independently() -> None:
    rng = np.random.default_rng(7)
    scenario = Scenario(task_s=1800, deadline_s=3000, overhead_s=360, step_s=300)
    wins = [Window("t", "f", 0.0, rng.random(10) < 0.6, rng.uniform(0.5, 1.5, 10), 3.0)
            for _ in range(12)]
    batched = optimal(wins, scenario)
    for win, together in zip(wins, batched, strict=True):
        alone = optimal([win], scenario)[0]
        assert together == alone


def test_one_dp_gives_the_optimum_at_every_shorter_deadline() -> None:
    """optimal_at on the longest windows equals optimal on each deadline's own prefixes."""
    rng = np.random.default_rng(5)
    longest = Scenario(task_s=1800, deadline_s=20 * 300, overhead_s=360, step_s=300)
    wins = [Window("t", "f", 0.0, rng.random(20) < p, rng.uniform(0.5, 1.5, 20), 3.0)
            for p in np.linspace(0.0, 1.0, 9)]
    deadlines = [2400.0, 3300.0, 4500.0, 6000.0]
    together = optimal_at(wins, longest, deadlines)
    for deadline in deadlines:
        short = Scenario(task_s=1800, deadline_s=deadline, overhead_s=360, step_s=300)
        steps = short.steps
        prefixes = [Window("t", "f", 0.0, w.avail[:steps], w.spot_price[:steps], 3.0)
                    for w in wins]
        assert together[deadline] == optimal(prefixes, short)  # exactly, statistics included
    # Less slack never costs less, and here it costs more somewhere: the cells differ.
    costs = np.array([[o.cost for o in together[d]] for d in deadlines])
    assert (np.diff(costs, axis=0) <= 1e-12).all() and (costs[0] > costs[-1]).any()
    with pytest.raises(ScenarioError):
        optimal_at(wins, longest, [6300.0])


def test_fast_view_builds_the_same_view_as_the_constructor() -> None:
    seen: list[PolicyView] = []

    def record(v: PolicyView) -> Capacity:
        seen.append(v)
        return deadline_policy(v)

    scenario = Scenario(task_s=6 * 300, deadline_s=14 * 300, overhead_s=600, step_s=300)
    run_online(window([1, 1, 0, 0, 1, 1, 1, 0, 1, 1, 1, 1, 1, 1]), scenario, record)
    assert seen and all(set(vars(v)) == VIEW_FIELDS for v in seen)  # every field, no other
    assert all(PolicyView(**vars(v)) == v for v in seen)
    fields = dict(vars(seen[0]))
    assert fast_view(fields) == PolicyView(**fields)


def test_optimal_is_a_lower_bound_for_every_policy() -> None:
    rng = np.random.default_rng(11)
    scenario = Scenario(task_s=6 * 300, deadline_s=14 * 300, overhead_s=600, step_s=300)
    wins = [Window("t", "f", 0.0, rng.random(14) < p, np.ones(14), 3.0)
            for p in np.linspace(0.0, 1.0, 15)]
    for record in evaluate(wins, scenario):
        best = record.outcomes["optimal"].cost
        for name, outcome in record.outcomes.items():
            assert outcome.cost >= best - 1e-9, name


def test_optimal_reports_its_path_statistics() -> None:
    # Spot for 2 steps, preempted, 1 step down, then up again: 4 steps of work, 1 h step.
    scenario = Scenario(task_s=4 * H, deadline_s=5 * H, overhead_s=0, step_s=H)
    best = optimal([window([1, 1, 0, 1, 1])], scenario)[0]
    assert best.cost == pytest.approx(4.0)
    assert (best.finished_s, best.preemptions, best.changeovers) == (5 * H, 1, 0)
    forced = optimal([window([1, 1, 0, 1])], Scenario(task_s=4 * H, deadline_s=4 * H,
                                                      overhead_s=0, step_s=H))[0]
    assert forced.cost == pytest.approx(1 + 1 + 3 + 1)
    assert (forced.preemptions, forced.changeovers) == (1, 2)


def test_run_online_charges_overheads_and_counts_events() -> None:
    scenario = Scenario(task_s=2 * H, deadline_s=6 * H, overhead_s=H // 2, step_s=H // 2)
    # Spot: launch (0.5 h overhead), 0.5 h work, preempted, wait, relaunch, 1.5 h of work.
    out = run_online(window([1, 1, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1]), scenario, always_spot)
    assert out.preemptions == 1 and out.changeovers == 0
    assert out.finished_s == pytest.approx(3.5 * H)
    assert out.cost == pytest.approx(6 * 0.5 * 1.0)  # six half-hour Spot steps at 1.0 / h
    assert run_online(window([0] * 12), scenario, always_standard) == \
        run_standard(window([0] * 12), scenario)


def test_a_missed_deadline_is_charged_as_finished_on_standard() -> None:
    scenario = Scenario(task_s=2 * H, deadline_s=4 * H, overhead_s=0, step_s=H)
    out = run_online(window([1, 0, 0, 0]), scenario, always_spot)
    assert not out.met_deadline
    assert out.cost == pytest.approx(1.0 + 3.0 * 1.0)


def test_checkpoint_interval_loses_work_on_preemption_only() -> None:
    plain = Scenario(task_s=3 * H, deadline_s=8 * H, overhead_s=0, step_s=H)
    lossy = Scenario(task_s=3 * H, deadline_s=8 * H, overhead_s=0, step_s=H, checkpoint_s=2 * H)
    trace = window([1, 0, 1, 1, 1, 1, 1, 1])
    assert run_online(trace, plain, always_spot).finished_s == 4 * H
    # The hour before the preemption was never checkpointed: three more hours after it.
    assert run_online(trace, lossy, always_spot).finished_s == 5 * H

    def spot_then_standard(v: PolicyView) -> Capacity:
        return Capacity.SPOT if v.now_s < H else Capacity.STANDARD

    # A requested switch checkpoints first, so nothing is lost.
    assert run_online(window([1] * 8), lossy, spot_then_standard).finished_s == 3 * H


def test_resample_takes_the_worst_of_a_step_and_the_mean_price() -> None:
    trace = Trace("x.json", "fam", 100, np.array([1, 1, 0, 1, 1, 1, 4, 4, 3]),
                  np.array([1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0]))
    avail, price = resample(trace, 300, 1)  # three samples per step
    assert avail.tolist() == [False, True, True]
    assert price.tolist() == pytest.approx([2.0, 5.0, 8.0])
    avail, _ = resample(trace, 150, 4)  # steps straddle samples; four nodes needed
    assert avail.tolist() == [False, False, False, False, True, False]


def test_windows_slide_and_price_on_demand_from_the_trace(tmp_path: Path) -> None:
    path = tmp_path / "fam" / "z.json"
    path.parent.mkdir()
    path.write_text(json.dumps({"metadata": {"gap_seconds": 600}, "data": [1] * 36,
                                "prices": [0.5] * 36}))
    trace = load_trace(path, tmp_path)
    assert (trace.name, trace.family, trace.hours) == ("fam/z.json", "fam", 6.0)
    scenario = Scenario(task_s=2 * H, deadline_s=3 * H, overhead_s=600, step_s=600)
    wins = windows_of(trace, scenario, stride_s=H)
    assert [w.start_s for w in wins] == [0.0, H, 2 * H, 3 * H]
    assert all(w.od_price == pytest.approx(1.5) for w in wins)
    assert len(windows_of(trace, scenario, stride_s=None)) == 1


def test_scenario_rejects_what_it_cannot_simulate() -> None:
    with pytest.raises(ScenarioError):
        Scenario(task_s=10 * H, deadline_s=10 * H, overhead_s=600, step_s=300)
    with pytest.raises(ScenarioError):
        Scenario(task_s=H, deadline_s=2 * H + 1, overhead_s=600, step_s=300)


def write_traces(root: Path) -> None:
    rng = np.random.default_rng(3)
    for family, n in (("availability/1-node/a", 1), ("preemption/4-node/b", 4)):
        folder = root / family
        folder.mkdir(parents=True)
        for k in range(2):
            data = rng.integers(0, n + 1, size=200).tolist()
            payload: dict[str, object] = {"metadata": {"gap_seconds": 300}, "data": data}
            if k:
                payload["prices"] = rng.uniform(0.8, 1.2, size=200).round(3).tolist()
            (folder / f"z{k}.json").write_text(json.dumps(payload))


SMALL = ["--task-hours", "3", "--deadline-hours", "5", "--restart-overhead-hours", "0.1",
         "--tick-minutes", "6", "--window-stride-hours", "4"]


def test_json_output_shape(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_traces(tmp_path)
    assert main([str(tmp_path), *SMALL, "--json"]) == 0
    out = capsys.readouterr().out
    payload = json.loads(out)  # exactly one JSON document, nothing else
    assert set(payload) == {"runs", "view", "policies"}
    assert payload["view"] == "production"  # the default: what production can observe
    assert payload["runs"] == 4 * 3  # four traces of 16.7 h, windows of 5 h every 4 h
    assert set(payload["policies"]) == set(POLICIES)
    metrics = {"mean_cost", "p95_cost", "deadline_met_fraction", "mean_cost_ratio_to_optimal",
               "mean_preemptions", "mean_changeovers", "mean_probes", "mean_probe_cost"}
    for name, summary in payload["policies"].items():
        assert set(summary) == metrics, name
    assert payload["policies"]["optimal"]["mean_cost_ratio_to_optimal"] == pytest.approx(1.0)
    assert payload["policies"]["deadline"]["deadline_met_fraction"] == 1.0
    assert payload["policies"]["standard"]["mean_cost_ratio_to_optimal"] >= 1.0


def test_traces_default_to_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    write_traces(tmp_path)
    monkeypatch.setenv(TRACES_ENV, str(tmp_path / "availability"))
    assert main([*SMALL, "--json", "--nodes", "1", "--policies", "deadline,optimal"]) == 0
    payload = json.loads(capsys.readouterr().out)
    assert payload["runs"] == 2 * 3
    assert set(payload["policies"]) == {"deadline", "optimal"}


def test_plot_and_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_traces(tmp_path)
    png = tmp_path / "cost.png"
    assert main([str(tmp_path), *SMALL, "--plot", str(png),
                 "--plot-deadline-hours", "4", "--plot-deadline-hours", "5"]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    assert main([str(bad), *SMALL]) == 2
    assert main([str(tmp_path / "missing"), *SMALL]) == 2
    assert "spotorch simulate:" in capsys.readouterr().err


def test_runs_as_a_module(tmp_path: Path) -> None:
    write_traces(tmp_path)
    done = subprocess.run([sys.executable, "-m", "spotorch.sim.simulate", str(tmp_path), *SMALL,
                           "--json", "--policies", "standard,optimal"],
                          capture_output=True, text=True, check=True, timeout=60)
    assert json.loads(done.stdout)["runs"] == 12


def test_deadline_policy_is_the_production_dispatch() -> None:
    """The simulator's 'deadline' goes through choose_capacity, i.e. deadline_policy."""
    scenario = Scenario(task_s=2 * H, deadline_s=4 * H, overhead_s=600, step_s=600)
    win = window([1, 0, 0, 1, 1, 0, 1, 1, 1, 1, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1])
    (record,) = evaluate([win], scenario, ("deadline",))
    assert record.outcomes["deadline"] == run_online(win, scenario, deadline_policy)


def test_production_view_of_spot_while_on_standard() -> None:
    """With a cooldown, standard sees Spot only once the cooldown after the last outage ends."""
    seen_on_standard: list[bool] = []

    def back_to_spot_when_seen(v: PolicyView) -> Capacity:
        if v.current is Capacity.STANDARD:
            seen_on_standard.append(v.spot_available)
            return Capacity.SPOT if v.spot_available else Capacity.STANDARD
        return Capacity.SPOT if v.spot_available or v.current else Capacity.STANDARD

    trace = window([1, 0] + [1] * 10)  # preempted at 10 min, Spot back at once
    truthful = Scenario(task_s=3600, deadline_s=7200, overhead_s=0, step_s=600)
    production = Scenario(task_s=3600, deadline_s=7200, overhead_s=0, step_s=600,
                          view=View.PRODUCTION, spot_cooldown_s=1800)
    out = run_online(trace, truthful, back_to_spot_when_seen)
    assert seen_on_standard == [True] and out.changeovers == 2
    seen_on_standard.clear()
    out = run_online(trace, production, back_to_spot_when_seen)
    assert seen_on_standard == [False, False, True]  # at 20, 30 and 40 min
    assert out.changeovers == 2 and out.cost == pytest.approx((1 + 3 * 3 + 2) / 6)


def test_spot_history_comes_only_from_spot_attempts() -> None:
    """History fields count what Spot attempts saw; standard learns nothing, in both modes."""
    # Spot up 2 steps, preempted; queued 2 steps, runs 1; then standard for 3 steps while the
    # trace flips (unseen); then Spot again.
    trace = window([1, 1, 0, 0, 1, 0, 1, 0, 1, 1, 1, 1, 1, 1])
    plan = {5: Capacity.STANDARD, 6: Capacity.STANDARD, 7: Capacity.STANDARD}
    for cooldown in (None, 0.0):
        seen: list[PolicyView] = []

        def follow_plan(v: PolicyView, seen: list[PolicyView] = seen) -> Capacity:
            seen.append(v)
            return plan.get(len(seen) - 1, Capacity.SPOT)

        scenario = Scenario(task_s=8 * 600, deadline_s=14 * 600, overhead_s=0, step_s=600,
                            view=View.VISIBLE if cooldown is None else View.PRODUCTION,
                            spot_cooldown_s=cooldown or 0.0)
        run_online(trace, scenario, follow_plan)
        history = [(v.spot_run_s, v.spot_wait_s, v.spot_waits, v.preemptions, v.spot_down_at_s)
                   for v in seen]
        assert history[:9] == [
            (0, 0, 0, 0, None), (600, 0, 0, 0, None), (1200, 0, 0, 1, 1200),
            (1200, 600, 0, 1, 1800), (1200, 1200, 1, 1, 1800), (1800, 1200, 1, 2, 3000),
            (1800, 1200, 1, 2, 3000), (1800, 1200, 1, 2, 3000), (1800, 1200, 1, 2, 3000)]
        assert len(seen) == 10 and seen[9].spot_run_s == 2400
        assert [v.spot_assumed for v in seen[5:10]] == [False] + [cooldown is not None] * 3 \
            + [False]
