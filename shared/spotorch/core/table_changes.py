"""BigQuery table changes: the audit entry's change in one shape, and the pure batching rules.

Eventarc delivers BigQuery's audit entries as `google.cloud.audit.log.v1.written` CloudEvents;
they are decoded at the edge (spotorch.entrypoints.audit_entries) into a TableChange. What an
entry says is a hint: spotorch.app.table_intake checks the job it names (jobs.get) and the table
(tables.get) before anything changes. Nothing here does I/O.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from spotorch.core.pipeline import BigQuerySource, Pipeline


@dataclass(frozen=True)
class TableChange:
    """One audit entry that says a job changed tables (still to be checked against BigQuery)."""

    event_id: str
    job_project: str
    job_id: str
    tables: tuple[str, ...]  # project.dataset.table, the tables the entry names as changed
    kind: str  # "job_done" (a jobChange end entry) or "table_data_change"
    inserted_rows: int | None = None  # tableDataChange.insertedRowsCount
    deleted_rows: int | None = None
    truncated: bool = False
    # resource.labels.location of the entry: jobs.get needs it outside the US and EU
    location: str | None = None

    @property
    def job_name(self) -> str:
        """The job as the audit log names it: projects/P/jobs/ID."""
        return f"projects/{self.job_project}/jobs/{self.job_id}"


# --- what BigQuery says (the source of truth), as the decisions see it ----------------------------


@dataclass(frozen=True)
class TableInfo:
    """tables.get of one table: when it last changed (BigQuery's clock) and its rows."""

    table: str  # project.dataset.table
    last_modified_ms: int
    num_rows: int


@dataclass(frozen=True)
class JobInfo:
    """jobs.get of the job an audit entry names."""

    job_id: str
    job_type: str  # load, query, copy, extract
    state: str  # PENDING, RUNNING, DONE
    failed: bool
    end_ms: int | None  # statistics.endTime
    rows: int | None  # load outputRows, or a DML query's numDmlAffectedRows
    destinations: tuple[str, ...] = ()  # project.dataset.table the job resource names
    error_reason: str | None = None  # status.errorResult.reason of a failed job
    error_message: str | None = None  # status.errorResult.message


def confirm(change: TableChange, job: JobInfo | None) -> str | None:
    """Why BigQuery's own job contradicts the audit entry, or None when it confirms it."""
    if job is None:
        return f"job {change.job_name} does not exist"
    if job.state != "DONE":
        return f"job {change.job_name} is {job.state}, not DONE"
    if job.failed:
        return f"job {change.job_name} failed: it changed nothing"
    if job.job_type not in ("load", "query", "copy"):
        return f"job {change.job_name} is a {job.job_type} job: it writes no table"
    # A DML query's job resource does not name its target table (only its query text does):
    # only a destination the job does name must agree.
    if job.destinations and not set(change.tables) & set(job.destinations):
        return (f"job {change.job_name} wrote {', '.join(job.destinations)}, not "
                f"{', '.join(change.tables)}")
    return None


# --- the watch of one pipeline's tables (pure) ------------------------------------------------------


@dataclass(frozen=True)
class Watch:
    """Everything known about one pipeline's watched tables between snapshots."""

    pipeline: str
    seen: Mapping[str, tuple[int, int]]  # table -> (last_modified_ms, num_rows) last seen
    pending_rows: int = 0  # rows changed since the last snapshot
    changed_at_ms: int | None = None  # BigQuery time of the newest change counted
    first_change_at: float | None = None  # our clock: when the pending changes began
    last_change_at: float | None = None  # our clock: the last counted change (quiet period)
    last_snapshot_at: float | None = None  # our clock: the last snapshot taken (min interval)
    jobs: tuple[str, ...] = ()  # job ids counted since the last snapshot (one count per job)
    taking: Mapping[str, Any] | None = None  # a snapshot decided and not yet exported
    # the last snapshot given up on (a job failed MAX_JOB_ATTEMPTS times): for people
    gave_up: Mapping[str, Any] | None = None

    def to_doc(self) -> dict[str, Any]:
        """The watch's Firestore document."""
        return {"pipeline": self.pipeline,
                "tables": [{"table": t, "last_modified_ms": m, "num_rows": n}
                           for t, (m, n) in sorted(self.seen.items())],
                "pending_rows": self.pending_rows, "changed_at_ms": self.changed_at_ms,
                "first_change_at": self.first_change_at, "last_change_at": self.last_change_at,
                "last_snapshot_at": self.last_snapshot_at, "jobs": list(self.jobs),
                "taking": None if self.taking is None else dict(self.taking),
                "gave_up": None if self.gave_up is None else dict(self.gave_up)}

    @classmethod
    def from_doc(cls, doc: Mapping[str, Any]) -> Watch:
        """The watch a stored document holds (the inverse of to_doc)."""
        return cls(
            pipeline=str(doc["pipeline"]),
            seen={str(t["table"]): (int(t["last_modified_ms"]), int(t["num_rows"]))
                  for t in doc.get("tables") or ()},
            pending_rows=int(doc.get("pending_rows") or 0),
            changed_at_ms=doc.get("changed_at_ms"), first_change_at=doc.get("first_change_at"),
            last_change_at=doc.get("last_change_at"), last_snapshot_at=doc.get("last_snapshot_at"),
            jobs=tuple(str(j) for j in doc.get("jobs") or ()),
            taking=doc.get("taking"), gave_up=doc.get("gave_up"))


MAX_JOBS_KEPT = 500  # job ids remembered per watch between snapshots (older ones: the dedupe)


def observe_tables(watch: Watch, tables: Sequence[TableInfo], now: float, *,
                   baseline: bool) -> Watch:
    """The tick's look at the tables: a table modified since last seen counts its row change
    (at least one row: an UPDATE changes none). baseline: a first look records without counting."""
    seen = dict(watch.seen)
    rows, newest = 0, watch.changed_at_ms
    for info in tables:
        before = seen.get(info.table)
        seen[info.table] = (max(info.last_modified_ms, before[0] if before else 0), info.num_rows)
        if before is None and baseline:
            continue
        if before is None or info.last_modified_ms > before[0]:
            rows += max(abs(info.num_rows - (before[1] if before else 0)), 1)
            newest = max(newest or 0, info.last_modified_ms)
    grown = replace(watch, seen=seen)
    return _counted(grown, rows, newest, now) if rows else grown


def observe_job(watch: Watch, change: TableChange, job: JobInfo, tables: Sequence[TableInfo],
                now: float) -> Watch | None:
    """A confirmed job's change: its rows count once (both of its entries name the same job);
    None when it was counted already. The tables' state is recorded, so the tick does not count
    the same change again."""
    if job.job_id in watch.jobs:
        return None
    seen = dict(watch.seen)
    for info in tables:
        before = seen.get(info.table, (0, 0))
        seen[info.table] = (max(info.last_modified_ms, before[0]), info.num_rows)
    hinted = (change.inserted_rows or 0) + (change.deleted_rows or 0)
    rows = max(job.rows or 0, hinted, 1)
    newest = max([watch.changed_at_ms or 0, job.end_ms or 0,
                  *(t.last_modified_ms for t in tables)])
    jobs = (*watch.jobs, job.job_id)[-MAX_JOBS_KEPT:]
    return _counted(replace(watch, seen=seen, jobs=jobs), rows, newest, now)


def _counted(watch: Watch, rows: int, newest: int | None, now: float) -> Watch:
    return replace(watch, pending_rows=watch.pending_rows + rows, changed_at_ms=newest,
                   first_change_at=watch.first_change_at or now, last_change_at=now)


def due(watch: Watch, source: BigQuerySource, now: float) -> str | None:
    """Why no snapshot is taken now, or None when it is due."""
    if watch.taking is not None:
        return "a snapshot is being taken"
    if watch.pending_rows < source.min_rows_changed:
        return f"{watch.pending_rows} of {source.min_rows_changed} rows changed"
    if (watch.last_change_at or 0.0) + source.quiet_period_s > now:
        return "not quiet yet"
    if watch.last_snapshot_at is not None and \
            watch.last_snapshot_at + source.min_interval_s > now:
        return "the last snapshot is more recent than min_interval"
    return None


def snapshot_id_of(pipeline: str, tables: Sequence[str], snapshot_ms: int,
                   query: str | None = None) -> str:
    """Stable id of a table snapshot: the pipeline, its tables and the time they are read at
    (and the query, if any: a changed query is another snapshot of the same time)."""
    key: list[Any] = [pipeline, sorted(tables), snapshot_ms]
    if query is not None:
        key.append(query_sha256(query))
    canonical = json.dumps(key, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def take(watch: Watch, pipeline: Pipeline, now: float) -> Watch:
    """The decision to snapshot: at the newest counted change (BigQuery's clock), recorded before
    any snapshot job, so a crash is finished by the next tick and never doubled."""
    source = pipeline.trigger.bigquery
    assert source is not None
    snapshot_ms = int(watch.changed_at_ms or 0)
    sid = snapshot_id_of(pipeline.name, source.tables, snapshot_ms, source.query)
    return replace(watch, taking={"snapshot_id": sid, "snapshot_ms": snapshot_ms,
                                  "decided_at": now, "rows": watch.pending_rows},
                   pending_rows=0, jobs=(), first_change_at=None, last_snapshot_at=now)


def taken(watch: Watch, snapshot_id: str) -> Watch | None:
    """The snapshot was exported and recorded: the watch takes the next one."""
    if watch.taking is None or watch.taking.get("snapshot_id") != snapshot_id:
        return None
    return replace(watch, taking=None)


# --- carrying out a decided snapshot: its jobs, started and followed (pure) ----------------------

MAX_JOB_ATTEMPTS = 3  # a snapshot query or extract that failed this often: the snapshot is given up
MAX_FAILURES_KEPT = 10  # failed jobs recorded on the taking record
# A snapshot still being taken this long after its decision is given up: BigQuery's limit on a
# query job is 6 hours, each part runs a query then an extract, and a retry starts them again.
MAX_TAKING_S = 24 * 3600.0
SNAPSHOT, EXPORT, DONE = "snapshot", "export", "done"  # a part's phases, in order


# An extract job to a bucket that does not exist ends DONE with this errorResult (the local
# stack's BigQuery front and the in-memory twin). The reason is BigQuery's `notFound`; the exact
# message real BigQuery writes was not found in its documentation: this text is ours
# (docs/local-stack.md), and nothing decides on it.
EXTRACT_NO_BUCKET = ("notFound", "Not found: Bucket {bucket} (the extract's destination)")


def extract_bucket_missing(bucket: str) -> tuple[str, str]:
    """(reason, message) of an extract job's errorResult when its bucket does not exist."""
    return EXTRACT_NO_BUCKET[0], EXTRACT_NO_BUCKET[1].format(bucket=bucket)


def snapshot_parts(source: BigQuerySource) -> tuple[str, ...]:
    """The parts of one snapshot, each a snapshot job then an extract job: "query" for a
    query's result, else the index of each table (job ids hold no table names)."""
    return ("query",) if source.query is not None else tuple(
        str(i) for i in range(len(source.tables)))


def part_state(taking: Mapping[str, Any], part: str) -> tuple[str, int]:
    """(phase, attempt) of one part; a taking record written before parts existed starts over
    at the snapshot phase (its jobs are found again by their ids)."""
    found = (taking.get("parts") or {}).get(part) or {}
    return str(found.get("phase") or SNAPSHOT), int(found.get("attempt") or 1)


def job_id(phase: str, snapshot_id: str, part: str, attempt: int) -> str:
    """The id of a part's job: derived from the snapshot, the part and the attempt, so a
    redelivery or a concurrent invocation finds the job started before (a Conflict on insert)
    instead of starting another; a retry after a failure has an id of its own."""
    base = f"spotorch-{phase}-{snapshot_id}-{part}"
    return base if attempt == 1 else f"{base}-a{attempt}"


def _with_part(watch: Watch, part: str, phase: str, attempt: int,
               **more: Any) -> Watch:
    assert watch.taking is not None
    parts = dict(watch.taking.get("parts") or {})
    parts[part] = {"phase": phase, "attempt": attempt}
    return replace(watch, taking={**watch.taking, "parts": parts, **more})


def _is_taking(watch: Watch, snapshot_id: str) -> bool:
    return watch.taking is not None and watch.taking.get("snapshot_id") == snapshot_id


def advanced(watch: Watch, snapshot_id: str, part: str, phase: str,
             attempt: int) -> Watch | None:
    """The part's job of (phase, attempt) ended well: the part moves to its next phase; None
    when another invocation moved it already."""
    if not _is_taking(watch, snapshot_id) or watch.taking is None or \
            part_state(watch.taking, part) != (phase, attempt):
        return None
    after = EXPORT if phase == SNAPSHOT else DONE
    return _with_part(watch, part, after, 1 if after == EXPORT else attempt)


def job_failed(watch: Watch, snapshot_id: str, part: str, phase: str, attempt: int,
               job: JobInfo, now: float) -> Watch | None:
    """The part's job of (phase, attempt) ended DONE with an error: recorded; the next attempt
    (a fresh job id) unless MAX_JOB_ATTEMPTS ran out, then the snapshot is given up: recorded in
    gave_up, and the watch takes the next one when new changes make it due (the rows of this
    one are not counted again: the same snapshot time would be the same snapshot id, whose
    jobs failed). None when recorded before."""
    if not _is_taking(watch, snapshot_id) or watch.taking is None or \
            part_state(watch.taking, part) != (phase, attempt):
        return None
    failure = {"part": part, "phase": phase, "attempt": attempt, "job_id": job.job_id,
               "reason": job.error_reason or "", "message": job.error_message or "", "at": now}
    failures = [*(watch.taking.get("failures") or ()), failure][-MAX_FAILURES_KEPT:]
    if attempt < MAX_JOB_ATTEMPTS:
        return _with_part(watch, part, phase, attempt + 1, failures=failures)
    return _given_up(watch, snapshot_id, failures, now)


def _given_up(watch: Watch, snapshot_id: str, failures: list[dict[str, Any]],
              now: float) -> Watch:
    assert watch.taking is not None
    gave_up = {"snapshot_id": snapshot_id, "snapshot_ms": watch.taking.get("snapshot_ms"),
               "decided_at": watch.taking.get("decided_at"), "given_up_at": now,
               "rows": watch.taking.get("rows"), "failures": failures}
    return replace(watch, taking=None, gave_up=gave_up)


def give_up(watch: Watch, snapshot_id: str, reason: str, message: str,
            now: float) -> Watch | None:
    """The snapshot being taken is given up for a reason of its own, not a job's error (it ran
    past MAX_TAKING_S; its export wrote nothing): recorded as its last failure, as job_failed
    records one. None when it is not the one being taken (given up or finished before)."""
    if not _is_taking(watch, snapshot_id) or watch.taking is None:
        return None
    failure = {"part": None, "phase": None, "attempt": None, "job_id": None, "reason": reason,
               "message": message, "at": now}
    failures = [*(watch.taking.get("failures") or ()), failure][-MAX_FAILURES_KEPT:]
    return _given_up(watch, snapshot_id, failures, now)


def taking_overdue(watch: Watch, now: float) -> bool:
    """Whether the snapshot being taken was decided more than MAX_TAKING_S ago: its jobs are
    not coming (BigQuery ends a query job within 6 hours), so waiting longer only blocks the
    pipeline's next snapshot."""
    if watch.taking is None:
        return False
    return now - float(watch.taking.get("decided_at") or now) > MAX_TAKING_S


def snapshot_table_name(table: str, snapshot_id: str) -> str:
    """The snapshot table's id in the snapshot dataset: the source table's name and the id."""
    name = re.sub(r"[^A-Za-z0-9_]", "_", table.rsplit(".", 1)[-1])[:900]
    return f"{name}__{snapshot_id}"


def rfc3339_ms(ms: int) -> str:
    """An epoch-milliseconds time as RFC 3339 (UTC, millisecond precision)."""
    from datetime import UTC
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="milliseconds") \
        .replace("+00:00", "Z")


# --- a query as the run's data (trigger.bigquery.query) -------------------------------------------

# A backticked name; a table the query reads is written `project.dataset.table` (fully qualified,
# backticked), so it can be found and read as of the snapshot time.
_BACKTICKED = re.compile(r"`([^`]+)`")
# A table after FROM or JOIN not written that way (bare, `dataset.table`, `p`.`d`.`t`).
_LOOSE_REFERENCE = re.compile(
    r"\b(?:FROM|JOIN)\s+(`[^`]*`\.[^\s,()]+|`[^`.]+\.[^`.]+`|[A-Za-z_][\w-]*(?:\.[\w-]+)+)"
    r"(?![\w`.])", re.IGNORECASE)
# What may follow a table in FROM without being its alias.
_NOT_ALIAS = ("WHERE", "JOIN", "INNER", "LEFT", "RIGHT", "FULL", "CROSS", "NATURAL", "ON", "USING",
              "GROUP", "ORDER", "LIMIT", "OFFSET", "HAVING", "QUALIFY", "WINDOW", "UNION",
              "INTERSECT", "EXCEPT", "TABLESAMPLE", "FOR", "PIVOT", "UNPIVOT")
# A name given to a table or subquery: after AS, or right after a backticked table or a ')'.
_ALIAS = re.compile(
    rf"(?:\bAS|[`)])\s+(?!(?:AS|{'|'.join(_NOT_ALIAS)})\b)([A-Za-z_]\w*)", re.IGNORECASE)
_ALIAS_FOLLOWS = re.compile(
    rf"\s+(?:AS\b|(?!(?:{'|'.join(_NOT_ALIAS)})\b)[A-Za-z_]\w*)", re.IGNORECASE)


def query_tables(query: str) -> tuple[str, ...]:
    """The fully qualified tables a query names (`project.dataset.table`), first use first."""
    seen: dict[str, None] = {}
    for match in _BACKTICKED.finditer(query):
        if match.group(1).count(".") == 2 and not query[match.end():].startswith("."):
            seen.setdefault(match.group(1))
    return tuple(seen)


def query_problems(query: str, tables: Sequence[str]) -> list[str]:
    """What keeps a query from being snapshotted as of one time: not a single SELECT, a table
    not written `project.dataset.table`, or one that is not among the watched tables."""
    problems = []
    if not re.match(r"^\s*(\(\s*)*(SELECT|WITH)\b", query, re.IGNORECASE):
        problems.append("must be a GoogleSQL query: SELECT ... (or WITH ... SELECT ...)")
    if ";" in query.strip().rstrip(";"):
        problems.append("must be one statement (no ';' inside)")
    if re.search(r"\bFOR\s+SYSTEM_TIME\b", query, re.IGNORECASE):
        problems.append("must not say FOR SYSTEM_TIME AS OF: each snapshot reads the tables as "
                        "of its own time")
    # `JOIN r.items` unnests an array of the row aliased r: not a table
    aliases = {a.lower() for a in _ALIAS.findall(query)}
    for loose in dict.fromkeys(m.group(1) for m in _LOOSE_REFERENCE.finditer(query)):
        if loose.count(".") == 1 and loose.split(".")[0].lower() in aliases:
            continue
        problems.append(f"reads {loose}: write every table it reads fully qualified and "
                        "backticked (`project.dataset.table`), so the snapshot reads it as of the "
                        "snapshot time")
    named = query_tables(query)
    for table in named:
        if table not in tables:
            problems.append(f"reads `{table}`, which is not in tables: list every table the "
                            "query reads there (the audit events and the tick watch those)")
    if not named:
        problems.append("reads none of the tables: name them `project.dataset.table`")
    return problems


def with_tables(query: str, read: Callable[[str], str]) -> str:
    """The query with each table it reads (`project.dataset.table`, not a column's qualifier)
    replaced by read(table), keeping the table's implicit alias (its table id) unless the query
    gives one."""
    def replaced(match: re.Match[str]) -> str:
        table, rest = match.group(1), query[match.end():]
        if table.count(".") != 2 or rest.startswith("."):
            return match.group(0)
        # backticked: a table id may be a reserved word (ROWS, GROUPS, ...)
        alias = "" if _ALIAS_FOLLOWS.match(rest) else f" AS `{table.rsplit('.', 1)[-1]}`"
        return read(table) + alias
    return _BACKTICKED.sub(replaced, query)


def query_as_of(query: str, snapshot_ms: int) -> str:
    """The query with every table it reads as of snapshot_ms: each becomes a subquery
    `(SELECT * FROM t FOR SYSTEM_TIME AS OF TIMESTAMP_MILLIS(ms))` (real BigQuery and the
    bqemulator both run it; an alias after FOR SYSTEM_TIME would not be portable)."""
    return with_tables(query, lambda table: (
        f"(SELECT * FROM `{table}` FOR SYSTEM_TIME AS OF TIMESTAMP_MILLIS({int(snapshot_ms)}))"))


def query_sha256(query: str) -> str:
    """The query's hash as provenance records it (hex SHA-256 of its exact text)."""
    return hashlib.sha256(query.encode()).hexdigest()
