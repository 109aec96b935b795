"""The demo's BigQuery story: rows loaded into a table start a run on a snapshot of it.

The pipeline watches one table on the local stack's BigQuery emulator. Rows are loaded (a load
job); the stack publishes the job's audit entries as Eventarc would; spotorch checks the job and
the table, snapshots the table at the job's end and exports the snapshot to GCS as Parquet; the
run trains the example package on that export. While it trains more rows arrive: their snapshot
is taken and its run waits for the first (on_active_run: queue). The report adds the snapshot's
`bigquery` map (tables, snapshot_time, snapshot_tables, export_uris, objects) and the next one.
Then `spotorch rerun` runs the first run again: the table has changed since (the later rows),
yet the rerun reads the first snapshot's export at its recorded generations, with the same code
and seed, and its metrics equal the first run's (`rerun` in the report).

Registered in demo_scenarios.SCENARIOS by name; the settings are plain values so that this
module needs nothing of the demo's at import.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[3]
PIPELINE = "demo"  # the demo follows the runs of this pipeline
DATASET, TABLE_ID = "sales", "rows"
FEATURES, CLASSES = 16, 3
FIRST_ROWS, LATER_ROWS = 3000, 1500
_TRAINER_ENV = {"EXAMPLE_TOTAL_STEPS": "300", "EXAMPLE_STEP_SLEEP": "0.03",
                "EXAMPLE_CHECKPOINT_EVERY": "50", "EXAMPLE_PROGRESS_INTERVAL": "1"}


def _table(project: str) -> str:
    return f"{project}.{DATASET}.{TABLE_ID}"


def document(doc: dict[str, Any]) -> dict[str, Any]:
    """The demo pipeline watching a BigQuery table instead of a bucket."""
    project = "spotorch-local"  # the stack's project (StackConfig.project)
    doc["trigger"] = {"bigquery": {"tables": [_table(project)], "min_rows_changed": 1000,
                                   "snapshot_dataset": f"{project}.snapshots",
                                   "snapshot_ttl": "1d",
                                   "export_uri": "gs://spotorch-bq-exports/demo"},
                      "on_active_run": "queue"}
    return doc


def _client(stack: Any) -> Any:
    from google.api_core.client_options import ClientOptions
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import bigquery

    from spotorch.settings import ENV_BIGQUERY_ENDPOINT

    return bigquery.Client(project=stack.project, credentials=AnonymousCredentials(),
                           client_options=ClientOptions(
                               api_endpoint=stack.env[ENV_BIGQUERY_ENDPOINT]))


def _schema() -> list[Any]:
    from google.cloud import bigquery

    return [*(bigquery.SchemaField(f"f{i}", "FLOAT64") for i in range(FEATURES)),
            bigquery.SchemaField("label", "INT64")]


def _load(client: Any, table: str, x: Any, y: Any) -> None:
    """One load job of the rows (newline-delimited JSON, as load_table_from_json sends it)."""
    from google.cloud import bigquery

    rows = [{**{f"f{i}": float(v) for i, v in enumerate(row)}, "label": int(label)}
            for row, label in zip(x, y, strict=True)]
    client.load_table_from_json(rows, table, job_config=bigquery.LoadJobConfig(
        schema=_schema())).result()


def arrive(stack: Any, docs: Any, say: Callable[[str], None]) -> None:
    """Create the table, insert the first rows; once the first run trains, insert more."""
    from google.cloud import bigquery

    sys.path.insert(0, str(REPO / "examples"))
    from make_data import make_dataset

    client = _client(stack)
    client.create_dataset(DATASET, exists_ok=True)
    client.create_dataset("snapshots", exists_ok=True)
    table = _table(stack.project)
    client.create_table(bigquery.Table(table, schema=_schema()), exists_ok=True)
    x, y = make_dataset(rows=FIRST_ROWS + LATER_ROWS, features=FEATURES, classes=CLASSES, seed=0)
    _load(client, table, x[:FIRST_ROWS], y[:FIRST_ROWS])
    say(f"loaded {FIRST_ROWS} rows into {table} (a load job on the emulator)")

    def later() -> None:
        from spotorch.core.model import Run, RunStatus

        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            runs = [Run.from_dict(d) for d in docs.query("runs", "pipeline", PIPELINE)]
            if any(r.status is RunStatus.RUNNING for r in runs):
                _load(client, table, x[FIRST_ROWS:], y[FIRST_ROWS:])
                say(f"loaded {LATER_ROWS} more rows while the first run trains")
                return
            time.sleep(0.5)
    threading.Thread(target=later, name="demo-bigquery-later-rows", daemon=True).start()


def extend(report: dict[str, Any], run: Any, stack: Any) -> None:
    """The snapshot's bigquery map, and the next snapshot's run (queued behind the first)."""
    from spotorch.adapters.gcp.firestore import FirestoreDocumentStore
    from spotorch.app.snapshots import SnapshotState
    from spotorch.core.model import Run
    from spotorch.settings import COLLECTION_SNAPSHOTS

    docs = FirestoreDocumentStore(project=stack.project)
    snapshots = {s.snapshot_id: s for s in (SnapshotState.from_doc(d) for d in docs.query(
        COLLECTION_SNAPSHOTS, "pipeline", PIPELINE))}
    mine = snapshots.get(run.snapshot_id) if run is not None else None
    report["bigquery"] = None if mine is None else mine.bigquery
    runs = sorted((Run.from_dict(d) for d in docs.query("runs", "pipeline", PIPELINE)),
                  key=lambda r: r.created_at)
    later = [r for r in runs if run is None or r.run_id != run.run_id]
    report["next_snapshot"] = None if not later else {
        "run_id": later[0].run_id, "status": str(later[0].status),
        "bigquery": (snapshots[later[0].snapshot_id].bigquery
                     if later[0].snapshot_id in snapshots else None)}
    if run is not None and str(run.status) == "SUCCEEDED":
        report["rerun"] = _rerun(run, stack, docs)


RERUN_TIMEOUT_S = 240.0  # the rerun queues behind the next snapshot's run, then trains


def _rerun(run: Any, stack: Any, docs: Any) -> dict[str, Any]:
    """`spotorch rerun` of the first run (through the CLI and the api, as an operator would),
    waited for; whether its metrics (data digest included) equal the first run's."""
    from spotorch.core.model import Run
    from spotorch_trainer import GcsStorage

    cli = subprocess.run([sys.executable, "-m", "spotorch.operate.cli", "rerun", run.run_id,
                          "--request-id", "demo", "--json"],
                         env={**os.environ, **stack.env, "COLUMNS": "200"}, capture_output=True,
                         text=True, timeout=120, cwd=REPO)
    if cli.returncode != 0:
        return {"error": cli.stderr.strip()[-500:]}
    rerun_id = str(json.loads(cli.stdout)["run_id"])
    deadline = time.monotonic() + RERUN_TIMEOUT_S
    again: Run | None = None
    while time.monotonic() < deadline:
        found, _ = docs.get("runs", rerun_id)
        again = Run.from_dict(found) if found else None
        if again is not None and again.status.terminal:
            break
        time.sleep(1.0)
    if again is None or not again.status.terminal:
        return {"run_id": rerun_id, "error": f"not finished after {RERUN_TIMEOUT_S:g}s"}

    def metrics(of: Run) -> dict[str, Any] | None:
        """The final metrics, less the serving latencies timed on the trainer's machine
        (spotorch_trainer.latency.MEASURED): the rest a rerun reproduces exactly."""
        from spotorch_trainer.latency import MEASURED

        try:
            loaded: dict[str, Any] = json.loads(GcsStorage().read(f"{of.output_uri}/metrics.json"))
        except Exception:  # no model: the comparison says so
            return None
        return {k: v for k, v in loaded.items() if k not in MEASURED}

    first, rerun = metrics(run), metrics(again)
    return {"run_id": rerun_id, "status": str(again.status), "rerun_of": again.rerun_of,
            "same_data": (again.provenance or {}).get("data") == (run.provenance or {}).get("data"),
            "metrics": rerun, "metrics_equal": first is not None and first == rerun}


SETTINGS: dict[str, Any] = {
    "name": "bigquery",
    "title": "rows in a BigQuery table start a run on its Parquet export",
    "setup": f"Rows are loaded into a BigQuery table on the local emulator ({FIRST_ROWS}, then "
             f"{LATER_ROWS} more once the first run trains); the stack publishes each load job's "
             "audit entries as Eventarc would.",
    "expected_status": "SUCCEEDED",
    "recovery": {"escalation": "never", "backoff_base": "1s", "decision_interval": "2s"},
    "trainer_env": _TRAINER_ENV,
    "document": document,
    "arrival": arrive,
    "extend": extend,
}
