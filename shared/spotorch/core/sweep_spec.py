"""What a pipeline says about hyperparameter sweeps and model registration (pure, no I/O)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Annotated

from spotorch.core.canary import ServeSpec
from spotorch.core.fields import Field, FileSection, Matches, Pairs
from spotorch.core.promotion import Evaluation, PromotionPolicy

ParamValue = int | float | str | bool


class SearchKind(StrEnum):
    """How trial parameters are chosen."""

    GRID = "grid"  # the cartesian product of every parameter's values, in order
    RANDOM = "random"  # independent draws with a seed: the same seed gives the same trials
    VIZIER = "vizier"  # Vertex AI Vizier suggests each trial from the results so far


class Goal(StrEnum):
    """Whether the sweep's metric is better low or high."""
    MINIMIZE = "minimize"
    MAXIMIZE = "maximize"


class Scale(StrEnum):
    """How a numeric parameter's values are spread: evenly, or evenly in their logarithm."""
    LINEAR = "linear"
    LOG = "log"


@dataclass(frozen=True)
class Parameter(FileSection):
    """One hyperparameter: a list of values (grid or random choice) or a range (random only)."""

    name: str
    values: tuple[ParamValue, ...] = ()
    low: float | None = None
    high: float | None = None
    scale: Scale = Scale.LINEAR
    integer: bool = False


@dataclass(frozen=True)
class MedianStopping(FileSection):
    """The median stopping rule: a running trial whose best value up to step s is worse than the
    median of the other trials' values at that same step s (each one's last report at or before
    s, among the trials that got that far) is stopped."""

    min_trials: int = 3  # other trials with a value at that step before the rule may stop anyone
    min_step: int = 1  # never stop a trial at an earlier step (warm-up)


@dataclass(frozen=True)
class MetricGoal(FileSection):
    """One objective of a sweep with several: a metric the trainer reports (or `cost`, the
    trial's cost from the ledger, in dollars) and which way is better."""

    FILE_REQUIRES = ("name", "goal")
    name: str
    goal: Goal = Goal.MINIMIZE


@dataclass(frozen=True)
class Bound(FileSection):
    """A business constraint on one metric, in the metric's own unit (latency_p95_ms:
    milliseconds per request at batch size 1; cost: dollars from the ledger; model_size_bytes)."""

    max: float | None = None
    min: float | None = None


@dataclass(frozen=True)
class SweepSpec(FileSection):
    """A pipeline's sweep: every trial is a spotorch run with its own parameters."""

    parameters: tuple[Parameter, ...]
    search: SearchKind = SearchKind.GRID
    seed: int = 0
    trials: int = 0  # 0: every grid point (grid); required for random
    parallelism: int = 2  # trials running at once
    metric: str = "loss"  # a metric the trainer reports (spotorch_trainer progress metrics)
    goal: Goal = Goal.MINIMIZE
    early_stopping: MedianStopping | None = None
    # Several objectives (the first is the quality the choice maximises within the constraints);
    # none: `metric` and `goal` alone, as before.
    metrics: tuple[MetricGoal, ...] = ()
    # {metric: {max: x, min: y}}: the chosen trial must meet every one; none meeting them
    # registers nothing.
    constraints: Annotated[tuple[tuple[str, Bound], ...], Pairs(str, Bound)] = ()

    @property
    def quality(self) -> str:
        """The metric whose curve a trial keeps and whose best value the choice seeks."""
        return self.metrics[0].name if self.metrics else self.metric

    @property
    def quality_goal(self) -> Goal:
        """Which way the quality metric is better."""
        return self.metrics[0].goal if self.metrics else self.goal


@dataclass(frozen=True)
class ModelRegistration(FileSection):
    """Register the model of a successful run (or a sweep's best trial) in Vertex AI Model Registry."""

    display_name: str = ""  # "": the pipeline's name
    serving_image: str = ""  # the serving container image (ModelContainerSpec.image_uri)
    labels: Annotated[tuple[tuple[str, str], ...], Pairs(
        Annotated[str, Matches(r"^[a-z][a-z0-9_-]{0,62}$", "must be a Vertex AI label key")],
        Annotated[str, Matches(r"^[a-z0-9_-]{0,63}$", "must be a Vertex AI label value")],
        max_entries=48)] = ()
    aliases: tuple[str, ...] = ("latest",)  # a sweep's winner also gets "best"
    region: str = ""  # "": the pipeline's first job region
    experiments: bool = True  # log params, final metrics and cost to Vertex AI Experiments
    # issue 37: the held-out data versions are evaluated on, and the gate that moves an alias
    evaluation: Annotated[Evaluation | None, Field(
        description="The held-out data every version is evaluated on (docs/promotion.md).")] = None
    promote: Annotated[PromotionPolicy | None, Field(
        description="Move an alias (production) to a new version only when it beats the "
                    "version holding it on the held-out data (docs/promotion.md).")] = None
    serve: Annotated[ServeSpec | None, Field(
        description="Serve the promoted version on a Vertex AI endpoint, a new one first as a "
                    "canary (docs/promotion.md).")] = None
