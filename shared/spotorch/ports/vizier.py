"""The port for a sweep's search: a Vertex AI Vizier study that suggests trials and hears results."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

from spotorch.core.errors import ServiceCallFailed
from spotorch.core.pareto import Objective
from spotorch.core.sweep_spec import Parameter, ParamValue

ACTIVE = "ACTIVE"  # suggested, not yet completed (Vizier's REQUESTED and ACTIVE)
STOPPING = "STOPPING"
COMPLETED = "COMPLETED"


@dataclass(frozen=True)
class StudyConfig:
    """What a study searches: the sweep's parameters and objectives, in one region."""

    display_name: str  # the sweep's id: the same sweep always finds the same study
    region: str
    parameters: tuple[Parameter, ...]
    objectives: tuple[Objective, ...]
    algorithm: str = ""  # "": Vizier's default (Bayesian); "RANDOM_SEARCH"; "GRID_SEARCH"
    median_stopping: bool = False  # CheckTrialEarlyStoppingState applies the median rule


@dataclass(frozen=True)
class Measurement:
    """Metric values at a step."""

    step: int
    metrics: Mapping[str, float]


@dataclass(frozen=True)
class StudyTrial:
    """A trial of a study as Vizier reports it."""

    name: str  # projects/P/locations/L/studies/S/trials/T
    state: str  # ACTIVE, STOPPING or COMPLETED
    params: Mapping[str, ParamValue]
    client_id: str = ""
    measurements: tuple[Measurement, ...] = ()
    final: Mapping[str, float] | None = None
    infeasible: bool = False
    infeasible_reason: str = ""


class SearchError(ServiceCallFailed):
    """A study call failed; `permanent` says whether retrying can help."""


class TrialSearch(Protocol):
    """Vertex AI Vizier, as much as a sweep needs of it."""

    def study(self, config: StudyConfig) -> str:
        """The study named config.display_name in the region, created if missing; its name."""
        ...

    def suggest(self, study: str, client_id: str, count: int = 1) -> tuple[StudyTrial, ...]:
        """`count` trials for this client: its trials still active first, new ones for the rest
        (asking again with the same client id gives the same active trials)."""
        ...

    def measure(self, trial: str, measurement: Measurement) -> bool:
        """Add an intermediate measurement; False if the trial was completed already."""
        ...

    def complete(self, trial: str, final: Mapping[str, float] | None, *,
                 infeasible_reason: str = "") -> StudyTrial:
        """Complete the trial with its final values, or as infeasible with the reason given;
        a trial completed before is returned as it is."""
        ...

    def should_stop(self, trial: str) -> bool:
        """Whether the study's stopping rule says the trial should stop now."""
        ...

    def optimal(self, study: str) -> tuple[StudyTrial, ...]:
        """The optimal trials: the best one, or the Pareto front of several objectives."""
        ...

    def trial(self, name: str) -> StudyTrial:
        """One trial; SearchError(code NOT_FOUND) if absent."""
        ...

    def trials(self, study: str) -> tuple[StudyTrial, ...]:
        """Every trial of the study, oldest first."""
        ...
