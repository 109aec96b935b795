"""The unit of work: load a run, decide, save it in one conditional write, carry out its intents."""

from __future__ import annotations

import contextlib
import logging
import random
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any, assert_never

from spotorch.app import hardware_probes as probes
from spotorch.app import preprocess_steps, promotions, releases, run_log
from spotorch.app.deps import Deps, JobOwner, ObservationSource, context, job_id_of
from spotorch.app.launch_specs import hardware_probe_spec, launch_spec, probe_spec, stage_packages
from spotorch.app.spot_record import seen_between, shape_key
from spotorch.core import hardware, provenance
from spotorch.core import health as hp
from spotorch.core.context import Context
from spotorch.core.decide import decide
from spotorch.core.intents import (
    CancelIntent,
    DeleteCheckpointsIntent,
    Intent,
    LaunchIntent,
    LaunchProbeIntent,
    PreprocessIntent,
    PublishIntent,
    RegisterModelIntent,
)
from spotorch.core.model import PROBE_HARDWARE, Run, RunStatus
from spotorch.core.moves import claim, claimable, remember, spent
from spotorch.core.observations import (
    CheckpointsDeleted,
    IntentDeferred,
    IntentDone,
    LaunchDone,
    LaunchFailed,
    ModelRegistered,
    Observation,
    ProbeLaunched,
    ProbeLaunchFailed,
    Promote,
)
from spotorch.core.pipeline import OnActiveRun
from spotorch.ports.jobs import LaunchError
from spotorch.ports.registry import (
    LABEL_MODEL_PIPELINE,
    LABEL_MODEL_RUN,
    LABEL_MODEL_SNAPSHOT,
    ExperimentRun,
    ModelUpload,
    RegistryError,
)
from spotorch.ports.store import AddTo, ConflictError
from spotorch.settings import COLLECTION_JOBS, JOB_RECORD_GRACE_S, TTL_FIELD

MAX_MODEL_LABELS = 64  # Vertex AI: at most 64 labels on a resource

log = logging.getLogger("spotorch.service")

MAX_CONFLICT_RETRIES = 8
CARRY_OUT_ROUNDS = 4
LEASE_MARGIN_S = 60.0  # never start a launch with less of its claim left than this


# ---------------------------------------------------------------- the unit of work

def apply(deps: Deps, run_id: str, observations: ObservationSource, *,
          event_id: str | None = None, take_over: bool = False) -> Run | None:
    """Feed observations to a run in one conditional write, then carry out what was decided."""
    for attempt in range(MAX_CONFLICT_RETRIES):
        run, version = deps.runs.load(run_id)
        if run is None:
            return None
        if event_id and event_id in run.seen:
            return run  # a redelivery: already handled, nothing to write
        now = deps.clock.now()
        ctx = context(deps, run, now)
        new = run
        for obs in observations(run) if callable(observations) else observations:
            new = decide(new, obs, ctx)
        if new == run and not take_over:
            return run  # changes nothing (a duplicate under another id): no write at all
        new = remember(new, event_id)
        taken = claimable(new, now) if take_over else ()
        new = claim(new, taken, now) if taken else new
        mine = _fresh(run, new) + tuple(i.id for i in taken)
        if new == run:
            return run
        try:
            # What the change taught about Spot goes to the shared record in the same commit:
            # counted once however often the event comes, and no round trip of its own.
            version = deps.runs.save(new, version, _spot_additions(deps, run, new, now))
        except ConflictError:
            time.sleep(random.uniform(0.0, 0.02 * (attempt + 1)))  # spread racing writers out
            continue
        _remember_measurements(deps, run, new, now)
        run_log.attempts_changed(run, new)
        return carry_out(deps, new, version, mine, was_active=run.active)
    raise ConflictError(f"run {run_id}: too much contention, giving up for redelivery")


def _spot_additions(deps: Deps, old: Run, new: Run, now: float) -> list[AddTo]:
    """The shared record's writes for what this change taught about Spot (ended Spot
    attempts, probe answers); none if they cannot be made (the record is advice: it never
    holds up the run's own write)."""
    try:
        seen = seen_between(old, new, now)
        if not seen:
            return []
        return deps.spot.additions(shape_key(deps.pipeline(new.pipeline), new), seen, now,
                                   shard=new.bucket)
    except Exception as exc:
        log.warning("spot record of run %s not updated: %s", new.run_id, exc,
                    extra={"run_id": new.run_id})
        return []


def _remember_measurements(deps: Deps, old: Run, new: Run, now: float) -> None:
    """New hardware measurements to the pipeline's probe cache (nightly runs reuse them)."""
    measured = {name: hardware.ProbeResult.from_doc(doc)
                for name, doc in new.hardware_results.items()
                if name not in old.hardware_results and
                any(p.candidate == name and p.kind == PROBE_HARDWARE for p in new.probes)}
    if measured:
        try:
            probes.save_cache(deps.docs, new.pipeline, measured, now)
        except Exception as exc:  # the run has its results; the next run probes again
            log.warning("probe cache of %s not saved: %s", new.pipeline, exc)


def _fresh(old: Run, new: Run) -> tuple[str, ...]:
    known = {i.id for i in old.outbox}
    return tuple(i.id for i in new.outbox if i.id not in known)


def carry_out(deps: Deps, run: Run, version: Any, mine: Sequence[str], *,
               was_active: bool = True) -> Run:
    """Perform the intents this invocation owns; record their results in one more write."""
    pending = set(mine)
    results: list[Observation] = []
    ctx = context(deps, run, deps.clock.now())
    after = run
    for _ in range(CARRY_OUT_ROUNDS):
        todo = [i for i in after.outbox if i.id in pending]
        if not todo:
            break
        before = after
        for intent in todo:
            pending.discard(intent.id)
            result = _perform(deps, after, intent)
            if result is not None:
                results.append(result)
                after = decide(after, result, ctx)
        pending.update(_fresh(before, after))  # e.g. attempt.launched after a launch
    if after != run:
        try:
            deps.runs.save(after, version)
        except ConflictError:
            # Someone changed the run meanwhile: apply our results to the fresh copy instead.
            after = apply(deps, run.run_id, results) or after
        else:
            run_log.attempts_changed(run, after)
    if was_active and not after.active and \
            deps.pipeline(after.pipeline).trigger.on_active_run is OnActiveRun.QUEUE:
        promote_next(deps, after.pipeline)  # the oldest queued run of the pipeline may start
    if was_active and not after.active:
        _run_ended(deps, after)
    return after


def _run_ended(deps: Deps, run: Run) -> None:
    """Tell those who follow ended runs (Deps.on_run_ended); a failure is theirs to repair."""
    try:
        run_log.run_ended(deps, run)
    except Exception as exc:  # a line for Cloud Monitoring must never hold up the run
        log.warning("run %s: its end was not logged: %s", run.run_id, exc,
                    extra={"run_id": run.run_id})
    for follower in deps.on_run_ended:
        try:
            follower(deps, run)
        except Exception as exc:
            log.warning("%s not told that run %s ended yet: %s", getattr(follower, "__name__", "?"),
                        run.run_id, exc, extra={"run_id": run.run_id})


def _perform(deps: Deps, run: Run, intent: Intent) -> Observation | None:
    try:
        match intent:
            case PublishIntent():
                deps.publisher.publish(intent.event)
                return IntentDone(intent.id)
            case CancelIntent():
                deps.launcher.cancel(intent.job_name)
                return IntentDone(intent.id)
            case LaunchIntent():
                return _perform_launch(deps, run, intent)
            case RegisterModelIntent():
                return _register_model(deps, run, intent)
            case DeleteCheckpointsIntent():
                return _perform_delete(deps, intent)
            case LaunchProbeIntent():
                return _perform_probe_launch(deps, run, intent)
            case PreprocessIntent():
                return preprocess_steps.perform(deps, run, intent)
            case _:
                assert_never(intent)
    except Exception as exc:  # a failed side effect stays in the outbox; the next tick retries it
        log.warning("intent %s (%s) of run %s failed: %s", intent.id, intent.kind, run.run_id, exc,
                    extra={"run_id": run.run_id})
        return IntentDeferred(intent.id, f"{type(exc).__name__}: {str(exc)[:300]}",
                              getattr(exc, "code", None) or "")


def _perform_delete(deps: Deps, intent: DeleteCheckpointsIntent) -> Observation:
    """List the run's checkpoints, delete what the intent's rule dooms; report steps and bytes.

    The listing is taken now, so a checkpoint completed after the decision is seen (and kept:
    only steps older than the newest kept one go); incomplete ones are never deleted.
    """
    listed = {c.step: c for c in deps.checkpoints.list(intent.root)}
    pairs = [(c.step, c.complete) for c in listed.values()]
    doomed = (hp.diverged_steps(pairs, intent.above) if intent.above is not None
              else hp.retention_doomed(pairs, intent.keep_newest, intent.keep))
    reclaimed = 0
    for step in doomed:
        reclaimed += deps.checkpoints.delete(listed[step].uri)
    if doomed:
        log.info("deleted %d checkpoint(s) under %s (%d bytes)", len(doomed), intent.root,
                 reclaimed)
    return CheckpointsDeleted(intent.id, tuple(doomed), reclaimed)


def _perform_launch(deps: Deps, run: Run, intent: LaunchIntent) -> Observation | None:
    if deps.clock.now() > intent.claimed_until - LEASE_MARGIN_S:
        return None  # our claim is nearly over: let the tick re-claim it rather than race it
    if any(isinstance(i, DeleteCheckpointsIntent) and i.above is not None for i in run.outbox):
        return None  # diverged checkpoints first: the new attempt must not find them
    waits = _earlier_job_alive(deps, run, intent.attempt)
    if waits is not None:
        return IntentDeferred(intent.id, *waits)  # the next tick tries again, its claim given up
    try:
        spec = launch_spec(deps, run, intent)
        stage_packages(deps, spec)  # the packages it runs, in the staging bucket first
        job_name = deps.launcher.launch(spec)
    except LaunchError as exc:
        return LaunchFailed(intent.id, intent.attempt, str(exc), exc.permanent, exc.code)
    record_job(deps, job_name, run.run_id, intent.attempt, run.pipeline)
    return LaunchDone(intent.id, intent.attempt, job_name)


def _perform_probe_launch(deps: Deps, run: Run, intent: LaunchProbeIntent) -> Observation | None:
    if deps.clock.now() > intent.claimed_until - LEASE_MARGIN_S:
        return None  # as a launch: let the tick re-claim it rather than race it
    probe = run.probe(intent.probe)
    if probe is None or probe.cancel_reason is not None or not probe.live:
        return ProbeLaunchFailed(intent.id, intent.probe, "no longer needed", permanent=True)
    try:
        spec = hardware_probe_spec(deps, run, probe) if probe.kind == PROBE_HARDWARE \
            else probe_spec(deps, run, intent)
        stage_packages(deps, spec)
        job_name = deps.launcher.launch(spec)
    except (LaunchError, ValueError) as exc:
        permanent = not isinstance(exc, LaunchError) or exc.permanent
        return ProbeLaunchFailed(intent.id, intent.probe, str(exc), permanent)
    record_job(deps, job_name, run.run_id, 0, run.pipeline, probe=intent.probe)
    return ProbeLaunched(intent.id, intent.probe, job_name)


def _register_model(deps: Deps, run: Run, intent: RegisterModelIntent) -> Observation | None:
    """UploadModel as a new version of the pipeline's model (idempotent: found by the run's
    label); a permanent refusal ends the run SUCCEEDED without a model name, saying why."""
    model = deps.pipeline(run.pipeline).model
    if model is None or deps.models is None:
        return ModelRegistered(intent.id, error="no model registry configured")
    pipeline = deps.pipeline(run.pipeline)
    labels = {**dict(model.labels), LABEL_MODEL_PIPELINE: run.pipeline,
              LABEL_MODEL_RUN: run.run_id, LABEL_MODEL_SNAPSHOT: run.snapshot_id or ""}
    found = provenance.labels(run.provenance or {})
    if len(labels) + len(found) <= MAX_MODEL_LABELS:  # Vertex refuses a 65th label
        labels.update(found)
    else:
        log.warning("run %s: the pipeline's model labels leave no room for provenance labels",
                    run.run_id, extra={"run_id": run.run_id})
    try:
        promotions.check_servable(deps, model.serving_image, intent.artifact_uri)  # issue 37
        name = deps.models.upload(ModelUpload(
            pipeline=run.pipeline, run_id=run.run_id,
            region=model.region or pipeline.job.regions[0],
            display_name=model.display_name or run.pipeline, artifact_uri=intent.artifact_uri,
            serving_image=model.serving_image, labels=labels, aliases=model.aliases))
    except RegistryError as exc:
        if not exc.permanent:
            raise  # stays in the outbox; the tick retries it
        return ModelRegistered(intent.id, error=str(exc))
    releases.after_registration(deps, run, name)  # model.promote: the gate (issue 37)
    if model.experiments and deps.experiments is not None:
        _log_experiment(deps, run, region=model.region or pipeline.job.regions[0])
    return ModelRegistered(intent.id, model_name=name)


def _log_experiment(deps: Deps, run: Run, *, region: str) -> None:
    """The run in its pipeline's Vertex AI Experiment: parameters, final metrics and cost
    (best effort: a failure is logged, the model is registered either way)."""
    assert deps.experiments is not None
    ctx = Context(deps.pipeline(run.pipeline), deps.clock.now(), prices=deps.prices)
    metrics = {**{k: float(v) for k, v in run.progress.metrics.items()},
               "cost": round(spent(run, ctx), 6),
               "preemptions": float(run.counters.preemptions), "step": float(run.progress.step)}
    try:
        deps.experiments.log_run(ExperimentRun(experiment=run.pipeline, run_id=run.run_id,
                                               region=region, params=dict(run.params),
                                               metrics=metrics,
                                               provenance=provenance.metadata(run.provenance)))
    except RegistryError as exc:
        log.warning("run %s not logged to Experiments: %s", run.run_id, exc,
                    extra={"run_id": run.run_id})


def _earlier_job_alive(deps: Deps, run: Run, attempt: int) -> tuple[str, str] | None:
    """One live job per run: why the launch must wait and the refusal's code (None: every
    earlier attempt's job is confirmed ended by Vertex itself).

    A job still alive (the attempt was ended by a message that lied, or a cancel has not landed)
    is cancelled now and the launch waits; NOT_FOUND means there is no job to fear.
    """
    waits: str | None = None
    for earlier in run.attempts[:attempt - 1]:
        if earlier.job_name is None:
            continue
        try:
            status = deps.launcher.get(earlier.job_name)
        except LaunchError as exc:
            if exc.code == "NOT_FOUND":
                continue
            log.warning("launch of %s attempt %d waits: cannot confirm %s ended: %s",
                        run.run_id, attempt, earlier.job_name, exc, extra={"run_id": run.run_id})
            return f"cannot confirm that {earlier.job_name} ended: {str(exc)[:200]}", exc.code or ""
        if not status.phase.terminal:
            log.warning("launch of %s attempt %d waits: %s is still %s; cancelling it",
                        run.run_id, attempt, earlier.job_name, status.phase,
                        extra={"run_id": run.run_id})
            with contextlib.suppress(LaunchError):
                deps.launcher.cancel(earlier.job_name)
            waits = f"{earlier.job_name} is still {status.phase}; cancelled"
    return None if waits is None else (waits, "")


def record_job(deps: Deps, job_name: str, run_id: str, attempt: int, pipeline: str, *,
               probe: int = 0) -> None:
    """Remember which run and attempt (or probe) a job belongs to (log-sink entries name only
    the job)."""
    now = deps.clock.now()
    known = deps.pipelines.get(pipeline)  # gone from the deployment: a week, Vertex's default
    timeout_s = known.job.timeout_s if known is not None else 7 * 24 * 3600.0
    doc: dict[str, Any] = {
        "job_name": job_name, "run_id": run_id, "attempt": attempt, "pipeline": pipeline,
        "recorded_at": now,
        TTL_FIELD: datetime.fromtimestamp(now + timeout_s + JOB_RECORD_GRACE_S, UTC)}
    if probe:
        doc["probe"] = probe
    try:
        deps.docs.put(COLLECTION_JOBS, job_id_of(job_name), doc, None)
    except ConflictError:
        pass  # recorded by an earlier try (adopted job): the same facts
    except Exception as exc:  # the tick's polling still follows the job; its lines go unattributed
        log.warning("could not record job %s of %s: %s", job_name, run_id, exc,
                    extra={"run_id": run_id})
    else:
        deps.owners.remember(job_id_of(job_name), JobOwner(job_name, run_id, attempt, probe))


def promote_next(deps: Deps, pipeline_name: str) -> Run | None:
    """Start the oldest queued run of a pipeline when none of its runs is under way."""
    active = deps.runs.active_for_pipeline(pipeline_name)
    if any(r.status is not RunStatus.QUEUED for r in active):
        return None
    queued = [r for r in active if r.status is RunStatus.QUEUED]
    return apply(deps, queued[0].run_id, [Promote()]) if queued else None
