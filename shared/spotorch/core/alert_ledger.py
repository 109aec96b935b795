"""The alert ledger's rules: when an (event, channel) may be sent, and each run's rate limit.

Pure: the ledgers (Firestore, in memory) keep the state; these decide on it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any
from urllib.parse import quote

DEFAULT_LEASE_S = 900.0  # longer than a function's 540 s timeout: an older claim's sender is dead
DEFAULT_RETENTION_S = 14 * 24 * 3600.0  # longer than Pub/Sub keeps redelivering (7 days)


class Outcome(StrEnum):
    """State of one (event, channel) record."""

    SENDING = "sending"  # claimed; the send is in flight (or its sender died: see the lease)
    SENT = "sent"
    HELD = "held"  # the rate limit held it back; counted in the run's next alert
    FAILED = "failed"  # retries exhausted or permanent error; a redelivery may try again


@dataclass(frozen=True)
class Admission:
    """The rate limit's answer for one alert."""

    allowed: bool
    held: Mapping[str, int] = field(default_factory=dict)  # kinds held back since the last alert
    first: bool = False  # no alert of this run went out on this channel before


def record_key(event_id: str, channel: str) -> str:
    """Document id of an (event, channel) record: injective and safe for Firestore ids."""
    return quote(f"{event_id}|{channel}", safe=":@|-_.~")


def run_key(run_id: str, channel: str) -> str:
    """Document id of a run's rate-limit state on one channel."""
    return quote(f"{run_id}|{channel}", safe=":@|-_.~")


def claimable(record: Mapping[str, Any] | None, now: float, lease_s: float) -> bool:
    """A record may be (re)claimed when absent, failed, or in flight for longer than a lease."""
    if record is None:
        return True
    state = record.get("state")
    return state == Outcome.FAILED or (
        state == Outcome.SENDING and now - float(record.get("claimed_at", now)) >= lease_s)


def admit(state: dict[str, Any], kind: str, now: float, limit: int, window_s: float,
           always: bool) -> Admission:
    """Fixed-window limit; mutates the run's state. Admitting takes (and clears) the held counts."""
    if now - float(state.get("window_start", now)) >= window_s or "window_start" not in state:
        state["window_start"], state["in_window"] = now, 0
    if not always and int(state.get("in_window", 0)) >= limit:
        held = dict(state.get("held") or {})
        held[kind] = int(held.get(kind, 0)) + 1
        state["held"] = held
        return Admission(False)
    admission = Admission(True, dict(state.get("held") or {}), int(state.get("sent", 0)) == 0)
    state["in_window"] = int(state.get("in_window", 0)) + 1
    state["sent"] = int(state.get("sent", 0)) + 1
    state["held"] = {}
    return admission


