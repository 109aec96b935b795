"""spotorch's CloudEvents: catalog, envelope, Pub/Sub form and JSON Schemas."""

from __future__ import annotations

import base64
import copy
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from spotorch.core import events
from spotorch.core.events import EVENT_KINDS, build_event, event_type, from_pubsub, kind_of, to_pubsub
from spotorch.core.model import FailureClass
from spotorch.core.pipeline import Capacity
from spotorch.spec import event_schemas
from spotorch.spec.event_schemas import find_schemas_dir, validate_event

ROOT = Path(__file__).resolve().parent.parent
SCHEMAS = ROOT / "schemas" / "events"
T0 = 1_764_424_992.5

_TRIAL: dict[str, Any] = {"trial": 2, "trial_run_id": "sw-1-t2", "params": {"lr": 0.01, "batch": 64},
             "status": "SUCCEEDED", "metric": 0.31, "step": 40, "stopped_early": False,
             "cost": 0.12, "preemptions": 1, "experiment_run": "churn-sw-1-t2"}
_RESULT: dict[str, Any] = {"reason": "best trial 2", "metric": "loss", "goal": "minimize",
                           "trials": 4, "stopped_early": 1, "best": _TRIAL,
                           "model_name": "projects/p/locations/us-central1/models/churn@3",
                           "cost_estimate": 0.5}

# What the domain emits for each kind (the list), with sample values.
SAMPLES: dict[str, dict[str, Any]] = {
    "run.created": {"status": "pending", "data_uri": "gs://b/daily/2025-11-29/",
                    "snapshot_id": "daily/2025-11-29", "deadline": None,
                    "reason": "snapshot complete"},
    "attempt.launched": {"attempt": 1, "capacity": "spot", "region": "us-central1",
                         "job_name": None, "resumed_from_step": None, "resumed_from_uri": None},
    "attempt.preempted": {"attempt": 1, "capacity": "spot",
                          "job_name": "projects/p/locations/us-central1/customJobs/1",
                          "progress_step": None, "preemptions": 1},
    "attempt.ended": {"attempt": 2, "capacity": "standard", "job_name": None, "state": "SUCCEEDED",
                      "end_reason": "succeeded", "failure_class": None, "exit_code": None},
    "run.escalated": {"from": "spot", "to": "standard", "reason": "3 preemptions"},
    "run.succeeded": {"status": "succeeded", "attempts": 2, "preemptions": 1,
                      "cost_estimate": None, "model_uri": "gs://m/churn/r1"},
    "run.failed": {"status": "failed", "reason": "user errors", "failure_class": "user_error",
                   "attempts": 1, "preemptions": 0},
    "run.cancelled": {"status": "cancelled", "reason": "operator"},
    "run.budget_exceeded": {"budget": "cost", "limit": 10.0, "used": 10.5},
    "run.deadline_at_risk": {"deadline": "2025-11-30T06:00:00Z", "remaining_work_s": None,
                             "time_left_s": -30.0, "action": "escalate"},
    "run.hardware_chosen": {"chosen": "l4", "reason": "cheapest", "warning": "",
                            "expected_compute_s": 9000.0, "deadline_s": None,
                            "rows": [{"candidate": "l4", "shape": "g2-standard-8", "fit": True,
                                      "reason": "chosen", "steps_per_s": 4.0,
                                      "meets_deadline": None, "chosen": True}]},
    "sweep.created": {"sweep_id": "sw-1", "status": "RUNNING", "trials": 4, "parallelism": 2,
                      "metric": "loss", "goal": "minimize", "search": "grid",
                      "data_uri": "gs://b/daily/2025-11-29/"},
    "sweep.trial_started": {"sweep_id": "sw-1", "trial": 1, "trial_run_id": "sw-1-t1",
                            "params": {"lr": 0.1}},
    "sweep.trial_stopped": {"sweep_id": "sw-1", "trial": 3, "trial_run_id": "sw-1-t3", "step": 20,
                            "value": 0.9, "median": 0.4, "reason": "median stopping"},
    "sweep.trial_ended": {"sweep_id": "sw-1", **_TRIAL},
    "sweep.succeeded": {"sweep_id": "sw-1", **_RESULT, "status": "SUCCEEDED"},
    "sweep.failed": {"sweep_id": "sw-1", **_RESULT, "status": "FAILED", "best": None,
                     "model_name": None},
    "sweep.cancelled": {"sweep_id": "sw-1", **_RESULT, "status": "CANCELLED", "best": None,
                        "model_name": None},
    # training health (issue 16)
    "attempt.hung": {"attempt": 1, "job_name": "projects/p/locations/us-central1/customJobs/1",
                     "step": 40, "silent_s": 130.0, "hang_after_s": 120.0, "last_report": None,
                     "reason": "no trainer report for 130s (hang_after 120s)"},
    "run.step_rate_degraded": {"attempt": 1, "step": 90, "rate": 0.5, "median": 4.0,
                               "fraction": 0.5, "reason": "slow", "action": "warn"},
    "run.straggler": {"attempt": 1, "step": 90, "rank": 1, "replica": "workerpool1-0",
                      "step_s": 0.3, "median_s": 0.1, "factor": 1.5, "reason": "slow",
                      "action": "warn"},
    "run.diverged": {"attempt": 1, "rule": "nonfinite_loss", "step": 70,
                     "values": {"loss": None, "best": 0.3}, "reason": "loss is nan at step 70",
                     "action": "relaunch", "resume_step": 60},
    "run.checkpoint_stale": {"attempt": 1, "step": 10, "checkpoint_step": None,
                             "since_s": 3700.0, "stale_after_s": 3600.0, "reason": "stale"},
    "run.machine_changed": {"from": "n1-standard-4", "to": "n1-highmem-8", "attempt": 1,
                            "reason": "out of memory on n1-standard-4"},
    "run.checkpoints_deleted": {"steps": [10, 20], "bytes_reclaimed": 2048,
                                "total_bytes_reclaimed": 4096, "reason": "retention"},
    "run.spot_probed": {"probe": 2, "region": "us-central1", "found": True, "switching": True,
                        "reason": "probe 2 found Spot capacity in us-central1"},
    "run.preprocess_started": {"job_name": "spotorch-r-20251129-1-pre1", "launch": 1,
                               "region": "us-central1", "cache_key": "0123456789abcdef0123",
                               "output_uri": "gs://prep/churn/0123456789abcdef0123/",
                               "previous_error": None},
    "run.preprocess_ended": {"phase": "FAILED", "state": "JOB_STATE_FAILED", "cache_hit": False,
                             "job_name": "spotorch-r-20251129-1-pre1", "job_id": "j-1",
                             "output_uri": "gs://prep/churn/0123456789abcdef0123/",
                             "cache_key": "0123456789abcdef0123", "failure_class": "user_error",
                             "error": "ValueError: bad row", "cost": 0.01},
    "snapshot.failed": {"snapshot_id": "0123456789abcdef", "tables": ["p.d.t"],
                        "snapshot_time": "2025-11-29T14:03:12.345Z", "phase": "export",
                        "job_id": "spotorch-export-0123456789abcdef-0-a3", "reason": "notFound",
                        "message": "Not found: Bucket b", "attempts": 3,
                        "failures": [{"part": "0", "phase": "export", "attempt": 3,
                                      "job_id": "spotorch-export-0123456789abcdef-0-a3",
                                      "reason": "notFound", "message": "Not found: Bucket b"}]},
    "model.promoted": {"model_name": "projects/p/locations/us-central1/models/churn@2",
                       "model": "projects/p/locations/us-central1/models/churn",
                       "alias": "production", "promoted": True, "rule": "improved",
                       "reason": "accuracy 0.91 beats the champion's 0.874 by 0.036",
                       "metric": "accuracy", "value": 0.91,
                       "champion": "projects/p/locations/us-central1/models/churn@2",
                       "replaced": "projects/p/locations/us-central1/models/churn@1",
                       "evaluation": "folder gs://b/holdout/", "latency_p95_ms": 12.5},
    "model.rejected": {"model_name": "projects/p/locations/us-central1/models/churn@3",
                       "model": "projects/p/locations/us-central1/models/churn",
                       "alias": "production", "promoted": False, "rule": "margin",
                       "reason": "accuracy 0.706 does not beat the champion's 0.874 by 0.01",
                       "metric": "accuracy", "value": 0.706,
                       "champion": "projects/p/locations/us-central1/models/churn@2",
                       "replaced": None, "evaluation": "folder gs://b/holdout/",
                       "latency_p95_ms": None},
    "upload.unmatched": {"bucket": "b", "folder": "daily/x/", "uri": "gs://b/daily/x/",
                         "objects": ["daily/x/_SUCCESS"], "more_objects": False,
                         "first_seen": "2025-11-29T14:03:12.345Z", "last_seen": None,
                         "reasons": [{"pipeline": "churn", "rule": "selection",
                                      "expected": {"bucket": "b", "prefix": "daily/",
                                                   "batch": "marker", "marker": "_DONE"},
                                      "text": "excluded; marker _DONE"}],
                         "reason": "excluded; marker _DONE"},
}

# One way to break each kind: (data field, wrong value or None to drop it).
BREAKS: dict[str, tuple[str, Any]] = {
    "run.created": ("deadline", "tomorrow morning"),
    "attempt.launched": ("capacity", "preemptible"),
    "attempt.preempted": ("preemptions", None),
    "attempt.ended": ("failure_class", "bad luck"),
    "run.escalated": ("to", "gpu"),
    "run.succeeded": ("attempts", "2"),
    "run.failed": ("reason", 17),
    "run.cancelled": ("status", 3),
    "run.budget_exceeded": ("used", None),
    "run.deadline_at_risk": ("time_left_s", "soon"),
    "run.hardware_chosen": ("rows", []),
    "sweep.created": ("goal", "lowest"),
    "sweep.trial_started": ("params", "lr=0.1"),
    "sweep.trial_stopped": ("median", None),
    "sweep.trial_ended": ("stopped_early", "no"),
    "sweep.succeeded": ("model_name", "churn-model"),
    "sweep.failed": ("trials", -1),
    "sweep.cancelled": ("cost_estimate", None),
    "attempt.hung": ("silent_s", None),
    "run.step_rate_degraded": ("action", "panic"),
    "run.straggler": ("replica", "the slow one"),
    "run.diverged": ("rule", "bad vibes"),
    "run.checkpoint_stale": ("since_s", -1),
    "run.machine_changed": ("to", ""),
    "run.checkpoints_deleted": ("bytes_reclaimed", 1.5),
    "run.spot_probed": ("found", "yes"),
    "run.preprocess_started": ("cache_key", "not-a-key"),
    "run.preprocess_ended": ("phase", "RUNNING"),
    "snapshot.failed": ("phase", "query"),
    "model.promoted": ("rule", "margin"),
    "model.rejected": ("promoted", True),
    "upload.unmatched": ("objects", []),
}


def sample(kind: str, sequence: int = 4, **overrides: Any) -> dict[str, Any]:
    return build_event(run_id="r-20251129-1", pipeline="churn", sequence=sequence, kind=kind,
                       data={**SAMPLES[kind], **overrides}, time=T0)


def test_catalog_samples_and_schemas_cover_the_same_kinds() -> None:
    schema_kinds = {p.name.removesuffix(".v1.schema.json")
                    for p in SCHEMAS.glob("*.v1.schema.json")}
    assert schema_kinds == set(EVENT_KINDS) == set(SAMPLES) == set(BREAKS)


@pytest.mark.parametrize("kind", sorted(EVENT_KINDS))
def test_every_kind_built_with_sample_data_validates(kind: str) -> None:
    event = sample(kind)
    assert event["type"] == f"dev.spotorch.{kind}.v1"
    assert kind_of(event["type"]) == kind
    assert validate_event(event) == []


@pytest.mark.parametrize("kind", sorted(EVENT_KINDS))
def test_a_wrong_field_fails_its_schema(kind: str) -> None:
    event = sample(kind)
    name, value = BREAKS[kind]
    if value is None:
        del event["data"][name]
    else:
        event["data"][name] = value
    problems = validate_event(event)
    assert problems and all(p.startswith("data") for p in problems), problems
    assert any(name in p for p in problems), problems


@pytest.mark.parametrize("kind", sorted(EVENT_KINDS))
def test_schema_examples_validate(kind: str) -> None:
    schema = json.loads((SCHEMAS / f"{kind}.v1.schema.json").read_text())
    assert schema["examples"] and all(validate_event(ex) == [] for ex in schema["examples"])


def test_extra_fields_are_allowed_everywhere() -> None:
    event = sample("run.failed", extra_field={"anything": 1})
    event["traceparent"] = "00-abc-def-01"  # a CloudEvents extension attribute
    assert validate_event(event) == []


def test_data_for_one_kind_does_not_pass_as_another() -> None:
    event = sample("run.cancelled")
    event["type"] = event_type("run.succeeded")
    assert any("attempts" in p for p in validate_event(event))


@pytest.mark.parametrize(("key", "value", "needle"), [
    ("type", "dev.spotorch.run.exploded.v1", "unknown event type"),
    ("type", "com.example.thing", "type"),
    ("specversion", "0.3", "specversion"),
    ("time", "2025-11-29 14:03", "time"),
    ("subject", "runs/someone-else", "subject"),
    ("source", "//spotorch/pipelines/other", "source"),
    ("id", "r-other:4", "id"),
    ("datacontenttype", "text/plain", "datacontenttype"),
])
def test_envelope_problems_are_reported(key: str, value: str, needle: str) -> None:
    event = sample("run.cancelled")
    event[key] = value
    problems = validate_event(event)
    assert any(p.startswith(needle) or needle in p for p in problems), problems


def test_missing_run_id_and_not_an_object() -> None:
    event = sample("run.cancelled")
    del event["data"]["run_id"]
    assert any("run_id" in p for p in validate_event(event))
    assert validate_event([]) == ["<event>: event is not a JSON object"]  # type: ignore[arg-type]


def test_failure_classes_and_capacities_match_the_ports() -> None:
    envelope = json.loads((SCHEMAS / "envelope.schema.json").read_text())
    assert set(envelope["$defs"]["failure_class"]["enum"]) == {c.value for c in FailureClass}
    assert set(envelope["$defs"]["capacity"]["enum"]) == {c.value for c in Capacity}


def test_build_event_envelope() -> None:
    event = sample("run.failed", sequence=12)
    assert event["id"] == "r-20251129-1:12"
    assert event["source"] == "//spotorch/pipelines/churn"
    assert event["subject"] == "runs/r-20251129-1"
    assert event["time"] == "2025-11-29T14:03:12.500Z"
    assert event["data"]["run_id"] == "r-20251129-1" and event["data"]["pipeline"] == "churn"
    with pytest.raises(ValueError, match="unknown spotorch event kind"):
        build_event(run_id="r", pipeline="p", sequence=1, kind="run.exploded", data={}, time=T0)


def test_kind_and_version_parsing() -> None:
    assert kind_of("dev.spotorch.run.deadline_at_risk.v1") == "run.deadline_at_risk"
    assert events.version_of("dev.spotorch.run.failed.v2") == "v2"
    for bad in ("dev.spotorch.run.failed", "com.example.run.failed.v1", "dev.spotorch.x.v1"):
        with pytest.raises(ValueError):
            kind_of(bad)


def test_pubsub_round_trip() -> None:
    event = sample("attempt.preempted")
    data, attributes, ordering_key = to_pubsub(event)
    assert from_pubsub(data) == event
    assert ordering_key == "r-20251129-1"
    assert attributes == {"content-type": "application/cloudevents+json",
                          "type": "dev.spotorch.attempt.preempted.v1", "pipeline": "churn",
                          "run_id": "r-20251129-1", "event_id": "r-20251129-1:4"}
    assert all(isinstance(v, str) for v in attributes.values())  # Pub/Sub wants strings
    # What a push subscription or Eventarc hands a function: base64 of the same bytes.
    assert from_pubsub(base64.b64decode(base64.b64encode(data))) == event


@pytest.mark.parametrize("data", [b"not json", b"[1, 2]", b'{"id": "x"}', b"\xff\xfe"])
def test_from_pubsub_rejects_what_is_not_a_structured_event(data: bytes) -> None:
    with pytest.raises(ValueError):
        from_pubsub(data)


def test_schemas_found_in_repo_bundle_or_env(tmp_path: Path) -> None:
    # repo: <root>/shared/spotorch -> <root>/schemas/events
    assert find_schemas_dir() == SCHEMAS
    # bundle: <bundle>/spotorch next to <bundle>/schemas/events
    bundle = tmp_path / "bundle"
    shutil.copytree(SCHEMAS, bundle / "schemas" / "events")
    (bundle / "spotorch").mkdir()
    assert find_schemas_dir(bundle / "spotorch", environ={}) == bundle / "schemas" / "events"
    # an explicit directory wins
    assert find_schemas_dir(tmp_path / "x", environ={event_schemas.SCHEMAS_ENV: str(SCHEMAS)}) == SCHEMAS
    with pytest.raises(event_schemas.SchemasNotFound, match="SPOTORCH_SCHEMAS_DIR"):
        find_schemas_dir(tmp_path / "nowhere" / "spotorch", environ={})


def test_validation_works_from_a_bundle_layout(tmp_path: Path) -> None:
    """The deploy bundle ships spotorch/ and schemas/ side by side; validation must work there."""
    bundle = tmp_path / "bundle"
    shutil.copytree(ROOT / "shared" / "spotorch", bundle / "spotorch",
                    ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(SCHEMAS, bundle / "schemas" / "events")
    event = copy.deepcopy(sample("run.succeeded"))
    code = ("import json, sys, spotorch.spec.event_schemas as e; ev = json.loads(sys.argv[1]); "
            "found = e.find_schemas_dir(); "
            "assert found.parent.parent == e.Path(sys.argv[2]), found; "
            "print(json.dumps(e.validate_event(ev)))")
    out = subprocess.run([sys.executable, "-c", code, json.dumps(event), str(bundle)],
                         cwd=bundle, capture_output=True, text=True, timeout=60,
                         env={"PYTHONPATH": str(bundle), "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == []
