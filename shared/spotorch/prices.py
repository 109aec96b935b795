"""List prices for cost estimates and budgets: per accelerator-hour by capacity (FACTS.md).

Compute Engine list prices, us-central1 unless noted; Vertex AI training adds its own margin, so a
pipeline can override them with `prices` (per replica-hour).
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from spotorch.pipeline import Capacity, Pipeline, WorkerPool

# Accelerator type -> capacity -> price per accelerator-hour.
ACCELERATOR_PRICES: Mapping[str, Mapping[Capacity, float]] = {
    "NVIDIA_TESLA_A100": {Capacity.STANDARD: 2.934, Capacity.SPOT: 1.147, Capacity.FLEX_START: 1.467},
    "NVIDIA_L4": {Capacity.STANDARD: 0.56, Capacity.SPOT: 0.223, Capacity.FLEX_START: 0.28},
    "NVIDIA_TESLA_T4": {Capacity.STANDARD: 0.35, Capacity.SPOT: 0.14, Capacity.FLEX_START: 0.175},
    # Per TPU chip-hour. From the author's memory of Cloud TPU's list prices (v5e about 1.20 on
    # demand); NOT verified here, and Vertex AI's TPU training prices differ: override them.
    "TPU_V5_LITEPOD": {Capacity.STANDARD: 1.20, Capacity.SPOT: 0.48, Capacity.FLEX_START: 0.60},
}
# A replica without a known accelerator: an n1-standard-4's price per hour.
CPU_REPLICA_PRICES: Mapping[Capacity, float] = {
    Capacity.STANDARD: 0.19, Capacity.SPOT: 0.04, Capacity.FLEX_START: 0.095,
}


# Per vCPU-hour of a CPU-only machine, for comparing CPU shapes of different sizes (issue 19):
# the n1-standard-4 prices above divided by its 4 vCPUs.
CPU_VCPU_PRICES: Mapping[Capacity, float] = {c: p / 4 for c, p in CPU_REPLICA_PRICES.items()}
_VCPUS = re.compile(r"-(\d+)$")


def shape_hourly_price(machine_type: str, accelerator_type: str | None, accelerator_count: int,
                       capacity: Capacity) -> float:
    """One replica of a machine shape per hour: its accelerators' price when the table knows them
    (the host VM is not priced, as in hourly_price), else its vCPUs at CPU_VCPU_PRICES."""
    table = ACCELERATOR_PRICES.get(accelerator_type or "")
    if table and accelerator_count:
        return table[capacity] * accelerator_count
    found = _VCPUS.search(machine_type)
    if found is None:
        return CPU_REPLICA_PRICES[capacity]
    return CPU_VCPU_PRICES[capacity] * int(found.group(1))


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
