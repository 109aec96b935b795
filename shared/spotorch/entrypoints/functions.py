"""What each Cloud Function does: decode its CloudEvent into a command and hand it to the service layer.

Kept light on purpose: nothing heavy is imported until a function's first event (cold starts).
Every exception is classified here, at the boundary: bad input and unknown things are acknowledged
and recorded in `rejected_events` (redelivering them could never help); transient failures raise,
so Pub/Sub delivers the message again.
"""

from __future__ import annotations

import base64
import binascii
import functools
import json
import logging
import math
import os
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

from spotorch.core.errors import InvalidEvent, SpotorchError
from spotorch.logs import METRIC_FIELD, METRIC_TICK, setup_logging

if TYPE_CHECKING:
    from spotorch.app.deps import Deps
    from spotorch.core.observations import TrainerReported
    from spotorch.entrypoints.log_entries import StateLines

log = logging.getLogger("spotorch.entrypoints.functions")


class CloudEventLike(Protocol):
    """What functions-framework hands a CloudEvent function (a cloudevents CloudEvent)."""

    data: Any

    def __getitem__(self, key: str) -> Any: ...


@functools.cache
def deps() -> Deps:
    """The production dependencies, built once per instance on first use."""
    from spotorch.entrypoints.wiring import production_deps

    setup_logging()
    return production_deps()


STATE_LINES_ENV = "SPOTORCH_JOB_STATE_LINES"  # JSON [[pattern, phase], ...], first match wins


@functools.cache
def state_lines() -> StateLines:
    """The service lines that name job states: the built-in table, or SPOTORCH_JOB_STATE_LINES."""
    from spotorch.entrypoints.log_entries import DEFAULT_STATE_LINES, StateLines

    raw = os.environ.get(STATE_LINES_ENV)
    if not raw:
        return DEFAULT_STATE_LINES
    table = json.loads(raw)  # a broken setting fails loudly at the first job event
    return StateLines.from_table([(str(pattern), str(phase)) for pattern, phase in table])


def _attr(event: CloudEventLike, name: str) -> str:
    try:
        return str(event[name])
    except (KeyError, TypeError):
        return ""


# ---------------------------------------------------------------- decoding

MAX_MESSAGE_BYTES = 1 << 20  # larger than any message spotorch's producers send
MAX_ID_LEN = 128
MAX_INT = 2 ** 53  # steps, attempts, exit codes: past this nothing is a real count
MAX_METRICS = 64


def _pubsub_message(event: CloudEventLike) -> tuple[bytes, Mapping[str, str]]:
    """Data and attributes of the Pub/Sub message inside a messagePublished CloudEvent."""
    data = getattr(event, "data", None)
    if not isinstance(data, Mapping) or not isinstance(data.get("message"), Mapping):
        raise InvalidEvent("not a Pub/Sub messagePublished event: data.message is missing")
    message = data["message"]
    raw = message.get("data") or b""
    if not isinstance(raw, str | bytes) or len(raw) > MAX_MESSAGE_BYTES * 4 // 3 + 4:
        raise InvalidEvent("message.data is not a base64 string of at most 1 MiB")
    try:
        body = base64.b64decode(raw, validate=True)
    except (binascii.Error, ValueError, TypeError) as exc:
        raise InvalidEvent(f"message.data is not base64: {exc}") from None
    from spotorch.entrypoints.depth import too_deep

    deep = too_deep(body)  # before any json.loads of it (a RecursionError otherwise)
    if deep is not None:
        raise InvalidEvent(f"message.data: {deep}")
    attributes = message.get("attributes") or {}
    if not isinstance(attributes, Mapping):
        raise InvalidEvent("message.attributes is not an object")
    return body, {str(k): str(v) for k, v in attributes.items()}


def _count(value: Any, what: str, *, low: int = 0) -> int:
    """A whole number in [low, MAX_INT]: JSON ints only (no floats, booleans, Infinity)."""
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise InvalidEvent(f"{what} is not an integer: {str(value)[:40]!r}")
    if isinstance(value, str):
        if not value.isascii() or not value.strip().lstrip("-").isdigit() or len(value) > 20:
            raise InvalidEvent(f"{what} is not an integer: {value[:40]!r}")
        value = int(value)
    number = int(value)
    if not low <= number <= MAX_INT:
        raise InvalidEvent(f"{what} {number} is out of range [{low}, {MAX_INT}]")
    return number


def _optional_count(data: Mapping[str, Any], key: str, *, low: int = 0) -> int | None:
    return None if data.get(key) is None else _count(data[key], key, low=low)


def _nonfinite(value: Any) -> tuple[str, ...]:
    """The trainer's list of metric names whose value was NaN or infinite (training health)."""
    if value is None:
        return ()
    if not isinstance(value, list) or len(value) > MAX_METRICS or not all(
            isinstance(k, str) and 0 < len(k) <= MAX_ID_LEN for k in value):
        raise InvalidEvent("nonfinite is not a list of metric names")
    return tuple(sorted(set(value)))


def _seconds(data: Mapping[str, Any], key: str) -> float | None:
    value = data.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) \
            or not 0 <= value <= 1e9:
        raise InvalidEvent(f"{key} is not a number of seconds: {str(value)[:40]!r}")
    return float(value)


MAX_REPLICAS_REPORTED = 512  # replica_step_s entries a report may carry (one per training rank)


def _replica_step_s(value: Any) -> tuple[float, ...]:
    """The chief's per-rank mean step times (straggler rule); absent: ()."""
    if value is None:
        return ()
    if not isinstance(value, list) or len(value) > MAX_REPLICAS_REPORTED or not all(
            not isinstance(t, bool) and isinstance(t, int | float) and math.isfinite(t)
            and 0 <= t <= 1e9 for t in value):
        raise InvalidEvent(f"replica_step_s is not a list of at most {MAX_REPLICAS_REPORTED} "
                           "numbers of seconds")
    return tuple(float(t) for t in value)


def _metrics(value: Any, nonfinite: tuple[str, ...] = ()) -> dict[str, float]:
    """Named finite numbers, at most MAX_METRICS of them; null only for a name in nonfinite."""
    if value is None:
        return {}
    if isinstance(value, Mapping):
        value = {k: v for k, v in value.items() if not (v is None and k in nonfinite)}
    if not isinstance(value, Mapping):
        raise InvalidEvent(f"metrics is not an object of numbers: {str(value)[:40]!r}")
    if len(value) > MAX_METRICS:
        raise InvalidEvent(f"metrics has {len(value)} entries, more than {MAX_METRICS}")
    out: dict[str, float] = {}
    for key, number in value.items():
        if not isinstance(key, str) or not 0 < len(key) <= MAX_ID_LEN:
            raise InvalidEvent(f"metric name {str(key)[:40]!r} is empty or too long")
        if isinstance(number, bool) or not isinstance(number, int | float) \
                or not math.isfinite(number) or abs(number) > 1e300:
            raise InvalidEvent(f"metric {key[:40]!r} is not a finite number: {str(number)[:40]!r}")
        out[key] = float(number)
    return out


def parse_trainer_message(body: bytes) -> tuple[TrainerReported, str, str]:
    """A trainer event (spotorch_trainer) as an observation, its run id and its stable id."""
    from spotorch.core.ids import check_id, check_token
    from spotorch.core.observations import TrainerReported
    from spotorch_trainer import contract
    from spotorch_trainer.contract import parse_rfc3339

    try:
        data = json.loads(body)
    except (ValueError, RecursionError) as exc:
        raise InvalidEvent(f"trainer event is not JSON: {str(exc)[:80]}") from None
    if not isinstance(data, dict):
        raise InvalidEvent("trainer event is not a JSON object")
    missing = [k for k in ("run_id", "attempt", "kind") if data.get(k) in (None, "")]
    if missing:
        raise InvalidEvent(f"trainer event lacks {', '.join(missing)}")
    if data["kind"] not in contract.EVENT_KINDS:
        raise InvalidEvent(f"unknown trainer event kind {str(data['kind'])[:40]!r}")
    run_id = check_id(data["run_id"], "run_id")
    event_id = "" if data.get("event_id") in (None, "") else check_token(data["event_id"], "event_id")
    try:
        at = parse_rfc3339(str(data["time"])[:64]) if data.get("time") else time.time()
    except ValueError:
        raise InvalidEvent(f"time is not an RFC 3339 timestamp: {str(data['time'])[:40]!r}") \
            from None
    uri = data.get("checkpoint_uri") or None
    if uri is not None and (not isinstance(uri, str) or len(uri) > 2048):
        raise InvalidEvent("checkpoint_uri is not a string of at most 2048 characters")
    nonfinite = _nonfinite(data.get("nonfinite"))
    report = TrainerReported(
        attempt=_count(data["attempt"], "attempt", low=1), kind=str(data["kind"]), at=at,
        step=_optional_count(data, "step"), total_steps=_optional_count(data, "total_steps", low=1),
        checkpoint_uri=uri, metrics=_metrics(data.get("metrics"), nonfinite),
        exit_code=None if data.get("exit_code") is None
        else _count(data["exit_code"], "exit_code", low=-MAX_INT),
        nonfinite=nonfinite, report_interval_s=_seconds(data, "report_interval_s"),
        checkpoint_s=_seconds(data, "checkpoint_s"),
        replica_step_s=_replica_step_s(data.get("replica_step_s")))
    return report, run_id, event_id


# ---------------------------------------------------------------- the boundary


def _transient(exc: BaseException) -> bool:
    """Whether trying the same message again later may succeed."""
    from spotorch.ports.jobs import LaunchError
    from spotorch.ports.store import ConflictError

    if isinstance(exc, LaunchError):
        return not exc.permanent
    if isinstance(exc, ConflictError | ConnectionError | TimeoutError):
        return True
    try:
        from google.api_core import exceptions as gexc
    except ImportError:  # pragma: no cover - google-api-core comes with every client
        return False
    return isinstance(exc, gexc.ServiceUnavailable | gexc.DeadlineExceeded | gexc.TooManyRequests
                      | gexc.Aborted | gexc.InternalServerError | gexc.GatewayTimeout
                      | gexc.RetryError | gexc.BadGateway)


def guarded(name: str, handler: Callable[[CloudEventLike], None]) -> Callable[[CloudEventLike], None]:
    """Acknowledge and record events that can never succeed; let transient failures raise (retry)."""
    @functools.wraps(handler)
    def run(event: CloudEventLike) -> None:
        event_id, event_type = _attr(event, "id"), _attr(event, "type")
        fields = {"event_id": event_id, "event_type": event_type, "function": name}
        started = time.perf_counter()
        try:
            handler(event)
        except InvalidEvent as exc:
            log.warning("%s: rejected event: %s", name, exc.reason, extra=fields)
            _record_rejected(event, event_id, event_type, exc.reason)
            return
        except SpotorchError as exc:  # a permanent problem with this event (unknown run/pipeline)
            log.warning("%s: %s", name, exc, extra=fields)
            _record_rejected(event, event_id, event_type, str(exc))
            return
        except Exception as exc:
            if _transient(exc):
                log.warning("%s: transient failure, to be redelivered: %s", name, exc, extra=fields)
                _record_failure(event, event_id, event_type,
                                f"{type(exc).__name__}: {str(exc)[:500]}")
                raise
            # Redelivering cannot help; the record keeps the event for a person and a replay.
            log.exception("%s: failed for good: %s", name, exc, extra=fields)
            _record_rejected(event, event_id, event_type,
                             f"internal error: {type(exc).__name__}: {str(exc)[:500]}")
            return
        log.debug("%s: handled", name, extra={
            **fields, "elapsed_ms": round((time.perf_counter() - started) * 1000, 1)})
    return run


def _record_rejected(event: CloudEventLike, event_id: str, event_type: str, reason: str) -> None:
    from spotorch.app.runs import record_rejected

    try:
        record_rejected(deps().docs, event_id=event_id, event_type=event_type, reason=reason,
                        now=time.time(), payload=getattr(event, "data", None))
    except Exception as exc:  # recording is best effort; the log line above has the reason
        log.error("could not record rejected event: %s", exc, extra={"event_id": event_id})


def _record_failure(event: CloudEventLike, event_id: str, event_type: str, reason: str) -> None:
    """The last transient failure of a message, for `spotorch dead-letters` if it ends there.

    Keyed by the message's content (ids.message_key): dead-lettering gives it a new id."""
    from datetime import UTC, datetime

    from spotorch.core.ids import message_key, object_key
    from spotorch.settings import COLLECTION_FAILURES, FAILURE_RETENTION_S, TTL_FIELD

    try:
        body, attributes = _pubsub_message(event)
        keys = [message_key(body, attributes)]
    except InvalidEvent:  # not a Pub/Sub message (an Eventarc storage event): its id will do
        keys = [event_id]
    data = getattr(event, "data", None)
    if isinstance(data, Mapping):  # a storage event: also by its object generation, which a
        # dead-lettered notification of it names too (ids.failure_keys)
        obj = object_key(data.get("bucket"), data.get("name"), data.get("generation"))
        if obj is not None and obj not in keys:
            keys.append(obj)
    try:
        docs = deps().docs
        now = time.time()
        for key in keys:
            _, version = docs.get(COLLECTION_FAILURES, key)
            docs.put(COLLECTION_FAILURES, key, {
                "event_id": event_id, "event_type": event_type, "reason": reason, "at": now,
                TTL_FIELD: datetime.fromtimestamp(now + FAILURE_RETENTION_S, UTC)}, version)
    except Exception as exc:  # best effort: the store may be what is failing
        log.warning("could not record the failure of %s (%s): %s", event_id, reason[:200], exc)


# ---------------------------------------------------------------- handlers

def object_event(event: CloudEventLike) -> None:
    """GCS object finalized (Eventarc) or a GCS Pub/Sub notification: batch it, maybe start a run."""
    from spotorch.app.arrivals import data_arrived
    from spotorch.entrypoints import storage_events

    obj = storage_events.parse_object_event(_attr(event, "type"), _attr(event, "id"), event.data)
    data_arrived(deps(), obj)


def table_event(event: CloudEventLike) -> None:
    """A BigQuery InsertJob audit entry (Eventarc): checked against BigQuery, maybe a snapshot."""
    from spotorch.app.table_intake import snapshot_job_ended, table_changed
    from spotorch.entrypoints.audit_entries import own_job_snapshot, parse_audit_event

    change = parse_audit_event(_attr(event, "type"), _attr(event, "id"), event.data)
    snapshot_id = own_job_snapshot(event.data)
    if snapshot_id is not None:  # one of our snapshot's jobs ended: carry the snapshot on now
        snapshot_job_ended(deps(), snapshot_id)
        return
    if change is None:  # a start entry, a failed job, a plain query: acknowledged, nothing to do
        log.debug("BigQuery audit entry names no table change", extra={"event_id": _attr(event, "id")})
        return
    table_changed(deps(), change)


def job_event(event: CloudEventLike) -> None:
    """A job's service log line (log sink) or a trainer report, both via Pub/Sub; or a preprocess
    job's Dataflow statusChanged (its own Eventarc trigger on this function's service)."""
    from spotorch.core.preprocess import STATUS_CHANGED_TYPE
    from spotorch.entrypoints.audit_entries import AUDIT_LOG_TYPE
    from spotorch_trainer import contract

    # Eventarc's own triggers on this function's service, by event type; else Pub/Sub's.
    direct = {STATUS_CHANGED_TYPE: dataflow_event, AUDIT_LOG_TYPE: dataproc_event}
    if (handle := direct.get(_attr(event, "type"))) is not None:
        handle(event)
        return

    body, attributes = _pubsub_message(event)
    source = attributes.get(contract.ATTR_SOURCE, contract.SOURCE_JOB)
    handler = _JOB_SOURCES.get(source)
    if handler is None:
        raise InvalidEvent(f"unknown message source {source[:40]!r}")
    handler(body, attributes, _attr(event, "id"))


# Lines of jobs spotorch did not create (another team's, in the same project: the log sink
# cannot tell them apart), counted per instance. Each is acknowledged with a debug line, no
# warning and no write; one info line at the first and every NOT_OURS_EVERY-th says how many.
NOT_OURS_EVERY = 1000
not_ours_seen = 0


def _not_ours(job_id: str, event_id: str) -> None:
    global not_ours_seen
    not_ours_seen += 1
    fields = {"event_id": event_id, "job_id": job_id, "not_ours_seen": not_ours_seen}
    if not_ours_seen % NOT_OURS_EVERY == 1:
        log.info("%d log line(s) of Vertex AI jobs spotorch did not create, ignored (this one: "
                 "job %s)", not_ours_seen, job_id, extra=fields)
    else:
        log.debug("job %s is not one spotorch created: line ignored", job_id, extra=fields)


def _job_line(body: bytes, attributes: Mapping[str, str], event_id: str) -> None:
    from spotorch.app.deps import NotOurJob
    from spotorch.app.job_events import job_line_reported
    from spotorch.entrypoints.log_entries import NotAJobStateChange, parse_log_entry

    d = deps()
    try:
        line = parse_log_entry(body, attributes, state_lines())
    except NotAJobStateChange:
        return  # a job's log line that reports no state: nothing to do, nothing wrong
    try:
        run = job_line_reported(d, line.job_id, line.phase, line.message, event_id=event_id,
                                project=line.project)
    except NotOurJob:
        _not_ours(line.job_id, event_id)
        return
    log.info("job %s: %s", line.job_id, line.phase,
             extra={"run_id": run.run_id, "event_id": event_id, "status": str(run.status)})


def _trainer(body: bytes, attributes: Mapping[str, str], event_id: str) -> None:
    from spotorch.app.job_events import trainer_message
    from spotorch.core.trust import SignedMessage
    from spotorch_trainer import contract

    report, run_id, trainer_event_id = parse_trainer_message(body)
    signed = SignedMessage(body, attributes.get(contract.ATTR_SIGNATURE, ""),
                           attributes.get(contract.ATTR_ATTEMPT, ""))
    run = trainer_message(deps(), run_id, report, signed, event_id=trainer_event_id or event_id)
    log.debug("trainer %s step %s", report.kind, report.step,
              extra={"run_id": run_id, "event_id": event_id, "status": str(run.status)})


_JOB_SOURCES: Mapping[str, Callable[[bytes, Mapping[str, str], str], None]] = {
    "job": _job_line,
    "trainer": _trainer,
}


ATTR_SHARD = "spotorch_shard"  # spotorch.adapters.gcp.pubsub.ATTR_SHARD (not imported: cold start)


def tick_event(event: CloudEventLike) -> None:
    """The reconcile tick (Cloud Scheduler via Pub/Sub), or one shard of a fanned-out tick."""
    from spotorch.app.tick import reconcile, reconcile_shard

    body, attributes = _pubsub_message(event)
    runs = reconcile_shard(deps(), _shard(body)) if ATTR_SHARD in attributes else reconcile(deps())
    log.info("tick: %d active runs reconciled", len(runs),
             extra={METRIC_FIELD: METRIC_TICK, "event_id": _attr(event, "id"),
                    "shard": attributes.get(ATTR_SHARD), "active_runs": len(runs)})


def _shard(body: bytes) -> Mapping[str, Any]:
    """A shard message of spotorch's own tick: checked, as anything that arrives on a topic."""
    try:
        shard = json.loads(body)
    except (ValueError, RecursionError):
        raise InvalidEvent("shard message is not JSON") from None
    if not isinstance(shard, dict) or not isinstance(shard.get("statuses"), list):
        raise InvalidEvent("shard message lacks statuses")
    shards = _count(shard.get("shards"), "shards", low=1)
    if _count(shard.get("shard"), "shard") >= shards:
        raise InvalidEvent("shard number is not below the number of shards")
    return shard


def run_event(event: CloudEventLike) -> None:
    """The notifier: one subscriber of spotorch's own events, sending Chat, Slack and email alerts."""
    from spotorch.entrypoints.alerts import handle_pubsub_cloudevent

    setup_logging()
    deliveries = handle_pubsub_cloudevent(event)
    log.info("notifier: %d deliveries", len(deliveries), extra={"event_id": _attr(event, "id")})


def dataflow_event(event: CloudEventLike) -> None:
    """Eventarc's google.cloud.dataflow.job.v1beta3.statusChanged: a preprocess job moved (a
    hint, checked against GetJob before the run changes; the tick's poll is the backstop)."""
    from spotorch.app.job_events import status_changed
    from spotorch.core import preprocess as pp
    from spotorch.entrypoints.dataflow_events import status_hint

    type_ = _attr(event, "type")
    if type_ != pp.STATUS_CHANGED_TYPE:
        raise InvalidEvent(f"not a Dataflow statusChanged event: {type_[:80]!r}")
    data = getattr(event, "data", None)
    if not isinstance(data, Mapping):
        raise InvalidEvent("statusChanged event without a JSON object as its data")
    try:
        hint = status_hint(data)
    except ValueError as exc:
        raise InvalidEvent(str(exc)) from None
    status_changed(deps(), hint, _attr(event, "id"))


def dataproc_event(event: CloudEventLike) -> None:
    """A Dataproc Admin Activity audit entry (Eventarc): a Spark step's batch may have ended (a
    hint, checked against GetBatch; the tick's poll is the backstop)."""
    from spotorch.app.job_events import batch_hinted
    from spotorch.entrypoints.batch_entries import batch_hint

    hint = batch_hint(getattr(event, "data", None))
    if hint is None:  # an entry that says nothing of a batch's end: acknowledged
        log.debug("Dataproc audit entry names no ended batch", extra={"event_id": _attr(event, "id")})
        return
    log.info("Dataproc audit entry: batch %s may have ended (checked with GetBatch)",
             hint.job_id, extra={"event_id": _attr(event, "id")})
    batch_hinted(deps(), hint, _attr(event, "id"))


# What each Cloud Function runs: its handler, guarded so bad events are acknowledged and recorded.
on_object_finalized = guarded("on_object_finalized", object_event)
on_job_event = guarded("on_job_event", job_event)
on_table_changed = guarded("on_table_changed", table_event)
on_tick = guarded("on_tick", tick_event)
on_run_event = guarded("on_run_event", run_event)
