"""The alert ledger on Firestore: create() preconditions make a claim win exactly once."""

from __future__ import annotations

import threading
from datetime import UTC, datetime
from typing import Any

from spotorch.core.alert_ledger import (
    DEFAULT_LEASE_S,
    DEFAULT_RETENTION_S,
    Admission,
    Outcome,
    admit,
    claimable,
    record_key,
    run_key,
)
from spotorch.settings import COLLECTION_NOTIFICATION_RUNS, COLLECTION_NOTIFICATIONS


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
        """NotificationLedger.claim: a create() that wins once; a failed or stale claim is taken over."""
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
        if not snapshot.exists or not claimable(snapshot.to_dict(), now, self.lease_s):
            return False  # (vanished: its TTL ran out long after any redelivery)
        try:
            # Take over a failed or abandoned claim only if nobody else did since we read it.
            ref.update(fresh, option=db.write_option(last_update_time=snapshot.update_time))
            return True
        except (gexc.FailedPrecondition, gexc.NotFound, gexc.Conflict):
            return False

    def finish(self, event_id: str, channel: str, outcome: Outcome, now: float,
               detail: str = "", attempts: int = 0) -> None:
        """NotificationLedger.finish: records the outcome on the claim's document."""
        ref = self._db().collection(self.collection).document(record_key(event_id, channel))
        ref.set({"state": outcome.value, "finished_at": now, "detail": detail,
                 "attempts": attempts, "expires_at": self._expires(now)}, merge=True)

    def admit(self, run_id: str, channel: str, kind: str, now: float, *, limit: int,
              window_s: float, always: bool = False) -> Admission:
        """NotificationLedger.admit: the run's rate-limit state updated in a transaction."""
        from google.cloud import firestore

        db = self._db()
        ref = db.collection(self.runs_collection).document(run_key(run_id, channel))

        @firestore.transactional
        def admit_in(transaction: Any) -> Admission:
            snapshot = ref.get(transaction=transaction)
            state = (snapshot.to_dict() or {}) if snapshot.exists else {}
            admission = admit(state, kind, now, limit, window_s, always)
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
