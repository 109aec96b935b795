"""The table source port: BigQuery as much as a BigQuery trigger needs of it."""

from __future__ import annotations

from typing import Protocol

from spotorch.core.errors import SpotorchError
from spotorch.core.table_changes import JobInfo, TableInfo


class TableNotFound(SpotorchError):
    """No table of that name (or no access to it)."""


class JobRefused(SpotorchError):
    """BigQuery refused to start a job (a 4xx answer to jobs.insert other than "that id exists":
    a bad query, no such table, no access): the attempt failed, as a job that ended in error."""

    def __init__(self, job_id: str, reason: str, message: str) -> None:
        super().__init__(f"BigQuery refused job {job_id}: {reason}: {message}")
        self.job_id, self.reason, self.message = job_id, reason, message


class TableSource(Protocol):
    """Reads tables and jobs, snapshots tables at a time and exports them to Cloud Storage."""

    def get_table(self, table: str) -> TableInfo:
        """tables.get of project.dataset.table; TableNotFound when it is not there."""
        ...

    def get_job(self, project: str, job_id: str, location: str | None = None) -> JobInfo | None:
        """jobs.get (location: the job's, needed outside the US and EU); None when there is no
        such job."""
        ...

    def own_job(self, job_id: str, dataset: str | None = None) -> JobInfo | None:
        """jobs.get of a job this source started (its project, and the location of `dataset`,
        the snapshot dataset it reads or writes); None when there is no such job yet."""
        ...

    def start_snapshot(self, table: str, snapshot_ms: int, destination: str, expires_ms: int,
                       job_id: str) -> bool:
        """Start the job (id job_id) that creates `destination` (project.dataset.table) holding
        `table` as it was at snapshot_ms (time travel), expiring at expires_ms; returns at once
        (own_job follows it). A job of that id started before is left as it is. True when the
        destination exists already (the same decision carried out before): no job started.
        JobRefused when BigQuery refuses the job itself."""
        ...

    def start_snapshot_query(self, query: str, snapshot_ms: int, destination: str,
                             expires_ms: int, job_id: str) -> bool:
        """start_snapshot of the result of `query` (a SELECT naming each table it reads
        `project.dataset.table`) with every table read as it was at snapshot_ms."""
        ...

    def start_extract(self, table: str, destination_uri: str, job_id: str) -> None:
        """Start the extract job (id job_id) of `table` to a gs:// wildcard URI as Parquet;
        returns at once (own_job follows it); a job of that id started before is left as it is.
        JobRefused when BigQuery refuses the job itself."""
        ...
