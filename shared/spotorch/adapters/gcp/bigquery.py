"""TableSource on google-cloud-bigquery; the client on first use (cold starts never pay for it).

The snapshot is `CREATE TABLE dest OPTIONS(expiration_timestamp=...) AS SELECT * FROM src FOR
SYSTEM_TIME AS OF TIMESTAMP_MILLIS(t)`: it runs on real BigQuery and on the bqemulator, which
parses neither `CREATE SNAPSHOT TABLE` nor a copy job's `table@<ms>` decorator (docs/local-stack.md).
On real BigQuery this makes a standard table rather than a snapshot table (billed as a query and
stored in full); it expires all the same. The endpoint (SPOTORCH_BIGQUERY_ENDPOINT) points the
same client at the emulator with anonymous credentials.

Nothing here waits for a job: the snapshot query and the extract are started with the ids the
caller derives (a Conflict on insert: started before) and followed with jobs.get (own_job), so
no invocation is held for a job's duration (spotorch.app.table_intake.finish_snapshot).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from spotorch.core.table_changes import JobInfo, TableInfo
from spotorch.ports.tables import JobRefused, TableNotFound


def _table_id(ref: Any) -> str | None:
    if not isinstance(ref, dict):
        return None
    try:
        return f"{ref['projectId']}.{ref['datasetId']}.{ref['tableId']}"
    except KeyError:
        return None


def _ms(value: Any) -> int | None:
    """BigQuery times are epoch milliseconds as decimal strings ("1796177803458"; the emulator
    writes "1796177803458.0")."""
    if value in (None, ""):
        return None
    return int(float(value))


def _quoted(table: str) -> str:
    return "`" + table.replace("`", "") + "`"


# BigQuery answers a rate or quota limit with 403 too: those pass with time (the tick tries again).
TRANSIENT_REASONS = frozenset({"rateLimitExceeded", "quotaExceeded", "backendError"})


def _refusal(job_id: str, exc: Exception) -> JobRefused | None:
    """The attempt's failure when a 4xx answer to jobs.insert is one no waiting changes (a bad
    query, no such table or bucket, no access); None for a rate or quota (403 as well)."""
    errors = getattr(exc, "errors", None) or [{}]
    first = errors[0] if isinstance(errors[0], dict) else {}
    reason = str(first.get("reason") or type(exc).__name__)
    if reason in TRANSIENT_REASONS:
        return None
    return JobRefused(job_id, reason, str(getattr(exc, "message", exc)))


def _insert(job_id: str, start: Callable[[], Any]) -> None:
    """jobs.insert of a job named job_id: a Conflict means it was started before (left as it
    is); a refusal no waiting changes is the port's JobRefused; anything else propagates."""
    from google.api_core import exceptions as gexc

    try:
        start()
    except gexc.Conflict:
        pass
    except (gexc.BadRequest, gexc.Forbidden, gexc.NotFound) as exc:
        refused = _refusal(job_id, exc)
        if refused is None:
            raise
        raise refused from None


class BigQueryTables:
    """ports.TableSource: tables.get, jobs.get, a query to snapshot, an extract job to export."""

    def __init__(self, project: str, *, endpoint: str | None = None,
                 location: str | None = None) -> None:
        self.project = project
        self.endpoint = endpoint
        # Where our snapshot jobs run and are read back (jobs.get needs it outside US and EU):
        # the snapshot dataset's location (SPOTORCH_BIGQUERY_LOCATION); None: BigQuery's default.
        self.location = location
        self._client: Any = None
        self._lock = threading.Lock()
        self._locations: dict[str, str | None] = {}

    def client(self) -> Any:
        """The google-cloud-bigquery client, built once on first use."""
        with self._lock:
            if self._client is None:
                from google.cloud import bigquery

                if self.endpoint:
                    from google.api_core.client_options import ClientOptions
                    from google.auth.credentials import AnonymousCredentials

                    self._client = bigquery.Client(
                        project=self.project, credentials=AnonymousCredentials(),
                        client_options=ClientOptions(api_endpoint=self.endpoint),
                        location=self.location)
                else:
                    self._client = bigquery.Client(project=self.project, location=self.location)
            return self._client

    def get_table(self, table: str) -> TableInfo:
        """TableSource.get_table (tables.get)."""
        from google.api_core import exceptions as gexc

        try:
            found = self.client().get_table(table)
        except gexc.NotFound:
            raise TableNotFound(table) from None
        props = found._properties
        return TableInfo(table, _ms(props.get("lastModifiedTime")) or 0,
                         int(props.get("numRows") or 0))

    def get_job(self, project: str, job_id: str, location: str | None = None) -> JobInfo | None:
        """TableSource.get_job (jobs.get); None when BigQuery has no such job."""
        from google.api_core import exceptions as gexc

        try:
            job = self.client().get_job(job_id, project=project, location=location)
        except gexc.NotFound:
            return None
        props = job._properties
        config, stats = props.get("configuration") or {}, props.get("statistics") or {}
        kind = str(config.get("jobType") or job.job_type or "").lower()
        destinations = []
        if kind == "load":
            destinations.append(_table_id(config.get("load", {}).get("destinationTable")))
        elif kind == "copy":
            destinations.append(_table_id(config.get("copy", {}).get("destinationTable")))
        rows: Any = None
        if kind == "load":
            rows = stats.get("load", {}).get("outputRows")
        elif kind == "query":
            rows = stats.get("query", {}).get("numDmlAffectedRows")
        status = props.get("status") or {}
        error = status.get("errorResult") or {}
        return JobInfo(job_id=job_id, job_type=kind, state=str(status.get("state") or ""),
                       failed=bool(error), end_ms=_ms(stats.get("endTime")),
                       rows=None if rows is None else int(rows),
                       destinations=tuple(d for d in destinations if d),
                       error_reason=str(error["reason"]) if error.get("reason") else None,
                       error_message=str(error["message"]) if error.get("message") else None)

    def own_job(self, job_id: str, dataset: str | None = None) -> JobInfo | None:
        """TableSource.own_job: jobs.get in this source's project, in SPOTORCH_BIGQUERY_LOCATION
        or else the snapshot dataset's own location (read once: a job outside the US and EU
        is not found without it)."""
        return self.get_job(self.project, job_id, self.location or self._location_of(dataset))

    def _location_of(self, dataset: str | None) -> str | None:
        """datasets.get's location of the dataset, once per dataset; None when unknown."""
        if not dataset:
            return None
        if dataset not in self._locations:
            from google.api_core import exceptions as gexc

            try:
                found = self.client().get_dataset(dataset).location
            except gexc.NotFound:
                return None  # not cached: it may be created yet
            self._locations[dataset] = str(found) if found else None
        return self._locations[dataset]


    def start_snapshot(self, table: str, snapshot_ms: int, destination: str, expires_ms: int,
                       job_id: str) -> bool:
        """TableSource.start_snapshot: CREATE TABLE ... AS SELECT ... FOR SYSTEM_TIME AS OF."""
        return self._start_create_as(destination, expires_ms, job_id,
                                     f"SELECT * FROM {_quoted(table)} "
                                     f"FOR SYSTEM_TIME AS OF TIMESTAMP_MILLIS({int(snapshot_ms)})")

    def start_snapshot_query(self, query: str, snapshot_ms: int, destination: str,
                             expires_ms: int, job_id: str) -> bool:
        """TableSource.start_snapshot_query: CREATE TABLE ... AS the query, each table it reads
        rewritten to FOR SYSTEM_TIME AS OF the snapshot time (core.table_changes.query_as_of)."""
        from spotorch.core.table_changes import query_as_of

        return self._start_create_as(destination, expires_ms, job_id,
                                     query_as_of(query.strip().rstrip(";"), snapshot_ms))

    def _start_create_as(self, destination: str, expires_ms: int, job_id: str,
                         select: str) -> bool:
        """Start CREATE TABLE destination (expiring) AS select, unless the table exists."""
        from google.api_core import exceptions as gexc

        client = self.client()
        try:
            client.get_table(destination)
            return True  # taken before (the same decision carried out again)
        except gexc.NotFound:
            pass
        sql = (f"CREATE TABLE {_quoted(destination)} "
               f"OPTIONS(expiration_timestamp=TIMESTAMP_MILLIS({int(expires_ms)})) "
               f"AS {select}")
        _insert(job_id, lambda: client.query(sql, job_id=job_id, job_retry=None))  # a retry
        return False  # is ours, with a fresh id

    def start_extract(self, table: str, destination_uri: str, job_id: str) -> None:
        """TableSource.start_extract: an extract job named job_id, not waited for."""
        from google.cloud import bigquery

        config = bigquery.ExtractJobConfig(destination_format="PARQUET")
        _insert(job_id, lambda: self.client().extract_table(table, destination_uri,
                                                            job_id=job_id, job_config=config))
