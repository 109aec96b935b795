"""The table source port: BigQuery as much as a BigQuery trigger needs of it."""

from __future__ import annotations

from typing import Protocol

from spotorch.core.errors import SpotorchError
from spotorch.core.table_changes import JobInfo, TableInfo


class TableNotFound(SpotorchError):
    """No table of that name (or no access to it)."""


class TableSource(Protocol):
    """Reads tables and jobs, snapshots tables at a time and exports them to Cloud Storage."""

    def get_table(self, table: str) -> TableInfo:
        """tables.get of project.dataset.table; TableNotFound when it is not there."""
        ...

    def get_job(self, project: str, job_id: str, location: str | None = None) -> JobInfo | None:
        """jobs.get (location: the job's, needed outside the US and EU); None when there is no
        such job."""
        ...

    def snapshot(self, table: str, snapshot_ms: int, destination: str, expires_ms: int) -> None:
        """Create `destination` (project.dataset.table) holding `table` as it was at snapshot_ms
        (time travel), expiring at expires_ms; a destination that exists already is kept (the
        same decision taken again)."""
        ...

    def snapshot_query(self, query: str, snapshot_ms: int, destination: str,
                       expires_ms: int) -> None:
        """Create `destination` holding the result of `query` (a SELECT naming each table it
        reads `project.dataset.table`) with every table read as it was at snapshot_ms, expiring
        at expires_ms; a destination that exists already is kept."""
        ...

    def export_parquet(self, table: str, destination_uri: str, job_id: str) -> None:
        """An extract job of `table` to a gs:// wildcard URI as Parquet, waited for; the same
        job_id again waits for that job instead of starting another."""
        ...
