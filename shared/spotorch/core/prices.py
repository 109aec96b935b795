"""List prices: what one hour of a machine or an accelerator costs, by region and capacity.

The table a ledger prices with. Machines of a family that Compute Engine prices per vCPU and per
GiB (N1, N2, E2, G2, ...) are priced from the family's unit rates and the machine's shape;
machines whose host is priced whole (A2, A3) have their own line; accelerators are priced per
unit. Every figure names its source and the date it was read. What the table does not know is
an unknown price, never another machine's. `spotorch prices refresh` writes a table of the same
shape from Google's Cloud Billing Catalog API; users point SPOTORCH_PRICES at their own.

Compute Engine list prices: Vertex AI custom training bills its own rates, a little higher; a
pipeline with a negotiated or current Vertex rate sets `prices` and those win (docs/operating.md).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from spotorch.core.pipeline import Capacity

# Dataflow bills batch workers per second for the resources GetJobMetrics reports (TotalVcpuTime,
# TotalMemoryUsage, TotalPdUsage), not by machine type: the table's Dataflow keys, each per hour
# of one unit (a vCPU, a GB of memory, a GB of standard persistent disk).
DATAFLOW_VCPU, DATAFLOW_MEMORY_GB, DATAFLOW_PD_GB = "batch_vcpu", "batch_memory_gb", "batch_pd_gb"
# Dataproc Serverless (issue 42), priced beside Dataflow in the table's `dataflow` section (the
# preprocess services'): per DCU-hour and per GB-hour of shuffle storage, standard tier.
DATAPROC_DCU, DATAPROC_SHUFFLE_GB = "dataproc_dcu", "dataproc_shuffle_gb"
DATAFLOW_RESOURCES = (DATAFLOW_VCPU, DATAFLOW_MEMORY_GB, DATAFLOW_PD_GB, DATAPROC_DCU,
                      DATAPROC_SHUFFLE_GB)

# FLEX_START (Dynamic Workload Scheduler) is billed at a discount of the on-demand rate; the size
# of that discount varies by resource and was not read here: half, as an estimate.
FLEX_RATIO = 0.5


@dataclass(frozen=True)
class Rate:
    """An hourly price on standard and Spot capacity, and where it comes from."""

    standard: float
    spot: float
    source: str
    as_of: str  # ISO 8601 date the figure was read

    def on(self, capacity: Capacity) -> float:
        """The price per hour on this capacity."""
        if capacity is Capacity.SPOT:
            return self.spot
        if capacity is Capacity.FLEX_START:
            return self.standard * FLEX_RATIO
        return self.standard


@dataclass(frozen=True)
class UnitRates:
    """A machine family's price per vCPU-hour and per GiB-hour of memory."""

    vcpu: Rate
    gib: Rate


@dataclass(frozen=True)
class PriceTable:
    """Prices by region: family unit rates, whole hosts, accelerators (per unit)."""

    families: Mapping[str, Mapping[str, UnitRates]] = field(default_factory=dict)
    machines: Mapping[str, Mapping[str, Rate]] = field(default_factory=dict)
    accelerators: Mapping[str, Mapping[str, Rate]] = field(default_factory=dict)
    # Dataflow batch resources (DATAFLOW_RESOURCES) by region, per unit-hour; standard only: the
    # preprocess step launches no FlexRS job, so a Rate's spot figure is not used for them.
    dataflow: Mapping[str, Mapping[str, Rate]] = field(default_factory=dict)
    source: str = ""
    as_of: str = ""
    currency: str = "USD"


# --- machine shapes --------------------------------------------------------------------------
# Compute Engine's machine types: vCPUs and GiB of memory, by family and size. Families priced per
# unit need the shape; whole-host families (A2, A3) do not.

_PER_VCPU_GIB: Mapping[str, float] = {
    "n1-standard": 3.75, "n1-highmem": 6.5, "n1-highcpu": 0.9,
    "n2-standard": 4.0, "n2-highmem": 8.0, "n2-highcpu": 1.0,
    "e2-standard": 4.0, "e2-highmem": 8.0, "e2-highcpu": 1.0,
    "c2-standard": 4.0, "g2-standard": 4.0,
}
_SIZED = re.compile(r"^(?P<series>[a-z][a-z0-9]*-[a-z]+)-(?P<n>[0-9]+)$")


@dataclass(frozen=True)
class Shape:
    """A machine type's family (as the price table names it), vCPUs and memory."""

    family: str  # e.g. "n1", "e2", "g2"
    vcpus: int
    gib: float


# Accelerator-optimized hosts: vCPUs and GiB per GPU (Compute Engine's A2 and A3 pages; the
# SkyPilot catalog's rows agree), priced per unit when a table has no whole-host line for them.
_PER_GPU: Mapping[str, tuple[str, int, float]] = {
    "a2-highgpu": ("a2", 12, 85.0), "a2-ultragpu": ("a2", 12, 170.0),
    "a3-highgpu": ("a3", 26, 234.0),
}
_GPU_SIZED = re.compile(r"^(?P<series>[a-z][a-z0-9]*-[a-z]+)-(?P<n>[0-9]+)g$")


def _whole() -> Mapping[str, Shape]:
    return {"a2-megagpu-16g": Shape("a2", 96, 1360.0), "a3-megagpu-8g": Shape("a3", 208, 1872.0)}


def shape_of(machine_type: str) -> Shape | None:
    """The shape of a machine type priced per unit; None for whole-host or unknown types."""
    whole = _whole().get(machine_type)
    if whole is not None:
        return whole
    gpus = _GPU_SIZED.match(machine_type)
    if gpus is not None and gpus.group("series") in _PER_GPU:
        family, vcpus, gib = _PER_GPU[gpus.group("series")]
        n = int(gpus.group("n"))
        return Shape(family, vcpus * n, gib * n)
    sized = _SIZED.match(machine_type)
    if sized is None or sized.group("series") not in _PER_VCPU_GIB:
        return None
    vcpus = int(sized.group("n"))
    series = sized.group("series")
    return Shape(series.split("-")[0], vcpus, vcpus * _PER_VCPU_GIB[series])


ANY_REGION = "*"


def region_entry(table: Mapping[str, Mapping[str, object]], key: str,
                 region: str) -> tuple[object | None, str | None]:
    """(entry, the region it is for) of key in region: that region's, else the table's fallback
    for any region (ANY_REGION), else the first region listed (named, so the ledger says so)."""
    by_region = table.get(key)
    if not by_region:
        return None, None
    if region in by_region:
        return by_region[region], region
    if ANY_REGION in by_region:
        return by_region[ANY_REGION], ANY_REGION
    first = next(iter(by_region))
    return by_region[first], first
