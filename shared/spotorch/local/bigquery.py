"""The local stack's BigQuery: the bqemulator behind a small front that adds what it lacks.

bqemulator (PyPI; DuckDB and SQLGlot) runs in a venv of its own (the Makefile's BQEMULATOR_VENV:
it pins protobuf below what the Google clients use), with a HOME of the stack's own holding the
DuckDB spatial extension it would otherwise download at start. The real google-cloud-bigquery
client talks to the front exactly as to BigQuery; the front forwards every request unchanged
and adds two things the emulator does not do (docs/local-stack.md says what is emulated):

- Extracts to gs://: the emulator writes them to a local folder (BQEMU_GCS_LOCAL_ROOT), with a
  wildcard URI's '*' left in the file name. Before an extract job is forwarded, the front makes
  its folders; before a response that shows the job DONE reaches the client, it uploads the
  files to fake-gcs-server under the names BigQuery gives them ('*' as 000000000000), so the
  objects exist, with generations, when the client learns the job is done. An extract to a
  bucket that does not exist ends DONE with an errorResult (notFound), as on BigQuery; the
  emulator itself would write the files anyway.
- Audit entries: BigQuery writes Cloud Audit Logs entries when a job starts and ends; no
  emulator does. For each load, query or extract job the front sees end, it hands `on_job_done`
  the entries Eventarc would deliver (audit_entries): the jobInsertion start entry, the jobChange
  end entry and, for the table a load or DML job changed, a tableDataChange entry, in the real
  LogEntry shape (BigQueryAuditMetadata) and no richer. A job made by jobs.insert is logged
  under methodName ...JobService.InsertJob (jobInsertion.reason JOB_INSERT_REQUEST); one made by
  the jobs.query RPC (`query_and_wait`, `bq query`, the console, most DML) under
  ...JobService.Query (reason QUERY_REQUEST), as BigQuery does. jobs.query answers with a
  QueryResponse, not a job: when one says jobComplete, the front reads the job (jobs.get) to log
  it. The start entry is handed on with the others, when the job ends (BigQuery writes it
  when the job is inserted: nothing spotorch does reads it).
"""

from __future__ import annotations

import http.server
import json
import logging
import os
import re
import shutil
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from spotorch.core.table_changes import extract_bucket_missing
from spotorch.entrypoints.audit_entries import BIGQUERY_SERVICE, INSERT_JOB, METADATA_TYPE, QUERY_JOB
from spotorch.local.emulators import Emulator, EmulatorError, _spawn, free_port

log = logging.getLogger("spotorch.local.bigquery")

ENV_BQEMULATOR = "SPOTORCH_BQEMULATOR"  # the bqemulator executable (default: the Makefile's venv)
DUCKDB_VERSION = "v1.5.5"  # the pinned duckdb's extension folder
FIRST_SHARD = "000000000000"  # the name BigQuery gives a wildcard URI's first file

# The target of a DML statement: the job resource does not name it (only the query text does).
_DML_TARGET = re.compile(
    r"^\s*(?:INSERT(?:\s+INTO)?|UPDATE|DELETE(?:\s+FROM)?|MERGE(?:\s+INTO)?|TRUNCATE\s+TABLE)"
    r"\s+`?([A-Za-z0-9_.:-]+)`?", re.IGNORECASE)


# jobs.query (POST /bigquery/v2/projects/P/queries) and getQueryResults (GET .../queries/ID).
_QUERIES = re.compile(r"^/bigquery/v2/projects/[^/]+/queries(/[^/?]+)?(\?.*)?$")
# tables.get: /bigquery/v2/projects/P/datasets/D/tables/T (a query string aside).
_TABLE_GET = re.compile(r"^/bigquery/v2/projects/[^/]+/datasets/[^/]+/tables/[^/?]+(\?.*)?$")
# The media part's type in a multipart load (google-resumable-media writes `*/*`).
_MEDIA_ANY = re.compile(rb"(?i)content-type: \*/\*")


def bqemulator_binary() -> Path:
    """The bqemulator executable: $SPOTORCH_BQEMULATOR, else the Makefile's venv beside ours."""
    configured = os.environ.get(ENV_BQEMULATOR)
    path = Path(configured) if configured else Path(sys.prefix) / "bqemulator" / "bin" / "bqemulator"
    if not path.exists():
        raise EmulatorError(f"bqemulator not found at {path}: run `make venv` (it installs it in a "
                            f"venv of its own) or set {ENV_BQEMULATOR}")
    return path


def _emulator_home(binary: Path, home: Path) -> None:
    """A HOME with DuckDB's spatial extension where the emulator looks for it (offline)."""
    venv = binary.resolve().parent.parent
    found = sorted(venv.glob("lib/python*/site-packages/duckdb_extension_spatial/extensions/"
                             f"{DUCKDB_VERSION}/spatial.duckdb_extension"))
    if not found:
        raise EmulatorError(f"no DuckDB spatial extension {DUCKDB_VERSION} in {venv} "
                            "(pip install duckdb-extension-spatial==1.5.5 there)")
    target = home / ".duckdb" / "extensions" / DUCKDB_VERSION / "linux_amd64"
    target.mkdir(parents=True, exist_ok=True)
    shutil.copy2(found[0], target / "spatial.duckdb_extension")


def start_bigquery(log_dir: Path, project: str, gcs_root: Path,
                   port: int | None = None) -> Emulator:
    """Start bqemulator (REST on `port`, in memory) with its own HOME; extracts go to gcs_root."""
    binary = bqemulator_binary()
    home = log_dir / "bigquery-home"
    _emulator_home(binary, home)
    gcs_root.mkdir(parents=True, exist_ok=True)
    port = port or free_port()
    env = {**os.environ, "HOME": str(home), "BQEMU_GCS_LOCAL_ROOT": str(gcs_root)}
    argv = [str(binary), "start", "--rest-port", str(port), "--grpc-port", str(free_port()),
            "--project", project, "--ephemeral", "--log-level", "warning"]
    return _spawn("bigquery", argv, log_dir, port, f"/bigquery/v2/projects/{project}/datasets",
                  timeout=120.0, env=env)


# --- the audit entries BigQuery would write ------------------------------------------------------


def _time(ms: Any) -> str:
    when = datetime.fromtimestamp(float(ms or 0) / 1000, UTC)
    return when.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _table_resource(ref: Mapping[str, Any]) -> str:
    return f"projects/{ref['projectId']}/datasets/{ref['datasetId']}/tables/{ref['tableId']}"


def changed_table(job: Mapping[str, Any]) -> str | None:
    """projects/P/datasets/D/tables/T a load or DML job wrote; None for any other job."""
    config = job.get("configuration") or {}
    project = (job.get("jobReference") or {}).get("projectId", "")
    if "load" in config:
        return _table_resource(config["load"]["destinationTable"])
    query = config.get("query")
    statement = ((job.get("statistics") or {}).get("query") or {}).get("statementType", "")
    if not isinstance(query, Mapping) or statement not in ("INSERT", "UPDATE", "DELETE", "MERGE",
                                                           "TRUNCATE_TABLE"):
        return None
    found = _DML_TARGET.match(str(query.get("query") or ""))
    if found is None:
        return None
    parts = found.group(1).replace(":", ".").split(".")
    default = query.get("defaultDataset") or {}
    if len(parts) == 1 and default.get("datasetId"):
        parts = [default.get("projectId") or project, default["datasetId"], parts[0]]
    elif len(parts) == 2:
        parts = [project, *parts]
    if len(parts) != 3:
        return None
    return f"projects/{parts[0]}/datasets/{parts[1]}/tables/{parts[2]}"


def _job_config(job: Mapping[str, Any], table: str | None) -> dict[str, Any] | None:
    """The audit log's JobConfig of a job resource (BigQueryAuditMetadata.JobConfig: type and
    its one config); None for a job kind the front does not log (copy: the emulator has none)."""
    config = job.get("configuration") or {}
    stats = job.get("statistics") or {}
    if "load" in config:
        return {"type": "IMPORT", "loadConfig": {"destinationTable": table or _table_resource(
            config["load"]["destinationTable"])}}
    if isinstance(config.get("query"), Mapping):
        # No destinationTable: the emulator names an anonymous table even for DML, and which
        # statements real BigQuery's entry names one for is not known here (docs/local-stack.md).
        return {"type": "QUERY", "queryConfig": {
            "query": config["query"].get("query", ""),
            "statementType": stats.get("query", {}).get("statementType", "")}}
    if isinstance(config.get("extract"), Mapping):
        extract = config["extract"]
        source = extract.get("sourceTable") or {}
        out: dict[str, Any] = {"destinationUris": list(extract.get("destinationUris") or ())}
        if source.get("tableId"):
            out["sourceTable"] = _table_resource(source)
        return {"type": "EXPORT", "extractConfig": out}
    return None


def audit_entries(job: Mapping[str, Any], *, via_query: bool = False) -> list[dict[str, Any]]:
    """The LogEntry data of the entries BigQuery writes for a job that ended: the jobInsertion
    start entry, the jobChange end entry of every job (load, query, extract; failed ones with
    their error), and for a load or DML job that succeeded the tableDataChange entry of the
    table it changed. via_query: the job was made by the jobs.query RPC (methodName
    ...JobService.Query, reason QUERY_REQUEST), not by jobs.insert (...InsertJob)."""
    status = job.get("status") or {}
    if status.get("state") != "DONE":
        return []
    table = changed_table(job)
    job_config = _job_config(job, table)
    if job_config is None:
        return []
    ref = job.get("jobReference") or {}
    project, job_id = ref.get("projectId", ""), ref.get("jobId", "")
    job_name = f"projects/{project}/jobs/{job_id}"
    stats = job.get("statistics") or {}
    config = job.get("configuration") or {}
    load = "load" in config
    rows = (stats.get("load", {}).get("outputRows") if load
            else stats.get("query", {}).get("numDmlAffectedRows"))

    method = QUERY_JOB if via_query else INSERT_JOB

    def entry(resource: str, metadata: dict[str, Any], suffix: str) -> dict[str, Any]:
        return {"protoPayload": {
            "@type": "type.googleapis.com/google.cloud.audit.AuditLog",
            "status": {}, "serviceName": BIGQUERY_SERVICE, "methodName": method,
            "resourceName": resource, "metadata": {"@type": METADATA_TYPE, **metadata}},
            "insertId": f"{job_id}-{suffix}",
            "resource": {"type": "bigquery_project", "labels": {"project_id": project,
                                                                "location": ref.get("location",
                                                                                    "US")}},
            "timestamp": _time(stats.get("endTime")), "severity": "INFO",
            "logName": f"projects/{project}/logs/cloudaudit.googleapis.com%2Fdata_access",
            "operation": {"id": job_name, "producer": BIGQUERY_SERVICE,
                          **({"first": True} if suffix == "insert" else {"last": True})},
            "receiveTimestamp": _time(stats.get("endTime"))}

    # The start entry: what the job was when inserted (its state then is not known here).
    inserted = entry(job_name, {"jobInsertion": {"job": {
        "jobName": job_name, "jobConfig": job_config, "jobStatus": {"jobState": "RUNNING"},
        "jobStats": {"createTime": _time(stats.get("creationTime"))}},
        "reason": "QUERY_REQUEST" if via_query else "JOB_INSERT_REQUEST"}}, "insert")
    job_status: dict[str, Any] = {"jobState": "DONE"}
    error = status.get("errorResult")
    if error:
        # google.rpc.Status: the message only (which code BigQuery maps each reason to is not
        # known here: docs/local-stack.md)
        job_status["errorResult"] = {"message": str(error.get("message") or "")}
    done = entry(job_name, {"jobChange": {"before": "RUNNING", "after": "DONE", "job": {
        "jobName": job_name, "jobConfig": job_config, "jobStatus": job_status,
        "jobStats": {"createTime": _time(stats.get("creationTime")),
                     "startTime": _time(stats.get("startTime")),
                     "endTime": _time(stats.get("endTime"))}}}}, "done")
    if table is None or error:
        return [inserted, done]
    # TableDataChange.Reason: JOB (a job's destination: a load), QUERY (DML or DDL)
    change: dict[str, Any] = {"jobName": job_name, "reason": "JOB" if load else "QUERY"}
    if rows is not None:
        change["insertedRowsCount" if load or stats.get("query", {}).get("statementType")
               == "INSERT" else "deletedRowsCount"] = str(rows)
    return [inserted, done, entry(table, {"tableDataChange": change}, "change")]


# --- the front ------------------------------------------------------------------------------------

Uploader = Callable[[str, str, Path], None]  # (bucket, object name, local file)


def _end_after_commit(job: dict[str, Any]) -> bool:
    """BigQuery reports a job's endTime after its changes committed, so a snapshot AS OF a load
    or DML job's end holds its rows. The bqemulator truncates its end to the millisecond, which
    falls before its own commit about one time in four (measured: a row missing from a read AS
    OF its job's endTime 10 times in 40, never at the next millisecond): the front reports the
    next millisecond. Whether the answer changed."""
    stats = job.get("statistics")
    end = stats.get("endTime") if isinstance(stats, dict) else None
    if not isinstance(end, str) or not end.isdigit() or \
            (job.get("status") or {}).get("state") != "DONE":
        return False
    assert isinstance(stats, dict)
    stats["endTime"] = str(int(end) + 1)
    return True


@dataclass
class BigQueryFront:
    """An HTTP front of the emulator: extracts bridged into fake GCS, audit entries handed on."""

    emulator: str  # http://127.0.0.1:PORT of bqemulator
    gcs_root: Path  # its BQEMU_GCS_LOCAL_ROOT
    upload: Uploader
    on_job_done: Callable[[dict[str, Any]], None] = lambda entry: None
    bucket_exists: Callable[[str], bool] = lambda bucket: True  # in fake-gcs-server
    port: int = 0
    # job id -> the errorResult of an extract whose bucket does not exist
    _failed: dict[str, dict[str, str]] = field(default_factory=dict)
    _seen: set[str] = field(default_factory=set)
    # "project:job id" of the jobs the jobs.query RPC made (logged as ...JobService.Query)
    _queried: set[str] = field(default_factory=set)
    # table resource -> endTime (ms) of the last load or DML job the front saw end on it
    _changed: dict[str, int] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _server: http.server.ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        """Where clients reach BigQuery (api_endpoint)."""
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> BigQueryFront:
        """Serve on self.port (a free one when 0) in a daemon thread."""
        front = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                return

            def _forward(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                if self.command == "POST":
                    body = front._before(self.path, body)
                request = urllib.request.Request(
                    front.emulator + self.path, data=body if body else None, method=self.command,
                    headers={k: v for k, v in self.headers.items()
                             if k.lower() not in ("host", "content-length", "accept-encoding")})
                try:
                    with urllib.request.urlopen(request, timeout=300) as response:
                        status, headers, data = response.status, response.headers, response.read()
                except urllib.error.HTTPError as exc:
                    status, headers, data = exc.code, exc.headers, exc.read()
                if status == 200 and "/jobs" in self.path:
                    data = front._after(data)
                elif status == 200 and _QUERIES.match(self.path):
                    front._queried_job(data, made=self.command == "POST")
                elif status == 200 and self.command == "GET" and _TABLE_GET.match(self.path):
                    data = front._table(data)
                self.send_response(status)
                for key, value in headers.items():
                    if key.lower() not in ("transfer-encoding", "content-length", "connection",
                                           "content-encoding"):
                        self.send_header(key, value)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _forward

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self.port = self._server.server_address[1]
        threading.Thread(target=self._server.serve_forever, daemon=True,
                         name="bigquery-front").start()
        return self

    def stop(self) -> None:
        """Stop serving."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def _local(self, uri: str) -> Path:
        bucket, _, name = uri[len("gs://"):].partition("/")
        return self.gcs_root / bucket / name

    def _before(self, path: str, body: bytes) -> bytes:
        """The request as the emulator takes it: an extract job's folders made first; a load
        job's media part typed (the client sends `*/*`, which BigQuery takes and the emulator
        refuses)."""
        if path.startswith("/upload/"):
            return _MEDIA_ANY.sub(b"content-type: application/octet-stream", body, count=1)
        try:
            job = json.loads(body or b"{}")
        except ValueError:
            return body
        extract = (job.get("configuration") or {}).get("extract") if isinstance(job, dict) else None
        for uri in (extract or {}).get("destinationUris") or ():
            if isinstance(uri, str) and uri.startswith("gs://"):
                self._local(uri).parent.mkdir(parents=True, exist_ok=True)
                bucket = uri[len("gs://"):].partition("/")[0]
                job_id = (job.get("jobReference") or {}).get("jobId")
                if job_id and not self.bucket_exists(bucket):
                    reason, message = extract_bucket_missing(bucket)
                    with self._lock:
                        self._failed.setdefault(str(job_id), {"reason": reason,
                                                              "message": message})
        return body

    def _failing(self, job: dict[str, Any]) -> bool:
        """An extract whose bucket does not exist: shown DONE with its errorResult."""
        error = self._failed.get(str((job.get("jobReference") or {}).get("jobId")))
        if error is None:
            return False
        job["status"] = {"state": "DONE", "errorResult": dict(error), "errors": [dict(error)]}
        return True

    def _after(self, data: bytes) -> bytes:
        """A job response as BigQuery would answer (a failing extract's error); a job seen DONE
        for the first time: bridge its export, hand on its audit entries."""
        try:
            job = json.loads(data or b"{}")
        except ValueError:
            return data
        if isinstance(job, dict) and job.get("kind") == "bigquery#job" and \
                (_end_after_commit(job) | self._failing(job)):
            data = json.dumps(job).encode()
        self._done(job)
        return data

    def _queried_job(self, data: bytes, *, made: bool) -> None:
        """A jobs.query answer (made: the job it names was made by jobs.query) or a
        getQueryResults one (which `client.query(...).result()` also polls for a jobs.insert
        job): once the answer says jobComplete, a job jobs.query made is read (jobs.get) and
        logged as BigQuery logs it; a jobs.insert job is logged when a job response shows it."""
        try:
            answer = json.loads(data or b"{}")
            ref = answer["jobReference"]
            key = f"{ref['projectId']}:{ref['jobId']}"
        except (ValueError, KeyError, TypeError):
            return
        with self._lock:
            if made:
                self._queried.add(key)
            queried = key in self._queried
        if not queried or answer.get("jobComplete") is not True:
            return
        location = f"?location={ref['location']}" if ref.get("location") else ""
        url = f"{self.emulator}/bigquery/v2/projects/{ref['projectId']}/jobs/{ref['jobId']}"
        try:
            with urllib.request.urlopen(url + location, timeout=60) as response:
                job = json.loads(response.read())
                _end_after_commit(job)
                self._done(job)
        except (urllib.error.URLError, OSError, ValueError) as exc:  # the tick repairs
            log.warning("job %s of a jobs.query not read: %s", key, exc)

    def _done(self, job: Any) -> None:
        if not isinstance(job, dict) or job.get("kind") != "bigquery#job" or \
                (job.get("status") or {}).get("state") != "DONE":
            return
        key = str(job.get("id"))
        with self._lock:  # one bridge and one set of entries per job, however often it is read
            if key in self._seen:
                return
            self._seen.add(key)
            extract = (job.get("configuration") or {}).get("extract")
            if extract and not (job.get("status") or {}).get("errorResult"):
                for uri in extract.get("destinationUris") or ():
                    self._bridge(uri)
        table = changed_table(job)
        if table is not None and not (job.get("status") or {}).get("errorResult"):
            ended = int(float((job.get("statistics") or {}).get("endTime") or 0))
            with self._lock:
                self._changed[table] = max(self._changed.get(table, 0), ended)
        with self._lock:
            via_query = key in self._queried
        for entry in audit_entries(job, via_query=via_query):
            try:
                self.on_job_done(entry)
            except Exception as exc:  # an audit entry lost is what the tick repairs
                log.warning("audit entry of job %s not delivered: %s", key, exc)

    def _table(self, data: bytes) -> bytes:
        """tables.get as BigQuery answers it: the emulator never moves lastModifiedTime after
        creation and counts only streamed rows in numRows; the front sets the time of the last
        load or DML job it saw end on the table, and the rows a COUNT(*) finds."""
        try:
            table = json.loads(data)
            ref = table["tableReference"]
        except (ValueError, KeyError, TypeError):
            return data
        if table.get("type") not in (None, "TABLE"):
            return data
        resource = _table_resource(ref)
        ended = self._changed.get(resource)
        if ended is not None:
            table["lastModifiedTime"] = str(max(int(float(table.get("lastModifiedTime") or 0)),
                                                ended))
        rows = self._count(ref)
        if rows is not None:
            table["numRows"] = str(rows)
        return json.dumps(table).encode()

    def _count(self, ref: Mapping[str, Any]) -> int | None:
        query = {"query": f"SELECT COUNT(*) FROM `{ref['projectId']}.{ref['datasetId']}."
                          f"{ref['tableId']}`", "useLegacySql": False}
        request = urllib.request.Request(
            f"{self.emulator}/bigquery/v2/projects/{ref['projectId']}/queries",
            data=json.dumps(query).encode(), method="POST",
            headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=60) as response:
                answer = json.loads(response.read())
            return int(answer["rows"][0]["f"][0]["v"])
        except (urllib.error.URLError, OSError, ValueError, KeyError, IndexError, TypeError):
            return None

    def _bridge(self, uri: str) -> None:
        bucket, _, name = uri[len("gs://"):].partition("/")
        local = self._local(uri)
        # The emulator leaves '*' in the file name; the glob also finds numbered shards.
        files = sorted(local.parent.glob(local.name)) if "*" in name else [local]
        for path in files:
            if not path.is_file():
                continue
            relative = path.relative_to(self.gcs_root / bucket).as_posix()
            self.upload(bucket, relative.replace("*", FIRST_SHARD), path)
