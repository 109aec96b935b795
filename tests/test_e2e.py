"""End to end on the local stack: the demo's scenarios, with real checkpoints, events and alerts."""

from __future__ import annotations

from typing import Any

import pytest

from spotorch.events import kind_of, validate_event
from spotorch.local.demo import SCENARIOS, run_demo

pytestmark = [pytest.mark.emulator, pytest.mark.slow]

_REPORTS: dict[str, dict[str, Any]] = {}


def report(name: str) -> dict[str, Any]:
    if name not in _REPORTS:
        _REPORTS[name] = run_demo(SCENARIOS[name], timeout_s=180.0, quiet=True)
    return _REPORTS[name]


def kinds(r: dict[str, Any]) -> list[str]:
    return [kind_of(t) for t in r["events"]]


def test_default_scenario_resumes_from_checkpoints_escalates_and_succeeds() -> None:
    r = report("default")
    assert r["status"] == "SUCCEEDED", r.get("history")
    capacities = [a["capacity"] for a in r["attempts"]]
    assert capacities == ["spot", "spot", "standard"]
    first, second, third = r["attempts"]
    assert first["resumed_from_step"] is None and first["end_reason"].startswith("preempted")
    assert second["resumed_from_step"] is not None and second["resumed_from_step"] > 0
    assert third["resumed_from_step"] >= second["resumed_from_step"]
    assert all(a["job_name"].startswith("projects/") and "/customJobs/" in a["job_name"]
               for a in r["attempts"])
    assert r["preemptions"] == 2 and r["escalated"]["to"] == "standard"
    assert r["metrics"]["test_accuracy"] > 0.6 and r["model_uri"].endswith("model.npz")
    assert r["timings_ms"]["upload_to_launch"] < 10_000
    # Attempt 1's preemption came with its job-state line; attempt 2's lines were all lost
    # (the schedule's drop_events), so only the tick's polling saw it: within one period.
    heard, polled = r["timings_ms"]["preemption_to_relaunch_each"]
    assert heard < 5_000 and polled <= r["tick_s"] * 1000 + 1500
    assert kinds(r)[0] == "run.created" and kinds(r)[-1] == "run.succeeded"
    assert kinds(r).count("attempt.preempted") == 2 and "run.escalated" in kinds(r)


def test_every_published_event_validates_against_its_schema() -> None:
    r = report("default")
    assert r["published"]
    for event in r["published"]:
        assert validate_event(event) == [], event


def test_alerts_reach_chat_and_email() -> None:
    r = report("default")
    channels = {a["channel"] for a in r["alerts"]}
    assert {"chat", "email"} <= channels
    assert {"channel": "email", "event_type": "dev.spotorch.run.succeeded.v1"} in r["alerts"]


def test_stockout_scenario_moves_to_standard_then_probes_its_way_back_to_spot() -> None:
    r = report("stockout")
    assert r["status"] == "SUCCEEDED", r.get("history")
    capacities = [a["capacity"] for a in r["attempts"]]
    assert capacities[:3] == ["spot", "spot", "standard"] and capacities[-1] == "spot"
    assert [a["region"] for a in r["attempts"][:2]] == ["us-central1", "europe-west4"]
    assert r["attempts"][0]["failure_class"] == "stockout"
    # On standard, Spot probes found capacity again; the run went back to Spot, resuming.
    standard, back = r["attempts"][2], r["attempts"][3]
    assert standard["end_reason"] == "cancelled (switch)" and back["resumed_from_step"]
    probes = r["probes"]
    assert probes and probes[-1]["found"] is True and r["counters"]["probes"] == len(probes)
    assert all(p["state"] == "CANCELLED" for p in probes)  # none left behind
    # A probe never counts as an attempt: no attempt has a probe's job, no budget moved.
    assert not {p["job_name"] for p in probes} & {a["job_name"] for a in r["attempts"]}
    assert r["counters"]["stockouts"] == 2 and len(r["attempts"]) == 4
    assert "spot_probed" in " ".join(kinds(r)) and "probe" in back_reason(r)
    assert r["cost"]["probes"] == len(probes)


def back_reason(r: dict[str, Any]) -> str:
    return str(r["escalated"]["reason"]) if r["escalated"] else ""


@pytest.mark.extended  # budgets: tests/test_service.py; alerts: the default scenario
def test_user_error_scenario_fails_with_its_budget_and_says_why() -> None:
    r = report("user-error")
    assert r["status"] == "FAILED"
    assert "user_errors budget exhausted" in r["end_reason"]
    assert [a["exit_code"] for a in r["attempts"]] == [1, 1]
    assert kinds(r)[-2:] == ["run.budget_exceeded", "run.failed"]


@pytest.mark.extended  # the default scenario loses attempt 2's job events: the same path
def test_lost_job_events_are_repaired_by_the_tick_within_one_period() -> None:
    r = run_demo(SCENARIOS["default"], timeout_s=180.0, quiet=True, lose_job_events=True)
    assert r["status"] == "SUCCEEDED", r.get("history")
    assert [a["capacity"] for a in r["attempts"]] == ["spot", "spot", "standard"]
    # Only polling saw the preemptions: the relaunch came at the next tick (plus handling time).
    assert r["timings_ms"]["preemption_to_relaunch"] <= r["tick_s"] * 1000 + 1500


def test_hardware_scenario_trains_on_the_cheapest_candidate_that_meets_the_deadline() -> None:
    r = report("hardware")
    assert r["status"] == "SUCCEEDED", r.get("history")
    table = r["hardware"]
    rows = {row["candidate"]: row for row in table["rows"]}
    assert len(rows) >= 3
    assert not rows["small"]["fit"] and rows["small"]["reason"].startswith("out of memory")
    # by the table's own figures: the cheapest fit candidate expected to meet the deadline
    meeting = [row for row in rows.values() if row["fit"] and row["meets_deadline"]]
    cheapest = min(meeting, key=lambda row: row["spot_cost"])
    assert table["chosen"] == cheapest["candidate"] == "l4"
    assert rows["cpu"]["meets_deadline"] is False  # too slow for the deadline
    assert rows["a100"]["spot_cost"] > rows["l4"]["spot_cost"]
    assert kinds(r)[:2] == ["run.created", "run.hardware_chosen"]
    # the run probed them itself (the functions launched, the tick followed): probes, no attempts
    assert len(r["probes"]) == 4 and r["counters"]["probes"] == 4
    assert all(p["state"] in ("SUCCEEDED", "FAILED", "CANCELLED") for p in r["probes"])
    assert not {p["job_name"] for p in r["probes"]} & {a["job_name"] for a in r["attempts"]}
    assert any(h["what"] == "status PROBING" for h in r["history"])
    # the run was billed on the chosen shape (an L4 and its host), not the pipeline's CPU pool
    assert r["cost"]["attempts"][0]["per_hour"] > 0.2


@pytest.mark.extended  # tests/test_health_examples.py and the service tests cover it
def test_hang_scenario_relaunches_a_hung_attempt_and_succeeds() -> None:
    r = report("hang")
    assert r["status"] == "SUCCEEDED", r.get("history")
    assert [a["failure_class"] for a in r["attempts"]] == ["hung", None]
    assert r["attempts"][1]["resumed_from_step"] is not None  # from its latest checkpoint


@pytest.mark.extended  # tests/test_health_examples.py and the service tests cover it
def test_diverge_scenario_stops_the_run_before_its_planned_steps() -> None:
    r = report("diverge")
    assert r["status"] == "FAILED_DIVERGED", r.get("history")
    assert "nonfinite_loss" in (r["end_reason"] or "") or "loss_spike" in (r["end_reason"] or "")
    assert len(r["attempts"]) == 1 and r["attempts"][0]["progress_reached"] < 120


@pytest.mark.extended  # tests/test_health_examples.py and the service tests cover it
def test_oom_scenario_moves_to_the_next_machine_and_succeeds() -> None:
    r = report("oom")
    assert r["status"] == "SUCCEEDED", r.get("history")
    first, second = r["attempts"]
    assert first["failure_class"] == "out_of_memory" and "OOMKilled" in first["end_reason"]
    assert second["machine_type"] == "n1-highmem-8"


def test_sweep_scenario_stops_one_trial_resumes_preempted_ones_and_registers_the_best() -> None:
    r = report("sweep")
    assert r["status"] == "SUCCEEDED", r.get("history")
    trials = r["trials"]
    assert len(trials) >= 4
    assert any(t["stopped_early"] for t in trials)
    assert any(t["preemptions"] and t["resumed_from_step"] is not None for t in trials)
    best = next(t for t in trials if t["trial"] == r["best"])
    assert best["status"] == "SUCCEEDED" and best["metric"] is not None
    assert r["model_name"].startswith("projects/") and "/models/" in r["model_name"]
    assert all(t["experiment_run"] for t in trials)
