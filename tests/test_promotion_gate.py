"""The promotion gate (spotorch.core.promotion), pure: table tests of every rule, the champion
record's decisions (once per version), evaluation identity and data time."""

from __future__ import annotations

import pytest

from spotorch.core.promotion import (
    DECISIONS_KEPT,
    Candidate,
    ChampionRecord,
    Evaluation,
    HashSplit,
    PromotionPolicy,
    consider,
    data_time,
    evaluation_identity,
    evaluation_metrics,
    gate,
    latency_of,
)

M = "projects/p/locations/us-central1/models/churn"
HOLDOUT = "folder gs://b/holdout/"
POLICY = PromotionPolicy(metric="accuracy", goal="maximize", min_improvement=0.01,
                         max_latency_p95_ms=50.0)


def cand(v: int, acc: float | None = 0.9, *, t: float | None = 100.0 * 2,
         ev: str | None = HOLDOUT, lat: float | None = 10.0) -> Candidate:
    return Candidate(version=f"{M}@{v}", run_id=f"r{v}",
                     metrics={} if acc is None else {"accuracy": acc}, evaluation=ev,
                     data_time=t, latency_p95_ms=lat)


CHAMP = cand(1, 0.874, t=100.0)

# (case, challenger, champion, policy, promote, rule, words in the reason)
CASES = [
    ("first version", cand(2), None, POLICY, True, "first", "first evaluated"),
    ("better by more than the margin", cand(2, 0.91), CHAMP, POLICY, True, "improved",
     "beats the champion's 0.874"),
    ("worse", cand(2, 0.706), CHAMP, POLICY, False, "margin", "does not beat"),
    ("better but within the margin", cand(2, 0.88), CHAMP, POLICY, False, "margin", "by 0.01"),
    ("equal, no margin", cand(2, 0.874), CHAMP, PromotionPolicy(metric="accuracy"), False,
     "margin", "does not beat"),
    ("any strict gain, no margin", cand(2, 0.875), CHAMP, PromotionPolicy(metric="accuracy"),
     True, "improved", "beats"),
    ("minimize: lower wins", cand(2, 0.2), cand(1, 0.3, t=100.0),
     PromotionPolicy(metric="accuracy", goal="minimize"), True, "improved", "beats"),
    ("minimize: higher loses", cand(2, 0.4), cand(1, 0.3, t=100.0),
     PromotionPolicy(metric="accuracy", goal="minimize"), False, "margin", "minimize"),
    ("over the latency budget", cand(2, 0.99, lat=80.0), CHAMP, POLICY, False, "latency",
     "over the budget of 50 ms"),
    ("latency unmeasured with a budget", cand(2, 0.99, lat=None), None, POLICY, False, "latency",
     "no p95 prediction latency"),
    ("latency unmeasured, no budget", cand(2, 0.99, lat=None), None,
     PromotionPolicy(metric="accuracy"), True, "first", "first"),
    ("no evaluation metric", cand(2, None), None, POLICY, False, "metric", "eval_accuracy"),
    ("not evaluated on held-out data", cand(2, ev=None), None, POLICY, False, "metric",
     "held-out"),
    ("older data (a rerun) cannot take the alias back", cand(2, 0.99, t=50.0), CHAMP, POLICY,
     False, "data", "no newer"),
    ("the same data cannot either", cand(2, 0.99, t=100.0), CHAMP, POLICY, False, "data",
     "no newer"),
    ("unknown data time", cand(2, 0.99, t=None), CHAMP, POLICY, False, "data", "unknown"),
    ("other evaluation data", cand(2, 0.99, ev="folder gs://b/other/"), CHAMP, POLICY, False,
     "evaluation", "cannot compare"),
    ("champion lacks the metric", cand(2, 0.99), cand(1, None, t=100.0), POLICY, False,
     "evaluation", "has no accuracy"),
    ("NaN metric", cand(2, float("nan")), None, POLICY, False, "metric", "finite"),
]


@pytest.mark.parametrize(("case", "challenger", "champion", "policy", "promote", "rule", "words"),
                         CASES, ids=[c[0] for c in CASES])
def test_the_gate(case: str, challenger: Candidate, champion: Candidate | None,
                  policy: PromotionPolicy, promote: bool, rule: str, words: str) -> None:
    verdict = gate(policy, challenger, champion)
    assert (verdict.promote, verdict.rule) == (promote, rule), verdict.reason
    assert words in verdict.reason


def test_consider_decides_once_per_version_and_moves_the_champion() -> None:
    record = ChampionRecord(model=M, alias="production")
    record, first = consider(record, POLICY, cand(1, 0.874, t=100.0), now=1.0)
    assert first.promoted and record.champion is not None and record.champion.version == f"{M}@1"
    worse = cand(2, 0.7, t=200.0)
    record, rejected = consider(record, POLICY, worse, now=2.0)
    assert not rejected.promoted and record.champion is not None
    assert record.champion.version == f"{M}@1"
    better = cand(3, 0.95, t=300.0)
    record, promoted = consider(record, POLICY, better, now=3.0)
    assert promoted.promoted and promoted.replaced == f"{M}@1"
    assert record.champion is not None and record.champion.version == f"{M}@3"
    # a redelivery of version 2 (now judged against version 3) changes nothing
    again, same = consider(record, POLICY, worse, now=4.0)
    assert again == record and same == rejected
    # even version 1, whose decision said promoted, does not take the alias back
    again, same = consider(record, POLICY, cand(1, 0.874, t=100.0), now=5.0)
    assert again == record and same == first
    assert ChampionRecord.from_doc(record.to_doc()) == record


def test_the_record_keeps_the_newest_decisions() -> None:
    record = ChampionRecord(model=M, alias="production")
    for v in range(DECISIONS_KEPT + 5):
        record, _ = consider(record, POLICY, cand(v, 0.5, t=float(v), lat=99.0), now=float(v))
    assert len(record.decisions) == DECISIONS_KEPT
    assert record.decisions[-1].version == f"{M}@{DECISIONS_KEPT + 4}"


def test_evaluation_identity_names_the_held_out_data() -> None:
    assert evaluation_identity(None, {}) is None
    assert evaluation_identity(Evaluation(data_uri="gs://b/h/"), {"uri": "gs://b/d1/"}) == \
        evaluation_identity(Evaluation(data_uri="gs://b/h/"), {"uri": "gs://b/d2/"})
    split = Evaluation(split=HashSplit(key="user_id", percent=10))
    one = evaluation_identity(split, {"objects_hash": "aaa"})
    assert one is not None and "aaa" in one and "user_id" in one
    assert one != evaluation_identity(split, {"objects_hash": "bbb"})  # another snapshot's rows
    other_rule = Evaluation(split=HashSplit(key="user_id", percent=20))
    assert evaluation_identity(other_rule, {"objects_hash": "aaa"}) != one


def test_data_time_from_generations_bigquery_or_creation() -> None:
    pinned = {"objects": [{"name": "a", "generation": 1_700_000_000_000_000},
                          {"name": "b", "generation": 1_700_000_100_000_000}]}
    assert data_time(pinned, 5.0, rerun=True) == 1_700_000_100.0  # a rerun: the same data time
    assert data_time({"bigquery": {"snapshot_time": 42.0}}, 5.0, rerun=False) == 42.0
    assert data_time({"uri": "gs://b/d/"}, 5.0, rerun=False) == 5.0
    assert data_time({"uri": "gs://b/d/"}, 5.0, rerun=True) is None


def test_evaluation_metrics_and_latency_from_the_reported_ones() -> None:
    reported = {"loss": 0.1, "eval_accuracy": 0.9, "eval_latency_p95_ms": 12.0}
    assert evaluation_metrics(reported) == {"accuracy": 0.9, "latency_p95_ms": 12.0}
    assert latency_of(reported) == 12.0 and latency_of({"loss": 1.0}) is None


# --- the canary (spotorch.core.canary) -------------------------------------------------------------

from spotorch.core.canary import Rollout, ServeSpec, Window, judge  # noqa: E402

SPEC = ServeSpec(endpoint="e", canary_minutes=10, max_error_rate=0.05, max_latency_p95_ms=100.0,
                 min_predictions=10)
WATCHED = Rollout(key="k", endpoint="E", serving="M@1", serving_id="1", canary="M@2",
                  canary_id="2", started_at=0.0, phase="canary")


@pytest.mark.parametrize(("window", "now", "phase", "words"), [
    (Window(100, 10, 20.0), 60.0, "rolling_back", "error rate 0.100"),
    (Window(100, 0, 250.0), 60.0, "rolling_back", "p95 latency 250.0 ms"),
    (Window(100, 5, 20.0), 599.0, "canary", ""),  # within bounds, the window not passed
    (Window(100, 5, 20.0), 600.0, "finishing", "passed"),
    (Window(3, 0, 20.0), 900.0, "canary", ""),  # too few predictions to let it take all
    (Window(), 900.0, "canary", ""),
])
def test_the_canary_is_judged_on_its_own_traffic(window: Window, now: float, phase: str,
                                                  words: str) -> None:
    after = judge(WATCHED, SPEC, window, now)
    assert after.phase == phase
    assert words in (after.history[-1][1] if after.history else "")
