"""Notification ledgers: which alerts went out (dedupe) and each run's rate-limit state."""

from __future__ import annotations

import copy
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any
from urllib.parse import quote

COLLECTION_NOTIFICATIONS = "notifications"  # one doc per (event, channel); TTL on expires_at
COLLECTION_NOTIFICATION_RUNS = "notification_runs"  # one doc per (run, channel); TTL on expires_at
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


def _claimable(record: Mapping[str, Any] | None, now: float, lease_s: float) -> bool:
    """A record may be (re)claimed when absent, failed, or in flight for longer than a lease."""
    if record is None:
        return True
    state = record.get("state")
    return state == Outcome.FAILED or (
        state == Outcome.SENDING and now - float(record.get("claimed_at", now)) >= lease_s)


def _admit(state: dict[str, Any], kind: str, now: float, limit: int, window_s: float,
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


class InMemoryNotificationLedger:
    """NotificationLedger in dicts behind a lock (one process)."""

    def __init__(self, *, lease_s: float = DEFAULT_LEASE_S) -> None:
        self.lease_s = lease_s
        self.records: dict[str, dict[str, Any]] = {}
        self.runs: dict[str, dict[str, Any]] = {}
        self._lock = threading.Lock()

    def claim(self, event_id: str, channel: str, run_id: str, now: float) -> bool:
        key = record_key(event_id, channel)
        with self._lock:
            if not _claimable(self.records.get(key), now, self.lease_s):
                return False
            self.records[key] = {"event_id": event_id, "channel": channel, "run_id": run_id,
                                 "state": Outcome.SENDING.value, "claimed_at": now}
            return True

    def finish(self, event_id: str, channel: str, outcome: Outcome, now: float,
               detail: str = "", attempts: int = 0) -> None:
        with self._lock:
            record = self.records.setdefault(record_key(event_id, channel), {})
            record.update(state=outcome.value, finished_at=now, detail=detail, attempts=attempts)

    def admit(self, run_id: str, channel: str, kind: str, now: float, *, limit: int,
              window_s: float, always: bool = False) -> Admission:
        with self._lock:
            state = self.runs.setdefault(run_key(run_id, channel), {})
            return _admit(state, kind, now, limit, window_s, always)

    def record(self, event_id: str, channel: str) -> dict[str, Any] | None:
        """The (event, channel) record, for tests and inspection."""
        with self._lock:
            found = self.records.get(record_key(event_id, channel))
            return copy.deepcopy(found)


class FirestoreNotificationLedger:
    """NotificationLedger on Firestore: create() preconditions make a claim win exactly once.

    Records carry `expires_at` (a timestamp) for a TTL policy on both collections.
    """

    def __init__(self, client: Any = None, *, project: str | None = None,
                 database: str | None = None, lease_s: float = DEFAULT_LEASE_S,
                 retention_s: float = DEFAULT_RETENTION_S,
                 collection: str = COLLECTION_NOTIFICATIONS,
                 runs_collection: str = COLLECTION_NOTIFICATION_RUNS) -> None:
        self._client = client
        self._project, self._database = project, database
        self.lease_s, self.retention_s = lease_s, retention_s
        self.collection, self.runs_collection = collection, runs_collection
        self._client_lock = threading.Lock()

    def _db(self) -> Any:
        with self._client_lock:
            if self._client is None:
                from google.cloud import firestore

                kwargs = {"database": self._database} if self._database else {}
                self._client = firestore.Client(project=self._project, **kwargs)
            return self._client

    def _expires(self, now: float) -> datetime:
        return datetime.fromtimestamp(now + self.retention_s, UTC)

    def claim(self, event_id: str, channel: str, run_id: str, now: float) -> bool:
        from google.api_core import exceptions as gexc

        db = self._db()
        ref = db.collection(self.collection).document(record_key(event_id, channel))
        fresh = {"event_id": event_id, "channel": channel, "run_id": run_id,
                 "state": Outcome.SENDING.value, "claimed_at": now,
                 "expires_at": self._expires(now)}
        try:
            ref.create(fresh)
            return True
        except gexc.Conflict:  # AlreadyExists: someone handled (or is handling) this event
            pass
        snapshot = ref.get()
        if not snapshot.exists or not _claimable(snapshot.to_dict(), now, self.lease_s):
            return False  # (vanished: its TTL ran out long after any redelivery)
        try:
            # Take over a failed or abandoned claim only if nobody else did since we read it.
            ref.update(fresh, option=db.write_option(last_update_time=snapshot.update_time))
            return True
        except (gexc.FailedPrecondition, gexc.NotFound, gexc.Conflict):
            return False

    def finish(self, event_id: str, channel: str, outcome: Outcome, now: float,
               detail: str = "", attempts: int = 0) -> None:
        ref = self._db().collection(self.collection).document(record_key(event_id, channel))
        ref.set({"state": outcome.value, "finished_at": now, "detail": detail,
                 "attempts": attempts, "expires_at": self._expires(now)}, merge=True)

    def admit(self, run_id: str, channel: str, kind: str, now: float, *, limit: int,
              window_s: float, always: bool = False) -> Admission:
        from google.cloud import firestore

        db = self._db()
        ref = db.collection(self.runs_collection).document(run_key(run_id, channel))

        @firestore.transactional
        def admit_in(transaction: Any) -> Admission:
            snapshot = ref.get(transaction=transaction)
            state = (snapshot.to_dict() or {}) if snapshot.exists else {}
            admission = _admit(state, kind, now, limit, window_s, always)
            state.update(run_id=run_id, channel=channel, updated_at=now,
                         expires_at=self._expires(now))
            transaction.set(ref, state)
            return admission

        result: Admission = admit_in(db.transaction())
        return result

    def record(self, event_id: str, channel: str) -> dict[str, Any] | None:
        """The (event, channel) record, for tests and inspection."""
        ref = self._db().collection(self.collection).document(record_key(event_id, channel))
        snapshot = ref.get()
        return snapshot.to_dict() if snapshot.exists else None
