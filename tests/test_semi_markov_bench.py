"""The semi-Markov benchmark's model and DP (benchmarks/semi_markov_policy.py) on hand-made cases."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

from spotorch.core.pipeline import Capacity
from spotorch.core.policy import PolicyView

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("semi_markov_policy",
                                                  ROOT / "benchmarks" / "semi_markov_policy.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_run_lengths_mark_the_cut_ends_as_censored(bench: ModuleType) -> None:
    avail = np.array([1, 1, 0, 0, 0, 1, 1, 1, 0], dtype=bool)
    assert bench.run_lengths(avail) == [(True, 2, True), (False, 3, False), (True, 3, False),
                                        (False, 1, True)]


def test_survival_is_kaplan_meier_with_a_pooled_tail(bench: ModuleType) -> None:
    # Ended runs of 1, 2, 2 and a censored one of 3 ticks: at age 1 four at risk, one ends;
    # at age 2 three at risk, two end; ages >= 3 (the pooled tail): one at risk, none ends.
    keep = bench.survival([(1, False), (2, False), (2, False), (3, True)], max_age=3)
    assert keep[0] == pytest.approx(0.75) and keep[1] == pytest.approx(1 / 3)
    assert keep[2] == pytest.approx(0.9999)  # clipped: never certain


def test_the_dp_waits_for_spot_that_returns_and_buys_standard_when_it_does_not(
        bench: ModuleType) -> None:
    ages = 4
    model = bench.Model(up=np.full(ages, 0.999), down=np.full(ages, 0.5))  # outages are short
    table = bench.solve(model, 3.0, 1, ticks=20, work_ticks=10)
    policy = bench.SemiMarkovPolicy(table, ages)

    def view(**kw: object) -> PolicyView:
        fields: dict[str, object] = dict(
            now_s=0.0, deadline_s=20 * 300.0, work_total_s=10 * 300.0, work_done_s=0.0,
            restart_overhead_s=300.0, current=None, spot_available=False, preemptions=1,
            tick_s=300.0, spot_down_s=0.0)
        return PolicyView(**{**fields, **kw})  # type: ignore[arg-type]

    assert policy(view()) is Capacity.SPOT  # ten ticks of slack, outages of two: wait
    # Spot that hardly ever returns: waiting is still free, so the DP waits until the last
    # tick that leaves a standard launch (one tick of overhead) and ten ticks of work.
    never = bench.Model(up=np.full(ages, 0.999), down=np.full(ages, 0.9999))
    stuck = bench.solve(never, 3.0, 1, ticks=20, work_ticks=10)
    assert stuck[12, 10, bench.IDLE, ages] and not stuck[11, 10, bench.IDLE, ages]
    # Spot up and running: stay on it.
    assert policy(view(current=Capacity.SPOT, spot_available=True, spot_up_s=600.0,
                       spot_down_s=None)) is Capacity.SPOT
