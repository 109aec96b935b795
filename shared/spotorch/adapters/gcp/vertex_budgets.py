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

from spotorch.ports.budget import CRUD, QUOTA_WINDOW_S, SUBMIT, VERTEX_QUOTAS, Budget, spent
from spotorch.ports.store import ConflictError, DocumentStore
from spotorch.settings import COLLECTION_BUDGETS

log = logging.getLogger("spotorch.adapters.budget")

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
        """Budget.take: waits until this instance's window has room; RESOURCE_EXHAUSTED past the wait."""
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


@dataclass
class _Lease:
    expires_at: float  # its tokens are spent before this, or never
    tokens: int  # left
    granted: int


class SharedRequestBudget:
    """A budget per (region, kind) shared by every instance: one small document each, in the
    document store (Firestore in production), holding the grants of the last minute or so.

    The rule: a grant of n tokens at time t is allowed when the grants since t - horizon_s, with
    n, stay within share * quota, and its tokens may be spent only until t + lease_s (horizon_s
    = 60 + lease_s). Any minute of Vertex calls then spends only tokens granted within one
    horizon, so no sliding minute goes over, whatever Vertex's refill is (it is not documented;
    the emulator uses a sliding minute). It allows a burst of the whole share at once (540
    requests, 54 submissions with the defaults) and about share * quota * 60 / horizon_s a
    minute after that.

    Why blocks: taking one token per Vertex request would cost a Firestore write per request and
    put the busiest document at ~9 writes a second, far past the ~1 write a second one document
    sustains. An instance instead takes a block (1/`blocks_per_horizon` of the limit) in one
    conditional write and spends it locally; a document then sees at most about
    `blocks_per_horizon` writes per horizon (0.25 a second with the defaults) from a busy
    instance. What an instance leased and did not spend within lease_s lapses: tokens are lost,
    never over-granted. So a lease is sized by the instance's demand: twice what it spent of its
    previous lease (a quarter block for the first), at most a block. A slow caller (a listing's
    page a second) then strands a few tokens per lease rather than most of a block, and a burst
    doubles its leases up to the block.

    When the store cannot be reached, the instance falls back to its own conservative budget
    (default a tenth of the quota per instance) for `retry_store_after_s`, so the tick is never
    held up by a budget it cannot read; contention on the document is not a failure to reach it
    and is retried until `max_wait_s`.
    """

    def __init__(self, docs: DocumentStore, quotas: Mapping[str, float] | None = None, *,
                 share: float = 0.9, lease_s: float = 5.0, blocks_per_horizon: int = 16,
                 max_wait_s: float = 5.0, fallback: Budget | None = None,
                 retry_store_after_s: float = 30.0, collection: str = COLLECTION_BUDGETS,
                 clock: Callable[[], float] = time.time,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.docs = docs
        self.quotas = dict(quotas or VERTEX_QUOTAS)
        self.lease_s = lease_s
        self.horizon_s = QUOTA_WINDOW_S + lease_s
        self.limits = {k: math.floor(q * share) for k, q in self.quotas.items()}
        self.blocks = {k: max(1, math.ceil(limit / max(1, blocks_per_horizon)))
                       for k, limit in self.limits.items()}
        self.max_wait_s = max_wait_s
        self.fallback = fallback or RequestBudget(
            {k: q * share / 10 for k, q in self.quotas.items()}, max_wait_s=max_wait_s)
        self.retry_store_after_s = retry_store_after_s
        self.collection = collection
        # The wall clock, not a monotonic one: grants from every instance share one time line.
        self._clock, self._sleep = clock, sleep
        self._leases: dict[tuple[str, str], _Lease] = {}
        # (region, kind) -> until when the document was found spent: no grant leaves it sooner,
        # so the refusals meanwhile cost no read.
        self._spent_until: dict[tuple[str, str], float] = {}
        self._store_down_until = -math.inf
        self._lock = threading.Lock()  # one lease at a time: an instance never contends with itself
        self.leases_taken = 0  # conditional writes that granted tokens (for the benchmark)
        self.fallbacks = 0  # takes served by the fallback budget

    def take(self, region: str, kinds: Sequence[str], *, max_wait_s: float | None = None) -> None:
        """Budget.take: tokens leased from the shared document; this instance's budget when unreachable."""
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

    def _take_locked(self, region: str, kinds: Sequence[str], now: float) -> float:
        """Spend one token of each kind (leasing where none is left): 0, or when to try again.

        Nothing is spent unless every kind has a token: a launch refused for its submission does
        not use up a resource-management token."""
        limited = [k for k in dict.fromkeys(kinds) if k in self.limits]
        for kind in limited:
            lease = self._leases.get((region, kind))
            if lease is not None and now < lease.expires_at and lease.tokens > 0:
                continue
            until = self._spent_until.get((region, kind), -math.inf)
            if now < until:
                return until - now
            granted, retry_at = self._lease(region, kind, now, self._want(region, kind))
            if granted is None:  # contended: others are leasing right now
                return random.uniform(0.02, 0.1)
            if granted == 0:  # spent until the oldest grant leaves the horizon
                self._spent_until[(region, kind)] = retry_at
                return max(retry_at - now, 0.01)
            self._leases[(region, kind)] = _Lease(now + self.lease_s, granted, granted)
        for kind in limited:
            self._leases[(region, kind)].tokens -= 1
        return 0.0

    def _want(self, region: str, kind: str) -> int:
        """Tokens to ask for: twice what the previous lease had spent, within (1, block)."""
        block = self.blocks[kind]
        last = self._leases.get((region, kind))
        spent = (last.granted - last.tokens) if last else block // 8
        return max(1, min(block, 2 * spent))

    def _lease(self, region: str, kind: str, now: float, want: int,
               attempts: int = 5) -> tuple[int | None, float]:
        """(tokens granted by one conditional write on the (region, kind) document, or None when
        every attempt lost a race; when 0 were granted, the time one may be)."""
        key = f"{region}:{kind}"
        limit, block = self.limits[kind], want
        for _ in range(attempts):
            doc, version = self.docs.get(self.collection, key)
            # A list of maps: Firestore's arrays cannot hold arrays.
            grants = [(float(g["t"]), int(g["n"])) for g in (doc or {}).get("grants", [])
                      if float(g["t"]) > now - self.horizon_s]
            n = min(block, limit - sum(n for _, n in grants))
            if n <= 0:
                return 0, min((t for t, _ in grants), default=now) + self.horizon_s
            try:
                self.docs.put(self.collection, key,
                              {"region": region, "kind": kind, "limit": limit,
                               "horizon_s": self.horizon_s,
                               "grants": [{"t": t, "n": g} for t, g in [*grants, (now, n)]]},
                              version)
            except ConflictError:
                continue
            self.leases_taken += 1
            return n, now
        return None, now
