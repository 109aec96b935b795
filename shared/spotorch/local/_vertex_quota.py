"""Vertex AI's default request quotas, per project and region, enforced like the real service.

Defaults from the Vertex AI quotas page (FACTS.md): 600 resource-management (CRUD) requests
and 60 job submissions per minute per region. Exceeding one answers RESOURCE_EXHAUSTED. Which
calls count against which quota is our reading of that page: every JobService call is a
resource-management request, and CreateCustomJob is also a job submission. A refused call does
not use quota. The window is a sliding minute (Google does not document its refill).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass

RESOURCE_MANAGEMENT = "resource_management"
JOB_SUBMISSION = "job_submission"

# Metric -> (quota metric, limit name) in the wording of Google's quota errors.
_NAMES: Mapping[str, tuple[str, str]] = {
    RESOURCE_MANAGEMENT: ("Resource management (CRUD) requests",
                          "Resource management (CRUD) requests per minute per region"),
    JOB_SUBMISSION: ("Job or LRO submission requests",
                     "Job or LRO submission requests per minute per region"),
}

# What each JobService method costs.
METHOD_METRICS: Mapping[str, tuple[str, ...]] = {
    "CreateCustomJob": (RESOURCE_MANAGEMENT, JOB_SUBMISSION),
    "GetCustomJob": (RESOURCE_MANAGEMENT,),
    "CancelCustomJob": (RESOURCE_MANAGEMENT,),
    "ListCustomJobs": (RESOURCE_MANAGEMENT,),
}


class QuotaExceeded(Exception):
    """A request over a quota: the service answers RESOURCE_EXHAUSTED with this message."""


@dataclass(frozen=True)
class QuotaLimits:
    """Requests allowed per window, per project and region; None: unlimited."""

    resource_management: int | None = 600
    job_submission: int | None = 60
    window_s: float = 60.0

    @classmethod
    def unlimited(cls) -> QuotaLimits:
        return cls(None, None)

    def limit(self, metric: str) -> int | None:
        return {RESOURCE_MANAGEMENT: self.resource_management,
                JOB_SUBMISSION: self.job_submission}[metric]


class QuotaMeter:
    """Counts calls in a sliding window per (project, region, metric); refuses those over."""

    def __init__(self, limits: QuotaLimits,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.limits = limits
        self._clock = clock
        self._calls: dict[tuple[str, str, str], deque[float]] = {}
        self._lock = threading.Lock()

    def charge(self, method: str, project: str, region: str) -> None:
        """Record one call of method, or raise QuotaExceeded (recording nothing)."""
        metrics = METHOD_METRICS.get(method, (RESOURCE_MANAGEMENT,))
        now = self._clock()
        with self._lock:
            windows = [(m, self._window((project, region, m), now)) for m in metrics]
            for metric, calls in windows:
                limit = self.limits.limit(metric)
                if limit is not None and len(calls) >= limit:
                    quota, limit_name = _NAMES[metric]
                    raise QuotaExceeded(
                        f"Quota exceeded for quota metric '{quota}' and limit '{limit_name}' "
                        f"of service 'aiplatform.googleapis.com' for consumer "
                        f"'project:{project}' in region {region} ({limit} per "
                        f"{self.limits.window_s:g}s).")
            for _, calls in windows:
                calls.append(now)

    def _window(self, key: tuple[str, str, str], now: float) -> deque[float]:
        calls = self._calls.setdefault(key, deque())
        while calls and calls[0] <= now - self.limits.window_s:
            calls.popleft()
        return calls
