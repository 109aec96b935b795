"""The notifier's entry (function on_run_event): a Pub/Sub CloudEvent in, alerts out.

The event is decoded and checked here; the channels, the ledger and the routes are built from
the environment once per process; spotorch.app.notify decides and sends.
"""

from __future__ import annotations

import base64
import binascii
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from spotorch.adapters.notify.channels import ENV_SMTP_CA_FILE, ENV_SMTP_STARTTLS
from spotorch.app.notify import (
    ENV_ALERT_MAX_PER_WINDOW,
    ENV_ALERT_WINDOW_S,
    Delivery,
    NotifyPolicy,
    handle_run_event,
    identity,
    log_json,
)
from spotorch.core.errors import InvalidEvent
from spotorch.core.events import from_pubsub
from spotorch.ports.alerts import Channel, NotificationLedger

if TYPE_CHECKING:
    from spotorch.core.pipeline import Route

ENV_NOTIFY_LEDGER = "SPOTORCH_NOTIFY_LEDGER"  # firestore (default) | memory (one process only)
# What the notifier reads besides its secrets (deploy/ may set them).
NOTIFY_OPTIONAL_ENV = (ENV_SMTP_STARTTLS, ENV_SMTP_CA_FILE, ENV_NOTIFY_LEDGER,
                       ENV_ALERT_MAX_PER_WINDOW, ENV_ALERT_WINDOW_S)

def _field(obj: Any, name: str) -> Any:
    if isinstance(obj, Mapping):
        return obj.get(name)
    try:
        return obj[name]  # cloudevents' CloudEvent exposes attributes by subscript
    except (KeyError, TypeError):
        return getattr(obj, name, None)


def decode_pubsub_cloudevent(cloud_event: Any) -> dict[str, Any]:
    """The spotorch event inside a Pub/Sub messagePublished CloudEvent; InvalidEvent if malformed.

    Data-field problems against the JSON Schemas are logged, not rejected: an alert about a run
    that failed is worth more than a perfect payload.
    """
    envelope_id, envelope_type = str(_field(cloud_event, "id") or ""), \
        str(_field(cloud_event, "type") or "")
    data = getattr(cloud_event, "data", None) if not isinstance(cloud_event, Mapping) \
        else cloud_event.get("data")
    message = data.get("message") if isinstance(data, Mapping) else None
    payload = message.get("data") if isinstance(message, Mapping) else None
    if not isinstance(payload, str | bytes):
        raise InvalidEvent("not a Pub/Sub message: no data.message.data", event_id=envelope_id,
                           event_type=envelope_type)
    try:
        event = from_pubsub(base64.b64decode(payload, validate=True))
    except (ValueError, binascii.Error) as exc:
        raise InvalidEvent(f"message data is not a spotorch CloudEvent: {exc}",
                           event_id=envelope_id, event_type=envelope_type) from None
    ident = identity(event)
    from spotorch.spec.event_schemas import event_problems

    try:
        problems = event_problems(event)
    except FileNotFoundError as exc:  # schemas not bundled: still alert, but say so
        log_json("ERROR", f"cannot validate events: {exc}", event_id=ident.event_id)
        return event
    envelope = [f"{path}: {msg}" for path, msg in problems if not path.startswith("data")]
    if envelope:
        raise InvalidEvent("; ".join(envelope), event_id=ident.event_id,
                           event_type=str(event.get("type")))
    if problems:
        log_json("WARNING", "event data does not match its schema",
                  event_id=ident.event_id, problems=[f"{p}: {m}" for p, m in problems])
    return event


def routes_from_pipelines(path: str) -> Callable[[str], Sequence[Route]]:
    """Routes of each pipeline, from the pipelines loaded once per process (spotorch.spec.compiled)."""

    def routes_for(pipeline: str) -> Sequence[Route]:
        from spotorch.spec.compiled import function_pipelines

        routes = {p.name: p.routes for p in function_pipelines(Path(path))}.get(pipeline)
        if routes is None:
            log_json("WARNING", "event of an unknown pipeline: no alert routes",
                      pipeline=pipeline)
        return routes or ()

    return routes_for


def ledger_from_env(env: Mapping[str, str]) -> NotificationLedger:
    """Firestore ledger of this deployment (or in-memory with SPOTORCH_NOTIFY_LEDGER=memory)."""
    from spotorch.adapters.gcp.notification_ledger import FirestoreNotificationLedger
    from spotorch.adapters.memory.notification_ledger import InMemoryNotificationLedger
    from spotorch.settings import Settings

    if env.get(ENV_NOTIFY_LEDGER, "firestore").lower() == "memory":
        return InMemoryNotificationLedger()
    settings = Settings.from_env(env)
    return FirestoreNotificationLedger(project=settings.project,
                                       database=settings.firestore_database)


@dataclass(frozen=True)
class _Runtime:
    routes_for: Callable[[str], Sequence[Route]]
    ledger: NotificationLedger
    channels: Mapping[str, Channel]
    policy: NotifyPolicy


_runtime: _Runtime | None = None
_runtime_lock = threading.Lock()


def _process_runtime() -> _Runtime:
    """Ledger, channels and routes from the environment, once per process (warm starts reuse)."""
    global _runtime
    with _runtime_lock:
        if _runtime is None:
            from spotorch.adapters.notify.channels import EnvChannels
            from spotorch.settings import Settings

            env = dict(os.environ)
            _runtime = _Runtime(routes_from_pipelines(Settings.from_env(env).pipelines),
                                ledger_from_env(env), EnvChannels(env), NotifyPolicy.from_env(env))
        return _runtime


def reset_runtime() -> None:
    """Forget the cached runtime (tests; or after changing the environment)."""
    global _runtime
    with _runtime_lock:
        _runtime = None


def handle_pubsub_cloudevent(cloud_event: Any, *,
                             routes_for: Callable[[str], Sequence[Route]] | None = None,
                             ledger: NotificationLedger | None = None,
                             channels: Mapping[str, Channel] | None = None,
                             now: float | None = None) -> list[Delivery]:
    """Entry for on_run_event: decode the Pub/Sub CloudEvent and notify; InvalidEvent if malformed.

    Anything not given is built from the environment once per process.
    """
    event = decode_pubsub_cloudevent(cloud_event)
    policy = None
    if routes_for is None or ledger is None or channels is None:
        runtime = _process_runtime()
        routes_for = runtime.routes_for if routes_for is None else routes_for
        ledger = runtime.ledger if ledger is None else ledger
        channels = runtime.channels if channels is None else channels
        policy = runtime.policy
    return handle_run_event(event, routes_for=routes_for, ledger=ledger, channels=channels,
                            now=time.time() if now is None else now, policy=policy)
