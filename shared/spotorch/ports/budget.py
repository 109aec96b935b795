"""The request budget port: what a Vertex adapter asks before each call, below Vertex's quotas.

Vertex's default quotas are 600 resource-management (CRUD) requests and 60 job submissions per
minute per region and project (FACTS.md); going over answers RESOURCE_EXHAUSTED.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

from spotorch.ports.jobs import LaunchError

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
