"""The one region rule (spotorch.core.regions): avoid where the run just stocked out or was
preempted, then the best ranked; production and the simulator apply the same function."""

from __future__ import annotations

import pytest

from fakes import fake_deps
from spotorch.adapters.memory.twins import InMemoryLauncher, ManualClock
from spotorch.app.deps import Deps
from spotorch.app.runs import start_run
from spotorch.app.spot_record import SpotRecord
from spotorch.app.tick import tick
from spotorch.core.model import FailureClass, JobPhase, Run
from spotorch.core.pipeline import (
    Capacity,
    EscalationKind,
    JobTemplate,
    Pipeline,
    RecoveryPolicy,
    Trigger,
    WorkerPool,
)
from spotorch.core.regions import AVOID_STOCKOUT, RegionMark, choose_region, mark

SPOT, STANDARD = Capacity.SPOT, Capacity.STANDARD
T0 = 1_800_000_000.0


# ---------------------------------------------------------------- the rule itself

def test_the_best_ranked_region_not_avoided_wins() -> None:
    marks = (RegionMark("a", SPOT, T0 + 100, AVOID_STOCKOUT),)
    assert choose_region(("a", "b", "c"), marks, SPOT, T0) == "b"
    assert choose_region(("c", "a", "b"), marks, SPOT, T0) == "c"
    assert choose_region(("a", "b", "c"), marks, SPOT, T0 + 100) == "a"  # the mark ended


def test_a_mark_is_per_capacity() -> None:
    marks = (RegionMark("a", SPOT, T0 + 100, AVOID_STOCKOUT),)
    assert choose_region(("a", "b"), marks, STANDARD, T0) == "a"


def test_a_probe_s_region_wins_unless_avoided() -> None:
    marks = (RegionMark("c", SPOT, T0 + 100, AVOID_STOCKOUT),)
    assert choose_region(("a", "b", "c"), marks, SPOT, T0, prefer="b") == "b"
    assert choose_region(("a", "b", "c"), marks, SPOT, T0, prefer="c") == "a"
    assert choose_region(("a", "b"), marks, SPOT, T0, prefer="elsewhere") == "a"


def test_with_every_region_avoided_the_mark_that_ends_first_wins() -> None:
    marks = (RegionMark("a", SPOT, T0 + 300, AVOID_STOCKOUT),
             RegionMark("b", SPOT, T0 + 100, AVOID_STOCKOUT),
             RegionMark("c", SPOT, T0 + 200, AVOID_STOCKOUT))
    assert choose_region(("a", "b", "c"), marks, SPOT, T0) == "b"


def test_marking_keeps_the_later_end_and_drops_expired_marks() -> None:
    marks = mark((), "a", SPOT, T0 + 100, AVOID_STOCKOUT, T0)
    marks = mark(marks, "a", SPOT, T0 + 50, AVOID_STOCKOUT, T0)
    assert marks == (RegionMark("a", SPOT, T0 + 100, AVOID_STOCKOUT),)
    marks = mark(marks, "b", SPOT, T0 + 500, AVOID_STOCKOUT, T0 + 200)
    assert marks == (RegionMark("b", SPOT, T0 + 500, AVOID_STOCKOUT),)


def test_no_region_is_a_bug() -> None:
    with pytest.raises(ValueError, match="no regions"):
        choose_region((), (), SPOT, T0)


# ---------------------------------------------------------------- production, past the cache

def pipeline(regions: tuple[str, ...]) -> Pipeline:
    pool = WorkerPool(machine_type="n1-standard-8", image_uri="img")
    return Pipeline(name="p", trigger=Trigger(bucket="b"), checkpoint_uri="gs://c/p",
                    output_uri="gs://m/p", job=JobTemplate(worker_pools=(pool,), regions=regions),
                    recovery=RecoveryPolicy(escalation=EscalationKind.NEVER,
                                            stockout_wait_s=900.0, backoff_base_s=1.0,
                                            backoff_cap_s=1.0))


def setup(regions: tuple[str, ...]) -> tuple[Deps, InMemoryLauncher, ManualClock]:
    deps = fake_deps(pipeline(regions))
    deps.spot = SpotRecord(cache_s=60.0)  # production's cache of the ranking
    assert isinstance(deps.launcher, InMemoryLauncher) and isinstance(deps.clock, ManualClock)
    return deps, deps.launcher, deps.clock


def current(deps: Deps) -> Run:
    run, _ = deps.runs.load("r")
    assert run is not None and run.current is not None
    return run


def stock_out(deps: Deps, clock: ManualClock) -> Run:
    """The live Spot attempt queues past the stockout wait; the next one launches."""
    before = len(current(deps).attempts)
    clock.advance(1000.0)  # past the wait, and past the ranking cache
    tick(deps)  # cancelled for a stockout
    tick(deps)  # its end confirmed: the next attempt after a 1-s backoff
    clock.advance(5.0)
    tick(deps)
    run = current(deps)
    assert len(run.attempts) == before + 1
    assert run.attempts[-2].failure is FailureClass.STOCKOUT
    return run


@pytest.mark.parametrize("regions", [("us-central1", "europe-west4"),
                                     ("us-central1", "europe-west4", "us-east1")])
def test_after_a_stockout_past_the_cache_the_run_never_goes_straight_back(
        regions: tuple[str, ...]) -> None:
    """The ranking is re-read after the cache (60 s) with the stockout in it; an index into that
    list sent the run back to the region that had just had no capacity."""
    deps, _, clock = setup(regions)
    run = start_run(deps, "p", run_id="r", data_uri="gs://b/d/", snapshot_id="r", reason="t")
    assert run is not None and run.current is not None
    seen = [run.current.region]
    assert seen == ["us-central1"]
    for _ in range(len(regions) - 1):
        run = stock_out(deps, clock)
        seen.append(run.current.region)  # type: ignore[union-attr]
    # Every region tried once before any is tried again: none skipped, none repeated.
    assert seen == list(dict.fromkeys(seen)) and set(seen) == set(regions)


def test_after_every_region_stocked_out_the_one_avoided_longest_ago_comes_first() -> None:
    regions = ("us-central1", "europe-west4", "us-east1")
    deps, _, clock = setup(regions)
    start_run(deps, "p", run_id="r", data_uri="gs://b/d/", snapshot_id="r", reason="t")
    for _ in range(3):
        run = stock_out(deps, clock)
    assert run.current is not None and run.current.region == "us-central1"
    assert {m.region for m in run.avoid_regions} == set(regions)


def test_a_preemption_moves_the_next_spot_attempt_elsewhere() -> None:
    deps, launcher, clock = setup(("us-central1", "europe-west4"))
    run = start_run(deps, "p", run_id="r", data_uri="gs://b/d/", snapshot_id="r", reason="t")
    assert run is not None and run.current is not None and run.current.job_name
    launcher.set_status(run.current.job_name, JobPhase.RUNNING, start_time=clock.t)
    tick(deps)
    clock.advance(600.0)
    launcher.set_status(run.current.job_name, JobPhase.FAILED, failure=FailureClass.PREEMPTED,
                        start_time=clock.t - 600.0, end_time=clock.t)
    tick(deps)
    run = current(deps)
    assert run.attempts[0].failure is FailureClass.PREEMPTED
    assert run.current is not None and run.current.region == "europe-west4"
    assert run.current.capacity is SPOT
