"""Training-health rules (spotorch.core.health): pure functions, tables of inputs -> findings."""

from __future__ import annotations

import math

import pytest

from spotorch.core import health as hp
from spotorch.core.health import HealthPolicy, KnownCheckpoint, MetricMode, Rule

P = HealthPolicy()


# ---------------------------------------------------------------- hung

# (hang_after_s, report interval, longest gap, starting) -> limit
HANG_LIMITS = [
    (None, None, 500.0, False, None),  # older trainer, no interval: not watched
    (None, 10.0, 0.0, False, 120.0),  # 10 x 10 s is under the floor
    (None, 30.0, 0.0, False, 300.0),  # 10 x interval
    (None, 10.0, 45.0, False, 450.0),  # 10 x the longest gap seen
    (None, 10.0, 0.0, True, 1800.0),  # before the first step: startup allowance
    (60.0, None, 500.0, False, 60.0),  # the pipeline's own value wins
    (60.0, None, 0.0, True, 1800.0),
]


@pytest.mark.parametrize(("after", "interval", "gap", "starting", "limit"), HANG_LIMITS)
def test_hang_after_is_the_pipelines_or_derived_from_the_report_interval(
        after: float | None, interval: float | None, gap: float, starting: bool,
        limit: float | None) -> None:
    policy = HealthPolicy(hang_after_s=after)
    assert hp.hang_after_s(policy, interval, gap, starting=starting) == limit


def test_hung_fires_only_past_the_limit() -> None:
    assert hp.hung(P, silent_s=120.0, report_interval_s=10.0, longest_gap_s=0.0, step=5) is None
    found = hp.hung(P, silent_s=121.0, report_interval_s=10.0, longest_gap_s=0.0, step=5)
    assert found is not None and found.rule is Rule.HUNG and found.step == 5
    assert found.values == {"silent_s": 121.0, "hang_after_s": 120.0}
    assert hp.hung(P, silent_s=1e6, report_interval_s=None, longest_gap_s=0.0, step=5) is None


# ---------------------------------------------------------------- step rate

def feed_rates(policy: HealthPolicy, rates: list[float]) -> tuple[hp.RateState, list[int]]:
    state, fired = hp.RateState(), []
    for i, rate in enumerate(rates):
        state, found = hp.rate_sample(policy, state, rate, i)
        if found is not None:
            assert found.rule is Rule.STEP_RATE_COLLAPSE
            fired.append(i)
    return state, fired


# rates -> indices at which the rule fires (min 5 samples, 3 slow in a row, fraction 0.5)
RATE_TABLE = [
    ([10.0] * 10, []),
    ([10.0] * 5 + [4.0] * 3, [7]),  # the third slow sample in a row
    ([10.0] * 5 + [4.0, 4.0, 10.0, 4.0, 4.0], []),  # a good sample resets the count
    ([10.0] * 5 + [4.0] * 6, [7]),  # one warning per collapse
    ([10.0] * 5 + [4.0] * 3 + [10.0] + [4.0] * 3, [7, 11]),  # recovered, then collapsed again
    ([4.0] * 3 + [10.0] * 2, []),  # too few samples for a verdict
    ([10.0] * 5 + [6.0] * 5, []),  # above half the median
]


@pytest.mark.parametrize(("rates", "fires"), RATE_TABLE)
def test_step_rate_collapse_table(rates: list[float], fires: list[int]) -> None:
    assert feed_rates(P, rates)[1] == fires


def test_slow_samples_stay_out_of_the_baseline_and_the_rule_can_be_off() -> None:
    state, _ = feed_rates(P, [10.0] * 5 + [1.0] * 10)
    assert state.samples == (10.0,) * 5
    assert feed_rates(HealthPolicy(step_rate_fraction=None), [10.0] * 5 + [0.1] * 5)[1] == []


# ---------------------------------------------------------------- divergence

def feed_losses(policy: HealthPolicy,
                losses: list[tuple[int, float]]) -> list[hp.Finding]:
    state, found = hp.LossState(), []
    for step, loss in losses:
        state, finding = hp.loss_sample(policy, state, step, loss)
        if finding is not None:
            found.append(finding)
    return found


NAN, INF = math.nan, math.inf

# policy, (step, loss) reports -> (rule, step, good_until_step) of the first finding, or None
DIVERGENCE_TABLE = [
    (P, [(10, 1.0), (20, 0.8), (30, 0.7)], None),
    (P, [(10, 1.0), (20, 0.8), (30, NAN)], (Rule.NONFINITE_LOSS, 30, 20)),
    (P, [(10, 1.0), (20, INF)], (Rule.NONFINITE_LOSS, 20, 10)),
    (HealthPolicy(nonfinite_loss=False), [(10, 1.0), (20, NAN)], None),
    (P, [(10, 1.0), (20, 0.5), (30, 6.0), (40, 7.0), (50, 8.0)], (Rule.LOSS_SPIKE, 50, 20)),
    (P, [(10, 1.0), (20, 0.5), (30, 6.0), (40, 7.0), (50, 0.6)], None),  # two spikes only
    (P, [(10, 1.0), (20, 0.5), (30, 4.0), (40, 4.0), (50, 4.0)], None),  # 8x, below k=10
    (HealthPolicy(loss_spike_factor=None), [(10, 1.0)] + [(20 + i, 100.0) for i in range(5)],
     None),
    (HealthPolicy(loss_plateau_steps=100), [(10, 1.0), (50, 1.2), (100, 1.1), (110, 1.05)],
     (Rule.LOSS_PLATEAU, 110, 10)),
    (HealthPolicy(loss_plateau_steps=100), [(10, 1.0), (50, 0.9), (100, 1.1), (140, 1.0)],
     None),
    (HealthPolicy(loss_plateau_steps=100, loss_plateau_min_delta=0.2),
     [(10, 1.0), (50, 0.9), (120, 0.85)], (Rule.LOSS_PLATEAU, 120, 10)),
]


@pytest.mark.parametrize(("policy", "losses", "first"), DIVERGENCE_TABLE)
def test_divergence_rules_table(policy: HealthPolicy, losses: list[tuple[int, float]],
                                first: tuple[Rule, int, int] | None) -> None:
    found = feed_losses(policy, losses)
    if first is None:
        assert found == []
    else:
        assert found, "a rule should have fired"
        assert (found[0].rule, found[0].step, found[0].good_until_step) == first
        assert found[0].message


def test_a_spike_on_a_negative_best_never_fires() -> None:
    assert feed_losses(P, [(1, -2.0)] + [(i, 50.0) for i in range(2, 8)]) == []


RESUME_TABLE = [
    ([(10, "a"), (20, "b"), (30, "c")], 25, (20, "b")),
    ([(10, "a"), (20, "b"), (30, "c")], 30, (30, "c")),
    ([(10, "a")], 5, None),
    ([(10, "a")], None, None),
]


@pytest.mark.parametrize(("checkpoints", "good", "expected"), RESUME_TABLE)
def test_resume_point_is_the_newest_checkpoint_at_or_before_the_last_good_step(
        checkpoints: list[tuple[int, str]], good: int | None,
        expected: tuple[int, str] | None) -> None:
    assert hp.resume_point(checkpoints, good) == expected


# ---------------------------------------------------------------- stale checkpoints, Young/Daly

def test_stale_checkpoint_fires_past_the_limit_or_never_when_off() -> None:
    assert hp.stale_checkpoint(P, since_s=3600.0, step=1) is None
    found = hp.stale_checkpoint(P, since_s=3601.0, step=1)
    assert found is not None and found.rule is Rule.STALE_CHECKPOINT
    off = HealthPolicy(checkpoint_stale_after_s=None)
    assert hp.stale_checkpoint(off, since_s=1e9, step=1) is None


YOUNG_DALY = [  # (checkpoint cost, MTBF) -> optimal interval
    (30.0, 3600.0, math.sqrt(2 * 30 * 3600)),  # ~465 s
    (60.0, 4 * 3600.0, math.sqrt(2 * 60 * 4 * 3600)),  # ~1315 s
    (0.0, 3600.0, 0.0),
]


@pytest.mark.parametrize(("cost", "mtbf", "optimal"), YOUNG_DALY)
def test_young_daly_interval(cost: float, mtbf: float, optimal: float) -> None:
    assert hp.young_daly_interval_s(cost, mtbf) == pytest.approx(optimal)


def test_young_daly_rejects_impossible_inputs() -> None:
    with pytest.raises(ValueError):
        hp.young_daly_interval_s(-1.0, 10.0)
    with pytest.raises(ValueError):
        hp.young_daly_interval_s(1.0, 0.0)


def test_checkpoint_advice_from_a_runs_history() -> None:
    advice = hp.checkpoint_advice([0.0, 600.0, 1200.0, 1800.0], [20.0, 40.0, 30.0],
                                  spot_run_s=4 * 3600.0, preemptions=2)
    assert advice.interval_s == 600.0 and advice.checkpoint_cost_s == 30.0
    assert advice.mtbf_s == 7200.0
    assert advice.optimal_s == pytest.approx(math.sqrt(2 * 30 * 7200))  # ~657 s
    assert advice.verdict == "close to optimal"
    rare = hp.checkpoint_advice([0.0, 7200.0], [30.0], spot_run_s=7200.0, preemptions=2)
    assert rare.verdict == "checkpoint more often"
    unknown = hp.checkpoint_advice([0.0, 600.0], [30.0], spot_run_s=3600.0, preemptions=0)
    assert unknown.optimal_s is None and unknown.verdict == "not enough history"


# ---------------------------------------------------------------- out of memory

MACHINES = ("n1-highmem-4", "n1-highmem-8", "n1-highmem-16")
NEXT_MACHINE = [
    ((), "n1-standard-4", None),
    (MACHINES, "n1-standard-4", "n1-highmem-4"),  # the pipeline's own machine: the first
    (MACHINES, "n1-highmem-4", "n1-highmem-8"),
    (MACHINES, "n1-highmem-16", None),  # the largest: nothing left
]


@pytest.mark.parametrize(("machines", "current", "expected"), NEXT_MACHINE)
def test_next_machine(machines: tuple[str, ...], current: str, expected: str | None) -> None:
    assert hp.next_machine(HealthPolicy(fallback_machines=machines), current) == expected


# ---------------------------------------------------------------- retention

LISTED = [(100, True), (200, True), (300, True), (400, True), (500, False)]
RETENTION = [
    (2, (), (100, 200)),  # keep 300, 400; the incomplete 500 is left alone
    (2, (100,), (200,)),  # 100 protected (best by metric, or resumed from)
    (10, (), ()),
    (1, (), (100, 200, 300)),
    (0, (), (100, 200, 300)),  # never fewer than one
]


@pytest.mark.parametrize(("newest", "keep", "doomed"), RETENTION)
def test_retention_keeps_the_newest_k_and_protected_and_never_incomplete(
        newest: int, keep: tuple[int, ...], doomed: tuple[int, ...]) -> None:
    assert hp.retention_doomed(LISTED, newest, keep) == doomed


def test_retention_never_deletes_newer_than_the_newest_kept_or_incomplete() -> None:
    assert hp.doomed_steps([(100, True), (900, True), (50, False)], frozenset({500})) == (100,)
    assert hp.retention_doomed([(5, False), (6, False)], 1, ()) == ()


def test_diverged_steps_are_the_complete_ones_after_the_safe_step() -> None:
    assert hp.diverged_steps(LISTED, 200) == (300, 400)
    assert hp.diverged_steps(LISTED, -1) == (100, 200, 300, 400)


BEST = [
    (MetricMode.MIN, [(1, 0.5), (2, 0.3), (3, 0.4)], 2),
    (MetricMode.MAX, [(1, 0.5), (2, 0.3), (3, 0.4)], 1),
    (MetricMode.MIN, [(1, 0.3), (2, 0.3)], 2),  # ties: the newer
    (MetricMode.MIN, [(1, None), (2, math.nan)], None),
]


@pytest.mark.parametrize(("mode", "scored", "best"), BEST)
def test_best_step(mode: MetricMode, scored: list[tuple[int, float | None]],
                   best: int | None) -> None:
    known = [KnownCheckpoint(s, f"u{s}", 0.0, m) for s, m in scored]
    assert hp.best_step(known, mode) == best


def test_policy_problems_name_the_bad_fields() -> None:
    assert HealthPolicy().problems() == []
    bad = HealthPolicy(step_rate_fraction=1.5, keep_last=0, loss_spike_factor=0.5,
                       fallback_machines=("a", "a"))
    assert {name for name, _ in bad.problems()} == {"step_rate_fraction", "keep_last",
                                                     "loss_spike_factor", "fallback_machines"}
