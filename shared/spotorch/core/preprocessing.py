"""What happens to a run with a preprocess step (issue 31): PREPROCESSING, then training.

A run of a pipeline with `preprocess` starts PREPROCESSING: the shell identifies its input and
looks the cache up (PreprocessIntent lookup -> PreprocessCacheChecked); a complete output is
reused, else the Dataflow job is launched (launch -> PreprocessObserved) and followed by GetJob
(the tick's poll, and statusChanged events checked against it). JOB_STATE_DONE marks the output
complete and starts the training on it; a failure relaunches within its class's budget or ends
the run with the job's error text. The step's state machine itself is spotorch.core.preprocess.
"""

from __future__ import annotations

from dataclasses import replace

from spotorch.core import preprocess as pp
from spotorch.core.context import Context
from spotorch.core.cost import preprocess_cost
from spotorch.core.intents import (
    PREPROCESS_CANCEL,
    PREPROCESS_LAUNCH,
    PREPROCESS_LOOKUP,
    PREPROCESS_MARK,
    PreprocessIntent,
)
from spotorch.core.launching import first_launch
from spotorch.core.model import Run, RunStatus
from spotorch.core.moves import (
    LAUNCH_LEASE_S,
    add_intent,
    cost_of,
    drop_intent,
    fail,
    move_to,
    next_intent_id,
    note,
    publish,
)
from spotorch.core.observations import Observation, PreprocessCacheChecked, PreprocessObserved
from spotorch.core.probes import probe_hardware


def step_of(run: Run) -> pp.PreprocessStep | None:
    """The run's preprocess step, None for a run without one."""
    return pp.PreprocessStep.from_doc(run.preprocess) if run.preprocess else None


def begin(run: Run, ctx: Context, reason: str) -> Run:
    """Start a run that may go: the preprocess step first if the pipeline has one and its
    output is not complete yet, else the training (hardware probes or the first attempt)."""
    step = step_of(run)
    if ctx.pipeline.preprocess is not None and (step is None or step.phase is not
                                                pp.StepPhase.DONE):
        return _start(run, ctx, reason)
    return _train(run, ctx, reason)


def _train(run: Run, ctx: Context, reason: str) -> Run:
    if run.hardware is None and ctx.pipeline.hardware is not None:
        return probe_hardware(run, ctx, ctx.hardware_cache or {})
    return first_launch(run, ctx, reason)


def _intent(run: Run, ctx: Context, action: str, job_name: str = "") -> Run:
    run, intent_id = next_intent_id(run)
    return add_intent(run, PreprocessIntent(intent_id, action, job_name,
                                            claimed_until=ctx.now + LAUNCH_LEASE_S))


def _start(run: Run, ctx: Context, reason: str) -> Run:
    assert ctx.pipeline.preprocess is not None
    step = pp.new_step(pp.step_pipeline(ctx.pipeline, run),
                       pp.input_identity(run.snapshot_id, run.data_uri, None))
    run = replace(run, preprocess=step.to_doc())
    run = move_to(run, RunStatus.PREPROCESSING, ctx, reason or "preprocess step first")
    return _intent(run, ctx, PREPROCESS_LOOKUP)


def on_cache_checked(run: Run, obs: Observation, ctx: Context) -> Run:
    """The input identified and the cache looked up: reuse the output, or launch the job."""
    assert isinstance(obs, PreprocessCacheChecked)
    run = drop_intent(run, obs.intent_id)
    step = step_of(run)
    if step is None or ctx.pipeline.preprocess is None or run.status is not \
            RunStatus.PREPROCESSING or step.phase is not pp.StepPhase.WAITING:
        return run  # a duplicate answer, or the run moved on (cancelled)
    pipeline = pp.step_pipeline(ctx.pipeline, run)
    keyed = replace(pp.new_step(pipeline, obs.input_id), phase=step.phase)
    return _apply(run, ctx, pp.on_cache(keyed, obs.complete and pp.cacheable(pipeline),
                                        run.run_id, ctx.now))


def on_job_observed(run: Run, obs: Observation, ctx: Context) -> Run:
    """The step's job as GetJob answered: follow it, relaunch it, or end the step."""
    assert isinstance(obs, PreprocessObserved)
    if obs.intent_id:
        run = drop_intent(run, obs.intent_id)
    step = step_of(run)
    spec = ctx.pipeline.preprocess
    if step is None or spec is None:
        return run
    return _apply(run, ctx, pp.on_job(step, spec, obs.job, ctx.now, run.run_id))


def cancel(run: Run, ctx: Context, reason: str) -> Run:
    """Cancel a PREPROCESSING run: its live job is cancelled first (CANCELLING until it ends)."""
    step = step_of(run)
    decision = pp.on_run_cancelled(step, ctx.now) if step is not None else None
    if decision is None or decision.action is not pp.StepAction.CANCEL:
        run = move_to(run, RunStatus.CANCELLED, ctx, reason)
        return publish(run, ctx, "run.cancelled", status=str(run.status), reason=reason,
                       cost=cost_of(run, ctx))
    run = replace(run, preprocess=decision.step.to_doc(), end_reason=reason)
    run = move_to(run, RunStatus.CANCELLING, ctx, reason)
    return _intent(run, ctx, PREPROCESS_CANCEL, decision.step.job_name or "")


def _ended_event(run: Run, ctx: Context, step: pp.PreprocessStep) -> Run:
    return publish(run, ctx, "run.preprocess_ended", state=step.state, phase=str(step.phase),
                   cache_hit=step.cache_hit, job_name=step.job_name, job_id=step.job_id,
                   output_uri=step.output_uri, cache_key=step.cache_key,
                   failure_class=str(step.failure) if step.failure else None, error=step.error,
                   cost=round(preprocess_cost(step.to_doc(), ctx.prices), 4))


def _what(step: pp.PreprocessStep) -> str:
    return "Dataproc batch" if step.kind == "spark" else "Dataflow job"


def _apply(run: Run, ctx: Context, decision: pp.StepDecision) -> Run:
    step = decision.step
    run = replace(run, preprocess=step.to_doc())
    match decision.action:
        case pp.StepAction.NONE:
            return run
        case pp.StepAction.LAUNCH:
            run = note(run, ctx, f"preprocess: launch {_what(step)} {step.job_name}",
                       f"launch {step.launches}; output {step.output_uri}")
            run = publish(run, ctx, "run.preprocess_started", job_name=step.job_name,
                          launch=step.launches, region=step.region, cache_key=step.cache_key,
                          output_uri=step.output_uri, previous_error=step.error)
            return _intent(run, ctx, PREPROCESS_LAUNCH, step.job_name or "")
        case pp.StepAction.CANCEL:
            run = note(run, ctx, f"preprocess: cancel {_what(step)} {step.job_name}",
                       decision.reason)
            return _intent(run, ctx, PREPROCESS_CANCEL, step.job_name or "")
        case pp.StepAction.TRAIN:
            run = note(run, ctx, "preprocess: output complete", decision.reason)
            run = _ended_event(run, ctx, step)
            if not step.cache_hit:
                run = _intent(run, ctx, PREPROCESS_MARK, step.job_name or "")
            if run.status is not RunStatus.PREPROCESSING:
                return run  # cancelled meanwhile: the output stays for the next run
            return _train(run, ctx, f"preprocess output {step.output_uri}")
        case pp.StepAction.FAIL:
            run = note(run, ctx, "preprocess: ended without output", decision.reason)
            run = _ended_event(run, ctx, step)
            if run.status is RunStatus.CANCELLING or decision.run_status is RunStatus.CANCELLED:
                reason = run.end_reason or decision.reason
                run = move_to(run, RunStatus.CANCELLED, ctx, reason)
                return publish(run, ctx, "run.cancelled", status=str(run.status), reason=reason,
                               cost=cost_of(run, ctx))
            status = decision.run_status or RunStatus.FAILED_INFRA
            return fail(run, ctx, status, decision.reason, step.failure)
    return run
