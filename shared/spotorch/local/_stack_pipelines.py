"""The pipelines a local stack serves: each file checked on its own, the valid ones made active.

The functions read every file of SPOTORCH_PIPELINES and fail on any bad one (spotorch.spec.loader),
so the stack points them at a directory of its own holding only the files that passed; a bad
file is reported with every problem and left out, and the others keep working.
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from spotorch.core.pipeline import Pipeline
from spotorch.local._stack_config import repo_file
from spotorch.spec.compiled import write_compiled

# Environment variable names a route target may name (the notifier's own rule).
_ENV_NAME = re.compile(r"^[A-Z][A-Z0-9_]*$")


@dataclass(frozen=True)
class RouteInfo:
    """One alert route: which channel, which target (env name, sm:// reference, or none)."""

    channel: str
    target: str


@dataclass(frozen=True)
class LoadedPipeline:
    """A pipeline file that passed validation, with what the stack needs from it."""

    name: str
    file: Path
    trigger: str  # gs://bucket/prefix
    buckets: tuple[str, ...]
    routes: tuple[RouteInfo, ...]
    pipeline: Pipeline | None = field(default=None, compare=False, repr=False)  # as validated


@dataclass(frozen=True)
class PipelineSet:
    """What a pipelines directory holds: the valid pipelines and the files that were left out."""

    source: Path
    loaded: tuple[LoadedPipeline, ...]
    rejected: Mapping[str, tuple[str, ...]]  # file -> every problem, as config reports it

    @property
    def buckets(self) -> tuple[str, ...]:
        return tuple(sorted({b for p in self.loaded for b in p.buckets}))

    @property
    def landing_buckets(self) -> tuple[str, ...]:
        """The buckets the pipelines watch: versioned, as production's must be (a rerun reads
        an object's recorded generation after it was overwritten; docs/reproducibility.md)."""
        return tuple(sorted({p.pipeline.trigger.bucket for p in self.loaded
                             if p.pipeline is not None and p.pipeline.trigger.bucket}))

    @property
    def routes(self) -> tuple[RouteInfo, ...]:
        return tuple(dict.fromkeys(r for p in self.loaded for r in p.routes))

    def to_json(self) -> dict[str, Any]:
        return {"source": str(self.source),
                "loaded": [{"name": p.name, "file": str(p.file), "trigger": p.trigger,
                            "buckets": list(p.buckets)} for p in self.loaded],
                "rejected": {f: list(problems) for f, problems in self.rejected.items()},
                "buckets": list(self.buckets),
                "unrouted": sorted({f"{r.channel}: {r.target}" for r in unrouted(self.routes)})}


def default_pipelines_dir(cwd: Path) -> Path:
    """./pipelines when there is one, else the examples shipped with spotorch."""
    own = cwd / "pipelines"
    return own if own.is_dir() else repo_file("examples", "pipelines")


def _bucket(uri: str | None) -> str | None:
    if not uri or not uri.startswith("gs://"):
        return None
    return uri.removeprefix("gs://").split("/", 1)[0] or None


def _describe(pipeline: Any, file: Path) -> LoadedPipeline:
    source = pipeline.trigger.bigquery
    # A BigQuery trigger's export bucket holds the runs' data.
    step = pipeline.preprocess  # its outputs (and its template) live in buckets too (issue 39)
    uris = (pipeline.checkpoint_uri, pipeline.output_uri, pipeline.job.base_output_uri,
            pipeline.job.staging_uri, source.export_uri if source is not None else None,
            step.output_uri if step is not None else None,
            step.template_uri if step is not None else None)
    buckets = [b for b in (pipeline.trigger.bucket, *(_bucket(u) for u in uris)) if b]
    return LoadedPipeline(
        name=pipeline.name, file=file,
        trigger=(f"bigquery:{','.join(source.tables)}" if source is not None
                 else f"gs://{pipeline.trigger.bucket}/{pipeline.trigger.prefix}"),
        buckets=tuple(dict.fromkeys(buckets)),
        routes=tuple(RouteInfo(r.channel, r.target) for r in pipeline.routes), pipeline=pipeline)


def check_pipelines(source: Path, *, dataflow: bool = True, dataproc: bool = True) -> PipelineSet:
    """Check every pipeline file below source on its own; a second file with a name already
    taken is left out too (the functions would refuse both); without the local Dataflow
    (dataflow False), a pipeline with a preprocess step is left out, saying so."""
    from spotorch.spec.loader import check_file, pipeline_files

    loaded: dict[str, LoadedPipeline] = {}
    rejected: dict[str, tuple[str, ...]] = {}
    if not source.exists():
        return PipelineSet(source, (), {str(source): ("no such file or directory",)})
    for file in pipeline_files(source):
        pipeline, problems = check_file(file)
        if pipeline is None:
            rejected[str(file)] = tuple(str(p) for p in problems)
        elif pipeline.preprocess is not None and str(pipeline.preprocess.kind) == "spark" \
                and not dataproc:  # issue 42
            rejected[str(file)] = (f"{file}: preprocess: this local stack runs no Dataproc; "
                                   "start it with dataproc=True (spotorch dev up --dataproc)",)
        elif pipeline.preprocess is not None and str(pipeline.preprocess.kind) != "spark" \
                and not dataflow:
            rejected[str(file)] = (f"{file}: preprocess: this local stack runs no Dataflow; "
                                   "start it with dataflow=True (spotorch dev up --dataflow)",)
        elif pipeline.name in loaded:
            rejected[str(file)] = (f"{file}: name: pipeline {pipeline.name!r} is already "
                                   f"defined in {loaded[pipeline.name].file}",)
        else:
            loaded[pipeline.name] = _describe(pipeline, file)
    return PipelineSet(source, tuple(loaded.values()), rejected)


KEEP_VERSIONS = 3  # built folders kept: a function still reading an older one finds it whole


def _versions(active_dir: Path) -> list[Path]:
    return sorted(active_dir.parent.glob(f".{active_dir.name}.v*"),
                  key=lambda p: int(p.name.rsplit(".v", 1)[1]) if p.name.rsplit(".v", 1)[1]
                  .isdigit() else -1)


def _swap(active_dir: Path, built: Path) -> None:
    """Point active_dir (a symbolic link) at built in one rename: a reader sees the old folder
    or the new one, whole, never one being deleted or filled."""
    if active_dir.is_dir() and not active_dir.is_symlink():  # a stack of an older version
        aside = active_dir.with_name(f".{active_dir.name}.old")
        shutil.rmtree(aside, ignore_errors=True)
        active_dir.rename(aside)
        shutil.rmtree(aside, ignore_errors=True)
    link = active_dir.with_name(f".{active_dir.name}.link")
    link.unlink(missing_ok=True)
    link.symlink_to(built.name)
    link.replace(active_dir)
    for old in _versions(active_dir)[:-KEEP_VERSIONS]:
        if old != built:
            shutil.rmtree(old, ignore_errors=True)


def activate(pipelines: PipelineSet, active_dir: Path) -> PipelineSet:
    """Make active_dir hold exactly the valid files (the functions read it), their Python
    packages built and pipelines.json written; a pipeline whose package does not build is left
    out like an invalid file. Returns what is served.

    Atomic: the files are written into a new folder beside it (.NAME.vN), then active_dir, a
    symbolic link, is renamed onto it; the functions resolve it once and read that folder."""
    from spotorch.core.errors import ConfigError
    from spotorch.spec.packages import stage

    final = active_dir
    active_dir.parent.mkdir(parents=True, exist_ok=True)
    known = _versions(final)
    number = int(known[-1].name.rsplit(".v", 1)[1]) + 1 if known else 1
    while True:
        active_dir = final.with_name(f".{final.name}.v{number}")
        try:
            active_dir.mkdir()
            break
        except FileExistsError:
            number += 1
    root = pipelines.source if pipelines.source.is_dir() else pipelines.source.parent
    served: list[LoadedPipeline] = []
    rejected = dict(pipelines.rejected)
    for p in pipelines.loaded:
        try:
            staged = stage((p.pipeline,), active_dir) if p.pipeline is not None else ()
        except ConfigError as exc:
            rejected[str(p.file)] = tuple(str(problem) for problem in exc.problems)
            continue
        served.append(replace(p, pipeline=staged[0] if staged else None))
        target = active_dir / p.file.relative_to(root)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(p.file, target)
    # What the functions read at their first event, as deploy/package.py writes it for the
    # bundle: the validated pipelines, readable without pydantic or YAML.
    write_compiled([p.pipeline for p in served if p.pipeline is not None], active_dir)
    _swap(final, active_dir)
    return PipelineSet(pipelines.source, tuple(served), rejected)


def fingerprint(source: Path) -> tuple[tuple[str, int, int], ...]:
    """What changes when a pipeline file is added, removed or edited."""
    from spotorch.spec.loader import pipeline_files

    if not source.exists():
        return ()
    files: Iterable[Path] = pipeline_files(source)
    out = []
    for f in files:
        try:
            stat = f.stat()
        except OSError:
            continue
        out.append((str(f), stat.st_mtime_ns, stat.st_size))
    return tuple(out)


def unrouted(routes: Iterable[RouteInfo]) -> list[RouteInfo]:
    """Routes whose target the receivers cannot take over: a Secret Manager reference (not
    emulated) or a literal address list; they go wherever that target says."""
    return [r for r in routes if r.target and not _ENV_NAME.match(r.target)]


def env_targets(routes: Iterable[RouteInfo]) -> dict[str, str]:
    """Route targets that name an environment variable, by channel kind: {NAME: kind}."""
    return {r.target: r.channel for r in routes if _ENV_NAME.match(r.target)}
