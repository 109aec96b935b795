"""Escalation policies: the dispatch table, the deadline guard, and Uniform Progress's rules."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spotorch.core.pipeline import Capacity, EscalationKind, RecoveryPolicy
from spotorch.core.policy import (
    DeadlineTuning,
    PolicyView,
    ProbeTerms,
    UnknownEscalation,
    choose_capacity,
    deadline_policy,
    flex_max_wait_s,
    greedy,
    mean_down_h,
    mean_up_h,
    probe_worth,
    slack_of,
    uniform_progress,
)
from spotorch.sim.simulate import Scenario, Window, run_online

H = 3600.0
SPOT, STANDARD = Capacity.SPOT, Capacity.STANDARD


def view(**overrides: Any) -> PolicyView:
    """A run 10 h in, 48 h of work, 20 h done, deadline at 72 h, on Spot with Spot up."""
    fields: dict[str, Any] = dict(now_s=10 * H, deadline_s=72 * H, work_total_s=48 * H,
                                  work_done_s=20 * H, restart_overhead_s=0.2 * H,
                                  current=SPOT, spot_available=True, preemptions=0,
                                  tick_s=300.0)
    fields.update(overrides)
    return PolicyView(**fields)


def recovery(kind: EscalationKind, after: int = 3) -> RecoveryPolicy:
    return RecoveryPolicy(escalation=kind, escalate_after_preemptions=after)


# Slack in this table = (deadline - now) - (total - done); 34 h in the default view.
DISPATCH_TABLE = [
    # NEVER: Spot, whatever happens
    (EscalationKind.NEVER, {}, SPOT),
    (EscalationKind.NEVER, {"now_s": 71 * H, "preemptions": 40}, SPOT),
    # ALWAYS_STANDARD: standard, even with all the slack in the world
    (EscalationKind.ALWAYS_STANDARD, {}, STANDARD),
    (EscalationKind.ALWAYS_STANDARD, {"deadline_s": None}, STANDARD),
    # COUNT: Spot until N preemptions, then standard
    (EscalationKind.COUNT, {"preemptions": 2}, SPOT),
    (EscalationKind.COUNT, {"preemptions": 3}, STANDARD),
    (EscalationKind.COUNT, {"preemptions": 9, "current": None}, STANDARD),
    # DEADLINE: Spot-first without a deadline or without a size
    (EscalationKind.DEADLINE, {"deadline_s": None, "current": STANDARD}, SPOT),
    (EscalationKind.DEADLINE, {"work_total_s": None, "spot_available": False}, SPOT),
    # DEADLINE: plenty of slack -> Spot, and wait through an outage
    (EscalationKind.DEADLINE, {}, SPOT),
    (EscalationKind.DEADLINE, {"current": None, "spot_available": False}, SPOT),
    # DEADLINE: an outage with too little slack for the reserve -> buy standard
    (EscalationKind.DEADLINE, {"current": None, "spot_available": False, "now_s": 40 * H}, STANDARD),
    # DEADLINE: on standard during an outage -> stay; Spot back with slack -> go back to Spot
    (EscalationKind.DEADLINE, {"current": STANDARD, "spot_available": False}, STANDARD),
    (EscalationKind.DEADLINE, {"current": STANDARD}, SPOT),
    # DEADLINE: Spot back but only slack for the guard, not the switch reserve -> stay
    (EscalationKind.DEADLINE, {"current": STANDARD, "now_s": 51.3 * H}, STANDARD),
    # DEADLINE: the safety net, and a run already late
    (EscalationKind.DEADLINE, {"now_s": 51.9 * H}, STANDARD),
    (EscalationKind.DEADLINE, {"now_s": 80 * H}, STANDARD),
    # DEADLINE: nothing left to do
    (EscalationKind.DEADLINE, {"work_done_s": 48 * H, "now_s": 71 * H}, SPOT),
]


@pytest.mark.parametrize(("kind", "overrides", "expected"), DISPATCH_TABLE)
def test_choose_capacity_table(kind: EscalationKind, overrides: dict[str, Any],
                               expected: Capacity) -> None:
    assert choose_capacity(view(**overrides), recovery(kind)) is expected


def test_count_threshold_comes_from_the_recovery_policy() -> None:
    assert choose_capacity(view(preemptions=1), recovery(EscalationKind.COUNT, after=1)) \
        is STANDARD
    assert choose_capacity(view(preemptions=1), recovery(EscalationKind.COUNT, after=5)) is SPOT


def test_unknown_escalation_is_an_error() -> None:
    bogus = RecoveryPolicy(escalation="sometimes")  # type: ignore[arg-type]
    with pytest.raises(UnknownEscalation):
        choose_capacity(view(), bogus)


UP_TABLE = [
    # rule 2: Spot whenever available, even behind the uniform line (ep(10 h) = 6.67 h)
    ({"work_done_s": 2 * H, "current": None}, SPOT),
    # rule 1: idle and behind the line -> standard; ahead of it -> wait
    ({"work_done_s": 6 * H, "current": None, "spot_available": False}, STANDARD),
    ({"work_done_s": 7 * H, "current": None, "spot_available": False}, SPOT),
    # rule 3: on standard, stay until cp >= ep(t + 2d) = 6.93 h, even with Spot back
    ({"work_done_s": 6.9 * H, "current": STANDARD}, STANDARD),
    ({"work_done_s": 7.0 * H, "current": STANDARD}, SPOT),
    # on standard with Spot unavailable: stay, even far ahead of the line (the authors' rule;
    # the old one returned Spot, i.e. left standard to wait)
    ({"work_done_s": 19.0 * H, "current": STANDARD, "spot_available": False}, STANDARD),
    # a queued Spot attempt is idle for rule 4: capacity back but slack under 2d + tick
    ({"work_done_s": 30 * H, "now_s": 53.7 * H, "current": SPOT, "spot_queued": True}, STANDARD),
    # rule 4: idle with slack under 2d (plus a tick) -> standard
    ({"work_done_s": 30 * H, "now_s": 53.7 * H, "current": None}, STANDARD),
    # rule 2 again: a running Spot attempt is not interrupted by rule 4
    ({"work_done_s": 30 * H, "now_s": 53.7 * H}, SPOT),
]


@pytest.mark.parametrize(("overrides", "expected"), UP_TABLE)
def test_uniform_progress_rules(overrides: dict[str, Any], expected: Capacity) -> None:
    assert uniform_progress(view(**overrides)) is expected


def test_greedy_waits_until_forced_then_stays_on_standard() -> None:
    assert greedy(view(current=None, spot_available=False, now_s=40 * H)) is SPOT
    assert greedy(view(current=None, spot_available=False, now_s=51.9 * H)) is STANDARD
    assert greedy(view(current=STANDARD, now_s=20 * H)) is STANDARD


views = st.builds(
    PolicyView,
    now_s=st.floats(0, 100 * H), deadline_s=st.floats(0, 100 * H),
    work_total_s=st.floats(1, 60 * H), work_done_s=st.floats(0, 60 * H),
    restart_overhead_s=st.floats(0, H), current=st.sampled_from([None, SPOT, STANDARD]),
    spot_available=st.booleans(), preemptions=st.integers(0, 50),
    changeovers=st.integers(0, 50), tick_s=st.floats(1, 900))


@settings(max_examples=300, deadline=None)
@given(views)
def test_deadline_guard_always_wins(v: PolicyView) -> None:
    """Whenever one more tick off standard could be fatal, every deadline-aware policy says so."""
    slack = slack_of(v)
    assert slack is not None
    if slack.work_left_s > 0 and slack.must_run_standard:
        assert deadline_policy(v) is STANDARD
        assert greedy(v) is STANDARD
        assert uniform_progress(v) is STANDARD


def markov_trace(rng: np.random.Generator, n: int, up_steps: float, down_steps: float
                 ) -> np.ndarray:
    """Spot availability as a two-state Markov chain with the given mean sojourns (in steps)."""
    avail = np.empty(n, dtype=bool)
    avail[0] = rng.random() < up_steps / (up_steps + down_steps)
    for i in range(1, n):
        leave = 1.0 / (up_steps if avail[i - 1] else down_steps)
        avail[i] = avail[i - 1] != (rng.random() < leave)
    return avail


@pytest.mark.parametrize("seed", range(6))
def test_deadline_never_missed_when_feasible(seed: int) -> None:
    """Synthetic traces from always-up to never-up; the deadline policies always make it."""
    rng = np.random.default_rng(seed)
    step = 300
    for _ in range(12):
        task = int(rng.integers(4, 40)) * step
        overhead = int(rng.choice([0, 60, 300, 720, 1200]))
        task -= task % (np.gcd(step, overhead) or step)
        deadline = -(-(task + overhead) // step) * step + int(rng.integers(0, 30)) * step
        scenario = Scenario(task_s=task, deadline_s=deadline, overhead_s=overhead, step_s=step)
        n = scenario.steps
        avail = (np.ones(n, bool) if rng.random() < 0.1 else np.zeros(n, bool)
                 if rng.random() < 0.1 else markov_trace(rng, n, *rng.uniform(1, 12, size=2)))
        window = Window("t", "f", 0.0, avail, np.ones(n), 3.0)
        for policy in (deadline_policy, greedy, uniform_progress):
            outcome = run_online(window, scenario, policy)
            assert outcome.met_deadline, (policy.__name__, scenario, avail.astype(int))
            assert outcome.finished_s is not None and outcome.finished_s <= deadline


def test_history_estimates_shrink_to_the_priors() -> None:
    assert mean_up_h(view()) == pytest.approx(5.0) and mean_down_h(view()) == pytest.approx(1.0)
    # 9 h run over 3 preemptions, weight 3 on 5 h: (9 + 15) / 6 = 4 h.
    assert mean_up_h(view(spot_run_s=9 * H, preemptions=3)) == pytest.approx(4.0)
    # 5 h queued over 2 outages seen to their end, weight 1 on 1 h: (5 + 1) / 3 = 2 h.
    assert mean_down_h(view(spot_wait_s=5 * H, spot_waits=2)) == pytest.approx(2.0)


# On standard with Spot back at 47 h: slack 5 h, work left 20 h, overhead 0.2 h.
SWITCH_BACK = {"current": STANDARD, "now_s": 47 * H, "work_done_s": 28 * H}


def test_switch_back_bar_follows_the_runs_spot_up_time() -> None:
    """Short Spot up-times so far raise the bar for leaving standard; long ones lower it."""
    # With no history the bar is 0.2 x 20 h x 0.2 = 0.8 h over the guard; slack is 5 h.
    assert deadline_policy(view(**SWITCH_BACK)) is SPOT
    # 40 preemptions in 2 h of Spot: U = (2 + 15) / 43 = 0.4 h, bar 20 x 0.2 / 0.4 = 10 h.
    choppy = view(**SWITCH_BACK, preemptions=40, spot_run_s=2 * H)
    assert deadline_policy(choppy) is STANDARD
    # 45 h over 1 preemption: U = 15 h, bar 0.27 h: slack 1 h is enough (not for the prior).
    steady = view(**{**SWITCH_BACK, "now_s": 51 * H}, preemptions=1, spot_run_s=45 * H)
    assert deadline_policy(steady) is SPOT
    assert deadline_policy(dataclasses.replace(steady, preemptions=0, spot_run_s=0.0)) \
        is STANDARD
    assert deadline_policy(dataclasses.replace(choppy, preemptions=0, spot_run_s=0.0)) is SPOT


def test_the_switch_back_hysteresis_waits_for_spot_to_have_been_back() -> None:
    """With it on, a return younger than half an overhead (0.1 h here) does not make the run
    leave standard; off (the default), any return does."""
    half = DeadlineTuning(switch_after_overheads=0.5)
    assert deadline_policy(view(**SWITCH_BACK, spot_up_s=0.0), half) is STANDARD
    assert deadline_policy(view(**SWITCH_BACK, spot_up_s=300.0), half) is STANDARD
    assert deadline_policy(view(**SWITCH_BACK, spot_up_s=600.0), half) is SPOT
    assert deadline_policy(view(**SWITCH_BACK, spot_up_s=None), half) is SPOT  # age unknown
    assert deadline_policy(view(**SWITCH_BACK, spot_up_s=0.0)) is SPOT
    # Only the way back off standard waits: a queued or idle run takes Spot at once.
    assert deadline_policy(view(current=None, spot_up_s=0.0), half) is SPOT
    # A probe's question is whether Spot seen back would be taken, whatever its age.
    assert probe_worth(view(**ON_STANDARD, spot_up_s=0.0), TERMS,
                       lambda v: deadline_policy(v, half))


def test_assumed_spot_waits_for_the_runs_typical_outage() -> None:
    """Spot only assumed back (a cooldown): leave standard no sooner than a mean outage."""
    recent = view(**SWITCH_BACK, spot_assumed=True, spot_down_at_s=46 * H)  # 1 h ago
    assert deadline_policy(recent) is SPOT  # prior mean outage 1 h: just passed
    long_outages = dataclasses.replace(recent, spot_wait_s=8 * H, spot_waits=1)  # 4.5 h
    assert deadline_policy(long_outages) is STANDARD
    assert deadline_policy(dataclasses.replace(long_outages, spot_down_at_s=40 * H)) is SPOT
    # Seen, not assumed: the truth needs no extra wait.
    assert deadline_policy(dataclasses.replace(long_outages, spot_assumed=False)) is SPOT


# Probes: on standard at 47 h with Spot unseen; slack 5 h, work left 20 h, overhead 0.2 h.
ON_STANDARD = {**SWITCH_BACK, "spot_available": False}
TERMS = ProbeTerms(hit_cost=300 / H * 1.0, saving_per_s=2.0 / H, wait_s=600.0)


def test_a_probe_is_worth_it_only_on_standard_when_the_policy_would_leave() -> None:
    assert probe_worth(view(**ON_STANDARD), TERMS)
    # On Spot (running or queued) the attempt itself shows Spot capacity: never probe.
    assert not probe_worth(view(**{**ON_STANDARD, "current": SPOT}), TERMS)
    assert not probe_worth(view(**{**ON_STANDARD, "current": None}), TERMS)
    # Slack for the guard but not for the switch reserve: a yes would change nothing.
    assert deadline_policy(view(**{**SWITCH_BACK, "now_s": 51.3 * H})) is STANDARD
    assert not probe_worth(view(**{**ON_STANDARD, "now_s": 51.3 * H}), TERMS)
    # The same question, asked of another policy: UP leaves standard only ahead of its line.
    assert not probe_worth(view(**ON_STANDARD), TERMS, uniform_progress)
    assert probe_worth(view(**{**ON_STANDARD, "work_done_s": 40 * H, "now_s": 40 * H}), TERMS,
                       uniform_progress)


def test_a_probe_must_pay_for_itself() -> None:
    # 20 h left at 2 / h saved: 40 minus two overheads; a probe billed more is not worth it.
    assert probe_worth(view(**ON_STANDARD), dataclasses.replace(TERMS, hit_cost=38.0))
    assert not probe_worth(view(**ON_STANDARD), dataclasses.replace(TERMS, hit_cost=40.0))
    # Misses that cost something: long outages (Spot history) make most probes misses.
    costly_miss = dataclasses.replace(TERMS, miss_cost=1.0)
    assert probe_worth(view(**ON_STANDARD), costly_miss)  # prior outage 1 h: p(hit) 0.15
    long_outages = view(**ON_STANDARD, spot_wait_s=200 * H, spot_waits=1)  # ~100 h outages
    assert not probe_worth(long_outages, costly_miss)
    assert probe_worth(long_outages, TERMS)  # a miss is free: worth trying anyway


def test_flex_start_replaces_standard_when_the_slack_covers_its_wait() -> None:
    outage = {"current": None, "spot_available": False, "now_s": 40 * H}  # slack 4 h, tight
    assert deadline_policy(view(**outage)) is STANDARD
    assert deadline_policy(view(**outage, flex_wait_s=1800.0)) is Capacity.FLEX_START
    assert deadline_policy(view(**outage, flex_wait_s=2 * H)) is STANDARD  # 2 x 2 h > 4 h
    # The safety net is standard, never a queue.
    assert deadline_policy(view(now_s=51.9 * H, flex_wait_s=60.0)) is STANDARD
    # On standard: stay (flex would cost a relaunch and give up the way back to Spot).
    assert deadline_policy(view(**{**outage, "current": STANDARD}, flex_wait_s=60.0)) \
        is STANDARD


def test_flex_max_wait_leaves_time_for_standard_after_a_timeout() -> None:
    # Slack 4 h at 40 h; guard = 2 x 0.2 h + 5 min: at most 4 h - 0.483 h of waiting.
    v = view(current=None, now_s=40 * H)
    assert flex_max_wait_s(v, 24 * H) == pytest.approx(4 * H - (0.4 * H + 300))
    assert flex_max_wait_s(v, 600.0) == 600.0
    assert flex_max_wait_s(view(deadline_s=None), 600.0) == 600.0
