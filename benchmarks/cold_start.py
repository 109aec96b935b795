"""Cold start: what a function instance imports before its first event, against the bare clients.

    .venv/bin/python benchmarks/cold_start.py [--repeat 7]

For each function, two fresh interpreters are timed (CPU time, median of --repeat runs,
interpreter start-up subtracted): (a) `import` of the client libraries that function needs and
nothing else; (b) loading
functions/main.py the way functions-framework does, then every module its first event imports
(spotorch's own modules and the same client libraries) and, for the functions that know
pipelines, reading them as production_deps does at the first event: the examples' pipelines,
validated beforehand into pipelines.json as deploy/package.py does (--yaml: from the YAML files
with the loader instead, the fallback without that file). Target: (b) <= 1.3 x (a).

By default (b) runs what is deployed: the function bundle deploy/package.py builds from the
examples' pipelines, unpacked (production modules, pipelines.json, hash-checked bytecode).
--source runs the repository's source tree instead (as before; where PYTHONDONTWRITEBYTECODE is
set, as here, every spotorch module is compiled on every start, while the clients load the
bytecode pip wrote).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

EVENT_CLIENTS = ("functions_framework", "google.cloud.firestore", "google.cloud.aiplatform_v1",
                 "google.cloud.pubsub_v1", "google.cloud.storage")
# Function -> (client libraries it needs, spotorch modules its first event imports).
FUNCTIONS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "on_object_finalized": (EVENT_CLIENTS, ("spotorch.entrypoints.wiring",
                                            "spotorch.app.arrivals", "spotorch.core.triggers")),
    # BigQuery's audit entries: the BigQuery client as well (built at the first table change).
    "on_table_changed": ((*EVENT_CLIENTS, "google.cloud.bigquery"),
                         ("spotorch.entrypoints.wiring", "spotorch.app.table_intake",
                          "spotorch.core.table_changes", "spotorch.adapters.gcp.bigquery")),
    "on_job_event": (EVENT_CLIENTS, ("spotorch.entrypoints.wiring",
                                     "spotorch.entrypoints.log_entries", "spotorch.app.job_events")),
    "on_tick": (EVENT_CLIENTS, ("spotorch.entrypoints.wiring", "spotorch.app.tick")),
    # The operator api: its first request reads or changes a run (status, list, cancel, retry).
    "api": (EVENT_CLIENTS, ("spotorch.entrypoints.wiring", "spotorch.entrypoints.functions",
                            "spotorch.app.views", "spotorch.app.queries", "spotorch.app.runs",
                            "spotorch.adapters.gcp.firestore_reads")),
    "on_run_event": (("functions_framework", "google.cloud.firestore"),
                     ("spotorch.entrypoints.alerts", "spotorch.adapters.notify.channels",
                      "spotorch.adapters.gcp.notification_ledger")),
}
WIRING_DEPS = ("spotorch.spec.compiled", "spotorch.adapters.gcp.vertex",
               "spotorch.adapters.gcp.pubsub", "spotorch.adapters.gcp.firestore",
               "spotorch.adapters.gcp.checkpoints", "spotorch_trainer.checkpoints")


def _time(code: str) -> float:
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=REPO)
    return float(out.stdout.strip().splitlines()[-1])


# CPU time of the importing process, not wall time: on a shared 2-core machine wall time swings
# by half with the load; the CPU an import burns does not (it is what a cold instance pays).
_TIMER = ("import time; t0 = time.process_time()\n{body}\n"
          "print(time.process_time() - t0)")


def _bare(clients: tuple[str, ...]) -> str:
    return _TIMER.format(body="\n".join(f"import {m}" for m in clients))


def _ours(clients: tuple[str, ...], modules: tuple[str, ...], pipelines: Path | None = None,
          root: Path | None = None) -> str:
    needs_wiring = "spotorch.entrypoints.wiring" in modules
    read = [] if pipelines is None or not needs_wiring else [
        "from spotorch.spec.compiled import function_pipelines",
        f"assert function_pipelines({str(pipelines)!r})"]
    paths = [str(root)] if root else [str(REPO / "shared"), str(REPO / "trainer")]
    main = root / "main.py" if root else REPO / "functions" / "main.py"
    body = [
        "import sys, importlib.util",
        f"sys.path[:0] = {paths!r}",
        f"spec = importlib.util.spec_from_file_location('main', {str(main)!r})",
        "main = importlib.util.module_from_spec(spec); spec.loader.exec_module(main)",
        *(f"import {m}" for m in modules + (WIRING_DEPS if needs_wiring else ())),
        *(f"import {m}" for m in clients),
        *read,
    ]
    return _TIMER.format(body="\n".join(body))


def _bundle(yaml_only: bool) -> Path:
    """The function bundle of the examples' pipelines, unpacked (its pipelines/ next to it)."""
    import importlib.util
    import zipfile

    spec = importlib.util.spec_from_file_location("spotorch_deploy_package",
                                                  REPO / "deploy" / "package.py")
    assert spec is not None and spec.loader is not None
    package = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = package
    spec.loader.exec_module(package)
    where = Path(tempfile.mkdtemp(prefix="cold-start-bundle-"))
    bundle = package.build(REPO, REPO / "examples" / "pipelines", where / "bundle.zip")
    with zipfile.ZipFile(bundle.path) as zf:
        zf.extractall(where / "unpacked")
    if yaml_only:
        (where / "unpacked" / "pipelines" / "pipelines.json").unlink()
    return where / "unpacked"


def _pipelines(yaml_only: bool) -> Path:
    """The examples' pipelines in a directory of their own, compiled unless yaml_only."""
    where = Path(tempfile.mkdtemp(prefix="cold-start-pipelines-"))
    for file in (REPO / "examples" / "pipelines").glob("*.yaml"):
        shutil.copy2(file, where / file.name)
    if not yaml_only:
        sys.path[:0] = [str(REPO / "shared"), str(REPO / "trainer")]
        from spotorch.spec.compiled import write_compiled
        from spotorch.spec.loader import load_pipelines

        write_compiled(load_pipelines(where), where)
    return where


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--yaml", action="store_true",
                        help="read the pipelines from YAML (no pipelines.json), as before")
    parser.add_argument("--source", action="store_true",
                        help="the repository's source tree instead of the unpacked bundle")
    args = parser.parse_args()
    root = None if args.source else _bundle(args.yaml)
    pipelines = _pipelines(args.yaml) if root is None else root / "pipelines"
    results = {}
    for name, (clients, modules) in FUNCTIONS.items():
        # Interleaved, so a change in the machine's load reaches both sides alike.
        pairs = [(_time(_bare(clients)), _time(_ours(clients, modules, pipelines, root)))
                 for _ in range(args.repeat)]
        bare = statistics.median(b for b, _ in pairs)
        ours = statistics.median(o for _, o in pairs)
        results[name] = {"bare_clients_s": round(bare, 3), "function_s": round(ours, 3),
                         "ratio": round(ours / bare, 3)}
        print(f"{name:<22} clients {bare:6.3f}s  function {ours:6.3f}s  ratio {ours / bare:5.2f}x",
              file=sys.stderr)
    main_only = statistics.median(_time(_ours((), (), None, root)) for _ in range(args.repeat))
    results["import functions/main.py alone"] = {"function_s": round(main_only, 3)}
    print(json.dumps(results, indent=2))
    worst = max(r["ratio"] for r in results.values() if "ratio" in r)
    print(f"worst ratio {worst:.2f}x (target <= 1.3x)", file=sys.stderr)
    shutil.rmtree(pipelines if root is None else root.parent, ignore_errors=True)
    return 0 if worst <= 1.3 else 1


if __name__ == "__main__":
    sys.exit(main())
