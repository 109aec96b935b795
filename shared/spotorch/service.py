"""The service layer: load a run, decide, save it in one conditional write, then carry out its intents."""

from __future__ import annotations

import contextlib
import json
import logging
import random
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, assert_never

from spotorch import domain, hardware, probes, shapes
from spotorch import health as hp
from spotorch.domain import (
    CancelIntent,
    CancelRequested,
    Checkpoint,
    CheckpointsDeleted,
    Context,
    DeleteCheckpointsIntent,
    FailureClass,
    Intent,
    IntentDone,
    JobMissing,
    JobObserved,
    JobPhase,
    JobStatus,
    LaunchDone,
    LaunchFailed,
    LaunchIntent,
    LaunchProbeIntent,
    ModelRegistered,
    Observation,
    ProbeLaunched,
    ProbeLaunchFailed,
    ProbeMissing,
    ProbeObserved,
    Promote,
    PublishIntent,
    RegisterModelIntent,
    Run,
    RunStatus,
    Tick,
    TrainerReported,
)
from spotorch.errors import InvalidEvent, SpotorchError
from spotorch.hardware import PROBE_CANDIDATE_LABEL
from spotorch.logs import shorten
from spotorch.pipeline import Capacity, HardwareCandidate, JobTemplate, OnActiveRun, Pipeline
from spotorch.ports import (
    LABEL_ATTEMPT,
    LABEL_BUCKET,
    LABEL_PIPELINE,
    LABEL_PROBE,
    LABEL_RUN,
    AddTo,
    CheckpointStore,
    Clock,
    ConflictError,
    DocumentStore,
    EventPublisher,
    JobLauncher,
    LaunchError,
    LaunchSpec,
    ObjectStore,
    RunStore,
    ShardDispatcher,
    label_value,
)
from spotorch.registry import (
    LABEL_MODEL_PIPELINE,
    LABEL_MODEL_RUN,
    LABEL_MODEL_SNAPSHOT,
    ExperimentRun,
    ExperimentTracker,
    ModelRegistry,
    ModelUpload,
    RegistryError,
)
from spotorch.settings import COLLECTION_JOBS, COLLECTION_LISTINGS, COLLECTION_REJECTED
from spotorch.spot_record import SpotRecord, seen_between, shape_key, shape_of
from spotorch.triggers import ObjectEvent, ObjectEventKind
from spotorch_trainer import contract

if TYPE_CHECKING:
    from spotorch.intake import SnapshotReady

log = logging.getLogger("spotorch.service")

MAX_CONFLICT_RETRIES = 8
CARRY_OUT_ROUNDS = 4
LEASE_MARGIN_S = 60.0  # never start a launch with less of its claim left than this


class UnknownRun(SpotorchError):
    """No run has this id."""


class UnknownPipeline(SpotorchError):
    """No pipeline has this name."""


class NotRetryable(SpotorchError):
    """Only a run that ended without success can be retried."""


class UnknownAttempt(SpotorchError):
    """The run has no attempt with this number."""


class NotOurJob(SpotorchError):
    """A job spotorch never created (or whose record is gone): acknowledged and recorded."""


class ImplausibleReport(SpotorchError):
    """A trainer report that cannot be true of this run (progress past the end, too fast)."""


@dataclass
class Deps:
    """What the service layer talks to; adapters are real in production and fakes in unit tests."""

    runs: RunStore
    docs: DocumentStore
    launcher: JobLauncher
    checkpoints: CheckpointStore
    publisher: EventPublisher
    clock: Clock
    pipelines: Mapping[str, Pipeline]
    objects: ObjectStore  # the landing buckets: manifests, existence checks, listings
    events_topic: str = ""  # trainer events topic handed to jobs (projects/P/topics/T)
    shards: ShardDispatcher | None = None  # None: the tick reconciles every run itself
    models: ModelRegistry | None = None  # Vertex AI Model Registry (pipelines with `model`)
    experiments: ExperimentTracker | None = None  # Vertex AI Experiments (sweep trials)
    # Spot seen by every run, per region and shape: ranks regions for the next Spot attempt.
    spot: SpotRecord = field(default_factory=SpotRecord)
    owners: JobOwners = field(default_factory=lambda: JobOwners())  # the job records, cached

    def pipeline(self, name: str) -> Pipeline:
        try:
            return self.pipelines[name]
        except KeyError:
            raise UnknownPipeline(f"no pipeline named {name!r}") from None


ObservationSource = Sequence[Observation] | Callable[[Run], Sequence[Observation]]


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
            new = domain.decide(new, obs, ctx)
        if new == run and not take_over:
            return run  # changes nothing (a duplicate under another id): no write at all
        new = domain.remember(new, event_id)
        taken = domain.claimable(new, now) if take_over else ()
        new = domain.claim(new, taken, now) if taken else new
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
        return _carry_out(deps, new, version, mine, was_active=run.active)
    raise ConflictError(f"run {run_id}: too much contention, giving up for redelivery")


def context(deps: Deps, run: Run, now: float) -> Context:
    """What a decision about this run needs: its pipeline, the time, and (for a pipeline with
    several regions) the regions ranked by the shared record of Spot for the run's shape."""
    pipeline = deps.pipeline(run.pipeline)
    ctx = Context(pipeline, now, region_order=region_order(deps, pipeline,
                                                           shape_key(pipeline, run), now))
    if pipeline.hardware is None or run.hardware is not None or \
            run.status not in (RunStatus.QUEUED, RunStatus.PROBING):
        return ctx
    cache = _probe_cache(deps, pipeline) if run.status is RunStatus.QUEUED else None
    return replace(ctx, outlook=hardware_outlook(deps, pipeline, now), hardware_cache=cache)


def _probe_cache(deps: Deps, pipeline: Pipeline) -> dict[str, hardware.ProbeResult] | None:
    try:
        return probes.load_cache(deps.docs, pipeline.name)
    except Exception as exc:  # None: the run starts on the pipeline's own worker pools
        log.warning("probe cache of %s unreadable: %s", pipeline.name, exc)
        return None


def hardware_outlook(deps: Deps, pipeline: Pipeline, now: float) -> hardware.Outlook | None:
    """Expected preemptions per hour of each candidate's shape, from the shared Spot record
    (every run's Spot attempts in the pipeline's regions); None when nothing was observed."""
    search = pipeline.hardware
    if search is None:
        return None
    rates: dict[str, float] = {}
    try:
        for candidate in search.candidates:
            shape = shape_of(shapes.on_candidate(pipeline, candidate), None)
            records = deps.spot.records(deps.docs, shape, pipeline.job.regions, now)
            available_h = sum(r.available_s for r in records) / 3600.0
            if available_h > 0:
                rates[candidate.name] = sum(r.preemptions for r in records) / available_h
    except Exception as exc:
        log.warning("no Spot history for %s's candidates: %s", pipeline.name, exc)
        return None
    overhead = pipeline.recovery.restart_overhead_s
    return hardware.Outlook(rates, rework_s_per_preemption=overhead) if rates else None


def region_order(deps: Deps, pipeline: Pipeline, shape: str, now: float) -> tuple[str, ...] | None:
    """The pipeline's regions best first for this shape; None: one region, or no record."""
    if len(pipeline.job.regions) < 2:
        return None
    try:
        return deps.spot.order(deps.docs, shape, pipeline.job.regions, now)
    except Exception as exc:  # advice only: the fixed order still works
        log.warning("spot record unreadable, regions in the pipeline's order: %s", exc)
        return None


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
                any(p.candidate == name and p.kind == domain.PROBE_HARDWARE for p in new.probes)}
    if measured:
        try:
            probes.save_cache(deps.docs, new.pipeline, measured, now)
        except Exception as exc:  # the run has its results; the next run probes again
            log.warning("probe cache of %s not saved: %s", new.pipeline, exc)


def _fresh(old: Run, new: Run) -> tuple[str, ...]:
    known = {i.id for i in old.outbox}
    return tuple(i.id for i in new.outbox if i.id not in known)


def _carry_out(deps: Deps, run: Run, version: Any, mine: Sequence[str], *,
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
                after = domain.decide(after, result, ctx)
        pending.update(_fresh(before, after))  # e.g. attempt.launched after a launch
    if after != run:
        try:
            deps.runs.save(after, version)
        except ConflictError:
            # Someone changed the run meanwhile: apply our results to the fresh copy instead.
            after = apply(deps, run.run_id, results) or after
    if was_active and not after.active and \
            deps.pipeline(after.pipeline).trigger.on_active_run is OnActiveRun.QUEUE:
        promote_next(deps, after.pipeline)  # the oldest queued run of the pipeline may start
    if was_active and not after.active and after.sweep_id:
        _trial_ended(deps, after)
    return after


def _trial_ended(deps: Deps, run: Run) -> None:
    """Tell a trial's sweep at once; if this fails, the sweep's tick finds it."""
    from spotorch import sweep_service

    try:
        sweep_service.trial_ended(deps, run)
    except Exception as exc:
        log.warning("sweep %s not told of trial %s yet: %s", run.sweep_id, run.run_id, exc,
                    extra={"run_id": run.run_id})


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
            case _:
                assert_never(intent)
    except Exception as exc:  # a failed side effect stays in the outbox; the tick retries it
        log.warning("intent %s (%s) of run %s failed: %s", intent.id, intent.kind, run.run_id, exc,
                    extra={"run_id": run.run_id})
        return None


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
    if not _earlier_jobs_ended(deps, run, intent.attempt):
        return None  # the launch waits in the outbox; the tick tries again
    try:
        job_name = deps.launcher.launch(launch_spec(deps, run, intent))
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
        spec = hardware_probe_spec(deps, run, probe) if probe.kind == domain.PROBE_HARDWARE \
            else probe_spec(deps, run, intent)
        job_name = deps.launcher.launch(spec)
    except (LaunchError, ValueError) as exc:
        permanent = not isinstance(exc, LaunchError) or exc.permanent
        return ProbeLaunchFailed(intent.id, intent.probe, str(exc), permanent)
    record_job(deps, job_name, run.run_id, 0, run.pipeline, probe=intent.probe)
    return ProbeLaunched(intent.id, intent.probe, job_name)


def _probe_labels(run: Run, probe: int, kind: str) -> dict[str, str]:
    """A run's probe job: its run and bucket (the tick lists it), never an attempt number."""
    return {LABEL_RUN: run.run_id, LABEL_ATTEMPT: domain.probe_key(probe),
            LABEL_PIPELINE: run.pipeline, LABEL_BUCKET: str(run.bucket), LABEL_PROBE: kind}


def _probe_session(run: Run, pipeline: Pipeline, region: str) -> probes.ProbeSession:
    """Where a run's hardware probes write: {checkpoint_uri}/{run_id}-probes/{candidate}/."""
    return probes.ProbeSession(f"{run.run_id}-probes", pipeline.checkpoint_uri, run.data_uri,
                               region)


def _candidate(pipeline: Pipeline, name: str | None) -> HardwareCandidate | None:
    search = pipeline.hardware
    return next((c for c in (search.candidates if search else ()) if c.name == name), None)


def hardware_probe_spec(deps: Deps, run: Run, probe: domain.Probe) -> LaunchSpec:
    """A hardware candidate's probe: the training code on its shape for probe_steps steps."""
    pipeline = deps.pipeline(run.pipeline)
    candidate = _candidate(pipeline, probe.candidate)
    if candidate is None:
        raise ValueError(f"the pipeline no longer lists candidate {probe.candidate!r}")
    spec = probes.probe_spec(pipeline, _probe_session(run, pipeline, probe.region), candidate)
    return replace(spec, run_id=run.run_id, region=probe.region,
                   labels={**spec.labels, **_probe_labels(run, probe.number,
                                                          domain.PROBE_HARDWARE),
                           PROBE_CANDIDATE_LABEL: candidate.name},
                   display_name=f"spotorch-{run.run_id}-probe{probe.number}-"
                                f"{candidate.name}"[:128])


def _hardware_result(deps: Deps, run: Run, probe: domain.Probe,
                     status: JobStatus) -> dict[str, Any] | None:
    """An ended hardware probe's measurement, from its trainer's report (read now)."""
    pipeline = deps.pipeline(run.pipeline)
    search = pipeline.hardware
    candidate = _candidate(pipeline, probe.candidate)
    if probe.kind != domain.PROBE_HARDWARE or search is None or candidate is None or \
            not status.phase.terminal:
        return None
    root = probes.probe_root(_probe_session(run, pipeline, probe.region), candidate)
    try:
        raw = deps.checkpoints.read_report(f"{root}/checkpoints/{contract.PROBE_REPORT}",
                                           probes.MAX_REPORT_BYTES)
        report = json.loads(raw) if raw else None
    except (OSError, ValueError) as exc:
        log.warning("probe report of %s unreadable: %s", probe.candidate, exc,
                    extra={"run_id": run.run_id})
        report = None
    result = hardware.result_of(
        candidate.name, report if isinstance(report, Mapping) else None,
        succeeded=status.phase is JobPhase.SUCCEEDED, exit_code=status.exit_code,
        message=status.message or str(status.phase), now=deps.clock.now(),
        key=hardware.cache_key(pipeline, candidate, search.probe_steps),
        job_name=status.job_name)
    return result.to_doc()


def probe_spec(deps: Deps, run: Run, intent: LaunchProbeIntent) -> LaunchSpec:
    """A Spot capacity probe: the run's machine shape (every pool, every replica: capacity for
    one VM says little of eight) running the probe's command, which only has to start."""
    pipeline = deps.pipeline(run.pipeline)
    shaped = with_machine(_hardware_template(pipeline, run), run.health.machine_type)
    command = pipeline.recovery.spot_probes.command
    pools = tuple(replace(pool, command=command, args=(), env=()) for pool in shaped.worker_pools)
    # Cancelled once it runs or after its wait: the timeout only bounds a probe nobody cancels.
    timeout = pipeline.recovery.spot_probes.wait_s + 2 * pipeline.recovery.decision_interval_s
    template = replace(shaped, worker_pools=pools, timeout_s=timeout)
    labels = _probe_labels(run, intent.probe, domain.PROBE_CAPACITY)
    return LaunchSpec(run_id=run.run_id, pipeline=run.pipeline, attempt=0,
                      capacity=Capacity.SPOT, region=intent.region, template=template, env={},
                      labels=labels,
                      display_name=f"spotorch-{run.run_id}-probe{intent.probe}"[:128])


def _register_model(deps: Deps, run: Run, intent: RegisterModelIntent) -> Observation | None:
    """UploadModel as a new version of the pipeline's model (idempotent: found by the run's
    label); a permanent refusal ends the run SUCCEEDED without a model name, saying why."""
    model = deps.pipeline(run.pipeline).model
    if model is None or deps.models is None:
        return ModelRegistered(intent.id, error="no model registry configured")
    pipeline = deps.pipeline(run.pipeline)
    labels = {**dict(model.labels), LABEL_MODEL_PIPELINE: run.pipeline,
              LABEL_MODEL_RUN: run.run_id, LABEL_MODEL_SNAPSHOT: run.snapshot_id or ""}
    try:
        name = deps.models.upload(ModelUpload(
            pipeline=run.pipeline, run_id=run.run_id,
            region=model.region or pipeline.job.regions[0],
            display_name=model.display_name or run.pipeline, artifact_uri=intent.artifact_uri,
            serving_image=model.serving_image, labels=labels, aliases=model.aliases))
    except RegistryError as exc:
        if not exc.permanent:
            raise  # stays in the outbox; the tick retries it
        return ModelRegistered(intent.id, error=str(exc))
    if model.experiments and deps.experiments is not None:
        _log_experiment(deps, run, region=model.region or pipeline.job.regions[0])
    return ModelRegistered(intent.id, model_name=name)


def _log_experiment(deps: Deps, run: Run, *, region: str) -> None:
    """The run in its pipeline's Vertex AI Experiment: parameters, final metrics and cost
    (best effort: a failure is logged, the model is registered either way)."""
    assert deps.experiments is not None
    ctx = Context(deps.pipeline(run.pipeline), deps.clock.now())
    metrics = {**{k: float(v) for k, v in run.progress.metrics.items()},
               "cost": round(domain.cost_estimate(run, ctx), 6),
               "preemptions": float(run.counters.preemptions), "step": float(run.progress.step)}
    try:
        deps.experiments.log_run(ExperimentRun(experiment=run.pipeline, run_id=run.run_id,
                                               region=region, params=dict(run.params),
                                               metrics=metrics))
    except RegistryError as exc:
        log.warning("run %s not logged to Experiments: %s", run.run_id, exc,
                    extra={"run_id": run.run_id})


def _earlier_jobs_ended(deps: Deps, run: Run, attempt: int) -> bool:
    """One live job per run: every earlier attempt's job is confirmed ended by Vertex itself.

    A job still alive (the attempt was ended by a message that lied, or a cancel has not landed)
    is cancelled now and the launch waits; NOT_FOUND means there is no job to fear.
    """
    ended = True
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
            return False
        if not status.phase.terminal:
            log.warning("launch of %s attempt %d waits: %s is still %s; cancelling it",
                        run.run_id, attempt, earlier.job_name, status.phase,
                        extra={"run_id": run.run_id})
            with contextlib.suppress(LaunchError):
                deps.launcher.cancel(earlier.job_name)
            ended = False
    return ended


def job_id_of(job_name: str) -> str:
    return job_name.rsplit("/", 1)[-1]


def record_job(deps: Deps, job_name: str, run_id: str, attempt: int, pipeline: str, *,
               probe: int = 0) -> None:
    """Remember which run and attempt (or probe) a job belongs to (log-sink entries name only
    the job)."""
    doc = {"job_name": job_name, "run_id": run_id, "attempt": attempt, "pipeline": pipeline,
           "recorded_at": deps.clock.now()}
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


# ---------------------------------------------------------------- hardware (issue 19)

def _hardware_template(pipeline: Pipeline, run: Run) -> JobTemplate:
    """The pipeline's job template, on the candidate the run's hardware choice names."""
    return shapes.run_pipeline(pipeline, run.hardware).job


def launch_spec(deps: Deps, run: Run, intent: LaunchIntent) -> LaunchSpec:
    """The job of one attempt: the pipeline's template plus the trainer's env and identifying labels."""
    pipeline = deps.pipeline(run.pipeline)
    number = intent.attempt
    env = {
        contract.ENV_RUN_ID: run.run_id,
        contract.ENV_ATTEMPT: str(number),
        contract.ENV_PIPELINE: run.pipeline,
        contract.ENV_CHECKPOINT_URI: run.checkpoint_uri,
        contract.ENV_RESUME_FROM: intent.resume_uri or "",
        contract.ENV_RESUME_STEP: "" if intent.resume_step is None else str(intent.resume_step),
        contract.ENV_DATA_URI: run.data_uri,
        contract.ENV_MODEL_URI: run.output_uri,
        contract.ENV_EVENTS_TOPIC: deps.events_topic,
    }
    if run.sweep_id:
        env[contract.ENV_PARAMS] = json.dumps(dict(run.params), sort_keys=True)
    if intent.resume_exact:
        env[contract.ENV_RESUME_EXACT] = "1"
    labels = {LABEL_RUN: run.run_id, LABEL_ATTEMPT: str(number), LABEL_PIPELINE: run.pipeline,
              LABEL_BUCKET: str(run.bucket)}
    return LaunchSpec(run_id=run.run_id, pipeline=run.pipeline, attempt=number,
                      capacity=intent.capacity, region=intent.region,
                      template=with_machine(_hardware_template(pipeline, run),
                                            intent.machine_type), env=env,
                      labels=labels,
                      display_name=f"spotorch-{run.run_id}-a{number}"[:128])


def with_machine(template: JobTemplate, machine_type: str | None) -> JobTemplate:
    """The job template with the first worker pool on another machine type (OOM fallback)."""
    if not machine_type or not template.worker_pools:
        return template
    first, *rest = template.worker_pools
    return replace(template, worker_pools=(replace(first, machine_type=machine_type), *rest))


# ---------------------------------------------------------------- starting runs

def start_run(deps: Deps, pipeline_name: str, *, run_id: str, data_uri: str,
              snapshot_id: str | None, reason: str,
              resume_from: Checkpoint | None = None, retry_of: str | None = None,
              sweep_id: str | None = None,
              params: Mapping[str, Any] | None = None) -> Run | None:
    """Create the run of a snapshot exactly once; apply the pipeline's rule for an active run.

    A sweep's trial (sweep_id set) runs alongside the others: its sweep decides parallelism."""
    pipeline = deps.pipeline(pipeline_name)
    existing, _ = deps.runs.load(run_id)
    if existing is not None:
        return existing
    rule = "parallel" if sweep_id else pipeline.trigger.on_active_run.value
    active = [] if rule == "parallel" else \
        [r for r in deps.runs.active_for_pipeline(pipeline.name) if r.run_id != run_id]
    if active and rule == "skip":
        log.info("snapshot %s skipped: run %s is active", snapshot_id, active[0].run_id)
        return None
    now = deps.clock.now()
    cache = _probe_cache(deps, pipeline) if pipeline.hardware is not None else None
    run = domain.new_run(run_id=run_id, pipeline=pipeline, now=now,
                         data_uri=data_uri, snapshot_id=snapshot_id,
                         queued=bool(active) and rule == "queue", resume_from=resume_from,
                         retry_of=retry_of, reason=reason, sweep_id=sweep_id, params=params,
                         region_order=region_order(deps, pipeline, shape_of(pipeline, None),
                                                   now),
                         hardware_cache=cache,
                         outlook=hardware_outlook(deps, pipeline, now) if cache else None)
    try:
        version = deps.runs.save(run, None)
    except ConflictError:
        return deps.runs.load(run_id)[0]  # created concurrently by a duplicate delivery
    run = _carry_out(deps, run, version, tuple(i.id for i in run.outbox))
    if active and rule == "supersede":
        for old in active:
            cancel_run(deps, old.run_id, f"superseded by run {run_id}")
    return run


def promote_next(deps: Deps, pipeline_name: str) -> Run | None:
    """Start the oldest queued run of a pipeline when none of its runs is under way."""
    active = deps.runs.active_for_pipeline(pipeline_name)
    if any(r.status is not RunStatus.QUEUED for r in active):
        return None
    queued = [r for r in active if r.status is RunStatus.QUEUED]
    return apply(deps, queued[0].run_id, [Promote()]) if queued else None


# ---------------------------------------------------------------- events and the tick

def job_changed(deps: Deps, run_id: str, attempt: int, status: JobStatus,
                event_id: str | None = None, *, confirmed: bool = True) -> Run:
    """A job's state changed; when it ended, look up the checkpoint it left first."""
    def observe(run: Run) -> Sequence[Observation]:
        if run.attempt(attempt) is None:
            raise UnknownAttempt(f"run {run_id} has no attempt {attempt}")
        checkpoint = _checkpoint_if_ended(deps, run, status) if confirmed else None
        return [JobObserved(attempt, status, checkpoint, confirmed=confirmed)]
    return _apply_known(deps, run_id, observe, event_id)


@dataclass(frozen=True)
class JobOwner:
    """What the job record says of a job: its full name (with region), run and attempt."""

    job_name: str
    run_id: str
    attempt: int
    probe: int = 0  # a Spot probe's job (attempt 0)


@dataclass
class JobOwners:
    """The job records' answers, kept per instance: which run each job id belongs to."""

    # A job record never changes once written (a job id names one run's attempt or probe for
    # good), so a found owner can be kept; a missing record is asked again every time (it may
    # be a forged id now and a real one never, or one whose record write failed). An attempt
    # sends several lines (provisioning, running, its end) and the launching instance records
    # the job itself: each hit saves a Firestore read on the job-event path.
    limit: int = 10_000
    _known: dict[str, JobOwner] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def find(self, docs: DocumentStore, job_id: str) -> JobOwner | None:
        known = self._known.get(job_id)
        if known is not None:
            return known
        doc, _ = docs.get(COLLECTION_JOBS, job_id)
        if doc is None:
            return None
        owner = JobOwner(str(doc["job_name"]), str(doc["run_id"]), int(doc["attempt"]),
                         int(doc.get("probe") or 0))
        self.remember(job_id, owner)
        return owner

    def remember(self, job_id: str, owner: JobOwner) -> None:
        with self._lock:
            if len(self._known) >= self.limit:  # the oldest first: dicts keep insertion order
                del self._known[next(iter(self._known))]
            self._known[job_id] = owner


def job_owner(deps: Deps, job_id: str) -> JobOwner | None:
    return deps.owners.find(deps.docs, job_id)


def probe_changed(deps: Deps, run_id: str, probe: int, status: JobStatus,
                  event_id: str | None = None) -> Run:
    """Vertex's own status of a probe's job."""
    def observe(run: Run) -> Sequence[Observation]:
        known = run.probe(probe)
        if known is None:
            raise UnknownAttempt(f"run {run_id} has no probe {probe}")
        return [ProbeObserved(probe, status, _hardware_result(deps, run, known, status))]
    return _apply_known(deps, run_id, observe, event_id)


def job_line_reported(deps: Deps, job_id: str, phase: JobPhase, message: str,
                      event_id: str | None = None) -> Run:
    """A job's service log line (log sink): attribute it by the job record, confirm an ending.

    A line is a hint: a terminal one is checked with GetCustomJob (the record holds the job's
    region) and only Vertex's answer is applied. A transient failure of that check raises, so
    the message comes back; NOT_FOUND is left to the tick's polling.
    """
    owner = job_owner(deps, job_id)
    if owner is None:
        raise NotOurJob(f"job {job_id} is not one spotorch created (no job record)")
    if owner.probe:
        # A probe's RUNNING moves a run off standard: only Vertex's own answer is applied.
        try:
            confirmed = deps.launcher.get(owner.job_name)
        except LaunchError as exc:
            if exc.code != "NOT_FOUND":
                raise
            gone = ProbeMissing(owner.probe, owner.job_name)
            return _apply_known(deps, owner.run_id, lambda _run: [gone], event_id)
        return probe_changed(deps, owner.run_id, owner.probe, confirmed, event_id)
    if not phase.terminal:
        hint = JobStatus(owner.job_name, phase, message=message)
        return job_changed(deps, owner.run_id, owner.attempt, hint, event_id, confirmed=False)
    try:
        status = deps.launcher.get(owner.job_name)
    except LaunchError as exc:
        if exc.code != "NOT_FOUND":
            raise
        run, _ = deps.runs.load(owner.run_id)
        if run is None:
            raise UnknownRun(f"no run {owner.run_id!r}") from None
        return run  # the tick counts it as missing and, in time, as lost
    return job_changed(deps, owner.run_id, owner.attempt, status, event_id)


def _checkpoint_if_ended(deps: Deps, run: Run, status: JobStatus) -> Checkpoint | None:
    if not status.phase.terminal:
        return None
    try:
        return deps.checkpoints.latest(run.checkpoint_uri)
    except Exception as exc:  # the decision can go on with what the trainer reported
        log.warning("checkpoint lookup for %s failed: %s", run.run_id, exc)
        return None


def trainer_reported(deps: Deps, run_id: str, report: TrainerReported,
                     event_id: str | None = None) -> Run:
    """The trainer of an attempt reported progress, a checkpoint, or its end."""
    def observe(run: Run) -> Sequence[Observation]:
        if run.attempt(report.attempt) is None:
            raise UnknownAttempt(f"run {run_id} has no attempt {report.attempt}")
        why = domain.implausible(run, report, deps.clock.now())
        if why is not None:
            raise ImplausibleReport(f"run {run_id} attempt {report.attempt}: {why}")
        return [] if _coalesced(run, report) else [report]
    return _apply_known(deps, run_id, observe, event_id)


def _apply_known(deps: Deps, run_id: str, observe: Callable[[Run], Sequence[Observation]],
                 event_id: str | None) -> Run:
    """apply() for an event about a run that must exist: an unknown run is an error to record."""
    run = apply(deps, run_id, observe, event_id=event_id)
    if run is None:
        raise UnknownRun(f"no run {run_id!r}")
    return run


@dataclass(frozen=True)
class Listing:
    """What ListCustomJobs said of spotorch's live jobs: their statuses, and where it could say.

    A live attempt whose job is absent from a listed region has ended (or vanished): only then is
    GetCustomJob asked. In a region whose listing failed, every live job is asked.
    """

    statuses: Mapping[str, JobStatus]
    regions: frozenset[str]


def list_live_jobs(deps: Deps, regions: Sequence[str]) -> Listing:
    statuses: dict[str, JobStatus] = {}
    listed: set[str] = set()
    for region in sorted(set(regions)):
        try:
            statuses.update((s.job_name, s) for s in deps.launcher.list_live(region))
        except LaunchError as exc:
            log.warning("listing live jobs in %s failed (each job is asked instead): %s",
                        region, exc)
            continue
        listed.add(region)
    return Listing(statuses, frozenset(listed))


def _regions_of(runs: Sequence[Run]) -> list[str]:
    return sorted({a.region for r in runs for a in r.attempts if a.live and a.job_name})


# Firestore sustains about one write per second per document: plain progress reports closer
# than this to the last one written are acknowledged without a write (the next one carries the
# news, metrics included). Checkpoints, starts and ends are always written.
COALESCE_S = 1.0


def _coalesced(run: Run, report: TrainerReported) -> bool:
    last = run.progress.at
    return (report.kind == "progress" and report.checkpoint_uri is None
            and not report.nonfinite  # a diverging loss is news now (training health)
            and last is not None and 0.0 <= report.at - last < COALESCE_S
            and (report.step or 0) >= run.progress.step)


def tick(deps: Deps, *, buckets: Sequence[int] | None = None,
         listing: Listing | None = None) -> list[Run]:
    """Reconcile: every active run (or those of some buckets) against its job, timers fired,
    crashes' leftovers finished. Job states come from one listing per region, not a call per job."""
    runs = deps.runs.active() if buckets is None else deps.runs.active_in_buckets(buckets)
    if listing is None:
        listing = list_live_jobs(deps, _regions_of(runs))
    touched: list[Run] = []
    pipelines_with_queue: set[str] = set()
    for run in runs:
        if run.status is RunStatus.QUEUED:
            pipelines_with_queue.add(run.pipeline)
            continue
        result = apply(deps, run.run_id, _poll(deps, run, listing), take_over=True)
        if result is not None:
            touched.append(result)
    for name in pipelines_with_queue:
        promote_next(deps, name)
    _retry_deferred_launches(deps, touched)
    cancel_stray_probes(deps, runs, listing, buckets)
    if not buckets or 0 in buckets:  # sweeps are few: one shard (or the whole tick) takes them
        from spotorch import sweep_service

        sweep_service.reconcile_sweeps(deps)
    return touched


# A launch the request budget refused (Vertex allows 60 submissions a minute per region) is
# tried again by the same tick while the budget refills, rather than a whole tick later: 100
# relaunches after a mass preemption are then all created within about two minutes.
LAUNCH_RETRY_WINDOW_S = 150.0
LAUNCH_RETRY_PAUSE_S = 5.0


def _retry_deferred_launches(deps: Deps, runs: Sequence[Run]) -> None:
    def deferred(run: Run) -> bool:  # a launch refused for quota (its claim given up)
        now = deps.clock.now()
        return run.active and any(isinstance(i, LaunchIntent) and i.claimed_until <= now
                                  for i in run.outbox)

    waiting = [r.run_id for r in runs if deferred(r)]
    # Bounded in real time (the invocation's), whatever clock the decisions use.
    until = time.monotonic() + LAUNCH_RETRY_WINDOW_S
    while waiting and time.monotonic() < until:
        time.sleep(LAUNCH_RETRY_PAUSE_S)  # the budget refills by the minute
        for i, run_id in enumerate(waiting):
            run = apply(deps, run_id, [], take_over=True)
            if run is not None and deferred(run):
                waiting = waiting[i:]  # refused again: the budget is spent for now, the rest wait
                break
        else:
            waiting = []
    if waiting:
        log.info("tick: %d launch(es) wait for the next tick", len(waiting))


def _poll(deps: Deps, run: Run, listing: Listing) -> Callable[[Run], list[Observation]]:
    """Each live job's status from the listing, or from Vertex where the listing cannot answer;
    the checkpoint lookups wait for the fresh run."""
    statuses: list[tuple[int, JobStatus]] = []
    missing: list[Observation] = []
    for attempt in run.attempts:
        if not (attempt.live and attempt.job_name):
            continue
        listed = listing.statuses.get(attempt.job_name)
        if listed is not None:
            statuses.append((attempt.number, listed))
            continue
        try:
            statuses.append((attempt.number, deps.launcher.get(attempt.job_name)))
        except LaunchError as exc:
            if exc.code == "NOT_FOUND":
                missing.append(JobMissing(attempt.number, attempt.job_name))
            log.warning("polling %s failed: %s", attempt.job_name, exc,
                        extra={"run_id": run.run_id})
    probed = _poll_probes(deps, run, listing)

    def observe(fresh: Run) -> list[Observation]:
        polled: list[Observation] = [JobObserved(n, s, _checkpoint_if_ended(deps, fresh, s))
                                     for n, s in statuses]
        return [*polled, *missing, *probed, Tick()]
    return observe


def _poll_probes(deps: Deps, run: Run, listing: Listing) -> list[Observation]:
    """The live probe's status: from the listing, else asked (it ended, or is not listed)."""
    found: list[Observation] = []
    for probe in run.probes:
        if not (probe.live and probe.job_name):
            continue
        listed = listing.statuses.get(probe.job_name)
        if listed is not None:
            found.append(ProbeObserved(probe.number, listed))
            continue
        try:
            status = deps.launcher.get(probe.job_name)
            found.append(ProbeObserved(probe.number, status,
                                       _hardware_result(deps, run, probe, status)))
        except LaunchError as exc:
            if exc.code == "NOT_FOUND":
                found.append(ProbeMissing(probe.number, probe.job_name))
            log.warning("polling probe %s failed: %s", probe.job_name, exc,
                        extra={"run_id": run.run_id})
    return found


def cancel_stray_probes(deps: Deps, runs: Sequence[Run], listing: Listing,
                        buckets: Sequence[int] | None = None) -> int:
    """Cancel listed live probe jobs that no active run is waiting on (the run ended, or lost
    track of it in a crash): a probe left behind bills Spot time for nothing."""
    by_label = {label_value(r.run_id): r for r in runs}
    cancelled = 0
    for status in listing.statuses.values():
        labels = status.labels
        if labels.get(LABEL_PROBE) not in (domain.PROBE_CAPACITY, domain.PROBE_HARDWARE):
            continue
        bucket = labels.get(LABEL_BUCKET, "")
        if buckets is not None and (not bucket.isdigit() or int(bucket) not in buckets):
            continue  # another shard's
        run = by_label.get(labels.get(LABEL_RUN, ""))
        if run is not None and _waits_on(run, status):
            continue
        if run is not None:  # it may have launched the probe since the tick loaded it
            fresh, _ = deps.runs.load(run.run_id)
            if fresh is not None and _waits_on(fresh, status):
                continue
        try:
            deps.launcher.cancel(status.job_name)
            cancelled += 1
            log.info("cancelled stray probe %s (run %s)", status.job_name, labels.get(LABEL_RUN))
        except LaunchError as exc:
            log.warning("cancelling stray probe %s failed: %s", status.job_name, exc)
    return cancelled


def _waits_on(run: Run, status: JobStatus) -> bool:
    """Whether a live probe of the run is this job (or this probe, its creation in flight)."""
    return any(probe.live and probe.cancel_reason is None and (
        probe.job_name == status.job_name
        or (probe.job_name is None
            and status.labels.get(LABEL_ATTEMPT) == domain.probe_key(probe.number)))
        for probe in run.probes)


# ---------------------------------------------------------------- fanning the tick out

FANOUT_AFTER_JOBS = 500  # more live jobs than this: shards reconcile them in parallel
RECONCILE_SHARDS = 8  # each takes RECONCILE_BUCKETS / RECONCILE_SHARDS buckets


def _status_doc(status: JobStatus) -> dict[str, Any]:
    return {"job_name": status.job_name, "phase": str(status.phase),
            "failure": str(status.failure) if status.failure else None,
            "exit_code": status.exit_code, "message": status.message[:500],
            "labels": dict(status.labels), "create_time": status.create_time,
            "start_time": status.start_time, "end_time": status.end_time}


def status_from_doc(doc: Mapping[str, Any]) -> JobStatus:
    return JobStatus(job_name=str(doc["job_name"]), phase=JobPhase(doc["phase"]),
                     failure=FailureClass(doc["failure"]) if doc.get("failure") else None,
                     exit_code=doc.get("exit_code"), message=str(doc.get("message") or ""),
                     labels={str(k): str(v) for k, v in (doc.get("labels") or {}).items()},
                     create_time=doc.get("create_time"), start_time=doc.get("start_time"),
                     end_time=doc.get("end_time"))


def shard_buckets(shard: int, shards: int = RECONCILE_SHARDS) -> list[int]:
    return [b for b in range(domain.RECONCILE_BUCKETS) if b % shards == shard]


def reconcile_runs(deps: Deps) -> list[Run]:
    """List live jobs once per region; reconcile here, or hand the buckets out in shards."""
    regions = sorted({r for p in deps.pipelines.values() for r in p.job.regions}
                     | set(_regions_of(deps.runs.active()) if deps.shards is None else ()))
    listing = list_live_jobs(deps, regions)
    if deps.shards is None or len(listing.statuses) <= FANOUT_AFTER_JOBS:
        return tick(deps, listing=listing)
    by_shard: dict[int, list[dict[str, Any]]] = {k: [] for k in range(RECONCILE_SHARDS)}
    for status in listing.statuses.values():
        bucket = status.labels.get(LABEL_BUCKET, "")
        if bucket.isdigit():
            by_shard[int(bucket) % RECONCILE_SHARDS].append(_status_doc(status))
    for shard, docs in by_shard.items():
        deps.shards.dispatch({"shard": shard, "shards": RECONCILE_SHARDS,
                              "regions": sorted(listing.regions), "statuses": docs})
    log.info("tick: %d live jobs handed to %d shards", len(listing.statuses), RECONCILE_SHARDS)
    return []


def reconcile_shard(deps: Deps, shard: Mapping[str, Any]) -> list[Run]:
    """One shard of a fanned-out tick: its buckets' runs against the statuses it carries."""
    buckets = shard_buckets(int(shard["shard"]), int(shard["shards"]))
    statuses = {s.job_name: s for s in map(status_from_doc, shard.get("statuses") or ())}
    # Jobs of these buckets absent from the listing of a listed region are asked one by one.
    listing = Listing(statuses, frozenset(str(r) for r in shard.get("regions") or ()))
    return tick(deps, buckets=buckets, listing=listing)


# ---------------------------------------------------------------- operator actions

def cancel_run(deps: Deps, run_id: str, reason: str = "cancelled by an operator") -> Run:
    """Cancel a run and stop its job."""
    run = apply(deps, run_id, [CancelRequested(reason)])
    if run is None:
        raise UnknownRun(f"no run {run_id!r}")
    return run


def retry_run(deps: Deps, run_id: str, request_id: str = "1") -> Run:
    """Start a new run that resumes a failed or cancelled run from its latest checkpoint."""
    old, _ = deps.runs.load(run_id)
    if old is None:
        raise UnknownRun(f"no run {run_id!r}")
    if old.active or old.status is RunStatus.SUCCEEDED:
        raise NotRetryable(f"run {run_id} is {old.status}; only a run that failed or was "
                           "cancelled can be retried")
    resume = deps.checkpoints.latest(old.checkpoint_uri) or old.latest_checkpoint
    new_id = f"{run_id}-retry-{request_id}"[:63]
    run = start_run(deps, old.pipeline, run_id=new_id, data_uri=old.data_uri,
                    snapshot_id=old.snapshot_id, reason=f"retry of {run_id}",
                    resume_from=resume, retry_of=old.retry_of or run_id)
    if run is None:
        raise NotRetryable(f"pipeline {old.pipeline} skips new runs while one is active")
    return run


REJECTED_REASON_CHARS = 4000


def record_rejected(docs: DocumentStore, *, event_id: str, event_type: str, reason: str,
                    now: float, payload: Mapping[str, Any] | None = None) -> None:
    """Keep a malformed event for people to look at; it is acknowledged, never retried."""
    key = (event_id or f"unknown-{now}").replace("/", "_")[:200]
    # Firestore refuses a string over 1 MiB and a document over 1 MiB: a reason quoting hostile
    # input (a 1 MiB object name) is cut, so the record is written all the same.
    doc = {"event_id": shorten(str(event_id), 1500), "event_type": shorten(str(event_type), 500),
           "reason": shorten(reason, REJECTED_REASON_CHARS), "at": now,
           "payload": repr(payload)[:4000] if payload is not None else None,
           # A timestamp, not a number: Firestore's TTL policy only acts on timestamps.
           "expires_at": datetime.fromtimestamp(now + 30 * 24 * 3600, UTC)}
    with contextlib.suppress(ConflictError):  # recorded by an earlier delivery
        docs.put(COLLECTION_REJECTED, key, doc, None)


def run_summary(run: Run) -> dict[str, Any]:
    """A run as people and the demo read it."""
    return {
        "run_id": run.run_id,
        "pipeline": run.pipeline,
        "status": str(run.status),
        "end_reason": run.end_reason,
        "preemptions": run.counters.preemptions,
        "model_name": run.model_name,
        "sweep_id": run.sweep_id,
        "params": dict(run.params),
        "escalated": None if not run.escalated else {
            "to": run.escalated["to"], "reason": run.escalated["reason"]},
        "attempts": [{
            "attempt": a.number, "capacity": str(a.capacity), "region": a.region,
            "state": str(a.state), "job_name": a.job_name, "end_reason": a.end_reason,
            "failure_class": str(a.failure) if a.failure else None, "exit_code": a.exit_code,
            "created_at": a.created_at, "started_at": a.started_at, "ended_at": a.ended_at,
            "resumed_from_step": a.resumed_from_step, "progress_reached": a.progress_step,
            "machine_type": a.machine_type,
        } for a in run.attempts],
        "health": {
            "hangs": run.counters.hangs, "divergences": run.counters.divergences,
            "out_of_memory": run.counters.out_of_memory,
            "checkpoints_deleted": run.health.deleted_checkpoints,
            "bytes_reclaimed": run.health.bytes_reclaimed,
        },
        "probes": [{
            "probe": p.number, "region": p.region, "state": str(p.state), "job_name": p.job_name,
            "found": p.found, "created_at": p.created_at, "started_at": p.started_at,
            "ended_at": p.ended_at, "cancel_reason": p.cancel_reason,
        } for p in run.probes],
        "history": [{"at": h.at, "what": h.what, "reason": h.reason} for h in run.history],
    }


def submit(deps: Deps, pipeline_name: str, data_uri: str, *, request_id: str = "") -> Run | None:
    """Start a run by hand for a data URI (CLI/API); the same request id gives the same run."""
    from spotorch.intake import manual_snapshot, run_id_for

    pipeline = deps.pipeline(pipeline_name)
    snap = manual_snapshot(pipeline, data_uri, request_id=request_id, now=deps.clock.now())
    return start_run(deps, pipeline.name, run_id=run_id_for(pipeline.name, snap.snapshot_id),
                     data_uri=snap.data_uri, snapshot_id=snap.snapshot_id,
                     reason=f"submitted by hand for {data_uri}")


# ---------------------------------------------------------------- data arrival

def data_arrived(deps: Deps, obj: ObjectEvent, *, listed: bool = False) -> list[Run]:
    """An object event (Eventarc, a GCS notification, or a listing): batch it, start what it completes.

    A finalize event counts only if that generation exists (one metadata read), so a forged or
    stale event cannot start a run.
    """
    from spotorch import intake

    pipelines = tuple(deps.pipelines.values())
    if not intake.matches_any(obj, pipelines):
        log.info("object %s matches no pipeline: %s", obj.uri, intake.why_unmatched(obj, pipelines),
                 extra={"event_id": obj.event_id})
        return []
    if obj.kind == ObjectEventKind.FINALIZE and not listed and \
            not deps.objects.exists(obj.bucket, obj.name, obj.generation):
        raise InvalidEvent(f"{obj.uri} generation {obj.generation} does not exist",
                           event_id=obj.event_id)
    ready = intake.handle_object_event(obj, pipelines=pipelines, docs=deps.docs,
                                       now=deps.clock.now(), reader=deps.objects)
    return [run for snap in ready if (run := start_snapshot_run(deps, snap, "complete"))]


def start_snapshot_run(deps: Deps, snap: SnapshotReady, why: str) -> Run | None:
    """The one run of a completed snapshot; then the snapshot is marked dispatched."""
    from spotorch import intake

    if deps.pipeline(snap.pipeline).sweep is not None:  # a sweep pipeline: the snapshot's sweep
        from spotorch import sweep_service

        sweep_service.start_snapshot_sweep(deps, snap, why)
        intake.mark_dispatched(snap, docs=deps.docs)
        return None
    run = start_run(deps, snap.pipeline, run_id=intake.run_id_for(snap.pipeline, snap.snapshot_id),
                    data_uri=snap.data_uri, snapshot_id=snap.snapshot_id,
                    reason=f"data snapshot {snap.data_uri} {why}")
    intake.mark_dispatched(snap, docs=deps.docs)  # also when skipped: it must not come back
    log.info("snapshot %s ready", snap.snapshot_id,
             extra={"run_id": run.run_id if run else None, "pipeline": snap.pipeline})
    return run


LISTING_PAGE_SIZE = 500
LISTING_PAGES_PER_TICK = 4  # bounded work per invocation; a long listing goes on next tick
# Objects older than the first listing of a prefix by more than this predate spotorch's watch
# (or their events were handled then): a first deploy on a full bucket starts no old runs.
LISTING_LOOKBACK_S = 3600.0
# Objects updated this long before the start of the last completed pass are not fed again (they
# were, by that pass); the margin covers the gap between GCS's clock and ours.
LISTING_MARGIN_S = 600.0


def list_landing(deps: Deps) -> int:
    """Feed the objects of every landing prefix to intake, as events would: what events missed.

    Each (bucket, prefix) keeps a cursor in Firestore, so a tick reads at most
    LISTING_PAGES_PER_TICK pages and the next one carries on; at the end the cursor starts over.
    Listed objects go through the same intake as events (by object generation), so an object
    whose event did arrive changes nothing; a snapshot starts its run exactly once either way.
    Returns the number of objects listed.
    """
    from spotorch import intake

    listed = 0
    now = deps.clock.now()
    for bucket, prefix in intake.landing_prefixes(tuple(deps.pipelines.values())):
        key = f"{bucket}:{prefix}".replace("/", "|")[:1400]
        doc, version = deps.docs.get(COLLECTION_LISTINGS, key)
        state = doc or {}
        token = state.get("page_token")
        since = float(state.get("watching_since") or now)
        # A pass over the prefix spans ticks; what a completed pass listed is not fed again.
        pass_started = now if token is None else float(state.get("pass_started") or now)
        fed_before = state.get("fed_before")
        skip_before = since - LISTING_LOOKBACK_S
        if fed_before is not None:
            skip_before = max(skip_before, float(fed_before) - LISTING_MARGIN_S)
        for _ in range(LISTING_PAGES_PER_TICK):
            page = deps.objects.list_page(bucket, prefix, token, LISTING_PAGE_SIZE)
            for info in page.objects:
                if info.updated is not None and info.updated < skip_before:
                    continue
                listed += 1
                try:
                    data_arrived(deps, intake.listed_event(info), listed=True)
                except SpotorchError as exc:
                    log.warning("listed object gs://%s/%s: %s", info.bucket, info.name, exc)
            token = page.next_page_token
            if token is None:
                fed_before = pass_started  # everything older was listed by this pass
                break
        with contextlib.suppress(ConflictError):  # another tick listed it meanwhile: fine
            deps.docs.put(COLLECTION_LISTINGS, key, {
                "page_token": token, "bucket": bucket, "prefix": prefix, "watching_since": since,
                "pass_started": pass_started, "fed_before": fed_before, "listed_at": now},
                version)
    return listed


def reconcile(deps: Deps) -> list[Run]:
    """The tick: close due snapshots, list the landing prefixes, then reconcile every active run."""
    from spotorch import intake

    def run_exists(run_id: str) -> bool:
        return deps.runs.load(run_id)[0] is not None

    for snap in intake.close_due_snapshots(pipelines=tuple(deps.pipelines.values()),
                                           docs=deps.docs, now=deps.clock.now(),
                                           run_exists=run_exists):
        start_snapshot_run(deps, snap, "closed by the tick")
    try:
        list_landing(deps)
    except Exception as exc:  # listing is a repair; the runs' reconcile must not wait for it
        log.warning("listing the landing buckets failed: %s", exc)
    return reconcile_runs(deps)
