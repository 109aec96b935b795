"""Training health in decisions: hung, slow and diverged attempts, out of memory, checkpoint retention."""

from __future__ import annotations

import math
from dataclasses import replace

from spotorch.core import health as hp
from spotorch.core.context import Context
from spotorch.core.escalation import spot_history
from spotorch.core.intents import DeleteCheckpointsIntent, LaunchIntent
from spotorch.core.launching import launch
from spotorch.core.model import (
    CANCEL_DIVERGED,
    CANCEL_HUNG,
    CANCEL_SLOW,
    KNOWN_CHECKPOINTS_LIMIT,
    Attempt,
    AttemptState,
    Checkpoint,
    FailureClass,
    Run,
    RunStatus,
)
from spotorch.core.moves import (
    LAUNCH_LEASE_S,
    add_intent,
    cancel_attempt,
    fail,
    iso,
    next_intent_id,
    note,
    publish,
    stop,
    with_attempt,
)
from spotorch.core.observations import CheckpointsDeleted, Observation, TrainerReported
from spotorch.core.pipeline import rank_replica

# ---------------------------------------------------------------- training health
#
# Rules over the trainer's reports (hung, step rate, divergence), over time (the tick: hung,
# stale checkpoints), over failed attempts (out of memory) and over checkpoints (retention).
# The rules themselves are pure functions in spotorch.core.health; this section feeds them the run's
# signals and turns what they find into history, events, cancels and relaunches. A rule only
# looks at the current, live attempt of a STARTING/RUNNING run that nothing is cancelling.

def _watched(run: Run, attempt: Attempt) -> bool:
    current = run.current
    return (run.status in (RunStatus.STARTING, RunStatus.RUNNING) and current is not None
            and attempt.number == current.number and attempt.live
            and attempt.cancel_reason is None)


def _loss_of(obs: TrainerReported, metric: str) -> float | None:
    """The loss a report carries: NaN when the trainer flagged it non-finite."""
    if metric in obs.nonfinite:
        return math.nan
    return obs.metrics.get(metric)


def trainer_health(run: Run, obs: TrainerReported, ctx: Context,
                    fresh_rate: float | None, *, newest: bool = True) -> Run:
    """Fold a trainer report into the run's health: rate, loss, gaps; act on slow or diverged."""
    attempt = run.attempt(obs.attempt)
    if attempt is None or not _watched(run, attempt):
        return run
    policy, health = ctx.health, run.health
    gap = obs.at - attempt.last_report_at if attempt.last_report_at is not None else 0.0
    rate, slow = health.rate, None
    if fresh_rate is not None:
        rate, slow = hp.rate_sample(policy, health.rate, fresh_rate, obs.step)
    loss, diverged = health.loss, None
    value = _loss_of(obs, policy.loss_metric)
    if value is not None and obs.step is not None and obs.kind == "progress" and newest:
        loss, diverged = hp.loss_sample(policy, health.loss, obs.step, value)
    straggler, straggling = health.straggler, None
    if obs.replica_step_s and obs.kind == "progress" and newest:
        straggler, straggling = hp.straggler_sample(policy, health.straggler,
                                                    obs.replica_step_s, obs.step)
    health = replace(health, reports=health.reports + 1,
                     longest_gap_s=max(health.longest_gap_s, gap),
                     report_interval_s=obs.report_interval_s or health.report_interval_s,
                     rate=rate, loss=loss, straggler=straggler)
    attempts = list(run.attempts)  # one copy of the run for attempt and health together
    attempts[attempt.number - 1] = replace(attempt, last_report_at=max(
        obs.at, attempt.last_report_at or obs.at))
    run = replace(run, attempts=tuple(attempts), health=health)
    if obs.checkpoint is not None:
        run = _known_checkpoint(run, ctx, obs)
    if slow is not None:
        run = _on_slow(run, ctx, slow)
    current = run.current
    if straggling is not None and current is not None and _watched(run, current):
        run = _on_straggler(run, ctx, straggling)
    current = run.current
    if diverged is not None and current is not None and _watched(run, current):
        run = _on_diverged(run, ctx, diverged)
    return run


def _known_checkpoint(run: Run, ctx: Context, obs: TrainerReported) -> Run:
    """Remember a reported checkpoint (with its metric, for keep-best) and when it arrived."""
    reported = obs.checkpoint
    assert reported is not None
    metric_name = ctx.health.keep_best_metric
    metric = obs.metrics.get(metric_name) if metric_name else None
    known = hp.KnownCheckpoint(reported.step, reported.uri, obs.at, metric, obs.checkpoint_s)
    others = tuple(c for c in run.health.checkpoints if c.step != reported.step)
    checkpoints = tuple(sorted((*others, known), key=lambda c: c.step))[-KNOWN_CHECKPOINTS_LIMIT:]
    health = replace(run.health, checkpoints=checkpoints)
    if run.latest_checkpoint is not None and run.latest_checkpoint.step == reported.step:
        health = replace(health, checkpoint_at=obs.at)
    return replace(run, health=health)


def _cancel_for_health(run: Run, ctx: Context, why: str, detail: str) -> Run:
    current = run.current
    assert current is not None
    run = with_attempt(run, replace(current, cancel_detail=detail))
    return cancel_attempt(run, ctx, run.current or current, why)


def _on_slow(run: Run, ctx: Context, finding: hp.Finding) -> Run:
    current = run.current
    assert current is not None
    relaunch = ctx.health.step_rate_relaunch
    run = publish(run, ctx, "run.step_rate_degraded", attempt=current.number,
                   step=finding.step, rate=finding.values.get("rate"),
                   median=finding.values.get("median"),
                   fraction=finding.values.get("fraction"), reason=finding.message,
                   action="relaunch" if relaunch else "warn")
    run = note(run, ctx, f"step rate collapsed on attempt {current.number}", finding.message)
    if not relaunch:
        return run
    return _cancel_for_health(run, ctx, CANCEL_SLOW, f"{finding.rule}: {finding.message}")


def _on_straggler(run: Run, ctx: Context, finding: hp.Finding) -> Run:
    """One replica holds the collective back: tell it (which replica, how slow); relaunch on new
    VMs from the latest checkpoint when health.straggler_relaunch says so."""
    current = run.current
    assert current is not None
    relaunch = ctx.health.straggler_relaunch
    rank = int(finding.values.get("rank") or 0)
    replica = rank_replica(rank)
    run = publish(run, ctx, "run.straggler", attempt=current.number, step=finding.step,
                   rank=rank, replica=replica, step_s=finding.values.get("step_s"),
                   median_s=finding.values.get("median_s"),
                   factor=finding.values.get("factor"), reason=finding.message,
                   action="relaunch" if relaunch else "warn")
    run = note(run, ctx, f"replica {replica} is a straggler on attempt {current.number}",
               finding.message)
    if not relaunch:
        return run
    return _cancel_for_health(run, ctx, CANCEL_SLOW, f"{finding.rule}: {finding.message}")


def _on_diverged(run: Run, ctx: Context, finding: hp.Finding) -> Run:
    """A divergence rule fired: fail the run, or relaunch from before the divergence began."""
    current = run.current
    assert current is not None
    policy = ctx.health
    relaunch = policy.divergence_action is hp.DivergenceAction.RELAUNCH
    safe = hp.resume_point(((c.step, c.uri) for c in run.health.checkpoints),
                           finding.good_until_step)
    run = publish(run, ctx, "run.diverged", attempt=current.number, rule=str(finding.rule),
                   step=finding.step, values=dict(finding.values), reason=finding.message,
                   action="relaunch" if relaunch else "fail",
                   resume_step=safe[0] if safe and relaunch else None)
    run = note(run, ctx, f"diverged: {finding.rule} at step {finding.step}", finding.message)
    if not relaunch:
        return stop(run, ctx, f"diverged ({finding.rule}): {finding.message}",
                     RunStatus.FAILED_DIVERGED)
    rollback = Checkpoint(*safe) if safe else None
    run = replace(run, health=replace(run.health, rollback=rollback))
    return _cancel_for_health(run, ctx, CANCEL_DIVERGED, f"{finding.rule}: {finding.message}")


def roll_back(run: Run, ctx: Context) -> Run:
    """Before relaunching a diverged run: resume from the safe checkpoint, delete the later ones."""
    health = run.health
    safe = health.rollback
    trusted = safe.step if safe else -1
    progress = replace(run.progress, step=max(trusted, 0), at=None, rate=None)
    health = replace(health, trust_until_step=trusted, loss=hp.LossState(),
                     checkpoints=tuple(c for c in health.checkpoints if c.step <= trusted))
    run = replace(run, latest_checkpoint=safe, progress=progress, health=health)
    run = note(run, ctx, "roll back", f"resume from step {safe.step}" if safe
                else "no checkpoint before the divergence: fresh start")
    run, intent_id = next_intent_id(run)
    return add_intent(run, DeleteCheckpointsIntent(intent_id, run.checkpoint_uri, above=trusted,
                                             claimed_until=ctx.now + LAUNCH_LEASE_S))


def _base_machine(ctx: Context) -> str:
    pools = ctx.pipeline.job.worker_pools
    return pools[0].machine_type if pools else ""


def recover_out_of_memory(run: Run, ctx: Context, attempt: Attempt) -> Run:
    """Out of memory: never the same machine again; the next larger fallback, or fail."""
    run = replace(run, counters=replace(run.counters,
                                        out_of_memory=run.counters.out_of_memory + 1))
    current = attempt.machine_type or _base_machine(ctx)
    larger = hp.next_machine(ctx.health, current)
    if larger is None:
        why = (f"{current} is the largest of health.fallback_machines"
               if ctx.health.fallback_machines else "no health.fallback_machines listed")
        return fail(run, ctx, RunStatus.FAILED_OUT_OF_MEMORY,
                     f"out of memory on {current}; not retried on the same machine ({why})",
                     FailureClass.OUT_OF_MEMORY)
    reason = f"out of memory on {current}: next attempt on {larger}"
    # Another machine, another normal step rate: the median starts over.
    run = replace(run, health=replace(run.health, machine_type=larger, rate=hp.RateState()))
    run = publish(run, ctx, "run.machine_changed", **{"from": current}, to=larger,
                   reason=reason, attempt=attempt.number)
    run = note(run, ctx, f"machine {current} -> {larger}", reason)
    return launch(run, ctx, attempt.capacity, reason)


def tick_health(run: Run, ctx: Context, current: Attempt) -> Run:
    """Time-based rules: hung attempts, stale checkpoints (runs that use the trainer helper)."""
    if run.status is not RunStatus.RUNNING or current.state is not AttemptState.RUNNING \
            or run.health.reports == 0 or not _watched(run, current):
        return run
    if current.missing_polls:
        # Vertex answered NOT_FOUND: the job may be gone, and a silent trainer is what a gone
        # job looks like. The lost rule decides (its own budget), not the hang rule.
        return run
    health = run.health
    silent_since = current.last_report_at or current.started_at or ctx.now
    starting = (current.progress_step or 0) <= (current.resumed_from_step or 0)
    found = hp.hung(ctx.health, silent_s=ctx.now - silent_since,
                    report_interval_s=health.report_interval_s,
                    longest_gap_s=health.longest_gap_s, step=run.progress.step,
                    starting=starting)
    if found is not None:
        run = publish(run, ctx, "attempt.hung", attempt=current.number,
                       job_name=current.job_name, step=run.progress.step,
                       silent_s=found.values["silent_s"],
                       hang_after_s=found.values["hang_after_s"],
                       last_report=iso(current.last_report_at), reason=found.message)
        run = note(run, ctx, f"attempt {current.number} hung", found.message)
        return _cancel_for_health(run, ctx, CANCEL_HUNG, found.message)
    latest = run.latest_checkpoint
    key = f"{current.number}:{latest.step if latest else -1}"
    if health.stale_warned == key:
        return run
    since = max(health.checkpoint_at or 0.0, current.started_at or ctx.now)
    found = hp.stale_checkpoint(ctx.health, since_s=ctx.now - since, step=run.progress.step)
    if found is None:
        return run
    run = replace(run, health=replace(health, stale_warned=key))
    run = publish(run, ctx, "run.checkpoint_stale", attempt=current.number,
                   step=run.progress.step, checkpoint_step=latest.step if latest else None,
                   since_s=found.values["since_s"], stale_after_s=found.values["stale_after_s"],
                   reason=found.message)
    return note(run, ctx, "checkpoint stale", found.message)


def retention(before: Run, run: Run, ctx: Context) -> Run:
    """Decide a retention pass when a newer checkpoint became known, and when the run ends."""
    policy = ctx.health
    ending = before.active and not run.active
    newer = run.active and run.latest_checkpoint is not None \
        and run.latest_checkpoint != before.latest_checkpoint
    if policy.keep_last is None or not (ending or newer) or (ending and not policy.prune_on_end):
        return run
    if run.latest_checkpoint is None and not run.health.checkpoints:
        return run  # nothing was ever written
    if any(isinstance(i, DeleteCheckpointsIntent) and (i.above is not None or i.ending == ending)
           for i in run.outbox):
        return run  # a pass (or the diverged checkpoints' deletion) is pending: it comes first
    protect = {a.resumed_from_step for a in run.attempts if a.live}
    protect |= {i.resume_step for i in run.outbox if isinstance(i, LaunchIntent)}
    protect |= {c.step for c in (run.latest_checkpoint, run.health.rollback) if c is not None}
    if policy.keep_best_metric:
        protect.add(hp.best_step(run.health.checkpoints, policy.keep_best_mode))
    keep = tuple(sorted(s for s in protect if s is not None))
    run, intent_id = next_intent_id(run)
    return add_intent(run, DeleteCheckpointsIntent(
        intent_id, run.checkpoint_uri,
        keep_newest=policy.keep_last_on_end if ending else policy.keep_last, keep=keep,
        ending=ending, claimed_until=ctx.now + LAUNCH_LEASE_S))


def on_checkpoints_deleted(run: Run, obs: Observation, ctx: Context) -> Run:
    """Checkpoints were deleted: forget them, count the bytes, end a rollback if one asked for it."""
    assert isinstance(obs, CheckpointsDeleted)
    intent = next((i for i in run.outbox if i.id == obs.intent_id), None)
    run = replace(run, outbox=tuple(i for i in run.outbox if i.id != obs.intent_id))
    if not isinstance(intent, DeleteCheckpointsIntent):
        return run
    gone = set(obs.steps)
    health = run.health
    health = replace(health, deleted_checkpoints=health.deleted_checkpoints + len(gone),
                     bytes_reclaimed=health.bytes_reclaimed + obs.bytes,
                     checkpoints=tuple(c for c in health.checkpoints if c.step not in gone))
    rollback = intent.above is not None
    if rollback:
        health = replace(health, trust_until_step=None, rollback=None)
    run = replace(run, health=health)
    if not gone:
        return run
    why = "divergence" if rollback else "retention"
    run = note(run, ctx, f"{len(gone)} checkpoint(s) deleted ({why})",
                f"steps {sorted(gone)}; {obs.bytes} bytes reclaimed")
    if not run.active:
        return run  # a terminal run publishes nothing after its last event; history has it
    return publish(run, ctx, "run.checkpoints_deleted", steps=sorted(gone),
                    bytes_reclaimed=obs.bytes, total_bytes_reclaimed=health.bytes_reclaimed,
                    reason=why)


def checkpoint_advice(run: Run, now: float) -> hp.CheckpointAdvice:
    """The run's checkpoint interval against the Young/Daly optimum (for `spotorch show`)."""
    history = spot_history(run, now)
    known = run.health.checkpoints
    return hp.checkpoint_advice([c.at for c in known],
                                [c.seconds for c in known if c.seconds is not None],
                                history.run_s, run.counters.preemptions)
