"""The example's preprocess step: an Apache Beam pipeline that normalizes the CSV shards.

    python -m spotorch_example.preprocess --input gs://B/snapshot/ --output gs://B/out/KEY/
        [--inputs gs://.../inputs.json] [--num_shards 2] [--expected_features N]
        [Beam options: --runner DataflowRunner --project ... --region ...]

With --inputs (spotorch passes the run's inputs manifest when the run pinned its data) the
shards read are exactly the manifest's objects at their recorded generations
(spotorch_trainer.snapshot_objects), not what the --input folder holds now: a rerun after an
overwrite reads what its origin read.

Reads every *.csv under --input (a header line f0..fN,label, then rows), scales each feature to
zero mean and unit variance over the whole snapshot (one pass for the statistics, one to apply
them), and writes CSV shards with the same header under --output (part-0000i-of-0000n.csv), which
the trainer reads as its data; each row's shard and place are a function of its content, so the
same input gives the same bytes on every run. A row that does not parse fails the pipeline with
the row's ValueError: on Dataflow the job ends JOB_STATE_FAILED with that text, a user error for spotorch.

On Dataflow spotorch's launcher template runs this module (docs/preprocess.md); locally the
Dataflow emulator runs it with Beam's DirectRunner. Needs apache-beam[gcp]
(deploy/dataflow-launcher/requirements.txt; `make beam-venv`).
"""

from __future__ import annotations

import argparse
import math
import zlib
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

LABEL = "label"


def parse_row(line: str, width: int, expected: int | None = None) -> tuple[list[float], int]:
    """(features, label) of one CSV data line; ValueError naming the line when it is malformed
    or (expected) does not have the number of features the model takes."""
    fields = line.split(",")
    if len(fields) != width:
        raise ValueError(f"row has {len(fields)} fields, the header {width}: {line[:80]!r}")
    if expected is not None and len(fields) - 1 != expected:
        raise ValueError(f"row has {len(fields) - 1} features, the model takes {expected} "
                         f"(--expected_features): {line[:40]!r}...")
    try:
        return [float(v) for v in fields[:-1]], int(fields[-1])
    except ValueError as exc:
        raise ValueError(f"{exc} in row {line[:80]!r}") from None


class Moments:
    """Per-feature count, sum and sum of squares, combined across workers (a CombineFn)."""

    @staticmethod
    def create() -> tuple[int, list[float], list[float]]:
        """The empty accumulator."""
        return 0, [], []

    @staticmethod
    def add(acc: tuple[int, list[float], list[float]], row: Sequence[float]
            ) -> tuple[int, list[float], list[float]]:
        """One row added."""
        n, sums, squares = acc
        if not sums:
            sums, squares = [0.0] * len(row), [0.0] * len(row)
        return (n + 1, [s + v for s, v in zip(sums, row, strict=True)],
                [q + v * v for q, v in zip(squares, row, strict=True)])

    @staticmethod
    def merge(accs: Iterable[tuple[int, list[float], list[float]]]
              ) -> tuple[int, list[float], list[float]]:
        """Accumulators of several bundles, combined."""
        total: tuple[int, list[float], list[float]] = (0, [], [])
        for n, sums, squares in accs:
            if not sums:
                continue
            if not total[1]:
                total = (n, list(sums), list(squares))
                continue
            total = (total[0] + n, [a + b for a, b in zip(total[1], sums, strict=True)],
                     [a + b for a, b in zip(total[2], squares, strict=True)])
        return total

    @staticmethod
    def extract(acc: tuple[int, list[float], list[float]]) -> list[tuple[float, float]]:
        """(mean, standard deviation) per feature; a constant feature keeps its scale (1)."""
        n, sums, squares = acc
        out = []
        for s, q in zip(sums, squares, strict=True):
            mean = s / n
            var = max(q / n - mean * mean, 0.0)
            out.append((mean, math.sqrt(var) if var > 1e-12 else 1.0))
        return out


def normalize(row: tuple[list[float], int], stats: Sequence[tuple[float, float]]) -> str:
    """One output line: each feature scaled by the snapshot's statistics, then the label."""
    features, label = row
    scaled = [(v - m) / s for v, (m, s) in zip(features, stats, strict=True)]
    return ",".join(f"{v:.6f}" for v in scaled) + f",{label}"


def _data_lines(path_and_line: Any) -> Iterator[str]:
    """A line of a shard unless it is the header (every shard has one)."""
    _, line = path_and_line
    if line and not line.startswith("f0,"):
        yield line


def _pinned_lines(obj: Any) -> Iterator[tuple[str, str]]:
    """(uri, line) of every line of one pinned object, read at its recorded generation."""
    for line in obj.read().decode().splitlines():
        yield obj.uri, line


def run(argv: Sequence[str] | None = None) -> None:
    """Build and run the pipeline; the rest of argv are Beam's own options."""
    import apache_beam as beam
    from apache_beam.io import ReadFromTextWithFilename
    from apache_beam.io.filesystems import FileSystems
    from apache_beam.options.pipeline_options import PipelineOptions

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--input", required=True)
    parser.add_argument("--output", required=True)
    parser.add_argument("--inputs", default=None,
                        help="the run's inputs manifest: read its objects at their generations")
    parser.add_argument("--num_shards", type=int, default=2)
    parser.add_argument("--expected_features", type=int, default=None,
                        help="fail on rows with another number of features")
    known, beam_args = parser.parse_known_args(argv)
    pattern = known.input.rstrip("/") + "/*.csv"
    pinned: list[Any] = []
    if known.inputs:
        from spotorch_trainer import snapshot_objects

        pinned = [o for o in snapshot_objects(known.inputs) if o.name.endswith(".csv")]
        if not pinned:
            raise SystemExit(f"no .csv objects in the inputs manifest {known.inputs}")
        first_name, header = pinned[0].uri, pinned[0].read().decode().split("\n", 1)[0].strip()
    else:
        matched = FileSystems.match([pattern])[0].metadata_list
        if not matched:
            raise SystemExit(f"no .csv files under {known.input}")
        first_name = sorted(m.path for m in matched)[0]
        with FileSystems.open(first_name) as first:
            header = first.readline().decode().strip()
    width = len(header.split(","))
    if not header.endswith("," + LABEL):
        raise SystemExit(f"{first_name}: the header must end with ,{LABEL}: {header!r}")
    with beam.Pipeline(options=PipelineOptions(beam_args)) as pipeline:
        lines = (pipeline | "Pinned shards" >> beam.Create(pinned)
                 | "Read at generation" >> beam.FlatMap(_pinned_lines)) if pinned else \
            (pipeline | "Read shards" >> ReadFromTextWithFilename(pattern))
        rows = (lines
                | "Drop headers" >> beam.FlatMap(_data_lines)
                | "Parse rows" >> beam.Map(parse_row, width, known.expected_features))
        stats = (rows
                 | "Features" >> beam.Map(lambda r: r[0])
                 | "Moments" >> beam.CombineGlobally(_moments_fn()))
        keyed = (rows
                 | "Normalize" >> beam.Map(normalize, beam.pvalue.AsSingleton(stats))
                 | "Shard" >> beam.Map(lambda line: (shard_of(line, known.num_shards), line)))
        # Every shard index once, so that a shard no row hashes to is still written (empty).
        every = pipeline | "Every shard" >> beam.Create([(i, None) for i in
                                                         range(known.num_shards)])
        _ = ((keyed, every) | "Shards" >> beam.Flatten() | "By shard" >> beam.GroupByKey()
             | "Write shards" >> beam.Map(_write_shard, known.output, known.num_shards, header))


def shard_of(line: str, shards: int) -> int:
    """The shard of an output line: a function of its content, so that the same input gives
    the same files byte for byte on every run (Beam's own sharding and order are not stable,
    and a rerun that rebuilds the output must train on the same bytes)."""
    return zlib.crc32(line.encode()) % shards


def shard_lines(lines: Iterable[str | None]) -> list[str]:
    """A shard's lines in a stable order that is not the features' (a content hash)."""
    return sorted((x for x in lines if x is not None), key=lambda x: (zlib.crc32(x.encode()), x))


def _write_shard(keyed: tuple[int, Iterable[str | None]], output: str, shards: int,
                 header: str) -> str:
    from apache_beam.io.filesystems import FileSystems

    index, lines = keyed
    path = f"{output.rstrip('/')}/part-{index:05d}-of-{shards:05d}.csv"
    with FileSystems.create(path) as out:
        out.write(("\n".join([header, *shard_lines(lines)]) + "\n").encode())
    return path


def _moments_fn() -> Any:
    import apache_beam as beam

    class MomentsFn(beam.CombineFn):  # type: ignore[misc]
        def create_accumulator(self) -> Any:
            return Moments.create()

        def add_input(self, acc: Any, row: Any) -> Any:
            return Moments.add(acc, row)

        def merge_accumulators(self, accs: Any) -> Any:
            return Moments.merge(accs)

        def extract_output(self, acc: Any) -> Any:
            return Moments.extract(acc)

    return MomentsFn()


if __name__ == "__main__":
    run()
