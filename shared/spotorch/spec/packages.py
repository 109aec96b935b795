"""Your code without Docker: build a pipeline's Python packages where the pipeline is validated.

For a worker pool with `python_package`, spotorch builds the source distribution of `source` (its
own build backend, offline: setuptools from this environment), or takes the built `package`, and
adds spotorch_trainer as a package of its own (`spotorch-trainer`, built from the installed
helper), so `dependencies = ["spotorch-trainer"]` resolves on Vertex's prebuilt container. Each
archive is made reproducible (sorted members, fixed dates and owners) and named by its content
hash: `{job.staging_uri}/packages/{sha256[:16]}/{file}`. The pipeline gets those URIs
(python_package.package_uris) and the files (staged_files, under the compiled directory's
packages/), which the functions upload when the staging bucket lacks them.
"""

from __future__ import annotations

import gzip
import hashlib
import importlib.metadata
import io
import shutil
import subprocess
import sys
import tarfile
import tempfile
import tomllib
from dataclasses import replace
from pathlib import Path

from spotorch.core.errors import ConfigError, Problem
from spotorch.core.pipeline import Pipeline, PythonPackage, WorkerPool

PACKAGES_DIR = "packages"  # under the compiled pipelines' directory
TRAINER_DIST = "spotorch-trainer"
_BUILD = ("import importlib, sys; backend = importlib.import_module(sys.argv[1]); "
          "print(backend.build_sdist(sys.argv[2]))")
_SKIP = frozenset({"__pycache__", ".git", ".venv", "build", "dist", ".mypy_cache",
                   ".pytest_cache", ".ruff_cache"})


def reproducible_tar_gz(data: bytes) -> bytes:
    """The same tar.gz with its members sorted and dates, owners and modes fixed."""
    out = io.BytesIO()
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as src, \
            gzip.GzipFile(fileobj=out, mode="wb", mtime=0) as gz, \
            tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as dst:
        for member in sorted(src.getmembers(), key=lambda m: m.name):
            content = src.extractfile(member) if member.isfile() else None
            member.mtime, member.uid, member.gid, member.uname, member.gname = 0, 0, 0, "", ""
            member.mode = 0o755 if member.isdir() else 0o644
            member.pax_headers = {}
            dst.addfile(member, content)
    return out.getvalue()


def _copy_tree(src: Path, dst: Path) -> None:
    shutil.copytree(src, dst, ignore=lambda d, names: [n for n in names if n in _SKIP
                                                       or n.endswith((".pyc", ".egg-info"))])


def _fingerprint(source: Path) -> tuple[tuple[str, int, int], ...]:
    return tuple(sorted((p.relative_to(source).as_posix(), p.stat().st_size, p.stat().st_mtime_ns)
                        for p in source.rglob("*") if p.is_file()
                        and not _SKIP.intersection(p.relative_to(source).parts)))


_built: dict[tuple[str, tuple[tuple[str, int, int], ...]], tuple[str, bytes]] = {}


def build_sdist(source: Path) -> tuple[str, bytes]:
    """(file name, reproducible bytes) of the source distribution of a project folder, built
    offline by its own build backend from this environment (ValueError saying what is wrong);
    built once per process for an unchanged folder (the local stack reloads pipelines often)."""
    key = (str(source.resolve()), _fingerprint(source) if source.is_dir() else ())
    if key not in _built:
        _built[key] = _build_sdist(source)
    return _built[key]


def _build_sdist(source: Path) -> tuple[str, bytes]:
    pyproject = source / "pyproject.toml"
    if not pyproject.is_file():
        raise ValueError(f"{source} has no pyproject.toml")
    backend = tomllib.loads(pyproject.read_text()).get("build-system", {}).get(
        "build-backend", "setuptools.build_meta")
    with tempfile.TemporaryDirectory(prefix="spotorch-sdist-") as tmp:
        work, out = Path(tmp) / "src", Path(tmp) / "dist"
        _copy_tree(source, work)  # build artifacts stay out of your folder
        out.mkdir()
        done = subprocess.run([sys.executable, "-c", _BUILD, backend, str(out)], cwd=work,
                              capture_output=True, text=True, timeout=300)
        if done.returncode != 0:
            tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
            raise ValueError(f"building the source distribution of {source} with {backend} "
                             f"failed: {' | '.join(tail)}")
        name = done.stdout.strip().splitlines()[-1]
        return name, reproducible_tar_gz((out / name).read_bytes())


def trainer_sdist() -> tuple[str, bytes]:
    """spotorch_trainer as the package spotorch-trainer, built from the installed helper."""
    import spotorch_trainer

    try:
        version = importlib.metadata.version("spotorch")
    except importlib.metadata.PackageNotFoundError:
        version = "0"
    with tempfile.TemporaryDirectory(prefix="spotorch-trainer-") as tmp:
        project = Path(tmp)
        _copy_tree(Path(spotorch_trainer.__file__).resolve().parent, project / "spotorch_trainer")
        (project / "pyproject.toml").write_text(
            '[build-system]\nrequires = ["setuptools>=61"]\n'
            'build-backend = "setuptools.build_meta"\n\n'
            f'[project]\nname = "{TRAINER_DIST}"\nversion = "{version}"\n'
            'description = "spotorch\'s helper for training code (stdlib only at import)."\n'
            'requires-python = ">=3.10"\n\n'
            '[tool.setuptools]\npackages = ["spotorch_trainer"]\n')
        return build_sdist(project)


def _staged(staging_uri: str, name: str, data: bytes, directory: Path) -> tuple[str, str]:
    """(gs:// URI, path under directory) of one archive, stored by its content hash."""
    digest = hashlib.sha256(data).hexdigest()[:16]
    relative = f"{PACKAGES_DIR}/{digest}/{name}"
    target = directory / relative
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(data)
    return f"{staging_uri.rstrip('/')}/packages/{digest}/{name}", relative


def _stage_pool(pipeline: Pipeline, pool: WorkerPool, directory: Path,
                trainer: tuple[str, bytes] | None) -> WorkerPool:
    package = pool.python_package
    if package is None or package.package_uris:
        return pool  # no package, or built already
    staging = pipeline.job.staging_uri or ""
    here = Path(pipeline.source).parent if pipeline.source else Path.cwd()
    archives: list[tuple[str, bytes]] = []
    if trainer is not None and staging:
        archives.append(trainer)
    if package.source:
        archives.append(build_sdist((here / package.source).resolve()))
    elif package.package:
        built = (here / package.package).resolve()
        if not built.is_file():
            raise ValueError(f"python_package.package {built} does not exist")
        data = built.read_bytes()
        archives.append((built.name, reproducible_tar_gz(data) if built.name.endswith(".tar.gz")
                         else data))
    staged = [_staged(staging, name, data, directory) for name, data in archives]
    uris = tuple(uri for uri, _ in staged) + ((package.package_uri,) if package.package_uri
                                              else ())
    return replace(pool, python_package=replace(
        package, package_uris=uris, staged_files=tuple(path for _, path in staged)))


def stage(pipelines: tuple[Pipeline, ...] | list[Pipeline], directory: Path) -> tuple[Pipeline, ...]:
    """Build every python_package of these pipelines into directory/packages/ (directory: where
    the compiled pipelines go); ConfigError listing every package that could not be built."""
    needs = [p for p in pipelines if any(w.python_package for w in p.job.worker_pools)]
    if not needs:
        return tuple(pipelines)
    trainer = trainer_sdist()
    staged: dict[str, Pipeline] = {}
    problems: list[Problem] = []
    for p in needs:
        pools = []
        for i, pool in enumerate(p.job.worker_pools):
            try:
                pools.append(_stage_pool(p, pool, directory, trainer))
            except (ValueError, OSError, subprocess.TimeoutExpired) as exc:
                problems.append(Problem(p.source, f"job.worker_pools[{i}].python_package",
                                        str(exc)))
        staged[p.name] = replace(p, job=replace(p.job, worker_pools=tuple(pools)))
    if problems:
        raise ConfigError(problems)
    return tuple(staged.get(p.name, p) for p in pipelines)


def describe_code(pool: WorkerPool) -> dict[str, object]:
    """What a pool runs, for reports: the package URIs, the executor image and the module, or the
    image and command."""
    package: PythonPackage | None = pool.python_package
    if package is None:
        return {"image_uri": pool.image_uri, "command": list(pool.command)}
    return {"package_uris": list(package.package_uris), "executor_image_uri":
            package.executor_image_uri, "python_module": package.python_module}
