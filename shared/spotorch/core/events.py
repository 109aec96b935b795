"""spotorch's own CloudEvents: the catalog of types, building them, their Pub/Sub form."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from spotorch_trainer.contract import rfc3339

TYPE_PREFIX = "dev.spotorch."
TYPE_VERSION = "v1"
SPEC_VERSION = "1.0"
CONTENT_TYPE = "application/cloudevents+json"  # Pub/Sub attribute: data is a structured event

# Short kind -> what it means. The full type is dev.spotorch.<kind>.v1 (see docs/events.md).
EVENT_KINDS: Mapping[str, str] = {
    "run.created": "a run was created for a data snapshot or a manual submit",
    "attempt.launched": "an attempt's training job was created",
    "attempt.preempted": "an attempt's Spot VMs were taken back",
    "attempt.ended": "an attempt ended for another reason (success, failure class, cancel)",
    "run.escalated": "the run moved between Spot and standard VMs",
    "run.succeeded": "the run finished with a trained model",
    "run.failed": "the run ended without a model; the reason says why",
    "run.cancelled": "the run was cancelled by an operator or superseded",
    "run.budget_exceeded": "a retry budget or the cost budget ran out",
    "run.deadline_at_risk": "the deadline can no longer be met on Spot alone",
    "run.hardware_chosen": "the run's machine shape was chosen from probe measurements",
    "run.spot_probed": "a Spot capacity probe of a run on standard VMs answered (found or not)",
    # issue 31: the preprocess step (Apache Beam on Dataflow) before training
    "run.preprocess_started": "the run's preprocess step launched its Dataflow job",
    "run.preprocess_ended": "the preprocess step ended: its output complete (or reused from the "
                            "cache), or its job failed or was cancelled",
    # Sweeps (spotorch.core.sweeps): the event's run_id is the sweep id; subject runs/<sweep id>.
    "sweep.created": "a hyperparameter sweep was created and its trials planned",
    "sweep.trial_started": "a trial of a sweep was started as a run of its own",
    "sweep.trial_stopped": "the median stopping rule stopped a trial early",
    "sweep.trial_ended": "a trial's run ended (succeeded, failed, stopped or cancelled)",
    "sweep.succeeded": "every trial ended; the best trial (and its registered model) is named",
    "sweep.failed": "every trial ended and none succeeded with a value of the metric",
    "sweep.cancelled": "the sweep was cancelled and its trials stopped",
    # training health
    "attempt.hung": "an attempt's trainer went silent while its job ran: cancelled, relaunched",
    "run.step_rate_degraded": "the step rate fell far below the run's own median",
    "run.straggler": "one training replica's own step time stayed far above the others'",
    "run.diverged": "a divergence rule fired (non-finite loss, loss spike, loss plateau)",
    "run.checkpoint_stale": "no new checkpoint for checkpoint_stale_after while running",
    "run.machine_changed": "out of memory: the next attempt takes a larger machine",
    "run.checkpoints_deleted": "checkpoints were deleted (retention, or after a divergence)",
    # Data arrival: the event's run_id names the upload's folder record (upload-<digest>).
    # BigQuery snapshots (trigger.bigquery): the event's run_id names the snapshot (snapshot-<id>).
    "snapshot.failed": "a BigQuery snapshot was given up: its snapshot query or extract job "
                       "failed on every attempt; the jobs, reasons and messages",
    # issue 37: the promotion gate (spotorch.core.promotion); one per registered version
    "model.promoted": "a registered version passed the promotion gate and took its alias",
    "model.rejected": "a registered version did not pass the promotion gate: registered without "
                      "the alias, and why",
    "upload.unmatched": "objects landed in a watched bucket, matched no pipeline, and stayed "
                        "quiet: the rule each missed and what each pipeline expects",
}

# Kinds after which a run never changes again.
TERMINAL_KINDS = frozenset({"run.succeeded", "run.failed", "run.cancelled",
                            "sweep.succeeded", "sweep.failed", "sweep.cancelled"})

_TYPE_RE = re.compile(
    r"^dev\.spotorch\.(?P<kind>[a-z][a-z_]*\.[a-z][a-z_]*)\.(?P<version>v[1-9][0-9]*)$")



def event_type(kind: str) -> str:
    """Full CloudEvents type of a kind, e.g. run.failed -> dev.spotorch.run.failed.v1."""
    if kind not in EVENT_KINDS:
        raise ValueError(f"unknown spotorch event kind {kind!r}")
    return f"{TYPE_PREFIX}{kind}.{TYPE_VERSION}"


def _parse_type(type_: str) -> re.Match[str]:
    match = _TYPE_RE.match(type_) if isinstance(type_, str) else None
    if match is None:
        raise ValueError(f"not a spotorch event type: {type_!r}")
    return match


def kind_of(type_: str) -> str:
    """Short kind of a full type (the inverse of event_type); the kind need not be known yet."""
    return _parse_type(type_)["kind"]


def version_of(type_: str) -> str:
    """Version suffix of a full type, e.g. dev.spotorch.run.failed.v1 -> v1."""
    return _parse_type(type_)["version"]


def build_event(*, run_id: str, pipeline: str, sequence: int, kind: str,
                data: Mapping[str, Any], time: float) -> dict[str, Any]:
    """A structured-mode CloudEvent whose id, {run_id}:{sequence}, is stable for deduping."""
    return {
        "specversion": SPEC_VERSION,
        "id": f"{run_id}:{sequence}",
        "source": f"//spotorch/pipelines/{pipeline}",
        "type": event_type(kind),
        "subject": f"runs/{run_id}",
        "time": rfc3339(time),
        "datacontenttype": "application/json",
        "data": {"run_id": run_id, "pipeline": pipeline, **data},
    }


def to_pubsub(event: Mapping[str, Any]) -> tuple[bytes, dict[str, str], str]:
    """Message data (the structured event), attributes to filter on, the ordering key (the run)."""
    data = event["data"]
    attributes = {
        "content-type": CONTENT_TYPE,
        "type": str(event["type"]),
        "pipeline": str(data.get("pipeline", "")),
        "run_id": str(data.get("run_id", "")),
        "event_id": str(event["id"]),
    }
    return json.dumps(event, sort_keys=True).encode(), attributes, str(data.get("run_id", ""))


def from_pubsub(data: bytes) -> dict[str, Any]:
    """The structured CloudEvent carried in a Pub/Sub message; ValueError when it is not one."""
    try:
        event = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"message is not JSON: {exc}") from exc
    if not isinstance(event, dict) or not {"id", "type", "data"} <= event.keys():
        raise ValueError("message is not a structured CloudEvent")
    return event
