"""The alert ledger in memory (one process): dicts behind a lock."""

from __future__ import annotations

import copy
import threading
from typing import Any

from spotorch.core.alert_ledger import (
    DEFAULT_LEASE_S,
    Admission,
    Outcome,
    admit,
    claimable,
    record_key,
    run_key,
)


class InMemoryNotificationLedger:
    """NotificationLedger in dicts behind a lock (one process)."""

    def __init__(self, *, lease_s: float = DEFAULT_LEASE_S) -> None:
        self.lease_s = lease_s
        self.records: dict[str, dict[str, Any]] = {}
        self.runs: dict[str, dict[str, Any]] = {}
        self._lock = threading.Lock()

    def claim(self, event_id: str, channel: str, run_id: str, now: float) -> bool:
        """NotificationLedger.claim: wins when there is no record, or it failed, or its claim is stale."""
        key = record_key(event_id, channel)
        with self._lock:
            if not claimable(self.records.get(key), now, self.lease_s):
                return False
            self.records[key] = {"event_id": event_id, "channel": channel, "run_id": run_id,
                                 "state": Outcome.SENDING.value, "claimed_at": now}
            return True

    def finish(self, event_id: str, channel: str, outcome: Outcome, now: float,
               detail: str = "", attempts: int = 0) -> None:
        """NotificationLedger.finish: records the outcome on the claim."""
        with self._lock:
            record = self.records.setdefault(record_key(event_id, channel), {})
            record.update(state=outcome.value, finished_at=now, detail=detail, attempts=attempts)

    def admit(self, run_id: str, channel: str, kind: str, now: float, *, limit: int,
              window_s: float, always: bool = False) -> Admission:
        """NotificationLedger.admit: the run's rate-limit state updated under the lock."""
        with self._lock:
            state = self.runs.setdefault(run_key(run_id, channel), {})
            return admit(state, kind, now, limit, window_s, always)

    def record(self, event_id: str, channel: str) -> dict[str, Any] | None:
        """The (event, channel) record, for tests and inspection."""
        with self._lock:
            found = self.records.get(record_key(event_id, channel))
            return copy.deepcopy(found)
