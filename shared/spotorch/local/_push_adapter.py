"""Local stand-in for Eventarc: turns Pub/Sub push requests into CloudEvents for the functions.

The Pub/Sub emulator pushes the raw push body ({"message": {...}, "subscription": ...}).
functions-framework converts that itself, but not as Eventarc does: it drops "subscription",
adds "@type", names the topic only when it is in the URL path and answers 400 to a message
without "data". So push subscriptions point here instead:

    POST /<function>/projects/<project>/topics/<topic>

and this re-posts a binary-mode CloudEvent, exactly as Eventarc would, to the function's URL and
answers Pub/Sub with the function's status (2xx acknowledges, anything else makes it redeliver).

Run as `python -m spotorch.local._push_adapter --port P --route NAME=URL ... [--storage-topic T]`.
"""

from __future__ import annotations

import argparse
import http.client
import json
import re
import sys
import time
import urllib.parse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

PUBSUB_PUBLISHED = "google.cloud.pubsub.topic.v1.messagePublished"
STORAGE_FINALIZED = "google.cloud.storage.object.v1.finalized"

# GCS notification eventType -> Eventarc storage CloudEvent type.
STORAGE_TYPES = {
    "OBJECT_FINALIZE": STORAGE_FINALIZED,
    "OBJECT_DELETE": "google.cloud.storage.object.v1.deleted",
    "OBJECT_ARCHIVE": "google.cloud.storage.object.v1.archived",
    "OBJECT_METADATA_UPDATE": "google.cloud.storage.object.v1.metadataUpdated",
}

_PATH = re.compile(r"^/(?P<function>[^/]+)/(?P<topic>projects/[^/]+/topics/[^/?]+)")
FORWARD_TIMEOUT_S = 600.0  # longer than any function may run (540 s)


class PushError(ValueError):
    """A request that is not a Pub/Sub push this adapter can convert."""


@dataclass(frozen=True)
class CloudEventRequest:
    """A binary-mode CloudEvent as an HTTP request: ce-* headers and the JSON data as body."""

    headers: dict[str, str]
    body: bytes


def _message(push: Mapping[str, Any]) -> Mapping[str, Any]:
    message = push.get("message")
    if not isinstance(message, Mapping):
        raise PushError("push body has no message object")
    if not (message.get("messageId") or message.get("message_id")):
        raise PushError("push message has no messageId")
    return message


def _binary(attributes: Mapping[str, str], data: Any) -> CloudEventRequest:
    headers = {f"ce-{k}": v for k, v in attributes.items()}
    headers["Content-Type"] = "application/json"
    return CloudEventRequest(headers, json.dumps(data).encode())


def published_event(push: Mapping[str, Any], topic: str) -> CloudEventRequest:
    """Eventarc's messagePublished CloudEvent for a Pub/Sub push body from topic."""
    message = _message(push)
    return _binary({
        "specversion": "1.0",
        "id": str(message.get("messageId") or message.get("message_id")),
        "source": f"//pubsub.googleapis.com/{topic}",
        "type": PUBSUB_PUBLISHED,
        "time": str(message.get("publishTime") or message.get("publish_time") or ""),
    }, {"message": dict(message), "subscription": push.get("subscription", "")})


def storage_event(push: Mapping[str, Any]) -> CloudEventRequest | None:
    """Eventarc's storage CloudEvent for a GCS Pub/Sub notification; None for other event types."""
    import base64

    message = _message(push)
    attributes = message.get("attributes") or {}
    ce_type = STORAGE_TYPES.get(str(attributes.get("eventType", "")))
    if ce_type is None:
        return None
    try:
        obj = json.loads(base64.b64decode(message.get("data") or ""))
    except ValueError as exc:
        raise PushError(f"notification data is not the object's JSON: {exc}") from exc
    bucket = attributes.get("bucketId") or obj.get("bucket", "")
    name = attributes.get("objectId") or obj.get("name", "")
    return _binary({
        "specversion": "1.0",
        "id": str(message.get("messageId") or message.get("message_id")),
        "source": f"//storage.googleapis.com/projects/_/buckets/{bucket}",
        "subject": f"objects/{name}",
        "type": ce_type,
        "time": str(obj.get("updated") or message.get("publishTime") or ""),
    }, obj)


def convert(push: Mapping[str, Any], topic: str, storage_topics: Sequence[str],
            storage_types: Sequence[str] = (STORAGE_FINALIZED,)) -> CloudEventRequest | None:
    """The CloudEvent to deliver for a push from topic; None: acknowledge without delivering.

    Messages from storage_topics become storage CloudEvents, and only storage_types of them are
    delivered (the filter of an Eventarc trigger); everything else becomes messagePublished.
    """
    if topic.rsplit("/", 1)[-1] in storage_topics:
        event = storage_event(push)
        if event is None or event.headers["ce-type"] not in storage_types:
            return None
        return event
    return published_event(push, topic)


# ------------------------------------------------------------------ server

def _forward(url: str, event: CloudEventRequest) -> tuple[int, bytes]:
    parts = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port or 80,
                                      timeout=FORWARD_TIMEOUT_S)
    try:
        conn.request("POST", parts.path or "/", body=event.body, headers=event.headers)
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def make_handler(routes: Mapping[str, str], storage_topics: Sequence[str]
                 ) -> type[BaseHTTPRequestHandler]:
    """A request handler class bound to the function routes."""

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, as the emulator's HTTP client expects

        def do_GET(self) -> None:
            self._reply(200, b"ok\n")

        def do_POST(self) -> None:
            started = time.monotonic()
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            match = _PATH.match(self.path)
            if match is None or match["function"] not in routes:
                self._reply(404, f"no route for {self.path}\n".encode())
                return
            function, topic = match["function"], match["topic"]
            try:
                push = json.loads(body)
                if not isinstance(push, dict):
                    raise PushError("push body is not a JSON object")
                event = convert(push, topic, storage_topics)
            except (ValueError, PushError) as exc:
                self._log(function, "-", 400, started, str(exc))
                self._reply(400, f"{exc}\n".encode())
                return
            if event is None:
                self._log(function, "-", 204, started, "filtered out")
                self._reply(204, b"")
                return
            event_id = event.headers["ce-id"]
            try:
                status, answer = _forward(routes[function], event)
            except OSError as exc:  # the function is down or timed out: Pub/Sub retries
                status, answer = 503, f"{routes[function]}: {exc}\n".encode()
            self._log(function, event_id, status, started, answer[:200].decode("utf-8", "replace"))
            self._reply(status, answer)

        def _reply(self, status: int, body: bytes) -> None:
            self.send_response(status)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _log(self, function: str, event_id: str, status: int, started: float,
                 note: str) -> None:
            ms = (time.monotonic() - started) * 1000
            note = " ".join(note.split())
            sys.stdout.write(f"{time.strftime('%H:%M:%S')} {function} id={event_id} "
                             f"-> {status} {ms:.0f}ms {note}\n")
            sys.stdout.flush()

        def log_message(self, format: str, *args: Any) -> None:
            pass  # one line per delivery from _log is enough

    return Handler


def main(argv: Sequence[str] | None = None) -> int:
    """Serve until killed."""
    parser = argparse.ArgumentParser(prog="spotorch-push-adapter")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--route", action="append", default=[], metavar="FUNCTION=URL")
    parser.add_argument("--storage-topic", action="append", default=[],
                        help="deliver this topic's GCS notifications as storage CloudEvents")
    args = parser.parse_args(argv)
    routes = dict(r.split("=", 1) for r in args.route)
    server = ThreadingHTTPServer((args.host, args.port), make_handler(routes, args.storage_topic))
    server.daemon_threads = True
    print(f"push adapter listening on {args.host}:{args.port} routes={routes}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
