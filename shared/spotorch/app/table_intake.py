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
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from spotorch.app import snapshots as intake
from spotorch.app.deps import Deps
from spotorch.core.errors import InvalidEvent, SpotorchError
from spotorch.core.events import build_event
from spotorch.core.model import Run
from spotorch.core.pipeline import BigQuerySource, Pipeline
from spotorch.core.table_changes import (
    DONE,
    EXPORT,
    MAX_TAKING_S,
    SNAPSHOT,
    JobInfo,
    TableChange,
    TableInfo,
    Watch,
    advanced,
    confirm,
    due,
    give_up,
    job_failed,
    job_id,
    observe_job,
    observe_tables,
    part_state,
    query_sha256,
    rfc3339_ms,
    snapshot_parts,
    snapshot_table_name,
    take,
    taken,
    taking_overdue,
)
from spotorch.core.triggers import split_gs_uri
from spotorch.ports.store import ConflictError
from spotorch.ports.tables import JobRefused, TableNotFound, TableSource
from spotorch.settings import COLLECTION_SNAPSHOTS, COLLECTION_TABLE_WATCHES

log = logging.getLogger("spotorch.app.table_intake")

POLL_S = 0.5  # between two looks at the jobs while an invocation may still wait


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
    """A pipeline's watch, changed by decide (snapshots.conditional_update: get, decide,
    conditional put, again after a jittered pause on conflict)."""
    def decided(raw: Any) -> dict[str, Any] | None:
        changed = decide(Watch(pipeline, {}) if raw is None else Watch.from_doc(raw))
        return None if changed is None else changed.to_doc()
    written = intake.conditional_update(deps.docs, COLLECTION_TABLE_WATCHES, pipeline, decided)
    return None if written is None else Watch.from_doc(written)


def _read_tables(tables: TableSource, source: BigQuerySource) -> list[TableInfo]:
    """tables.get of every watched table that exists (one not there yet changes nothing)."""
    out = []
    for table in source.tables:
        with contextlib.suppress(TableNotFound):
            out.append(tables.get_table(table))
    return out


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
    dedupe = intake.dedupe_key("bq", change.event_id)
    if intake.handled_before(deps.docs, dedupe):
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
    deadline = time.monotonic() + deps.table_wait_s  # one wait budget for the invocation
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
        runs += _carry_on(deps, pipeline, max(0.0, deadline - time.monotonic()))
    intake.remember_handled(deps.docs, dedupe, {
        "event_id": change.event_id, "source": "bigquery", "job": change.job_name,
        "tables": list(change.tables)}, now)
    return runs


def snapshot_job_ended(deps: Deps, snapshot_id: str) -> list[Run]:
    """The audit entry of one of our own snapshot jobs ending: the snapshot it belongs to moves
    on at once rather than at the next tick (finish_snapshot reads the job itself: a forged
    entry changes nothing). The runs started."""
    runs: list[Run] = []
    for pipeline in bigquery_pipelines(deps):
        raw = deps.docs.get(COLLECTION_TABLE_WATCHES, pipeline.name)[0]
        taking = None if raw is None else Watch.from_doc(raw).taking
        if taking is not None and taking.get("snapshot_id") == snapshot_id:
            runs += _carry_on(deps, pipeline, deps.table_wait_s)
    return runs


def _carry_on(deps: Deps, pipeline: Pipeline, wait_s: float) -> list[Run]:
    """finish_snapshot from an event: once the decision is recorded, BigQuery failing to start
    or answer (an error, not a job's errorResult) is the tick's to carry on; the event is
    acknowledged rather than redelivered in a loop."""
    try:
        runs = finish_snapshot(deps, pipeline, wait_s=wait_s)
        publish_given_up(deps, pipeline)
        return runs
    except Exception as exc:
        log.warning("carrying on the snapshot of %s failed (the tick carries it on): %s",
                    pipeline.name, exc, extra={"pipeline": pipeline.name})
        return []


def check_tables(deps: Deps) -> list[Run]:
    """The tick: read every watched table (what events missed counts now), take the snapshots
    that are due (a quiet period passed), finish those a crash interrupted; the runs started."""
    runs: list[Run] = []
    deadline = time.monotonic() + deps.table_wait_s  # one wait budget for the whole tick
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
            runs += finish_snapshot(deps, pipeline,
                                    wait_s=max(0.0, deadline - time.monotonic()))
            publish_given_up(deps, pipeline)
        except ConflictError:
            log.warning("the watch of %s is contended; the next tick tries again", pipeline.name)
        except Exception as exc:  # one pipeline's tables must not stop the others' repair
            log.warning("checking the tables of %s failed: %s", pipeline.name, exc)
    return runs


def export_root(pipeline: Pipeline, snapshot_id: str) -> str:
    """gs://.../ where one snapshot's Parquet files go: below export_uri, per pipeline and id."""
    return f"{_source(pipeline).export_uri.rstrip('/')}/{pipeline.name}/{snapshot_id}/"


def _part_table(source: BigQuerySource, part: str) -> str:
    """What one part snapshots: "query", or the watched table (project.dataset.table)."""
    return "query" if part == "query" else source.tables[int(part)]


def _destination(source: BigQuerySource, part: str, sid: str) -> str:
    return f"{source.snapshot_dataset}.{snapshot_table_name(_part_table(source, part), sid)}"


def _export_folder(pipeline: Pipeline, part: str, sid: str, attempt: int) -> str:
    """gs://... folder of one part's export: a retried extract writes beside the failed one's
    (whatever that left is not part of the snapshot)."""
    leaf = _part_table(_source(pipeline), part).rsplit(".", 1)[-1]
    return f"{export_root(pipeline, sid)}{leaf}{'' if attempt == 1 else f'-a{attempt}'}/"


# What one look at a part found: done, moved on (look again at once), waiting on BigQuery, or
# the snapshot given up (the other parts start nothing more for it).
DONE_PART, MOVED, WAITING, GAVE_UP = "done", "moved", "waiting", "gave up"


def _advance(deps: Deps, pipeline: Pipeline, watch: Watch, part: str) -> str:
    """One look at a part's job: started if it is not there yet, its end recorded (the next
    phase, or the failure): DONE_PART, MOVED (look again at once) or WAITING (on BigQuery)."""
    assert watch.taking is not None
    source, tables = _source(pipeline), _tables(deps)
    sid, taking = str(watch.taking["snapshot_id"]), watch.taking
    phase, attempt = part_state(taking, part)
    if phase == DONE:
        return DONE_PART
    jid = job_id(phase, sid, part, attempt)
    job = tables.own_job(jid, source.snapshot_dataset)
    if job is None:
        destination = _destination(source, part, sid)
        try:
            if phase == SNAPSHOT:
                snapshot_ms = int(taking["snapshot_ms"])
                expires_ms = int((float(taking["decided_at"]) + source.snapshot_ttl_s) * 1000)
                exists = tables.start_snapshot_query(
                    source.query, snapshot_ms, destination, expires_ms, jid) \
                    if source.query is not None else tables.start_snapshot(
                        source.tables[int(part)], snapshot_ms, destination, expires_ms, jid)
                if exists:  # made before (a crash after its job, or an older release)
                    _update(deps, pipeline.name,
                            lambda w: advanced(w, sid, part, phase, attempt))
                    return MOVED
            else:
                uri = f"{_export_folder(pipeline, part, sid, attempt)}part-*.parquet"
                tables.start_extract(destination, uri, jid)
        except JobRefused as refused:  # an attempt that failed at its start: counted as one
            job = JobInfo(job_id=jid, job_type="query" if phase == SNAPSHOT else "extract",
                          state="DONE", failed=True, end_ms=None, rows=None,
                          error_reason=refused.reason, error_message=refused.message)
            return GAVE_UP if _failed(deps, pipeline, watch, part, phase, attempt, job) \
                else MOVED
        job = tables.own_job(jid, source.snapshot_dataset)
    if job is None or job.state != "DONE":
        return WAITING
    if job.failed:
        return GAVE_UP if _failed(deps, pipeline, watch, part, phase, attempt, job) else MOVED
    _update(deps, pipeline.name, lambda w: advanced(w, sid, part, phase, attempt))
    return DONE_PART if phase == EXPORT else MOVED


def _failed(deps: Deps, pipeline: Pipeline, watch: Watch, part: str, phase: str, attempt: int,
            job: JobInfo) -> bool:
    """A part's job ended with an error: recorded on the watch; retried (a warning), or given
    up (an error, and the snapshot.failed event). Whether the snapshot is given up."""
    assert watch.taking is not None
    sid, now = str(watch.taking["snapshot_id"]), deps.clock.now()
    written = _update(deps, pipeline.name,
                      lambda w: job_failed(w, sid, part, phase, attempt, job, now))
    if written is None:  # another invocation recorded it: look again
        return False
    given_up = written.taking is None  # its event: publish_given_up, after finish_snapshot
    log.log(logging.ERROR if given_up else logging.WARNING,
            "BigQuery %s job %s of snapshot %s failed (%s: %s): %s", phase, job.job_id, sid,
            job.error_reason, job.error_message,
            "snapshot given up" if given_up else f"attempt {attempt + 1} starts",
            extra={"pipeline": pipeline.name})
    return given_up


def _give_up(deps: Deps, pipeline: Pipeline, watch: Watch, reason: str, message: str) -> None:
    """Give the snapshot being taken up for a reason of its own (overdue, an empty export);
    its snapshot.failed event: publish_given_up, as for a job's failure."""
    assert watch.taking is not None
    sid = str(watch.taking["snapshot_id"])
    if _update(deps, pipeline.name,
               lambda w: give_up(w, sid, reason, message, deps.clock.now())) is not None:
        log.error("BigQuery snapshot %s given up: %s", sid, message,
                  extra={"pipeline": pipeline.name})


def given_up_event(pipeline: Pipeline, gave_up: Mapping[str, Any], now: float
                   ) -> dict[str, Any]:
    """The one snapshot.failed event of a snapshot given up (id `snapshot-<id>:1`: the same on
    every publish, so a republish after a crash is deduplicated downstream)."""
    failures = [{k: f.get(k) for k in ("part", "phase", "attempt", "job_id", "reason", "message")}
                for f in gave_up.get("failures") or ()]
    last = failures[-1] if failures else {}
    sid = str(gave_up.get("snapshot_id"))
    return build_event(run_id=f"snapshot-{sid}", pipeline=pipeline.name, sequence=1,
                       kind="snapshot.failed", time=now, data={
                           "snapshot_id": sid, "tables": list(_source(pipeline).tables),
                           "snapshot_time": rfc3339_ms(int(gave_up.get("snapshot_ms") or 0)),
                           "phase": last.get("phase"), "job_id": last.get("job_id"),
                           "reason": last.get("reason") or "", "message": last.get("message") or "",
                           "attempts": int(last.get("attempt") or 1), "failures": failures})


def publish_given_up(deps: Deps, pipeline: Pipeline) -> None:
    """Publish the snapshot.failed event of a snapshot given up and not yet published, then mark
    it; one lost between the two (a crash, Pub/Sub down) is published again by the next tick."""
    raw = deps.docs.get(COLLECTION_TABLE_WATCHES, pipeline.name)[0]
    gave_up = None if raw is None else Watch.from_doc(raw).gave_up
    if gave_up is None or gave_up.get("published"):
        return
    try:
        deps.publisher.publish(given_up_event(pipeline, gave_up, deps.clock.now()))
    except Exception as exc:  # the next tick tries again (the same id)
        log.warning("snapshot.failed of %s not published: %s", gave_up.get("snapshot_id"), exc,
                    extra={"pipeline": pipeline.name})
        return
    sid = gave_up.get("snapshot_id")

    def mark(w: Watch) -> Watch | None:
        if w.gave_up is None or w.gave_up.get("snapshot_id") != sid or w.gave_up.get("published"):
            return None
        return replace(w, gave_up={**w.gave_up, "published": True})
    _update(deps, pipeline.name, mark)


def finish_snapshot(deps: Deps, pipeline: Pipeline, wait_s: float | None = None) -> list[Run]:
    """Carry on a decided snapshot: start each part's snapshot job, then its extract job, as the
    one before ends, and once every export is done record the snapshot document and start the
    run. Each call advances what it can, waits at most wait_s (deps.table_wait_s) for the jobs,
    and returns: the next event or tick carries on. Job ids derive from the snapshot id, part and
    attempt, and every step is a conditional write of the watch checked against jobs.get, so a
    redelivery or a concurrent invocation starts no second job and no second run."""
    budget = deps.table_wait_s if wait_s is None else wait_s
    deadline = time.monotonic() + budget
    while True:
        raw = deps.docs.get(COLLECTION_TABLE_WATCHES, pipeline.name)[0]
        watch = None if raw is None else Watch.from_doc(raw)
        if watch is None or watch.taking is None:
            return []
        if taking_overdue(watch, deps.clock.now()):
            _give_up(deps, pipeline, watch, "timeout",
                     f"not finished {MAX_TAKING_S / 3600:g} hours after it was decided")
            return []
        found: list[str] = []
        for part in snapshot_parts(_source(pipeline)):
            found.append(_advance(deps, pipeline, watch, part))
            if found[-1] == GAVE_UP:  # nothing more is started for a snapshot given up
                return []
        if all(f == DONE_PART for f in found):
            return _record(deps, pipeline, watch)
        if MOVED in found:
            continue  # a phase ended: the next is started at once, whatever the budget
        left = deadline - time.monotonic()
        if left <= 0:
            return []
        time.sleep(min(POLL_S, left))


def _record(deps: Deps, pipeline: Pipeline, watch: Watch) -> list[Run]:
    """Every export done: the snapshot document (once), the watch takes the next, the run."""
    from spotorch.app.arrivals import start_snapshot_run

    assert watch.taking is not None
    source = _source(pipeline)
    sid = str(watch.taking["snapshot_id"])
    snapshot_ms = int(watch.taking["snapshot_ms"])
    root = export_root(pipeline, sid)
    bucket, key = split_gs_uri(root)
    snapshot_tables, export_uris = [], []
    objects: tuple[tuple[str, int], ...] = ()
    for part in snapshot_parts(source):
        folder = _export_folder(pipeline, part, sid, part_state(watch.taking, part)[1])
        snapshot_tables.append(_destination(source, part, sid))
        export_uris.append(f"{folder}part-*.parquet")
        objects += intake.listed_objects(deps.objects, bucket, split_gs_uri(folder)[1])
    objects = tuple(sorted(set(objects)))
    if not objects:  # waiting changes nothing: given up, and said (snapshot.failed)
        _give_up(deps, pipeline, watch, "empty", f"the export wrote nothing under {root}")
        return []
    now = deps.clock.now()
    bigquery: dict[str, Any] = {
        "tables": list(source.tables), "snapshot_time": rfc3339_ms(snapshot_ms),
        "snapshot_tables": snapshot_tables, "export_uris": export_uris,
        "objects": [{"name": n, "generation": g} for n, g in objects]}
    if source.query is not None:
        bigquery |= {"query": source.query, "query_sha256": query_sha256(source.query)}
    if watch.taking.get("failures"):  # jobs that failed and were retried on the way
        bigquery["job_failures"] = [dict(f) for f in watch.taking["failures"]]
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
