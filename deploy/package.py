"""Builds the Cloud Functions source bundle, offline: main.py, the spotorch and spotorch_trainer
modules it imports (production code only), schemas, requirements.txt and the pipelines; and a
tfvars file of what those pipelines need (buckets, service accounts, alert targets)."""

from __future__ import annotations

import argparse
import importlib
import json
import modulefinder
import py_compile
import re
import sys
import tempfile
import tomllib
import zipfile
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

# A fixed timestamp makes the zip a function of its contents only: same sources, same bytes, same
# object name in the source bucket, so Terraform rebuilds nothing.
ZIP_DATE = (1980, 1, 1, 0, 0, 0)
SKIP_DIRS = frozenset({"__pycache__", ".mypy_cache", ".pytest_cache", ".ruff_cache"})
SKIP_SUFFIXES = frozenset({".pyc", ".pyo"})
PIPELINE_SUFFIXES = (".yaml", ".yml")
BUNDLE_PIPELINES = "pipelines"  # the functions' SPOTORCH_PIPELINES; relative to the source root

# Repository path -> where it goes in the bundle.
PACKAGES = (("shared/spotorch", "spotorch"), ("trainer/spotorch_trainer", "spotorch_trainer"))
FUNCTIONS_DIR = "functions"
# Not production code: the local stack, emulators and demo, and the simulator (which imports
# numpy, not a runtime dependency). The bundle never holds them, and production code that imports
# them stops the build: the deployed functions would fail to import.
NON_PRODUCTION = ("spotorch.local", "spotorch.sim")
SCHEMAS_DIR = "schemas"  # spotorch looks for schemas/events next to the spotorch package
# The bundle's requirements.txt: every runtime dependency, transitively, at the version the venv
# has (`make lock` writes it). Each function then installs the same versions at build time.
LOCK_FILE = "deploy/requirements.lock"
# Where Cloud Functions runs the bundle (deploy/variables.tf python_runtime): the markers of the
# locked requirements are decided for it, not for the machine that writes the lock.
RUNTIME_MARKERS = {"python_version": "3.11", "python_full_version": "3.11.0", "os_name": "posix",
                   "sys_platform": "linux", "platform_system": "Linux",
                   "platform_machine": "x86_64", "implementation_name": "cpython",
                   "platform_python_implementation": "CPython"}
BUNDLE_PRICES = "prices.json"  # a price table the bundle carries: SPOTORCH_PRICES of the functions


class PackageError(Exception):
    """The bundle cannot be built as asked."""


# spotorch.core.pipeline.Preprocess.region's default (tests/test_deploy.py keeps them equal)
PREPROCESS_DEFAULT_REGION = "us-central1"


@dataclass(frozen=True)
class Needs:
    """What the bundled pipelines need from the deployment (Terraform grants and mounts it)."""

    landing: tuple[str, ...] = ()  # trigger buckets: Eventarc triggers, read access
    checkpoint: tuple[str, ...] = ()  # checkpoint_uri buckets: training writes, functions read
    model: tuple[str, ...] = ()  # output_uri / base_output_uri buckets: training writes
    service_accounts: tuple[str, ...] = ()  # job.service_account: the functions launch as them
    route_env: tuple[str, ...] = ()  # route targets naming env variables: notifier secrets
    route_secrets: tuple[str, ...] = ()  # sm:// route targets: the notifier reads them
    staging: tuple[str, ...] = ()  # job.staging_uri buckets: functions upload packages, jobs read
    preprocess: tuple[str, ...] = ()  # preprocess.output_uri buckets: Dataflow writes, jobs read
    # preprocess.region of each Beam step: a Dataflow statusChanged trigger in each (and
    # Dataflow's grants exist only then)
    preprocess_regions: tuple[str, ...] = ()
    # issue 42: preprocess.region of each kind: spark step (Dataproc's grants exist only then)
    spark_regions: tuple[str, ...] = ()
    export: tuple[str, ...] = ()  # trigger.bigquery.export_uri buckets: the Parquet exports
    bigquery_watched: tuple[str, ...] = ()  # project:dataset of the watched tables
    bigquery_snapshots: tuple[str, ...] = ()  # project:dataset of the snapshot tables
    # (account, bucket) of pipelines with their own job.service_account: the data it reads, the
    # checkpoints and models it writes (the training account's grants, for that pipeline only)
    account_data: tuple[tuple[str, str], ...] = ()
    account_output: tuple[tuple[str, str], ...] = ()
    # a step's own preprocess.service_account runs its workers: the worker role of its kind, and
    # (account, bucket) of its output buckets (write)
    beam_workers: tuple[str, ...] = ()
    spark_workers: tuple[str, ...] = ()
    account_step_output: tuple[tuple[str, str], ...] = ()

    def tfvars(self) -> dict[str, Any]:
        def pairs(found: tuple[tuple[str, str], ...]) -> dict[str, dict[str, str]]:
            return {f"{a} {b}": {"account": a, "bucket": b} for a, b in found}

        return {"pipeline_landing_buckets": list(self.landing),
                "pipeline_checkpoint_buckets": list(self.checkpoint),
                "pipeline_model_buckets": list(self.model),
                "pipeline_service_accounts": list(self.service_accounts),
                "pipeline_route_env": list(self.route_env),
                "pipeline_route_secrets": list(self.route_secrets),
                "pipeline_staging_buckets": list(self.staging),
                "pipeline_preprocess_buckets": list(self.preprocess),
                "pipeline_preprocess_regions": list(self.preprocess_regions),
                "pipeline_spark_regions": list(self.spark_regions),
                "pipeline_export_buckets": list(self.export),
                "pipeline_bigquery_watched_datasets": list(self.bigquery_watched),
                "pipeline_bigquery_snapshot_datasets": list(self.bigquery_snapshots),
                "pipeline_account_data_buckets": pairs(self.account_data),
                "pipeline_account_output_buckets": pairs(self.account_output),
                "pipeline_account_beam_workers": list(self.beam_workers),
                "pipeline_account_spark_workers": list(self.spark_workers),
                "pipeline_account_step_output_buckets": pairs(self.account_step_output)}


@dataclass(frozen=True)
class Bundle:
    """What was built."""

    path: Path
    names: tuple[str, ...]
    requirements: tuple[str, ...]
    pipelines: tuple[str, ...]
    needs: Needs = field(default_factory=Needs)


def runtime_requirements(pyproject: Path) -> tuple[str, ...]:
    """The runtime dependencies of pyproject.toml, one requirement each, as pip reads them."""
    try:
        project = tomllib.loads(pyproject.read_text())["project"]
    except (OSError, KeyError, tomllib.TOMLDecodeError) as exc:
        raise PackageError(f"cannot read [project] of {pyproject}: {exc}") from exc
    deps = project.get("dependencies", [])
    if not deps:
        raise PackageError(f"{pyproject} lists no runtime dependencies")
    return tuple(str(dep) for dep in deps)


def _requirement_name(requirement: str) -> str:
    return re.split(r"[<>=!~\[; ]", requirement.strip(), maxsplit=1)[0].lower().replace("_", "-")


def locked_requirements(root: Path) -> tuple[str, ...]:
    """The lock's pins (name==version), comments and blank lines left out."""
    path = root / LOCK_FILE
    try:
        lines = path.read_text().splitlines()
    except OSError as exc:
        raise PackageError(f"cannot read {path} ({exc}): run `make lock`") from exc
    return tuple(line.strip() for line in lines if line.strip() and not line.startswith("#"))


def dependency_closure(requirements: Sequence[str]) -> dict[str, str]:
    """Installed name -> version of the requirements and everything they need, transitively,
    with markers decided for the functions' runtime (RUNTIME_MARKERS)."""
    from importlib import metadata

    from packaging.requirements import Requirement

    found: dict[str, str] = {}
    todo = [(Requirement(r), "") for r in requirements]
    seen: set[tuple[str, frozenset[str]]] = set()
    while todo:
        req, extra = todo.pop()
        if req.marker is not None and not req.marker.evaluate({**RUNTIME_MARKERS, "extra": extra}):
            continue
        name = req.name.lower().replace("_", "-")
        key = (name, frozenset(req.extras))
        if key in seen:
            continue
        seen.add(key)
        try:
            dist = metadata.distribution(req.name)
        except metadata.PackageNotFoundError as exc:
            raise PackageError(f"{req.name} is not installed in this venv: `make venv` first") from exc
        found[name] = dist.version
        for sub in dist.requires or ():
            parsed = Requirement(sub)
            extras = req.extras or {""}
            todo.extend((parsed, e) for e in extras)
    return dict(sorted(found.items()))


def lock_text(root: Path) -> str:
    """The lock file for pyproject.toml's runtime dependencies, from the installed versions."""
    pins = dependency_closure(runtime_requirements(root / "pyproject.toml"))
    header = ("# The function bundle's requirements.txt: pyproject.toml's runtime dependencies and\n"
              "# theirs, pinned to the versions of the venv that wrote it. Regenerate: make lock\n")
    return header + "".join(f"{name}=={version}\n" for name, version in pins.items())


def _tree(src: Path, dest: str) -> Iterator[tuple[str, Path]]:
    """Files below src as (archive name under dest, path), caches left out."""
    for path in sorted(src.rglob("*")):
        rel = path.relative_to(src)
        skipped = SKIP_DIRS.intersection(rel.parts) or path.suffix in SKIP_SUFFIXES
        if path.is_file() and not skipped:
            yield f"{dest}/{rel.as_posix()}", path


def pipeline_files(pipelines: Path) -> tuple[Path, ...]:
    """The pipeline definitions in a directory; at least one, or the deployment could do nothing."""
    if not pipelines.is_dir():
        raise PackageError(f"pipelines directory {pipelines} does not exist")
    files = tuple(sorted(p for p in pipelines.rglob("*")
                         if p.is_file() and p.suffix in PIPELINE_SUFFIXES
                         and not SKIP_DIRS.intersection(p.relative_to(pipelines).parts)))
    if not files:
        raise PackageError(f"no pipeline (*.yaml, *.yml) in {pipelines}")
    return files


class _ImportRecorder(modulefinder.ModuleFinder):
    """A ModuleFinder that remembers who imported what, to name the culprit of a bad import."""

    def __init__(self, path: list[str]) -> None:
        super().__init__(path=path)
        self.importers: dict[str, set[str]] = {}

    def import_hook(self, name: str, caller: Any = None, fromlist: Any = None,
                    level: int = -1) -> Any:
        if caller is not None:
            self.importers.setdefault(name, set()).add(caller.__name__)
        return super().import_hook(name, caller, fromlist, level)


def _is_non_production(module: str) -> bool:
    return any(module == bad or module.startswith(bad + ".") for bad in NON_PRODUCTION)


def production_modules(root: Path) -> dict[str, Path]:
    """The spotorch and spotorch_trainer modules functions/main.py imports, directly or through
    others, imports inside functions included; module name -> source file.

    The search path holds only the repository's own code, so third-party and standard-library
    imports are noted as missing and not followed: what they need comes from requirements.txt."""
    main = root / FUNCTIONS_DIR / "main.py"
    homes = [root / src.rsplit("/", 1)[0] for src, _ in PACKAGES]
    finder = _ImportRecorder(path=[str(root / FUNCTIONS_DIR), *map(str, homes)])
    try:
        finder.run_script(str(main))
    except SyntaxError as exc:
        raise PackageError(f"cannot read the imports of {exc.filename}: {exc}") from exc
    found = {name: Path(module.__file__) for name, module in finder.modules.items()
             if module.__file__ and name != "__main__"}
    bad = sorted(name for name in found if _is_non_production(name))
    if bad:
        culprits = sorted({c for name in bad for c in finder.importers.get(name, ())
                           if not _is_non_production(c)})
        raise PackageError(f"production code imports non-production modules {', '.join(bad)} "
                           f"(from {', '.join(culprits) or '?'}): the functions could not import "
                           f"them once deployed")
    return found


def _module_files(root: Path, modules: Mapping[str, Path]) -> Iterator[tuple[str, Path]]:
    """(archive name, path) for each module's source, plus the data files (py.typed, ...) of each
    package it holds; caches and the files of packages not imported stay out."""
    for src, dest in PACKAGES:
        base = root / src
        if not (base / "__init__.py").is_file():
            raise PackageError(f"package {base} is missing")
        for name, path in sorted(modules.items()):
            if name != dest and not name.startswith(dest + "."):
                continue
            yield f"{dest}/{path.resolve().relative_to(base.resolve()).as_posix()}", path
            if path.name == "__init__.py":
                for data in sorted(path.parent.iterdir()):
                    if data.is_file() and data.suffix not in {".py", *SKIP_SUFFIXES}:
                        yield (f"{dest}/{data.resolve().relative_to(base.resolve()).as_posix()}",
                               data)


def bundle_sources(root: Path, pipelines: Path) -> dict[str, Path]:
    """Every file of the bundle: archive name -> path in the repository or the pipelines dir."""
    functions = root / FUNCTIONS_DIR
    if not (functions / "main.py").is_file():
        raise PackageError(f"{functions / 'main.py'} is missing")
    files = {p.name: p for p in sorted(functions.glob("*.py"))}
    files.update(_module_files(root, production_modules(root)))
    if (root / SCHEMAS_DIR).is_dir():
        files.update(_tree(root / SCHEMAS_DIR, SCHEMAS_DIR))
    for path in pipeline_files(pipelines):
        files[f"{BUNDLE_PIPELINES}/{path.relative_to(pipelines).as_posix()}"] = path
    return files


def _bucket(uri: Any) -> str | None:
    """Bucket of a gs:// URI (or of a bare bucket name), None for anything else."""
    if not isinstance(uri, str) or not uri:
        return None
    if uri.startswith("gs://"):
        return uri[len("gs://"):].split("/", 1)[0] or None
    return None if "/" in uri or ":" in uri else uri


# Where a pipeline names a bucket: key in the YAML -> which kind of bucket it is.
_URI_KEYS = {"checkpoint_uri": "checkpoint", "output_uri": "model", "base_output_uri": "model",
             "staging_uri": "staging", "export_uri": "export"}
_ENV_NAME = re.compile(r"^[A-Z_][A-Z0-9_]*$")  # what the notifier takes for an env variable
_SECRET_REF = re.compile(r"^sm://(projects/[^/]+/secrets/[^/]+)(/versions/[^/]+)?$")
# sm:// route targets are resolved by the notifier at run time with this optional client.
SECRET_MANAGER_REQUIREMENT = "google-cloud-secret-manager>=2.20"


def _route(route: Any) -> Iterator[tuple[str, str]]:
    target = route.get("target") if isinstance(route, Mapping) else None
    if not isinstance(target, str):
        return
    secret = _SECRET_REF.match(target)
    if secret:
        yield "route_secrets", secret.group(1)
    elif _ENV_NAME.match(target):
        yield "route_env", target


def _dataset(name: Any) -> str | None:
    """project:dataset of project.dataset(.table), as deploy/bigquery.tf grants on it."""
    parts = name.split(".") if isinstance(name, str) else []
    return f"{parts[0]}:{parts[1]}" if len(parts) >= 2 and all(parts[:2]) else None


def _bigquery(source: Any) -> Iterator[tuple[str, str]]:
    """The datasets a BigQuery trigger watches and writes its snapshots to (export_uri is
    found by the walk like every other gs:// URI)."""
    if not isinstance(source, Mapping):
        return
    for table in source.get("tables") or ():
        dataset = _dataset(table)
        if dataset:
            yield "bigquery_watched", dataset
    dataset = _dataset(source.get("snapshot_dataset"))
    if dataset:
        yield "bigquery_snapshots", dataset


def _walk(node: Any) -> Iterator[tuple[str, str]]:
    """(kind, value) for every bucket, service account and route target a pipeline names."""
    if isinstance(node, Mapping):
        for key, value in node.items():
            if key == "trigger" and isinstance(value, Mapping):
                bucket = _bucket(value.get("bucket"))
                if bucket:
                    yield "landing", bucket
                yield from _bigquery(value.get("bigquery"))
            elif key == "preprocess" and isinstance(value, Mapping):
                bucket = _bucket(value.get("output_uri"))
                if bucket:
                    yield "preprocess", bucket
                region = value.get("region", PREPROCESS_DEFAULT_REGION)
                if isinstance(region, str) and region:  # Dataflow's (Beam) or Dataproc's (Spark)
                    yield ("spark_regions" if value.get("kind") == "spark"
                           else "preprocess_regions"), region
                account = value.get("service_account")
                if isinstance(account, str) and "@" in account:  # its workers run as it
                    yield ("spark_workers" if value.get("kind") == "spark"
                           else "beam_workers"), account
                yield from _walk({k: v for k, v in value.items() if k != "output_uri"})
                continue
            elif key in _URI_KEYS and str(value).startswith("gs://"):
                bucket = _bucket(value)
                if bucket:
                    yield _URI_KEYS[key], bucket
            elif key == "service_account" and isinstance(value, str) and "@" in value:
                yield "service_accounts", value
            elif key == "routes" and isinstance(value, list):
                for route in value:
                    yield from _route(route)
            yield from _walk(value)
    elif isinstance(node, list):
        for item in node:
            yield from _walk(item)


def pipeline_needs(files: Iterable[Path]) -> Needs:
    """What pipeline files need; a file that is not valid YAML stops the build."""
    kinds = ("landing", "checkpoint", "model", "service_accounts", "route_env", "route_secrets",
             "staging", "preprocess", "export", "bigquery_watched", "bigquery_snapshots",
             "preprocess_regions", "spark_regions", "beam_workers", "spark_workers")
    found: dict[str, set[str]] = {kind: set() for kind in kinds}
    data: set[tuple[str, str]] = set()
    output: set[tuple[str, str]] = set()
    step_output: set[tuple[str, str]] = set()
    for path in files:
        try:
            docs = list(yaml.safe_load_all(path.read_text()))
        except yaml.YAMLError as exc:
            raise PackageError(f"{path} is not valid YAML: {exc}") from exc
        for doc in docs:  # one pipeline per document: its own account gets its own buckets
            mine: dict[str, set[str]] = {kind: set() for kind in kinds}
            for kind, value in _walk(doc):
                found[kind].add(value)
                mine[kind].add(value)
            for account in mine["service_accounts"]:
                data |= {(account, b) for b in mine["landing"] | mine["staging"]
                         | mine["preprocess"] | mine["export"]}
                output |= {(account, b) for b in mine["checkpoint"] | mine["model"]}
            for account in mine["beam_workers"] | mine["spark_workers"]:
                step_output |= {(account, b) for b in mine["preprocess"]}
    return Needs(**{kind: tuple(sorted(found[kind])) for kind in kinds},
                 account_data=tuple(sorted(data)), account_output=tuple(sorted(output)),
                 account_step_output=tuple(sorted(step_output)))


def bundle_requirements(runtime: Sequence[str], needs: Needs) -> tuple[str, ...]:
    """requirements.txt: the runtime dependencies, plus what the pipelines' features need."""
    extra = (SECRET_MANAGER_REQUIREMENT,) if needs.route_secrets else ()
    names = {_requirement_name(req) for req in runtime}
    return (*runtime, *(e for e in extra if _requirement_name(e) not in names))


def _spotorch_importable(root: Path) -> None:
    for extra in (root / "shared", root / "trainer"):
        if str(extra) not in sys.path:
            sys.path.insert(0, str(extra))


def check_prices(root: Path, path: Path) -> bytes:
    """A price table's bytes, once spotorch's own reader accepts it (every problem listed)."""
    _spotorch_importable(root)
    from spotorch.core.errors import ConfigError
    from spotorch.spec.prices import load_table

    try:
        load_table(path)
    except ConfigError as exc:
        raise PackageError(f"price table {path} (SPOTORCH_PRICES) is not valid: {exc}") from exc
    return path.read_bytes()


def check_placeholders(root: Path, files: Iterable[Path]) -> None:
    """Refuse pipelines that still hold `spotorch init`'s placeholders, naming each one."""
    _spotorch_importable(root)
    from spotorch.operate.init_project import PLACEHOLDER, placeholders

    left = [line for path in files for line in placeholders(path)]
    if left:
        raise PackageError(f"fill in the placeholders ({PLACEHOLDER}) first:\n  "
                           + "\n  ".join(left))


def check_with_loader(root: Path, pipelines: Path) -> int | None:
    """Load the pipelines with spotorch's own loader (what the functions run); None if absent."""
    _spotorch_importable(root)
    try:
        config = importlib.import_module("spotorch.spec.loader")
    except ModuleNotFoundError:
        return None
    load = getattr(config, "load_pipelines", None)
    if load is None:
        return None
    try:
        return len(list(load(str(pipelines))))
    except Exception as exc:  # any loader error means the deployed functions would fail too
        raise PackageError(f"pipelines in {pipelines} do not load: {exc}") from exc


def compiled_pipelines(root: Path, pipelines: Path) -> dict[str, bytes]:
    """pipelines/pipelines.json: the validated pipelines in the form the functions read without
    pydantic or YAML (spotorch.spec.compiled), with the hashes of the YAML files it came from;
    and pipelines/packages/...: the Python packages built for them (spotorch.spec.packages)."""
    check_with_loader(root, pipelines)  # puts shared/ on the path; PackageError if invalid
    loader = importlib.import_module("spotorch.spec.loader")
    compiled = importlib.import_module("spotorch.spec.compiled")
    packages = importlib.import_module("spotorch.spec.packages")
    with tempfile.TemporaryDirectory(prefix="spotorch-bundle-") as tmp:
        try:
            staged = packages.stage(loader.load_pipelines(str(pipelines)), Path(tmp))
        except Exception as exc:  # a package that does not build would not run either
            raise PackageError(f"the pipelines' Python packages do not build: {exc}") from exc
        doc = compiled.compiled_document(staged, pipelines)
        out = {f"{BUNDLE_PIPELINES}/{p.relative_to(tmp).as_posix()}": p.read_bytes()
               for p in sorted(Path(tmp).rglob("*")) if p.is_file()}
    out[f"{BUNDLE_PIPELINES}/pipelines.json"] = json.dumps(doc, sort_keys=True).encode()
    return out


RUNTIME_PYTHON = (3, 11)  # var.python_runtime's default (python311): the bytecode is for it


def bytecode(files: Mapping[str, Path]) -> dict[str, bytes]:
    """__pycache__/*.pyc of every Python file in the bundle, hash-checked (valid whatever mtime
    the build gives the sources; recompiled by Python if a source differs): a cold instance
    loads spotorch's modules instead of compiling them, as it does for pip-installed clients.
    Nothing when this Python is not the runtime's (its bytecode would be ignored)."""
    if sys.version_info[:2] != RUNTIME_PYTHON:
        return {}
    tag = sys.implementation.cache_tag
    out: dict[str, bytes] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, path in files.items():
            if not name.endswith(".py"):
                continue
            folder, _, stem = name.rpartition("/")
            target = f"{folder + '/' if folder else ''}__pycache__/{stem[:-3]}.{tag}.pyc"
            cfile = Path(tmp) / target
            py_compile.compile(str(path), cfile=str(cfile), dfile=name, doraise=True,
                               invalidation_mode=py_compile.PycInvalidationMode.CHECKED_HASH)
            out[target] = cfile.read_bytes()
    return out


def write_zip(out: Path, files: Mapping[str, Path], extra: Mapping[str, bytes]) -> None:
    """A deterministic zip: sorted names, fixed dates, fixed permissions."""
    out.parent.mkdir(parents=True, exist_ok=True)
    contents = {name: path.read_bytes() for name, path in files.items()} | dict(extra)
    tmp = out.with_suffix(out.suffix + ".tmp")
    with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for name in sorted(contents):
            info = zipfile.ZipInfo(name, date_time=ZIP_DATE)
            info.external_attr = 0o644 << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(info, contents[name])
    tmp.replace(out)


def build(root: Path, pipelines: Path, out: Path, tfvars: Path | None = None,
          validate: bool = True, prices: Path | None = None) -> Bundle:
    """Build the bundle (and the buckets tfvars); PackageError on anything missing or invalid."""
    files = bundle_sources(root, pipelines)
    pipeline_paths = pipeline_files(pipelines)
    check_placeholders(root, pipeline_paths)
    needs = pipeline_needs(pipeline_paths)
    requirements = bundle_requirements(locked_requirements(root), needs)
    extra = {"requirements.txt": ("\n".join(requirements) + "\n").encode(), **bytecode(files)}
    # The pipeline files as read once: the bundle carries these bytes, and they must still be
    # what was validated and compiled (a file edited meanwhile: build again).
    read = {f"{BUNDLE_PIPELINES}/{p.relative_to(pipelines).as_posix()}": p.read_bytes()
            for p in pipeline_paths}
    if validate:  # validated here, read cold by the functions (docs/architecture.md, cold start)
        extra.update(compiled_pipelines(root, pipelines))
    changed = sorted(name for name, data in read.items()
                     if not files[name].is_file() or files[name].read_bytes() != data)
    if changed:
        raise PackageError(f"pipeline files changed while the bundle was built: "
                           f"{', '.join(changed)}; build it again")
    extra.update(read)
    if prices is not None:
        extra[BUNDLE_PRICES] = check_prices(root, prices)
    write_zip(out, files, extra)
    if tfvars is not None:
        tfvars.parent.mkdir(parents=True, exist_ok=True)
        generated = {**needs.tfvars(), "bundle_prices": BUNDLE_PRICES if prices else ""}
        tfvars.write_text(json.dumps(generated, indent=2, sort_keys=True) + "\n")
    return Bundle(path=out, names=tuple(sorted([*files, *extra])), requirements=requirements,
                  pipelines=tuple(str(p.relative_to(pipelines)) for p in pipeline_paths),
                  needs=needs)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--root", type=Path, default=Path(__file__).resolve().parent.parent,
                        help="repository root (default: the parent of deploy/)")
    parser.add_argument("--pipelines", type=Path, help="directory of pipeline YAML")
    parser.add_argument("--out", type=Path, help="zip to write")
    parser.add_argument("--prices", type=Path,
                        help="price table the bundle carries (the functions' SPOTORCH_PRICES)")
    parser.add_argument("--write-lock", type=Path, metavar="FILE",
                        help=f"write the lock of the runtime dependencies ({LOCK_FILE}) and stop")
    parser.add_argument("--tfvars", type=Path,
                        help="JSON tfvars to write with the pipelines' buckets")
    parser.add_argument("--no-validate", action="store_true",
                        help="skip loading the pipelines with spotorch's loader")
    args = parser.parse_args(argv)
    if args.write_lock:
        try:
            args.write_lock.write_text(lock_text(args.root.resolve()))
        except PackageError as exc:
            print(f"package: {exc}", file=sys.stderr)
            return 1
        print(f"package: wrote {args.write_lock}")
        return 0
    if args.pipelines is None or args.out is None:
        parser.error("--pipelines and --out are required (or --write-lock)")
    try:
        bundle = build(args.root.resolve(), args.pipelines.resolve(), args.out, args.tfvars,
                       validate=not args.no_validate, prices=args.prices)
    except PackageError as exc:
        print(f"package: {exc}", file=sys.stderr)
        return 1
    landing = ", ".join(bundle.needs.landing) or "-"
    print(f"package: {bundle.path} ({len(bundle.names)} files, {len(bundle.pipelines)} pipelines: "
          f"{', '.join(bundle.pipelines)}; landing buckets: {landing})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
