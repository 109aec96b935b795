"""Storage events decoded at the edge: the two wire forms of one object change.

Eventarc's CloudEvent (google.cloud.storage.object.v1.*, data = the object resource) and a GCS
Pub/Sub notification (JSON_API_V1, carried by a messagePublished CloudEvent) both become the same
spotorch.core.triggers.ObjectEvent; only the event id differs. Bad input raises InvalidEvent
naming the field. Nothing here does I/O.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from spotorch.core.errors import InvalidEvent
from spotorch.core.triggers import ObjectEvent, ObjectEventKind

STORAGE_TYPE_PREFIX = "google.cloud.storage.object.v1."
PUBSUB_MESSAGE_TYPE = "google.cloud.pubsub.topic.v1.messagePublished"


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
