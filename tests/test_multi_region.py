"""Multi-region Spot (issue 43): the priced move, the multi-region optimum against brute force and
the single-region optimum, the replay's policies, the command line, and production's next region
chosen by the function the simulator's policy calls."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from spotorch.core.context import Context
from spotorch.core.cost import hourly_rate, ledger
from spotorch.core.escalation import policy_view
from spotorch.core.model import Attempt, AttemptState, FailureClass, Probe, Run, RunStatus
from spotorch.core.pipeline import (
    Capacity,
    EscalationKind,
    JobTemplate,
    Pipeline,
    RecoveryPolicy,
    Trigger,
    WorkerPool,
)
from spotorch.core.policy import PolicyView, RegionRecord, choose_capacity
from spotorch.core.region_moves import (
    checkpoint_region,
    hop_elsewhere,
    next_region,
    spot_estimates,
)
from spotorch.core.regions import (
    MovePrices,
    SpotEstimate,
    SpotPick,
    choose_spot_region,
    egress_per_gb,
    region_of,
)
from spotorch.sim.model import Scenario, View, Window
from spotorch.sim.multi_region import (
    Decision,
    MultiWindow,
    SpotorchMulti,
    multi_policies,
    run_multi,
    with_record,
)
from spotorch.sim.optimal import optimal
from spotorch.sim.optimal_multi import Zones, brute_force_multi, optimal_multi, zone_prices
from spotorch.sim.simulate import simulate

TRACES = Path(__file__).resolve().parents[1] / "shared" / "spotorch" / "sim" / "traces"
NINE = TRACES / "availability" / "1-node" / "aws-02-15-2023"


def test_regions_and_egress() -> None:
    assert region_of("us-east-1a") == "us-east-1"
    assert region_of("us-central1-a") == "us-central1"
    assert region_of("us-central1") == "us-central1"
    assert egress_per_gb("us-east-1a", "us-east-1c") == 0.0
    assert egress_per_gb("us-east-1", "us-west-2") == 0.02
    assert egress_per_gb("us-east1", "europe-west4") == 0.08
    move = MovePrices(checkpoint_gb=50, data_gb=10, data_region="us-east-1", bandwidth_gbps=8.0)
    # Within the region nothing moves; across, 50 GB at $0.02 and 50 s, rounded up to a minute.
    assert move.cost("us-east-1", "us-east-1c") == 0.0
    assert move.cost("us-east-1", "us-west-2a") == pytest.approx(60 * 0.02)
    assert move.seconds("us-east-1", "us-west-2") == 60.0
    assert move.cost(None, "us-west-2") == pytest.approx(10 * 0.02)  # no checkpoint yet: data only


SMALL = Scenario(task_s=1500, deadline_s=2400, overhead_s=180, step_s=300)
SMALL_ZONES = Zones(("us-east-1a", "us-west-2a", "us-west-2b"), (1.0, 0.5, 0.6), (3.0, 2.5, 2.5),
                    MovePrices(checkpoint_gb=10, data_gb=5, data_region="us-east-1",
                               bandwidth_gbps=8 * 10 / 240, egress_per_gb=0.05))


@pytest.mark.parametrize("seed", range(3))
def test_optimum_equals_brute_force(seed: int) -> None:
    rng = np.random.default_rng(seed)
    avail = rng.random((12, 3, SMALL.steps)) < 0.45
    found = optimal_multi(avail, SMALL, SMALL_ZONES)
    for k in range(len(avail)):
        assert found[k].cost == pytest.approx(brute_force_multi(avail[k], SMALL, SMALL_ZONES))


def test_optimum_pays_for_a_move_only_when_it_is_worth_it() -> None:
    # Spot only in the far region: the optimum either moves (egress + transfer) or buys standard.
    avail = np.zeros((1, 3, SMALL.steps), dtype=bool)
    avail[0, 1, :] = True
    cheap = optimal_multi(avail, SMALL, SMALL_ZONES)[0].cost
    dear = replace(SMALL_ZONES, move=replace(SMALL_ZONES.move, egress_per_gb=100.0))
    assert optimal_multi(avail, SMALL, dear)[0].cost == pytest.approx(
        brute_force_multi(avail[0], SMALL, dear))
    standard_home = (SMALL.overhead_s + SMALL.task_s) / 3600 * 3.0
    assert cheap < standard_home  # a move to cheap Spot pays
    assert optimal_multi(avail, SMALL, dear)[0].cost == pytest.approx(
        min(standard_home, (SMALL.overhead_s + SMALL.task_s) / 3600 * 2.5 + 5 * 100.0))


def test_optimum_with_one_zone_is_the_single_region_optimum() -> None:
    scenario = Scenario(task_s=6 * 3600, deadline_s=9 * 3600, overhead_s=720, step_s=300)
    rng = np.random.default_rng(7)
    avail = np.repeat(rng.random((8, 1, scenario.steps // 6)) < 0.6, 6, axis=2)
    windows = [Window("t", "f", 0.0, avail[k, 0], np.ones(scenario.steps), 3.0)
               for k in range(len(avail))]
    single = optimal(windows, scenario)
    multi = optimal_multi(avail, scenario, zone_prices(["us-east-1a"], 1.0, 3.0))
    for s, m in zip(single, multi, strict=True):
        assert m.cost == pytest.approx(s.cost)
        assert m.finished_s == pytest.approx(s.finished_s)


def _window(avail: np.ndarray) -> MultiWindow:
    return MultiWindow("f", 0.0, avail, np.zeros((avail.shape[0], 0), dtype=bool))


@pytest.mark.parametrize("view", list(View))
def test_online_policies_meet_the_deadline_and_cost_no_less_than_the_optimum(view: View) -> None:
    scenario = Scenario(task_s=4 * 3600, deadline_s=6 * 3600, overhead_s=600, step_s=300,
                        view=view)
    zones = zone_prices(["us-east-1a", "us-east-1b", "us-west-2a"], 1.0, 3.0,
                        MovePrices(checkpoint_gb=50, data_region="us-east-1"))
    rng = np.random.default_rng(3)
    avail = np.repeat(rng.random((6, 3, scenario.steps // 6)) < 0.5, 6, axis=2)
    best = optimal_multi(avail, scenario, zones)
    for k in range(len(avail)):
        for policy in multi_policies().values():
            out = run_multi(_window(avail[k]), scenario, zones, policy)
            assert out.met_deadline, policy.name
            assert out.cost >= best[k].cost - 1e-9, policy.name


def test_the_replay_charges_egress_for_a_move() -> None:
    # Spot only in us-west-2 from the start: spotorch moves there and pays 50 GB of egress once
    # (the data is read where it is: no charge for it).
    scenario = Scenario(task_s=2 * 3600, deadline_s=4 * 3600, overhead_s=600, step_s=300,
                        view=View.VISIBLE)
    zones = zone_prices(["us-east-1a", "us-west-2a"], 1.0, 3.0,
                        MovePrices(checkpoint_gb=50, data_region="us-east-1"))
    avail = np.zeros((2, scenario.steps), dtype=bool)
    avail[0, :6] = True  # home Spot for half an hour, then gone
    avail[1, :] = True
    out = run_multi(_window(avail), scenario, zones, SpotorchMulti())
    assert out.met_deadline
    assert out.moves == 1
    assert out.egress_cost == pytest.approx(50 * 0.02)


def test_simulate_multi_region_json() -> None:
    result = CliRunner().invoke(simulate, [
        "--multi-region", str(NINE), "--task-hours", "8", "--deadline-hours", "10",
        "--restart-overhead-hours", "0.2", "--window-stride-hours", "240", "--view", "visible",
        "--checkpoint-gb", "50", "--json"])
    assert result.exit_code == 0, result.output
    payload = json.loads(result.output)
    assert len(payload["zones"]) == 9 and payload["data_region"] == "us-east-1"
    for name in ("optimal", "uniform_progress", "deadline", "single_region"):
        summary = payload["policies"][name]
        assert summary["deadline_met_fraction"] == 1.0
        assert summary["mean_cost_ratio_to_optimal"] >= 1.0 - 1e-9
    assert payload["policies"]["optimal"]["mean_cost_ratio_to_optimal"] == 1.0


def test_simulate_multi_region_refuses_bad_input(tmp_path: Path) -> None:
    result = CliRunner().invoke(simulate, ["--multi-region", "--task-hours", "8",
                                           "--deadline-hours", "10"])
    assert result.exit_code == 2 and "needs the zones' traces" in result.output
    table = tmp_path / "prices.json"
    table.write_text('{"us-east-1": {"spot": -1}}')
    result = CliRunner().invoke(simulate, ["--multi-region", str(NINE), "--region-prices",
                                           str(table), "--task-hours", "8",
                                           "--deadline-hours", "10"])
    assert result.exit_code == 2 and "must map a region or zone" in result.output


# ---- production: the same function picks the next region

REGIONS = ("us-central1", "us-east1", "us-west1")


def _pipeline(checkpoint_gb: float) -> Pipeline:
    pool = WorkerPool(machine_type="n1-standard-8", image_uri="img",
                      accelerator_type="NVIDIA_TESLA_V100", accelerator_count=1)
    return Pipeline(name="p", trigger=Trigger(bucket="b"), checkpoint_uri="gs://c/p",
                    output_uri="gs://m/p", job=JobTemplate(worker_pools=(pool,), regions=REGIONS),
                    recovery=RecoveryPolicy(escalation=EscalationKind.DEADLINE,
                                            checkpoint_gb=checkpoint_gb,
                                            expected_compute_s=10 * 3600.0))


def _run(attempts: tuple[Attempt, ...], now: float) -> Run:
    return Run(run_id="r1", pipeline="p", status=RunStatus.RUNNING, created_at=0.0,
               data_uri="gs://d", checkpoint_uri="gs://c/p", output_uri="gs://m/p",
               attempts=attempts, deadline_at=now + 20 * 3600.0)


def test_production_next_region_is_the_simulators_choice() -> None:
    pipeline = _pipeline(50.0)
    now = 12 * 3600.0
    # A long Spot run in us-east1 (then cancelled), two preemptions in us-central1 long ago.
    attempts = (
        Attempt(number=1, capacity=Capacity.SPOT, region="us-central1", created_at=0.0,
                started_at=10.0, ended_at=600.0, failure=FailureClass.PREEMPTED,
                state=AttemptState.FAILED),
        Attempt(number=2, capacity=Capacity.SPOT, region="us-central1", created_at=700.0,
                started_at=710.0, ended_at=1300.0, failure=FailureClass.PREEMPTED,
                state=AttemptState.FAILED),
        Attempt(number=3, capacity=Capacity.SPOT, region="us-east1", created_at=1400.0,
                started_at=1410.0, ended_at=9 * 3600.0, state=AttemptState.CANCELLED),
    )
    run = _run(attempts, now)
    ctx = Context(pipeline=pipeline, now=now)
    chosen = next_region(run, ctx, Capacity.SPOT)
    # The simulator's spotorch policy, given the same estimates and checkpoint, picks the same.
    estimates = spot_estimates(run, REGIONS, now)
    assert checkpoint_region(run) == "us-east1"
    zones = Zones(REGIONS, (1.2225,) * 3, (2.86,) * 3, MovePrices(checkpoint_gb=50))
    view = PolicyView(now_s=now, deadline_s=now + 20 * 3600.0, work_total_s=10 * 3600.0,
                      work_done_s=0.0, restart_overhead_s=pipeline.recovery.restart_overhead_s,
                      current=None, spot_available=True, preemptions=2)
    sim = SpotorchMulti()._pick(Decision(view, estimates, None, "us-east1", (), zones, False))
    assert sim is not None
    assert REGIONS[sim[0]] == "us-east1" == chosen  # the long-lived region, the checkpoint's
    direct = choose_spot_region(estimates, checkpoint_region="us-east1",
                                prices=MovePrices(checkpoint_gb=50),
                                spot_per_h=dict.fromkeys(REGIONS, 1.0), standard_per_h=3.0,
                                work_left_s=10 * 3600.0, overhead_s=600.0)
    assert direct is not None and direct.location == "us-east1"


def test_a_move_pays_only_when_the_saving_beats_the_egress() -> None:
    here = SpotEstimate("us-east1", tries=1, found=1, run_s=3600.0, preemptions=1, seen=True)
    there = SpotEstimate("us-west1", tries=1, found=1, run_s=4 * 3600.0, preemptions=1, seen=True)
    def pick(prices: MovePrices) -> SpotPick | None:
        return choose_spot_region((here, there), checkpoint_region="us-east1", prices=prices,
                                  spot_per_h={"us-east1": 1.0, "us-west1": 1.0},
                                  standard_per_h=3.0, work_left_s=40 * 3600.0, overhead_s=600.0)

    cheap = pick(MovePrices(checkpoint_gb=50))
    dear = pick(MovePrices(checkpoint_gb=50, egress_per_gb=1.0))
    assert cheap is not None and cheap.location == "us-west1" and cheap.move_cost == 1.0
    assert dear is not None and dear.location == "us-east1" and dear.move_cost == 0.0


def test_the_ledger_charges_egress_for_a_move() -> None:
    pipeline = _pipeline(50.0)
    attempts = (
        Attempt(number=1, capacity=Capacity.SPOT, region="us-central1", created_at=0.0,
                started_at=10.0, ended_at=3600.0, failure=FailureClass.PREEMPTED,
                state=AttemptState.FAILED),
        Attempt(number=2, capacity=Capacity.SPOT, region="us-east1", created_at=3700.0,
                state=AttemptState.CANCELLED),  # never started: nothing copied
        Attempt(number=3, capacity=Capacity.SPOT, region="us-west1", created_at=3800.0,
                started_at=3900.0, ended_at=7200.0, state=AttemptState.CANCELLED),
    )
    book = ledger(_run(attempts, 7200.0), pipeline, 7200.0)
    without = ledger(_run(attempts, 7200.0), _pipeline(0.0), 7200.0)
    assert book.moves == 1
    assert book.egress_cost == pytest.approx(50 * 0.02)
    assert book.total == pytest.approx(without.total + 1.0)
    assert "1 move between regions" in book.sentence()


def test_a_queued_attempt_hops_where_the_simulator_would_send_it() -> None:
    # A tight deadline: the deadline policy would leave a queued Spot attempt for standard. A
    # probe found Spot in us-east1 before: production cancels the queue as a stockout and the
    # simulator's policy moves there, through the same choose_spot_region.
    pipeline = _pipeline(50.0)
    now = 3 * 3600.0
    queued = Attempt(number=2, capacity=Capacity.SPOT, region="us-central1",
                     created_at=now - 240.0, queued_since=now - 240.0, state=AttemptState.QUEUED)
    attempts = (
        Attempt(number=1, capacity=Capacity.SPOT, region="us-central1", created_at=0.0,
                started_at=10.0, ended_at=now - 300.0, failure=FailureClass.PREEMPTED,
                state=AttemptState.FAILED),
        queued,
    )
    probe = Probe(number=1, region="us-east1", created_at=600.0, started_at=700.0,
                  ended_at=800.0, found=True, state=AttemptState.CANCELLED)
    run = replace(_run(attempts, now), probes=(probe,), deadline_at=now + 11.5 * 3600.0)
    ctx = Context(pipeline=pipeline, now=now)
    view = policy_view(run, ctx, current=Capacity.SPOT, spot_available=False)
    assert choose_capacity(view, pipeline.recovery) is Capacity.STANDARD  # alone, it would leave
    assert hop_elsewhere(run, ctx, queued, view)
    estimates = spot_estimates(run, REGIONS, now)
    spot = hourly_rate(pipeline, Capacity.SPOT, "us-central1").per_hour or 0.0
    standard = hourly_rate(pipeline, Capacity.STANDARD, "us-central1").per_hour or 0.0
    zones = Zones(REGIONS, (spot,) * 3, (standard,) * 3, MovePrices(checkpoint_gb=50))
    view = replace(view, spot_queued=True)  # the simulator's view of a queued attempt
    choice = SpotorchMulti().decide(Decision(view, estimates, 0, "us-central1", run.avoid_regions,
                                             zones, False))
    assert choice.capacity is Capacity.SPOT and REGIONS[choice.zone] == "us-east1"
    # Without the probe's evidence (Spot no likelier than a coin there), neither hops.
    blind = replace(run, probes=())
    assert not hop_elsewhere(blind, ctx, queued, view)
    choice = SpotorchMulti().decide(Decision(view, spot_estimates(blind, REGIONS, now), 0,
                                             "us-central1", (), zones, False))
    assert choice.capacity is Capacity.STANDARD


def test_the_shared_record_is_the_prior_in_production_and_in_the_simulator() -> None:
    # A fresh run: nothing of its own seen yet. The record says us-east1 had Spot most of the
    # day in long runs, us-central1 (first in the pipeline's order) seldom and briefly.
    pipeline = _pipeline(50.0)
    records = {"us-central1": RegionRecord(observed_s=86400.0, available_s=0.2 * 86400.0,
                                           preemptions=30),
               "us-east1": RegionRecord(observed_s=86400.0, available_s=0.9 * 86400.0,
                                        preemptions=2),
               "us-west1": RegionRecord(observed_s=0.0, available_s=0.0)}
    run = _run((), 0.0)
    flat = Context(pipeline=pipeline, now=0.0)
    assert next_region(run, flat, Capacity.SPOT) == "us-central1"  # flat priors: the order
    ctx = Context(pipeline=pipeline, now=0.0, region_records=records)
    assert next_region(run, ctx, Capacity.SPOT) == "us-east1"
    estimates = with_record(spot_estimates(run, REGIONS, 0.0), [records[r] for r in REGIONS])
    assert estimates == spot_estimates(run, REGIONS, 0.0, records)
    zones = Zones(REGIONS, (1.2225,) * 3, (2.86,) * 3, MovePrices(checkpoint_gb=50))
    view = PolicyView(now_s=0.0, deadline_s=20 * 3600.0, work_total_s=10 * 3600.0,
                      work_done_s=0.0, restart_overhead_s=600.0, current=None,
                      spot_available=True, preemptions=0)
    sim = SpotorchMulti()._pick(Decision(view, estimates, None, None, (), zones, False))
    assert sim is not None and REGIONS[sim[0]] == "us-east1"
