"""Write a small synthetic classification data set as CSV shards (a local dir or a gs:// prefix).

    python examples/make_data.py OUT [--rows 3000] [--features 16] [--classes 3] [--shards 3]
                                     [--seed 0] [--spread 0.8]

Each class is a mixture of two Gaussian clusters, so a linear model falls short and a small MLP
does better. The same arguments always give byte-identical files.
"""

from __future__ import annotations

import argparse
import io
import sys
from pathlib import Path

import numpy as np

_TRAINER = Path(__file__).resolve().parent.parent / "trainer"
if (_TRAINER / "spotorch_trainer" / "__init__.py").is_file() and str(_TRAINER) not in sys.path:
    sys.path.insert(0, str(_TRAINER))  # a source checkout: use the helper next to this file

from spotorch_trainer.storage import join, write_bytes  # noqa: E402

LABEL = "label"
CLUSTERS_PER_CLASS = 2


def make_dataset(rows: int, features: int, classes: int, seed: int,
                 spread: float = 0.8) -> tuple[np.ndarray, np.ndarray]:
    """Features (rows x features, float) and labels (rows, int) drawn from a seeded mixture."""
    rng = np.random.default_rng(seed)
    centers = rng.normal(0.0, spread, size=(classes * CLUSTERS_PER_CLASS, features))
    cluster = rng.integers(0, classes * CLUSTERS_PER_CLASS, size=rows)
    x = centers[cluster] + rng.normal(0.0, 1.0, size=(rows, features))
    y = cluster % classes
    return x, y


def to_csv(x: np.ndarray, y: np.ndarray) -> bytes:
    """One CSV shard with a header line: f0..fN, label."""
    out = io.StringIO()
    out.write(",".join([*(f"f{i}" for i in range(x.shape[1])), LABEL]) + "\n")
    for row, label in zip(x, y, strict=True):
        out.write(",".join(f"{v:.6f}" for v in row) + f",{int(label)}\n")
    return out.getvalue().encode()


def write_shards(out: str, x: np.ndarray, y: np.ndarray, shards: int) -> list[str]:
    """Split rows into shards and write part-0000i-of-0000n.csv under out; return their URIs."""
    uris = []
    for i, (xs, ys) in enumerate(zip(np.array_split(x, shards), np.array_split(y, shards),
                                     strict=True)):
        uri = join(out, f"part-{i:05d}-of-{shards:05d}.csv")
        write_bytes(uri, to_csv(xs, ys))
        uris.append(uri)
    return uris


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", help="directory or gs://bucket/prefix to write the shards to")
    parser.add_argument("--rows", type=int, default=3000)
    parser.add_argument("--features", type=int, default=16)
    parser.add_argument("--classes", type=int, default=3)
    parser.add_argument("--shards", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--spread", type=float, default=0.8,
                        help="std of the cluster centres; smaller is harder")
    args = parser.parse_args(argv)
    x, y = make_dataset(args.rows, args.features, args.classes, args.seed, args.spread)
    for uri in write_shards(args.out, x, y, args.shards):
        print(uri)
    return 0


if __name__ == "__main__":
    sys.exit(main())
