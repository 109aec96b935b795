"""A registered version's way out (issue 37): the promotion gate, then serving when it passed.

Registration calls `after_registration` once, after the upload returned the version's name.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from spotorch.app import promotions, serving
from spotorch.core.model import Run
from spotorch.core.promotion import Decision

if TYPE_CHECKING:
    from spotorch.app.deps import Deps


def after_registration(deps: Deps, run: Run | str, version: str) -> Decision | None:
    """Judge the version (spotorch.app.promotions); when it holds the alias, roll it out on the
    pipeline's endpoint (spotorch.app.serving). Redelivery-safe: a decision is made once, and a
    version already serving, watched or queued is not queued again."""
    decision = promotions.after_registration(deps, run, version)
    if decision is None or not decision.promoted:
        return decision
    record = promotions.champion_record(deps, promotions.model_of(version))
    if record is None or record.champion is None or record.champion.version != version:
        return decision  # promoted once, since replaced or rolled back: not deployed again
    pipeline_name = run if isinstance(run, str) else run.pipeline
    if isinstance(run, str):
        found, _ = deps.runs.load(run)
        pipeline_name = found.pipeline if found else ""
    if pipeline_name:
        serving.on_promoted(deps, deps.pipeline(pipeline_name), version)
    return decision
