"""What Vertex says of a job (spotorch.adapters.gcp.vertex.reported), classified the way the core
does it (spotorch.core.recovery.classify): the pair the tests of failure classes read."""

from __future__ import annotations

from spotorch.adapters.gcp.vertex import reported
from spotorch.core.health import HealthPolicy
from spotorch.core.model import FailureClass, JobPhase
from spotorch.core.pipeline import RecoveryPolicy
from spotorch.core.recovery import classify as core_classify


def classify(job_state: int | str, error_code: int, message: str,
             recovery: RecoveryPolicy | None = None, health: HealthPolicy | None = None, *,
             started: bool | None = None) -> tuple[JobPhase, FailureClass | None, int | None]:
    """(phase, failure class, exit code) of a job Vertex reports with this state and error."""
    status = reported(job_state, error_code, message, started=started)
    return status.phase, core_classify(status, recovery, health), status.exit_code
