"""The notifier: turns spotorch's CloudEvents into Chat, Slack and email alerts, once each.

handle_run_event is the service function (routes, dedupe, rate limit, threading, retries);
handle_pubsub_cloudevent is the thin entry functions/main.py calls with a Pub/Sub CloudEvent.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from enum import StrEnum
from fnmatch import fnmatchcase
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from spotorch import logs
from spotorch.adapters.notify.channels import (
    CHANNEL_KINDS,
    DEFAULT_SMTP_PORT,
    ENV_CHAT_WEBHOOK_URL,
    ENV_EMAIL_TO,
    ENV_SLACK_WEBHOOK_URL,
    ENV_SMTP_CA_FILE,
    ENV_SMTP_FROM,
    ENV_SMTP_HOST,
    ENV_SMTP_PASSWORD,
    ENV_SMTP_PORT,
    ENV_SMTP_STARTTLS,
    ENV_SMTP_USER,
    SECRET_ENV,
    BrokenChannel,
    Channel,
    ChannelConfigError,
    ChannelError,
    ChatWebhook,
    EnvChannels,
    NotifyError,
    SecretRef,
    SlackWebhook,
    SmtpEmail,
    StartTls,
    channel_for_target,
    channel_key,
    channels_from_env,
    redact,
)
from spotorch.adapters.notify.ledger import (
    COLLECTION_NOTIFICATION_RUNS,
    COLLECTION_NOTIFICATIONS,
    Admission,
    FirestoreNotificationLedger,
    InMemoryNotificationLedger,
    Outcome,
)
from spotorch.core.alerts import Alert, Severity, render_alert
from spotorch.core.errors import InvalidEvent, SpotorchError
from spotorch.core.events import TERMINAL_KINDS, TYPE_PREFIX, from_pubsub, kind_of
from spotorch.spec.event_schemas import event_problems

if TYPE_CHECKING:
    # Only a type here: the pipeline format (pydantic, ~0.06 s) is imported where the pipeline
    # files are parsed, at the first event's route lookup, not when the function instance loads.
    from spotorch.core.pipeline import Route

__all__ = [
    "CHANNEL_KINDS", "COLLECTION_NOTIFICATIONS", "COLLECTION_NOTIFICATION_RUNS",
    "DEFAULT_SMTP_PORT", "ENV_CHAT_WEBHOOK_URL", "ENV_EMAIL_TO", "ENV_NOTIFY_LEDGER",
    "ENV_SLACK_WEBHOOK_URL", "ENV_SMTP_CA_FILE", "ENV_SMTP_FROM", "ENV_SMTP_HOST",
    "ENV_SMTP_PASSWORD", "ENV_SMTP_PORT", "ENV_SMTP_STARTTLS", "ENV_SMTP_USER",
    "NOTIFY_OPTIONAL_ENV", "SECRET_ENV", "Admission", "Alert", "BrokenChannel", "Channel",
    "ChannelConfigError", "ChannelError", "ChatWebhook", "Delivery", "DeliveryStatus",
    "EnvChannels", "FirestoreNotificationLedger", "InMemoryNotificationLedger",
    "NotificationLedger", "NotifyError", "NotifyPolicy", "Outcome", "SecretRef", "Severity",
    "SlackWebhook", "SmtpEmail", "StartTls", "channel_for_target", "channels_from_env",
    "decode_pubsub_cloudevent", "handle_pubsub_cloudevent", "handle_run_event",
    "ledger_from_env", "redact", "render_alert", "reset_runtime", "route_matches",
    "routes_from_pipelines", "selected_channels",
]

ENV_NOTIFY_LEDGER = "SPOTORCH_NOTIFY_LEDGER"  # firestore (default) | memory (one process only)
ENV_ALERT_MAX_PER_WINDOW = "SPOTORCH_ALERT_MAX_PER_WINDOW"
ENV_ALERT_WINDOW_S = "SPOTORCH_ALERT_WINDOW_S"
NOTIFY_OPTIONAL_ENV = (ENV_SMTP_STARTTLS, ENV_SMTP_CA_FILE, ENV_NOTIFY_LEDGER,
                       ENV_ALERT_MAX_PER_WINDOW, ENV_ALERT_WINDOW_S)

_log = logging.getLogger("spotorch.app.notify")  # JSON lines via spotorch.logs, set up once


class NotificationLedger(Protocol):
    """Remembers which (event, channel) alerts went out and each (run, channel)'s rate limit."""

    def claim(self, event_id: str, channel: str, run_id: str, now: float) -> bool:
        """Take the right to send this event on this channel; False if sent, held or in flight.

        A failed record, or a claim older than the lease (its sender died), can be taken again.
        Of two concurrent claims exactly one wins.
        """
        ...

    def finish(self, event_id: str, channel: str, outcome: Outcome, now: float,
               detail: str = "", attempts: int = 0) -> None:
        """Record how a claimed send ended."""
        ...

    def admit(self, run_id: str, channel: str, kind: str, now: float, *, limit: int,
              window_s: float, always: bool = False) -> Admission:
        """Count one alert against the run's limit on this channel, atomically.

        When allowed, returns (and clears) the kinds held back since the last alert; when not,
        counts this kind as held. `always` (terminal events) passes regardless of the limit.
        """
        ...


class DeliveryStatus(StrEnum):
    """What became of one event on one channel."""

    SENT = "sent"
    DUPLICATE = "duplicate"  # already sent, held or being sent: a redelivery; nothing done
    HELD = "held"  # rate limit; summarized in the run's next alert on this channel
    FAILED = "failed"  # permanent error or retries exhausted; logged and recorded
    UNCONFIGURED = "unconfigured"  # a route names a channel this deployment has no settings for


@dataclass(frozen=True)
class Delivery:
    """The outcome of one event on one channel."""

    event_id: str
    channel: str  # channel key: "chat", "slack", "email", or "kind:target" for a targeted route
    status: DeliveryStatus
    attempts: int = 0
    detail: str = ""  # redacted: safe to log
    held_summarized: int = 0  # held-back alerts this one summarized


@dataclass(frozen=True)
class NotifyPolicy:
    """Rate limit and retry settings of the notifier."""

    max_alerts_per_window: int = 5  # per (run, channel)
    window_s: float = 600.0
    # Ends of runs, and the moments that change what a run costs, always reach people.
    always_send: frozenset[str] = field(
        default_factory=lambda: TERMINAL_KINDS | {"run.escalated", "run.deadline_at_risk"})
    max_attempts: int = 3  # per channel and event; then the failure is logged and recorded
    backoff_s: float = 0.5  # doubled after every attempt, capped
    backoff_cap_s: float = 4.0

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> NotifyPolicy:
        """Defaults, with the rate limit overridable by SPOTORCH_ALERT_* variables."""
        try:
            return cls(max_alerts_per_window=int(env.get(ENV_ALERT_MAX_PER_WINDOW,
                                                         cls.max_alerts_per_window)),
                       window_s=float(env.get(ENV_ALERT_WINDOW_S, cls.window_s)))
        except ValueError as exc:  # a typo must not stop alerts: say so and use the defaults
            _log_json("ERROR", f"bad {ENV_ALERT_MAX_PER_WINDOW}/{ENV_ALERT_WINDOW_S}: {exc}")
            return cls()

    def backoff(self, attempt: int) -> float:
        return float(min(self.backoff_cap_s, self.backoff_s * 2 ** (attempt - 1)))


def _log_json(severity: str, message: str, **fields: Any) -> None:
    """One structured log line, with known secrets and webhook URLs redacted."""
    _log.log(logging.getLevelName(severity), redact(message),
             extra=logs.extra(**{k: redact(v) if isinstance(v, str) else v
                                 for k, v in fields.items()}))


# --- routing -------------------------------------------------------------------------------------


def route_matches(pattern: str, kind: str) -> bool:
    """Whether a route's event pattern selects a kind.

    "*" matches everything; otherwise fnmatch on the kind ("run.*", "*.failed"), a dot-bounded
    suffix of the kind ("failed" matches run.failed), or the full type (dev.spotorch.run.failed.v1).
    """
    if pattern.startswith(TYPE_PREFIX):
        with contextlib.suppress(ValueError):
            pattern = kind_of(pattern)
    return pattern == "*" or fnmatchcase(kind, pattern) or kind.endswith(f".{pattern}")


def selected_channels(routes: Sequence[Route], kind: str) -> list[str]:
    """Channel keys the routes send this kind to, each once, in route order."""
    keys: list[str] = []
    for route in routes:
        key = channel_key(route.channel, route.target)
        if key not in keys and any(route_matches(p, kind) for p in route.events):
            keys.append(key)
    return keys


# --- the service function ----------------------------------------------------------------------


@dataclass(frozen=True)
class _Identity:
    event_id: str
    kind: str
    run_id: str
    pipeline: str


def _identity(event: Mapping[str, Any]) -> _Identity:
    data = event.get("data")
    event_id, type_ = str(event.get("id", "")), str(event.get("type", ""))
    if not isinstance(data, Mapping) or not event_id:
        raise InvalidEvent("event has no id or no data object", event_id=event_id,
                           event_type=type_)
    try:
        kind = kind_of(type_)
    except ValueError as exc:
        raise InvalidEvent(str(exc), event_id=event_id, event_type=type_) from None
    run_id, pipeline = data.get("run_id"), data.get("pipeline")
    if not isinstance(run_id, str) or not run_id or not isinstance(pipeline, str) or not pipeline:
        raise InvalidEvent("event data lacks run_id or pipeline", event_id=event_id,
                           event_type=type_)
    return _Identity(event_id, kind, run_id, pipeline)


def _send_with_retries(channel: Channel, alert: Alert, policy: NotifyPolicy,
                       sleep: Callable[[float], None]) -> tuple[int, str]:
    """Attempts made and the last error ("" when sent); only transient errors are retried."""
    attempt, error = 0, ""
    while attempt < policy.max_attempts:
        attempt += 1
        try:
            channel.send(alert)
            return attempt, ""
        except ChannelError as exc:
            error = str(exc)
            if exc.permanent:
                break
        except Exception as exc:  # a channel bug must not cost the other channels their alert
            error = f"{type(exc).__name__}: {exc}"
        if attempt < policy.max_attempts:
            sleep(policy.backoff(attempt))
    return attempt, redact(error)


def _deliver(event: Mapping[str, Any], ident: _Identity, key: str, *,
             ledger: NotificationLedger, channels: Mapping[str, Channel], now: float,
             policy: NotifyPolicy, sleep: Callable[[float], None]) -> Delivery:
    """One event on one channel: dedupe, rate limit, render, send, record."""
    base = {"event_id": ident.event_id, "channel": key, "run_id": ident.run_id,
            "pipeline": ident.pipeline, "kind": ident.kind}
    channel = channels.get(key)
    if channel is None:
        _log_json("WARNING", "route names a channel that is not configured", **base)
        return Delivery(ident.event_id, key, DeliveryStatus.UNCONFIGURED,
                        detail="no settings for this channel")
    if not ledger.claim(ident.event_id, key, ident.run_id, now):
        return Delivery(ident.event_id, key, DeliveryStatus.DUPLICATE)
    try:
        admission = ledger.admit(ident.run_id, key, ident.kind, now,
                                 limit=policy.max_alerts_per_window, window_s=policy.window_s,
                                 always=ident.kind in policy.always_send)
    except Exception:
        # Release the claim so the redelivery this exception causes can try again.
        _finish(ledger, ident, key, Outcome.FAILED, now, "rate limit state unavailable", 0)
        raise
    if not admission.allowed:
        _finish(ledger, ident, key, Outcome.HELD, now, "", 0)
        _log_json("INFO", "alert held back by the rate limit", **base)
        return Delivery(ident.event_id, key, DeliveryStatus.HELD)
    alert = render_alert(event, held=admission.held, first=admission.first)
    attempts, error = _send_with_retries(channel, alert, policy, sleep)
    held = alert.held_count
    if error:
        _finish(ledger, ident, key, Outcome.FAILED, now, error, attempts)
        _log_json("ERROR", f"alert not delivered: {error}", attempts=attempts,
                  held_summarized=held, **base)
        return Delivery(ident.event_id, key, DeliveryStatus.FAILED, attempts, error, held)
    _finish(ledger, ident, key, Outcome.SENT, now, "", attempts)
    _log_json("INFO", "alert sent", attempts=attempts, held_summarized=held, **base)
    return Delivery(ident.event_id, key, DeliveryStatus.SENT, attempts, "", held)


def _finish(ledger: NotificationLedger, ident: _Identity, key: str, outcome: Outcome,
            now: float, detail: str, attempts: int) -> None:
    """Record an outcome; a failure here is logged, not raised: the alert's fate is sealed."""
    try:
        ledger.finish(ident.event_id, key, outcome, now, detail, attempts)
    except Exception as exc:
        _log_json("WARNING", f"could not record alert outcome: {type(exc).__name__}: {exc}",
                  event_id=ident.event_id, channel=key, outcome=outcome.value)


def handle_run_event(event: Mapping[str, Any], *, routes_for: Callable[[str], Sequence[Route]],
                     ledger: NotificationLedger, channels: Mapping[str, Channel], now: float,
                     policy: NotifyPolicy | None = None,
                     sleep: Callable[[float], None] = time.sleep) -> list[Delivery]:
    """Send one spotorch event to the channels its pipeline's routes select; one Delivery each.

    Never raises for a channel failure (retried, logged, recorded). Raises InvalidEvent for an
    event without id/type/run/pipeline, and lets ledger errors through: nothing was sent twice
    yet, and the redelivery that an exception causes is deduplicated by the ledger.
    """
    ident = _identity(event)
    policy = policy or NotifyPolicy()
    try:
        routes = routes_for(ident.pipeline)
    except SpotorchError as exc:  # broken pipeline config: no redelivery will fix it
        _log_json("ERROR", f"cannot read routes: {exc}", event_id=ident.event_id,
                  pipeline=ident.pipeline)
        return []
    keys = selected_channels(routes, ident.kind)

    def one(key: str) -> Delivery:
        return _deliver(event, ident, key, ledger=ledger, channels=channels, now=now,
                        policy=policy, sleep=sleep)

    if len(keys) <= 1:
        return [one(key) for key in keys]
    # In parallel, so a channel that times out does not delay the others.
    with ThreadPoolExecutor(max_workers=len(keys), thread_name_prefix="notify") as pool:
        futures = [pool.submit(one, key) for key in keys]
        return [future.result() for future in futures]


# --- the Pub/Sub entry -------------------------------------------------------------------------


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
    ident = _identity(event)
    try:
        problems = event_problems(event)
    except FileNotFoundError as exc:  # schemas not bundled: still alert, but say so
        _log_json("ERROR", f"cannot validate events: {exc}", event_id=ident.event_id)
        return event
    envelope = [f"{path}: {msg}" for path, msg in problems if not path.startswith("data")]
    if envelope:
        raise InvalidEvent("; ".join(envelope), event_id=ident.event_id,
                           event_type=str(event.get("type")))
    if problems:
        _log_json("WARNING", "event data does not match its schema",
                  event_id=ident.event_id, problems=[f"{p}: {m}" for p, m in problems])
    return event


def routes_from_pipelines(path: str) -> Callable[[str], Sequence[Route]]:
    """Routes of each pipeline, from the pipelines loaded once per process (spotorch.spec.loader)."""

    def routes_for(pipeline: str) -> Sequence[Route]:
        from spotorch.spec.loader import cached_pipelines

        routes = {p.name: p.routes for p in cached_pipelines(Path(path))}.get(pipeline)
        if routes is None:
            _log_json("WARNING", "event of an unknown pipeline: no alert routes",
                      pipeline=pipeline)
        return routes or ()

    return routes_for


def ledger_from_env(env: Mapping[str, str]) -> NotificationLedger:
    """Firestore ledger of this deployment (or in-memory with SPOTORCH_NOTIFY_LEDGER=memory)."""
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
