"""Vertex AI request budgets: per instance (RequestBudget), or shared by every instance through
the document store (SharedRequestBudget). VertexJobLauncher takes one before each call.

Vertex's default quotas are 600 resource-management (CRUD) requests and 60 job submissions per
minute per region and project (FACTS.md); going over answers RESOURCE_EXHAUSTED. Both budgets
refuse a call they cannot allow within `max_wait_s` with the same transient RESOURCE_EXHAUSTED
LaunchError, so a launch stays in its run's outbox with its claim and a later tick retries it.
"""

from __future__ import annotations

import logging
import math
import random
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from spotorch.ports import ConflictError, DocumentStore, LaunchError
from spotorch.settings import COLLECTION_BUDGETS

log = logging.getLogger("spotorch.budget")

CRUD = "resource_management"
SUBMIT = "job_submission"
VERTEX_QUOTAS: Mapping[str, int] = {CRUD: 600, SUBMIT: 60}  # per minute per region (FACTS.md)
QUOTA_WINDOW_S = 60.0


class Budget(Protocol):
    """What the launcher asks before a Vertex call: one request of each kind, in a region."""

    def take(self, region: str, kinds: Sequence[str], *, max_wait_s: float | None = None) -> None:
        """Return when the call may go, waiting up to max_wait_s (None: the budget's own);
        raise the transient RESOURCE_EXHAUSTED LaunchError."""
        ...


def spent(region: str, kinds: Sequence[str], wait_s: float) -> LaunchError:
    """The refusal both budgets raise: transient, with Vertex's own code for a spent quota."""
    return LaunchError(f"request budget for {'/'.join(kinds)} in {region} is spent for "
                       f"{wait_s:.0f}s", permanent=False, code="RESOURCE_EXHAUSTED")


class RequestBudget:
    """Requests per minute per region this instance allows itself, below Vertex's quotas.

    Instances do not share this budget: each takes its share (default: half of each quota, for
    the tick plus a burst of launches). A call that would go over waits up to `max_wait_s` for
    the sliding minute to move, then fails as RESOURCE_EXHAUSTED.
    """

    def __init__(self, per_minute: Mapping[str, float] | None = None, *, max_wait_s: float = 5.0,
                 clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.per_minute = dict(per_minute or {CRUD: 300.0, SUBMIT: 30.0})
        self.max_wait_s = max_wait_s
        self._clock, self._sleep = clock, sleep
        self._calls: dict[tuple[str, str], list[float]] = {}
        self._lock = threading.Lock()

    def _wait_s(self, region: str, kinds: Sequence[str], now: float) -> float:
        wait = 0.0
        for kind in kinds:
            calls = [t for t in self._calls.get((region, kind), []) if t > now - QUOTA_WINDOW_S]
            self._calls[(region, kind)] = calls
            limit = self.per_minute.get(kind)
            if limit is not None and len(calls) >= limit:
                wait = max(wait, calls[0] + QUOTA_WINDOW_S - now)
        return wait

    def take(self, region: str, kinds: Sequence[str], *, max_wait_s: float | None = None) -> None:
        deadline = self._clock() + (self.max_wait_s if max_wait_s is None else max_wait_s)
        while True:
            with self._lock:
                now = self._clock()
                wait = self._wait_s(region, kinds, now)
                if wait <= 0:
                    for kind in kinds:
                        self._calls.setdefault((region, kind), []).append(now)
                    return
            if now + wait > deadline:
                raise spent(region, kinds, wait)
            self._sleep(min(wait, 1.0))


def window_limit(quota: float, share: float, window_s: float) -> int:
    """Requests one fixed window may grant so that no sliding minute sees more than share*quota.

    A sliding minute overlaps at most ceil(60 / window_s) + 1 fixed windows; Vertex does not
    document how its per-minute quota refills (the emulator uses a sliding minute), so the
    budget assumes the strictest reading.
    """
    overlapped = math.ceil(QUOTA_WINDOW_S / window_s - 1e-9) + 1
    return max(0, math.floor(quota * share / overlapped))


@dataclass
class _Lease:
    window: int
    tokens: int


class SharedRequestBudget:
    """A budget per (region, kind) shared by every instance: one small document each, in the
    document store (Firestore in production), handing out blocks of tokens per fixed window.

    Why blocks: taking one token per Vertex request would cost a Firestore write per request and
    put the busiest document at ~8 writes a second (500 CRUD a minute), far past the ~1 write a
    second one document sustains. An instance instead takes a block (about a quarter of the
    window's limit) in one conditional write and spends it locally; a document then sees at most
    `blocks_per_window` writes per window (0.4 a second with the defaults). What an instance
    leased and did not spend lapses with its window: tokens are lost, never over-granted.

    Why fixed windows: a counter with the window's number in it needs no list of timestamps and
    no clean-up (the document is reset by the first lease of a newer window). The window's limit
    is chosen so that a sliding minute never sees more than `share` of Vertex's quota
    (window_limit): 10-s windows keep 6/7 of it usable.

    When the store cannot be reached, the instance falls back to its own conservative budget
    (default a tenth of the quota per instance) for `retry_store_after_s`, so the tick is never
    held up by a budget it cannot read; contention on the document is not a failure to reach it
    and is retried until `max_wait_s`.
    """

    def __init__(self, docs: DocumentStore, quotas: Mapping[str, float] | None = None, *,
                 share: float = 0.9, window_s: float = 10.0, blocks_per_window: int = 4,
                 max_wait_s: float = 5.0, fallback: Budget | None = None,
                 retry_store_after_s: float = 30.0, collection: str = COLLECTION_BUDGETS,
                 clock: Callable[[], float] = time.time,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.docs = docs
        self.quotas = dict(quotas or VERTEX_QUOTAS)
        self.window_s = window_s
        self.limits = {k: window_limit(q, share, window_s) for k, q in self.quotas.items()}
        self.blocks = {k: max(1, math.ceil(limit / max(1, blocks_per_window)))
                       for k, limit in self.limits.items()}
        self.max_wait_s = max_wait_s
        self.fallback = fallback or RequestBudget(
            {k: q * share / 10 for k, q in self.quotas.items()}, max_wait_s=max_wait_s)
        self.retry_store_after_s = retry_store_after_s
        self.collection = collection
        # The wall clock, not a monotonic one: every instance must agree on the window's number.
        self._clock, self._sleep = clock, sleep
        self._leases: dict[tuple[str, str], _Lease] = {}
        # (region, kind) -> the window found spent: tokens never come back within a window, so
        # the refusals that follow cost no read.
        self._spent: dict[tuple[str, str], int] = {}
        self._store_down_until = -math.inf
        self._lock = threading.Lock()  # one lease at a time: an instance never contends with itself
        self.leases_taken = 0  # conditional writes that granted tokens (for the benchmark)
        self.fallbacks = 0  # takes served by the fallback budget

    def take(self, region: str, kinds: Sequence[str], *, max_wait_s: float | None = None) -> None:
        deadline = self._clock() + (self.max_wait_s if max_wait_s is None else max_wait_s)
        while True:
            with self._lock:
                now = self._clock()
                retry_in = self._attempt(region, kinds, now)
            if retry_in is None:  # the store cannot be reached: this instance's own budget
                self.fallbacks += 1
                self.fallback.take(region, kinds, max_wait_s=max_wait_s)
                return
            if retry_in <= 0:
                return
            if now + retry_in > deadline:
                raise spent(region, kinds, retry_in)
            self._sleep(retry_in)

    def _attempt(self, region: str, kinds: Sequence[str], now: float) -> float | None:
        """0 when taken, the seconds to wait before trying again, or None: use the fallback."""
        if now < self._store_down_until:
            return None
        try:
            return self._take_locked(region, kinds, now)
        except Exception as exc:  # any failure to reach the store (unavailable, deadline, auth)
            log.warning("shared request budget unreachable (%s: %s); this instance uses its own "
                        "for %.0f s", type(exc).__name__, exc, self.retry_store_after_s)
            self._store_down_until = now + self.retry_store_after_s
            return None

    def _window(self, now: float) -> int:
        return int(now // self.window_s)

    def _take_locked(self, region: str, kinds: Sequence[str], now: float) -> float:
        """Spend one token of each kind (leasing where none is left): 0, or when to try again.

        Nothing is spent unless every kind has a token: a launch refused for its submission does
        not use up a resource-management token."""
        window = self._window(now)
        limited = [k for k in dict.fromkeys(kinds) if k in self.limits]
        for kind in limited:
            lease = self._leases.get((region, kind))
            if lease is not None and lease.window == window and lease.tokens > 0:
                continue
            granted = 0 if self._spent.get((region, kind)) == window \
                else self._lease(region, kind, window)
            if granted is None:  # contended: others are leasing right now
                return random.uniform(0.02, 0.1)
            if granted == 0:  # spent for this window
                self._spent[(region, kind)] = window
                return (window + 1) * self.window_s - now
            self._leases[(region, kind)] = _Lease(window, granted)
        for kind in limited:
            self._leases[(region, kind)].tokens -= 1
        return 0.0

    def _lease(self, region: str, kind: str, window: int, attempts: int = 5) -> int | None:
        """Tokens granted by one conditional write on the (region, kind) document: 0 when the
        window's limit is reached, None when every attempt lost a race."""
        key = f"{region}:{kind}"
        limit, block = self.limits[kind], self.blocks[kind]
        for _ in range(attempts):
            doc, version = self.docs.get(self.collection, key)
            doc_window = int(doc["window"]) if doc else -1
            if doc_window > window:
                return 0  # another instance's clock is ahead: this window is over for it
            granted = int(doc["granted"]) if doc and doc_window == window else 0
            n = min(block, limit - granted)
            if n <= 0:
                return 0
            try:
                self.docs.put(self.collection, key,
                              {"region": region, "kind": kind, "window": window,
                               "window_s": self.window_s, "limit": limit,
                               "granted": granted + n}, version)
            except ConflictError:
                continue
            self.leases_taken += 1
            return n
        return None
