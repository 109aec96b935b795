"""The service layer: load a run, decide, save it in one conditional write, then carry out its intents."""

from __future__ import annotations

import contextlib
import logging
import random
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, assert_never

from spotorch import domain
from spotorch.domain import (
    CancelIntent,
    CancelRequested,
    Checkpoint,
    Context,
    Intent,
    IntentDone,
    JobObserved,
    JobStatus,
    LaunchDone,
    LaunchFailed,
    LaunchIntent,
    Observation,
    Promote,
    PublishIntent,
    Run,
    RunStatus,
    Tick,
    TrainerReported,
)
from spotorch.errors import SpotorchError
from spotorch.pipeline import OnActiveRun, Pipeline
from spotorch.ports import (
    LABEL_ATTEMPT,
    LABEL_PIPELINE,
    LABEL_RUN,
    CheckpointStore,
    Clock,
    ConflictError,
    DocumentStore,
    EventPublisher,
    JobLauncher,
    LaunchError,
    LaunchSpec,
    RunStore,
)
from spotorch.settings import COLLECTION_REJECTED
from spotorch_trainer import contract

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
    events_topic: str = ""  # trainer events topic handed to jobs (projects/P/topics/T)

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
        ctx = Context(deps.pipeline(run.pipeline), now)
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
            version = deps.runs.save(new, version)
        except ConflictError:
            time.sleep(random.uniform(0.0, 0.02 * (attempt + 1)))  # spread racing writers out
            continue
        return _carry_out(deps, new, version, mine, was_active=run.active)
    raise ConflictError(f"run {run_id}: too much contention, giving up for redelivery")


def _fresh(old: Run, new: Run) -> tuple[str, ...]:
    known = {i.id for i in old.outbox}
    return tuple(i.id for i in new.outbox if i.id not in known)


def _carry_out(deps: Deps, run: Run, version: Any, mine: Sequence[str], *,
               was_active: bool = True) -> Run:
    """Perform the intents this invocation owns; record their results in one more write."""
    pending = set(mine)
    results: list[Observation] = []
    ctx = Context(deps.pipeline(run.pipeline), deps.clock.now())
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
    return after


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
            case _:
                assert_never(intent)
    except Exception as exc:  # a failed side effect stays in the outbox; the tick retries it
        log.warning("intent %s (%s) of run %s failed: %s", intent.id, intent.kind, run.run_id, exc,
                    extra={"run_id": run.run_id})
        return None


def _perform_launch(deps: Deps, run: Run, intent: LaunchIntent) -> Observation | None:
    if deps.clock.now() > intent.claimed_until - LEASE_MARGIN_S:
        return None  # our claim is nearly over: let the tick re-claim it rather than race it
    try:
        job_name = deps.launcher.launch(launch_spec(deps, run, intent))
    except LaunchError as exc:
        return LaunchFailed(intent.id, intent.attempt, str(exc), exc.permanent)
    return LaunchDone(intent.id, intent.attempt, job_name)


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
    labels = {LABEL_RUN: run.run_id, LABEL_ATTEMPT: str(number), LABEL_PIPELINE: run.pipeline}
    return LaunchSpec(run_id=run.run_id, pipeline=run.pipeline, attempt=number,
                      capacity=intent.capacity, region=intent.region,
                      template=pipeline.job, env=env, labels=labels,
                      display_name=f"spotorch-{run.run_id}-a{number}"[:128])


# ---------------------------------------------------------------- starting runs

def start_run(deps: Deps, pipeline_name: str, *, run_id: str, data_uri: str,
              snapshot_id: str | None, reason: str,
              resume_from: Checkpoint | None = None, retry_of: str | None = None) -> Run | None:
    """Create the run of a snapshot exactly once; apply the pipeline's rule for an active run."""
    pipeline = deps.pipeline(pipeline_name)
    existing, _ = deps.runs.load(run_id)
    if existing is not None:
        return existing
    rule = pipeline.trigger.on_active_run.value
    active = [] if rule == "parallel" else \
        [r for r in deps.runs.active_for_pipeline(pipeline.name) if r.run_id != run_id]
    if active and rule == "skip":
        log.info("snapshot %s skipped: run %s is active", snapshot_id, active[0].run_id)
        return None
    run = domain.new_run(run_id=run_id, pipeline=pipeline, now=deps.clock.now(),
                         data_uri=data_uri, snapshot_id=snapshot_id,
                         queued=bool(active) and rule == "queue", resume_from=resume_from,
                         retry_of=retry_of, reason=reason)
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
                event_id: str | None = None) -> Run | None:
    """A job's state changed; when it ended, look up the checkpoint it left first."""
    def observe(run: Run) -> Sequence[Observation]:
        return [JobObserved(attempt, status, _checkpoint_if_ended(deps, run, status))]
    return apply(deps, run_id, observe, event_id=event_id)


def _checkpoint_if_ended(deps: Deps, run: Run, status: JobStatus) -> Checkpoint | None:
    if not status.phase.terminal:
        return None
    try:
        return deps.checkpoints.latest(run.checkpoint_uri)
    except Exception as exc:  # the decision can go on with what the trainer reported
        log.warning("checkpoint lookup for %s failed: %s", run.run_id, exc)
        return None


def trainer_reported(deps: Deps, run_id: str, report: TrainerReported,
                     event_id: str | None = None) -> Run | None:
    """The trainer of an attempt reported progress, a checkpoint, or its end."""
    return apply(deps, run_id, [report], event_id=event_id)


def tick(deps: Deps) -> list[Run]:
    """Reconcile: poll every active run's job, fire due timers, finish what crashes left undone."""
    touched: list[Run] = []
    pipelines_with_queue: set[str] = set()
    for run in deps.runs.active():
        if run.status is RunStatus.QUEUED:
            pipelines_with_queue.add(run.pipeline)
            continue
        result = apply(deps, run.run_id, _poll(deps, run), take_over=True)
        if result is not None:
            touched.append(result)
    for name in pipelines_with_queue:
        promote_next(deps, name)
    return touched


def _poll(deps: Deps, run: Run) -> Callable[[Run], list[Observation]]:
    """Ask the launcher about every live job now; the checkpoint lookups wait for the fresh run."""
    statuses: list[tuple[int, JobStatus]] = []
    for attempt in run.attempts:
        if attempt.live and attempt.job_name:
            try:
                statuses.append((attempt.number, deps.launcher.get(attempt.job_name)))
            except LaunchError as exc:
                log.warning("polling %s failed: %s", attempt.job_name, exc)

    def observe(fresh: Run) -> list[Observation]:
        polled: list[Observation] = [JobObserved(n, s, _checkpoint_if_ended(deps, fresh, s))
                                     for n, s in statuses]
        return [*polled, Tick()]
    return observe


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


def record_rejected(docs: DocumentStore, *, event_id: str, event_type: str, reason: str,
                    now: float, payload: Mapping[str, Any] | None = None) -> None:
    """Keep a malformed event for people to look at; it is acknowledged, never retried."""
    key = (event_id or f"unknown-{now}").replace("/", "_")[:200]
    doc = {"event_id": event_id, "event_type": event_type, "reason": reason, "at": now,
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
        "escalated": None if not run.escalated else {
            "to": run.escalated["to"], "reason": run.escalated["reason"]},
        "attempts": [{
            "attempt": a.number, "capacity": str(a.capacity), "region": a.region,
            "state": str(a.state), "job_name": a.job_name, "end_reason": a.end_reason,
            "failure_class": str(a.failure) if a.failure else None, "exit_code": a.exit_code,
            "created_at": a.created_at, "started_at": a.started_at, "ended_at": a.ended_at,
            "resumed_from_step": a.resumed_from_step, "progress_reached": a.progress_step,
        } for a in run.attempts],
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
