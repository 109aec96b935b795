"""What happens when an attempt fails: its failure class, its budget, and the next attempt."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Mapping
from dataclasses import replace

from spotorch.core.context import Context
from spotorch.core.escalation import (
    budget_escape,
    escalation_reason,
    policy_capacity,
    spot_cooldown_until,
)
from spotorch.core.health import HealthPolicy, compiled, is_out_of_memory
from spotorch.core.launching import launch
from spotorch.core.model import (
    CANCEL_DIVERGED,
    CANCEL_HUNG,
    CANCEL_SLOW,
    CANCEL_STOCKOUT,
    Attempt,
    AttemptState,
    FailureClass,
    JobPhase,
    JobStatus,
    Run,
    RunStatus,
)
from spotorch.core.moves import fail, move_to, publish
from spotorch.core.pipeline import Capacity, EscalationKind, RecoveryPolicy
from spotorch.core.quotas import on_quota
from spotorch.core.region_moves import spot_elsewhere
from spotorch.core.regions import AVOID_PREEMPTED, AVOID_STOCKOUT, mark
from spotorch.core.training_health import recover_out_of_memory, roll_back
from spotorch_trainer.contract import EXIT_KILLED, EXIT_PREEMPTED


def _jitter(run_id: str, n: int) -> float:
    """Deterministic jitter in [0.5, 1.0): replays decide the same, runs spread their retries."""
    digest = hashlib.sha256(f"{run_id}:{n}".encode()).digest()
    return 0.5 + digest[0] / 512


def backoff_s(recovery: RecoveryPolicy, run_id: str, failures: int) -> float:
    """Capped, jittered exponential backoff after the n-th failure in a row."""
    raw = recovery.backoff_base_s * (2 ** max(failures - 1, 0))
    return float(min(recovery.backoff_cap_s, raw) * _jitter(run_id, failures))


# How a stopped run ends -> the failure class its run.failed names (others: none).
STOP_FAILURES: Mapping[RunStatus, FailureClass] = {RunStatus.FAILED_DIVERGED: FailureClass.DIVERGED}

# Why spotorch cancelled an attempt -> the failure class its end counts as (others: CANCELLED).
_CANCEL_FAILURES: Mapping[str, FailureClass] = {
    CANCEL_STOCKOUT: FailureClass.STOCKOUT,
    CANCEL_HUNG: FailureClass.HUNG,
    CANCEL_SLOW: FailureClass.HUNG,
    CANCEL_DIVERGED: FailureClass.DIVERGED,
}


# Failures whose cause the workers' own error output shows (their stderr's last lines are kept
# with the attempt); Spot preemptions and stockouts are Vertex's doing, not the code's.
WORKER_FAILURES = frozenset({FailureClass.USER_ERROR, FailureClass.INFRA,
                             FailureClass.OUT_OF_MEMORY})
# A health rule's cancel that NOT_FOUND evidence overtook: the job is gone (a cancel never
# landed on it), so the attempt is lost and the lost budget pays, not the hang budget.
_LOST_OVERTAKES = frozenset({CANCEL_HUNG, CANCEL_SLOW})


# --- classifying what the service said of a failed job -------------------------------------------
# Adapters report a job's state, error code and message, exit code and whether it ever ran; the
# failure class is decided here, with the run's pipeline's own patterns (recovery.*_patterns,
# health.oom_patterns), the first rule that applies winning.

# google.rpc.Code of a job's `error` -> failure class, when no message pattern decided.
ERROR_CODE_FAILURES: Mapping[int, FailureClass] = {
    1: FailureClass.CANCELLED,  # CANCELLED: what Vertex sets on a cancelled job
    3: FailureClass.USER_ERROR,  # INVALID_ARGUMENT: Vertex's code for a replica's non-zero exit
    4: FailureClass.TIMEOUT,  # DEADLINE_EXCEEDED
    5: FailureClass.USER_ERROR,  # NOT_FOUND: e.g. an image or bucket that does not exist
    7: FailureClass.USER_ERROR,  # PERMISSION_DENIED: the service account lacks a role
    8: FailureClass.STOCKOUT,  # RESOURCE_EXHAUSTED: no capacity (quota messages match QUOTA first)
    9: FailureClass.USER_ERROR,  # FAILED_PRECONDITION
    10: FailureClass.INFRA,  # ABORTED
    13: FailureClass.INFRA,  # INTERNAL
    14: FailureClass.INFRA,  # UNAVAILABLE
}
# States whose name alone says the class. EXPIRED: the job never got capacity within its wait
# window (FLEX_START max_wait_duration): a stockout, not a timeout (that is scheduling.timeout).
STATE_FAILURES: Mapping[str, FailureClass] = {"EXPIRED": FailureClass.STOCKOUT}
# Exit statuses of a replica killed by SIGKILL (as a shell and as a signal number report it).
KILLED_EXIT_CODES = frozenset({EXIT_KILLED, -9})
# Among capacity messages, these say the job had been running (PREEMPTED, not STOCKOUT); used
# only when the service did not say whether the job ever ran.
WHILE_RUNNING_PATTERNS: tuple[str, ...] = (r"(?i)preempt",)
# Links and resource names say where, not why; "projects/spotorch-x" must not read as "spot".
_NAMES = re.compile(r"(?i)\b(?:https?://|gs://)\S+|\bprojects/\S+")


def _matches(patterns: tuple[str, ...], text: str) -> bool:
    return any(p.search(text) for p in compiled(patterns))


def classify(status: JobStatus, recovery: RecoveryPolicy | None = None,
             health: HealthPolicy | None = None) -> FailureClass | None:
    """The failure class of a job from what its service said, by a pipeline's patterns (the
    defaults without one); None for a job that has not failed."""
    if status.failure is not None:
        return status.failure  # fixed by the evidence itself (LOST; an in-memory twin)
    if status.phase is JobPhase.CANCELLED:
        return FailureClass.CANCELLED
    if status.phase is not JobPhase.FAILED:
        return None
    recovery = recovery or RecoveryPolicy()
    health = health or HealthPolicy()
    implied = STATE_FAILURES.get(status.state.upper().removeprefix("JOB_STATE_"))
    if implied is not None:
        return implied
    if status.error_code == 1:
        return FailureClass.CANCELLED
    message = status.message or ""
    text = _NAMES.sub(" ", message)
    exit_code = status.exit_code
    # Out of memory before everything else that reads the message: a CUDA OOM message speaks
    # of "total capacity" and would read as a stockout.
    if exit_code != EXIT_PREEMPTED and is_out_of_memory(text, health.oom_patterns):
        return FailureClass.OUT_OF_MEMORY  # OOM-killed (137) or an allocator's own error
    if exit_code is not None:
        # The trainer exits 143 after writing its last checkpoint on SIGTERM: a preemption.
        if exit_code == EXIT_PREEMPTED:
            return FailureClass.PREEMPTED
        if exit_code in KILLED_EXIT_CODES:
            # SIGKILL without an out-of-memory message: the VM, the kernel or the runtime, not
            # the training code (failure_of turns it back into a user error if the trainer
            # said it exits so itself).
            return FailureClass.INFRA
        return FailureClass.USER_ERROR
    if _matches(recovery.quota_patterns, message):
        return FailureClass.QUOTA  # before "timeout"/"spot": the metric names either
    if _matches(recovery.timeout_patterns, text):
        return FailureClass.TIMEOUT
    if _matches(recovery.preemption_patterns, text):
        started = status.started
        if started is None:
            started = _matches(WHILE_RUNNING_PATTERNS, text)
        return FailureClass.PREEMPTED if started else FailureClass.STOCKOUT
    if _matches(recovery.infra_patterns, text):
        return FailureClass.INFRA
    return ERROR_CODE_FAILURES.get(status.error_code, FailureClass.INFRA)


def failure_of(attempt: Attempt, status: JobStatus, ctx: Context) -> FailureClass:
    """How an ended attempt counts, its job's failure classified by the run's pipeline (ctx);
    the first rule that applies wins."""
    if status.failure is FailureClass.LOST and attempt.cancel_reason in _LOST_OVERTAKES:
        return FailureClass.LOST
    if attempt.state is AttemptState.CANCELLED or attempt.cancel_reason is not None:
        return _CANCEL_FAILURES.get(attempt.cancel_reason or "", FailureClass.CANCELLED)
    failure = classify(status, ctx.recovery, ctx.health) or FailureClass.INFRA
    if failure is FailureClass.INFRA and status.exit_code == EXIT_KILLED \
            and attempt.reported_exit == EXIT_KILLED:
        return FailureClass.USER_ERROR  # killed, but the trainer said it exits so itself
    return failure


END_REASONS: Mapping[FailureClass, Callable[[Attempt, JobStatus], str]] = {
    FailureClass.PREEMPTED: lambda a, s: "preempted" + (f": {s.message}" if s.message else ""),
    FailureClass.STOCKOUT: lambda a, s: "stockout: no capacity" + (
        f" ({s.message})" if s.message else " within the stockout wait"),
    FailureClass.USER_ERROR: lambda a, s: f"user error: exit code {s.exit_code}"
    + (f" ({s.message})" if s.message else ""),
    FailureClass.INFRA: lambda a, s: f"infrastructure error: {s.message or 'unknown'}",
    FailureClass.TIMEOUT: lambda a, s: f"timeout: {s.message or 'the job hit its timeout'}",
    FailureClass.CANCELLED: lambda a, s: f"cancelled ({a.cancel_reason or 'outside spotorch'})",
    FailureClass.LAUNCH_REJECTED: lambda a, s: f"launch rejected: {s.message}",
    FailureClass.LOST: lambda a, s: f"lost: {s.message or 'Vertex AI no longer knows the job'}",
    FailureClass.HUNG: lambda a, s: f"hung: {a.cancel_detail or 'no trainer report'}",
    FailureClass.OUT_OF_MEMORY: lambda a, s: "out of memory" + (
        f" (exit code {s.exit_code})" if s.exit_code is not None else "")
    + (f": {s.message}" if s.message else ""),
    FailureClass.DIVERGED: lambda a, s: f"diverged: {a.cancel_detail or 'a divergence rule fired'}",
    FailureClass.QUOTA: lambda a, s: f"quota: {s.message or 'a resource quota refused the job'}",
}

# Failure class -> (counter field, budget field, status when the budget runs out, budget name).
_BUDGETS: Mapping[FailureClass, tuple[str, str, RunStatus, str]] = {
    FailureClass.PREEMPTED: ("preemptions", "max_preemptions", RunStatus.FAILED_PREEMPTED,
                             "preemptions"),
    FailureClass.STOCKOUT: ("stockouts", "max_stockouts", RunStatus.FAILED_NO_RESOURCE,
                            "stockouts"),
    FailureClass.USER_ERROR: ("user_errors", "max_user_errors", RunStatus.FAILED, "user_errors"),
    FailureClass.INFRA: ("infra_errors", "max_infra_errors", RunStatus.FAILED_INFRA,
                         "infra_errors"),
    FailureClass.TIMEOUT: ("timeouts", "max_timeouts", RunStatus.FAILED_TIMEOUT, "timeouts"),
    FailureClass.LOST: ("lost", "max_lost_jobs", RunStatus.FAILED_INFRA, "lost_jobs"),
    # The health classes' limits live in the pipeline's health policy (Context.health).
    FailureClass.HUNG: ("hangs", "max_hangs", RunStatus.FAILED_HUNG, "hangs"),
    FailureClass.DIVERGED: ("divergences", "max_divergences", RunStatus.FAILED_DIVERGED,
                            "divergences"),
}

# Not the job's fault, or nothing to wait for: relaunch without a backoff.
_RELAUNCH_AT_ONCE = frozenset({FailureClass.PREEMPTED, FailureClass.HUNG, FailureClass.DIVERGED})

# Failures after which the run avoids the attempt's region (for its capacity) for the Spot cooldown.
_AVOID_REGION: Mapping[FailureClass, str] = {FailureClass.STOCKOUT: AVOID_STOCKOUT,
                                             FailureClass.PREEMPTED: AVOID_PREEMPTED}

# A job Vertex answers NOT_FOUND for this many polls in a row, over at least this long, is lost.
# (Defaults until the pipeline format carries them; a transient poll error never counts.) A
# wrong verdict would relaunch while the job may still train (two live jobs); why these values:
# docs/architecture.md, "One write per event, and the outbox".
LOST_AFTER_POLLS = 3
LOST_AFTER_S = 120.0
MAX_LOST_JOBS = 3


def recover(run: Run, ctx: Context, attempt: Attempt, failure: FailureClass) -> Run:
    """Count the failure against its budget, then relaunch (now or after a backoff) or give up."""
    recovery = ctx.recovery
    if failure is FailureClass.USER_ERROR and attempt.exit_code in recovery.retryable_exit_codes:
        failure = FailureClass.INFRA  # declared retryable: counts against the infra budget
    if failure is FailureClass.OUT_OF_MEMORY:
        return recover_out_of_memory(run, ctx, attempt)
    if failure is FailureClass.QUOTA:  # no budget: each region, capacity and shape once
        return on_quota(run, ctx, attempt, attempt.end_reason or "")
    counter, limit_field, failed_status, budget = _BUDGETS[failure]
    used = getattr(run.counters, counter) + 1
    progressed = (run.latest_checkpoint is not None
                  and run.latest_checkpoint.step > (attempt.resumed_from_step or -1))
    ran = attempt.started_at is not None  # one that never ran says nothing about progress
    no_progress = 0 if progressed else run.counters.no_progress + (1 if ran else 0)
    run = replace(run, counters=replace(run.counters, **{counter: used, "no_progress": no_progress}))
    limit = int(getattr(recovery, limit_field, getattr(ctx.health, limit_field, MAX_LOST_JOBS)))
    if used > limit:
        escape, why = budget_escape(run, ctx, attempt, failure)
        if escape:  # a budget ends a run only when no capacity could finish it (issue 39)
            return launch(run, ctx, Capacity.STANDARD,
                          f"{budget} budget spent ({used} > {limit}): {why}")
        run = publish(run, ctx, "run.budget_exceeded", budget=budget, limit=limit, used=used)
        return fail(run, ctx, failed_status,
                     f"{budget} budget exhausted: {used} > {limit} (last: {_brief(attempt)})"
                     f"{why}", failure)
    if failure in _AVOID_REGION:  # the one region rule: not straight back to where it failed
        run = replace(run, avoid_regions=mark(
            run.avoid_regions, attempt.region, attempt.capacity,
            ctx.now + recovery.spot_cooldown_s, _AVOID_REGION[failure], ctx.now))
    if failure in (FailureClass.PREEMPTED, FailureClass.STOCKOUT):
        run = replace(run, spot_unavailable_until=spot_cooldown_until(ctx.now,
                                                                    recovery.spot_cooldown_s))
    if no_progress >= recovery.max_no_progress_attempts and (
            attempt.capacity is not Capacity.SPOT or recovery.escalation is EscalationKind.NEVER):
        run = publish(run, ctx, "run.budget_exceeded", budget="no_progress",
                       limit=recovery.max_no_progress_attempts, used=no_progress)
        return fail(run, ctx, RunStatus.FAILED_NO_PROGRESS,
                     f"{no_progress} attempts in a row ended without a newer checkpoint", failure)
    capacity, reason = _next_capacity(run, ctx, attempt, failure)
    if failure is FailureClass.DIVERGED:
        run = roll_back(run, ctx)
    if failure in _RELAUNCH_AT_ONCE:
        return launch(run, ctx, capacity, reason)
    failures_in_row = used if failure is not FailureClass.STOCKOUT else run.counters.stockouts
    wait = backoff_s(recovery, run.run_id, failures_in_row)
    run = replace(run, next_action_at=ctx.now + wait, next_capacity=capacity, next_reason=reason)
    return move_to(run, RunStatus.RECOVERING, ctx, f"{reason}; next attempt in {wait:.0f}s")


def _next_capacity(run: Run, ctx: Context, attempt: Attempt,
                   failure: FailureClass) -> tuple[Capacity, str]:
    """Where the next attempt runs after a failure, and why; the first rule that applies wins."""
    recovery = ctx.recovery
    spot_lost = failure in (FailureClass.PREEMPTED, FailureClass.STOCKOUT)
    # Issue 43: Spot lost in one region may be there in another (core.region_moves).
    elsewhere = spot_lost and attempt.capacity is Capacity.SPOT and spot_elsewhere(run, ctx)
    capacity = policy_capacity(run, ctx, current=None, spot_available=not spot_lost or elsewhere)
    escalating = attempt.capacity is Capacity.SPOT and \
        recovery.escalation is not EscalationKind.NEVER
    regions = max(len(ctx.pipeline.job.regions), 1)
    if escalating and run.counters.no_progress >= recovery.max_no_progress_attempts:
        # Spot keeps failing before a checkpoint: stop paying for work that is lost.
        return Capacity.STANDARD, (f"{run.counters.no_progress} attempts in a row without a "
                                   "newer checkpoint")
    if escalating and failure is FailureClass.STOCKOUT and run.counters.stockouts >= regions:
        # Waited for Spot in every region: stop waiting.
        return Capacity.STANDARD, (f"no Spot capacity in any of {regions} region(s) within "
                                   "the stockout wait")
    if capacity is Capacity.STANDARD and attempt.capacity is Capacity.SPOT:
        return capacity, escalation_reason(run, ctx, failure)
    return capacity, f"after {_brief(attempt)} of attempt {attempt.number}"


_BRIEF: Mapping[FailureClass, str] = {
    FailureClass.PREEMPTED: "preemption", FailureClass.STOCKOUT: "stockout",
    FailureClass.USER_ERROR: "user error", FailureClass.INFRA: "infrastructure error",
    FailureClass.TIMEOUT: "timeout", FailureClass.CANCELLED: "cancel",
    FailureClass.LAUNCH_REJECTED: "launch rejection", FailureClass.LOST: "lost job",
    FailureClass.HUNG: "hang", FailureClass.OUT_OF_MEMORY: "out of memory",
    FailureClass.DIVERGED: "divergence", FailureClass.QUOTA: "quota",
}


def _brief(attempt: Attempt) -> str:
    """A few words on how an attempt ended (its end_reason keeps the full message)."""
    words = _BRIEF.get(attempt.failure, "failure") if attempt.failure else "end"
    return f"{words} (exit code {attempt.exit_code})" if attempt.exit_code is not None else words
