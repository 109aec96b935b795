"""Uploads that feed no pipeline: recorded per folder, shown to operators, alerted on once.

An object in a landing bucket that no pipeline takes, for a reason the pipelines did not intend
(another prefix, not in a snapshot folder, a name the glob or suffixes exclude: the rules of
spotorch.core.triggers), is recorded in COLLECTION_UNMATCHED, one document per (bucket, folder):
the first MAX_SAMPLE objects with, per pipeline, the rule each missed and what the pipeline
expects. Documents stay small (MAX_SAMPLE objects, MAX_PIPELINES reasons each) and are written
at most once per COALESCE_S beyond the sample, so a noisy folder costs a read per object and a
write now and then; `expires_at` lets a Firestore TTL policy delete them after KEEP_S.

Once a folder has had no new unmatched object for the quiet period, the tick publishes ONE
upload.unmatched event (its id is fixed per document, so a crash between publishing and marking
republishes the same id, which the notifier deduplicates). A folder whose objects the current
pipelines would take by then (the pipelines were fixed) is marked resolved instead.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from spotorch.app import updates
from spotorch.core.events import build_event
from spotorch.core.pipeline import Pipeline
from spotorch.core.triggers import (
    INTENDED_SKIPS,
    Miss,
    ObjectEvent,
    ObjectEventKind,
    match,
    miss,
    skip_reason,
)
from spotorch.ports.messages import EventPublisher
from spotorch.ports.store import ConflictError, DocumentStore
from spotorch.settings import COLLECTION_UNMATCHED

log = logging.getLogger("spotorch.app.unmatched")

FORMAT = 1
MAX_SAMPLE = 10  # objects kept per folder document
MAX_PIPELINES = 10  # reasons kept per object (the pipelines watching the bucket, by name)
MAX_NAME = 300  # characters of an object name kept
COALESCE_S = 30.0  # beyond the sample, a folder's document is written at most this often
KEEP_S = 7 * 24 * 3600.0  # expires_at: a TTL policy deletes the record this long after
DEFAULT_QUIET_S = 600.0  # no new unmatched object for this long: the upload is over, alert
WRITE_ATTEMPTS = 5
KIND = "upload.unmatched"


def folder_of(name: str) -> str:
    """The folder an object lies in ('' at the bucket's top)."""
    return name.rsplit("/", 1)[0] + "/" if "/" in name else ""


def record_key(bucket: str, folder: str) -> str:
    """The record document of an upload folder: a hash, as bucket and folder may hold any character."""
    return "upload-" + hashlib.sha256(f"{bucket}\n{folder}".encode()).hexdigest()[:24]


def unintended_misses(event: ObjectEvent, pipelines: Sequence[Pipeline]) -> list[Miss] | None:
    """The pipelines' misses when an object is an upload nothing took by mistake; None when a
    pipeline takes it, or means to skip it, or no pipeline watches its bucket."""
    if event.kind != ObjectEventKind.FINALIZE or not any(p.trigger.bucket == event.bucket
                                                        for p in pipelines):
        return None
    found: list[Miss] = []
    for pipeline in sorted(pipelines, key=lambda p: p.name):
        missed = miss(pipeline, event)
        if missed is None or missed.rule in INTENDED_SKIPS:
            return None
        found.append(missed)
    # The pipelines that watch this bucket first: their reasons are the ones that help.
    found.sort(key=lambda m: m.rule == "bucket")
    return found[:MAX_PIPELINES]


def matches_any(event: ObjectEvent, pipelines: Sequence[Pipeline]) -> bool:
    """Whether any pipeline takes this object."""
    return any(match(p, event) is not None for p in pipelines)


def why_unmatched(event: ObjectEvent, pipelines: Sequence[Pipeline]) -> str:
    """Per pipeline, the rule an object missed (for the one log line an unmatched object gets)."""
    if not pipelines:
        return "no pipeline is loaded"
    return "; ".join(f"{p.name}: {skip_reason(p, event)}" for p in pipelines)


def _object_doc(event: ObjectEvent, misses: Sequence[Miss], now: float) -> dict[str, Any]:
    return {"name": event.name[:MAX_NAME], "generation": event.generation, "seen_at": now,
            "misses": [m.to_doc() for m in misses]}


def _decide(doc: Mapping[str, Any] | None, event: ObjectEvent, misses: Sequence[Miss],
            now: float) -> dict[str, Any] | None:
    """The folder's new document, or None when nothing worth a write changed."""
    folder = folder_of(event.name)
    if doc is None:
        return {"format": FORMAT, "bucket": event.bucket, "folder": folder[:MAX_NAME],
                "first_seen": now, "last_seen": now, "objects": [_object_doc(event, misses, now)],
                "overflow": False, "alerted": False, "alerted_at": None, "resolved": False,
                "expires_at": datetime.fromtimestamp(now + KEEP_S, UTC)}
    objects = list(doc.get("objects") or [])
    overflow = bool(doc.get("overflow"))
    # Only news is written: a new object for the sample, the first one beyond it, or (at most
    # every COALESCE_S) a later last_seen, which holds the alert back while the upload goes on.
    fresh = now - float(doc.get("last_seen") or 0.0) >= COALESCE_S
    if event.name[:MAX_NAME] in {o.get("name") for o in objects}:
        if not fresh:
            return None
    elif len(objects) < MAX_SAMPLE:
        objects.append(_object_doc(event, misses, now))
    elif overflow and not fresh:
        return None
    else:
        overflow = True
    return {**doc, "objects": objects, "overflow": overflow, "last_seen": now,
            "expires_at": datetime.fromtimestamp(now + KEEP_S, UTC)}


def record_unmatched(docs: DocumentStore, event: ObjectEvent, misses: Sequence[Miss],
                     now: float) -> None:
    """Record an object no pipeline took by mistake (misses: unintended_misses of it)."""
    key = record_key(event.bucket, folder_of(event.name))
    try:
        _update(docs, key, lambda doc: _decide(doc, event, misses, now))
    except ConflictError:
        log.warning("unmatched object %s not recorded: its folder's record is contended",
                    event.uri)


def _update(docs: DocumentStore, key: str,
            decide: Callable[[Mapping[str, Any] | None], dict[str, Any] | None]) -> None:
    """One record's change through app.updates' loop (ConflictError after WRITE_ATTEMPTS)."""
    updates.conditional_update(
        lambda: docs.get(COLLECTION_UNMATCHED, key), decide,
        lambda new, version: docs.put(COLLECTION_UNMATCHED, key, new, version),
        what=f"{COLLECTION_UNMATCHED}/{key}", attempts=WRITE_ATTEMPTS)


def _now_matches(doc: Mapping[str, Any], pipelines: Sequence[Pipeline]) -> bool:
    """Whether the current pipelines would take one of the recorded objects (they were fixed)."""
    for obj in doc.get("objects") or ():
        event = ObjectEvent(event_id="recheck", kind=ObjectEventKind.FINALIZE,
                            bucket=str(doc.get("bucket")), name=str(obj.get("name")),
                            generation=int(obj.get("generation") or 1))
        if any(match(p, event) is not None for p in pipelines):
            return True
    return False


def unmatched_event(key: str, doc: Mapping[str, Any], now: float) -> dict[str, Any]:
    """The one upload.unmatched event of a folder (id `<key>:1`: the same on every publish)."""
    objects = list(doc.get("objects") or ())
    misses = list(objects[0].get("misses") or ()) if objects else []
    watching = [m for m in misses if m.get("rule") != "bucket"] or misses
    pipeline = str(watching[0]["pipeline"]) if watching else "unknown"
    where = f"gs://{doc.get('bucket')}/{doc.get('folder')}"
    names = [str(o.get("name")) for o in objects]
    return build_event(run_id=key, pipeline=pipeline, sequence=1, kind=KIND, time=now, data={
        "bucket": doc.get("bucket"), "folder": doc.get("folder"), "uri": where,
        "objects": names, "more_objects": bool(doc.get("overflow")),
        "first_seen": _iso(doc.get("first_seen")), "last_seen": _iso(doc.get("last_seen")),
        "reasons": [{"pipeline": m.get("pipeline"), "rule": m.get("rule"),
                     "expected": m.get("expected"), "text": m.get("text")} for m in misses],
        "reason": str(watching[0].get("text")) if watching else "no pipeline watches it"})


def _iso(ts: Any) -> str | None:
    from spotorch_trainer.contract import rfc3339

    return rfc3339(float(ts)) if isinstance(ts, int | float) else None


def alert_quiet_uploads(docs: DocumentStore, publisher: EventPublisher,
                        pipelines: Sequence[Pipeline], now: float,
                        quiet_s: float = DEFAULT_QUIET_S) -> int:
    """The tick: one event per folder quiet for quiet_s whose objects still match nothing;
    returns how many were published."""
    published = 0
    for doc in docs.query(COLLECTION_UNMATCHED, "alerted", False):
        if doc.get("resolved") or float(doc.get("last_seen") or now) + quiet_s > now:
            continue
        key = record_key(str(doc.get("bucket")), str(doc.get("folder")))
        resolved = _now_matches(doc, pipelines)
        if not resolved:
            try:
                publisher.publish(unmatched_event(key, doc, now))
            except Exception as exc:  # the next tick tries again (the same id)
                log.warning("upload.unmatched for %s not published: %s", key, exc)
                continue
            published += 1
        _mark(docs, key, now, resolved)
    return published


def _mark(docs: DocumentStore, key: str, now: float, resolved: bool) -> None:
    with contextlib.suppress(ConflictError):  # contended: the next pass marks it
        _update(docs, key, lambda doc: None if doc is None else {
            **doc, "alerted": True, "alerted_at": now, "resolved": resolved})
