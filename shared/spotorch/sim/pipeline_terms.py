"""`spotorch simulate --pipeline FILE`: the task, deadline, restart overhead, nodes and prices of
a real pipeline instead of numbers copied by hand (issue 41).

From the pipeline file: the task is `recovery.expected_compute` (the whole task on standard VMs),
the deadline `deadline`, the overhead `recovery.restart_overhead`, the nodes every replica of its
worker pools, and the prices one hour of its job on Spot and on standard VMs in its first region
from the price table (SPOTORCH_PRICES, else the shipped list prices; the pipeline's own `prices`
win), so costs come out in the table's money rather than in Spot = 1 units. Options given on the
command line still win over what the file says.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from spotorch.sim.model import ScenarioError


@dataclass(frozen=True)
class PipelineTerms:
    """What a pipeline file says of the scenario, in the command line's units."""

    name: str
    task_hours: float | None  # None: the file has no expected_compute
    deadline_hours: float | None
    overhead_hours: float
    nodes: int
    spot_per_node_hour: float  # the price table's, for the pipeline's own shape
    standard_per_node_hour: float
    currency: str
    shape: str  # what was priced, for people

    def to_json(self) -> dict[str, object]:
        """The terms as `spotorch simulate --json` reports them."""
        return {"pipeline": self.name, "currency": self.currency, "shape": self.shape,
                "spot_per_node_hour": round(self.spot_per_node_hour, 6),
                "standard_per_node_hour": round(self.standard_per_node_hour, 6)}


def pipeline_terms(path: Path) -> PipelineTerms:
    """The terms of the pipeline in this file; ScenarioError naming what is missing or wrong."""
    from spotorch.core.cost import hourly_rate
    from spotorch.core.errors import ConfigError
    from spotorch.core.pipeline import Capacity
    from spotorch.spec.loader import load_pipeline
    from spotorch.spec.prices import price_table

    try:
        pipeline = load_pipeline(path)
    except ConfigError as exc:
        raise ScenarioError(f"--pipeline {path}: {exc}") from None
    table = price_table()
    region = pipeline.job.regions[0] if pipeline.job.regions else "us-central1"
    spot = hourly_rate(pipeline, Capacity.SPOT, region, table)
    standard = hourly_rate(pipeline, Capacity.STANDARD, region, table)
    if spot.per_hour is None or standard.per_hour is None:
        unknown = ", ".join(dict.fromkeys((*spot.unknown, *standard.unknown))) or "its shape"
        raise ScenarioError(f"--pipeline {path}: the price table has no price for {unknown}; "
                            "give --on-demand-price and --price-ratio instead")
    nodes = max(1, sum(p.replica_count for p in pipeline.job.worker_pools))
    compute = pipeline.recovery.expected_compute_s
    return PipelineTerms(
        name=pipeline.name,
        task_hours=None if compute is None else compute / 3600.0,
        deadline_hours=None if pipeline.deadline_s is None else pipeline.deadline_s / 3600.0,
        overhead_hours=pipeline.recovery.restart_overhead_s / 3600.0, nodes=nodes,
        spot_per_node_hour=spot.per_hour / nodes,
        standard_per_node_hour=standard.per_hour / nodes, currency=table.currency,
        shape=", ".join(f"{p.replica_count}x {p.machine_type}"
                        + (f" + {p.accelerator_count}x {p.accelerator_type}"
                           if p.accelerator_type else "")
                        for p in pipeline.job.worker_pools) + f" in {region}")


def on_grid(task_s: float, deadline_s: float, overhead_s: float,
            step_s: float) -> tuple[float, float]:
    """(task, deadline) on the replay's grid: the deadline down to whole steps, the task up to
    whole work units (gcd of step and overhead); the replay needs both."""
    unit = math.gcd(int(step_s), round(overhead_s)) or int(step_s)
    return (math.ceil(round(task_s) / unit) * unit,
            math.floor(round(deadline_s) / step_s) * step_s)
