"""spotorch_trainer.read_parquet: a snapshot's Parquet files as one table, sharded per replica."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from spotorch_trainer import parquet_files, read_parquet


def write(folder: Path, name: str, xs: list[int]) -> None:
    path = folder / name
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({"x": xs, "label": [v % 2 for v in xs]}), path)


def test_every_file_in_name_order_and_nothing_else(tmp_path: Path) -> None:
    write(tmp_path, "rows/part-000000000001.parquet", [3, 4])
    write(tmp_path, "rows/part-000000000000.parquet", [0, 1, 2])
    (tmp_path / "_SUCCESS").write_text("")
    assert parquet_files(str(tmp_path)) == ["rows/part-000000000000.parquet",
                                            "rows/part-000000000001.parquet"]
    table = read_parquet(str(tmp_path))
    assert table.column("x").to_pylist() == [0, 1, 2, 3, 4]
    assert read_parquet(str(tmp_path), columns=["label"]).column_names == ["label"]


def test_the_replicas_together_read_each_row_once(tmp_path: Path) -> None:
    write(tmp_path, "a.parquet", list(range(7)))
    write(tmp_path, "b.parquet", list(range(7, 10)))
    shares = [read_parquet(str(tmp_path), rank=r, world_size=3).column("x").to_pylist()
              for r in range(3)]
    assert shares == [[0, 1, 2, 3], [4, 5, 6], [7, 8, 9]]


def test_a_snapshot_without_parquet_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "part-0.csv").write_text("x,label\n1,0\n")
    with pytest.raises(FileNotFoundError, match=r"no \.parquet files"):
        read_parquet(str(tmp_path))
