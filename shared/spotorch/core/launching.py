"""Launching an attempt: where it goes, what it resumes from, and what its creation means."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from spotorch.core.context import Context
from spotorch.core.escalation import policy_capacity
from spotorch.core.intents import LaunchIntent
from spotorch.core.model import (
    CANCEL_BY_OPERATOR,
    CANCEL_ORPHAN,
    Attempt,
    AttemptState,
    FailureClass,
    Run,
    RunStatus,
)
from spotorch.core.moves import (
    LAUNCH_LEASE_S,
    add_intent,
    cancel_attempt,
    fail,
    move_to,
    next_intent_id,
    note,
    publish,
    release,
    with_attempt,
)
from spotorch.core.observations import (
    QUOTA_REFUSED,
    IntentDeferred,
    LaunchDone,
    LaunchFailed,
    Observation,
)
from spotorch.core.pipeline import Capacity
from spotorch.core.region_moves import next_region
from spotorch.core.trust import attempt_key


def first_launch(run: Run, ctx: Context, reason: str) -> Run:
    """Launch a run's first attempt, on the capacity its escalation policy chooses."""
    return launch(run, ctx, policy_capacity(run, ctx, current=None, spot_available=True),
                   reason)


def announce_hardware(run: Run, ctx: Context, hardware: Mapping[str, Any]) -> Run:
    """Note and publish the hardware the run was given (run.hardware_chosen)."""
    run = note(run, ctx, "hardware chosen", str(hardware.get("reason", "")))
    return publish(run, ctx, "run.hardware_chosen", **{
        k: hardware.get(k) for k in ("chosen", "reason", "warning", "expected_compute_s",
                                     "deadline_s", "rows")})


def startup_loss(attempt: Attempt | None) -> str | None:
    """What a preemption during start-up cost, said plainly: an attempt preempted before its
    trainer reported anything (package install, imports, data loading), so no checkpoint yet;
    None for any other attempt."""
    if attempt is None or attempt.failure is not FailureClass.PREEMPTED \
            or attempt.progress_step is not None or attempt.last_report_at is not None:
        return None
    after = (f" {attempt.ended_at - attempt.started_at:.0f} s after start"
             if attempt.started_at is not None and attempt.ended_at is not None else "")
    return (f"attempt {attempt.number} was preempted{after}, during start-up (before the "
            "trainer entered its loop: package install, imports, data loading): no checkpoint "
            "yet")


# ---------------------------------------------------------------- launching

def launch(run: Run, ctx: Context, capacity: Capacity, reason: str) -> Run:
    """Add the next attempt on this capacity, in the best region, resuming from the newest checkpoint."""
    previous = run.current
    number = len(run.attempts) + 1
    region = next_region(run, ctx, capacity)  # issue 43: the rule the simulator replays
    exact = run.health.trust_until_step is not None  # diverged checkpoints may still be there
    ckpt = run.health.rollback if exact else run.latest_checkpoint
    machine = run.health.machine_type
    attempt = Attempt(number=number, capacity=capacity, region=region, created_at=ctx.now,
                      resumed_from_step=ckpt.step if ckpt else None,
                      resumed_from_uri=ckpt.uri if ckpt else None, machine_type=machine,
                      report_key=attempt_key(ctx.key_seed, run.run_id, number))
    run = replace(run, attempts=(*run.attempts, attempt), next_action_at=None, next_capacity=None,
                  next_reason=None, next_region=None)
    if previous is not None and previous.capacity != capacity:
        run = replace(run, escalated={"from": str(previous.capacity), "to": str(capacity),
                                      "reason": reason, "at": ctx.now})
        run = publish(run, ctx, "run.escalated", **{"from": str(previous.capacity)},
                       to=str(capacity), reason=reason)
        run = note(run, ctx, f"escalated to {capacity}", reason)
    run = move_to(run, RunStatus.STARTING, ctx, reason)
    run = note(run, ctx, f"launch attempt {number} on {capacity} in {region}"
                + (f" ({machine})" if machine else ""),
                reason + (f"; resume from step {ckpt.step}" if ckpt else "; fresh start"
                          + (f" ({lost})" if (lost := startup_loss(previous)) else "")))
    run, intent_id = next_intent_id(run)
    return add_intent(run, LaunchIntent(intent_id, number, capacity, region,
                                  resume_step=ckpt.step if ckpt else None,
                                  resume_uri=ckpt.uri if ckpt else None,
                                  claimed_until=ctx.now + LAUNCH_LEASE_S,
                                  machine_type=machine, resume_exact=exact))


def on_launch_done(run: Run, obs: Observation, ctx: Context) -> Run:
    """The job of an attempt exists: it is queued, announced, or cancelled if the run moved on."""
    assert isinstance(obs, LaunchDone)
    run = replace(run, outbox=tuple(i for i in run.outbox if i.id != obs.intent_id))
    attempt = run.attempt(obs.attempt)
    if attempt is None:
        return run
    if attempt.job_name == obs.job_name:
        return run
    attempt = replace(attempt, job_name=obs.job_name,
                      state=AttemptState.QUEUED if attempt.state is AttemptState.LAUNCHING
                      else attempt.state,
                      queued_since=attempt.queued_since or ctx.now)
    run = with_attempt(run, attempt)
    if run.status.terminal or run.status is RunStatus.CANCELLING or attempt is not run.current:
        # The job was created after the run moved on: stop it, it must not train twice.
        reason = CANCEL_BY_OPERATOR if run.status is RunStatus.CANCELLING else CANCEL_ORPHAN
        return cancel_attempt(run, ctx, attempt, reason)
    run = publish(run, ctx, "attempt.launched", attempt=attempt.number,
                   capacity=str(attempt.capacity), region=attempt.region, job_name=obs.job_name,
                   resumed_from_step=attempt.resumed_from_step,
                   resumed_from_uri=attempt.resumed_from_uri)
    return note(run, ctx, f"attempt {attempt.number} job created", obs.job_name)


def on_intent_deferred(run: Run, obs: Observation, ctx: Context) -> Run:
    """An intent not carried out this time: give up its claim; a launch notes why it waits."""
    assert isinstance(obs, IntentDeferred)
    intent = next((i for i in run.outbox if i.id == obs.intent_id), None)
    if intent is None:
        return run
    why = QUOTA_REFUSED if obs.code == QUOTA_REFUSED else "waiting"
    run = release(run, obs.intent_id, ctx.now, why if isinstance(intent, LaunchIntent) else "")
    if not isinstance(intent, LaunchIntent):
        # On the record at the first failure, with the service's error (issue 39); once per
        # error, not once per try.
        line = f"{intent.kind} failed, will retry"
        if any(h.what == line and h.reason == obs.reason for h in run.history[-10:]):
            return run
        return note(run, ctx, line, obs.reason)
    line = f"launch of attempt {intent.attempt} waits"
    if run.history and run.history[-1].what == line:
        return run  # one line in the history, not one per try
    return note(run, ctx, line, obs.reason)


def on_launch_failed(run: Run, obs: Observation, ctx: Context) -> Run:
    """A launch failed: transient, it is retried by the tick; permanent, the run fails."""
    assert isinstance(obs, LaunchFailed)
    attempt = run.attempt(obs.attempt)
    if not obs.permanent or attempt is None or not attempt.live:
        # Transient: the intent stays in the outbox and its claim is given up, so the next tick
        # tries again (a Vertex that answers again is used within one tick); refused for quota,
        # the tick's retry pass takes it again as the budget refills.
        run = release(run, obs.intent_id, ctx.now, obs.code or "transient")
        line = f"launch of attempt {obs.attempt} failed, will retry"
        if run.history and run.history[-1].what == line:
            return run  # retried until it goes: one line in the history, not one per try
        return note(run, ctx, line, obs.message)
    run = replace(run, outbox=tuple(i for i in run.outbox if i.id != obs.intent_id))
    attempt = replace(attempt, state=AttemptState.FAILED, ended_at=ctx.now,
                      failure=FailureClass.LAUNCH_REJECTED, end_reason=obs.message)
    run = with_attempt(run, attempt)
    return fail(run, ctx, RunStatus.FAILED_LAUNCH, f"Vertex AI refused the job: {obs.message}",
                 FailureClass.LAUNCH_REJECTED)
