"""Parquet snapshots (a BigQuery trigger's export) read as one table, sharded per replica.

pyarrow is imported on first use: a trainer that reads CSV never needs it.
"""

from __future__ import annotations

import io
from typing import Any

from spotorch_trainer.cluster import shard_range
from spotorch_trainer.storage import join, list_files, read_bytes

PARQUET_SUFFIX = ".parquet"


def parquet_files(uri: str) -> list[str]:
    """Relative names of every Parquet file under a snapshot (gs:// prefix or directory), sorted:
    the order every replica agrees on."""
    return [n for n in list_files(uri) if n.endswith(PARQUET_SUFFIX)]


def read_parquet(uri: str, *, rank: int = 0, world_size: int = 1,
                 columns: list[str] | None = None) -> Any:
    """The rows of every Parquet file under uri, in file order, as one pyarrow.Table; with a
    world of several replicas, only this rank's contiguous share of the rows (shard_range), so
    the replicas together read each row once. FileNotFoundError when there is no Parquet file."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    names = parquet_files(uri)
    if not names:
        raise FileNotFoundError(f"no {PARQUET_SUFFIX} files under {uri}")
    tables = [pq.read_table(io.BytesIO(read_bytes(join(uri, name))), columns=columns)
              for name in names]
    whole = pa.concat_tables(tables, promote_options="default") if len(tables) > 1 else tables[0]
    share = shard_range(whole.num_rows, rank, world_size)
    return whole.slice(share.start, share.stop - share.start)
