"""Identifiers that arrive from outside: checked before they name a Firestore document."""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from typing import Any

from spotorch.core.errors import InvalidEvent

MAX_ID_LEN = 128
# Letters, digits, '-', '_' and '.', starting with a letter or digit: no '/', never '.' or '..',
# never '__x__' (Firestore reserves those names), short enough for a label or a document id.
_SAFE_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


# Firestore's own rules for a document id (https://firebase.google.com/docs/firestore/quotas)
FIRESTORE_ID_MAX_BYTES = 1500
_RESERVED_ID = re.compile(r"__.*__", re.DOTALL)


def firestore_id_rule(value: str) -> str | None:
    """The Firestore document-id rule `value` breaks, in words; None when it breaks none."""
    if not value:
        return "empty (Firestore: an id must not be empty)"
    if "/" in value:
        return "contains '/' (Firestore: an id must not contain a forward slash)"
    if value in (".", ".."):
        return "is '.' or '..' (Firestore: an id cannot be a single or double period)"
    if _RESERVED_ID.fullmatch(value):
        return "matches __.*__ (Firestore reserves those ids)"
    if len(value.encode("utf-8", "surrogatepass")) > FIRESTORE_ID_MAX_BYTES:
        return f"longer than {FIRESTORE_ID_MAX_BYTES} bytes (Firestore's limit for an id)"
    return None


def check_id(value: Any, what: str) -> str:
    """`value` as an id, or InvalidEvent naming what is wrong with it (the Firestore rule it
    breaks first, then spotorch's stricter form)."""
    if not isinstance(value, str):
        raise InvalidEvent(f"{what} is not a string: {str(value)[:40]!r}")
    rule = firestore_id_rule(value)
    if rule is not None:
        raise InvalidEvent(f"{what} {value[:60]!r} is not a valid id: {rule}")
    if not _SAFE_ID.fullmatch(value) or value.endswith(".") or ".." in value:
        raise InvalidEvent(f"{what} {value[:60]!r} is not a valid id (1-{MAX_ID_LEN} letters, "
                           "digits, '-', '_' or '.', starting with a letter or digit)")
    return value


def is_valid_id(value: Any) -> bool:
    """Whether the value is an id check_id would accept."""
    try:
        check_id(value, "id")
    except InvalidEvent:
        return False
    return True


_TOKEN = re.compile(r"[\x21-\x7e]{1,256}")  # printable ASCII, no spaces


def check_token(value: Any, what: str) -> str:
    """An opaque id that is only compared, never used as a document name (e.g. an event id)."""
    if not isinstance(value, str) or not _TOKEN.fullmatch(value):
        raise InvalidEvent(f"{what} {str(value)[:60]!r} is not 1-256 printable ASCII characters")
    return value


def message_key(data: bytes, attributes: Mapping[str, str]) -> str:
    """A Pub/Sub message's identity that survives dead-lettering (which gives it a new id):
    its data and the attributes it was published with (not those Pub/Sub adds on the way)."""
    kept = sorted((k, v) for k, v in attributes.items() if not k.startswith("CloudPubSubDeadLetter"))
    digest = hashlib.sha256(data)
    digest.update(json.dumps(kept).encode())
    return digest.hexdigest()[:40]


def object_key(bucket: Any, name: Any, generation: Any) -> str | None:
    """A GCS object generation's identity, the same whichever way its event came (an Eventarc
    storage event, a Pub/Sub notification, or either dead-lettered); None without all three."""
    if not (bucket and name and generation) or not all(
            isinstance(v, str | int) and not isinstance(v, bool)
            for v in (bucket, name, generation)):
        return None
    digest = hashlib.sha256(f"{bucket}/{name}#{generation}".encode()).hexdigest()[:40]
    return f"gcs-{digest}"


def failure_keys(data: bytes, attributes: Mapping[str, str]) -> list[str]:
    """Where a held (dead-lettered) message's last failure may be recorded, most exact first:
    its content (message_key), the CloudEvent id an Eventarc transport carries, and the object
    generation a GCS notification names."""
    keys = [message_key(data, attributes)]
    if attributes.get("ce-id"):
        keys.append(str(attributes["ce-id"]))
    obj = object_key(attributes.get("bucketId"), attributes.get("objectId"),
                     attributes.get("objectGeneration"))
    if obj is None and data[:1] == b"{" and len(data) < 1 << 16:
        try:
            parsed = json.loads(data)
        except (ValueError, RecursionError):
            parsed = None
        if isinstance(parsed, dict):
            obj = object_key(parsed.get("bucket"), parsed.get("name"), parsed.get("generation"))
    if obj is not None:
        keys.append(obj)
    return keys


MAX_LABEL_LEN = 63
_LABEL_BAD = re.compile(r"[^a-z0-9_-]")


def label_value(value: str) -> str:
    """A Vertex-valid label value (lowercase letters, digits, - and _; at most 63 characters).

    A value that had to change gets a short hash of the original, so two different run ids never
    map to one label (find() depends on it); valid values pass through unchanged.
    """
    clean = _LABEL_BAD.sub("-", value.lower())
    if clean == value and len(value) <= MAX_LABEL_LEN:
        return value
    digest = hashlib.sha256(value.encode()).hexdigest()[:8]
    return f"{clean[:MAX_LABEL_LEN - 9]}-{digest}"
