"""The cost ledger: billed time x price per attempt, savings against standard, redone work."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from operator_runs import PIPELINE, deps_for, preempted_twice_then_standard, running_run
from spotorch.core.cost import hourly_rate, ledger, ledger_dict
from spotorch.core.model import Attempt, AttemptState, Run, RunStatus
from spotorch.core.pipeline import Capacity, JobTemplate, PoolRole, WorkerPool
from spotorch.core.prices import FLEX_RATIO

# n1-standard-4 per hour at the shipped list prices (N1 unit rates x 4 vCPUs, 15 GiB)
SPOT = 4 * 0.011149 + 15 * 0.001494
STANDARD = 4 * 0.031611 + 15 * 0.004237


def test_the_story_run_is_priced_attempt_by_attempt() -> None:
    deps = deps_for()
    run = preempted_twice_then_standard(deps)
    book = ledger(run, PIPELINE, deps.clock.now())
    # Attempts 1 and 2 ran 1200 s on Spot, attempt 3 900 s on standard; queued time is free.
    assert [round(a.billed_s) for a in book.attempts] == [1200, 1200, 900]
    assert [a.per_hour for a in book.attempts] == [SPOT, SPOT, STANDARD]
    assert book.total == pytest.approx((1200 * SPOT + 1200 * SPOT + 900 * STANDARD) / 3600)
    # Each attempt starts up for the 600 s restart overhead, then computes. Attempt 1 reached 110,
    # attempt 2 resumed at 100: 10 of its 110 steps redone; then 20 of 120.
    overhead = PIPELINE.recovery.restart_overhead_s
    assert [a.lost_steps for a in book.attempts] == [10, 20, 0]
    lost = (1200 - overhead) * SPOT / 3600 * 10 / 110 + (1200 - overhead) * SPOT / 3600 * 20 / 120
    assert book.lost_cost == pytest.approx(lost)
    useful_s = (1200 - overhead) * 100 / 110 + (1200 - overhead) * 100 / 120 + (900 - overhead)
    assert book.useful_s == pytest.approx(useful_s)
    standard = (useful_s + overhead) / 3600 * STANDARD
    assert book.standard_equivalent == pytest.approx(standard)
    assert book.savings == pytest.approx(standard - book.total)
    assert book.savings_pct == pytest.approx((standard - book.total) / standard * 100)
    assert book.preemptions == 2
    assert book.sentence() == ("$0.09 spent; saved $0.01 (10%) against standard VMs; "
                               "2 preemptions cost $0.0029 of redone work (30 steps)")


def test_a_live_attempt_is_billed_up_to_now_and_grows() -> None:
    deps = deps_for()
    run = running_run(deps)
    now = deps.clock.now()
    first = ledger(run, PIPELINE, now).total
    later = ledger(run, PIPELINE, now + 3600).total
    assert first == pytest.approx(300 * SPOT / 3600)
    assert later - first == pytest.approx(SPOT)


def test_an_attempt_that_never_started_costs_nothing() -> None:
    run = Run(run_id="r", pipeline="ops", status=RunStatus.STARTING, created_at=0.0,
              data_uri="gs://b/", checkpoint_uri="gs://c/", output_uri="gs://m/",
              attempts=(Attempt(1, Capacity.SPOT, "us-central1", AttemptState.QUEUED,
                                created_at=0.0, queued_since=0.0),))
    book = ledger(run, PIPELINE, 10_000.0)
    assert book.total == 0 and book.standard_equivalent == 0 and book.savings_pct is None
    assert book.sentence() == "nothing billed yet"


def test_a_short_attempt_is_all_start_up_and_compared_with_one_standard_start_up() -> None:
    deps = deps_for()
    run = running_run(deps)  # 300 s on Spot so far, less than the 600 s restart overhead
    book = ledger(run, PIPELINE, deps.clock.now())
    assert book.useful_s == 0
    assert book.standard_equivalent == pytest.approx(300 * STANDARD / 3600)
    assert book.savings is None and book.savings_pct is None  # no result yet: no savings claimed
    assert book.sentence() == ("$0.0056 spent so far; standard VMs would have cost $0.02 for the "
                               "same work")


def test_accelerators_and_replicas_multiply() -> None:
    pool = WorkerPool(machine_type="n1-standard-4", accelerator_type="NVIDIA_TESLA_A100",
                      accelerator_count=8, replica_count=2)
    pipeline = replace(PIPELINE, job=JobTemplate(worker_pools=(pool,)))
    rate = hourly_rate(pipeline, Capacity.SPOT, "us-central1")
    assert rate.per_hour == pytest.approx(2 * (SPOT + 8 * 1.147))
    assert any("NVIDIA_TESLA_A100" in b and "2026-12-01" in b for b in rate.basis)


def test_a_pipeline_price_override_wins_and_is_named() -> None:
    pipeline = replace(PIPELINE, prices=(("spot", 1.5), ("standard", 4.0)))
    rate = hourly_rate(pipeline, Capacity.SPOT, "us-central1")
    assert rate.per_hour == 1.5 and rate.basis == ("pipeline ops prices",)
    assert hourly_rate(pipeline, Capacity.FLEX_START, "us-central1").per_hour == \
        pytest.approx(STANDARD * FLEX_RATIO)


def test_an_unknown_machine_is_an_unknown_price_never_another_machine_s() -> None:
    pipeline = replace(PIPELINE, job=JobTemplate(worker_pools=(WorkerPool(machine_type="zz-9"),)))
    rate = hourly_rate(pipeline, Capacity.SPOT, "us-central1")
    assert rate.per_hour is None and rate.unknown == ("machine zz-9",)
    assert not any("n1-standard-4" in b for b in rate.basis)
    assert "pipeline unknown" in hourly_rate(None, Capacity.SPOT, "x").basis[0]


def test_an_unpriced_run_says_what_it_could_not_price_and_claims_no_savings() -> None:
    deps = deps_for()
    run = preempted_twice_then_standard(deps)
    odd = replace(PIPELINE, job=JobTemplate(worker_pools=(
        WorkerPool(machine_type="n1-standard-4", accelerator_type="NVIDIA_H200_141GB",
                   accelerator_count=1),)))
    book = ledger(run, odd, deps.clock.now())
    assert book.total == 0 and book.unpriced == ("accelerator NVIDIA_H200_141GB",)
    assert book.savings is None and "price unknown for accelerator NVIDIA_H200_141GB" \
        in book.sentence()


def test_g2_is_priced_as_g2_with_its_l4() -> None:
    pool = WorkerPool(machine_type="g2-standard-8", accelerator_type="NVIDIA_L4",
                      accelerator_count=1)
    pipeline = replace(PIPELINE, job=JobTemplate(worker_pools=(pool,)))
    rate = hourly_rate(pipeline, Capacity.STANDARD, "us-central1")
    # [C]'s g2-standard-8 in us-central1 is $0.853624 an hour with its L4.
    assert rate.per_hour == pytest.approx(0.853624, abs=1e-4)
    assert any(b.startswith("g2-standard-8 (8 vCPUs, 32 GiB at g2 rates)") for b in rate.basis)


def test_another_region_s_price_is_named_as_such() -> None:
    rate = hourly_rate(PIPELINE, Capacity.SPOT, "europe-west4")
    assert rate.per_hour == pytest.approx(SPOT)
    assert any("us-central1's price: none listed for europe-west4" in b for b in rate.basis)


def test_every_machine_in_the_machine_table_is_priced_or_named_unpriced() -> None:
    from spotorch.core.price_list import UNPRICED_ACCELERATORS, UNPRICED_MACHINES
    from spotorch.spec.catalog import load_catalog

    catalog = load_catalog({})
    for machine in sorted(catalog.machine_types):
        pipeline = replace(PIPELINE, job=JobTemplate(worker_pools=(WorkerPool(
            machine_type=machine),)))
        priced = hourly_rate(pipeline, Capacity.SPOT, "us-central1").per_hour is not None
        assert priced != any(machine.startswith(p) for p in UNPRICED_MACHINES), machine
    for accelerator in sorted(catalog.accelerator_regions):
        pool = WorkerPool(machine_type="n1-standard-4", accelerator_type=accelerator,
                          accelerator_count=1)
        pipeline = replace(PIPELINE, job=JobTemplate(worker_pools=(pool,)))
        rate = hourly_rate(pipeline, Capacity.SPOT, "us-central1" if "V4" not in accelerator
                           else "us-central2")
        assert (rate.per_hour is not None) != (accelerator in UNPRICED_ACCELERATORS), accelerator


def test_a_failed_run_states_what_standard_would_have_cost_and_no_savings() -> None:
    from operator_runs import failed_run

    deps = deps_for()
    book = ledger(failed_run(deps), PIPELINE, deps.clock.now())
    assert book.result == "no_result" and book.savings is None and book.total > 0
    assert book.sentence().endswith("for the same work (no result)")


def test_every_price_entry_names_a_source_and_an_iso_date() -> None:
    from datetime import date

    from spotorch.core.price_list import LIST_PRICES

    rates = [r for table in (LIST_PRICES.machines, LIST_PRICES.accelerators)
             for by_region in table.values() for r in by_region.values()]
    rates += [r for by_region in LIST_PRICES.families.values() for units in by_region.values()
              for r in (units.vcpu, units.gib)]
    assert rates
    for rate in rates:
        assert rate.source and date.fromisoformat(rate.as_of)
        assert rate.spot <= rate.standard


def test_ledger_json_rounds_and_carries_the_sentence() -> None:
    deps = deps_for()
    data = ledger_dict(ledger(preempted_twice_then_standard(deps), PIPELINE, deps.clock.now()))
    assert data["savings_pct"] == 10.2 and data["lost_steps"] == 30
    attempts = data["attempts"]
    assert isinstance(attempts, list)
    assert [a["capacity"] for a in attempts] == ["spot", "spot", "standard"]
    assert str(data["summary"]).startswith("$0.09 spent")


def test_an_alert_states_the_cost_once_as_the_ledger_says_it() -> None:
    from spotorch.core.alerts import render_alert

    deps = deps_for()
    data = ledger_dict(ledger(preempted_twice_then_standard(deps), PIPELINE, deps.clock.now()))
    event: dict[str, Any] = {"id": "r:9", "type": "dev.spotorch.run.succeeded.v1", "time": "t",
             "data": {"run_id": "r", "pipeline": "ops", "status": "SUCCEEDED",
                      "cost_estimate": data["total"], "cost": data}}
    facts = dict(render_alert(event).facts)
    assert facts["cost"] == data["summary"] and "cost_estimate" not in facts
    del event["data"]["cost"]  # an older event without the ledger still says what it cost
    assert "cost_estimate" in dict(render_alert(event).facts)


def test_the_ledger_breaks_each_attempt_down_per_pool_and_replica() -> None:
    deps = deps_for()
    run = preempted_twice_then_standard(deps)
    chief = WorkerPool(machine_type="n1-standard-4", accelerator_type="NVIDIA_TESLA_A100",
                       accelerator_count=1)
    workers = WorkerPool(machine_type="n1-standard-4", replica_count=3)
    evaluator = WorkerPool(machine_type="n1-standard-4", role=PoolRole.EVALUATOR)
    pipeline = replace(PIPELINE, job=JobTemplate(worker_pools=(chief, workers, evaluator)))
    rate = hourly_rate(pipeline, Capacity.SPOT, "us-central1")
    assert [(p.pool, p.role, p.replicas) for p in rate.pools] == \
        [(0, "chief", 1), (1, "workers", 3), (2, "evaluator", 1)]
    assert [p.per_hour for p in rate.pools] == pytest.approx(
        [SPOT + 1.147, 3 * SPOT, SPOT])
    assert sum(p.per_hour or 0 for p in rate.pools) == pytest.approx(rate.per_hour)
    book = ledger(run, pipeline, deps.clock.now())
    first = book.attempts[0]
    assert sum(c.cost for c in first.pools) == pytest.approx(first.cost)
    assert first.pools[1].per_replica == pytest.approx(first.pools[1].cost / 3)
    as_json: Any = ledger_dict(book)
    totals = {p["role"]: p for p in as_json["pools"]}
    assert set(totals) == {"chief", "workers", "evaluator"}
    assert sum(p["cost"] for p in as_json["pools"]) == pytest.approx(as_json["total"], abs=1e-3)
    assert totals["workers"]["replicas"] == 3
    assert as_json["attempts"][0]["pools"][0]["role"] == "chief"
    overridden = hourly_rate(replace(pipeline, prices=(("spot", 2.0),)), Capacity.SPOT, "x")
    assert [p.per_hour for p in overridden.pools] == [2.0, 6.0, 2.0]
