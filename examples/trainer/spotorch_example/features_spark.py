"""The example's Spark preprocess step (issue 42): the Beam step's transform, in PySpark.

    spotorch's PySpark driver runs it as __main__ with
        --input gs://B/snapshot/ --output gs://B/out/KEY/ [--inputs gs://.../inputs.json]
        [--num_shards=2] [--expected_features=N]

Reads every *.csv under --input (or, with --inputs, exactly the manifest's objects at their
recorded generations: spotorch_trainer.snapshot_objects), scales each feature to zero mean and
unit variance over the whole snapshot with Spark (the rows parsed and their moments summed on
the executors), and writes CSV shards with the same header under --output, each row's shard and
place a function of its content (the Beam step's rules: spotorch_example.preprocess), so the same
input gives the same bytes. The objects are read and written with the Cloud Storage client on
the driver: it runs alike on Dataproc Serverless and on the local Dataproc, whose Spark has no
Cloud Storage connector (the example's data is small; a large snapshot would read gs:// paths
with spark.read on Dataproc). A row that does not parse raises its ValueError on an executor;
the driver's exception fails the batch, a user error for spotorch.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from spotorch_example.preprocess import Moments, normalize, parse_row, shard_lines, shard_of


def read_shards(input_uri: str, inputs: str | None) -> list[tuple[str, bytes]]:
    """(name, bytes) of the snapshot's CSV shards, by name."""
    from spotorch_trainer.storage import join, list_files, read_bytes

    if inputs:
        from spotorch_trainer import snapshot_objects

        return [(o.name, o.read()) for o in snapshot_objects(inputs) if o.name.endswith(".csv")]
    return [(n, read_bytes(join(input_uri, n))) for n in list_files(input_uri)
            if n.endswith(".csv")]


def main(argv: Sequence[str] | None = None) -> None:
    """Normalize the snapshot's shards with Spark; write the output shards."""
    from pyspark.sql import SparkSession

    from spotorch_trainer.storage import join, write_bytes

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--input", required=True)
    parser.add_argument("--output", required=True)
    parser.add_argument("--inputs", default=None)
    parser.add_argument("--num_shards", type=int, default=2)
    parser.add_argument("--expected_features", type=int, default=None)
    args = parser.parse_args(argv)
    shards = read_shards(args.input, args.inputs)
    if not shards:
        raise SystemExit(f"no .csv files under {args.input}")
    header = shards[0][1].decode().split("\n", 1)[0].strip()
    width, expected = len(header.split(",")), args.expected_features
    lines = [line for _, data in shards for line in data.decode().splitlines()
             if line and not line.startswith("f0,")]
    spark = SparkSession.builder.getOrCreate()
    rows = spark.sparkContext.parallelize(lines, max(2, args.num_shards)) \
        .map(lambda line: parse_row(line, width, expected)).cache()
    acc = rows.map(lambda r: r[0]).aggregate(
        Moments.create(), Moments.add, lambda a, b: Moments.merge([a, b]))
    stats = Moments.extract(acc)
    shards_n = args.num_shards
    keyed = rows.map(lambda r: normalize(r, stats)) \
        .map(lambda line: (shard_of(line, shards_n), line)).groupByKey() \
        .mapValues(list).collectAsMap()
    for index in range(shards_n):
        body = "\n".join([header, *shard_lines(keyed.get(index, []))]) + "\n"
        write_bytes(join(args.output, f"part-{index:05d}-of-{shards_n:05d}.csv"), body.encode())


if __name__ == "__main__":
    main()
