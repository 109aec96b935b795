"""In-memory twins of the Model Registry and Experiments ports (tests/fakes)."""

from __future__ import annotations

import threading
from dataclasses import replace

from spotorch.ports.registry import (
    ExperimentRun,
    ModelUpload,
    ModelVersion,
    RegistryError,
    context_id,
    model_id,
)

DEFAULT_ALIAS = "default"  # Vertex gives the first version of a model this alias


class MemoryModelRegistry:
    """ModelRegistry in memory: versions per model, failures injectable."""
    def __init__(self, project: str = "local") -> None:
        self.project = project
        self.versions: dict[str, list[ModelVersion]] = {}  # model name -> versions in order
        self.uploads = 0  # UploadModel calls made (a redelivery must not add one)
        self.fail_next: RegistryError | None = None
        self.alias_moves = 0  # MergeVersionAliases calls made
        self._lock = threading.RLock()

    def upload(self, upload: ModelUpload) -> str:
        """ModelRegistry.upload: a new version, or the one this run already uploaded."""
        with self._lock:
            if self.fail_next is not None:
                exc, self.fail_next = self.fail_next, None
                raise exc
            model = (f"projects/{self.project}/locations/{upload.region}/models/"
                     f"{model_id(upload.pipeline)}")
            versions = self.versions.setdefault(model, [])
            for existing in versions:
                if existing.labels.get("spotorch_run") == upload.labels.get("spotorch_run"):
                    return existing.name
            self.uploads += 1
            number = str(len(versions) + 1)
            aliases = tuple(dict.fromkeys(((DEFAULT_ALIAS,) if not versions else ())
                                          + upload.aliases))
            # An alias names one version of a model: applying it moves it from the others.
            versions[:] = [replace(v, aliases=tuple(a for a in v.aliases if a not in aliases))
                           for v in versions]
            version = ModelVersion(name=f"{model}@{number}", version_id=number,
                                   display_name=upload.display_name,
                                   artifact_uri=upload.artifact_uri,
                                   serving_image=upload.serving_image,
                                   labels=dict(upload.labels), aliases=aliases)
            versions.append(version)
            return version.name

    def version(self, name: str) -> ModelVersion:
        """ModelRegistry.version: the stored version by MODEL@VERSION_ID or MODEL@ALIAS (as
        Vertex resolves a name); NOT_FOUND (permanent) if absent."""
        model, _, wanted = name.partition("@")
        for version in self.versions.get(model, []):
            if version.version_id == wanted or wanted in version.aliases:
                return version
        raise RegistryError(f"no model version {name}", permanent=True, code="NOT_FOUND")

    def move_alias(self, name: str, alias: str) -> None:
        """ModelRegistry.move_alias: the alias leaves the other versions of the model."""
        with self._lock:
            if self.fail_next is not None:
                exc, self.fail_next = self.fail_next, None
                raise exc
            self.version(name)
            model, _, number = name.partition("@")
            self.alias_moves += 1
            self.versions[model] = [
                replace(v, aliases=tuple(dict.fromkeys((*v.aliases, alias))) if
                        v.version_id == number else tuple(a for a in v.aliases if a != alias))
                for v in self.versions[model]]


class MemoryExperimentTracker:
    """ExperimentTracker in memory: runs by context name, children per experiment."""
    def __init__(self, project: str = "local") -> None:
        self.project = project
        self.runs: dict[str, ExperimentRun] = {}
        self.children: dict[str, list[str]] = {}

    def _store(self, region: str) -> str:
        return f"projects/{self.project}/locations/{region}/metadataStores/default"

    def log_run(self, run: ExperimentRun) -> str:
        """ExperimentTracker.log_run: stored under its context name; logging again replaces it."""
        experiment = f"{self._store(run.region)}/contexts/{context_id(run.experiment)}"
        name = f"{self._store(run.region)}/contexts/{context_id(f'{run.experiment}-{run.run_id}')}"
        self.runs[name] = run
        children = self.children.setdefault(experiment, [])
        if name not in children:
            children.append(name)
        return name

    def read_run(self, name: str) -> ExperimentRun:
        """ExperimentTracker.read_run: the stored run; NOT_FOUND (permanent) if absent."""
        try:
            return self.runs[name]
        except KeyError:
            raise RegistryError(f"no experiment run {name}", permanent=True,
                                code="NOT_FOUND") from None

    def runs_of(self, experiment: str, region: str) -> tuple[str, ...]:
        """ExperimentTracker.runs_of: the context names logged under the experiment, in order."""
        return tuple(self.children.get(
            f"{self._store(region)}/contexts/{context_id(experiment)}", ()))
