"""List prices for cost estimates and budgets: per accelerator-hour by capacity (FACTS.md).

Compute Engine list prices, us-central1 unless noted; Vertex AI training adds its own margin, so a
pipeline can override them with `prices` (per replica-hour).
"""

from __future__ import annotations

from collections.abc import Mapping

from spotorch.core.pipeline import Capacity, Pipeline, WorkerPool

# Accelerator type -> capacity -> price per accelerator-hour.
ACCELERATOR_PRICES: Mapping[str, Mapping[Capacity, float]] = {
    "NVIDIA_TESLA_A100": {Capacity.STANDARD: 2.934, Capacity.SPOT: 1.147, Capacity.FLEX_START: 1.467},
    "NVIDIA_L4": {Capacity.STANDARD: 0.56, Capacity.SPOT: 0.223, Capacity.FLEX_START: 0.28},
    "NVIDIA_TESLA_T4": {Capacity.STANDARD: 0.35, Capacity.SPOT: 0.14, Capacity.FLEX_START: 0.175},
}
# A replica without a known accelerator: an n1-standard-4's price per hour.
CPU_REPLICA_PRICES: Mapping[Capacity, float] = {
    Capacity.STANDARD: 0.19, Capacity.SPOT: 0.04, Capacity.FLEX_START: 0.095,
}


def _pool_price(pool: WorkerPool, capacity: Capacity) -> float:
    table = ACCELERATOR_PRICES.get(pool.accelerator_type or "")
    per_replica = table[capacity] * pool.accelerator_count if table and pool.accelerator_count \
        else CPU_REPLICA_PRICES[capacity]
    return per_replica * pool.replica_count


def hourly_price(pipeline: Pipeline, capacity: Capacity) -> float:
    """What one hour of the pipeline's job costs on this capacity."""
    override = dict(pipeline.prices).get(str(capacity))
    if override is not None:
        return override * sum(p.replica_count for p in pipeline.job.worker_pools)
    return sum(_pool_price(p, capacity) for p in pipeline.job.worker_pools)
