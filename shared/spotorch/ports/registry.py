"""Ports for where a trained model goes: Vertex AI Model Registry and Vertex AI Experiments."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

from spotorch.core.errors import ServiceCallFailed
from spotorch.core.sweep_spec import ParamValue

# Labels on every registered model version (keys as Vertex allows them: lowercase, underscores).
LABEL_MODEL_RUN = "spotorch_run"
LABEL_MODEL_PIPELINE = "spotorch_pipeline"
LABEL_MODEL_SNAPSHOT = "spotorch_snapshot"
LABEL_MODEL_SWEEP = "spotorch_sweep"
ALIAS_LATEST = "latest"
ALIAS_BEST = "best"


def model_id(pipeline: str) -> str:
    """The pipeline's model id: lowercase letters, digits, - and _ (at most 63)."""
    clean = "".join(c if c.isalnum() or c in "-_" else "-" for c in pipeline.lower())
    return (clean if clean[:1].isalnum() else f"m{clean}")[:63]


def context_id(text: str) -> str:
    """A metadata context id: lowercase letters, digits and -; starts with a letter or digit."""
    clean = "".join(c if c.isalnum() else "-" for c in text.lower()).strip("-")
    return (clean or "x")[:128]


@dataclass(frozen=True)
class ModelUpload:
    """One model version to register: the pipeline's model gets a new version per upload."""

    pipeline: str
    run_id: str  # the version is found again by this label (an upload retried after a crash)
    region: str
    display_name: str
    artifact_uri: str
    serving_image: str
    labels: Mapping[str, str] = field(default_factory=dict)
    aliases: tuple[str, ...] = (ALIAS_LATEST,)


@dataclass(frozen=True)
class ModelVersion:
    """A registered version as the registry reports it."""

    name: str  # projects/P/locations/L/models/M@V
    version_id: str
    display_name: str
    artifact_uri: str
    serving_image: str
    labels: Mapping[str, str]
    aliases: tuple[str, ...]


class RegistryError(ServiceCallFailed):
    """A registry or experiments call failed; `permanent` says whether retrying can help."""


class ModelRegistry(Protocol):
    """Vertex AI Model Registry, as much as spotorch needs of it."""

    def upload(self, upload: ModelUpload) -> str:
        """Register a new version of the pipeline's model and return its name (…/models/M@V).

        If a version carrying this run's label exists already, return it: a redelivered or
        retried upload never registers the same run twice. The aliases move to the new version.
        """
        ...

    def version(self, name: str) -> ModelVersion:
        """One version by its name (…/models/M@V); RegistryError(code NOT_FOUND) if absent."""
        ...

    def move_alias(self, name: str, alias: str) -> None:
        """Give the version `name` (…/models/M@V) the alias, which leaves the version holding it
        (MergeVersionAliases); idempotent."""
        ...


@dataclass(frozen=True)
class ExperimentRun:
    """One spotorch run (or trial) as a run of the pipeline's experiment."""

    experiment: str  # the pipeline
    run_id: str
    region: str
    params: Mapping[str, ParamValue] = field(default_factory=dict)
    metrics: Mapping[str, float] = field(default_factory=dict)  # final metrics, cost, savings
    state: str = "COMPLETE"  # COMPLETE, FAILED or CANCELLED (the SDK's Execution states)
    # What the run trained on and with (spotorch.core.provenance.metadata): digests, seed,
    # pinning; stored in the run context's metadata beside the SDK's own keys.
    provenance: Mapping[str, str] = field(default_factory=dict)


class ExperimentTracker(Protocol):
    """Vertex AI Experiments (MetadataService contexts)."""

    def log_run(self, run: ExperimentRun) -> str:
        """Create (or update) the experiment run and return its context name; idempotent."""
        ...

    def read_run(self, name: str) -> ExperimentRun:
        """The experiment run as stored; RegistryError(code NOT_FOUND) if absent."""
        ...

    def runs_of(self, experiment: str, region: str) -> tuple[str, ...]:
        """Context names of the experiment's runs."""
        ...
