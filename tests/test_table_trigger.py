"""The BigQuery trigger (issue 30): the pipeline format, the audit-log CloudEvent, and the intake
on in-memory adapters: batching, dedupe, forged events, the snapshot and its export, and the
tick that repairs a lost event. tests/test_table_source_contract.py runs the adapter against
the BigQuery emulator."""

from __future__ import annotations

import io
import json
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from cloudevents.conversion import to_structured
from cloudevents.http import CloudEvent

from fakes import fake_deps
from spotorch.adapters.memory.tables import InMemoryTables
from spotorch.adapters.memory.twins import InMemoryObjectStore, InMemoryPublisher, ManualClock
from spotorch.app import table_intake
from spotorch.app.deps import Deps
from spotorch.app.snapshots import SnapshotState
from spotorch.app.tick import reconcile
from spotorch.core import table_changes
from spotorch.core.errors import InvalidEvent
from spotorch.core.pipeline import BigQuerySource, JobTemplate, Pipeline, Trigger
from spotorch.core.pipeline_form import from_form, to_form
from spotorch.core.table_changes import (
    MAX_JOB_ATTEMPTS,
    TableChange,
    Watch,
    query_as_of,
    query_problems,
    query_sha256,
    snapshot_id_of,
)
from spotorch.entrypoints import audit_entries
from spotorch.entrypoints import functions as entry
from spotorch.entrypoints.audit_entries import (
    AUDIT_LOG_TYPE,
    INSERT_JOB,
    METADATA_TYPE,
    QUERY_JOB,
    parse_audit_event,
)
from spotorch.settings import COLLECTION_SNAPSHOTS, COLLECTION_TABLE_WATCHES
from spotorch.spec.event_schemas import validate_event
from spotorch.spec.loader import check_file

TABLE = "demo-proj.sales.rows"
MAIN = str(Path(__file__).resolve().parent.parent / "functions" / "main.py")


# --- the pipeline format ------------------------------------------------------------------------

GOOD = """
name: bq
trigger:
  bigquery:
    tables: [demo-proj.sales.rows]
    min_rows_changed: 10
    quiet_period: 5m
    min_interval: 1h
    snapshot_dataset: demo-proj.snapshots
    snapshot_ttl: 2d
    export_uri: gs://exports/bq
  on_active_run: queue
job:
  worker_pools: [{image_uri: img, machine_type: n1-standard-4}]
checkpoint_uri: gs://ckpts/c
output_uri: gs://models/o
"""


def test_a_bigquery_trigger_loads(tmp_path: Path) -> None:
    (tmp_path / "p.yaml").write_text(GOOD)
    pipeline, problems = check_file(tmp_path / "p.yaml")
    assert problems == ()
    assert pipeline is not None
    source = pipeline.trigger.bigquery
    assert source == BigQuerySource(tables=(TABLE,), min_rows_changed=10, quiet_period_s=300.0,
                                    min_interval_s=3600.0,
                                    snapshot_dataset="demo-proj.snapshots",
                                    snapshot_ttl_s=2 * 86400.0, export_uri="gs://exports/bq")
    assert pipeline.trigger.bucket == ""
    # The functions read the compiled form: the source survives it.
    assert from_form(to_form(pipeline)) == pipeline


def test_every_problem_of_a_bigquery_trigger_is_listed_at_load(tmp_path: Path) -> None:
    (tmp_path / "p.yaml").write_text(GOOD.replace(
        "  bigquery:", "  bucket: landing\n  batch: marker\n  bigquery:").replace(
        "[demo-proj.sales.rows]", "[rows]").replace("min_rows_changed: 10", "min_rows_changed: 0")
        .replace("export_uri: gs://exports/bq", "export_uri: gs://ckpts/c/exports"))
    _, problems = check_file(tmp_path / "p.yaml")
    said = {p.path: p.message for p in problems}
    assert "exactly one source" in said["trigger"]
    assert "Cloud Storage trigger only" in said["trigger.batch"]
    assert "project.dataset.table" in said["trigger.bigquery.tables[0]"]
    assert "at least 1" in said["trigger.bigquery.min_rows_changed"]
    assert "checkpoint_uri" in said["trigger.bigquery.export_uri"]


def test_two_watched_tables_of_one_name_are_refused_at_load(tmp_path: Path) -> None:
    """Their snapshot tables and export folders are named after the table: they would be one."""
    (tmp_path / "p.yaml").write_text(GOOD.replace(
        "[demo-proj.sales.rows]", "[demo-proj.sales.rows, demo-proj.archive.rows]"))
    _, problems = check_file(tmp_path / "p.yaml")
    [problem] = [p for p in problems if p.path == "trigger.bigquery.tables"]
    assert "demo-proj.sales.rows and demo-proj.archive.rows" in problem.message


def test_a_trigger_without_a_source_is_refused(tmp_path: Path) -> None:
    doc = GOOD.split("trigger:")[0] + "trigger:\n  on_active_run: queue\n" + \
        GOOD.split("  on_active_run: queue\n")[1]
    (tmp_path / "p.yaml").write_text(doc)
    _, problems = check_file(tmp_path / "p.yaml")
    assert any(p.path == "trigger" and "neither" in p.message for p in problems), problems



QUERY = "SELECT x, label FROM `demo-proj.sales.rows` WHERE label = 1"


def test_a_query_trigger_loads_and_survives_the_compiled_form(tmp_path: Path) -> None:
    (tmp_path / "p.yaml").write_text(GOOD.replace(
        "    min_rows_changed: 10\n", f"    min_rows_changed: 10\n    query: {QUERY}\n"))
    pipeline, problems = check_file(tmp_path / "p.yaml")
    assert problems == ()
    assert pipeline is not None and pipeline.trigger.bigquery is not None
    assert pipeline.trigger.bigquery.query == QUERY
    assert from_form(to_form(pipeline)) == pipeline


def test_every_problem_of_a_query_is_listed_at_load(tmp_path: Path) -> None:
    query = ("SELECT * FROM `demo-proj.sales.rows` r JOIN `demo-proj.sales.other` o USING (id) "
             "JOIN sales.extra e USING (id) FOR SYSTEM_TIME AS OF CURRENT_TIMESTAMP(); SELECT 1")
    (tmp_path / "p.yaml").write_text(GOOD.replace(
        "    min_rows_changed: 10\n", f"    min_rows_changed: 10\n    query: \"{query}\"\n"))
    _, problems = check_file(tmp_path / "p.yaml")
    said = [p.message for p in problems if p.path == "trigger.bigquery.query"]
    assert len(said) == 4, said
    assert any("one statement" in m for m in said)
    assert any("FOR SYSTEM_TIME" in m for m in said)
    assert any("reads sales.extra" in m and "backticked" in m for m in said)
    assert any("`demo-proj.sales.other`, which is not in tables" in m for m in said)


@pytest.mark.parametrize(("query", "words"), [
    ("DELETE FROM `p-1234.d.t` WHERE TRUE", "SELECT"),
    ("SELECT 1", "reads none of the tables"),
    ("SELECT * FROM `d.t`", "reads `d.t`"),
    ("SELECT * FROM p-1234.d.t", "reads p-1234.d.t"),
    ("SELECT * FROM `p-1234`.`d`.`t`", "reads `p-1234`.`d`.`t`"),
])
def test_a_query_that_cannot_be_snapshotted_is_refused(query: str, words: str) -> None:
    assert any(words in p for p in query_problems(query, ["p-1234.d.t"])), \
        query_problems(query, ["p-1234.d.t"])


def test_a_well_formed_query_has_no_problems() -> None:
    query = ("WITH recent AS (SELECT * FROM `p-1234.d.t` WHERE x > 0) "
             "SELECT r.x, u.name FROM recent r JOIN `p-1234.d.users` AS u ON r.id = u.id")
    assert query_problems(query, ["p-1234.d.t", "p-1234.d.users"]) == []
    # An array of an aliased row unnested by a join is not a table.
    assert query_problems("SELECT i FROM `p-1234.d.t` r JOIN r.items i", ["p-1234.d.t"]) == []
    assert query_problems("SELECT i FROM `p-1234.d.t` AS r CROSS JOIN r.items AS i",
                          ["p-1234.d.t"]) == []


def test_the_rewrite_reads_every_table_as_of_the_snapshot_time() -> None:
    as_of = "FOR SYSTEM_TIME AS OF TIMESTAMP_MILLIS(1700000000123)"
    # No alias: the table id stays the implicit one (backticked: ROWS is a reserved word).
    assert query_as_of("SELECT rows.x FROM `p-1234.d.rows` WHERE x > 1", 1700000000123) == (
        f"SELECT rows.x FROM (SELECT * FROM `p-1234.d.rows` {as_of}) AS `rows` WHERE x > 1")
    # An alias the query gives is kept; a column qualified by the full path is not a table.
    assert query_as_of("SELECT r.x FROM `p-1234.d.t` r JOIN `p-1234.d.u` AS u USING (id)",
                       1700000000123) == (
        f"SELECT r.x FROM (SELECT * FROM `p-1234.d.t` {as_of}) r "
        f"JOIN (SELECT * FROM `p-1234.d.u` {as_of}) AS u USING (id)")
    assert query_as_of("SELECT `p-1234.d.t`.x FROM `p-1234.d.t` JOIN b", 5).startswith(
        "SELECT `p-1234.d.t`.x FROM (SELECT * FROM `p-1234.d.t` FOR SYSTEM_TIME AS OF "
        "TIMESTAMP_MILLIS(5)) AS `t` JOIN")

# --- the audit-log CloudEvent ---------------------------------------------------------------------


def job_done(job_id: str = "job1", table: str = TABLE, *, error: bool = False,
             kind: str = "loadConfig") -> dict[str, Any]:
    """The data of an InsertJob end entry, as Cloud Audit Logs writes it (LogEntry JSON)."""
    project, dataset, name = table.split(".")
    job: dict[str, Any] = {
        "jobName": f"projects/{project}/jobs/{job_id}",
        "jobConfig": {"type": "IMPORT" if kind == "loadConfig" else "QUERY",
                      kind: {"destinationTable":
                             f"projects/{project}/datasets/{dataset}/tables/{name}"}},
        "jobStatus": {"jobState": "DONE", **({"errorResult": {"code": 3}} if error else {})}}
    return {"protoPayload": {
        "@type": "type.googleapis.com/google.cloud.audit.AuditLog",
        "serviceName": "bigquery.googleapis.com", "methodName": INSERT_JOB,
        "resourceName": f"projects/{project}/jobs/{job_id}",
        "metadata": {"@type": METADATA_TYPE, "jobChange": {"before": "RUNNING", "after": "DONE",
                                                           "job": job}}},
        "insertId": f"i-{job_id}", "logName": f"projects/{project}/logs/"
                                              "cloudaudit.googleapis.com%2Fdata_access",
        "resource": {"type": "bigquery_project", "labels": {"project_id": project}},
        "timestamp": "2026-12-02T02:00:00.000Z", "severity": "INFO",
        "operation": {"id": job_id, "producer": "bigquery.googleapis.com", "last": True}}


def data_change(job_id: str = "job1", inserted: int = 3) -> dict[str, Any]:
    """The data of a tableDataChange entry (a load or DML job's change to one table)."""
    project, dataset, name = TABLE.split(".")
    return {"protoPayload": {
        "serviceName": "bigquery.googleapis.com", "methodName": INSERT_JOB,
        "resourceName": f"projects/{project}/datasets/{dataset}/tables/{name}",
        "metadata": {"@type": METADATA_TYPE, "tableDataChange": {
            "insertedRowsCount": str(inserted), "reason": "JOB",
            "jobName": f"projects/{project}/jobs/{job_id}"}}}}


def test_an_end_entry_names_its_job_and_destination() -> None:
    data = job_done()
    data["resource"]["labels"]["location"] = "asia-northeast1"
    change = parse_audit_event(AUDIT_LOG_TYPE, "e1", data)
    assert change == TableChange("e1", "demo-proj", "job1", (TABLE,), "job_done",
                                 location="asia-northeast1")  # jobs.get needs it there
    assert change.job_name == "projects/demo-proj/jobs/job1"


def test_a_table_data_change_entry_names_the_table_and_its_counts() -> None:
    change = parse_audit_event(AUDIT_LOG_TYPE, "e2", json.dumps(data_change(inserted=7)))
    assert change is not None
    assert (change.tables, change.inserted_rows, change.kind) == \
        ((TABLE,), 7, "table_data_change")


def test_entries_of_a_job_the_jobs_query_rpc_made_name_the_same_change() -> None:
    # The console, `bq query`, query_and_wait and most DML go through jobs.query: BigQuery logs
    # their entries under methodName ...JobService.Query (jobInsertion.reason QUERY_REQUEST).
    done, change = job_done(kind="queryConfig"), data_change(inserted=4)
    for data in (done, change):
        data["protoPayload"]["methodName"] = QUERY_JOB
    change["protoPayload"]["metadata"]["tableDataChange"]["reason"] = "QUERY"
    assert parse_audit_event(AUDIT_LOG_TYPE, "q1", done) == TableChange(
        "q1", "demo-proj", "job1", (TABLE,), "job_done")
    parsed = parse_audit_event(AUDIT_LOG_TYPE, "q2", change)
    assert parsed is not None and (parsed.kind, parsed.inserted_rows) == ("table_data_change", 4)
    start = job_done()
    start["protoPayload"]["methodName"] = QUERY_JOB
    start["protoPayload"]["metadata"] = {"@type": METADATA_TYPE, "jobInsertion": {
        "job": done["protoPayload"]["metadata"]["jobChange"]["job"], "reason": "QUERY_REQUEST"}}
    assert parse_audit_event(AUDIT_LOG_TYPE, "q0", start) is None  # the start entry


def test_entries_that_name_no_change_are_none() -> None:
    start = job_done()
    start["protoPayload"]["metadata"] = {"@type": METADATA_TYPE, "jobInsertion": {
        "job": start["protoPayload"]["metadata"]["jobChange"]["job"], "reason": "JOB_INSERT_REQUEST"}}
    assert parse_audit_event(AUDIT_LOG_TYPE, "s", start) is None  # the start entry
    assert parse_audit_event(AUDIT_LOG_TYPE, "f", job_done(error=True)) is None  # failed
    running = job_done()
    running["protoPayload"]["metadata"]["jobChange"]["after"] = "RUNNING"
    assert parse_audit_event(AUDIT_LOG_TYPE, "r", running) is None


@pytest.mark.parametrize(("mutate", "words"), [
    (lambda d: d["protoPayload"].update(methodName="google.cloud.bigquery.v2.TableService."
                                                   "InsertTable"), "methodName"),
    (lambda d: d["protoPayload"].update(serviceName="storage.googleapis.com"), "serviceName"),
    (lambda d: d["protoPayload"]["metadata"]["jobChange"]["job"].update(jobName="job1"),
     "jobName"),
    (lambda d: d.pop("protoPayload"), "protoPayload"),
    (lambda d: d["protoPayload"].update(metadata="x"), "metadata"),
])
def test_malformed_entries_are_invalid_events(mutate: Any, words: str) -> None:
    data = job_done()
    mutate(data)
    with pytest.raises(InvalidEvent, match=words) as caught:
        parse_audit_event(AUDIT_LOG_TYPE, "bad", data)
    assert caught.value.event_id == "bad"


def test_other_event_types_and_garbage_are_invalid() -> None:
    with pytest.raises(InvalidEvent, match="type"):
        parse_audit_event("google.cloud.storage.object.v1.finalized", "x", job_done())
    with pytest.raises(InvalidEvent, match="not JSON"):
        parse_audit_event(AUDIT_LOG_TYPE, "x", b"{nope")
    with pytest.raises(InvalidEvent, match="negative"):
        parse_audit_event(AUDIT_LOG_TYPE, "x", data_change(inserted=-1))


# --- the intake on in-memory adapters -------------------------------------------------------------


def pipeline(**source: Any) -> Pipeline:
    settings: dict[str, Any] = {"tables": (TABLE,), "snapshot_dataset": "demo-proj.snapshots",
                                "export_uri": "gs://exports/bq", **source}
    return Pipeline(name="bq", trigger=Trigger(bigquery=BigQuerySource(**settings)),
                    job=JobTemplate(), checkpoint_uri="gs://ckpts/bq",
                    output_uri="gs://models/bq")


@pytest.fixture
def world() -> Iterator[tuple[Deps, InMemoryTables]]:
    deps = fake_deps(pipeline(min_rows_changed=3))
    assert isinstance(deps.objects, InMemoryObjectStore)
    tables = InMemoryTables(deps.objects)
    deps.tables = tables
    tables.load(TABLE, [], at_ms=1_000, job_id="create")  # the table exists, empty
    yield deps, tables


def rows(n: int, start: int = 0) -> list[dict[str, Any]]:
    return [{"x": float(i), "label": i % 2} for i in range(start, start + n)]


def clock(deps: Deps) -> ManualClock:
    assert isinstance(deps.clock, ManualClock)
    return deps.clock


def with_source(deps: Deps, **changes: Any) -> None:
    old = deps.pipelines["bq"]
    assert old.trigger.bigquery is not None
    deps.pipelines = {"bq": replace(old, trigger=replace(
        old.trigger, bigquery=replace(old.trigger.bigquery, **changes)))}


def event(job_id: str, event_id: str | None = None) -> TableChange:
    change = parse_audit_event(AUDIT_LOG_TYPE, event_id or f"ev-{job_id}", job_done(job_id))
    assert change is not None
    return change


def snapshot_docs(deps: Deps) -> list[SnapshotState]:
    return [SnapshotState.from_doc(d) for d in deps.docs.query(COLLECTION_SNAPSHOTS, "pipeline",
                                                               "bq")]


def watch_of(deps: Deps) -> Watch:
    raw = deps.docs.get(COLLECTION_TABLE_WATCHES, "bq")[0]
    assert raw is not None
    return Watch.from_doc(raw)


def test_a_load_starts_a_run_on_the_parquet_export_of_a_snapshot(
        world: tuple[Deps, InMemoryTables]) -> None:
    deps, tables = world
    tables.load(TABLE, rows(5), at_ms=2_000, job_id="load1")
    runs = table_intake.table_changed(deps, event("load1"))
    assert len(runs) == 1
    [snap] = snapshot_docs(deps)
    assert snap.bigquery is not None
    assert snap.bigquery["tables"] == [TABLE]
    assert snap.bigquery["snapshot_time"] == "1970-01-01T00:00:02.000Z"  # the job's end
    [snapshot_table] = snap.bigquery["snapshot_tables"]
    assert snapshot_table.startswith("demo-proj.snapshots.rows__")
    assert snap.bigquery["export_uris"] == [f"gs://exports/bq/bq/{snap.snapshot_id}/rows/"
                                            "part-*.parquet"]
    # The run trains on the exported objects, at their generations, like any GCS snapshot.
    [obj] = snap.bigquery["objects"]
    assert obj["name"] == f"bq/bq/{snap.snapshot_id}/rows/part-000000000000.parquet"
    assert snap.members() == ((obj["name"], obj["generation"]),)
    assert (snap.started, snap.pending_dispatch) == (runs[0].run_id, False)  # the run took it
    # The run's provenance carries the map as the snapshot has it, and pins the exported objects.
    provenance = runs[0].provenance
    assert provenance is not None
    assert provenance["data"]["bigquery"] == snap.bigquery
    assert provenance["data"]["objects"] == [obj] and provenance["data"]["pinned"]
    assert runs[0].data_uri == f"gs://exports/bq/bq/{snap.snapshot_id}/"
    assert pq.read_table(io.BytesIO(deps.objects.read("exports", obj["name"], obj["generation"],
                                                      1 << 20))).num_rows == 5
    # The snapshot table expires by the TTL, counted from the decision.
    assert tables.expires[snapshot_table] == int((clock(deps).t + 7 * 86400) * 1000)



def test_a_query_snapshot_is_the_query_result_as_of_the_snapshot_time(
        world: tuple[Deps, InMemoryTables]) -> None:
    deps, tables = world
    query = f"SELECT x, label FROM `{TABLE}` WHERE label = 1"
    with_source(deps, query=query)
    tables.load(TABLE, rows(5), at_ms=2_000, job_id="load1")
    tables.load(TABLE, rows(4, start=5), at_ms=3_000, job_id="load2")  # the event missed it
    [run] = table_intake.table_changed(deps, event("load1"))
    [snap] = snapshot_docs(deps)
    assert snap.bigquery is not None
    # The newest change tables.get saw (rows after it: the contract test, on the emulator).
    assert snap.bigquery["snapshot_time"] == "1970-01-01T00:00:03.000Z"
    # ONE snapshot table and export, of the query; the map records it and its hash.
    assert (snap.bigquery["query"], snap.bigquery["query_sha256"]) == (query, query_sha256(query))
    [snapshot_table] = snap.bigquery["snapshot_tables"]
    assert snapshot_table == f"demo-proj.snapshots.query__{snap.snapshot_id}"
    assert snap.bigquery["export_uris"] == [f"gs://exports/bq/bq/{snap.snapshot_id}/query/"
                                            "part-*.parquet"]
    [obj] = snap.bigquery["objects"]
    table = pq.read_table(io.BytesIO(deps.objects.read("exports", obj["name"], obj["generation"],
                                                       1 << 20)))
    assert sorted(table.column("x").to_pylist()) == [1.0, 3.0, 5.0, 7.0]  # label 1 of 9 rows
    assert run.provenance is not None and run.provenance["data"]["bigquery"] == snap.bigquery
    assert tables.expires[snapshot_table] == int((clock(deps).t + 7 * 86400) * 1000)


def test_a_changed_query_is_another_snapshot_of_the_same_time() -> None:
    from spotorch.core.table_changes import snapshot_id_of

    plain = snapshot_id_of("bq", [TABLE], 2_000)
    assert snapshot_id_of("bq", [TABLE], 2_000, None) == plain  # table pipelines keep their ids
    assert len({plain, snapshot_id_of("bq", [TABLE], 2_000, "SELECT 1"),
                snapshot_id_of("bq", [TABLE], 2_000, "SELECT 2")}) == 3

def test_rows_gather_until_min_rows_changed(world: tuple[Deps, InMemoryTables]) -> None:
    deps, tables = world
    tables.load(TABLE, rows(2), at_ms=2_000, job_id="load1")
    assert table_intake.table_changed(deps, event("load1")) == []
    tables.load(TABLE, rows(1, 2), at_ms=3_000, job_id="load2")
    [_run] = table_intake.table_changed(deps, event("load2"))
    [snap] = snapshot_docs(deps)
    assert snap.bigquery is not None and snap.bigquery["snapshot_time"].endswith("03.000Z")


def test_a_job_counts_once_whichever_entries_and_redeliveries_arrive(
        world: tuple[Deps, InMemoryTables]) -> None:
    deps, tables = world
    tables.load(TABLE, rows(2), at_ms=2_000, job_id="load1")
    assert table_intake.table_changed(deps, event("load1")) == []
    assert table_intake.table_changed(deps, event("load1")) == []  # redelivered
    other = parse_audit_event(AUDIT_LOG_TYPE, "tdc", data_change("load1", inserted=2))
    assert other is not None
    assert table_intake.table_changed(deps, other) == []  # the same job's tableDataChange
    raw = deps.docs.get(COLLECTION_TABLE_WATCHES, "bq")[0]
    assert raw is not None and raw["pending_rows"] == 2


def test_an_entry_that_comes_before_its_job_is_done_is_acknowledged_and_waits(
        world: tuple[Deps, InMemoryTables]) -> None:
    deps, tables = world
    done = tables.load(TABLE, rows(2), at_ms=2_000, job_id="load7")
    tables.jobs[(TABLE.split(".")[0], "load7")] = replace(done, state="RUNNING")
    assert table_intake.table_changed(deps, event("load7")) == []  # not refused as forged
    assert deps.docs.get(COLLECTION_TABLE_WATCHES, "bq")[0] is None  # nothing counted yet
    tables.jobs[(TABLE.split(".")[0], "load7")] = done
    assert table_intake.table_changed(deps, event("load7", "end")) == []
    raw = deps.docs.get(COLLECTION_TABLE_WATCHES, "bq")[0]
    assert raw is not None and raw["pending_rows"] == 2


def test_a_forged_event_is_refused_by_bigquery_s_own_job(
        world: tuple[Deps, InMemoryTables]) -> None:
    deps, _ = world
    with pytest.raises(InvalidEvent, match="does not exist"):
        table_intake.table_changed(deps, event("never-ran"))
    assert deps.docs.get(COLLECTION_TABLE_WATCHES, "bq")[0] is None
    assert snapshot_docs(deps) == []


def test_an_event_about_another_table_than_its_job_wrote_is_refused(
        world: tuple[Deps, InMemoryTables]) -> None:
    deps, tables = world
    tables.load("demo-proj.sales.other", rows(5), at_ms=2_000, job_id="load9")
    with pytest.raises(InvalidEvent, match=r"wrote demo-proj\.sales\.other"):
        table_intake.table_changed(deps, event("load9"))


def test_a_quiet_period_waits_for_the_tick(world: tuple[Deps, InMemoryTables]) -> None:
    deps, tables = world
    with_source(deps, quiet_period_s=60.0)
    tables.load(TABLE, rows(5), at_ms=2_000, job_id="load1")
    assert table_intake.table_changed(deps, event("load1")) == []
    clock(deps).advance(30)
    assert table_intake.check_tables(deps) == []
    clock(deps).advance(31)
    assert len(table_intake.check_tables(deps)) == 1
    assert table_intake.check_tables(deps) == []  # taken: nothing more


def test_min_interval_spaces_snapshots_and_the_next_waits_its_turn(
        world: tuple[Deps, InMemoryTables]) -> None:
    deps, tables = world
    with_source(deps, min_interval_s=600.0)
    tables.load(TABLE, rows(5), at_ms=2_000, job_id="load1")
    [first] = table_intake.table_changed(deps, event("load1"))
    tables.load(TABLE, rows(5, 5), at_ms=3_000, job_id="load2")
    assert table_intake.table_changed(deps, event("load2")) == []
    clock(deps).advance(599)
    assert table_intake.check_tables(deps) == []
    clock(deps).advance(2)
    [second] = table_intake.check_tables(deps)
    assert second.run_id != first.run_id
    times = sorted(s.bigquery["snapshot_time"] for s in snapshot_docs(deps) if s.bigquery)
    assert times[0].endswith("02.000Z") and times[1].endswith("03.000Z")


def test_a_lost_event_is_repaired_by_the_tick(world: tuple[Deps, InMemoryTables]) -> None:
    deps, tables = world
    reconcile(deps)  # the first tick: the table as it is is the baseline (no run)
    assert snapshot_docs(deps) == []
    tables.load(TABLE, rows(5), at_ms=5_000, job_id="lost")  # its audit event never arrives
    reconcile(deps)
    [snap] = snapshot_docs(deps)
    runs = [r for r in (deps.runs.load(f"bq-{snap.snapshot_id}")[0],) if r is not None]
    assert len(runs) == 1
    assert snap.bigquery is not None and snap.bigquery["snapshot_time"].endswith("05.000Z")
    reconcile(deps)  # nothing new: nothing more
    assert len(snapshot_docs(deps)) == 1
    # The event arriving late changes nothing: the tick counted the change already.
    assert table_intake.table_changed(deps, event("lost")) == []
    assert len(snapshot_docs(deps)) == 1


def test_a_snapshot_decided_before_a_crash_is_finished_by_the_tick(
        world: tuple[Deps, InMemoryTables], monkeypatch: pytest.MonkeyPatch) -> None:
    deps, tables = world
    tables.load(TABLE, rows(5), at_ms=2_000, job_id="load1")

    def crash(*_: Any, **__: Any) -> None:
        raise ConnectionError("the function died mid-export")
    monkeypatch.setattr(tables, "start_extract", crash)
    # The decision is recorded: the event is acknowledged, not redelivered in a loop.
    assert table_intake.table_changed(deps, event("load1")) == []
    assert watch_of(deps).taking is not None
    monkeypatch.undo()
    [_run] = table_intake.check_tables(deps)
    assert len(snapshot_docs(deps)) == 1
    assert table_intake.check_tables(deps) == []


# --- start, then follow: no invocation waits for a job ------------------------------------------


def test_a_job_left_running_never_holds_the_invocation_past_its_budget(
        world: tuple[Deps, InMemoryTables]) -> None:
    deps, tables = world
    deps.table_wait_s = 0.3
    tables.hold = True  # BigQuery takes its time: every job stays RUNNING
    tables.load(TABLE, rows(5), at_ms=2_000, job_id="load1")
    started = time.monotonic()
    assert table_intake.table_changed(deps, event("load1")) == []
    assert time.monotonic() - started < 0.3 + 1.0  # the budget, and not a job's duration
    taking = watch_of(deps).taking
    assert taking is not None
    sid = taking["snapshot_id"]
    assert [j for _, j in tables.jobs if j.startswith("spotorch-")] == [
        f"spotorch-snapshot-{sid}-0"]  # started once, however often it was looked at
    # The tick looks again: still running; then BigQuery ends the snapshot query.
    assert table_intake.check_tables(deps) == []
    tables.finish_held()
    [run] = table_intake.check_tables(deps)  # the extract is started and, DONE, recorded
    assert watch_of(deps).taking is None
    assert len(snapshot_docs(deps)) == 1 and snapshot_docs(deps)[0].started == run.run_id
    assert table_intake.check_tables(deps) == []
    assert table_intake.table_changed(deps, event("load1", "ev-again")) == []
    assert sorted(j for _, j in tables.jobs if j.startswith("spotorch-")) == [
        f"spotorch-export-{sid}-0", f"spotorch-snapshot-{sid}-0"]


def test_redeliveries_and_ticks_while_jobs_run_start_one_job_each_and_one_run(
        world: tuple[Deps, InMemoryTables]) -> None:
    deps, tables = world
    deps.table_wait_s = 0.0
    tables.hold = True
    tables.load(TABLE, rows(5), at_ms=2_000, job_id="load1")
    assert table_intake.table_changed(deps, event("load1")) == []
    # A redelivery and the tick, while the job runs: both find the job by its id.
    assert table_intake.table_changed(deps, event("load1", "ev-dup")) == []
    assert table_intake.check_tables(deps) == []
    tables.finish_held()
    pipeline_ = deps.pipelines["bq"]
    first = table_intake.finish_snapshot(deps, pipeline_)
    second = table_intake.finish_snapshot(deps, pipeline_)
    assert len(first) + len(second) == 1
    assert len([j for _, j in tables.jobs if j.startswith("spotorch-")]) == 2
    [snap] = snapshot_docs(deps)
    assert snap.started == (first + second)[0].run_id


def test_invocations_running_at_the_same_time_start_each_job_once_and_one_run(
        world: tuple[Deps, InMemoryTables]) -> None:
    import threading

    deps, tables = world
    deps.table_wait_s = 0.0
    tables.hold = True
    tables.load(TABLE, rows(5), at_ms=2_000, job_id="load1")
    assert table_intake.table_changed(deps, event("load1")) == []
    pipeline_ = deps.pipelines["bq"]
    results: list[list[Any]] = []
    errors: list[BaseException] = []

    def invocation() -> None:
        try:
            results.append(table_intake.finish_snapshot(deps, pipeline_, wait_s=1.5))
        except BaseException as exc:  # reported by the assertion below
            errors.append(exc)
    threads = [threading.Thread(target=invocation) for _ in range(4)]
    for t in threads:
        t.start()
    time.sleep(0.2)
    tables.finish_held()  # the snapshot query ends while all four follow it
    for t in threads:
        t.join(10)
    assert not errors
    assert sum(len(r) for r in results) == 1
    assert len([j for _, j in tables.jobs if j.startswith("spotorch-")]) == 2
    assert len(snapshot_docs(deps)) == 1


def test_a_failed_extract_is_recorded_and_retried_with_a_fresh_job_id(
        world: tuple[Deps, InMemoryTables]) -> None:
    deps, tables = world
    tables.load(TABLE, rows(5), at_ms=2_000, job_id="load1")
    sid = snapshot_id_of("bq", (TABLE,), 2_000)
    tables.fail[f"spotorch-export-{sid}-0"] = ("backendError", "the export broke")
    [run] = table_intake.table_changed(deps, event("load1"))
    [snap] = snapshot_docs(deps)
    assert snap.bigquery is not None
    [failure] = snap.bigquery["job_failures"]
    assert (failure["job_id"], failure["reason"], failure["message"], failure["phase"]) == (
        f"spotorch-export-{sid}-0", "backendError", "the export broke", "export")
    # The retry wrote beside the failed export; the run trains on the retry's objects only.
    assert snap.bigquery["export_uris"] == [f"gs://exports/bq/bq/{sid}/rows-a2/part-*.parquet"]
    assert [o["name"] for o in snap.bigquery["objects"]] == [
        f"bq/bq/{sid}/rows-a2/part-000000000000.parquet"]
    assert run.data_uri == f"gs://exports/bq/bq/{sid}/"
    assert isinstance(deps.publisher, InMemoryPublisher)
    assert not [e for e in deps.publisher.events
                if e["type"] == "dev.spotorch.snapshot.failed.v1"]  # retried: nothing to alert


def test_a_job_that_fails_every_attempt_is_given_up_once_and_alerted(
        world: tuple[Deps, InMemoryTables]) -> None:
    deps, tables = world
    tables.buckets = {"other"}  # the export bucket does not exist
    tables.load(TABLE, rows(5), at_ms=2_000, job_id="load1")
    assert isinstance(deps.publisher, InMemoryPublisher)
    deps.publisher.fail_next = 1  # Pub/Sub is briefly down when it is given up
    assert table_intake.table_changed(deps, event("load1")) == []
    watch = watch_of(deps)
    assert watch.taking is None and watch.gave_up is not None
    sid = watch.gave_up["snapshot_id"]
    failures = watch.gave_up["failures"]
    assert [f["job_id"] for f in failures] == [
        f"spotorch-export-{sid}-0", f"spotorch-export-{sid}-0-a2", f"spotorch-export-{sid}-0-a3"]
    assert {f["reason"] for f in failures} == {"notFound"}
    assert not watch.gave_up.get("published")
    # The tick publishes what was lost, once; later ticks start nothing and publish nothing.
    assert table_intake.check_tables(deps) == []
    assert table_intake.check_tables(deps) == []
    [alert] = [e for e in deps.publisher.events if e["type"] == "dev.spotorch.snapshot.failed.v1"]
    assert alert["id"] == f"snapshot-{sid}:1"
    assert (alert["data"]["reason"], alert["data"]["attempts"]) == ("notFound", MAX_JOB_ATTEMPTS)
    assert validate_event(alert) == []
    assert snapshot_docs(deps) == []
    assert len([j for _, j in tables.jobs if j.startswith("spotorch-export")]) == MAX_JOB_ATTEMPTS
    # New changes take a new snapshot (another time, another id) once the bucket is there.
    tables.buckets = None
    tables.load(TABLE, rows(5, 5), at_ms=3_000, job_id="load2")
    [_run] = table_intake.table_changed(deps, event("load2"))


def _alerts(deps: Deps) -> list[dict[str, Any]]:
    assert isinstance(deps.publisher, InMemoryPublisher)
    return [e for e in deps.publisher.events if e["type"] == "dev.spotorch.snapshot.failed.v1"]


def test_a_job_bigquery_refuses_to_start_is_a_failed_attempt_and_nothing_starts_after_giving_up(
        ) -> None:
    """A 4xx answer to jobs.insert (a bad query, no access) is no rate: each attempt counts, the
    snapshot is given up after MAX_JOB_ATTEMPTS and the other table's part starts nothing more."""
    other = "demo-proj.demo.more"
    deps = fake_deps(pipeline(min_rows_changed=3, tables=(TABLE, other)))
    assert isinstance(deps.objects, InMemoryObjectStore)
    tables = InMemoryTables(deps.objects)
    deps.tables = tables
    tables.load(TABLE, [], at_ms=1_000, job_id="create")
    tables.load(other, [], at_ms=1_000, job_id="create2")
    tables.load(TABLE, rows(5), at_ms=2_000, job_id="load1")
    sid = table_changes.snapshot_id_of("bq", (TABLE, other), 2_000)
    for attempt in ("", "-a2", "-a3"):
        tables.refuse[f"spotorch-snapshot-{sid}-0{attempt}"] = ("accessDenied", "no access")
    assert table_intake.table_changed(deps, event("load1")) == []
    watch = watch_of(deps)
    assert watch.taking is None and watch.gave_up is not None
    assert [f["job_id"] for f in watch.gave_up["failures"]] == [
        f"spotorch-snapshot-{sid}-0", f"spotorch-snapshot-{sid}-0-a2",
        f"spotorch-snapshot-{sid}-0-a3"]
    assert {f["reason"] for f in watch.gave_up["failures"]} == {"accessDenied"}
    # Part 1 started its snapshot on the first pass at most; nothing after the give-up.
    started = [j for _, j in tables.jobs if j.startswith("spotorch-")]
    assert all(j.endswith("-1") for j in started) and len(started) <= 2
    [alert] = _alerts(deps)
    assert validate_event(alert) == [] and alert["data"]["reason"] == "accessDenied"
    assert table_intake.check_tables(deps) == []  # the tick starts nothing for it either
    assert [j for _, j in tables.jobs if j.startswith("spotorch-")] == started


def test_a_snapshot_still_being_taken_a_day_later_is_given_up_and_the_next_can_come(
        world: tuple[Deps, InMemoryTables]) -> None:
    deps, tables = world
    tables.hold = True  # its jobs never end (a lost job, or a location never found)
    tables.load(TABLE, rows(5), at_ms=2_000, job_id="load1")
    assert table_intake.table_changed(deps, event("load1")) == []
    assert watch_of(deps).taking is not None
    clock(deps).advance(table_changes.MAX_TAKING_S - 60)
    assert table_intake.check_tables(deps) == [] and watch_of(deps).taking is not None
    clock(deps).advance(120)
    assert table_intake.check_tables(deps) == []
    watch = watch_of(deps)
    assert watch.taking is None and watch.gave_up is not None
    assert watch.gave_up["failures"][-1]["reason"] == "timeout"
    [alert] = _alerts(deps)
    assert validate_event(alert) == [] and alert["data"]["job_id"] is None
    from spotorch.core.alerts import render_alert
    assert "given up (timeout)" in render_alert(alert).headline
    tables.hold = False
    tables.load(TABLE, rows(5, 5), at_ms=3_000, job_id="load2")
    [_run] = table_intake.table_changed(deps, event("load2"))  # the pipeline is not blocked


def test_an_export_that_wrote_nothing_is_given_up_not_retried_forever(
        world: tuple[Deps, InMemoryTables], monkeypatch: pytest.MonkeyPatch) -> None:
    deps, tables = world
    tables.load(TABLE, rows(5), at_ms=2_000, job_id="load1")
    from spotorch.app import snapshots

    monkeypatch.setattr(snapshots, "listed_objects", lambda *_: ())
    assert table_intake.table_changed(deps, event("load1")) == []
    watch = watch_of(deps)
    assert watch.taking is None and watch.gave_up is not None
    assert watch.gave_up["failures"][-1]["reason"] == "empty"
    assert len(_alerts(deps)) == 1 and snapshot_docs(deps) == []


# --- the function ----------------------------------------------------------------------------------


def test_the_function_acknowledges_and_records_a_forged_event(
        world: tuple[Deps, InMemoryTables], monkeypatch: pytest.MonkeyPatch) -> None:
    import functions_framework

    deps, _ = world
    monkeypatch.setattr(entry, "deps", lambda: deps)
    cloud_event = CloudEvent({"type": AUDIT_LOG_TYPE, "id": "forged-1",
                              "source": "//cloudaudit.googleapis.com/projects/demo-proj/logs/"
                                        "data_access",
                              "serviceName": "bigquery.googleapis.com",
                              "methodName": INSERT_JOB}, job_done("never-ran"))
    headers, body = to_structured(cloud_event)
    app = functions_framework.create_app("on_table_changed", MAIN, "cloudevent").test_client()
    response = app.post("/", headers=headers, data=body)
    assert response.status_code == 200
    record, _ = deps.docs.get("rejected_events", "forged-1")
    assert record is not None and "does not exist" in record["reason"]


@pytest.mark.parametrize(("data", "recorded"), [
    ({"protoPayload": {"serviceName": "bigquery.googleapis.com", "methodName": INSERT_JOB,
                       "metadata": {"@type": METADATA_TYPE, "jobInsertion": {}}}}, False),
    ({"protoPayload": {"serviceName": "bigquery.googleapis.com", "methodName": "nope"}}, True),
    ("not json", True),
])
def test_the_function_acknowledges_start_entries_and_records_malformed_ones(
        world: tuple[Deps, InMemoryTables], monkeypatch: pytest.MonkeyPatch, data: Any,
        recorded: bool) -> None:
    import functions_framework

    deps, _ = world
    monkeypatch.setattr(entry, "deps", lambda: deps)
    cloud_event = CloudEvent({"type": AUDIT_LOG_TYPE, "id": "odd-1",
                              "source": "//cloudaudit.googleapis.com/projects/demo-proj/logs/"
                                        "data_access"}, data)
    headers, body = to_structured(cloud_event)
    app = functions_framework.create_app("on_table_changed", MAIN, "cloudevent").test_client()
    assert app.post("/", headers=headers, data=body).status_code == 200
    assert (deps.docs.get("rejected_events", "odd-1")[0] is not None) is recorded
    assert deps.docs.get(COLLECTION_TABLE_WATCHES, "bq")[0] is None


def extract_done(job_id: str) -> dict[str, Any]:
    """The jobChange end entry of an extract job (BigQueryAuditMetadata: type EXPORT)."""
    data = job_done(job_id)
    job = data["protoPayload"]["metadata"]["jobChange"]["job"]
    job["jobConfig"] = {"type": "EXPORT", "extractConfig": {
        "destinationUris": ["gs://exports/bq/x/part-*.parquet"]}}
    return data


def test_the_end_entry_of_our_own_job_carries_the_snapshot_on_at_once(
        world: tuple[Deps, InMemoryTables], monkeypatch: pytest.MonkeyPatch) -> None:
    import functions_framework

    deps, tables = world
    deps.table_wait_s = 0.0
    tables.hold = True
    tables.load(TABLE, rows(5), at_ms=2_000, job_id="load1")
    assert table_intake.table_changed(deps, event("load1")) == []
    taking = watch_of(deps).taking
    assert taking is not None
    sid = taking["snapshot_id"]
    monkeypatch.setattr(entry, "deps", lambda: deps)
    app = functions_framework.create_app("on_table_changed", MAIN, "cloudevent").test_client()

    def post(event_id: str, data: dict[str, Any]) -> None:
        cloud_event = CloudEvent({"type": AUDIT_LOG_TYPE, "id": event_id,
                                  "source": "//cloudaudit.googleapis.com/projects/demo-proj/"
                                            "logs/data_access"}, data)
        headers, body = to_structured(cloud_event)
        assert app.post("/", headers=headers, data=body).status_code == 200

    # An entry claiming our job ended while BigQuery says RUNNING (early, or forged): nothing.
    post("early", job_done(f"spotorch-snapshot-{sid}-0", f"{TABLE.rsplit('.', 2)[0]}.snapshots.x"))
    assert watch_of(deps).taking == taking
    assert snapshot_docs(deps) == []
    tables.finish_held()
    tables.hold = True  # the extract the entry starts takes its time too
    post("query-done", job_done(f"spotorch-snapshot-{sid}-0",
                                f"{TABLE.rsplit('.', 2)[0]}.snapshots.x"))
    assert table_changes.part_state(watch_of(deps).taking or {}, "0") == ("export", 1)
    tables.finish_held()
    post("export-done", extract_done(f"spotorch-export-{sid}-0"))
    assert watch_of(deps).taking is None
    [snap] = snapshot_docs(deps)
    assert snap.started  # the run started from the entry, before any tick
    post("export-done-again", extract_done(f"spotorch-export-{sid}-0"))
    assert len(snapshot_docs(deps)) == 1


def test_own_job_entries_are_recognised_by_their_job_id() -> None:
    sid = "0123456789abcdef"
    assert audit_entries.own_job_snapshot(extract_done(f"spotorch-export-{sid}-0-a2")) == sid
    assert audit_entries.own_job_snapshot(job_done(f"spotorch-snapshot-{sid}-query")) == sid
    assert audit_entries.own_job_snapshot(json.dumps(job_done(f"spotorch-export-{sid}-1"))) == sid
    assert audit_entries.own_job_snapshot(job_done("load1")) is None
    assert audit_entries.own_job_snapshot(job_done("spotorch-export-NOTHEX-0")) is None
    assert audit_entries.own_job_snapshot(data_change(f"spotorch-export-{sid}-0")) is None
    assert audit_entries.own_job_snapshot("not json") is None
