"""The small moves every rule makes: note, change status, add an intent, publish, cancel, fail, stop."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from spotorch.core import outbox
from spotorch.core.context import Context
from spotorch.core.cost import ledger, ledger_dict
from spotorch.core.events import build_event
from spotorch.core.intents import CancelIntent, Intent, LaunchIntent, PublishIntent
from spotorch.core.model import (
    CANCEL_BY_OPERATOR,
    PROBES_LIMIT,
    TRANSITIONS,
    Attempt,
    FailureClass,
    HistoryEntry,
    InvalidTransition,
    Probe,
    Run,
    RunStatus,
)
from spotorch.core.observations import error_line
from spotorch_trainer.contract import rfc3339

# ---------------------------------------------------------------- small pure helpers

SEEN_LIMIT = 200
HISTORY_LIMIT = 400
LAUNCH_LEASE_S = outbox.LEASE_S


def note(run: Run, ctx: Context, what: str, reason: str = "") -> Run:
    """Add a line to the run's history, keeping only the newest HISTORY_LIMIT."""
    history = (*run.history, HistoryEntry(ctx.now, what, reason))[-HISTORY_LIMIT:]
    return replace(run, history=history)


def move_to(run: Run, status: RunStatus, ctx: Context, reason: str = "") -> Run:
    """Change the run's status if TRANSITIONS allows it (InvalidTransition if not), noted in history."""
    if status == run.status:
        return run
    if status not in TRANSITIONS[run.status]:
        raise InvalidTransition(f"{run.run_id}: {run.status} -> {status} is not allowed")
    run = replace(run, status=status, end_reason=reason if status.terminal else run.end_reason)
    return note(run, ctx, f"status {status}", reason)


def next_intent_id(run: Run) -> tuple[Run, str]:
    """The run with its intent counter moved on, and the id of the next intent."""
    return replace(run, intent_seq=run.intent_seq + 1), f"{run.run_id}/{run.intent_seq + 1}"


def add_intent(run: Run, intent: Intent) -> Run:
    """The run with the intent added to its outbox."""
    return replace(run, outbox=(*run.outbox, intent))


def publish(run: Run, ctx: Context, kind: str, **data: Any) -> Run:
    """Add a CloudEvent of this kind to the outbox, numbered by the run's event sequence."""
    seq = run.event_seq + 1
    event = build_event(run_id=run.run_id, pipeline=run.pipeline, sequence=seq, kind=kind,
                        data=data, time=ctx.now)
    run, intent_id = next_intent_id(replace(run, event_seq=seq))
    return add_intent(run, PublishIntent(intent_id, event, claimed_until=ctx.now + LAUNCH_LEASE_S))


def with_attempt(run: Run, attempt: Attempt) -> Run:
    """The run with this attempt replacing the one of the same number."""
    attempts = list(run.attempts)
    attempts[attempt.number - 1] = attempt
    return replace(run, attempts=tuple(attempts))


def iso(ts: float | None) -> str | None:
    """An epoch time as RFC 3339 (for events), None kept as None."""
    return None if ts is None else rfc3339(ts)


def fmt_s(seconds: float) -> str:
    """A duration for people: hours past one hour, else seconds."""
    return f"{seconds / 3600:.1f}h" if seconds >= 3600 else f"{seconds:.0f}s"


def fail(run: Run, ctx: Context, status: RunStatus, reason: str,
          failure: FailureClass | None, **extra: Any) -> Run:
    """End the run failed and publish run.failed (extra: more fields, e.g. `quota`)."""
    run = move_to(run, status, ctx, reason)
    tail = next((a.error_tail for a in reversed(run.attempts) if a.error_tail), ())
    return publish(run, ctx, "run.failed", status=str(status), reason=reason,
                    failure_class=str(failure) if failure else None, attempts=len(run.attempts),
                    preemptions=run.counters.preemptions, cost=cost_of(run, ctx),
                    error=error_line(tail), error_tail=list(tail), **extra)


def cancel_attempt(run: Run, ctx: Context, attempt: Attempt, why: str) -> Run:
    """Ask to cancel an attempt's job (once; an operator's cancel may follow any other reason)."""
    if attempt.cancel_reason is not None and why != CANCEL_BY_OPERATOR:
        return run
    attempt = replace(attempt, cancel_reason=why)
    run = with_attempt(run, attempt)
    if attempt.job_name is None:
        return run  # not created yet: LaunchDone cancels it when it appears
    run, intent_id = next_intent_id(run)
    return add_intent(run, CancelIntent(intent_id, attempt.number, attempt.job_name, why,
                                  claimed_until=ctx.now + LAUNCH_LEASE_S))


def stop(run: Run, ctx: Context, reason: str, ends_as: RunStatus | None) -> Run:
    """Stop a run: cancel its live job, then end as ends_as (None: CANCELLED)."""
    if run.status is RunStatus.CANCELLING:
        return run
    live = run.current if run.current is not None and run.current.live else None
    if live is None:
        if ends_as is not None:
            return fail(run, ctx, ends_as, reason, None)
        run = move_to(run, RunStatus.CANCELLED, ctx, reason)
        return publish(run, ctx, "run.cancelled", status=str(run.status), reason=reason,
                        cost=cost_of(run, ctx))
    run = move_to(run, RunStatus.CANCELLING, ctx, reason)
    run = replace(run, end_reason=reason, stop_status=ends_as)
    # If the job is not created yet, LaunchDone cancels it when it appears.
    return cancel_attempt(run, ctx, live, CANCEL_BY_OPERATOR)


def with_probe(run: Run, probe: Probe) -> Run:
    """The run with this probe added or replaced, the oldest ended ones dropped past PROBES_LIMIT."""
    kept = tuple(probe if p.number == probe.number else p for p in run.probes)
    if all(p.number != probe.number for p in run.probes):
        kept = (*kept, probe)
    # Forget the oldest ended probes first; a live one is never forgotten.
    while len(kept) > PROBES_LIMIT and any(not p.live for p in kept):
        oldest = next(p for p in kept if not p.live)
        kept = tuple(p for p in kept if p is not oldest)
    return replace(run, probes=kept)


def drop_intent(run: Run, intent_id: str) -> Run:
    """The run without the outbox intent of this id (it was carried out)."""
    return replace(run, outbox=tuple(i for i in run.outbox if i.id != intent_id))


# ---------------------------------------------------------------- cost

def cost_of(run: Run, ctx: Context) -> dict[str, object]:
    """The run's cost ledger (spotorch.core.cost) as its terminal event carries it."""
    return ledger_dict(ledger(run, ctx.pipeline, ctx.now, ctx.prices))


def spent(run: Run, ctx: Context) -> float:
    """What the run has cost so far: the ledger's total (the one cost, budgets included)."""
    return ledger(run, ctx.pipeline, ctx.now, ctx.prices).total


# ---------------------------------------------------------------- outbox helpers

def claimable(run: Run, now: float) -> tuple[Intent, ...]:
    """Intents whose executor's claim has expired (crashed or lost): the tick may carry them out."""
    return outbox.claimable(run.outbox, now)


def release(run: Run, intent_id: str, now: float, why: str = "") -> Run:
    """Give up the claim on an intent (its executor stopped trying): the next tick takes it
    at once rather than when the claim would have expired (core.outbox); a launch notes why."""
    def noted(intent: Intent) -> Intent:
        return replace(intent, deferred=why) if isinstance(intent, LaunchIntent) else intent
    return replace(run, outbox=outbox.release(run.outbox, intent_id, now, noted))


def claim(run: Run, intents: tuple[Intent, ...], now: float) -> Run:
    """Take over intents for LAUNCH_LEASE_S (in the same conditional write that reads them)."""
    return replace(run, outbox=outbox.claim(run.outbox, (i.id for i in intents), now,
                                            LAUNCH_LEASE_S))


def remember(run: Run, event_id: str | None) -> Run:
    """Record an event id as handled (bounded), so a redelivery is recognised without work."""
    if not event_id:
        return run
    return replace(run, seen=(*run.seen, event_id)[-SEEN_LIMIT:])
