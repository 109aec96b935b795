"""Cold start: what a function instance imports before its first event, against the bare clients.

    .venv/bin/python benchmarks/cold_start.py [--repeat 7]

For each function, two fresh interpreters are timed (CPU time, median of --repeat runs,
interpreter start-up subtracted): (a) `import` of the client libraries that function needs and
nothing else; (b) loading
functions/main.py the way functions-framework does, then every module its first event imports
(spotorch's own modules and the same client libraries). Target: (b) <= 1.3 x (a).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

EVENT_CLIENTS = ("functions_framework", "google.cloud.firestore", "google.cloud.aiplatform_v1",
                 "google.cloud.pubsub_v1", "google.cloud.storage")
# Function -> (client libraries it needs, spotorch modules its first event imports).
FUNCTIONS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "on_object_finalized": (EVENT_CLIENTS, ("spotorch.entrypoints.wiring",
                                            "spotorch.app.arrivals", "spotorch.core.triggers")),
    "on_job_event": (EVENT_CLIENTS, ("spotorch.entrypoints.wiring",
                                     "spotorch.entrypoints.log_entries", "spotorch.app.job_events")),
    "on_tick": (EVENT_CLIENTS, ("spotorch.entrypoints.wiring", "spotorch.app.tick")),
    "on_run_event": (("functions_framework", "google.cloud.firestore"),
                     ("spotorch.entrypoints.alerts", "spotorch.adapters.notify.channels",
                      "spotorch.adapters.gcp.notification_ledger")),
}
WIRING_DEPS = ("spotorch.spec.loader", "spotorch.adapters.gcp.vertex",
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


def _ours(clients: tuple[str, ...], modules: tuple[str, ...]) -> str:
    needs_wiring = "spotorch.entrypoints.wiring" in modules
    body = [
        "import sys, importlib.util",
        f"sys.path[:0] = [{str(REPO / 'shared')!r}, {str(REPO / 'trainer')!r}]",
        f"spec = importlib.util.spec_from_file_location('main', {str(REPO / 'functions/main.py')!r})",
        "main = importlib.util.module_from_spec(spec); spec.loader.exec_module(main)",
        *(f"import {m}" for m in modules + (WIRING_DEPS if needs_wiring else ())),
        *(f"import {m}" for m in clients),
    ]
    return _TIMER.format(body="\n".join(body))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    results = {}
    for name, (clients, modules) in FUNCTIONS.items():
        bare = statistics.median(_time(_bare(clients)) for _ in range(args.repeat))
        ours = statistics.median(_time(_ours(clients, modules)) for _ in range(args.repeat))
        results[name] = {"bare_clients_s": round(bare, 3), "function_s": round(ours, 3),
                         "ratio": round(ours / bare, 3)}
        print(f"{name:<22} clients {bare:6.3f}s  function {ours:6.3f}s  ratio {ours / bare:5.2f}x",
              file=sys.stderr)
    main_only = statistics.median(_time(_ours((), ())) for _ in range(args.repeat))
    results["import functions/main.py alone"] = {"function_s": round(main_only, 3)}
    print(json.dumps(results, indent=2))
    worst = max(r["ratio"] for r in results.values() if "ratio" in r)
    print(f"worst ratio {worst:.2f}x (target <= 1.3x)", file=sys.stderr)
    return 0 if worst <= 1.3 else 1


if __name__ == "__main__":
    sys.exit(main())
