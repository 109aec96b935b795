"""BigQuery audit entries decoded at the edge: the change a job's entry names, as a TableChange.

Eventarc delivers `google.cloud.audit.log.v1.written` for serviceName bigquery.googleapis.com and
methodName google.cloud.bigquery.v2.JobService.InsertJob (jobs made by jobs.insert) or
google.cloud.bigquery.v2.JobService.Query (jobs made by the jobs.query RPC: the console, `bq
query`, `query_and_wait`, most DML; jobInsertion.reason QUERY_REQUEST); its data is a LogEntry whose
protoPayload is an AuditLog with `metadata` a BigQueryAuditMetadata. That metadata holds one of
jobInsertion, jobChange, tableDataChange (a oneof): a job writes a start entry and an end entry,
and a load or DML job may write a tableDataChange entry too. Only the end (jobChange.after DONE)
and tableDataChange entries name a change; every other entry is acknowledged and skipped. Bad
input raises InvalidEvent naming the field. Nothing here does I/O.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from spotorch.core.errors import InvalidEvent
from spotorch.core.table_changes import TableChange

AUDIT_LOG_TYPE = "google.cloud.audit.log.v1.written"
BIGQUERY_SERVICE = "bigquery.googleapis.com"
INSERT_JOB = "google.cloud.bigquery.v2.JobService.InsertJob"
QUERY_JOB = "google.cloud.bigquery.v2.JobService.Query"  # a job the jobs.query RPC made
JOB_METHODS = (INSERT_JOB, QUERY_JOB)  # deploy/bigquery.tf has one trigger filter for each
METADATA_TYPE = "type.googleapis.com/google.cloud.audit.BigQueryAuditMetadata"

# projects/P/datasets/D/tables/T, the audit log's form of a table.
_TABLE_RESOURCE = re.compile(r"^projects/([^/]+)/datasets/([^/]+)/tables/([^/@$]+)$")
_JOB_RESOURCE = re.compile(r"^projects/([^/]+)/jobs/([^/]+)$")


def table_id(resource: str) -> str | None:
    """project.dataset.table of projects/P/datasets/D/tables/T; None for anything else."""
    found = _TABLE_RESOURCE.match(resource)
    return None if found is None else ".".join(found.groups())


def _mapping(node: Any, where: str) -> Mapping[str, Any]:
    if not isinstance(node, Mapping):
        raise InvalidEvent(f"{where}: missing (expected a JSON object)")
    return node


def _count(value: Any, where: str) -> int | None:
    """int64 counts arrive as decimal strings in the JSON form of a proto."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise InvalidEvent(f"{where}: not an integer: {value!r}")
    try:
        number = int(value)
    except ValueError:
        raise InvalidEvent(f"{where}: not an integer: {value!r}") from None
    if number < 0:
        raise InvalidEvent(f"{where}: negative: {value!r}")
    return number


def _job(job_name: Any, where: str) -> tuple[str, str]:
    found = _JOB_RESOURCE.match(job_name) if isinstance(job_name, str) else None
    if found is None:
        raise InvalidEvent(f"{where}: not a job name projects/P/jobs/ID: {job_name!r}")
    return found.group(1), found.group(2)


def _destinations(config: Mapping[str, Any]) -> tuple[str, ...]:
    """The destination tables a JobConfig names (load, query, copy), as project.dataset.table."""
    out: list[str] = []
    for section in ("loadConfig", "queryConfig", "tableCopyConfig"):
        part = config.get(section)
        if isinstance(part, Mapping) and isinstance(part.get("destinationTable"), str):
            table = table_id(part["destinationTable"])
            if table is not None:
                out.append(table)
    return tuple(out)


def _location(data: Mapping[str, Any]) -> str | None:
    resource = data.get("resource")
    labels = resource.get("labels") if isinstance(resource, Mapping) else None
    location = labels.get("location") if isinstance(labels, Mapping) else None
    return location if isinstance(location, str) and location else None


def _parse(event_id: str, data: Mapping[str, Any]) -> TableChange | None:
    change = _parse_payload(event_id, data)
    return None if change is None else replace(change, location=_location(data))


def _parse_payload(event_id: str, data: Mapping[str, Any]) -> TableChange | None:
    payload = _mapping(data.get("protoPayload"), "data.protoPayload")
    if payload.get("serviceName") != BIGQUERY_SERVICE:
        raise InvalidEvent(f"data.protoPayload.serviceName: not {BIGQUERY_SERVICE}: "
                           f"{payload.get('serviceName')!r}")
    if payload.get("methodName") not in JOB_METHODS:
        raise InvalidEvent(f"data.protoPayload.methodName: not {' or '.join(JOB_METHODS)}: "
                           f"{payload.get('methodName')!r}")
    metadata = _mapping(payload.get("metadata"), "data.protoPayload.metadata")
    if metadata.get("@type") not in (None, METADATA_TYPE):
        raise InvalidEvent(f"data.protoPayload.metadata.@type: not BigQueryAuditMetadata: "
                           f"{metadata.get('@type')!r}")
    change = metadata.get("tableDataChange")
    if change is not None:
        change = _mapping(change, "data.protoPayload.metadata.tableDataChange")
        where = "data.protoPayload.metadata.tableDataChange"
        table = table_id(str(payload.get("resourceName") or ""))
        if table is None:
            raise InvalidEvent(f"data.protoPayload.resourceName: not a table: "
                               f"{payload.get('resourceName')!r}")
        project, job_id = _job(change.get("jobName"), f"{where}.jobName")
        return TableChange(event_id, project, job_id, (table,), "table_data_change",
                           inserted_rows=_count(change.get("insertedRowsCount"),
                                                f"{where}.insertedRowsCount"),
                           deleted_rows=_count(change.get("deletedRowsCount"),
                                               f"{where}.deletedRowsCount"),
                           truncated=change.get("truncated") is True)
    job_change = metadata.get("jobChange")
    if job_change is None:
        return None  # jobInsertion (the start entry) or another kind: nothing changed yet
    where = "data.protoPayload.metadata.jobChange"
    job_change = _mapping(job_change, where)
    if job_change.get("after") != "DONE":
        return None
    entry = _mapping(job_change.get("job"), f"{where}.job")
    status = entry.get("jobStatus")
    if isinstance(status, Mapping) and status.get("errorResult"):
        return None  # a failed job changed nothing
    project, job_id = _job(entry.get("jobName"), f"{where}.job.jobName")
    config = entry.get("jobConfig")
    tables = _destinations(config) if isinstance(config, Mapping) else ()
    if not tables:
        return None  # no destination named (a plain SELECT, an extract): no table changed
    return TableChange(event_id, project, job_id, tables, "job_done")


def parse_audit_event(event_type: str, event_id: str, data: Any) -> TableChange | None:
    """A BigQuery InsertJob or Query audit CloudEvent: the change it names, or None when it names
    none (a job's start entry, a failed job, a query without a destination). InvalidEvent for
    anything that is not such an entry (wrong type, service or method, malformed fields)."""
    try:
        if event_type != AUDIT_LOG_TYPE:
            raise InvalidEvent(f"type: not {AUDIT_LOG_TYPE}: {event_type!r}")
        if not isinstance(event_id, str) or not event_id:
            raise InvalidEvent("id: missing (needed to recognise a redelivered event)")
        if isinstance(data, bytes | str):
            try:
                data = json.loads(data)
            except ValueError:
                raise InvalidEvent("data: not JSON") from None
        return _parse(event_id, _mapping(data, "data"))
    except InvalidEvent as exc:
        raise InvalidEvent(exc.reason, event_id=str(event_id or ""),
                           event_type=str(event_type or "")) from None


# The id of a job finish_snapshot starts (job_id below): its snapshot id is in it.
_OWN_JOB = re.compile(r"^spotorch-(?:snapshot|export)-([0-9a-f]{8,32})-[A-Za-z0-9_-]+$")


def own_job_snapshot(data: Any) -> str | None:
    """The snapshot id of a jobChange end entry (DONE, failed or not) about one of the jobs
    finish_snapshot starts, else None. Only a hint that a snapshot may move on: finish_snapshot
    reads the job itself (jobs.get) before anything changes. Call it after parse_audit_event
    accepted the entry (this assumes its shape)."""
    if isinstance(data, bytes | str):
        try:
            data = json.loads(data)
        except ValueError:
            return None
    payload = data.get("protoPayload") if isinstance(data, Mapping) else None
    metadata = payload.get("metadata") if isinstance(payload, Mapping) else None
    change = metadata.get("jobChange") if isinstance(metadata, Mapping) else None
    if not isinstance(change, Mapping) or change.get("after") != "DONE":
        return None
    job = change.get("job")
    name = job.get("jobName") if isinstance(job, Mapping) else None
    found = _JOB_RESOURCE.match(name) if isinstance(name, str) else None
    own = _OWN_JOB.match(found.group(2)) if found else None
    return own.group(1) if own else None
