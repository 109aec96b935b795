"""Sweeps, pure: a sweep is a set of trial runs; `decide_sweep` chooses what happens to it next.

The service (sweep_service.py) feeds it what the trial runs look like, writes the sweep in one
conditional write with its outbox, and carries out the intents: start or stop a trial run,
register the winner's model, log a trial to Vertex AI Experiments, publish an event.
"""

from __future__ import annotations

import itertools
import math
import random
import statistics
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, replace
from enum import StrEnum
from typing import Any, ClassVar

from spotorch.core import outbox
from spotorch.core.events import build_event
from spotorch.core.model import RunStatus
from spotorch.core.pipeline import Pipeline
from spotorch.core.sweep_spec import Goal, MedianStopping, Parameter, ParamValue, Scale, SearchKind, SweepSpec

CURVE_LIMIT = 200  # points kept per trial (the median rule needs values at the same steps)
HISTORY_LIMIT = 200
LEASE_S = outbox.LEASE_S


class SweepError(ValueError):
    """A sweep spec that cannot produce trials."""


# ---------------------------------------------------------------- trial parameters

def _draw(param: Parameter, rng: random.Random) -> ParamValue:
    if param.values:
        return param.values[rng.randrange(len(param.values))]
    if param.low is None or param.high is None:
        raise SweepError(f"parameter {param.name}: give values, or low and high")
    if param.scale is Scale.LOG:
        if param.low <= 0:
            raise SweepError(f"parameter {param.name}: a log scale needs low > 0")
        value = math.exp(rng.uniform(math.log(param.low), math.log(param.high)))
    else:
        value = rng.uniform(param.low, param.high)
    return round(value) if param.integer else value


def trial_params(spec: SweepSpec) -> tuple[dict[str, ParamValue], ...]:
    """The parameters of every trial, in order; the same spec always gives the same trials."""
    if not spec.parameters:
        raise SweepError("a sweep needs at least one parameter")
    if spec.search is SearchKind.GRID:
        missing = [p.name for p in spec.parameters if not p.values]
        if missing:
            raise SweepError(f"a grid needs values for {', '.join(missing)}")
        names = [p.name for p in spec.parameters]
        grid = [dict(zip(names, combo, strict=True))
                for combo in itertools.product(*(p.values for p in spec.parameters))]
        return tuple(grid[:spec.trials] if spec.trials else grid)
    if spec.trials <= 0:
        raise SweepError("a random search needs a number of trials")
    rng = random.Random(spec.seed)
    return tuple({p.name: _draw(p, rng) for p in spec.parameters} for _ in range(spec.trials))


# ---------------------------------------------------------------- state

class SweepStatus(StrEnum):
    """Where a sweep is in its life; SWEEP_TRANSITIONS says which moves are allowed."""
    RUNNING = "RUNNING"  # trials are started as slots free up
    REGISTERING = "REGISTERING"  # every trial ended; the winner's model is being registered
    CANCELLING = "CANCELLING"  # a stop was asked; waiting for running trials to end
    SUCCEEDED = "SUCCEEDED"  # at least one trial succeeded; `best` names the winner
    FAILED = "FAILED"  # every trial ended without a result
    CANCELLED = "CANCELLED"

    @property
    def terminal(self) -> bool:
        """Whether the sweep has ended and nothing more happens to it."""
        return self in _SWEEP_ENDINGS


_SWEEP_ENDINGS = frozenset({SweepStatus.SUCCEEDED, SweepStatus.FAILED, SweepStatus.CANCELLED})

SWEEP_TRANSITIONS: Mapping[SweepStatus, frozenset[SweepStatus]] = {
    SweepStatus.RUNNING: frozenset({SweepStatus.REGISTERING, SweepStatus.CANCELLING,
                                    SweepStatus.SUCCEEDED, SweepStatus.FAILED,
                                    SweepStatus.CANCELLED}),
    SweepStatus.REGISTERING: frozenset({SweepStatus.SUCCEEDED, SweepStatus.CANCELLING}),
    SweepStatus.CANCELLING: frozenset({SweepStatus.CANCELLED}),
    SweepStatus.SUCCEEDED: frozenset(),
    SweepStatus.FAILED: frozenset(),
    SweepStatus.CANCELLED: frozenset(),
}


class TrialStatus(StrEnum):
    """Where one trial is: waiting for a slot, running, stopping, or ended."""
    PENDING = "PENDING"  # not started: waits for a free slot
    RUNNING = "RUNNING"  # its run is active
    STOPPING = "STOPPING"  # early-stopped or cancelled; waiting for its run to end
    SUCCEEDED = "SUCCEEDED"
    STOPPED = "STOPPED"  # stopped early by the median rule
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"

    @property
    def ended(self) -> bool:
        """Whether the trial's run is over, whatever the outcome."""
        return self in _TRIAL_ENDINGS


_TRIAL_ENDINGS = frozenset({TrialStatus.SUCCEEDED, TrialStatus.STOPPED, TrialStatus.FAILED,
                            TrialStatus.CANCELLED})


@dataclass(frozen=True)
class Trial:
    """One trial of a sweep: its parameters, its run, and what that run reported."""
    number: int
    params: Mapping[str, ParamValue]
    run_id: str
    status: TrialStatus = TrialStatus.PENDING
    run_status: str | None = None
    metric: float | None = None  # the last value of the sweep's metric
    step: int | None = None
    curve: tuple[tuple[int, float], ...] = ()  # (step, metric) as the trial reported it
    stopped_early: bool = False
    cost: float = 0.0
    preemptions: int = 0
    experiment_run: str | None = None
    stop_reason: str | None = None  # why the median rule stopped it (its values and the median)


@dataclass(frozen=True)
class StartTrial:
    """Start a trial's run (an outbox intent)."""
    id: str
    trial: int
    claimed_until: float = 0.0
    kind: ClassVar[str] = "start_trial"


@dataclass(frozen=True)
class StopTrial:
    """Stop a trial's run early or on cancel, with why (an outbox intent)."""
    id: str
    trial: int
    reason: str
    claimed_until: float = 0.0
    kind: ClassVar[str] = "stop_trial"


@dataclass(frozen=True)
class RegisterModel:
    """Upload the winner's model as a new version of the pipeline's model (aliases latest, best)."""

    id: str
    trial: int
    run_id: str
    artifact_uri: str
    claimed_until: float = 0.0
    kind: ClassVar[str] = "register_model"


@dataclass(frozen=True)
class LogTrial:
    """Log an ended trial's parameters, final metrics and cost to Vertex AI Experiments."""

    id: str
    trial: int
    claimed_until: float = 0.0
    kind: ClassVar[str] = "log_trial"


@dataclass(frozen=True)
class PublishSweepEvent:
    """Publish a sweep's event (an outbox intent), kept until it is sent."""
    id: str
    event: Mapping[str, Any]
    claimed_until: float = 0.0
    kind: ClassVar[str] = "publish"


SweepIntent = StartTrial | StopTrial | RegisterModel | LogTrial | PublishSweepEvent
_INTENTS: Mapping[str, Any] = {t.kind: t for t in (StartTrial, StopTrial, RegisterModel, LogTrial,
                                                   PublishSweepEvent)}


@dataclass(frozen=True)
class Sweep:
    """A sweep as stored: its trials, the best so far, its history and outbox of intents."""
    sweep_id: str
    pipeline: str
    status: SweepStatus
    created_at: float
    data_uri: str
    snapshot_id: str | None
    trials: tuple[Trial, ...]
    best: int | None = None  # number of the best trial so far
    model_name: str | None = None  # the registered model version's resource name
    end_reason: str | None = None
    updated_at: float = 0.0
    history: tuple[tuple[float, str], ...] = ()
    outbox: tuple[SweepIntent, ...] = ()
    event_seq: int = 0
    intent_seq: int = 0
    # The snapshot's objects (name, generation) and BigQuery map, pinned when the sweep is made:
    # every trial's provenance records them, so each trial trains on exactly the same data.
    objects: tuple[tuple[str, int], ...] = ()
    bigquery: Mapping[str, Any] | None = None

    @property
    def active(self) -> bool:
        """Whether the sweep is still going (stored too, so queries can filter on it)."""
        return not self.status.terminal

    def trial(self, number: int) -> Trial:
        """The trial with this number (numbers start at 1)."""
        return self.trials[number - 1]

    def to_dict(self) -> dict[str, Any]:
        """The document stored in Firestore: no arrays of arrays, intents tagged by kind."""
        doc = asdict(self)
        doc["active"] = self.active
        doc["outbox"] = [{**asdict(i), "kind": i.kind} for i in self.outbox]
        # Firestore holds no arrays of arrays: pairs are stored as maps.
        doc["history"] = [{"at": at, "what": what} for at, what in self.history]
        doc["trials"] = [{**asdict(t), "curve": [{"step": s, "value": v} for s, v in t.curve]}
                         for t in self.trials]
        doc["objects"] = [{"name": name, "generation": gen} for name, gen in self.objects]
        doc["bigquery"] = dict(self.bigquery) if self.bigquery is not None else None
        return doc

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> Sweep:
        """The sweep a stored document holds (the inverse of to_dict)."""
        data = {k: v for k, v in doc.items() if k != "active"}
        data["status"] = SweepStatus(data["status"])
        data["trials"] = tuple(
            Trial(**{**t, "status": TrialStatus(t["status"]), "params": dict(t["params"]),
                     "curve": tuple((int(p["step"]), float(p["value"]))
                                    for p in t.get("curve", ()))})
            for t in data["trials"])
        data["outbox"] = tuple(_INTENTS[str(i["kind"])](**{k: v for k, v in i.items()
                                                           if k != "kind"})
                               for i in data.get("outbox", ()))
        data["history"] = tuple((float(h["at"]), str(h["what"])) for h in data.get("history", ()))
        data["objects"] = tuple((str(o["name"]), int(o["generation"]))
                                for o in data.get("objects") or ())
        return cls(**data)


def trial_run_id(sweep_id: str, number: int) -> str:
    """The run id of a sweep's trial: the sweep id and the trial number, so a retry finds the same run."""
    return f"{sweep_id}-t{number}"


# ---------------------------------------------------------------- observations

@dataclass(frozen=True)
class TrialSeen:
    """What a trial's run looks like now (read from its run document)."""

    trial: int
    run_status: RunStatus
    step: int | None = None
    metric: float | None = None
    curve: tuple[tuple[int, float], ...] = ()
    cost: float = 0.0
    preemptions: int = 0


@dataclass(frozen=True)
class SweepIntentDeferred:
    """An outbox intent was not carried out this time: its claim is released (core.outbox)."""
    intent_id: str
    reason: str = ""


@dataclass(frozen=True)
class SweepIntentDone:
    """An outbox intent was carried out, with what it produced."""
    intent_id: str
    model_name: str | None = None  # RegisterModel's result
    experiment_run: str | None = None  # LogTrial's result


@dataclass(frozen=True)
class SweepCancelRequested:
    """Someone asked to stop the sweep: running trials are cancelled, no new ones start."""
    reason: str


@dataclass(frozen=True)
class SweepEvaluate:
    """Re-evaluate the median rule and free slots (the tick)."""


SweepObservation = (TrialSeen | SweepIntentDone | SweepIntentDeferred | SweepCancelRequested
                    | SweepEvaluate)


@dataclass(frozen=True)
class SweepContext:
    """What decide_sweep needs besides the sweep: its pipeline, sweep spec and the time."""
    pipeline: Pipeline
    spec: SweepSpec
    now: float
    register: bool = False  # the pipeline names a model registration
    experiments: bool = False


class InvalidSweepTransition(Exception):
    """A move not in SWEEP_TRANSITIONS: a bug, never bad input."""


# ---------------------------------------------------------------- helpers

def _note(sweep: Sweep, ctx: SweepContext, what: str) -> Sweep:
    return replace(sweep, history=(*sweep.history, (ctx.now, what))[-HISTORY_LIMIT:])


def _to(sweep: Sweep, status: SweepStatus, ctx: SweepContext, reason: str = "") -> Sweep:
    if status is sweep.status:
        return sweep
    if status not in SWEEP_TRANSITIONS[sweep.status]:
        raise InvalidSweepTransition(f"{sweep.sweep_id}: {sweep.status} -> {status}")
    sweep = replace(sweep, status=status,
                    end_reason=reason if status.terminal else sweep.end_reason)
    return _note(sweep, ctx, f"status {status}" + (f": {reason}" if reason else ""))


def _intent_id(sweep: Sweep) -> tuple[Sweep, str]:
    return replace(sweep, intent_seq=sweep.intent_seq + 1), f"{sweep.sweep_id}/{sweep.intent_seq + 1}"


def _add(sweep: Sweep, ctx: SweepContext, make: Any, **fields: Any) -> Sweep:
    sweep, intent_id = _intent_id(sweep)
    intent = make(id=intent_id, claimed_until=ctx.now + LEASE_S, **fields)
    return replace(sweep, outbox=(*sweep.outbox, intent))


def _publish(sweep: Sweep, ctx: SweepContext, kind: str, **data: Any) -> Sweep:
    seq = sweep.event_seq + 1
    event = build_event(run_id=sweep.sweep_id, pipeline=sweep.pipeline, sequence=seq, kind=kind,
                        data={"sweep_id": sweep.sweep_id, **data}, time=ctx.now)
    return _add(replace(sweep, event_seq=seq), ctx, PublishSweepEvent, event=event)


def _with_trial(sweep: Sweep, trial: Trial) -> Sweep:
    trials = list(sweep.trials)
    trials[trial.number - 1] = trial
    return replace(sweep, trials=tuple(trials))


def _better(goal: Goal, a: float, b: float) -> bool:
    return a < b if goal is Goal.MINIMIZE else a > b


def _best_of(values: list[float], goal: Goal) -> float:
    return min(values) if goal is Goal.MINIMIZE else max(values)


def best_trial(sweep: Sweep, goal: Goal) -> Trial | None:
    """The succeeded trial with the best final metric (ties: the earlier trial)."""
    best: Trial | None = None
    for trial in sweep.trials:
        if trial.status is TrialStatus.SUCCEEDED and trial.metric is not None and (
                best is None or best.metric is None or _better(goal, trial.metric, best.metric)):
            best = trial
    return best


def summary(trial: Trial) -> dict[str, Any]:
    """A trial as events and the sweep's result report it."""
    return {"trial": trial.number, "trial_run_id": trial.run_id, "params": dict(trial.params),
            "status": str(trial.status), "metric": trial.metric, "step": trial.step,
            "stopped_early": trial.stopped_early, "stop_reason": trial.stop_reason,
            "cost": round(trial.cost, 6), "preemptions": trial.preemptions,
            "experiment_run": trial.experiment_run}


# ---------------------------------------------------------------- creating a sweep

def new_sweep(*, sweep_id: str, pipeline: Pipeline, spec: SweepSpec, now: float, data_uri: str,
              snapshot_id: str | None, register: bool = False, experiments: bool = False,
              objects: tuple[tuple[str, int], ...] = (),
              bigquery: Mapping[str, Any] | None = None) -> Sweep:
    """A new sweep: its trials planned, announced, and the first `parallelism` of them started;
    objects and bigquery: the snapshot's data, pinned for every trial."""
    params = trial_params(spec)
    trials = tuple(Trial(number=n, params=p, run_id=trial_run_id(sweep_id, n))
                   for n, p in enumerate(params, start=1))
    ctx = SweepContext(pipeline, spec, now, register, experiments)
    sweep = Sweep(sweep_id=sweep_id, pipeline=pipeline.name, status=SweepStatus.RUNNING,
                  created_at=now, updated_at=now, data_uri=data_uri, snapshot_id=snapshot_id,
                  trials=trials, objects=objects, bigquery=bigquery)
    sweep = _note(sweep, ctx, f"created with {len(trials)} trials")
    sweep = _publish(sweep, ctx, "sweep.created", status=str(sweep.status), trials=len(trials),
                     parallelism=spec.parallelism, metric=spec.metric, goal=str(spec.goal),
                     search=str(spec.search), data_uri=data_uri)
    return _fill(sweep, ctx)


# ---------------------------------------------------------------- deciding

def decide_sweep(sweep: Sweep, obs: SweepObservation, ctx: SweepContext) -> Sweep:
    """The sweep after one observation; terminal sweeps only finish their outbox."""
    new = _HANDLERS[type(obs)](sweep, obs, ctx)
    return new if new == sweep else replace(new, updated_at=ctx.now)


def _on_done(sweep: Sweep, obs: SweepObservation, ctx: SweepContext) -> Sweep:
    assert isinstance(obs, SweepIntentDone)
    intent = next((i for i in sweep.outbox if i.id == obs.intent_id), None)
    if intent is None:
        return sweep  # a redelivered result
    sweep = replace(sweep, outbox=tuple(i for i in sweep.outbox if i.id != obs.intent_id))
    if isinstance(intent, LogTrial) and obs.experiment_run:
        sweep = _with_trial(sweep, replace(sweep.trial(intent.trial),
                                           experiment_run=obs.experiment_run))
    if isinstance(intent, RegisterModel) and sweep.status is SweepStatus.REGISTERING:
        sweep = replace(sweep, model_name=obs.model_name)
        sweep = _note(sweep, ctx, f"model registered: {obs.model_name}")
        return _succeed(sweep, ctx)
    return sweep


def _on_deferred(sweep: Sweep, obs: SweepObservation, ctx: SweepContext) -> Sweep:
    assert isinstance(obs, SweepIntentDeferred)
    return replace(sweep, outbox=outbox.release(sweep.outbox, obs.intent_id, ctx.now))


_RUN_TO_TRIAL: Mapping[RunStatus, TrialStatus] = {
    **{s: TrialStatus.RUNNING for s in RunStatus if not s.terminal},
    **{s: TrialStatus.FAILED for s in RunStatus if s.terminal},
    RunStatus.SUCCEEDED: TrialStatus.SUCCEEDED,
    RunStatus.CANCELLED: TrialStatus.CANCELLED,
}


def _on_seen(sweep: Sweep, obs: SweepObservation, ctx: SweepContext) -> Sweep:
    assert isinstance(obs, TrialSeen)
    if not 0 < obs.trial <= len(sweep.trials):
        return sweep
    trial = sweep.trial(obs.trial)
    if trial.status.ended or trial.status is TrialStatus.PENDING:
        return sweep  # ended trials never change; a pending one has no run to look at
    status = _RUN_TO_TRIAL[obs.run_status]
    if trial.status is TrialStatus.STOPPING and not obs.run_status.terminal:
        status = TrialStatus.STOPPING
    if trial.stopped_early and obs.run_status is RunStatus.CANCELLED:
        status = TrialStatus.STOPPED
    metric = obs.metric if obs.metric is not None else trial.metric
    trial = replace(trial, status=status, run_status=str(obs.run_status), metric=metric,
                    step=obs.step if obs.step is not None else trial.step,
                    curve=obs.curve[-CURVE_LIMIT:] or trial.curve, cost=obs.cost,
                    preemptions=obs.preemptions)
    before = sweep
    sweep = _with_trial(sweep, trial)
    if status.ended:
        sweep = _trial_ended(sweep, ctx, trial)
    elif sweep == before:
        return sweep
    return _advance(sweep, ctx)


def _trial_ended(sweep: Sweep, ctx: SweepContext, trial: Trial) -> Sweep:
    sweep = _note(sweep, ctx, f"trial {trial.number} {trial.status}")
    sweep = _publish(sweep, ctx, "sweep.trial_ended", **summary(trial))
    if ctx.experiments:
        sweep = _add(sweep, ctx, LogTrial, trial=trial.number)
    best = best_trial(sweep, ctx.spec.goal)
    if best is not None and best.number != sweep.best:
        sweep = replace(sweep, best=best.number)
        sweep = _note(sweep, ctx, f"best so far: trial {best.number} ({ctx.spec.metric} "
                                  f"{best.metric})")
    return sweep


def _on_evaluate(sweep: Sweep, obs: SweepObservation, ctx: SweepContext) -> Sweep:
    return _advance(sweep, ctx)


def _on_cancel(sweep: Sweep, obs: SweepObservation, ctx: SweepContext) -> Sweep:
    assert isinstance(obs, SweepCancelRequested)
    if sweep.status not in (SweepStatus.RUNNING, SweepStatus.REGISTERING):
        return sweep
    sweep = _to(sweep, SweepStatus.CANCELLING, ctx, obs.reason)
    for trial in sweep.trials:
        if trial.status is TrialStatus.PENDING:
            sweep = _with_trial(sweep, replace(trial, status=TrialStatus.CANCELLED))
        elif trial.status is TrialStatus.RUNNING:
            sweep = _with_trial(sweep, replace(trial, status=TrialStatus.STOPPING))
            sweep = _add(sweep, ctx, StopTrial, trial=trial.number, reason=obs.reason)
    return _advance(sweep, ctx)


_HANDLERS: Mapping[type, Callable[[Sweep, SweepObservation, SweepContext], Sweep]] = {
    TrialSeen: _on_seen,
    SweepIntentDone: _on_done,
    SweepIntentDeferred: _on_deferred,
    SweepCancelRequested: _on_cancel,
    SweepEvaluate: _on_evaluate,
}


def _advance(sweep: Sweep, ctx: SweepContext) -> Sweep:
    """Stop what the median rule condemns, fill free slots, finish when every trial ended."""
    if sweep.status is SweepStatus.RUNNING and ctx.spec.early_stopping is not None:
        sweep = _median_stop(sweep, ctx, ctx.spec.early_stopping)
    if sweep.status is SweepStatus.RUNNING:
        sweep = _fill(sweep, ctx)
    if all(t.status.ended for t in sweep.trials):
        sweep = _finish(sweep, ctx)
    return sweep


def _fill(sweep: Sweep, ctx: SweepContext) -> Sweep:
    running = sum(1 for t in sweep.trials if t.status in (TrialStatus.RUNNING, TrialStatus.STOPPING))
    for trial in sweep.trials:
        if running >= max(ctx.spec.parallelism, 1):
            break
        if trial.status is TrialStatus.PENDING:
            sweep = _with_trial(sweep, replace(trial, status=TrialStatus.RUNNING))
            sweep = _add(sweep, ctx, StartTrial, trial=trial.number)
            sweep = _publish(sweep, ctx, "sweep.trial_started", trial=trial.number,
                             trial_run_id=trial.run_id, params=dict(trial.params))
            running += 1
    return sweep


def median_verdict(trial: Trial, others: list[Trial], goal: Goal,
                   rule: MedianStopping) -> tuple[int, float, float] | None:
    """(step, trial's best so far, median of the others at that step) when the trial should stop."""
    if not trial.curve:
        return None
    step = trial.curve[-1][0]
    if step < rule.min_step:
        return None
    # Each other trial's value as of that step: its last report at or before it, provided it
    # got that far (trainers that report by time rarely report at exactly the same steps).
    at_step = [[v for s, v in other.curve if s <= step][-1] for other in others
               if other.curve and other.curve[-1][0] >= step
               and any(s <= step for s, _ in other.curve)]
    if len(at_step) < rule.min_trials:
        return None
    median = statistics.median(at_step)
    own = _best_of([v for s, v in trial.curve if s <= step], goal)
    return (step, own, median) if _better(goal, median, own) else None


def _median_stop(sweep: Sweep, ctx: SweepContext, rule: MedianStopping) -> Sweep:
    for trial in sweep.trials:
        if trial.status is not TrialStatus.RUNNING:
            continue
        others = [t for t in sweep.trials if t.number != trial.number and t.curve]
        verdict = median_verdict(trial, others, ctx.spec.goal, rule)
        if verdict is None:
            continue
        step, own, median = verdict
        reason = (f"median stopping: best {ctx.spec.metric} {own:g} by step {step} is worse than "
                  f"the median {median:g} of the other trials at that step")
        sweep = _with_trial(sweep, replace(trial, status=TrialStatus.STOPPING, stopped_early=True,
                                           stop_reason=reason))
        sweep = _add(sweep, ctx, StopTrial, trial=trial.number, reason=reason)
        sweep = _note(sweep, ctx, f"trial {trial.number} stopped early: {reason}")
        sweep = _publish(sweep, ctx, "sweep.trial_stopped", trial=trial.number,
                         trial_run_id=trial.run_id, step=step, value=own, median=median, reason=reason)
    return sweep


def _finish(sweep: Sweep, ctx: SweepContext) -> Sweep:
    if sweep.status is SweepStatus.CANCELLING:
        sweep = _to(sweep, SweepStatus.CANCELLED, ctx, sweep.end_reason or "cancelled")
        return _publish(sweep, ctx, "sweep.cancelled", **_result(sweep, ctx))
    if sweep.status is not SweepStatus.RUNNING:
        return sweep
    best = best_trial(sweep, ctx.spec.goal)
    if best is None:
        sweep = _to(sweep, SweepStatus.FAILED, ctx, "no trial succeeded with a value of "
                                                    f"{ctx.spec.metric}")
        return _publish(sweep, ctx, "sweep.failed", **_result(sweep, ctx))
    if ctx.register:
        sweep = _to(sweep, SweepStatus.REGISTERING, ctx, f"registering trial {best.number}")
        return _add(sweep, ctx, RegisterModel, trial=best.number, run_id=best.run_id,
                    artifact_uri=ctx.pipeline.run_output_uri(best.run_id))
    return _succeed(sweep, ctx)


def _succeed(sweep: Sweep, ctx: SweepContext) -> Sweep:
    best = sweep.trial(sweep.best) if sweep.best else None
    sweep = _to(sweep, SweepStatus.SUCCEEDED, ctx,
                f"best trial {best.number}" if best else "done")
    return _publish(sweep, ctx, "sweep.succeeded", **_result(sweep, ctx))


def _result(sweep: Sweep, ctx: SweepContext) -> dict[str, Any]:
    best = sweep.trial(sweep.best) if sweep.best else None
    return {"status": str(sweep.status), "reason": sweep.end_reason,
            "metric": ctx.spec.metric, "goal": str(ctx.spec.goal),
            "trials": len(sweep.trials),
            "stopped_early": sum(1 for t in sweep.trials if t.stopped_early),
            "best": summary(best) if best else None, "model_name": sweep.model_name,
            "cost_estimate": round(sum(t.cost for t in sweep.trials), 6)}


def claimable(sweep: Sweep, now: float) -> tuple[SweepIntent, ...]:
    """The outbox intents not leased to someone carrying them out right now (core.outbox)."""
    return outbox.claimable(sweep.outbox, now)


def claim(sweep: Sweep, intents: tuple[SweepIntent, ...], now: float) -> Sweep:
    """The sweep with these intents leased for LEASE_S, so a concurrent worker skips them."""
    return replace(sweep, outbox=outbox.claim(sweep.outbox, (i.id for i in intents), now, LEASE_S))


