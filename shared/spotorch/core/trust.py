"""What a message must be to be believed: plausible progress."""

from __future__ import annotations

from spotorch.core.model import Run
from spotorch.core.observations import TrainerReported

# ---------------------------------------------------------------- plausibility

# No optimizer step is this fast: a report implying more steps per second is not true.
MAX_STEPS_PER_S = 100_000.0
MAX_STEP = 2 ** 53  # beyond this a step is no longer an exact number anywhere on its way


def implausible(run: Run, report: TrainerReported, now: float | None = None) -> str | None:
    """Why a trainer report cannot be true of this run, or None when it may be.

    Progress only moves within what the run can have done: never past total_steps, never
    faster than MAX_STEPS_PER_S since the last thing known (a report, a checkpoint, the resume
    step of the attempt). A rejected report changes nothing, so one bad report cannot set the
    run's progress for good.
    """
    step = report.step
    if step is None:
        return None
    if step < 0 or step > MAX_STEP:
        return f"step {step} is out of range [0, {MAX_STEP}]"
    total = report.total_steps or run.progress.total_steps
    if total is not None and step > total:
        return f"step {step} is past total_steps {total}"
    attempt = run.attempt(report.attempt)
    known = max(run.progress.step,
                run.latest_checkpoint.step if run.latest_checkpoint else 0,
                (attempt.resumed_from_step or 0) if attempt else 0)
    since = run.progress.at if run.progress.at is not None and run.progress.step >= known \
        else (attempt.created_at if attempt else run.created_at)
    at = min(report.at, now) if now is not None else report.at
    if step - known > MAX_STEPS_PER_S * max(at - since, 1.0):
        return (f"step {step} jumps {step - known} steps from {known} in {max(at - since, 0):.0f}s"
                f" (more than {MAX_STEPS_PER_S:.0f} steps per second)")
    return None
