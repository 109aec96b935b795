"""Pipeline files: every problem in every file at once (file, field path, what is wrong, line)."""

from __future__ import annotations

import functools
import logging
import os
import re
import sys
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from spotorch.core.errors import ConfigError, Problem
from spotorch.core.pipeline import Pipeline
from spotorch.settings import Settings
from spotorch.spec.catalog import Catalog, accelerator_region_warnings, check_names, load_catalog
from spotorch.spec.checks import CHECKS, check_secrets, no_effect
from spotorch.spec.schema import plural, read_document, schema_main, value_kind
from spotorch.spec.yaml_source import parse_yaml

PIPELINE_SUFFIXES = (".yaml", ".yml")


# --- loading ------------------------------------------------------------------------------------


def _line_of(lines: Mapping[str, int], path: str) -> int:
    """Line of a field, else of its nearest parent that is in the file."""
    while path:
        if path in lines:
            return lines[path]
        path = re.sub(r"(\.[^.\[]*|\[\d+\])$", "", path) if re.search(r"[.\[]", path) else ""
    return lines.get("", 0)


@dataclass(frozen=True)
class FileCheck:
    """What checking one file found: its pipeline (only when there are no problems), the problems
    (each fails the load) and the warnings (settings without effect; they do not)."""

    pipeline: Pipeline | None
    problems: tuple[Problem, ...]
    warnings: tuple[Problem, ...] = ()


def _located(file: str, lines: Mapping[str, int], found: Iterable[tuple[str, str]],
             ) -> tuple[Problem, ...]:
    unique = dict.fromkeys(found)  # several checks can say the same thing
    ordered = sorted(unique, key=lambda pm: (_line_of(lines, pm[0]), pm[0]))
    return tuple(Problem(file, p, f"{m} (line {line})" if (line := _line_of(lines, p)) else m)
                 for p, m in ordered)


def inspect_file(path: str | os.PathLike[str], catalog: Catalog | None = None) -> FileCheck:
    """Every problem and warning of one file, and its pipeline when it has no problems."""
    file = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        return FileCheck(None, (Problem(file, "", f"cannot read: {exc}"),))
    parsed = parse_yaml(text)
    found = list(parsed.problems)
    warned: list[tuple[str, str]] = []
    pipeline = None
    if parsed.doc is not None:
        if not isinstance(parsed.doc, Mapping):
            found.append(("", f"must be a mapping of pipeline fields, not {value_kind(parsed.doc)}"))
        else:
            pipeline, format_problems = read_document(parsed.doc)
            found += format_problems
            if pipeline is not None:  # the health rules' own consistency (health.HealthPolicy)
                found += [(f"health.{f}", m) for f, m in pipeline.health.problems()]
            for check in CHECKS:
                found += check(parsed.doc)
            names = catalog or load_catalog()
            # A name the format already rejects needs no second message.
            found += [(p, m) for p, m in check_names(parsed.doc, names)
                      if p not in {fp for fp, _ in format_problems}]
            warned = [*no_effect(parsed.doc), *accelerator_region_warnings(parsed.doc, names)]
        # A secret wins over any other complaint about the same field: the others may echo it.
        secrets = dict(check_secrets(parsed.doc))
        found = [(p, m) for p, m in found if p not in secrets] + list(secrets.items())
    problems = _located(file, parsed.lines, found)
    warnings = _located(file, parsed.lines, warned)
    if problems or pipeline is None:
        return FileCheck(None, problems, warnings)
    return FileCheck(replace(pipeline, source=file), (), warnings)


def check_file(path: str | os.PathLike[str]) -> tuple[Pipeline | None, tuple[Problem, ...]]:
    """The pipeline of one file and every problem in it (the pipeline only when there are none)."""
    checked = inspect_file(path)
    return checked.pipeline, checked.problems


def load_pipeline(path: str | os.PathLike[str]) -> Pipeline:
    """One pipeline file; ConfigError listing every problem in it."""
    pipeline, problems = check_file(path)
    if pipeline is None:
        raise ConfigError(problems)
    return pipeline


def pipeline_files(path: str | os.PathLike[str]) -> tuple[Path, ...]:
    """The file itself, or every *.yaml / *.yml below a directory (hidden ones left out), sorted."""
    root = Path(path)
    if not root.is_dir():
        return (root,)
    return tuple(sorted(p for p in root.rglob("*") if p.is_file()
                        and p.suffix in PIPELINE_SUFFIXES
                        and not any(part.startswith(".") for part in p.relative_to(root).parts)))


def _duplicates(pipelines: Sequence[Pipeline]) -> list[Problem]:
    by_name: dict[str, list[str]] = {}
    for p in pipelines:
        by_name.setdefault(p.name, []).append(p.source)
    return [Problem(source, "name", f"pipeline {name!r} is also defined in "
                    + ", ".join(s for s in sources if s != source))
            for name, sources in by_name.items() if len(sources) > 1 for source in sources]


_Report = Callable[[str, FileCheck], None]


def _check_all(paths: Iterable[str | os.PathLike[str]], report: _Report | None = None,
               ) -> tuple[tuple[Pipeline, ...], list[Problem]]:
    """Every pipeline and every problem of the given files and directories, duplicates included;
    report(file, check) hears about each file as it is checked (warnings are logged otherwise)."""
    def tell(file: str, checked: FileCheck) -> None:
        if report is not None:
            report(file, checked)
        else:
            for warning in checked.warnings:
                _log.warning("pipeline warning: %s", warning)

    pipelines: list[Pipeline] = []
    problems: list[Problem] = []
    for given in paths:
        if not Path(given).exists() or (Path(given).is_dir() and not pipeline_files(given)):
            missing = "no such file or directory" if not Path(given).exists() \
                else "no pipeline files (*.yaml, *.yml) here"
            problems.append(Problem(str(given), "", missing))
            tell(str(given), FileCheck(None, tuple(problems[-1:])))
            continue
        for file in pipeline_files(given):
            checked = inspect_file(file)
            tell(str(file), checked)
            problems += checked.problems
            pipelines += [checked.pipeline] if checked.pipeline else []
    duplicates = _duplicates(pipelines)
    if duplicates:
        tell("", FileCheck(None, tuple(duplicates)))
    return tuple(pipelines), problems + duplicates


def load_pipelines(path_or_dir: str | os.PathLike[str]) -> tuple[Pipeline, ...]:
    """Every pipeline of a file or directory; ConfigError listing every problem in every file."""
    pipelines, problems = _check_all([path_or_dir])
    if problems:
        raise ConfigError(problems)
    return pipelines


_cache_lock = threading.Lock()
_log = logging.getLogger(__name__)


@functools.cache
def _cached(resolved: str) -> tuple[Pipeline, ...]:
    return load_pipelines(resolved)


def cached_pipelines(path: str | os.PathLike[str] | None = None) -> tuple[Pipeline, ...]:
    """Pipelines at path (default $SPOTORCH_PIPELINES, relative to the working directory), loaded
    once per process: a cold start reads them, warm invocations reuse them."""
    where = Path(path if path is not None else Settings.from_env().pipelines).resolve()
    with _cache_lock:
        return _cached(str(where))


def clear_pipeline_cache() -> None:
    """Forget the pipelines loaded so far (tests, or after the files changed)."""
    _cached.cache_clear()


# --- `spotorch validate` ------------------------------------------------------------------------


def validate_paths(paths: list[str]) -> int:
    """Check pipeline files (default: $SPOTORCH_PIPELINES, else ./pipelines): every problem of
    every file on stdout, OK per good file; the exit code, 1 on any problem (the command line
    is `spotorch validate`, spotorch.operate.cli_tools)."""
    paths = paths or [Settings.from_env().pipelines]

    def report(file: str, checked: FileCheck) -> None:
        if checked.pipeline is not None and not checked.problems:
            print(f"OK {file} (pipeline {checked.pipeline.name})")
        for problem in checked.problems:
            print(problem)
        for warning in checked.warnings:
            print(f"warning: {warning}")

    try:
        _, problems = _check_all(paths, report)
    except ConfigError as exc:  # a machine table that cannot be read
        problems = list(exc.problems)
        report("", FileCheck(None, exc.problems))
    if problems:
        files = len({p.file for p in problems})
        print(f"{plural(len(problems), 'problem')} in {plural(files, 'file')}", file=sys.stderr)
        return 1
    return 0


def validate_main(argv: list[str] | None = None) -> int:
    """`python -m spotorch.spec.loader [PATH...]`: validate_paths of the paths given."""
    return validate_paths(list(sys.argv[1:] if argv is None else argv))


if __name__ == "__main__":
    if sys.argv[1:2] == ["schema"]:
        sys.exit(schema_main(sys.argv[2:]))
    sys.exit(validate_main())
