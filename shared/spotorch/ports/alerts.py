"""The alert ports: a channel that delivers one alert, and the ledger of what went out."""

from __future__ import annotations

from typing import Protocol

from spotorch.core.alert_ledger import Admission, Outcome
from spotorch.core.alerts import Alert
from spotorch.core.errors import SpotorchError

CHANNEL_KINDS = ("chat", "slack", "email")


class NotifyError(SpotorchError):
    """Base of the notifier's errors."""


class ChannelError(NotifyError):
    """A channel could not deliver; `permanent` says whether trying again can help."""

    def __init__(self, message: str, *, permanent: bool) -> None:
        super().__init__(message)
        self.permanent = permanent


class ChannelConfigError(ChannelError):
    """A channel is misconfigured (missing setting, unresolvable secret): retrying cannot help."""

    def __init__(self, message: str) -> None:
        super().__init__(message, permanent=True)


class Channel(Protocol):
    """Delivers one alert; raises ChannelError (or anything else) when it cannot."""

    def send(self, alert: Alert) -> None:
        """Deliver one alert; ChannelError on failure (its permanent flag says whether retrying helps)."""
        ...


def channel_key(kind: str, target: str = "") -> str:
    """Name of a route's channel: the kind, or kind:target when the route picks a destination."""
    return f"{kind}:{target}" if target else kind


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
