"""What serving will see: prediction latency of the final model on held-out rows, and its size.

    metrics = serving_metrics(lambda rows: model.predict(rows), x_test, model_bytes=len(blob))
    run.log_metrics(**metrics)     # they ride on the signed progress and completed reports

Latency is measured per request, on this machine (the trial's), after a warm-up: p50 and p95 at
batch size 1 (latency_p50_ms, latency_p95_ms) and at a configurable batch size
(latency_batch_p50_ms, latency_batch_p95_ms, per request of `batch_size` rows; the size is
reported as latency_batch_size). Standard library only.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, Protocol

BATCH_ENV = "LATENCY_BATCH_SIZE"  # the batched size, set in the pool's env (SPOTORCH_* is reserved)
DEFAULT_BATCH = 32
DEFAULT_WARMUP = 10
DEFAULT_REQUESTS = 100
# The metrics that time this machine rather than describe the model: a rerun reproduces every
# other metric exactly, these only within the machine's noise.
MEASURED = frozenset({"latency_p50_ms", "latency_p95_ms", "latency_batch_p50_ms",
                      "latency_batch_p95_ms"})


class Rows(Protocol):
    """Held-out rows: a list, or an array (numpy, a dataframe's values) sliced by row."""

    def __len__(self) -> int: ...

    def __getitem__(self, index: Any) -> Any: ...


def percentile(samples: Sequence[float], q: float) -> float:
    """The q-th percentile (0-100) by the nearest-rank method: a value that was measured."""
    if not samples:
        raise ValueError("no samples")
    if not 0 <= q <= 100:
        raise ValueError(f"percentile {q} is not between 0 and 100")
    ordered = sorted(samples)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


def _batches(rows: Rows, size: int, count: int) -> Iterable[Any]:
    """`count` requests of `size` rows each, going round the held-out rows."""
    n = len(rows)
    start = 0
    for _ in range(count):
        if start + size <= n:
            yield rows[start:start + size]
        else:
            yield [rows[(start + i) % n] for i in range(size)]
        start = (start + size) % n


def request_latencies(predict: Callable[[Any], Any], rows: Rows, *,
                      batch_size: int = 1, warmup: int = DEFAULT_WARMUP,
                      requests: int = DEFAULT_REQUESTS,
                      clock: Callable[[], float] = time.perf_counter) -> list[float]:
    """Milliseconds of each of `requests` predict calls of `batch_size` rows, after `warmup`
    calls that are not counted (caches, lazy initialisation, the first allocation)."""
    if not len(rows):
        raise ValueError("no held-out rows to measure latency on")
    if batch_size < 1 or requests < 1 or warmup < 0:
        raise ValueError("batch_size and requests must be at least 1, warmup at least 0")
    for batch in _batches(rows, batch_size, warmup):
        predict(batch)
    out = []
    for batch in _batches(rows, batch_size, requests):
        started = clock()
        predict(batch)
        out.append((clock() - started) * 1000.0)
    return out


def model_size_bytes(path: str | os.PathLike[str]) -> int:
    """Bytes of a model file, or of every file below a model folder."""
    p = Path(path)
    if p.is_file():
        return p.stat().st_size
    if p.is_dir():
        return sum(f.stat().st_size for f in p.rglob("*") if f.is_file())
    raise FileNotFoundError(f"no model at {p}")


def serving_metrics(predict: Callable[[Any], Any], rows: Rows, *,
                    batch_size: int | None = None, warmup: int = DEFAULT_WARMUP,
                    requests: int = DEFAULT_REQUESTS, model_bytes: int | None = None,
                    model_path: str | os.PathLike[str] | None = None,
                    clock: Callable[[], float] = time.perf_counter) -> dict[str, float]:
    """Latency p50/p95 per request at batch 1 and at `batch_size` (else $LATENCY_BATCH_SIZE,
    else 32), and the model's size in bytes (given, or read from model_path)."""
    if batch_size is None:
        batch_size = int(os.environ.get(BATCH_ENV) or DEFAULT_BATCH)
    single = request_latencies(predict, rows, batch_size=1, warmup=warmup, requests=requests,
                               clock=clock)
    batched = request_latencies(predict, rows, batch_size=batch_size, warmup=warmup,
                                requests=requests, clock=clock)
    metrics = {"latency_p50_ms": percentile(single, 50), "latency_p95_ms": percentile(single, 95),
               "latency_batch_p50_ms": percentile(batched, 50),
               "latency_batch_p95_ms": percentile(batched, 95),
               "latency_batch_size": float(batch_size)}
    if model_bytes is None and model_path is not None:
        model_bytes = model_size_bytes(model_path)
    if model_bytes is not None:
        metrics["model_size_bytes"] = float(model_bytes)
    return metrics
