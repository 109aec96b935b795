"""A launch whose executor died after creating the job: adopted before its claim runs out
(issue 39).

A launch intent is claimed for LAUNCH_LEASE_S (120 s) so that no two executors create the same
attempt's job (Vertex has no create-if-absent: two creates make two jobs). When the function
holding the claim is killed mid-launch, nothing tells the others it is gone, so the tick waited
for the whole claim. What it can safely know: whether the job exists. Once a claim is
ADOPT_AFTER_S old, the tick looks the attempt's job up by its labels (JobLauncher.find): a job
that exists is adopted at once (LaunchDone, the observation the executor would have sent; a late
one from a live executor changes nothing). A job that does not exist still waits for the claim:
its executor may be creating it right now, and only the claim's end says it is not.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from spotorch.app.unit_of_work import record_job
from spotorch.core.intents import LaunchIntent
from spotorch.core.moves import LAUNCH_LEASE_S
from spotorch.core.observations import LaunchDone, Observation
from spotorch.ports.jobs import LaunchError

if TYPE_CHECKING:
    from spotorch.app.deps import Deps
    from spotorch.core.model import Run

log = logging.getLogger("spotorch.app.orphan_launches")

# A launch normally creates its job within seconds; a claim this old is worth a look.
ADOPT_AFTER_S = 30.0


def adopt_orphans(deps: Deps, run: Run) -> list[Observation]:
    """LaunchDone for each claimed launch whose job already exists though its claim holds."""
    now = deps.clock.now()
    found: list[Observation] = []
    for intent in run.outbox:
        if not isinstance(intent, LaunchIntent) or intent.claimed_until <= now:
            continue  # not claimed: the tick takes it anyway
        if now - (intent.claimed_until - LAUNCH_LEASE_S) < ADOPT_AFTER_S:
            continue  # its executor is most likely still at it
        attempt = run.attempt(intent.attempt)
        if attempt is None or attempt.job_name is not None or not attempt.live:
            continue
        try:
            status = deps.launcher.find(run.run_id, intent.attempt)
        except LaunchError as exc:
            log.info("looking for the job of %s attempt %d failed: %s", run.run_id,
                     intent.attempt, exc, extra={"run_id": run.run_id})
            continue
        if status is not None:
            # As the executor would have after its create: the job's record first (job events
            # find their run by it), then the observation.
            record_job(deps, status.job_name, run.run_id, intent.attempt, run.pipeline)
            log.info("run %s: attempt %d's job %s exists while its launch is still claimed: "
                     "adopted", run.run_id, intent.attempt, status.job_name,
                     extra={"run_id": run.run_id})
            found.append(LaunchDone(intent.id, intent.attempt, status.job_name))
    return found
