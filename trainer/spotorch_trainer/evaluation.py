"""Held-out evaluation of the final model (issue 37): which data, and how to report what it scored.

spotorch names a pipeline's evaluation data (`model.evaluation`) in the attempt's environment:

- SPOTORCH_EVAL_DATA_URI: a fixed folder of held-out data (the same for every run); read it as
  you read SPOTORCH_DATA_URI and never train on it;
- SPOTORCH_EVAL_SPLIT: JSON {"key": column, "percent": N, "salt": S}: hold out the rows of the
  run's own data whose key `is_held_out` (a stable hash: the same row always on the same side).

After training, evaluate the final model on that data and call `report_evaluation(run, metrics,
latency_p95_ms=...)`: the metrics ride, as `eval_<name>`, on the signed completed report, and
spotorch's promotion gate (`model.promote`) compares them with the champion's. `p95_ms` measures
a prediction function's latency the way the gate reads it.

Standard library only.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

ENV_EVAL_DATA_URI = "SPOTORCH_EVAL_DATA_URI"
ENV_EVAL_SPLIT = "SPOTORCH_EVAL_SPLIT"
EVAL_PREFIX = "eval_"  # spotorch.core.promotion.EVAL_PREFIX
LATENCY_METRIC = "latency_p95_ms"
BUCKETS = 100


class EvaluationError(ValueError):
    """The evaluation settings in the environment cannot be used."""


@dataclass(frozen=True)
class HeldOut:
    """The run's held-out data: a folder, or a split of its own rows by a key's hash."""

    data_uri: str | None = None
    key: str | None = None
    percent: int = 0
    salt: str = "spotorch"

    def is_held_out(self, value: Any) -> bool:
        """Whether a row whose key is `value` is held out (split only; False for a folder)."""
        if self.key is None:
            return False
        return bucket_of(value, self.salt) < self.percent

    def split(self, rows: Sequence[Mapping[str, Any]]) -> tuple[list[Mapping[str, Any]],
                                                                  list[Mapping[str, Any]]]:
        """(training rows, held-out rows) of rows keyed by the split's column."""
        if self.key is None:
            raise EvaluationError("no split configured (SPOTORCH_EVAL_SPLIT is not set)")
        train: list[Mapping[str, Any]] = []
        held: list[Mapping[str, Any]] = []
        for row in rows:
            if self.key not in row:
                raise EvaluationError(f"a row has no {self.key!r} column to split on")
            (held if self.is_held_out(row[self.key]) else train).append(row)
        return train, held


def bucket_of(value: Any, salt: str = "spotorch") -> int:
    """The stable bucket (0-99) of a key's value: sha256 of the salt and the value's text."""
    digest = hashlib.sha256(f"{salt}\x00{value}".encode()).digest()
    return int.from_bytes(digest[:8], "big") % BUCKETS


def held_out(environ: Mapping[str, str] | None = None) -> HeldOut | None:
    """The held-out data spotorch named for this attempt; None when the pipeline names none."""
    env = os.environ if environ is None else environ
    uri = env.get(ENV_EVAL_DATA_URI, "").strip()
    if uri:
        return HeldOut(data_uri=uri)
    raw = env.get(ENV_EVAL_SPLIT, "").strip()
    if not raw:
        return None
    try:
        spec = json.loads(raw)
        key, percent = str(spec["key"]), int(spec["percent"])
    except (ValueError, KeyError, TypeError) as exc:
        raise EvaluationError(f"{ENV_EVAL_SPLIT} is not {{\"key\", \"percent\"}} JSON: {exc}") \
            from exc
    if not 0 < percent < BUCKETS:
        raise EvaluationError(f"{ENV_EVAL_SPLIT}: percent must be 1-99, got {percent}")
    return HeldOut(key=key, percent=percent, salt=str(spec.get("salt") or "spotorch"))


def p95_ms(predict: Callable[[Any], object], instances: Sequence[Any], *, repeats: int = 20,
           clock: Callable[[], float] = time.perf_counter) -> float:
    """The 95th percentile, in milliseconds, of `predict(instance)` over the instances (cycled
    to at least `repeats` calls): a prediction's latency as the gate reads it."""
    if not instances:
        raise EvaluationError("no instances to time")
    times: list[float] = []
    for i in range(max(repeats, len(instances))):
        start = clock()
        predict(instances[i % len(instances)])
        times.append((clock() - start) * 1000.0)
    times.sort()
    return times[min(len(times) - 1, math.ceil(0.95 * len(times)) - 1)]


class _Reports(Protocol):
    def log_metrics(self, **metrics: float) -> None: ...


def report_evaluation(run: _Reports, metrics: Mapping[str, float], *,
                      latency_p95_ms: float | None = None) -> dict[str, float]:
    """Log the final model's held-out metrics as eval_<name> (and its p95 latency): they ride on
    the next signed report and the completed one. Returns what was logged."""
    logged = {f"{EVAL_PREFIX}{k}": float(v) for k, v in metrics.items()}
    if latency_p95_ms is not None:
        logged[f"{EVAL_PREFIX}{LATENCY_METRIC}"] = float(latency_p95_ms)
    run.log_metrics(**logged)
    return logged
