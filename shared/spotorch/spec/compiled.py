"""Validated pipelines in one JSON file beside their YAML: what the functions read, cold.

deploy/package.py and the local stack validate the pipeline files (spotorch.spec.loader, with
pydantic and YAML) and write `pipelines.json` into the directory the functions get as
SPOTORCH_PIPELINES: every pipeline in the attribute form of its dataclasses
(spotorch.core.pipeline_form), with the name and SHA-256 of each YAML file it came from. A
function reads that file with json alone. If the YAML files there no longer match the recorded
hashes (edited after validation), or there is no such file, it falls back to the loader: slower,
never stale.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import threading
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from spotorch.core.pipeline import Pipeline
from spotorch.core.pipeline_form import FORM_VERSION, from_form, to_form
from spotorch.settings import Settings

COMPILED_FILE = "pipelines.json"
FORMAT = "spotorch.pipelines"
YAML_SUFFIXES = (".yaml", ".yml")

_log = logging.getLogger(__name__)
_lock = threading.Lock()


def yaml_files(directory: Path) -> tuple[Path, ...]:
    """The pipeline files of a directory, as the loader finds them (hidden ones skipped)."""
    return tuple(sorted(p for p in directory.rglob("*") if p.suffix in YAML_SUFFIXES
                        and p.is_file()
                        and not any(part.startswith(".")
                                    for part in p.relative_to(directory).parts)))


def _digests(directory: Path) -> dict[str, str]:
    return {p.relative_to(directory).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in yaml_files(directory)}


def compiled_document(pipelines: Sequence[Pipeline], directory: Path) -> dict[str, Any]:
    """The compiled file's content for pipelines validated from directory's YAML files."""
    # `source` is for messages: the file's name, not the path on the machine that validated it.
    return {"format": FORMAT, "version": FORM_VERSION, "sources": _digests(directory),
            "pipelines": [to_form(replace(p, source=Path(p.source).name if p.source else ""))
                          for p in pipelines]}


def write_compiled(pipelines: Sequence[Pipeline], directory: Path) -> Path:
    """Write directory/pipelines.json for pipelines validated from directory's YAML files, with
    their Python packages built into directory/packages/ (spotorch.spec.packages)."""
    from spotorch.spec.packages import stage

    pipelines = stage(tuple(pipelines), directory)
    target = directory / COMPILED_FILE
    tmp = target.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(compiled_document(pipelines, directory), sort_keys=True))
    tmp.replace(target)
    return target


def read_compiled(directory: Path) -> tuple[Pipeline, ...] | None:
    """The pipelines of directory/pipelines.json; None when it is missing, of another format
    version, or older than the YAML files beside it."""
    target = directory / COMPILED_FILE
    try:
        doc = json.loads(target.read_text())
    except FileNotFoundError:
        return None
    if doc.get("format") != FORMAT or doc.get("version") != FORM_VERSION:
        _log.warning("%s: not a compiled pipelines file of version %s: reading the YAML",
                     target, FORM_VERSION)
        return None
    if doc.get("sources") != _digests(directory):
        _log.warning("%s does not match the pipeline files beside it (edited after it was "
                     "written): reading the YAML", target)
        return None
    return tuple(_located(from_form(p), directory) for p in doc["pipelines"])


def _located(pipeline: Pipeline, directory: Path) -> Pipeline:
    """The pipeline with its staged package files as paths on this machine."""
    pools = tuple(replace(w, python_package=replace(w.python_package, staged_files=tuple(
        str(directory / f) for f in w.python_package.staged_files)))
        if w.python_package is not None and w.python_package.staged_files else w
        for w in pipeline.job.worker_pools)
    return replace(pipeline, job=replace(pipeline.job, worker_pools=pools))


@functools.cache
def _cached(resolved: str) -> tuple[Pipeline, ...]:
    where = Path(resolved)
    if where.is_dir():
        compiled = read_compiled(where)
        if compiled is not None:
            return compiled
    from spotorch.spec.loader import load_pipelines  # pydantic and YAML: only without the file

    return load_pipelines(where)


def function_pipelines(path: str | os.PathLike[str] | None = None) -> tuple[Pipeline, ...]:
    """Pipelines at path (default $SPOTORCH_PIPELINES), loaded once per process: from the
    compiled file when it is there and current, else validated from the YAML."""
    where = Path(path if path is not None else Settings.from_env().pipelines).resolve()
    with _lock:
        return _cached(str(where))


def clear_cache() -> None:
    """Forget the pipelines loaded so far (tests, or after the files changed)."""
    _cached.cache_clear()
