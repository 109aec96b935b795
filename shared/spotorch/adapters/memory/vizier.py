"""A study's bookkeeping and optimizer (Optuna), and the in-memory twin of the TrialSearch port.

StudyBook keeps a study's trials the way Vizier does (client ids, measurements, completion,
infeasible trials, the median stopping rule, the optimal trials) and asks a real optimizer for
each new suggestion: Optuna's TPE (multivariate, with the constant liar for trials still running;
its multi-objective form for several objectives). The Vertex emulator serves the same book over
gRPC (spotorch.local._vertex_vizier), so the twin and the emulator search alike; Vertex AI's own
default algorithm is Google's GP-bandit, which this is not (docs/vertex-emulator.md).
"""

from __future__ import annotations

import itertools
import statistics
import threading
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from spotorch.core.pareto import front
from spotorch.core.sweep_spec import Goal, Parameter, ParamValue, Scale
from spotorch.ports.vizier import (
    ACTIVE,
    COMPLETED,
    Measurement,
    SearchError,
    StudyConfig,
    StudyTrial,
)

STARTUP_TRIALS = 5  # random trials before TPE models the results
MEDIAN_MIN_COMPLETED = 3  # completed trials the median rule needs before it stops anyone


class StudyStateError(Exception):
    """A call the trial's state refuses (Vizier's FAILED_PRECONDITION)."""


@dataclass
class BookTrial:
    """One trial as the book keeps it."""

    id: int
    number: int  # the optimizer's trial number
    params: dict[str, ParamValue]
    client_id: str
    state: str = ACTIVE
    measurements: list[Measurement] = field(default_factory=list)
    final: dict[str, float] | None = None
    infeasible: bool = False
    infeasible_reason: str = ""


def _distribution(param: Parameter) -> Any:
    from optuna import distributions as d

    if param.values:
        return d.CategoricalDistribution(list(param.values))
    if param.low is None or param.high is None:
        raise ValueError(f"parameter {param.name}: give values, or low and high")
    log = param.scale is Scale.LOG
    if param.integer:
        return d.IntDistribution(int(param.low), int(param.high), log=log)
    return d.FloatDistribution(param.low, param.high, log=log)


def _sampler(config: StudyConfig, seed: int | None) -> Any:
    import optuna

    if config.algorithm == "RANDOM_SEARCH":
        return optuna.samplers.RandomSampler(seed=seed)
    if config.algorithm == "GRID_SEARCH":
        missing = [p.name for p in config.parameters if not p.values]
        if missing:
            raise ValueError(f"GRID_SEARCH needs discrete or categorical values for "
                             f"{', '.join(missing)}")
        return optuna.samplers.GridSampler({p.name: list(p.values) for p in config.parameters},
                                           seed=seed)
    with warnings.catch_warnings():  # multivariate and constant_liar are marked experimental
        warnings.simplefilter("ignore")
        return optuna.samplers.TPESampler(seed=seed, n_startup_trials=STARTUP_TRIALS,
                                          multivariate=True, constant_liar=True)


class StudyBook:
    """One study: its trials, and the optimizer that suggests the next ones."""

    def __init__(self, name: str, config: StudyConfig, seed: int | None = None) -> None:
        import optuna

        if not config.parameters:
            raise ValueError("a study needs at least one parameter")
        if not config.objectives:
            raise ValueError("a study needs at least one metric")
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        self.name = name
        self.config = config
        self.trials: list[BookTrial] = []
        self._space = {p.name: _distribution(p) for p in config.parameters}
        self._grid = len(list(itertools.product(*(p.values for p in config.parameters)))) \
            if config.algorithm == "GRID_SEARCH" else None
        self._study = optuna.create_study(
            directions=["minimize" if o.goal is Goal.MINIMIZE else "maximize"
                        for o in config.objectives],
            sampler=_sampler(config, seed))
        self.lock = threading.RLock()

    def trial(self, trial_id: int) -> BookTrial:
        """The trial with this id (KeyError when unknown)."""
        if not 0 < trial_id <= len(self.trials):
            raise KeyError(trial_id)
        return self.trials[trial_id - 1]

    def suggest(self, client_id: str, count: int) -> list[BookTrial]:
        """This client's active trials first, then new ones, `count` in all (fewer once a grid
        is used up)."""
        mine = [t for t in self.trials if t.client_id == client_id and t.state != COMPLETED]
        out = mine[:count]
        while len(out) < count and (self._grid is None or len(self.trials) < self._grid):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                asked = self._study.ask(self._space)
            trial = BookTrial(id=len(self.trials) + 1, number=asked.number,
                              params=dict(asked.params), client_id=client_id)
            self.trials.append(trial)
            out.append(trial)
        return out

    def measure(self, trial_id: int, measurement: Measurement) -> BookTrial:
        """Add an intermediate measurement to an active trial."""
        trial = self.trial(trial_id)
        if trial.state == COMPLETED:
            raise StudyStateError(f"trial {trial_id} is completed: no more measurements")
        trial.measurements.append(measurement)
        return trial

    def complete(self, trial_id: int, final: Mapping[str, float] | None, *,
                 infeasible: bool = False, reason: str = "") -> BookTrial:
        """Complete a trial: its final values (the last measurement's when none are given) go to
        the optimizer; an infeasible trial, or one without every objective, counts as failed."""
        import optuna

        trial = self.trial(trial_id)
        if trial.state == COMPLETED:
            raise StudyStateError(f"trial {trial_id} is already completed")
        if final is None and not infeasible and trial.measurements:
            final = dict(trial.measurements[-1].metrics)
        trial.state = COMPLETED
        trial.infeasible, trial.infeasible_reason = infeasible, reason if infeasible else ""
        trial.final = None if infeasible or final is None else dict(final)
        names = [o.name for o in self.config.objectives]
        if trial.final is not None and all(n in trial.final for n in names):
            self._study.tell(trial.number, [trial.final[n] for n in names])
        else:
            self._study.tell(trial.number, state=optuna.trial.TrialState.FAIL)
        return trial

    def should_stop(self, trial_id: int) -> bool:
        """The median rule on the first objective (Vizier's median_automated_stopping_spec): a
        trial whose best value so far is worse than the median of the completed trials' running
        averages up to its last step should stop."""
        trial = self.trial(trial_id)
        if not self.config.median_stopping or trial.state == COMPLETED or not trial.measurements:
            return False
        objective = self.config.objectives[0]
        step = trial.measurements[-1].step
        own = [m.metrics[objective.name] for m in trial.measurements
               if objective.name in m.metrics]
        averages = []
        for other in self.trials:
            if other is trial or other.state != COMPLETED or other.infeasible:
                continue
            values = [m.metrics[objective.name] for m in other.measurements
                      if m.step <= step and objective.name in m.metrics]
            if values:
                averages.append(statistics.fmean(values))
        if not own or len(averages) < MEDIAN_MIN_COMPLETED:
            return False
        median = statistics.median(averages)
        return (min(own) > median if objective.goal is Goal.MINIMIZE else max(own) < median)

    def optimal(self) -> list[BookTrial]:
        """The best feasible completed trials (every tie), or the Pareto front of several."""
        names = [o.name for o in self.config.objectives]
        done = {t.id: t.final for t in self.trials
                if t.state == COMPLETED and t.final is not None and all(n in t.final for n in names)}
        return [self.trial(i) for i in front(done, self.config.objectives)]


def snapshot(book: StudyBook, trial: BookTrial) -> StudyTrial:
    """The port's view of a book trial."""
    return StudyTrial(name=f"{book.name}/trials/{trial.id}", state=trial.state,
                      params=dict(trial.params), client_id=trial.client_id,
                      measurements=tuple(trial.measurements),
                      final=dict(trial.final) if trial.final is not None else None,
                      infeasible=trial.infeasible, infeasible_reason=trial.infeasible_reason)


class MemoryTrialSearch:
    """TrialSearch in memory: studies by name, one StudyBook each; failures injectable."""

    def __init__(self, project: str = "local", *, seed: int | None = 0) -> None:
        self.project = project
        self.seed = seed
        self.books: dict[str, StudyBook] = {}
        self.suggest_calls = 0
        self.fail_next: SearchError | None = None
        self._ids = itertools.count(1)
        self._lock = threading.Lock()

    def _failing(self) -> None:
        if self.fail_next is not None:
            exc, self.fail_next = self.fail_next, None
            raise exc

    def _book(self, trial_name: str) -> tuple[StudyBook, int]:
        study, _, tid = trial_name.rpartition("/trials/")
        book = self.books.get(study)
        if book is None or not tid.isdigit() or not 0 < int(tid) <= len(book.trials):
            raise SearchError(f"no trial {trial_name}", permanent=True, code="NOT_FOUND")
        return book, int(tid)

    def _study(self, name: str) -> StudyBook:
        book = self.books.get(name)
        if book is None:
            raise SearchError(f"no study {name}", permanent=True, code="NOT_FOUND")
        return book

    def study(self, config: StudyConfig) -> str:
        """TrialSearch.study: the study of this display name, or a new one."""
        with self._lock:
            self._failing()
            parent = f"projects/{self.project}/locations/{config.region}"
            for name, book in self.books.items():
                if name.startswith(f"{parent}/") and book.config.display_name == config.display_name:
                    return name
            name = f"{parent}/studies/{next(self._ids)}"
            try:
                self.books[name] = StudyBook(name, config, self.seed)
            except ValueError as exc:
                raise SearchError(str(exc), permanent=True, code="INVALID_ARGUMENT") from exc
            return name

    def suggest(self, study: str, client_id: str, count: int = 1) -> tuple[StudyTrial, ...]:
        """TrialSearch.suggest: the client's active trials, then new ones."""
        with self._lock:
            self._failing()
            self.suggest_calls += 1
            book = self._study(study)
            return tuple(snapshot(book, t) for t in book.suggest(client_id, count))

    def measure(self, trial: str, measurement: Measurement) -> bool:
        """TrialSearch.measure: False once the trial is completed."""
        with self._lock:
            self._failing()
            book, tid = self._book(trial)
            try:
                book.measure(tid, measurement)
            except StudyStateError:
                return False
            return True

    def complete(self, trial: str, final: Mapping[str, float] | None, *,
                 infeasible_reason: str = "") -> StudyTrial:
        """TrialSearch.complete: a completed trial is returned as it is."""
        with self._lock:
            self._failing()
            book, tid = self._book(trial)
            if book.trial(tid).state != COMPLETED:
                book.complete(tid, final, infeasible=bool(infeasible_reason),
                              reason=infeasible_reason)
            return snapshot(book, book.trial(tid))

    def should_stop(self, trial: str) -> bool:
        """TrialSearch.should_stop: the median rule when the study asked for it."""
        with self._lock:
            book, tid = self._book(trial)
            return book.should_stop(tid)

    def optimal(self, study: str) -> tuple[StudyTrial, ...]:
        """TrialSearch.optimal: the best trials or the front."""
        with self._lock:
            book = self._study(study)
            return tuple(snapshot(book, t) for t in book.optimal())

    def trial(self, name: str) -> StudyTrial:
        """TrialSearch.trial: one trial; NOT_FOUND if absent."""
        with self._lock:
            book, tid = self._book(name)
            return snapshot(book, book.trial(tid))

    def trials(self, study: str) -> tuple[StudyTrial, ...]:
        """TrialSearch.trials: every trial, oldest first."""
        with self._lock:
            book = self._study(study)
            return tuple(snapshot(book, t) for t in book.trials)
