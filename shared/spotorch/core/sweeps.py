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
from dataclasses import asdict, dataclass, field, replace
from enum import StrEnum
from typing import Any, ClassVar

from spotorch.core import outbox
from spotorch.core.events import build_event
from spotorch.core.model import RunStatus
from spotorch.core.pareto import Choice, Limit, Objective, choose, front
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
    SUGGESTING = "SUGGESTING"  # a vizier trial whose parameters Vizier is suggesting
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
    # Every metric the run reported last (accuracy, latency_p95_ms, model_size_bytes, ...).
    metrics: Mapping[str, float] = field(default_factory=dict)
    study_trial: str | None = None  # search vizier: the Vizier trial this run is
    measured_step: int | None = None  # the last step measured on the Vizier trial
    end_reason: str | None = None  # why its run ended (a failed trial's reason)


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
class SuggestTrial:
    """Ask the sweep's Vizier study for a trial's parameters (client id: the trial's run id)."""

    id: str
    trial: int
    claimed_until: float = 0.0
    kind: ClassVar[str] = "suggest_trial"


@dataclass(frozen=True)
class MeasureTrial:
    """Add a trial's progress to its Vizier trial (AddTrialMeasurement)."""

    id: str
    trial: int
    step: int
    metrics: Mapping[str, float]
    claimed_until: float = 0.0
    kind: ClassVar[str] = "measure_trial"


@dataclass(frozen=True)
class CompleteStudyTrial:
    """Complete a trial's Vizier trial with its final values, or infeasible with the reason."""

    id: str
    trial: int
    final: Mapping[str, float] | None = None
    infeasible_reason: str = ""
    claimed_until: float = 0.0
    kind: ClassVar[str] = "complete_study_trial"


@dataclass(frozen=True)
class PublishSweepEvent:
    """Publish a sweep's event (an outbox intent), kept until it is sent."""
    id: str
    event: Mapping[str, Any]
    claimed_until: float = 0.0
    kind: ClassVar[str] = "publish"


SweepIntent = (StartTrial | StopTrial | RegisterModel | LogTrial | PublishSweepEvent
               | SuggestTrial | MeasureTrial | CompleteStudyTrial)
_INTENTS: Mapping[str, Any] = {t.kind: t for t in (StartTrial, StopTrial, RegisterModel, LogTrial,
                                                   PublishSweepEvent, SuggestTrial, MeasureTrial,
                                                   CompleteStudyTrial)}


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
    study: str | None = None  # search vizier: the study's resource name

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
                                    for p in t.get("curve", ())),
                     "metrics": {str(k): float(v) for k, v in (t.get("metrics") or {}).items()}})
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
    metrics: Mapping[str, float] = field(default_factory=dict)  # the run's last reported metrics
    end_reason: str | None = None


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
    verdict: str | None = None  # ... and the promotion gate's word on it (model.promote)
    experiment_run: str | None = None  # LogTrial's result
    study: str | None = None  # SuggestTrial's results: the study, the trial and its parameters
    study_trial: str | None = None
    params: Mapping[str, ParamValue] | None = None
    error: str | None = None  # an intent refused for good (a Vizier suggestion: its trial fails)


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
            "experiment_run": trial.experiment_run, "metrics": dict(trial.metrics),
            "study_trial": trial.study_trial}


# ---------------------------------------------------------------- objectives and the choice

COST = "cost"  # the objective and constraint name of a trial's cost (dollars, from the ledger)


def objectives(spec: SweepSpec) -> tuple[Objective, ...]:
    """The sweep's objectives: `metrics`, or its one `metric` with its `goal`."""
    return tuple(Objective(m.name, m.goal) for m in spec.metrics) or (
        Objective(spec.metric, spec.goal),)


def limits(spec: SweepSpec) -> tuple[Limit, ...]:
    """The sweep's constraints as limits on metric values."""
    return tuple(Limit(name, bound.max, bound.min) for name, bound in spec.constraints)


def trial_point(trial: Trial, spec: SweepSpec) -> dict[str, float]:
    """A trial's values by metric: what it reported, its cost, and its quality's final value."""
    point = {**{k: float(v) for k, v in trial.metrics.items()}, COST: round(trial.cost, 6)}
    if trial.metric is not None:
        point[spec.quality] = trial.metric
    return point


def choice(sweep: Sweep, spec: SweepSpec) -> Choice:
    """The front of the succeeded trials and the one chosen: the best quality within the
    constraints (spotorch.core.pareto.choose)."""
    points = {t.number: trial_point(t, spec) for t in sweep.trials
              if t.status is TrialStatus.SUCCEEDED}
    return choose(points, objectives(spec), limits(spec))


def trade_off(sweep: Sweep, spec: SweepSpec) -> dict[str, Any]:
    """The front, the constraints and why the chosen trial was chosen, as reports carry them."""
    made = choice(sweep, spec)
    points = {t.number: trial_point(t, spec) for t in sweep.trials}
    return {"search": str(spec.search),
            "objectives": [{"name": o.name, "goal": str(o.goal)} for o in objectives(spec)],
            "constraints": {name: {k: v for k, v in (("max", b.max), ("min", b.min))
                                   if v is not None} for name, b in spec.constraints},
            "pareto": list(made.front), "feasible": list(made.feasible),
            # the front among the trials meeting the constraints (where the choice is made)
            "pareto_feasible": [k for k in front({k: points[k] for k in made.feasible},
                                                 objectives(spec))],
            "chosen": made.chosen,
            "why": made.why, "misses": {str(k): list(v) for k, v in made.misses.items()}}


# ---------------------------------------------------------------- creating a sweep

def new_sweep(*, sweep_id: str, pipeline: Pipeline, spec: SweepSpec, now: float, data_uri: str,
              snapshot_id: str | None, register: bool = False, experiments: bool = False,
              objects: tuple[tuple[str, int], ...] = (),
              bigquery: Mapping[str, Any] | None = None) -> Sweep:
    """A new sweep: its trials planned, announced, and the first `parallelism` of them started;
    objects and bigquery: the snapshot's data, pinned for every trial."""
    if spec.search is SearchKind.VIZIER:
        if spec.trials <= 0:
            raise SweepError("a vizier search needs a number of trials")
        if not spec.parameters:
            raise SweepError("a sweep needs at least one parameter")
        params: tuple[dict[str, ParamValue], ...] = tuple({} for _ in range(spec.trials))
    else:
        params = trial_params(spec)
    trials = tuple(Trial(number=n, params=p, run_id=trial_run_id(sweep_id, n))
                   for n, p in enumerate(params, start=1))
    ctx = SweepContext(pipeline, spec, now, register, experiments)
    sweep = Sweep(sweep_id=sweep_id, pipeline=pipeline.name, status=SweepStatus.RUNNING,
                  created_at=now, updated_at=now, data_uri=data_uri, snapshot_id=snapshot_id,
                  trials=trials, objects=objects, bigquery=bigquery)
    sweep = _note(sweep, ctx, f"created with {len(trials)} trials")
    sweep = _publish(sweep, ctx, "sweep.created", status=str(sweep.status), trials=len(trials),
                     parallelism=spec.parallelism, metric=spec.quality, goal=str(spec.quality_goal),
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
    if isinstance(intent, SuggestTrial) and obs.study_trial:
        return _suggested(sweep, ctx, sweep.trial(intent.trial), obs)
    if isinstance(intent, SuggestTrial) and obs.error:
        return _not_suggested(sweep, ctx, sweep.trial(intent.trial), obs.error)
    if isinstance(intent, RegisterModel) and sweep.status is SweepStatus.REGISTERING:
        sweep = replace(sweep, model_name=obs.model_name)
        sweep = _note(sweep, ctx, f"model registered: {obs.model_name}"
                      + (f"; {obs.verdict}" if obs.verdict else ""))
        return _succeed(sweep, ctx)
    return sweep


def _on_deferred(sweep: Sweep, obs: SweepObservation, ctx: SweepContext) -> Sweep:
    assert isinstance(obs, SweepIntentDeferred)
    return replace(sweep, outbox=outbox.release(sweep.outbox, obs.intent_id, ctx.now))


def _suggested(sweep: Sweep, ctx: SweepContext, trial: Trial, obs: SweepIntentDone) -> Sweep:
    """Vizier suggested a trial's parameters: its run starts with them (a cancelled sweep
    completes the Vizier trial as infeasible instead)."""
    sweep = replace(sweep, study=obs.study or sweep.study)
    trial = replace(trial, study_trial=obs.study_trial)
    if trial.status is not TrialStatus.SUGGESTING:
        sweep = _with_trial(sweep, trial)
        sweep = _add(sweep, ctx, CompleteStudyTrial, trial=trial.number,
                     infeasible_reason=f"trial {trial.status.lower()} before it started")
        return _advance(sweep, ctx)
    trial = replace(trial, params=dict(obs.params or {}), status=TrialStatus.RUNNING)
    sweep = _with_trial(sweep, trial)
    sweep = _note(sweep, ctx, f"trial {trial.number} suggested by vizier: {obs.study_trial}")
    sweep = _add(sweep, ctx, StartTrial, trial=trial.number)
    sweep = _publish(sweep, ctx, "sweep.trial_started", trial=trial.number,
                     trial_run_id=trial.run_id, params=dict(trial.params))
    return _advance(sweep, ctx)


def _not_suggested(sweep: Sweep, ctx: SweepContext, trial: Trial, error: str) -> Sweep:
    """Vizier refused a trial's suggestion for good: the trial fails with why, and the sweep
    goes on (the next trial asks again; when every one is refused the sweep fails)."""
    if trial.status is not TrialStatus.SUGGESTING:
        return _advance(sweep, ctx)  # cancelled meanwhile: the sweep may end now
    trial = replace(trial, status=TrialStatus.FAILED, end_reason=error)
    sweep = _with_trial(sweep, trial)
    sweep = _note(sweep, ctx, f"trial {trial.number} FAILED: {error}")
    sweep = _publish(sweep, ctx, "sweep.trial_ended", **summary(trial))
    return _advance(sweep, ctx)


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
    if trial.status.ended or trial.status in (TrialStatus.PENDING, TrialStatus.SUGGESTING):
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
                    preemptions=obs.preemptions, metrics=dict(obs.metrics) or trial.metrics,
                    end_reason=obs.end_reason or trial.end_reason)
    before = sweep
    sweep = _with_trial(sweep, trial)
    sweep = _measure(sweep, ctx, trial)
    if status.ended:
        sweep = _trial_ended(sweep, ctx, trial)
    elif sweep == before:
        return sweep
    return _advance(sweep, ctx)


def _measure(sweep: Sweep, ctx: SweepContext, trial: Trial) -> Sweep:
    """A vizier trial's newer progress goes to its Vizier trial (also after a resume: the run,
    and so the Vizier trial, is the same)."""
    if trial.study_trial is None or not trial.curve or trial.status.ended:
        return sweep
    step, value = trial.curve[-1]
    if trial.measured_step is not None and step <= trial.measured_step:
        return sweep
    sweep = _with_trial(sweep, replace(trial, measured_step=step))
    return _add(sweep, ctx, MeasureTrial, trial=trial.number, step=step,
                metrics={ctx.spec.quality: value})


def _complete_study_trial(sweep: Sweep, ctx: SweepContext, trial: Trial) -> Sweep:
    """The ended trial's Vizier trial: its objectives' values, or infeasible with why."""
    if trial.study_trial is None:
        return sweep
    point = trial_point(trial, ctx.spec)
    names = [o.name for o in objectives(ctx.spec)]
    if trial.status is TrialStatus.SUCCEEDED:
        missing = [n for n in names if n not in point]
        if not missing:
            return _add(sweep, ctx, CompleteStudyTrial, trial=trial.number,
                        final={n: point[n] for n in names})
        reason = f"succeeded without reporting {', '.join(missing)}"
    elif trial.status is TrialStatus.STOPPED:  # its last measurement is its result
        return _add(sweep, ctx, CompleteStudyTrial, trial=trial.number)
    else:
        reason = f"run {trial.run_status}" + (f": {trial.end_reason}" if trial.end_reason else "")
    return _add(sweep, ctx, CompleteStudyTrial, trial=trial.number,
                infeasible_reason=reason[:500])


def _trial_ended(sweep: Sweep, ctx: SweepContext, trial: Trial) -> Sweep:
    sweep = _note(sweep, ctx, f"trial {trial.number} {trial.status}")
    sweep = _publish(sweep, ctx, "sweep.trial_ended", **summary(trial))
    sweep = _complete_study_trial(sweep, ctx, trial)
    if ctx.experiments:
        sweep = _add(sweep, ctx, LogTrial, trial=trial.number)
    best = choice(sweep, ctx.spec).chosen
    if best is not None and best != sweep.best:
        sweep = replace(sweep, best=best)
        sweep = _note(sweep, ctx, f"best so far: trial {best} ({ctx.spec.quality} "
                                  f"{sweep.trial(best).metric})")
    return sweep


def _on_evaluate(sweep: Sweep, obs: SweepObservation, ctx: SweepContext) -> Sweep:
    return _advance(sweep, ctx)


def _on_cancel(sweep: Sweep, obs: SweepObservation, ctx: SweepContext) -> Sweep:
    assert isinstance(obs, SweepCancelRequested)
    if sweep.status not in (SweepStatus.RUNNING, SweepStatus.REGISTERING):
        return sweep
    sweep = _to(sweep, SweepStatus.CANCELLING, ctx, obs.reason)
    for trial in sweep.trials:
        if trial.status in (TrialStatus.PENDING, TrialStatus.SUGGESTING):
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
    # A suggestion still out (retried by the tick) keeps the sweep open: its Vizier trial, when
    # it comes, is completed rather than left active.
    if all(t.status.ended for t in sweep.trials) and not any(
            isinstance(i, SuggestTrial) for i in sweep.outbox):
        sweep = _finish(sweep, ctx)
    return sweep


def _fill(sweep: Sweep, ctx: SweepContext) -> Sweep:
    running = sum(1 for t in sweep.trials if t.status in (
        TrialStatus.RUNNING, TrialStatus.STOPPING, TrialStatus.SUGGESTING))
    for trial in sweep.trials:
        if running >= max(ctx.spec.parallelism, 1):
            break
        if trial.status is TrialStatus.PENDING and ctx.spec.search is SearchKind.VIZIER:
            sweep = _with_trial(sweep, replace(trial, status=TrialStatus.SUGGESTING))
            sweep = _add(sweep, ctx, SuggestTrial, trial=trial.number)
            running += 1
        elif trial.status is TrialStatus.PENDING:
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
        verdict = median_verdict(trial, others, ctx.spec.quality_goal, rule)
        if verdict is None:
            continue
        step, own, median = verdict
        reason = (f"median stopping: best {ctx.spec.quality} {own:g} by step {step} is worse than "
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
    made = choice(sweep, ctx.spec)
    best = sweep.trial(made.chosen) if made.chosen is not None else None
    if best is None:
        why = ("no trial succeeded with a value of " f"{ctx.spec.quality}"
               if not made.misses else made.why)
        sweep = _to(sweep, SweepStatus.FAILED, ctx, why)  # registers nothing
        return _publish(sweep, ctx, "sweep.failed", **_result(sweep, ctx))
    sweep = replace(sweep, best=best.number)
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
            "metric": ctx.spec.quality, "goal": str(ctx.spec.quality_goal),
            "trade_off": trade_off(sweep, ctx.spec),
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


