"""Local stand-in for Pub/Sub push and Eventarc: delivers each subscription to its function.

The Pub/Sub emulator's own push is kinder and crueller than Pub/Sub: a refused push is retried
two or three times within seconds and then never again, and never dead-lettered (checked: 62
messages lost while a function was down). So the stack's subscriptions are pull subscriptions
(with the dead-letter policy), and this process does what Pub/Sub push does for them:

- it pulls each subscription and POSTs every message to its function, either as the CloudEvent
  Eventarc would post (mode eventarc: binary mode, the topic as source, "subscription" kept)
  or as the raw push body Pub/Sub sends (mode direct: {"message", "subscription",
  "deliveryAttempt"} to the function's URL with the topic in the path, as deploy/pubsub.tf);
- a 2xx answer acknowledges; anything else, or no answer within the ack deadline, is a failed
  delivery: the message comes back after the retry policy's exponential backoff (minimum
  backoff x 2^(attempt-1), at most the maximum backoff), until the dead-letter policy's
  max_delivery_attempts, when the emulator moves it to the dead-letter topic;
- the message stays in the emulator until acknowledged: a function that is down, or this
  process dying, loses nothing (a lease it held runs out and the emulator hands the message
  out again).

The retry policy lives here, not on the emulator's subscription: with one, the emulator ignores
a delay asked for (modifyAckDeadline) after the third attempt and stops delivering (checked).
Messages with an ordering key are delivered one at a time per key, in the order pulled; a failed
one is retried after its backoff while later ones of its key go on (Pub/Sub would hold them).

Run as `python -m spotorch.local._push_adapter --port P --pubsub HOST:PORT --project X
--deliver SUBSCRIPTION=TOPIC=URL ... [--mode eventarc|direct] [--storage-topic T]
[--min-backoff S --max-backoff S] [--ack-deadline S] [--max-delivery-attempts N]`; GET / on the
port answers "ok" (readiness).
"""

from __future__ import annotations

import argparse
import heapq
import http.client
import json
import math
import sys
import threading
import time
import urllib.parse
import warnings
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
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


# ------------------------------------------------------------------ delivery

def retry_backoff_s(attempt: int, min_s: float | None, max_s: float) -> float:
    """How long a message that failed its attempt-th delivery waits before the next one: the
    subscription's retry policy (exponential between its minimum and maximum backoff); no
    policy (min_s None) redelivers at once."""
    if min_s is None:
        return 0.0
    return float(min(max_s, min_s * 2 ** max(attempt - 1, 0)))


def push_body(message: Any, subscription: str, delivery_attempt: int) -> dict[str, Any]:
    """The JSON body Pub/Sub pushes for a pulled message (deliveryAttempt: with a dead-letter
    policy)."""
    import base64

    published = message.publish_time.rfc3339() if message.publish_time else ""
    body: dict[str, Any] = {
        "message": {"data": base64.b64encode(bytes(message.data)).decode(),
                    "attributes": dict(message.attributes), "messageId": message.message_id,
                    "message_id": message.message_id, "publishTime": published,
                    "publish_time": published},
        "subscription": subscription, "deliveryAttempt": delivery_attempt}
    if message.ordering_key:
        body["message"]["orderingKey"] = message.ordering_key
    return body


@dataclass(frozen=True)
class Route:
    """One subscription and where its messages go."""

    subscription: str  # projects/P/subscriptions/S
    topic: str  # projects/P/topics/T
    url: str  # the function's base URL
    function: str


@dataclass(frozen=True)
class Policy:
    """What Pub/Sub would apply to a push subscription: retry backoff, attempts, ack deadline."""

    min_backoff_s: float | None = 10.0
    max_backoff_s: float = 600.0
    max_delivery_attempts: int = 5
    ack_deadline_s: float = 60.0


def _forward(url: str, event: CloudEventRequest, timeout_s: float) -> tuple[int, bytes]:
    parts = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port or 80,
                                      timeout=timeout_s)
    try:
        conn.request("POST", parts.path or "/", body=event.body, headers=event.headers)
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


class Pump:
    """Pulls every route's subscription and delivers its messages as Pub/Sub push would."""

    def __init__(self, address: str, routes: Sequence[Route], policy: Policy, *,
                 mode: str = "eventarc", storage_topics: Sequence[str] = (),
                 workers: int = 16) -> None:
        import grpc
        from google.pubsub_v1 import SubscriberClient
        from google.pubsub_v1.services.subscriber.transports import SubscriberGrpcTransport

        self.routes = list(routes)
        self.policy = policy
        self.mode = mode
        self.storage_topics = list(storage_topics)
        self._client = SubscriberClient(transport=SubscriberGrpcTransport(
            channel=grpc.insecure_channel(address)))
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="push")
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        self._keyed: dict[tuple[str, str], list[Any]] = {}  # (subscription, key) -> waiting
        self._timers: list[tuple[float, int, str, str]] = []  # (due, seq, subscription, ack id)
        self._timer_wake = threading.Condition(self._lock)
        self._seq = 0
        self._threads: list[threading.Thread] = []

    def start(self) -> None:
        for route in self.routes:
            thread = threading.Thread(target=self._pull_loop, args=(route,), daemon=True,
                                      name=f"pull-{route.function}")
            thread.start()
            self._threads.append(thread)
        timers = threading.Thread(target=self._timer_loop, daemon=True, name="push-backoff")
        timers.start()
        self._threads.append(timers)

    def stop(self) -> None:
        self._stopping.set()
        with self._lock:
            self._timer_wake.notify_all()
        self._pool.shutdown(wait=False, cancel_futures=True)

    # -- pulling

    def _pull_loop(self, route: Route) -> None:
        while not self._stopping.is_set():
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", DeprecationWarning)
                    # Held open by the emulator until a message comes (or about 2 s pass).
                    response = self._client.pull(request={
                        "subscription": route.subscription, "max_messages": 50,
                        "return_immediately": False}, timeout=30)
            except Exception as exc:  # the emulator restarting, the subscription not made yet
                _say(f"{route.function} pull failed, retrying: {str(exc)[:120]}")
                self._stopping.wait(0.5)
                continue
            for received in response.received_messages:
                self._accept(route, received)

    def _accept(self, route: Route, received: Any) -> None:
        key = received.message.ordering_key
        if not key:
            self._pool.submit(self._deliver, route, received)
            return
        with self._lock:
            waiting = self._keyed.get((route.subscription, key))
            if waiting is not None:
                waiting.append(received)  # its key's runner delivers it after those before it
                return
            self._keyed[(route.subscription, key)] = []
        self._pool.submit(self._in_order, route, key, received)

    def _in_order(self, route: Route, key: str, received: Any) -> None:
        while True:
            self._deliver(route, received)
            with self._lock:
                waiting = self._keyed[(route.subscription, key)]
                if not waiting:
                    del self._keyed[(route.subscription, key)]
                    return
                received = waiting.pop(0)

    # -- one delivery

    def _deliver(self, route: Route, received: Any) -> None:
        started = time.monotonic()
        attempt = int(received.delivery_attempt or 1)
        message_id = received.message.message_id
        push = push_body(received.message, route.subscription, attempt)
        try:
            if self.mode == "direct":
                event: CloudEventRequest | None = CloudEventRequest(
                    {"Content-Type": "application/json"}, json.dumps(push).encode())
                url = route.url.rstrip("/") + "/" + route.topic
            else:
                event = convert(push, route.topic, self.storage_topics)
                url = route.url
        except (ValueError, PushError) as exc:  # Pub/Sub would push it; the function says 400
            event, url = None, route.url
            status, answer = 400, str(exc).encode()
        else:
            if event is None:  # not what the trigger's filter lets through
                self._ack(route, received)
                _log(route.function, message_id, attempt, 204, started, "filtered out")
                return
            try:
                # Pub/Sub waits for the answer as long as the ack deadline, no longer.
                status, answer = _forward(url, event, self.policy.ack_deadline_s)
            except OSError as exc:  # down, refused, timed out: a failed delivery
                status, answer = 503, f"{url}: {exc}".encode()
        if 200 <= status < 300 or status == 102:
            self._ack(route, received)
            _log(route.function, message_id, attempt, status, started, "")
            return
        note = answer[:160].decode("utf-8", "replace")
        if attempt >= self.policy.max_delivery_attempts:
            self._later(route, received.ack_id, 0.0)  # the emulator dead-letters it now
            _log(route.function, message_id, attempt, status, started, f"{note} -> dead letter")
            return
        wait = retry_backoff_s(attempt, self.policy.min_backoff_s, self.policy.max_backoff_s)
        self._later(route, received.ack_id, wait)
        _log(route.function, message_id, attempt, status, started, f"{note} -> again in {wait:g}s")

    def _ack(self, route: Route, received: Any) -> None:
        try:
            self._client.acknowledge(subscription=route.subscription, ack_ids=[received.ack_id])
        except Exception as exc:  # the lease ran out: it comes again (at least once)
            _say(f"ack of {received.message.message_id} failed: {str(exc)[:120]}")

    def _modack(self, subscription: str, ack_id: str, seconds: int) -> None:
        try:
            self._client.modify_ack_deadline(subscription=subscription, ack_ids=[ack_id],
                                             ack_deadline_seconds=seconds)
        except Exception as exc:  # the lease ran out: the emulator hands it out again anyway
            _say(f"modifyAckDeadline failed: {str(exc)[:120]}")

    def _later(self, route: Route, ack_id: str, wait_s: float) -> None:
        """Hand the message back to the emulator after wait_s (its next delivery attempt).

        The lease is first stretched past the wait, so that the emulator keeps it meanwhile (and
        redelivers it by itself if this process dies), then ended exactly at the wait."""
        if wait_s <= 0.0:
            self._modack(route.subscription, ack_id, 0)
            return
        self._modack(route.subscription, ack_id, min(math.ceil(wait_s) + 2, 600))
        with self._lock:
            self._seq += 1
            heapq.heappush(self._timers, (time.monotonic() + wait_s, self._seq,
                                          route.subscription, ack_id))
            self._timer_wake.notify()

    def _timer_loop(self) -> None:
        while not self._stopping.is_set():
            with self._lock:
                while not self._stopping.is_set() and (
                        not self._timers or self._timers[0][0] > time.monotonic()):
                    timeout = self._timers[0][0] - time.monotonic() if self._timers else None
                    self._timer_wake.wait(timeout)
                if self._stopping.is_set():
                    return
                _, _, subscription, ack_id = heapq.heappop(self._timers)
            self._modack(subscription, ack_id, 0)


def _say(text: str) -> None:
    sys.stdout.write(f"{time.strftime('%H:%M:%S')} {text}\n")
    sys.stdout.flush()


def _log(function: str, message_id: str, attempt: int, status: int, started: float,
         note: str) -> None:
    ms = (time.monotonic() - started) * 1000
    _say(f"{function} id={message_id} attempt={attempt} -> {status} {ms:.0f}ms "
         f"{' '.join(note.split())}")


# ------------------------------------------------------------------ readiness

class _Health(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        body = b"ok\n"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


def _route(spec: str, project: str) -> Route:
    """SUBSCRIPTION=TOPIC=FUNCTION=URL (short names; the project is added)."""
    subscription, topic, function, url = spec.split("=", 3)
    return Route(f"projects/{project}/subscriptions/{subscription}",
                 f"projects/{project}/topics/{topic}", url, function)


def main(argv: Sequence[str] | None = None) -> int:
    """Deliver until killed."""
    parser = argparse.ArgumentParser(prog="spotorch-push-adapter")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--pubsub", required=True, help="the Pub/Sub emulator, HOST:PORT")
    parser.add_argument("--project", required=True)
    parser.add_argument("--deliver", action="append", default=[],
                        metavar="SUBSCRIPTION=TOPIC=FUNCTION=URL")
    parser.add_argument("--mode", choices=("eventarc", "direct"), default="eventarc")
    parser.add_argument("--storage-topic", action="append", default=[],
                        help="deliver this topic's GCS notifications as storage CloudEvents")
    parser.add_argument("--min-backoff", type=float, default=None,
                        help="the retry policy's minimum backoff (none: redeliver at once)")
    parser.add_argument("--max-backoff", type=float, default=600.0)
    parser.add_argument("--max-delivery-attempts", type=int, default=5)
    parser.add_argument("--ack-deadline", type=float, default=60.0)
    args = parser.parse_args(argv)
    routes = [_route(spec, args.project) for spec in args.deliver]
    policy = Policy(args.min_backoff, args.max_backoff, args.max_delivery_attempts,
                    args.ack_deadline)
    pump = Pump(args.pubsub, routes, policy, mode=args.mode, storage_topics=args.storage_topic)
    server = ThreadingHTTPServer((args.host, args.port), _Health)
    server.daemon_threads = True
    pump.start()
    delivered = ", ".join(f"{r.subscription.rsplit('/', 1)[-1]} -> {r.function}" for r in routes)
    print(f"push adapter listening on {args.host}:{args.port}, delivering {delivered} "
          f"({args.mode}; backoff {args.min_backoff}..{args.max_backoff}s, "
          f"{args.max_delivery_attempts} attempts)", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        pump.stop()
        server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
