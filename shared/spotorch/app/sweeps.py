"""Sweeps, the use cases: start a sweep, follow its trial runs, cancel it; one conditional write
of the sweep document per change, then its outbox carried out (start or stop trial runs through
the run service, register the winner's model, log trials to Experiments, publish events)."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, assert_never

from spotorch.app import registration
from spotorch.app.deps import UnknownRun
from spotorch.app.runs import cancel_run, snapshot_objects, start_run
from spotorch.app.updates import conditional_update
from spotorch.core import provenance
from spotorch.core import sweeps as sweep
from spotorch.core.context import Context
from spotorch.core.errors import SpotorchError
from spotorch.core.model import Run
from spotorch.core.moves import spent
from spotorch.core.sweep_spec import SearchKind
from spotorch.core.sweeps import (
    CompleteStudyTrial,
    LogTrial,
    MeasureTrial,
    PublishSweepEvent,
    RegisterModel,
    StartTrial,
    StopTrial,
    SuggestTrial,
    Sweep,
    SweepCancelRequested,
    SweepContext,
    SweepEvaluate,
    SweepIntent,
    SweepIntentDeferred,
    SweepIntentDone,
    SweepObservation,
    TrialSeen,
    TrialStatus,
)
from spotorch.ports.store import ConflictError
from spotorch.ports.vizier import Measurement, SearchError, StudyConfig
from spotorch.settings import COLLECTION_SWEEPS

if TYPE_CHECKING:
    from spotorch.app.deps import Deps
    from spotorch.app.snapshots import SnapshotReady

log = logging.getLogger("spotorch.sweeps")

MAX_CONFLICT_RETRIES = 8
CARRY_OUT_ROUNDS = 4


class UnknownSweep(SpotorchError):
    """No sweep has this id."""


class NotASweepPipeline(SpotorchError):
    """The pipeline defines no sweep."""


def _context(deps: Deps, sw: Sweep) -> SweepContext:
    pipeline = deps.pipeline(sw.pipeline)
    if pipeline.sweep is None:
        raise NotASweepPipeline(f"pipeline {sw.pipeline} defines no sweep")
    model = pipeline.model
    return SweepContext(pipeline, pipeline.sweep, deps.clock.now(),
                        register=model is not None and deps.models is not None,
                        experiments=bool(model and model.experiments and deps.experiments))


def load_sweep(deps: Deps, sweep_id: str) -> tuple[Sweep | None, Any]:
    """The sweep and its document's version, (None, None) if there is no such sweep."""
    doc, version = deps.docs.get(COLLECTION_SWEEPS, sweep_id)
    return (Sweep.from_dict(doc) if doc else None), version


def active_sweeps(deps: Deps) -> list[Sweep]:
    """The sweeps not yet ended."""
    return [Sweep.from_dict(d) for d in deps.docs.query(COLLECTION_SWEEPS, "active", True)]


# ---------------------------------------------------------------- starting

def start_sweep(deps: Deps, pipeline_name: str, *, sweep_id: str, data_uri: str,
                snapshot_id: str | None, reason: str = "",
                objects: tuple[tuple[str, int], ...] = (),
                bigquery: Mapping[str, Any] | None = None) -> Sweep:
    """Create a sweep exactly once (the id decides) and start its first trials, every one on
    the snapshot's objects at these generations (and its BigQuery map)."""
    pipeline = deps.pipeline(pipeline_name)
    if pipeline.sweep is None:
        raise NotASweepPipeline(f"pipeline {pipeline_name} defines no sweep")
    if pipeline.sweep.search is SearchKind.VIZIER and deps.search is None:
        raise NotASweepPipeline(f"pipeline {pipeline_name} searches with vizier, and this "
                                "deployment has no Vizier client")
    existing, _ = load_sweep(deps, sweep_id)
    if existing is not None:
        return existing
    if objects and not provenance.fits_inline(objects):
        # The sweep's document is rewritten at every trial's change and must stay far below
        # Firestore's 1 MiB: a snapshot this large is not pinned for its trials (logged), as a
        # folder beyond MAX_PINNED_OBJECTS is not for a run.
        log.warning("sweep %s: %d objects are too many to pin for its trials; they read %s as "
                    "it is", sweep_id, len(objects), data_uri)
        objects = ()
    model = pipeline.model
    sw = sweep.new_sweep(sweep_id=sweep_id, pipeline=pipeline, spec=pipeline.sweep,
                         now=deps.clock.now(), data_uri=data_uri, snapshot_id=snapshot_id,
                         register=model is not None and deps.models is not None,
                         experiments=bool(model and model.experiments and deps.experiments),
                         objects=objects, bigquery=bigquery)
    try:
        version = deps.docs.put(COLLECTION_SWEEPS, sweep_id, sw.to_dict(), None)
    except ConflictError:
        found, _ = load_sweep(deps, sweep_id)  # created concurrently by a duplicate delivery
        assert found is not None
        return found
    log.info("sweep %s created (%s): %d trials", sweep_id, reason, len(sw.trials))
    return _carry_out(deps, sw, version, tuple(i.id for i in sw.outbox))


def start_snapshot_sweep(deps: Deps, snap: SnapshotReady, why: str) -> Sweep:
    """Start the sweep a complete data snapshot asks for, its id fixed by the snapshot."""
    from spotorch.app import snapshots as intake

    sweep_id = intake.run_id_for(snap.pipeline, snap.snapshot_id)
    existing, _ = load_sweep(deps, sweep_id)
    if existing is not None:  # a redelivery: its objects were pinned when it was made
        return existing
    return start_sweep(deps, snap.pipeline, sweep_id=sweep_id,
                       data_uri=snap.data_uri, snapshot_id=snap.snapshot_id,
                       reason=f"data snapshot {snap.data_uri} {why}",
                       objects=snapshot_objects(deps, snap), bigquery=snap.bigquery)


def submit_sweep(deps: Deps, pipeline_name: str, data_uri: str, *,
                 request_id: str = "") -> Sweep:
    """Start a sweep by hand for a data URI (CLI/API); the same request id gives the same sweep."""
    from spotorch.app.runs import folder_objects
    from spotorch.app.snapshots import manual_snapshot, run_id_for

    pipeline = deps.pipeline(pipeline_name)
    snap = manual_snapshot(pipeline, data_uri, request_id=request_id, now=deps.clock.now())
    sweep_id = run_id_for(pipeline.name, snap.snapshot_id)
    from spotorch.app.submissions import check_data_uri

    check_data_uri(deps, pipeline, data_uri)  # 400/404 before anything starts (issue 39)
    existing, _ = load_sweep(deps, sweep_id)
    if existing is not None:  # the same request: nothing listed again
        return existing
    return start_sweep(deps, pipeline.name, sweep_id=sweep_id,
                       data_uri=snap.data_uri, snapshot_id=snap.snapshot_id,
                       reason=f"submitted by hand for {data_uri}",
                       objects=folder_objects(deps, snap.data_uri))


# ---------------------------------------------------------------- the unit of work

SweepSource = Sequence[SweepObservation] | Callable[[Sweep], Sequence[SweepObservation]]


def apply_sweep(deps: Deps, sweep_id: str, observations: SweepSource, *,
                take_over: bool = False) -> Sweep | None:
    """Feed observations to a sweep in one conditional write (app.updates), then carry out what
    was decided."""
    read: dict[str, Any] = {}  # what the last pass read and decided

    def decided(sw: Sweep | None) -> Sweep | None:
        read.clear()
        read["sweep"] = sw
        if sw is None:
            return None
        ctx = _context(deps, sw)
        new = sw
        for obs in observations(sw) if callable(observations) else observations:
            new = sweep.decide_sweep(new, obs, ctx)
        taken = sweep.claimable(new, ctx.now) if take_over else ()
        new = sweep.claim(new, taken, ctx.now) if taken else new
        known = {i.id for i in sw.outbox}
        read["mine"] = tuple(i.id for i in new.outbox if i.id not in known) + \
            tuple(i.id for i in taken)
        return None if new == sw else new

    written = conditional_update(
        lambda: load_sweep(deps, sweep_id), decided,
        lambda new, version: deps.docs.put(COLLECTION_SWEEPS, sweep_id, new.to_dict(), version),
        what=f"sweep {sweep_id}", attempts=MAX_CONFLICT_RETRIES)
    if written is None:
        found: Sweep | None = read.get("sweep")
        return found
    return _carry_out(deps, written.doc, written.version, read["mine"])


def _carry_out(deps: Deps, sw: Sweep, version: Any, mine: Sequence[str]) -> Sweep:
    pending = set(mine)
    results: list[SweepObservation] = []
    ctx = _context(deps, sw)
    after = sw
    for _ in range(CARRY_OUT_ROUNDS):
        todo = [i for i in after.outbox if i.id in pending]
        if not todo:
            break
        before = {i.id for i in after.outbox}
        for intent in todo:
            pending.discard(intent.id)
            result = _perform(deps, after, intent)
            if result is not None:
                results.append(result)
                after = sweep.decide_sweep(after, result, ctx)
        pending.update(i.id for i in after.outbox if i.id not in before)
    if after != sw:
        try:
            deps.docs.put(COLLECTION_SWEEPS, sw.sweep_id, after.to_dict(), version)
        except ConflictError:
            after = apply_sweep(deps, sw.sweep_id, results) or after
    return after


def _perform(deps: Deps, sw: Sweep, intent: SweepIntent) -> SweepObservation | None:
    try:
        match intent:
            case PublishSweepEvent():
                deps.publisher.publish(intent.event)
            case StartTrial():
                trial = sw.trial(intent.trial)
                start_run(deps, sw.pipeline, run_id=trial.run_id, data_uri=sw.data_uri,
                                  snapshot_id=sw.snapshot_id, sweep_id=sw.sweep_id,
                                  params=trial.params, objects=sw.objects,
                                  bigquery=sw.bigquery,
                                  reason=f"trial {trial.number} of sweep {sw.sweep_id}")
            case StopTrial():
                with contextlib.suppress(UnknownRun):  # never created: nothing to stop
                    cancel_run(deps, sw.trial(intent.trial).run_id, intent.reason)
            case RegisterModel():
                name, verdict = registration.register_sweep_model(deps, sw, intent)
                return SweepIntentDone(intent.id, model_name=name, verdict=verdict)
            case LogTrial():
                return SweepIntentDone(intent.id, experiment_run=registration.log_trial(
                    deps, sw, intent))
            case SuggestTrial() | MeasureTrial() | CompleteStudyTrial():
                return _study_call(deps, sw, intent)
            case _:
                assert_never(intent)
        return SweepIntentDone(intent.id)
    except Exception as exc:  # deferred: stays in the outbox, its claim released (core.outbox)
        log.warning("intent %s (%s) of sweep %s failed: %s", intent.id, intent.kind, sw.sweep_id,
                    exc)
        return SweepIntentDeferred(intent.id, f"{type(exc).__name__}: {str(exc)[:300]}")


def study_config(deps: Deps, sw: Sweep) -> StudyConfig:
    """The sweep's Vizier study: named by the sweep, its parameters and objectives."""
    pipeline = deps.pipeline(sw.pipeline)
    spec = pipeline.sweep
    assert spec is not None
    return StudyConfig(display_name=sw.sweep_id, region=registration.model_region(pipeline),
                       parameters=spec.parameters, objectives=sweep.objectives(spec))


def _study_call(deps: Deps, sw: Sweep,
                intent: SuggestTrial | MeasureTrial | CompleteStudyTrial) -> SweepIntentDone:
    """Carry out a Vizier intent: suggest (client id: the trial's run id, so a redelivery gets
    the same Vizier trial), measure, or complete."""
    search = deps.search
    if search is None:
        raise NotASweepPipeline(f"sweep {sw.sweep_id} searches with vizier: no Vizier client")
    trial = sw.trial(intent.trial)
    try:
        if isinstance(intent, SuggestTrial):
            study = sw.study or search.study(study_config(deps, sw))
            suggested = search.suggest(study, trial.run_id, 1)
            if not suggested:
                return SweepIntentDone(intent.id, error=f"Vizier suggested no trial for {study} "
                                                        "(its search space is used up)")
            return SweepIntentDone(intent.id, study=study, study_trial=suggested[0].name,
                                   params=dict(suggested[0].params))
        assert trial.study_trial is not None
        if isinstance(intent, MeasureTrial):
            search.measure(trial.study_trial, Measurement(intent.step, dict(intent.metrics)))
        else:
            search.complete(trial.study_trial, dict(intent.final) if intent.final else None,
                            infeasible_reason=intent.infeasible_reason)
    except SearchError as exc:
        if not exc.permanent:
            raise  # stays in the outbox: the tick retries it when its claim expires
        # Vizier refused for good (a study spec it rejects, a permission missing): retrying
        # cannot help; a suggestion's refusal fails its trial, saying why.
        log.warning("sweep %s: %s refused for good: %s", sw.sweep_id, intent.kind, exc)
        return SweepIntentDone(intent.id, error=f"Vizier refused {intent.kind}: {exc}")
    return SweepIntentDone(intent.id)


# ---------------------------------------------------------------- following trials

def trial_seen(deps: Deps, run: Run, number: int) -> TrialSeen:
    """What the sweep needs of a trial's run: status, curve, final metric, cost."""
    pipeline = deps.pipeline(run.pipeline)
    metric_name = pipeline.sweep.quality if pipeline.sweep else ""
    curve = tuple((p.step, p.value) for p in run.curve)
    metric = curve[-1][1] if curve else run.progress.metrics.get(metric_name)
    cost = spent(run, Context(pipeline, deps.clock.now(), prices=deps.prices))
    return TrialSeen(number, run.status, step=run.progress.step if run.progress.at else None,
                     metric=metric, curve=curve, cost=cost, preemptions=run.counters.preemptions,
                     metrics={k: float(v) for k, v in run.progress.metrics.items()},
                     end_reason=run.end_reason)


def _number_of(sw: Sweep, run_id: str) -> int | None:
    return next((t.number for t in sw.trials if t.run_id == run_id), None)


def trial_ended(deps: Deps, run: Run) -> Sweep | None:
    """A trial's run ended: its sweep frees the slot, keeps the best, maybe ends."""
    if run.sweep_id is None:
        return None

    def observe(sw: Sweep) -> list[SweepObservation]:
        number = _number_of(sw, run.run_id)
        return [] if number is None else [trial_seen(deps, run, number)]
    return apply_sweep(deps, run.sweep_id, observe)


def _observe_trials(deps: Deps) -> Callable[[Sweep], list[SweepObservation]]:
    def observe(sw: Sweep) -> list[SweepObservation]:
        seen: list[SweepObservation] = []
        for trial in sw.trials:
            if trial.status in (TrialStatus.RUNNING, TrialStatus.STOPPING):
                run, _ = deps.runs.load(trial.run_id)
                if run is not None:
                    seen.append(trial_seen(deps, run, trial.number))
        return [*seen, SweepEvaluate()]
    return observe


def reconcile_sweeps(deps: Deps) -> list[Sweep]:
    """The tick: every active sweep looks at its trials (curves for the median rule, ends an
    event missed) and takes over intents a crash left behind."""
    done = []
    for sw in active_sweeps(deps):
        try:
            result = apply_sweep(deps, sw.sweep_id, _observe_trials(deps), take_over=True)
        except Exception as exc:  # one sweep's trouble must not stop the others
            log.warning("reconciling sweep %s failed: %s", sw.sweep_id, exc)
            continue
        if result is not None:
            done.append(result)
    return done


def cancel_sweep(deps: Deps, sweep_id: str, reason: str = "cancelled by an operator") -> Sweep:
    """Cancel a sweep: pending trials never start, running ones are cancelled."""
    sw = apply_sweep(deps, sweep_id, [SweepCancelRequested(reason)])
    if sw is None:
        raise UnknownSweep(f"no sweep {sweep_id!r}")
    return sw


def sweep_summary(sw: Sweep) -> dict[str, Any]:
    """A sweep as people, the CLI and the demo read it."""
    return {"sweep_id": sw.sweep_id, "pipeline": sw.pipeline, "status": str(sw.status),
            "end_reason": sw.end_reason, "best": sw.best, "model_name": sw.model_name,
            "trials": [sweep.summary(t) for t in sw.trials],
            "history": [{"at": at, "what": what} for at, what in sw.history]}
