"""`spotorch advise PIPELINE`: the table of hardware candidates from earlier probes (issue 19).

Without --probe nothing is launched: it reads the pipeline's probe cache (Firestore collection
hardware_probes, or --results FILE) and shows, per candidate, the measured rate, expected hours,
expected cost on Spot and standard, whether it fits and why, and the choice. With --probe DATA_URI
it first probes the candidates without a fresh result on Vertex AI (or the local emulator, through
SPOTORCH_VERTEX_ENDPOINT), waits for them and stores the results in the cache.
"""

from __future__ import annotations

import json
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import click

from spotorch.commandline import UsageFailure, run
from spotorch.core.fields import parse_duration
from spotorch.core.hardware import HardwareChoice, ProbeResult, cache_key, choose, fresh, table_lines
from spotorch.core.pipeline import Pipeline
from spotorch.operate.cli_session import session, target_options
from spotorch.ports.store import DocumentStore


def fresh_results(pipeline: Pipeline, cache: Mapping[str, ProbeResult],
                  now: float) -> dict[str, ProbeResult]:
    """The cached results still valid for this pipeline's code and candidates."""
    search = pipeline.hardware
    if search is None:
        return {}
    return {c.name: cache[c.name] for c in search.candidates
            if fresh(cache.get(c.name), cache_key(pipeline, c, search.probe_steps), now,
                     search.cache_ttl_s)}


def advise(pipeline: Pipeline, cache: Mapping[str, ProbeResult], now: float,
           deadline_s: float | None,
           unanswered: Mapping[str, ProbeResult] | None = None) -> HardwareChoice:
    """The choice from the fresh cached results; a candidate without one shows as not probed,
    or with why its probe just now gave no answer (unanswered: never cached)."""
    found = fresh_results(pipeline, cache, now)
    return choose(pipeline, {**{n: r for n, r in (unanswered or {}).items() if n not in found},
                             **found}, deadline_s)


def _read_results(path: str) -> dict[str, ProbeResult]:
    doc = json.loads(Path(path).read_text(encoding="utf-8"))
    found = doc.get("results", doc) if isinstance(doc, Mapping) else {}
    return {name: ProbeResult.from_doc(r) for name, r in found.items() if isinstance(r, Mapping)}


def _docs() -> DocumentStore:
    from spotorch.adapters.gcp.firestore import FirestoreDocumentStore
    from spotorch.settings import Settings

    settings = Settings.from_env()
    return FirestoreDocumentStore(project=settings.project, database=settings.firestore_database)


def built(pipeline: Pipeline, directory: Path) -> Pipeline:
    """The pipeline with its Python packages built into directory, as a deployment builds them
    (spotorch.spec.packages): a pipeline read from its YAML file has no package_uris yet, and
    the probe cache is keyed by the built archives."""
    if not any(w.python_package is not None and not w.python_package.package_uris
               for w in pipeline.job.worker_pools):
        return pipeline
    from spotorch.core.errors import ConfigError
    from spotorch.spec.packages import stage

    try:
        (staged,) = stage((pipeline,), directory)
    except ConfigError as exc:
        raise UsageFailure(str(exc)) from None
    return staged


def upload_packages(pipeline: Pipeline, directory: Path) -> None:
    """Upload the built packages the staging bucket lacks, as the functions do before a launch
    (spotorch.app.launch_specs.stage_packages)."""
    from spotorch.adapters.gcp.storage import GcsObjectStore
    from spotorch.settings import Settings

    objects = GcsObjectStore(project=Settings.from_env().project)
    for pool in pipeline.job.worker_pools:
        package = pool.python_package
        if package is not None:
            for uri, path in zip(package.package_uris, package.staged_files, strict=False):
                objects.ensure_file(uri, str(directory / path))


def _probe(pipeline: Pipeline, docs: DocumentStore, data_uri: str, now: float,
           built_in: Path) -> dict[str, ProbeResult]:
    """Probe the candidates without a fresh result; the probes that gave no answer."""
    from spotorch.adapters.gcp.vertex import VertexJobLauncher
    from spotorch.app.hardware_probes import ProbeSession, load_cache, run_probes, save_cache
    from spotorch.settings import Settings
    from spotorch_trainer.storage import read_bytes

    def read(uri: str) -> bytes | None:
        try:
            return read_bytes(uri)
        except OSError:
            return None

    settings = Settings.from_env()
    region = pipeline.job.regions[0]
    launcher = VertexJobLauncher(settings.project, endpoint=settings.vertex_endpoint,
                                 regions=(region,), token=settings.vertex_token)
    stamp = time.strftime("%Y%m%dt%H%M%S", time.gmtime(now))
    session = ProbeSession(f"probe-{pipeline.name}-{stamp}", pipeline.checkpoint_uri, data_uri,
                           region)
    upload_packages(pipeline, built_in)
    results = run_probes(pipeline, session, launcher, read, cache=load_cache(docs, pipeline.name))
    save_cache(docs, pipeline.name, results, time.time())  # infrastructure failures left out
    return {name: r for name, r in results.items() if r.infra}


def expired(pipeline: Pipeline, cache: Mapping[str, ProbeResult], now: float) -> list[str]:
    """Candidates whose cached result is for this code and shape but older than cache_ttl."""
    search = pipeline.hardware
    if search is None:
        return []
    return [c.name for c in search.candidates
            if (r := cache.get(c.name)) is not None and not r.infra
            and r.key == cache_key(pipeline, c, search.probe_steps)
            and now - r.measured_at > search.cache_ttl_s]


def _jsonable(choice: HardwareChoice, stale: list[str]) -> dict[str, Any]:
    return {"hardware": choice.to_doc(), "expired": stale}


@click.command(name="advise")
@click.argument("pipeline_file", metavar="PIPELINE",
                type=click.Path(exists=True, dir_okay=False))
@click.option("--results", type=click.Path(exists=True, dir_okay=False),
              help="Probe results from a JSON file instead of Firestore.")
@click.option("--probe", metavar="DATA_URI",
              help="Probe the candidates without a fresh result first, on this data.")
@click.option("--deadline", metavar="SPAN",
              help="Time left (e.g. 6h)  [default: the pipeline's deadline]")
@click.option("--json", "as_json", is_flag=True, help="One JSON object on stdout.")
@target_options()
@click.pass_context
def advise_command(ctx: click.Context, pipeline_file: str, results: str | None,
                   probe: str | None, deadline: str | None, as_json: bool) -> None:
    """The table of hardware candidates of PIPELINE (a file with hardware.candidates) from
    earlier probes: measured rate, expected hours and cost, whether each fits and why, the
    choice. Nothing is launched unless --probe. Exits 1 when no candidate fits."""
    from spotorch.core.errors import ConfigError
    from spotorch.spec.loader import load_pipeline

    try:
        pipeline = load_pipeline(pipeline_file)
    except ConfigError as exc:
        raise UsageFailure(str(exc)) from None
    if pipeline.hardware is None:
        raise UsageFailure(f"{pipeline_file} lists no hardware.candidates")
    try:
        left = parse_duration(deadline) if deadline else pipeline.deadline_s
    except ValueError as exc:
        raise UsageFailure(f"--deadline {deadline!r}: {exc}") from None
    now = time.time()
    unanswered: dict[str, ProbeResult] = {}
    with tempfile.TemporaryDirectory(prefix="spotorch-advise-") as tmp:
        pipeline = built(pipeline, Path(tmp))
        if results:
            cache = _read_results(results)
        else:
            from spotorch.app.hardware_probes import load_cache
            from spotorch.operate.target import use_stack_environment

            use_stack_environment(session(ctx).target())  # the local stack's emulators
            docs = _docs()
            if probe:
                unanswered = _probe(pipeline, docs, probe, now, Path(tmp))
                now = time.time()
            cache = load_cache(docs, pipeline.name)
    choice = advise(pipeline, cache, now, left, unanswered)
    stale = expired(pipeline, cache, now)
    if as_json:
        click.echo(json.dumps(_jsonable(choice, stale), indent=2, sort_keys=True))
    else:
        click.echo("\n".join(table_lines(choice)))
        if stale:
            click.echo(f"expired (older than cache_ttl): {', '.join(stale)}; "
                       "probe again with --probe DATA_URI")
    if choice.chosen is None:
        raise click.exceptions.Exit(1)



def main(argv: list[str] | None = None) -> int:
    """`python -m spotorch.operate.advise`: the `spotorch advise` command."""
    return run(advise_command, argv, prog_name="spotorch advise")
