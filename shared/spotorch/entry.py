"""What each Cloud Function does: decode its CloudEvent into a command and hand it to the service layer.

Kept light on purpose: nothing heavy is imported until a function's first event (cold starts).
"""

from __future__ import annotations

import base64
import binascii
import functools
import json
import time
from collections.abc import Callable, Mapping
from typing import Any

from spotorch.errors import InvalidEvent, SpotorchError
from spotorch.logs import logger

log = logger("spotorch.entry")

@functools.cache
def deps() -> Any:
    """The production dependencies, built once per instance on first use."""
    from spotorch.wiring import production_deps

    return production_deps()


def _attr(event: Any, name: str) -> str:
    try:
        return str(event[name])
    except (KeyError, TypeError):
        return ""


def _pubsub_message(event: Any) -> tuple[bytes, Mapping[str, str]]:
    """Data and attributes of the Pub/Sub message inside a messagePublished CloudEvent."""
    data = event.data if hasattr(event, "data") else None
    if not isinstance(data, Mapping) or not isinstance(data.get("message"), Mapping):
        raise InvalidEvent("not a Pub/Sub messagePublished event: data.message is missing")
    message = data["message"]
    try:
        body = base64.b64decode(message.get("data") or b"", validate=True)
    except (binascii.Error, ValueError, TypeError) as exc:
        raise InvalidEvent(f"message.data is not base64: {exc}") from None
    attributes = message.get("attributes") or {}
    if not isinstance(attributes, Mapping):
        raise InvalidEvent("message.attributes is not an object")
    return body, {str(k): str(v) for k, v in attributes.items()}


def guarded(name: str, handler: Callable[[Any], None]) -> Callable[[Any], None]:
    """Acknowledge and record events that can never succeed; let transient failures raise (retry)."""
    @functools.wraps(handler)
    def run(event: Any) -> None:
        event_id, event_type = _attr(event, "id"), _attr(event, "type")
        started = time.perf_counter()
        try:
            handler(event)
        except InvalidEvent as exc:
            log.warning(f"{name}: rejected event: {exc.reason}", event_id=event_id,
                        event_type=event_type, function=name)
            _record_rejected(event, event_id, event_type, exc.reason)
            return
        except SpotorchError as exc:  # a permanent problem with this event (unknown run/pipeline)
            log.error(f"{name}: {exc}", event_id=event_id, event_type=event_type, function=name)
            _record_rejected(event, event_id, event_type, str(exc))
            return
        log.debug(f"{name}: handled", event_id=event_id, event_type=event_type,
                  function=name, elapsed_ms=round((time.perf_counter() - started) * 1000, 1))
    return run


def _record_rejected(event: Any, event_id: str, event_type: str, reason: str) -> None:
    from spotorch.service import record_rejected

    try:
        record_rejected(deps().docs, event_id=event_id, event_type=event_type, reason=reason,
                        now=time.time(), payload=getattr(event, "data", None))
    except Exception as exc:  # recording is best effort; the log line above has the reason
        log.error(f"could not record rejected event: {exc}", event_id=event_id)


# ---------------------------------------------------------------- handlers

def object_event(event: Any) -> None:
    """GCS object finalized (Eventarc) or a GCS Pub/Sub notification: batch it, maybe start a run."""
    from spotorch import intake, triggers

    d = deps()
    obj = triggers.parse_object_event(_attr(event, "type"), _attr(event, "id"), event.data)
    ready = intake.handle_object_event(obj, pipelines=tuple(d.pipelines.values()), docs=d.docs,
                                       now=d.clock.now())
    for snap in ready:
        run = _start_snapshot_run(d, snap, "complete")
        log.info(f"snapshot {snap.snapshot_id} ready", run_id=run.run_id if run else None,
                 event_id=_attr(event, "id"), pipeline=snap.pipeline)


def _start_snapshot_run(d: Any, snap: Any, why: str) -> Any:
    """The one run of a completed snapshot; then the snapshot is marked dispatched."""
    from spotorch import intake
    from spotorch.service import start_run

    run = start_run(d, snap.pipeline, run_id=intake.run_id_for(snap.pipeline, snap.snapshot_id),
                    data_uri=snap.data_uri, snapshot_id=snap.snapshot_id,
                    reason=f"data snapshot {snap.data_uri} {why}")
    intake.mark_dispatched(snap, docs=d.docs)  # also when skipped: it must not come back
    return run


def job_event(event: Any) -> None:
    """A job state change (log sink or emulator) or a trainer report, both via Pub/Sub."""
    from spotorch_trainer import contract

    body, attributes = _pubsub_message(event)
    source = attributes.get(contract.ATTR_SOURCE, contract.SOURCE_JOB)
    _JOB_SOURCES.get(source, _job_state)(body, attributes, _attr(event, "id"))


def _job_state(body: bytes, attributes: Mapping[str, str], event_id: str) -> None:
    from spotorch.job_events import NotAJobStateChange, UnattributedJobUpdate, parse_job_message
    from spotorch.ports import LABEL_ATTEMPT, LABEL_RUN
    from spotorch.service import job_changed

    d = deps()
    try:
        update = parse_job_message(body, attributes)
        run_id, attempt, status = update.run_id, update.attempt, update.status
    except NotAJobStateChange:
        return  # a job's log line that reports no state: nothing to do, nothing wrong
    except UnattributedJobUpdate as unattributed:
        # A log-sink entry names the job, not the run: the job's own labels do.
        status = unattributed.status
        labels = d.launcher.get(status.job_name).labels
        if labels.get(LABEL_RUN) is None:
            return  # not one of ours
        run_id, attempt = labels[LABEL_RUN], int(labels.get(LABEL_ATTEMPT, "0"))
    run = job_changed(d, run_id, attempt, status, event_id=event_id)
    log.info(f"job {status.job_name} {status.phase}", run_id=run_id, event_id=event_id,
             status=str(run.status) if run else "unknown run")


def _trainer(body: bytes, attributes: Mapping[str, str], event_id: str) -> None:
    from spotorch.service import trainer_reported

    report, run_id, trainer_event_id = parse_trainer_message(body)
    run = trainer_reported(deps(), run_id, report, event_id=trainer_event_id or event_id)
    log.debug(f"trainer {report.kind} step {report.step}", run_id=run_id, event_id=event_id,
              status=str(run.status) if run else "unknown run")


_JOB_SOURCES: Mapping[str, Callable[[bytes, Mapping[str, str], str], None]] = {
    "job": _job_state,
    "trainer": _trainer,
}


def parse_trainer_message(body: bytes) -> tuple[Any, str, str]:
    """A trainer event (spotorch_trainer) as an observation, its run id and its stable id."""
    from spotorch.domain import TrainerReported
    from spotorch_trainer import contract
    from spotorch_trainer.contract import parse_rfc3339

    try:
        data = json.loads(body)
    except ValueError as exc:
        raise InvalidEvent(f"trainer event is not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise InvalidEvent("trainer event is not a JSON object")
    missing = [k for k in ("run_id", "attempt", "kind") if data.get(k) in (None, "")]
    if missing:
        raise InvalidEvent(f"trainer event lacks {', '.join(missing)}")
    if data["kind"] not in contract.EVENT_KINDS:
        raise InvalidEvent(f"unknown trainer event kind {data['kind']!r}")
    try:
        at = parse_rfc3339(str(data["time"])) if data.get("time") else time.time()
        report = TrainerReported(
            attempt=int(data["attempt"]), kind=str(data["kind"]), at=at,
            step=None if data.get("step") is None else int(data["step"]),
            total_steps=None if data.get("total_steps") is None else int(data["total_steps"]),
            checkpoint_uri=data.get("checkpoint_uri") or None,
            metrics={str(k): float(v) for k, v in (data.get("metrics") or {}).items()
                     if isinstance(v, int | float)},
            exit_code=None if data.get("exit_code") is None else int(data["exit_code"]))
    except (TypeError, ValueError) as exc:
        raise InvalidEvent(f"trainer event has a bad field: {exc}") from None
    return report, str(data["run_id"]), str(data.get("event_id") or "")


def tick_event(event: Any) -> None:
    """The reconcile tick (Cloud Scheduler via Pub/Sub)."""
    from spotorch import intake
    from spotorch.service import tick

    d = deps()
    for snap in intake.close_due_snapshots(pipelines=tuple(d.pipelines.values()), docs=d.docs,
                                           now=d.clock.now()):
        _start_snapshot_run(d, snap, "closed by the tick")
    runs = tick(d)
    log.info(f"tick: {len(runs)} active runs reconciled", event_id=_attr(event, "id"))


def run_event(event: Any) -> None:
    """The notifier: one subscriber of spotorch's own events, sending Chat, Slack and email alerts."""
    from spotorch.notify import handle_pubsub_cloudevent

    deliveries = handle_pubsub_cloudevent(event)
    log.info(f"notifier: {len(deliveries)} deliveries", event_id=_attr(event, "id"))


# What each Cloud Function runs: its handler, guarded so bad events are acknowledged and recorded.
on_object_finalized = guarded("on_object_finalized", object_event)
on_job_event = guarded("on_job_event", job_event)
on_tick = guarded("on_tick", tick_event)
on_run_event = guarded("on_run_event", run_event)
