"""An in-memory BigQuery for unit tests: tables with their history, jobs, snapshots, exports.

tests/test_table_source_contract.py runs the same checks against it and the BigQuery emulator.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from spotorch.adapters.memory.twins import InMemoryObjectStore
from spotorch.core.table_changes import JobInfo, TableInfo, extract_bucket_missing
from spotorch.core.triggers import split_gs_uri
from spotorch.ports.tables import JobRefused, TableNotFound

# The first file name BigQuery gives a wildcard URI's '*' (a 12-digit shard number).
FIRST_SHARD = "000000000000"


@dataclass
class InMemoryTables:
    """ports.TableSource over dicts; a test changes tables with load() (as a load or DML job)."""

    objects: InMemoryObjectStore
    # table -> its versions, oldest first: (BigQuery time in ms, the rows then)
    history: dict[str, list[tuple[int, tuple[dict[str, Any], ...]]]] = field(default_factory=dict)
    jobs: dict[tuple[str, str], JobInfo] = field(default_factory=dict)
    expires: dict[str, int] = field(default_factory=dict)
    calls: list[str] = field(default_factory=list)
    generation: int = 1000
    hold: bool = False  # started jobs stay RUNNING until finish_held (a job that takes long)
    fail: dict[str, tuple[str, str]] = field(default_factory=dict)  # job id -> (reason, message)
    buckets: set[str] | None = None  # the buckets that exist; None: every bucket
    # job id -> (reason, message): jobs.insert itself refused (a 4xx; the adapter's JobRefused)
    refuse: dict[str, tuple[str, str]] = field(default_factory=dict)
    _work: dict[str, Callable[[], None]] = field(default_factory=dict)
    _lock: threading.RLock = field(default_factory=threading.RLock)

    def load(self, table: str, rows: list[dict[str, Any]], *, at_ms: int, job_id: str,
             kind: str = "load") -> JobInfo:
        """Append rows as a job would (test helper); the job that did it is recorded DONE."""
        before = self.history.get(table, [(0, ())])[-1][1]
        self.history.setdefault(table, []).append((at_ms, (*before, *rows)))
        job = JobInfo(job_id, kind, "DONE", False, at_ms, len(rows),
                      (table,) if kind == "load" else ())
        self.jobs[(table.split(".")[0], job_id)] = job
        return job

    def rows_at(self, table: str, at_ms: int) -> tuple[dict[str, Any], ...]:
        """The table's rows as of a time (time travel); TableNotFound before it existed."""
        versions = [rows for ms, rows in self.history.get(table, []) if ms <= at_ms]
        if not versions:
            raise TableNotFound(f"{table} did not exist at {at_ms}")
        return versions[-1]

    def get_table(self, table: str) -> TableInfo:
        """TableSource.get_table: the newest version's time and row count."""
        self.calls.append(f"tables.get {table}")
        if table not in self.history:
            raise TableNotFound(table)
        at_ms, rows = self.history[table][-1]
        return TableInfo(table, at_ms, len(rows))

    def get_job(self, project: str, job_id: str, location: str | None = None) -> JobInfo | None:
        """TableSource.get_job."""
        self.calls.append(f"jobs.get {job_id}")
        return self.jobs.get((project, job_id))

    def own_job(self, job_id: str, dataset: str | None = None) -> JobInfo | None:
        """TableSource.own_job: a job this source started."""
        self.calls.append(f"jobs.get {job_id}")
        return self.jobs.get(("", job_id))

    def _start(self, job_id: str, kind: str, work: Callable[[], None]) -> None:
        """A job of that id: DONE at once (its work done), or RUNNING while `hold` (finish_held
        ends it); DONE with an error when its work raises or `fail` names it."""
        with self._lock:  # one job per id, as jobs.insert: concurrent callers get Conflict
            if ("", job_id) in self.jobs:
                return  # BigQuery answers Conflict: the job was started before
            if job_id in self.refuse:  # no job made: jobs.get will not find it
                raise JobRefused(job_id, *self.refuse[job_id])
            self.jobs[("", job_id)] = JobInfo(job_id, kind, "RUNNING", False, None, None)
            self._work[job_id] = work
            if not self.hold:
                self._end(job_id)

    def _end(self, job_id: str) -> None:
        job, work = self.jobs[("", job_id)], self._work.pop(job_id)
        reason, message = self.fail.get(job_id, (None, None))
        if reason is None:
            try:
                work()
            except _JobError as exc:
                reason, message = exc.reason, exc.message
        self.jobs[("", job_id)] = replace(job, state="DONE", failed=reason is not None,
                                          error_reason=reason, error_message=message)

    def finish_held(self) -> None:
        """End every job left RUNNING (test helper)."""
        with self._lock:
            self.hold = False
            for job_id in list(self._work):
                self._end(job_id)

    def start_snapshot(self, table: str, snapshot_ms: int, destination: str, expires_ms: int,
                       job_id: str) -> bool:
        """TableSource.start_snapshot: the rows as of snapshot_ms under a new name."""
        self.calls.append(f"snapshot {table}@{snapshot_ms} -> {destination}")
        if destination in self.history:
            return True

        def work() -> None:
            try:
                rows = self.rows_at(table, snapshot_ms)
            except TableNotFound as exc:
                raise _JobError("notFound", str(exc)) from None
            self._create(destination, snapshot_ms, rows, expires_ms)
        self._start(job_id, "query", work)
        return False

    def _create(self, destination: str, snapshot_ms: int, rows: tuple[dict[str, Any], ...],
                expires_ms: int) -> None:
        if destination in self.history:  # CREATE TABLE of a table that exists fails
            raise _JobError("duplicate", f"Already Exists: Table {destination}")
        self.history[destination] = [(snapshot_ms, rows)]
        self.expires[destination] = expires_ms

    def start_snapshot_query(self, query: str, snapshot_ms: int, destination: str,
                             expires_ms: int, job_id: str) -> bool:
        """TableSource.start_snapshot_query: the query run by SQLite (stdlib) over every table
        it reads as of snapshot_ms, so it takes SQL both dialects share (SELECT, WHERE, JOIN)."""
        self.calls.append(f"snapshot query@{snapshot_ms} -> {destination}")
        if destination in self.history:
            return True

        def work() -> None:
            try:
                result = self._query(query, snapshot_ms)
            except TableNotFound as exc:
                raise _JobError("notFound", str(exc)) from None
            self._create(destination, snapshot_ms, result, expires_ms)
        self._start(job_id, "query", work)
        return False

    def _query(self, query: str, snapshot_ms: int) -> tuple[dict[str, Any], ...]:
        import sqlite3

        from spotorch.core.table_changes import query_tables, with_tables

        db = sqlite3.connect(":memory:")
        try:
            for table in query_tables(query):
                rows = self.rows_at(table, snapshot_ms)
                columns = list(dict.fromkeys(
                    k for _, version in self.history[table] for row in version for k in row))
                declared = ", ".join(f'"{c}"' for c in columns or ["_"])
                db.execute(f'CREATE TABLE "{table}" ({declared})')
                db.executemany(f'INSERT INTO "{table}" VALUES ({", ".join("?" * len(columns))})',
                               [[row.get(c) for c in columns] for row in rows])
            # the same implicit aliases as BigQuery's (the table id)
            cursor = db.execute(with_tables(query.strip().rstrip(";"), lambda t: f'"{t}"'))
            names = [d[0] for d in cursor.description]
            return tuple(dict(zip(names, row, strict=True)) for row in cursor.fetchall())
        finally:
            db.close()

    def start_extract(self, table: str, destination_uri: str, job_id: str) -> None:
        """TableSource.start_extract: one Parquet shard of the rows (pyarrow, imported here);
        a bucket not in `buckets` (when set) fails the job as BigQuery does (notFound)."""
        self.calls.append(f"extract {table} -> {destination_uri}")

        def work() -> None:
            import io

            import pyarrow as pa
            import pyarrow.parquet as pq

            bucket, _ = split_gs_uri(destination_uri)
            if self.buckets is not None and bucket not in self.buckets:
                raise _JobError(*extract_bucket_missing(bucket))
            name = destination_uri[len(f"gs://{bucket}/"):].replace("*", FIRST_SHARD)
            rows = list(self.history[table][-1][1])
            out = io.BytesIO()
            pq.write_table(pa.Table.from_pylist(rows), out)
            self.generation += 1
            self.objects.put(bucket, name, self.generation, out.getvalue())
        self._start(job_id, "extract", work)


class _JobError(Exception):
    """Why a job ends DONE with an errorResult."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(f"{reason}: {message}")
        self.reason, self.message = reason, message
