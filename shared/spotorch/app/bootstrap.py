"""Deps with the use cases wired to each other: the one place that says who hears what."""

from __future__ import annotations

from typing import Any

from spotorch.app import sweeps
from spotorch.app.deps import Deps

# Followers of ended runs, in order: a sweep hears of its trial at once (its tick is the backstop).
RUN_ENDED = (sweeps.trial_ended,)


def deps(**ports: Any) -> Deps:
    """Deps on these adapters (Deps' fields by name), with every follower wired."""
    return Deps(**ports, on_run_ended=RUN_ENDED)
