"""The cost ledger: billed time x price per attempt, savings against standard, redone work."""

from __future__ import annotations

from dataclasses import replace

import pytest

from operator_runs import PIPELINE, deps_for, preempted_twice_then_standard, running_run
from spotorch.core.cost import PRICES, hourly_rate, ledger, ledger_dict
from spotorch.core.model import Attempt, AttemptState, Run, RunStatus
from spotorch.core.pipeline import Capacity, JobTemplate, WorkerPool

SPOT, STANDARD = 0.04, 0.19  # n1-standard-4 per hour in PRICES


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
    assert book.sentence() == ("$0.07 spent; saved $0.03 (28%) against standard VMs; "
                               "2 preemptions cost $0.0017 of redone work (30 steps)")


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
    assert book.savings_pct == pytest.approx((STANDARD - SPOT) / STANDARD * 100)


def test_accelerators_and_replicas_multiply() -> None:
    pool = WorkerPool(machine_type="n1-standard-4", accelerator_type="NVIDIA_TESLA_A100",
                      accelerator_count=8, replica_count=2)
    pipeline = replace(PIPELINE, job=JobTemplate(worker_pools=(pool,)))
    rate = hourly_rate(pipeline, Capacity.SPOT, "us-central1")
    assert rate.per_hour == pytest.approx(2 * (0.04 + 8 * 1.147))
    assert any("NVIDIA_TESLA_A100" in b and "2026-11-30" in b for b in rate.basis)


def test_a_pipeline_price_override_wins_and_is_named() -> None:
    pipeline = replace(PIPELINE, prices=(("spot", 1.5), ("standard", 4.0)))
    rate = hourly_rate(pipeline, Capacity.SPOT, "us-central1")
    assert rate.per_hour == 1.5 and rate.basis == ("pipeline ops prices",)
    assert hourly_rate(pipeline, Capacity.FLEX_START, "us-central1").per_hour == \
        PRICES.machines["n1-standard-4"]["*"].per_hour[Capacity.FLEX_START]


def test_unknown_machines_and_pipelines_say_how_they_were_priced() -> None:
    pipeline = replace(PIPELINE, job=JobTemplate(worker_pools=(WorkerPool(machine_type="zz-9"),)))
    assert "no price for machine zz-9: priced as n1-standard-4" in \
        hourly_rate(pipeline, Capacity.SPOT, "us-central1").basis
    assert "pipeline unknown" in hourly_rate(None, Capacity.SPOT, "x").basis[0]


def test_every_price_entry_names_a_source_and_an_iso_date() -> None:
    from datetime import date

    entries = [p for table in (PRICES.machines, PRICES.accelerators)
               for by_region in table.values() for p in by_region.values()]
    assert entries
    for entry in entries:
        assert entry.source and date.fromisoformat(entry.as_of)
        assert set(entry.per_hour) == set(Capacity)
        assert entry.per_hour[Capacity.SPOT] < entry.per_hour[Capacity.STANDARD]


def test_ledger_json_rounds_and_carries_the_sentence() -> None:
    deps = deps_for()
    data = ledger_dict(ledger(preempted_twice_then_standard(deps), PIPELINE, deps.clock.now()))
    assert data["savings_pct"] == 27.8 and data["lost_steps"] == 30
    assert [a["capacity"] for a in data["attempts"]] == ["spot", "spot", "standard"]
    assert str(data["summary"]).startswith("$0.07 spent")
