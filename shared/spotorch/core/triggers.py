"""Storage events in one shape, and the pure rules that decide which objects feed which pipelines.

Two wire forms reach spotorch for the same object change: Eventarc's CloudEvent
(google.cloud.storage.object.v1.*, data = the object resource) and a GCS Pub/Sub notification
(JSON_API_V1, carried by a messagePublished CloudEvent). Both become the same ObjectEvent; only
the event id differs. Nothing here does I/O.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from fnmatch import fnmatchcase
from typing import Any

from spotorch.core.errors import InvalidEvent
from spotorch.core.pipeline import BatchMode, Pipeline, Trigger

STORAGE_TYPE_PREFIX = "google.cloud.storage.object.v1."
PUBSUB_MESSAGE_TYPE = "google.cloud.pubsub.topic.v1.messagePublished"


class ObjectEventKind(StrEnum):
    """What happened to an object; only FINALIZE ever feeds a pipeline."""

    FINALIZE = "finalize"  # a new object or a new generation of one is complete
    DELETE = "delete"  # a generation was deleted (or replaced: GCS sends this for overwrites too)
    METADATA = "metadata"  # metadata changed; the content did not
    ARCHIVE = "archive"  # a live generation became noncurrent (versioned buckets)


# Eventarc CloudEvent type -> kind.
CLOUDEVENT_KINDS: Mapping[str, ObjectEventKind] = {
    f"{STORAGE_TYPE_PREFIX}finalized": ObjectEventKind.FINALIZE,
    f"{STORAGE_TYPE_PREFIX}deleted": ObjectEventKind.DELETE,
    f"{STORAGE_TYPE_PREFIX}metadataUpdated": ObjectEventKind.METADATA,
    f"{STORAGE_TYPE_PREFIX}archived": ObjectEventKind.ARCHIVE,
}

# GCS Pub/Sub notification attribute eventType -> kind.
NOTIFICATION_KINDS: Mapping[str, ObjectEventKind] = {
    "OBJECT_FINALIZE": ObjectEventKind.FINALIZE,
    "OBJECT_DELETE": ObjectEventKind.DELETE,
    "OBJECT_METADATA_UPDATE": ObjectEventKind.METADATA,
    "OBJECT_ARCHIVE": ObjectEventKind.ARCHIVE,
}


@dataclass(frozen=True)
class ObjectEvent:
    """One change to one object generation, whichever way it was delivered."""

    event_id: str
    kind: str  # an ObjectEventKind, or the raw type of a kind spotorch does not know
    bucket: str
    name: str
    generation: int
    size: int | None = None
    time: float | None = None  # the object's `updated` (else `timeCreated`), seconds since epoch
    content_type: str | None = None

    @property
    def uri(self) -> str:
        """The object as a gs:// URI."""
        return f"gs://{self.bucket}/{self.name}"


# --- parsing ------------------------------------------------------------------------------------


def _text(resource: Mapping[str, Any], field: str, where: str) -> str:
    value = resource.get(field)
    if not isinstance(value, str) or not value:
        problem = "missing" if value in (None, "") else f"not a string: {value!r}"
        raise InvalidEvent(f"{where}{field}: {problem}")
    return value


def _integer(value: Any, field: str, *, positive: bool) -> int:
    """GCS sends int64s as decimal strings; accept those and plain ints, nothing else."""
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise InvalidEvent(f"{field}: not an integer: {value!r}")
    try:
        number = int(value)
    except ValueError:
        raise InvalidEvent(f"{field}: not an integer: {value!r}") from None
    if number < 0 or (positive and number == 0):
        raise InvalidEvent(f"{field}: out of range: {value!r}")
    return number


def _timestamp(value: Any, field: str) -> float:
    try:
        return datetime.fromisoformat(str(value)).timestamp()
    except ValueError:
        raise InvalidEvent(f"{field}: not an RFC 3339 time: {value!r}") from None


def _object_event(event_id: str, kind: str, resource: Mapping[str, Any], *,
                  where: str = "data.") -> ObjectEvent:
    """An ObjectEvent from a (partial) object resource; bucket, name and generation required."""
    if not isinstance(event_id, str) or not event_id:
        raise InvalidEvent("id: missing (needed to recognise a redelivered event)")
    size = resource.get("size")
    when = resource.get("updated") or resource.get("timeCreated")
    time_field = "updated" if resource.get("updated") else "timeCreated"
    content_type = resource.get("contentType")
    return ObjectEvent(
        event_id=event_id,
        kind=kind,
        bucket=_text(resource, "bucket", where),
        name=_text(resource, "name", where),
        generation=_integer(resource.get("generation"), f"{where}generation", positive=True),
        size=None if size is None else _integer(size, f"{where}size", positive=False),
        time=None if when is None else _timestamp(when, f"{where}{time_field}"),
        content_type=content_type if isinstance(content_type, str) and content_type else None,
    )


def parse_storage_cloudevent(event_type: str, event_id: str,
                             data: Mapping[str, Any]) -> ObjectEvent:
    """An Eventarc Cloud Storage CloudEvent (finalized, deleted, archived, metadataUpdated)."""
    if not isinstance(event_type, str) or not event_type.startswith(STORAGE_TYPE_PREFIX):
        raise InvalidEvent(f"type: not a Cloud Storage object event: {event_type!r}",
                           event_id=str(event_id or ""), event_type=str(event_type or ""))
    kind = CLOUDEVENT_KINDS.get(event_type, event_type[len(STORAGE_TYPE_PREFIX):])
    if not isinstance(data, Mapping):
        raise InvalidEvent(f"data: expected the object resource (a JSON object), got "
                           f"{type(data).__name__}", event_id=str(event_id or ""),
                           event_type=event_type)
    try:
        return _object_event(event_id, kind, data)
    except InvalidEvent as exc:
        raise InvalidEvent(exc.reason, event_id=str(event_id or ""),
                           event_type=event_type) from None


def _notification_resource(message: Mapping[str, Any]) -> Mapping[str, Any]:
    """The object resource of a JSON_API_V1 notification; empty when the payload format is NONE."""
    payload = message.get("data")
    if payload in (None, "", b""):
        return {}
    try:
        raw = base64.b64decode(payload, validate=True)
        resource = json.loads(raw)
    except (binascii.Error, TypeError, ValueError):
        raise InvalidEvent("message.data: not base64 of a JSON object resource") from None
    if not isinstance(resource, Mapping):
        raise InvalidEvent("message.data: not a JSON object")
    return resource


def parse_pubsub_notification(event_id: str, message: Mapping[str, Any]) -> ObjectEvent:
    """A GCS Pub/Sub notification: `message` is the message object of a messagePublished event.

    The attributes (eventType, bucketId, objectId, objectGeneration) are authoritative; the
    payload, when present, adds size, time and content type and must agree with them.
    """
    try:
        if not isinstance(message, Mapping):
            raise InvalidEvent("message: missing (not a Pub/Sub message)")
        attributes = message.get("attributes")
        if not isinstance(attributes, Mapping):
            raise InvalidEvent("message.attributes: missing (not a GCS notification)")
        event_type = _text(attributes, "eventType", "message.attributes.")
        kind = NOTIFICATION_KINDS.get(event_type, event_type.lower())
        resource = _notification_resource(message)
        named = {"bucket": _text(attributes, "bucketId", "message.attributes."),
                 "name": _text(attributes, "objectId", "message.attributes."),
                 "generation": _integer(attributes.get("objectGeneration"),
                                        "message.attributes.objectGeneration", positive=True)}
        for field, value in named.items():
            if field in resource and str(resource[field]) != str(value):
                raise InvalidEvent(f"message.data.{field}: {resource[field]!r} disagrees with "
                                   f"the attributes ({value!r})")
        return _object_event(event_id, kind, {**resource, **named}, where="message.data.")
    except InvalidEvent as exc:
        raise InvalidEvent(exc.reason, event_id=str(event_id or ""),
                           event_type=PUBSUB_MESSAGE_TYPE) from None


def parse_object_event(cloud_event_type: str, event_id: str, data: Any) -> ObjectEvent:
    """Either form: an Eventarc storage CloudEvent, or messagePublished with a GCS notification."""
    if isinstance(data, bytes | str):
        try:
            data = json.loads(data)
        except ValueError:
            raise InvalidEvent("data: not JSON", event_id=str(event_id or ""),
                               event_type=str(cloud_event_type or "")) from None
    if cloud_event_type == PUBSUB_MESSAGE_TYPE:
        message = data.get("message") if isinstance(data, Mapping) else None
        if not isinstance(message, Mapping):
            raise InvalidEvent("data.message: missing", event_id=str(event_id or ""),
                               event_type=cloud_event_type)
        return parse_pubsub_notification(event_id, message)
    return parse_storage_cloudevent(cloud_event_type, event_id, data)


# --- matching -----------------------------------------------------------------------------------


def split_gs_uri(uri: str) -> tuple[str, str]:
    """(bucket, object prefix) of gs://bucket/path; the prefix ends with '/' unless it is empty."""
    if not uri.startswith("gs://"):
        raise ValueError(f"not a gs:// URI: {uri!r}")
    bucket, _, path = uri[len("gs://"):].partition("/")
    path = path.strip("/")
    return bucket, f"{path}/" if path else ""


def own_prefixes(pipeline: Pipeline) -> tuple[tuple[str, str], ...]:
    """(bucket, prefix) of all a pipeline's runs write: checkpoints, models, Vertex output."""
    uris = (pipeline.checkpoint_uri, pipeline.output_uri, pipeline.job.base_output_uri or "")
    return tuple(split_gs_uri(uri) for uri in uris if uri.startswith("gs://"))


def in_own_outputs(pipeline: Pipeline, bucket: str, name: str) -> bool:
    """Whether an object is something the pipeline's own jobs wrote (never a trigger)."""
    return any(b == bucket and name.startswith(p) for b, p in own_prefixes(pipeline))


def ignore_rule(trigger: Trigger, name: str) -> str | None:
    """The first ignore pattern an object name matches (tried on the name and on '/' + name)."""
    slashed = f"/{name}"
    return next((pattern for pattern in trigger.ignore
                 if fnmatchcase(name, pattern) or fnmatchcase(slashed, pattern)), None)


def snapshot_key(trigger: Trigger, name: str) -> str | None:
    """The snapshot an object belongs to: its own name (each_object), else the snapshot folder.

    The folder is the prefix plus the first `snapshot_depth` path segments below it, with a
    trailing '/'; None when the object does not lie inside such a folder.
    """
    if not name.startswith(trigger.prefix) or name.endswith("/"):
        return None
    if trigger.batch is BatchMode.EACH_OBJECT:
        return name
    parts = name[len(trigger.prefix):].split("/")
    folders = parts[:trigger.snapshot_depth]
    if len(parts) <= trigger.snapshot_depth or not all(folders):
        return None
    return trigger.prefix + "".join(f"{folder}/" for folder in folders)


def is_marker(trigger: Trigger, name: str) -> bool:
    """Whether the object is the marker of its snapshot folder (batch: marker only)."""
    key = snapshot_key(trigger, name)
    return (trigger.batch is BatchMode.MARKER and key is not None
            and name == key + trigger.marker)


def selects(trigger: Trigger, name: str) -> bool:
    """Whether the glob (on the name below the prefix) and the suffixes admit an object."""
    below = name[len(trigger.prefix):]
    return ((trigger.glob is None or fnmatchcase(below, trigger.glob))
            and (not trigger.suffixes or name.endswith(tuple(trigger.suffixes))))


# Each rule: its name, why an object is skipped, and the test it must pass. Order matters only
# for the reason reported; every rule is cheap.
_Rule = tuple[str, str, Callable[[Pipeline, ObjectEvent], bool]]
_RULES: tuple[_Rule, ...] = (
    ("finalized", "not a finalized object (deletes, archives and metadata updates never trigger)",
     lambda p, e: e.kind == ObjectEventKind.FINALIZE),
    ("bucket", "another bucket", lambda p, e: e.bucket == p.trigger.bucket),
    ("prefix", "outside the trigger prefix", lambda p, e: e.name.startswith(p.trigger.prefix)),
    ("placeholder", "a folder placeholder", lambda p, e: not e.name.endswith("/")),
    ("own_output", "written by the pipeline's own jobs (checkpoint or output prefix)",
     lambda p, e: not in_own_outputs(p, e.bucket, e.name)),
    ("ignored", "matches an ignore rule", lambda p, e: ignore_rule(p.trigger, e.name) is None),
    ("folder", "not inside a snapshot folder (see snapshot_depth)",
     lambda p, e: snapshot_key(p.trigger, e.name) is not None),
    ("selection", "excluded by the trigger's glob or suffixes",
     lambda p, e: is_marker(p.trigger, e.name) or selects(p.trigger, e.name)),
)
# Rules whose miss is intended (the pipeline means to skip such objects): never an upload that
# "matched nothing" (spotorch.app.unmatched records only the others).
INTENDED_SKIPS = frozenset({"finalized", "placeholder", "own_output", "ignored"})


def _missed(pipeline: Pipeline, event: ObjectEvent) -> tuple[str, str] | None:
    return next(((name, reason) for name, reason, passes in _RULES
                 if not passes(pipeline, event)), None)


def skip_reason(pipeline: Pipeline, event: ObjectEvent) -> str | None:
    """Why an event does not feed a pipeline, or None when it does."""
    missed = _missed(pipeline, event)
    return None if missed is None else missed[1]


def expectation(trigger: Trigger) -> dict[str, Any]:
    """What a trigger expects of an object, as data: where, which names, and the marker."""
    expected: dict[str, Any] = {"bucket": trigger.bucket, "prefix": trigger.prefix,
                                "batch": str(trigger.batch),
                                "snapshot_depth": trigger.snapshot_depth}
    if trigger.suffixes:
        expected["suffixes"] = list(trigger.suffixes)
    if trigger.glob:
        expected["glob"] = trigger.glob
    if trigger.batch is BatchMode.MARKER:
        expected["marker"] = trigger.marker
        expected["manifest"] = trigger.manifest
    return expected


def expectation_text(trigger: Trigger) -> str:
    """What a trigger expects, for people: 'objects ending .csv in gs://b/p/<folder>/; marker
    _DONE'."""
    folder = "".join(f"<{'folder' if i == 0 else 'sub'}>/" for i in range(trigger.snapshot_depth))
    where = f"gs://{trigger.bucket}/{trigger.prefix}" + \
        ("" if trigger.batch is BatchMode.EACH_OBJECT else folder)
    names = " or ".join(trigger.suffixes)
    what = (f"objects ending {names}" if trigger.suffixes else "objects") + \
        (f" matching {trigger.glob}" if trigger.glob else "")
    text = f"{what} in {where}"
    if trigger.batch is BatchMode.MARKER:
        text += f"; marker {trigger.marker}" + (" (a manifest)" if trigger.manifest else "")
    return text


@dataclass(frozen=True)
class Miss:
    """The rule an object missed in one pipeline, and what that pipeline expects."""

    pipeline: str
    rule: str  # a rule name: bucket, prefix, folder, selection (or an intended skip)
    reason: str
    expected: Mapping[str, Any]
    text: str  # reason and expectation in one line

    def to_doc(self) -> dict[str, Any]:
        """The miss as stored in an unmatched-upload record."""
        return {"pipeline": self.pipeline, "rule": self.rule, "reason": self.reason,
                "expected": dict(self.expected), "text": self.text}


def miss(pipeline: Pipeline, event: ObjectEvent) -> Miss | None:
    """Why an object does not feed a pipeline, with what it expects; None when it does."""
    missed = _missed(pipeline, event)
    if missed is None:
        return None
    rule, reason = missed
    trigger = pipeline.trigger
    text = f"{reason}: expects {expectation_text(trigger)}"
    base = event.name.rsplit("/", 1)[-1]
    if rule == "selection" and trigger.batch is BatchMode.MARKER and base[:1] in ("_", "."):
        text = f"{base} is not the marker (this pipeline's marker is {trigger.marker}); " + text
    return Miss(pipeline.name, rule, reason, expectation(trigger), text)


@dataclass(frozen=True)
class Match:
    """An object event that feeds a pipeline, and the snapshot it belongs to."""

    pipeline: Pipeline
    bucket: str
    snapshot_key: str  # folder ending in '/', or the object's name for each_object
    is_marker: bool

    @property
    def data_uri(self) -> str:
        """The snapshot's folder as a gs:// URI."""
        return f"gs://{self.bucket}/{self.snapshot_key}"


def match(pipeline: Pipeline, event: ObjectEvent) -> Match | None:
    """The snapshot an event feeds in a pipeline, or None (skip_reason says why)."""
    if skip_reason(pipeline, event) is not None:
        return None
    key = snapshot_key(pipeline.trigger, event.name)
    assert key is not None  # a rule above guarantees it
    return Match(pipeline, event.bucket, key, is_marker(pipeline.trigger, event.name))
