"""BigQuery as a data source through the whole local stack (issue 30): rows inserted into a table
on the BigQuery emulator, the audit entry the stack publishes for the job starts a run on a
snapshot (of a query of the table; the demo story: of the table) exported to fake GCS as
Parquet, the example trainer trains on it and the run succeeds; rows inserted during training
make the next snapshot, which waits its turn."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from spotorch.adapters.gcp.firestore import FirestoreDocumentStore
from spotorch.app.snapshots import SnapshotState
from spotorch.core.model import Run, RunStatus
from spotorch.local.stack import DevStack
from spotorch.settings import COLLECTION_SNAPSHOTS, ENV_BIGQUERY_ENDPOINT

pytestmark = [pytest.mark.emulator, pytest.mark.slow]
ROOT = Path(__file__).resolve().parent.parent
PROJECT = "spotorch-local"
TABLE = f"{PROJECT}.sales.rows"
FEATURES = 4
QUERY = (f"SELECT {', '.join(f'f{i}' for i in range(FEATURES))}, label FROM `{TABLE}` "
         "WHERE label IN (0, 1)")


def pipeline_file() -> dict[str, Any]:
    demo = yaml.safe_load((ROOT / "examples" / "pipelines" / "demo.yaml").read_text())
    demo["name"] = "bq"
    demo["trigger"] = {"bigquery": {
        "tables": [TABLE], "min_rows_changed": 20, "snapshot_dataset": f"{PROJECT}.snapshots",
        # the query form through the whole stack (the table form: the demo story below)
        "query": QUERY,
        "export_uri": "gs://spotorch-bq-exports/bq", "snapshot_ttl": "1d"},
        "on_active_run": "queue"}
    demo["job"]["worker_pools"][0]["python_package"]["source"] = str(ROOT / "examples" / "trainer")
    demo["job"]["worker_pools"][0]["env"] = {"EXAMPLE_TOTAL_STEPS": "60",
                                             "EXAMPLE_STEP_SLEEP": "0.05",
                                             "EXAMPLE_CHECKPOINT_EVERY": "20"}
    demo["checkpoint_uri"] = "gs://spotorch-checkpoints/bq"
    demo["output_uri"] = "gs://spotorch-models/bq"
    demo.pop("routes", None)
    return dict(demo)


def insert(client: Any, rows: int, seed: int) -> None:
    import random

    rng = random.Random(seed)
    values = ", ".join(
        "(" + ", ".join(f"{rng.gauss(label * 2.0, 1.0):.4f}" for _ in range(FEATURES))
        + f", {label})" for label in (i % 2 for i in range(rows)))
    columns = ", ".join(f"f{i}" for i in range(FEATURES))
    client.query(f"INSERT INTO sales.rows ({columns}, label) VALUES {values}").result()


def test_rows_in_a_table_start_a_run_on_its_parquet_export(tmp_path: Path) -> None:
    from google.api_core.client_options import ClientOptions
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import bigquery

    (tmp_path / "pipelines").mkdir()
    (tmp_path / "pipelines" / "bq.yaml").write_text(yaml.safe_dump(pipeline_file()))
    with DevStack(pipelines_dir=tmp_path / "pipelines", run_dir=tmp_path / "stack",
                  tick_seconds=2.0, project=PROJECT) as stack:
        saved = dict(os.environ)
        os.environ.update(stack.env)
        try:
            client = bigquery.Client(project=PROJECT, credentials=AnonymousCredentials(),
                                     client_options=ClientOptions(
                                         api_endpoint=stack.env[ENV_BIGQUERY_ENDPOINT]))
            client.create_dataset("sales")
            client.create_dataset("snapshots")
            client.create_table(bigquery.Table(TABLE, schema=[
                *(bigquery.SchemaField(f"f{i}", "FLOAT64") for i in range(FEATURES)),
                bigquery.SchemaField("label", "INT64")]))
            insert(client, 10, seed=1)  # below min_rows_changed: no snapshot yet
            insert(client, 30, seed=2)
            docs = FirestoreDocumentStore(project=PROJECT)
            began = time.monotonic()

            def runs() -> list[Run]:
                return sorted((Run.from_dict(d) for d in docs.query("runs", "pipeline", "bq")),
                              key=lambda r: r.created_at)
            while time.monotonic() - began < 60 and not runs():
                time.sleep(0.5)
            [first] = runs()
            insert(client, 25, seed=3)  # more rows while the first run trains
            while time.monotonic() - began < 80 and runs()[0].status is not RunStatus.SUCCEEDED:
                time.sleep(0.5)
            first = runs()[0]
            assert first.status is RunStatus.SUCCEEDED, first.status
            snaps = [SnapshotState.from_doc(d)
                     for d in docs.query(COLLECTION_SNAPSHOTS, "pipeline", "bq")]
            mine = next(s for s in snaps if s.snapshot_id == first.snapshot_id)
            assert mine.bigquery is not None
            assert mine.bigquery["tables"] == [TABLE]
            assert mine.bigquery["export_uris"][0].endswith("/query/part-*.parquet")
            assert mine.bigquery["query"] == QUERY and mine.bigquery["query_sha256"]
            assert mine.bigquery["objects"] and first.data_uri == mine.data_uri
            # provenance (issue 30's first half) names the table, snapshot time and export
            assert first.provenance is not None
            assert first.provenance["data"]["bigquery"] == mine.bigquery
            # The rows inserted during training made the next snapshot: its run came after.
            while time.monotonic() - began < 85 and len(runs()) < 2:
                time.sleep(0.5)
            assert len(runs()) == 2
            second = runs()[1]
            assert second.snapshot_id != first.snapshot_id
        finally:
            os.environ.clear()
            os.environ.update(saved)


def test_the_bigquery_demo_story_trains_on_the_export_of_a_loaded_table() -> None:
    """`spotorch demo --scenario bigquery --json`: a load job's rows, not a DML job's."""
    import json
    import subprocess
    import sys

    began = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "spotorch.local.demo", "--scenario",
                           "bigquery", "--json", "--timeout", "80"],
                          capture_output=True, text=True, timeout=400, cwd=ROOT,
                          env={**os.environ})
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout)
    assert report["status"] == "SUCCEEDED", report["history"]
    bq = report["bigquery"]
    assert bq["tables"] == ["spotorch-local.sales.rows"]
    assert bq["snapshot_time"].endswith("Z") and bq["export_uris"]
    assert [o["name"].rsplit("/", 1)[-1] for o in bq["objects"]] == ["part-000000000000.parquet"]
    # The "done when": provenance names the table, the snapshot time and the export.
    assert report["provenance"]["data"]["bigquery"] == bq
    # It trained on the whole first load (3000 rows: 80 % train, 20 % test), not on more.
    assert (report["metrics"]["n_train"], report["metrics"]["n_test"]) == (2400, 600)
    # The rows loaded during training made their own snapshot; its run came after the first.
    later = report["next_snapshot"]
    assert later is not None and later["bigquery"]["snapshot_time"] > bq["snapshot_time"]
    assert later["run_id"] != report["run_id"]
    # A rerun of the first run, after the table changed: the same export, the same metrics.
    rerun = report["rerun"]
    assert rerun["status"] == "SUCCEEDED", rerun
    assert rerun["rerun_of"] == report["run_id"] and rerun["same_data"]
    assert rerun["metrics_equal"] and rerun["metrics"]["n_train"] == 2400
    assert time.monotonic() - began < 300


def test_a_lost_bigquery_event_is_repaired_by_the_tick_on_the_stack(tmp_path: Path) -> None:
    """Every audit entry is lost (the front hands them to nobody): the tick's tables.get sees
    the table changed and starts the run on its snapshot."""
    from google.api_core.client_options import ClientOptions
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import bigquery

    (tmp_path / "pipelines").mkdir()
    (tmp_path / "pipelines" / "bq.yaml").write_text(yaml.safe_dump(pipeline_file()))
    with DevStack(pipelines_dir=tmp_path / "pipelines", run_dir=tmp_path / "stack",
                  tick_seconds=2.0, project=PROJECT) as stack:
        saved = dict(os.environ)
        os.environ.update(stack.env)
        try:
            lost: list[dict[str, Any]] = []
            stack._bigquery_front.on_job_done = lost.append  # Eventarc delivers nothing
            client = bigquery.Client(project=PROJECT, credentials=AnonymousCredentials(),
                                     client_options=ClientOptions(
                                         api_endpoint=stack.env[ENV_BIGQUERY_ENDPOINT]))
            client.create_dataset("sales")
            client.create_dataset("snapshots")
            client.create_table(bigquery.Table(TABLE, schema=[
                *(bigquery.SchemaField(f"f{i}", "FLOAT64") for i in range(FEATURES)),
                bigquery.SchemaField("label", "INT64")]))
            docs = FirestoreDocumentStore(project=PROJECT)
            began = time.monotonic()
            # The first tick that sees the table takes it as it is (empty) for the baseline.
            while time.monotonic() - began < 30 and \
                    docs.get("table_watches", "bq")[0] is None:
                time.sleep(0.5)
            assert docs.get("table_watches", "bq")[0] is not None
            insert(client, 30, seed=4)
            assert lost, "the front saw the job end"
            inserted = time.monotonic()
            runs: list[Run] = []
            while time.monotonic() - inserted < 40 and not runs:
                runs = [Run.from_dict(d) for d in docs.query("runs", "pipeline", "bq")]
                time.sleep(0.5)
            assert len(runs) == 1, "the tick did not start the run"
            assert time.monotonic() - inserted < 10 * 2.0
            snap = next(SnapshotState.from_doc(d) for d in docs.query(
                COLLECTION_SNAPSHOTS, "pipeline", "bq"))
            assert snap.bigquery is not None and snap.bigquery["objects"]
        finally:
            os.environ.clear()
            os.environ.update(saved)


def test_an_insert_through_jobs_query_starts_a_run_on_the_stack(tmp_path: Path) -> None:
    """`query_and_wait("INSERT ...")` goes through jobs.query, which BigQuery logs as
    ...JobService.Query: its entries alone (the tick is too slow to help here) start the run."""
    from google.api_core.client_options import ClientOptions
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import bigquery

    from spotorch.entrypoints.audit_entries import QUERY_JOB

    (tmp_path / "pipelines").mkdir()
    (tmp_path / "pipelines" / "bq.yaml").write_text(yaml.safe_dump(pipeline_file()))
    with DevStack(pipelines_dir=tmp_path / "pipelines", run_dir=tmp_path / "stack",
                  tick_seconds=3600.0, project=PROJECT) as stack:
        saved = dict(os.environ)
        os.environ.update(stack.env)
        try:
            seen: list[dict[str, Any]] = []
            deliver = stack._bigquery_front.on_job_done

            def record(entry: dict[str, Any]) -> None:
                seen.append(entry)
                deliver(entry)
            stack._bigquery_front.on_job_done = record
            client = bigquery.Client(project=PROJECT, credentials=AnonymousCredentials(),
                                     client_options=ClientOptions(
                                         api_endpoint=stack.env[ENV_BIGQUERY_ENDPOINT]))
            client.create_dataset("sales")
            client.create_dataset("snapshots")
            client.create_table(bigquery.Table(TABLE, schema=[
                *(bigquery.SchemaField(f"f{i}", "FLOAT64") for i in range(FEATURES)),
                bigquery.SchemaField("label", "INT64")]))
            columns = ", ".join(f"f{i}" for i in range(FEATURES))
            values = ", ".join("(" + ", ".join(f"{label * 2.0 + i * 0.01:.4f}"
                                               for _ in range(FEATURES)) + f", {label})"
                               for i, label in ((i, i % 2) for i in range(60)))
            client.query_and_wait(f"INSERT INTO sales.rows ({columns}, label) VALUES {values}")
            assert {e["protoPayload"]["methodName"] for e in seen} == {QUERY_JOB}
            docs = FirestoreDocumentStore(project=PROJECT)
            inserted = time.monotonic()
            runs: list[Run] = []
            while time.monotonic() - inserted < 60 and not runs:
                runs = [Run.from_dict(d) for d in docs.query("runs", "pipeline", "bq")]
                time.sleep(0.5)
            assert len(runs) == 1, "an INSERT through jobs.query started no run"
        finally:
            os.environ.clear()
            os.environ.update(saved)
