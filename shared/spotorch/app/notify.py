"""The notifier: turns spotorch's CloudEvents into Chat, Slack and email alerts, once each.

handle_run_event is the use case (routes, dedupe, rate limit, threading, retries); the Pub/Sub
entry and the channels and ledger built from the environment are in spotorch.entrypoints.alerts.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from enum import StrEnum
from fnmatch import fnmatchcase
from typing import TYPE_CHECKING, Any

from spotorch import logs
from spotorch.core.alert_ledger import Outcome
from spotorch.core.alerts import Alert, render_alert
from spotorch.core.errors import InvalidEvent, SpotorchError
from spotorch.core.events import TERMINAL_KINDS, TYPE_PREFIX, kind_of
from spotorch.logs import redact_secrets
from spotorch.ports.alerts import Channel, ChannelError, NotificationLedger, channel_key

if TYPE_CHECKING:
    from spotorch.core.pipeline import Route

ENV_ALERT_MAX_PER_WINDOW = "SPOTORCH_ALERT_MAX_PER_WINDOW"
ENV_ALERT_WINDOW_S = "SPOTORCH_ALERT_WINDOW_S"
_log = logging.getLogger("spotorch.app.notify")  # JSON lines via spotorch.logs, set up once


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
            log_json("ERROR", f"bad {ENV_ALERT_MAX_PER_WINDOW}/{ENV_ALERT_WINDOW_S}: {exc}")
            return cls()

    def backoff(self, attempt: int) -> float:
        """Seconds to wait before the n-th retry of a send: doubling, capped."""
        return float(min(self.backoff_cap_s, self.backoff_s * 2 ** (attempt - 1)))


def log_json(severity: str, message: str, **fields: Any) -> None:
    """One structured log line, with known secrets and webhook URLs redacted."""
    _log.log(logging.getLevelName(severity), redact_secrets(message),
             extra=logs.extra(**{k: redact_secrets(v) if isinstance(v, str) else v
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
class Identity:
    """What the notifier needs of an event to route and dedupe it."""
    event_id: str
    kind: str
    run_id: str
    pipeline: str


def identity(event: Mapping[str, Any]) -> Identity:
    """The identity of a CloudEvent; InvalidEvent naming what it lacks."""
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
    return Identity(event_id, kind, run_id, pipeline)


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
    return attempt, redact_secrets(error)


def _deliver(event: Mapping[str, Any], ident: Identity, key: str, *,
             ledger: NotificationLedger, channels: Mapping[str, Channel], now: float,
             policy: NotifyPolicy, sleep: Callable[[float], None]) -> Delivery:
    """One event on one channel: dedupe, rate limit, render, send, record."""
    base = {"event_id": ident.event_id, "channel": key, "run_id": ident.run_id,
            "pipeline": ident.pipeline, "kind": ident.kind}
    channel = channels.get(key)
    if channel is None:
        log_json("WARNING", "route names a channel that is not configured", **base)
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
        log_json("INFO", "alert held back by the rate limit", **base)
        return Delivery(ident.event_id, key, DeliveryStatus.HELD)
    alert = render_alert(event, held=admission.held, first=admission.first)
    attempts, error = _send_with_retries(channel, alert, policy, sleep)
    held = alert.held_count
    if error:
        _finish(ledger, ident, key, Outcome.FAILED, now, error, attempts)
        log_json("ERROR", f"alert not delivered: {error}", attempts=attempts,
                  held_summarized=held, **base)
        return Delivery(ident.event_id, key, DeliveryStatus.FAILED, attempts, error, held)
    _finish(ledger, ident, key, Outcome.SENT, now, "", attempts)
    log_json("INFO", "alert sent", attempts=attempts, held_summarized=held, **base)
    return Delivery(ident.event_id, key, DeliveryStatus.SENT, attempts, "", held)


def _finish(ledger: NotificationLedger, ident: Identity, key: str, outcome: Outcome,
            now: float, detail: str, attempts: int) -> None:
    """Record an outcome; a failure here is logged, not raised: the alert's fate is sealed."""
    try:
        ledger.finish(ident.event_id, key, outcome, now, detail, attempts)
    except Exception as exc:
        log_json("WARNING", f"could not record alert outcome: {type(exc).__name__}: {exc}",
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
    ident = identity(event)
    policy = policy or NotifyPolicy()
    try:
        routes = routes_for(ident.pipeline)
    except SpotorchError as exc:  # broken pipeline config: no redelivery will fix it
        log_json("ERROR", f"cannot read routes: {exc}", event_id=ident.event_id,
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
