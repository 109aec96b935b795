"""How long `spotorch runs` and `spotorch show` take on a local stack with 100 runs.

    .venv/bin/python benchmarks/cli_reads.py [--runs 100] [--repeat 5]

Starts Google's Firestore emulator, writes --runs runs the way the service stores them (three
attempts each, two preempted, a 40-entry history, checkpoints, metrics), then times the CLI as
a person runs it: a fresh `spotorch` process each time (wall time, median of --repeat), reading
through the emulator, prices from examples/pipelines/demo.yaml. Target: under 1 s each. The
wall time includes the emulator's answer (a Java process on the same cores); the CPU time is the
command's own (user + system), which the load of a shared machine changes least.
Also prints where the time of one `runs` goes (imports, the query, rendering) from -X importtime
and the process's own clock.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO / "shared"), str(REPO / "trainer")]

from spotorch.core.model import (
    Attempt,
    AttemptState,
    Checkpoint,
    Counters,
    FailureClass,
    HistoryEntry,
    Progress,
    Run,
    RunStatus,
)
from spotorch.core.pipeline import Capacity

T0 = 1_800_000_000.0
PIPELINES = REPO / "examples" / "pipelines" / "demo.yaml"


def a_run(i: int) -> Run:
    """A finished run like the demo's: preempted twice on Spot, succeeded on standard."""
    start = T0 + i * 600
    job = "projects/spotorch-local/locations/us-central1/customJobs/"
    attempts = tuple(
        Attempt(number=n, capacity=Capacity.SPOT if n < 3 else Capacity.STANDARD,
                region="us-central1", state=AttemptState.FAILED if n < 3 else AttemptState.SUCCEEDED,
                job_name=f"{job}{i * 10 + n}", created_at=start + n * 100,
                started_at=start + n * 100 + 20, ended_at=start + n * 100 + 90,
                end_reason="preempted: Spot VMs taken back" if n < 3 else "succeeded",
                failure=FailureClass.PREEMPTED if n < 3 else None,
                resumed_from_step=None if n == 1 else 100 * (n - 1),
                progress_step=100 * n + 20)
        for n in (1, 2, 3))
    history = tuple(HistoryEntry(start + k * 7, f"step {k}", "why " * 8) for k in range(40))
    return Run(run_id=f"demo-{i:04d}", pipeline="demo", status=RunStatus.SUCCEEDED,
               created_at=start, data_uri=f"gs://spotorch-landing/datasets/demo/s{i}/",
               checkpoint_uri="gs://spotorch-checkpoints/demo",
               output_uri=f"gs://spotorch-models/demo/demo-{i:04d}", updated_at=start + 400,
               attempts=attempts, counters=Counters(preemptions=2),
               progress=Progress(step=320, total_steps=320, at=start + 390, rate=4.2,
                                 metrics={"loss": 0.12, "accuracy": 0.91}),
               latest_checkpoint=Checkpoint(300, "gs://spotorch-checkpoints/demo/step-300"),
               history=history, escalated={"to": "standard", "reason": "2 preemptions"})


def _median_s(argv: list[str], env: dict[str, str], repeat: int) -> tuple[float, float]:
    """Median wall time and median CPU time (user + system) of a fresh process running argv:
    on a shared machine the wall time swings with the load, the CPU a command burns does not."""
    walls, cpus = [], []
    for _ in range(repeat):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        began = time.perf_counter()
        done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)
        walls.append(time.perf_counter() - began)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpus.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
        if done.returncode != 0:
            raise SystemExit(f"{' '.join(argv)} failed: {done.stderr}")
    return statistics.median(walls), statistics.median(cpus)


def _imports_s(argv: list[str], env: dict[str, str]) -> dict[str, float]:
    """Cumulative import time of the heaviest top-level packages of one run (-X importtime)."""
    done = subprocess.run([sys.executable, "-X", "importtime", *argv[1:]], env=env,
                          capture_output=True, text=True, timeout=120)
    top: dict[str, float] = {}
    for line in done.stderr.splitlines():
        if not line.startswith("import time:") or "|" not in line:
            continue
        _, cumulative, name = (p.strip() for p in line[len("import time:"):].split("|"))
        if not name.startswith(" ") and cumulative.isdigit():  # a top-level import
            top[name.strip()] = int(cumulative) / 1e6
    return dict(sorted(top.items(), key=lambda kv: -kv[1])[:6])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    from spotorch.adapters.gcp.firestore import FirestoreDocumentStore
    from spotorch.app.run_store import DocumentRunStore
    from spotorch.local.emulators import start_firestore

    with tempfile.TemporaryDirectory() as tmp:
        emulator = start_firestore(Path(tmp))
        try:
            os.environ["FIRESTORE_EMULATOR_HOST"] = emulator.address
            store = DocumentRunStore(FirestoreDocumentStore(project="bench"))
            for i in range(args.runs):
                store.save(replace(a_run(i)), None)
            env = {**os.environ, "FIRESTORE_EMULATOR_HOST": emulator.address,
                   "SPOTORCH_PROJECT": "bench", "SPOTORCH_API_URL": "http://127.0.0.1:9/",
                   "SPOTORCH_PIPELINES": str(PIPELINES), "SPOTORCH_STATE": f"{tmp}/none.json",
                   "XDG_CONFIG_HOME": tmp, "COLUMNS": "200",
                   "PYTHONPATH": os.pathsep.join([str(REPO / "shared"), str(REPO / "trainer")])}
            cli = [sys.executable, "-m", "spotorch.operate.cli"]
            newest = f"demo-{args.runs - 1:04d}"
            cases = {"spotorch runs": [*cli, "runs"],
                     "spotorch runs --limit 100": [*cli, "runs", "--limit", "100"],
                     "spotorch runs --json --limit 100": [*cli, "runs", "--json", "--limit", "100"],
                     f"spotorch show {newest}": [*cli, "show", newest],
                     "spotorch --help": [*cli, "--help"]}
            print(f"{args.runs} runs in the Firestore emulator; a fresh process each time, "
                  f"median of {args.repeat}; load average {os.getloadavg()[0]:.1f} on "
                  f"{os.cpu_count()} cores")
            print(f"  {'command':<36} {'wall':>7} {'CPU':>7}")
            for name, argv in cases.items():
                wall, cpu = _median_s(argv, env, args.repeat)
                print(f"  {name:<36} {wall:6.2f}s {cpu:6.2f}s")
            print("  heaviest imports of `spotorch runs` (cumulative, s):",
                  ", ".join(f"{k} {v:.2f}" for k, v in _imports_s(cases["spotorch runs"], env).items()))
        finally:
            emulator.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
