"""Deps with the use cases wired to each other: the one place that says who hears what."""

from __future__ import annotations

from typing import Any

from spotorch.app.deps import Deps
from spotorch.core.model import Run


def _sweep_trial_ended(deps: Deps, run: Run) -> object:
    """A sweep hears of its trial at once (its tick is the backstop). Imported on the first
    trial's end: most runs are no trial, and the sweeps' modules are a cold start's cost."""
    if run.sweep_id is None:
        return None
    from spotorch.app import sweeps

    return sweeps.trial_ended(deps, run)


# Followers of ended runs, in order.
RUN_ENDED = (_sweep_trial_ended,)


def deps(**ports: Any) -> Deps:
    """Deps on these adapters (Deps' fields by name), with every follower wired."""
    return Deps(**ports, on_run_ended=RUN_ENDED)
