"""decide(run, observation, context) -> run: one observation applied, its intents in the outbox."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from spotorch.core import hardware as hw
from spotorch.core import preprocessing
from spotorch.core import provenance as prov
from spotorch.core.context import Context
from spotorch.core.escalation import deadline_warning, policy_view, spot_cooldown_until, spot_cooling
from spotorch.core.intents import RegisterModelIntent
from spotorch.core.launching import (
    announce_hardware,
    first_launch,
    launch,
    on_intent_deferred,
    on_launch_done,
)
from spotorch.core.model import (
    CANCEL_ORPHAN,
    CANCEL_STOCKOUT,
    CANCEL_SWITCH,
    METRIC_NAMES_LIMIT,
    METRIC_SAMPLES_LIMIT,
    PHASE_TO_STATE,
    Attempt,
    AttemptState,
    Checkpoint,
    FailureClass,
    JobPhase,
    JobStatus,
    MetricPoint,
    MetricSample,
    Progress,
    Run,
    RunStatus,
)
from spotorch.core.moves import (
    LAUNCH_LEASE_S,
    add_intent,
    cancel_attempt,
    cost_of,
    fail,
    fmt_s,
    iso,
    move_to,
    next_intent_id,
    note,
    publish,
    spent,
    stop,
    with_attempt,
)
from spotorch.core.observations import (
    CancelRequested,
    CheckpointsDeleted,
    IntentDeferred,
    IntentDone,
    JobMissing,
    JobObserved,
    LaunchDone,
    LaunchFailed,
    ModelRegistered,
    Observation,
    PreprocessCacheChecked,
    PreprocessObserved,
    ProbeLaunched,
    ProbeLaunchFailed,
    ProbeMissing,
    ProbeObserved,
    Promote,
    Tick,
    TrainerReported,
    bounded_tail,
    error_line,
)
from spotorch.core.pipeline import Capacity, Pipeline
from spotorch.core.policy import RegionRecord, choose_capacity, may_switch
from spotorch.core.price_list import LIST_PRICES
from spotorch.core.prices import PriceTable
from spotorch.core.probes import (
    on_probe,
    on_probe_launch_failed,
    on_probe_launched,
    on_probe_missing,
    probe_hardware,
    probe_judged,
    probes_follow,
    probing,
    tick_hardware,
    tick_probe,
)
from spotorch.core.quotas import on_launch_refused
from spotorch.core.recovery import (
    END_REASONS,
    LOST_AFTER_POLLS,
    LOST_AFTER_S,
    STOP_FAILURES,
    failure_of,
    recover,
)
from spotorch.core.region_moves import hop_elsewhere
from spotorch.core.training_health import on_checkpoints_deleted, retention, tick_health, trainer_health
from spotorch.core.trust import rate_sample
from spotorch_trainer.contract import EVENT_COMPLETED

# ---------------------------------------------------------------- creating a run

def new_run(*, run_id: str, pipeline: Pipeline, now: float, data_uri: str,
            snapshot_id: str | None, queued: bool = False,
            resume_from: Checkpoint | None = None, retry_of: str | None = None,
            reason: str = "", sweep_id: str | None = None,
            params: Mapping[str, Any] | None = None,
            hardware: Mapping[str, Any] | None = None,
            region_order: tuple[str, ...] | None = None,
            region_records: Mapping[str, RegionRecord] | None = None,
            hardware_cache: Mapping[str, hw.ProbeResult] | None = None,
            outlook: hw.Outlook | None = None,
            prices: PriceTable = LIST_PRICES, key_seed: bytes = b"",
            provenance: Mapping[str, Any] | None = None, rerun_of: str | None = None) -> Run:
    """A new run: created, announced, and (unless queued) its first attempt launched.

    hardware: the choice among the pipeline's hardware candidates (issue 19), if one was made;
    region_order: the regions ranked by the shared Spot record (Context.region_order);
    region_records: that record's figures per region (Context.region_records);
    hardware_cache: the pipeline's cached probe results: with candidates and no choice made,
    the run probes those without a fresh result first (status PROBING);
    key_seed: the shell's random bytes the first attempt's report key derives from;
    provenance: what the run trains on and with (spotorch.core.provenance), recorded now only."""
    deadline = now + pipeline.deadline_s if pipeline.deadline_s else None
    run = Run(run_id=run_id, pipeline=pipeline.name, status=RunStatus.PENDING, created_at=now,
              updated_at=now, data_uri=data_uri, snapshot_id=snapshot_id, deadline_at=deadline,
              checkpoint_uri=pipeline.run_checkpoint_uri(retry_of or run_id),
              output_uri=pipeline.run_output_uri(run_id), latest_checkpoint=resume_from,
              retry_of=retry_of, sweep_id=sweep_id, params=dict(params or {}),
              hardware=hardware, provenance=dict(provenance) if provenance else None,
              rerun_of=rerun_of)
    ctx = Context(pipeline, now, region_order=region_order, region_records=region_records,
                  outlook=outlook, prices=prices, key_seed=key_seed)
    run = note(run, ctx, "created", reason)
    run = publish(run, ctx, "run.created", status=str(RunStatus.PENDING), data_uri=data_uri,
                   snapshot_id=snapshot_id, deadline=iso(deadline), reason=reason,
                   rerun_of=rerun_of, provenance=prov.event_form(provenance))
    if hardware is not None:  # issue 19: the table travels with the event
        run = announce_hardware(run, ctx, hardware)
    if queued:
        return move_to(run, RunStatus.QUEUED, ctx, "waiting for the active run of the pipeline")
    if pipeline.preprocess is not None:  # issue 31: its output first (or the cache's)
        return preprocessing.begin(run, ctx, "preprocess step first")
    if hardware is None and pipeline.hardware is not None and hardware_cache is not None:
        return probe_hardware(run, ctx, hardware_cache)
    return first_launch(run, ctx, "first attempt")


# ---------------------------------------------------------------- decide

def decide(run: Run, obs: Observation, ctx: Context) -> Run:
    """Apply one observation: the new run, with any new intents in its outbox."""
    if run.status.terminal and not isinstance(obs, IntentDone | IntentDeferred | LaunchDone
                                              | JobObserved | JobMissing
                                              | CheckpointsDeleted | ProbeLaunched
                                              | ProbeLaunchFailed | ProbeObserved | ProbeMissing
                                              | PreprocessObserved | PreprocessCacheChecked):
        return run
    handler = _HANDLERS[type(obs)]
    new = probes_follow(retention(run, handler(run, obs, ctx), ctx), ctx)
    return new if new == run else replace(new, updated_at=ctx.now)


def _on_intent_done(run: Run, obs: Observation, ctx: Context) -> Run:
    assert isinstance(obs, IntentDone)
    return replace(run, outbox=tuple(i for i in run.outbox if i.id != obs.intent_id))


def _on_trainer(run: Run, obs: Observation, ctx: Context) -> Run:
    assert isinstance(obs, TrainerReported)
    attempt = run.attempt(obs.attempt)
    if attempt is None:
        return run
    progress = run.progress
    fresh_rate: float | None = None
    # "completed" is a hint: only Vertex's SUCCEEDED ends an attempt and moves progress to it.
    hint = obs.kind == EVENT_COMPLETED
    # The attempt's newest report (or one of its newest step): an older step of the same
    # attempt is a reordered or replayed message, which says nothing new about its loss (a
    # replay of the newest one is a seen event id).
    newest = obs.step is not None and obs.step >= (attempt.progress_step or -1)
    if obs.step is not None and obs.step >= progress.step and not hint:
        rate = progress.rate
        if progress.at is not None and attempt.started_at is not None \
                and progress.at >= attempt.started_at:
            sample = rate_sample(obs.step - progress.step, obs.at - progress.at)
            rate = fresh_rate = sample if sample is not None else rate
        progress = Progress(step=obs.step, total_steps=obs.total_steps or progress.total_steps,
                            at=obs.at, rate=rate, metrics=dict(obs.metrics) or progress.metrics)
    elif hint and obs.metrics:
        progress = replace(progress, metrics=dict(obs.metrics))  # the final metrics
    run = replace(run, progress=progress)
    if hint:
        run = with_attempt(run, replace(attempt, reported_done_step=obs.step))
    elif obs.step is not None and obs.step > (attempt.progress_step or -1):
        run = with_attempt(run, replace(attempt, progress_step=obs.step))
    reported = obs.checkpoint
    if reported is not None:
        run = _newer_checkpoint(run, reported)
    if obs.kind == "failed" and obs.exit_code is not None:
        run = with_attempt(run, replace(run.attempt(obs.attempt) or attempt,
                                        reported_exit=obs.exit_code))
    if obs.kind == "started" and attempt.started_at is None:
        run = with_attempt(run, replace(run.attempt(obs.attempt) or attempt, started_at=obs.at))
    run = _metric_history(run, obs)
    return _sweep_curve(trainer_health(run, obs, ctx, fresh_rate, newest=newest and not hint),
                        obs, ctx)


# ---------------------------------------------------------------- Model Registry

def _register_model(run: Run, ctx: Context, attempt: Attempt, succeeded: Mapping[str, Any]) -> Run:
    """The job succeeded: register the model first; run.succeeded then names its version."""
    run = move_to(run, RunStatus.REGISTERING, ctx, f"attempt {attempt.number} succeeded")
    run, intent_id = next_intent_id(run)
    return add_intent(run, RegisterModelIntent(intent_id, run.output_uri, dict(succeeded),
                                         claimed_until=ctx.now + LAUNCH_LEASE_S))


def _on_model_registered(run: Run, obs: Observation, ctx: Context) -> Run:
    assert isinstance(obs, ModelRegistered)
    intent = next((i for i in run.outbox if i.id == obs.intent_id), None)
    if not isinstance(intent, RegisterModelIntent) or run.status is not RunStatus.REGISTERING:
        return run  # a redelivered result
    run = replace(run, outbox=tuple(i for i in run.outbox if i.id != obs.intent_id),
                  model_name=obs.model_name)
    line = f"model registered: {obs.model_name}" if obs.model_name else \
        f"model not registered: {obs.error}"
    why = f"attempt {run.current.number} succeeded" if run.current else "succeeded"
    run = move_to(note(run, ctx, line), RunStatus.SUCCEEDED, ctx, why)
    return publish(run, ctx, "run.succeeded", status=str(run.status), **intent.succeeded,
                    model_name=obs.model_name, model_error=obs.error)


# ---------------------------------------------------------------- metrics by step, for people

def _metric_history(run: Run, obs: TrainerReported) -> Run:
    """Keep the report's metrics by step: the first METRIC_NAMES_LIMIT names, finite values; a
    later attempt rewrites the steps it repeats, a late or repeated report of an earlier step
    changes nothing; when full, every other older sample goes (the whole run stays drawn,
    older parts coarser)."""
    if obs.step is None or not obs.metrics:
        return run
    last = run.metric_history[-1] if run.metric_history else None
    if last is not None and (obs.attempt, obs.step) <= (last.attempt, last.step):
        return run
    names = list(dict.fromkeys(k for s in run.metric_history for k in s.values))
    names += [k for k in obs.metrics if k not in names]
    kept_names = set(names[:METRIC_NAMES_LIMIT])
    values = {k: float(v) for k, v in obs.metrics.items()
              if k in kept_names and math.isfinite(v)}
    if not values:
        return run
    samples = (*(s for s in run.metric_history if s.step < obs.step),
               MetricSample(obs.step, obs.at, obs.attempt, values))
    if len(samples) > METRIC_SAMPLES_LIMIT:
        samples = (*samples[:-1][::2], samples[-1])
    return replace(run, metric_history=samples)


# ---------------------------------------------------------------- sweeps: a trial's curve

CURVE_LIMIT = 200


def _sweep_curve(run: Run, obs: TrainerReported, ctx: Context) -> Run:
    """A trial keeps its sweep metric by step; a resumed attempt rewrites the steps it repeats."""
    spec = ctx.pipeline.sweep
    if run.sweep_id is None or spec is None or obs.step is None:
        return run
    value = obs.metrics.get(spec.quality)
    if value is None or not math.isfinite(value):
        return run
    kept = tuple(p for p in run.curve if p.step < obs.step)
    return replace(run, curve=(*kept, MetricPoint(obs.step, float(value)))[-CURVE_LIMIT:])


def _newer_checkpoint(run: Run, ckpt: Checkpoint | None, *, looked_up: bool = False) -> Run:
    if ckpt is None or (run.latest_checkpoint and run.latest_checkpoint.step >= ckpt.step):
        return run
    trusted = run.health.trust_until_step
    if looked_up and trusted is not None and ckpt.step > trusted:
        return run  # possibly written while diverging, and not deleted yet
    return replace(run, latest_checkpoint=ckpt)


def _on_job_missing(run: Run, obs: Observation, ctx: Context) -> Run:
    assert isinstance(obs, JobMissing)
    attempt = run.attempt(obs.attempt)
    if attempt is None or attempt.job_name != obs.job_name or not attempt.live:
        return run
    since = attempt.missing_since if attempt.missing_since is not None else ctx.now
    attempt = replace(attempt, missing_polls=attempt.missing_polls + 1, missing_since=since)
    run = with_attempt(run, attempt)
    if attempt.missing_polls < LOST_AFTER_POLLS or ctx.now - since < LOST_AFTER_S:
        return run
    status = JobStatus(obs.job_name, JobPhase.FAILED, failure=FailureClass.LOST,
                       message=f"NOT_FOUND on {attempt.missing_polls} polls over "
                               f"{ctx.now - since:.0f}s")
    run = note(run, ctx, f"attempt {attempt.number} job lost", status.message)
    attempt = replace(attempt, state=AttemptState.FAILED)
    run = with_attempt(run, attempt)
    if run.status.terminal or attempt is not run.current:
        return run
    return _attempt_ended(run, ctx, attempt, status)


def _on_job(run: Run, obs: Observation, ctx: Context) -> Run:
    assert isinstance(obs, JobObserved)
    attempt = run.attempt(obs.attempt)
    if attempt is None:
        return run
    if attempt.job_name is not None and obs.status.job_name not in ("", attempt.job_name):
        return run  # news of another job (a forged or crossed message) says nothing of this one
    if not obs.confirmed:
        # Only Vertex's own answer moves an attempt: a line that says CANCELLING or FAILED of a
        # job Vertex runs would otherwise hold the attempt there (a later RUNNING is "older").
        return run
    state = PHASE_TO_STATE[obs.status.phase]
    run = _newer_checkpoint(run, obs.checkpoint, looked_up=True)
    if attempt.job_name is None:
        attempt = replace(attempt, job_name=obs.status.job_name)
    if attempt.missing_polls:
        attempt = replace(attempt, missing_polls=0, missing_since=None)  # Vertex knows it again
    if state.rank <= attempt.state.rank or attempt.state.ended:
        return with_attempt(run, attempt)  # late or repeated news never moves an attempt back
    attempt = replace(attempt, state=state)
    if state in (AttemptState.QUEUED, AttemptState.PENDING):
        attempt = replace(attempt, queued_since=attempt.queued_since or ctx.now)
    if state is AttemptState.RUNNING:
        attempt = replace(attempt, started_at=attempt.started_at or obs.status.start_time or ctx.now)
    run = with_attempt(run, attempt)
    if run.status.terminal:
        return run
    if attempt is not run.current:
        if state is AttemptState.RUNNING or state is AttemptState.QUEUED:
            return cancel_attempt(run, ctx, attempt, CANCEL_ORPHAN)
        return run
    if state is AttemptState.RUNNING and run.status is RunStatus.STARTING:
        return move_to(run, RunStatus.RUNNING, ctx, f"attempt {attempt.number} running")
    if state.ended:
        return _attempt_ended(run, ctx, attempt, obs.status, obs.error_tail)
    return run


def _end_attempt(attempt: Attempt, ctx: Context, status: JobStatus, reason: str,
                 failure: FailureClass | None, error_tail: tuple[str, ...] = ()) -> Attempt:
    return replace(attempt, ended_at=status.end_time or ctx.now, end_reason=reason,
                   failure=failure, exit_code=status.exit_code,
                   error_tail=bounded_tail(error_tail))


def _attempt_ended(run: Run, ctx: Context, attempt: Attempt, status: JobStatus,
                   error_tail: tuple[str, ...] = ()) -> Run:
    if attempt.state is AttemptState.SUCCEEDED:
        final = attempt.reported_done_step
        if final is not None and final > run.progress.step:  # Vertex confirms the trainer's end
            run = replace(run, progress=replace(run.progress, step=final))
        attempt = _end_attempt(attempt, ctx, status, "succeeded", None)
        run = _announce_end(with_attempt(run, attempt), ctx, attempt)
        done = replace(run, status=RunStatus.SUCCEEDED)  # the ledger of the run as it ends
        cost = cost_of(done, ctx)
        # cost_estimate (schema v1) is the ledger's total: one figure wherever a cost is stated
        succeeded = {"attempts": len(run.attempts), "preemptions": run.counters.preemptions,
                     "cost_estimate": cost["total"], "model_uri": run.output_uri, "cost": cost,
                     "provenance": prov.event_form(run.provenance)}
        if ctx.pipeline.model is not None and run.sweep_id is None:
            return _register_model(run, ctx, attempt, succeeded)
        run = move_to(run, RunStatus.SUCCEEDED, ctx, f"attempt {attempt.number} succeeded")
        return publish(run, ctx, "run.succeeded", status=str(run.status), **succeeded)
    failure = failure_of(attempt, status, ctx)
    reason = END_REASONS[failure](attempt, status)
    attempt = _end_attempt(attempt, ctx, status, reason, failure, error_tail)
    run = with_attempt(run, attempt)
    run = _announce_end(run, ctx, attempt)
    if failure is FailureClass.CANCELLED:
        if run.status is RunStatus.CANCELLING and run.stop_status is not None:
            return fail(run, ctx, run.stop_status, run.end_reason or "stopped",
                         STOP_FAILURES.get(run.stop_status))
        if run.status is RunStatus.CANCELLING or attempt.cancel_reason is None:
            why = run.end_reason if run.status is RunStatus.CANCELLING else \
                "the job was cancelled outside spotorch"
            run = move_to(run, RunStatus.CANCELLED, ctx, why or "cancelled")
            return publish(run, ctx, "run.cancelled", status=str(run.status),
                            reason=run.end_reason, cost=cost_of(run, ctx))
        if attempt.cancel_reason == CANCEL_SWITCH:
            return launch(run, ctx, run.next_capacity or Capacity.STANDARD,
                           run.next_reason or "capacity switch")
    return recover(run, ctx, attempt, failure)


def _announce_end(run: Run, ctx: Context, attempt: Attempt) -> Run:
    run = note(run, ctx, f"attempt {attempt.number} ended", attempt.end_reason or "")
    if attempt.failure is FailureClass.PREEMPTED:
        return publish(run, ctx, "attempt.preempted", attempt=attempt.number,
                        capacity=str(attempt.capacity), job_name=attempt.job_name,
                        progress_step=attempt.progress_step,
                        preemptions=run.counters.preemptions + 1)
    return publish(run, ctx, "attempt.ended", attempt=attempt.number,
                    capacity=str(attempt.capacity), job_name=attempt.job_name,
                    state=str(attempt.state), end_reason=attempt.end_reason,
                    failure_class=str(attempt.failure) if attempt.failure else None,
                    exit_code=attempt.exit_code, error=error_line(attempt.error_tail),
                    error_tail=list(attempt.error_tail))


def _on_cancel(run: Run, obs: Observation, ctx: Context) -> Run:
    assert isinstance(obs, CancelRequested)
    if run.status is RunStatus.REGISTERING:
        return run  # the model is trained: only its registration is left to finish
    if run.status is RunStatus.PREPROCESSING:
        return preprocessing.cancel(run, ctx, obs.reason)
    return stop(run, ctx, obs.reason, None)


def _over_budget(run: Run, ctx: Context) -> Run | None:
    """Stop a run whose estimated cost passed the pipeline's budget; None when within it."""
    budget = ctx.pipeline.max_cost
    if budget is None or run.status not in (RunStatus.STARTING, RunStatus.RUNNING,
                                            RunStatus.RECOVERING):
        return None
    so_far = spent(run, ctx)
    if so_far <= budget:
        return None
    run = publish(run, ctx, "run.budget_exceeded", budget="cost", limit=budget,
                   used=round(so_far, 4))
    return stop(run, ctx, f"cost budget exhausted: {so_far:.2f} > {budget:.2f}",
                 RunStatus.FAILED_BUDGET)


def _on_promote(run: Run, obs: Observation, ctx: Context) -> Run:
    if run.status is not RunStatus.QUEUED:
        return run
    return preprocessing.begin(run, ctx, "the pipeline's previous run ended")


def _on_tick(run: Run, obs: Observation, ctx: Context) -> Run:
    if run.status is RunStatus.PROBING:
        return tick_hardware(run, ctx)
    stopped = _over_budget(run, ctx)
    if stopped is not None:
        return stopped
    current = run.current
    if run.status is RunStatus.RECOVERING:
        if run.next_action_at is not None and ctx.now >= run.next_action_at:
            return launch(run, ctx, run.next_capacity or Capacity.SPOT,
                           run.next_reason or "backoff elapsed")
        return run
    if current is None or not current.live or current.cancel_reason is not None:
        return run
    run = tick_health(run, ctx, current)
    current = run.current
    if current is None or current.cancel_reason is not None:
        return run
    waiting = current.state in (AttemptState.QUEUED, AttemptState.PENDING)
    queued_for = ctx.now - (current.queued_since or current.created_at)
    if waiting and queued_for > ctx.recovery.stockout_wait_s \
            and current.capacity is not Capacity.FLEX_START:
        run = note(run, ctx, f"attempt {current.number} queued {queued_for:.0f}s",
                    "stockout: cancelling to try elsewhere")
        return cancel_attempt(run, ctx, current, CANCEL_STOCKOUT)
    if run.status not in (RunStatus.STARTING, RunStatus.RUNNING) or \
            current.capacity is Capacity.FLEX_START:
        return run
    if current.capacity is Capacity.STANDARD and probing(ctx) and (
            run.live_probe is not None or probe_judged(run, ctx)):
        return tick_probe(run, ctx, current)  # on standard, Spot is seen only through probes
    spot_waiting = current.capacity is Capacity.SPOT and waiting and queued_for > 60.0
    cooling = spot_cooling(ctx.now, run.spot_unavailable_until)
    view = policy_view(run, ctx, current=current.capacity,
                       spot_available=not (spot_waiting or cooling))
    wanted = choose_capacity(view, ctx.recovery)
    if spot_waiting and wanted is Capacity.STANDARD and hop_elsewhere(run, ctx, current, view):
        run = note(run, ctx, f"attempt {current.number} queued {queued_for:.0f}s",
                   "stockout: Spot is likely in another region (core.region_moves)")
        return cancel_attempt(run, ctx, current, CANCEL_STOCKOUT)
    run = deadline_warning(run, ctx, wanted, current)
    if wanted == current.capacity or (wanted is Capacity.SPOT and cooling):
        return run  # back to Spot only once it may have capacity again
    if not may_switch(view, wanted):
        return run  # within the minimum dwell of the last move (policy.may_switch)
    reason = (f"deadline policy: switch {current.capacity} -> {wanted} "
              f"(time left {fmt_s((run.deadline_at or ctx.now) - ctx.now)})")
    if spot_waiting:  # giving up on a Spot queue is evidence too: don't come straight back
        run = replace(run, spot_unavailable_until=spot_cooldown_until(
            ctx.now, ctx.recovery.spot_cooldown_s))
    run = replace(run, next_capacity=wanted, next_reason=reason)
    run = note(run, ctx, f"switch to {wanted}", reason)
    return cancel_attempt(run, ctx, current, CANCEL_SWITCH)


_HANDLERS: Mapping[type, Callable[[Run, Observation, Context], Run]] = {
    IntentDone: _on_intent_done,
    IntentDeferred: on_intent_deferred,
    ModelRegistered: _on_model_registered,
    LaunchDone: on_launch_done,
    LaunchFailed: on_launch_refused,
    TrainerReported: _on_trainer,
    JobObserved: _on_job,
    JobMissing: _on_job_missing,
    Tick: _on_tick,
    Promote: _on_promote,
    CancelRequested: _on_cancel,
    CheckpointsDeleted: on_checkpoints_deleted,
    ProbeLaunched: on_probe_launched,
    ProbeLaunchFailed: on_probe_launch_failed,
    ProbeObserved: on_probe,
    ProbeMissing: on_probe_missing,
    PreprocessCacheChecked: preprocessing.on_cache_checked,
    PreprocessObserved: preprocessing.on_job_observed,
}
