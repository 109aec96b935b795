"""BigQuery table changes into snapshots and their runs (pipelines with trigger.bigquery).

An audit entry is a hint: the job it names is read (jobs.get) and must be DONE, without error,
of a kind that writes tables; the watched tables are read (tables.get). Only then do the job's
rows count, once per job, in the pipeline's watch document (COLLECTION_TABLE_WATCHES). When the
batching rules say so (core.table_changes.due) the decision to snapshot is written first, then
carried out: each table is snapshotted at the decided time, exported to Cloud Storage as Parquet
(wildcard URI), and the export becomes an ordinary snapshot document (COLLECTION_SNAPSHOTS, with
a `bigquery` map), so the run trains on those objects and generations like any GCS snapshot and
the snapshot repair of spotorch.app.snapshots covers it. The tick reads every watched table and
counts what events missed, and finishes a decided snapshot a crash interrupted.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from spotorch.app.deps import Deps
from spotorch.core.errors import InvalidEvent, SpotorchError
from spotorch.core.model import Run
from spotorch.core.pipeline import BigQuerySource, Pipeline
from spotorch.core.table_changes import (
    TableChange,
    TableInfo,
    Watch,
    confirm,
    due,
    observe_job,
    observe_tables,
    query_sha256,
    rfc3339_ms,
    snapshot_table_name,
    take,
    taken,
)
from spotorch.core.triggers import split_gs_uri
from spotorch.ports.store import ConflictError
from spotorch.ports.tables import TableNotFound, TableSource
from spotorch.settings import COLLECTION_DEDUPE, COLLECTION_SNAPSHOTS, COLLECTION_TABLE_WATCHES

log = logging.getLogger("spotorch.app.table_intake")

WRITE_ATTEMPTS = 6
DEDUPE_TTL_S = 7 * 24 * 3600.0


class NoTableSource(SpotorchError):
    """A BigQuery pipeline is loaded but no table source is wired (SPOTORCH_BIGQUERY_*)."""


def bigquery_pipelines(deps: Deps) -> list[Pipeline]:
    """The loaded pipelines whose trigger watches BigQuery tables."""
    return [p for p in deps.pipelines.values() if p.trigger.bigquery is not None]


def _source(pipeline: Pipeline) -> BigQuerySource:
    source = pipeline.trigger.bigquery
    assert source is not None
    return source


def _tables(deps: Deps) -> TableSource:
    if deps.tables is None:
        raise NoTableSource("a pipeline watches BigQuery tables, but no BigQuery client is wired")
    return deps.tables


def _update(deps: Deps, pipeline: str,
            decide: Callable[[Watch], Watch | None]) -> Watch | None:
    """get -> decide -> conditional put of a pipeline's watch, again on conflict."""
    for attempt in range(WRITE_ATTEMPTS):
        raw, version = deps.docs.get(COLLECTION_TABLE_WATCHES, pipeline)
        current = Watch(pipeline, {}) if raw is None else Watch.from_doc(raw)
        changed = decide(current)
        if changed is None:
            return None
        try:
            deps.docs.put(COLLECTION_TABLE_WATCHES, pipeline, changed.to_doc(), version)
            return changed
        except ConflictError:
            if attempt + 1 == WRITE_ATTEMPTS:
                raise
    raise AssertionError("unreachable")


def _read_tables(tables: TableSource, source: BigQuerySource) -> list[TableInfo]:
    """tables.get of every watched table that exists (one not there yet changes nothing)."""
    out = []
    for table in source.tables:
        with contextlib.suppress(TableNotFound):
            out.append(tables.get_table(table))
    return out


def _dedupe_key(event_id: str) -> str:
    return f"bq-{hashlib.sha256(event_id.encode()).hexdigest()[:40]}"


def table_changed(deps: Deps, change: TableChange) -> list[Run]:
    """An audit entry naming a table change: checked against BigQuery, counted once per job, and
    the snapshots it makes due taken; the runs they start. InvalidEvent when BigQuery's own job
    contradicts the entry (forged, or about a job that failed)."""
    pipelines = [p for p in bigquery_pipelines(deps)
                 if set(change.tables) & set(_source(p).tables)]
    if not pipelines:
        log.debug("BigQuery change of %s: no pipeline watches it", ", ".join(change.tables),
                  extra={"event_id": change.event_id})
        return []
    dedupe = _dedupe_key(change.event_id)
    if deps.docs.get(COLLECTION_DEDUPE, dedupe)[0] is not None:
        return []
    tables = _tables(deps)
    job = tables.get_job(change.job_project, change.job_id, change.location)
    if job is not None and job.state != "DONE" and not job.failed:
        # BigQuery may write a tableDataChange entry before jobs.get says DONE: not a forgery,
        # just early; the job's end entry (or the tick's tables.get) counts it.
        log.info("BigQuery job %s is %s: its entry waits for the end entry", change.job_name,
                 job.state, extra={"event_id": change.event_id})
        return []
    why = confirm(change, job)
    if why is not None:
        raise InvalidEvent(f"BigQuery contradicts the audit entry: {why}",
                           event_id=change.event_id)
    assert job is not None
    now = deps.clock.now()
    runs: list[Run] = []
    for pipeline in pipelines:
        source = _source(pipeline)
        infos = _read_tables(tables, source)

        def decide(watch: Watch, pipeline: Pipeline = pipeline, source: BigQuerySource = source,
                   infos: list[TableInfo] = infos) -> Watch | None:
            counted = observe_job(watch, change, job, infos, now)
            if counted is None:
                return None
            return take(counted, pipeline, now) if due(counted, source, now) is None else counted
        _update(deps, pipeline.name, decide)
        runs += finish_snapshot(deps, pipeline)
    record = {"event_id": change.event_id, "source": "bigquery", "job": change.job_name,
              "tables": list(change.tables), "handled_at": now,
              "expires_at": datetime.fromtimestamp(now + DEDUPE_TTL_S, UTC)}
    with contextlib.suppress(ConflictError):
        deps.docs.put(COLLECTION_DEDUPE, dedupe, record, None)
    return runs


def check_tables(deps: Deps) -> list[Run]:
    """The tick: read every watched table (what events missed counts now), take the snapshots
    that are due (a quiet period passed), finish those a crash interrupted; the runs started."""
    runs: list[Run] = []
    for pipeline in bigquery_pipelines(deps):
        source = _source(pipeline)
        try:
            infos = _read_tables(_tables(deps), source)
            now = deps.clock.now()
            first = deps.docs.get(COLLECTION_TABLE_WATCHES, pipeline.name)[0] is None

            def decide(watch: Watch, pipeline: Pipeline = pipeline,
                       source: BigQuerySource = source, infos: list[TableInfo] = infos,
                       now: float = now, first: bool = first) -> Watch | None:
                if watch.taking is not None:
                    return None
                looked = observe_tables(watch, infos, now, baseline=first)
                if due(looked, source, now) is None:
                    return take(looked, pipeline, now)
                return looked if looked != watch else None
            _update(deps, pipeline.name, decide)
            runs += finish_snapshot(deps, pipeline)
        except ConflictError:
            log.warning("the watch of %s is contended; the next tick tries again", pipeline.name)
        except Exception as exc:  # one pipeline's tables must not stop the others' repair
            log.warning("checking the tables of %s failed: %s", pipeline.name, exc)
    return runs


def export_root(pipeline: Pipeline, snapshot_id: str) -> str:
    """gs://.../ where one snapshot's Parquet files go: below export_uri, per pipeline and id."""
    return f"{_source(pipeline).export_uri.rstrip('/')}/{pipeline.name}/{snapshot_id}/"


def finish_snapshot(deps: Deps, pipeline: Pipeline) -> list[Run]:
    """Carry out a decided snapshot: snapshot tables, Parquet exports, the snapshot document,
    then the run. Each step is idempotent by name (tables and job ids derive from the snapshot
    id), so a retry after a crash repeats nothing."""
    from spotorch.app import snapshots as intake
    from spotorch.app.arrivals import start_snapshot_run

    raw = deps.docs.get(COLLECTION_TABLE_WATCHES, pipeline.name)[0]
    watch = None if raw is None else Watch.from_doc(raw)
    if watch is None or watch.taking is None:
        return []
    source, tables = _source(pipeline), _tables(deps)
    sid = str(watch.taking["snapshot_id"])
    snapshot_ms = int(watch.taking["snapshot_ms"])
    expires_ms = int((float(watch.taking["decided_at"]) + source.snapshot_ttl_s) * 1000)
    root = export_root(pipeline, sid)
    snapshot_tables, export_uris = [], []
    if source.query is not None:  # one table: the query's result as of the snapshot time
        destination = f"{source.snapshot_dataset}.{snapshot_table_name('query', sid)}"
        tables.snapshot_query(source.query, snapshot_ms, destination, expires_ms)
        uri = f"{root}query/part-*.parquet"
        tables.export_parquet(destination, uri, job_id=f"spotorch-export-{sid}-query")
        snapshot_tables.append(destination)
        export_uris.append(uri)
    for i, table in enumerate(() if source.query is not None else source.tables):
        destination = f"{source.snapshot_dataset}.{snapshot_table_name(table, sid)}"
        tables.snapshot(table, snapshot_ms, destination, expires_ms)
        uri = f"{root}{table.rsplit('.', 1)[-1]}/part-*.parquet"
        tables.export_parquet(destination, uri, job_id=f"spotorch-export-{sid}-{i}")
        snapshot_tables.append(destination)
        export_uris.append(uri)
    bucket, key = split_gs_uri(root)
    objects = _listed(deps, bucket, key)
    if not objects:
        raise SpotorchError(f"the export of snapshot {sid} wrote nothing under {root}")
    now = deps.clock.now()
    bigquery: dict[str, Any] = {
        "tables": list(source.tables), "snapshot_time": rfc3339_ms(snapshot_ms),
        "snapshot_tables": snapshot_tables, "export_uris": export_uris,
        "objects": [{"name": n, "generation": g} for n, g in objects]}
    if source.query is not None:
        bigquery |= {"query": source.query, "query_sha256": query_sha256(source.query)}
    state = intake.SnapshotState(
        pipeline=pipeline.name, bucket=bucket, key=key, batch="bigquery", cycle=1,
        entries=tuple(intake.Entry(n, g, 1) for n, g in objects), first_seen=now,
        last_seen=now, completed_at=now, snapshot_id=sid, ready=objects, pending_dispatch=True,
        dispatched_at=now, bigquery=bigquery)
    recorded = True
    try:
        deps.docs.put(COLLECTION_SNAPSHOTS, intake.snapshot_doc_key(pipeline.name, bucket, key),
                      state.to_doc(), None)
    except ConflictError:
        recorded = False  # recorded before a crash: the snapshot repair reports it if need be
    _update(deps, pipeline.name, lambda w: taken(w, sid))
    if not recorded:
        return []
    ready = intake.SnapshotReady(pipeline=pipeline.name, snapshot_id=sid, data_uri=state.data_uri,
                                 objects=tuple(n for n, _ in objects),
                                 generations=tuple(g for _, g in objects), completed_at=now,
                                 bigquery=bigquery)
    log.info("BigQuery snapshot %s of %s at %s exported to %s", sid, ", ".join(source.tables),
             bigquery["snapshot_time"], root, extra={"pipeline": pipeline.name})
    run = start_snapshot_run(deps, ready, "exported")
    return [run] if run else []


def _listed(deps: Deps, bucket: str, prefix: str) -> tuple[tuple[str, int], ...]:
    """Every object (name, generation) under the export folder, sorted."""
    out: list[tuple[str, int]] = []
    token: str | None = None
    while True:
        page = deps.objects.list_page(bucket, prefix, token, 1000)
        out += [(o.name, o.generation) for o in page.objects]
        token = page.next_page_token
        if token is None:
            return tuple(sorted(out))
