"""A JSON nesting limit checked on the raw bytes, before anything parses them (issue 39).

Python's json module (and functions-framework, which parses a CloudEvent's body before any
function code runs) raises RecursionError on a document nested a few thousand levels deep: an
answer of 500, and for an event function a redelivery until the dead letter. Nothing spotorch
reads nests deeper than a few levels (an audit log entry about ten), so a body nested deeper
than MAX_JSON_DEPTH is refused from its bytes: the api answers 400, an event function
acknowledges it; both record it in rejected_events.

install(app) puts the check in front of every route of a functions-framework Flask app
(functions/main.py calls it while the framework loads the module, inside the app's context).
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import time
from collections.abc import Callable
from itertools import accumulate
from typing import Any

MAX_JSON_DEPTH = 100
# A JSON string, or an unterminated one to the end of the text: always matches from a quote, so
# the scan is linear (a pattern that must find the closing quote retries from every quote of an
# unterminated run: quadratic, 14 s for 40 kB of '\"').
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"?', re.DOTALL)
_NOT_BRACKET = bytes(b for b in range(256) if b not in b"[]{}")
_STEP = {ord("["): 1, ord("{"): 1, ord("]"): -1, ord("}"): -1}

log = logging.getLogger("spotorch.entrypoints.depth")


def json_depth(raw: bytes | str) -> int:
    """The deepest nesting of arrays and objects in a JSON text, read without parsing it
    (brackets inside strings do not count; a text that is not JSON gives some number)."""
    data = raw.encode("utf-8", "surrogatepass") if isinstance(raw, str) else raw
    if b"[" not in data and b"{" not in data:
        return 0
    brackets = _STRING.sub(b"", data).translate(None, _NOT_BRACKET)
    if not brackets:
        return 0
    return max(0, max(accumulate(map(_STEP.__getitem__, brackets))))


def too_deep(raw: bytes | str, limit: int = MAX_JSON_DEPTH) -> str | None:
    """Why this body is refused, or None when it nests at most `limit` levels."""
    depth = json_depth(raw)
    if depth <= limit:
        return None
    return f"JSON nested {depth} levels deep; at most {limit} are accepted"


def record_refused(docs: Any, *, event_id: str, event_type: str, reason: str,
                   payload: Any) -> None:
    """Keep a refused body in rejected_events (best effort: the answer says why either way)."""
    from spotorch.app.runs import record_rejected

    try:
        record_rejected(docs, event_id=event_id, event_type=event_type, reason=reason,
                        now=time.time(), payload=payload)
    except Exception as exc:  # the store may be what is failing; the log keeps the reason
        log.error("could not record a refused request: %s", exc)


def _body_key(raw: bytes) -> str:
    return "deep-" + hashlib.sha256(raw).hexdigest()[:32]


def install(app: Any, function: str, docs: Callable[[], Any]) -> None:
    """Refuse bodies nested deeper than MAX_JSON_DEPTH before functions-framework parses them:
    400 from the api, an acknowledgement (204) from an event function, which Pub/Sub and
    Eventarc would otherwise redeliver; both recorded in rejected_events (the store `docs()`
    gives: the caller's, so this module never imports the functions it guards)."""
    import flask

    def guard() -> Any:
        raw = flask.request.get_data(cache=True)
        reason = too_deep(raw)
        if reason is None:
            return None
        event_id = flask.request.headers.get("ce-id") or _body_key(raw)
        kind = flask.request.headers.get("ce-type") or \
            f"api {flask.request.method} {flask.request.path[:60]}"
        log.warning("%s: refused a body: %s", function, reason)
        record_refused(docs(), event_id=event_id[:200], event_type=kind[:200],
                       reason=reason, payload={"function": function, "bytes": len(raw),
                                               "head": raw[:200].decode("utf-8", "replace")})
        if function == "api":
            return flask.Response(json.dumps({"error": reason}), 400,
                                  {"Content-Type": "application/json"})
        return flask.Response("", 204)

    app.before_request(guard)
