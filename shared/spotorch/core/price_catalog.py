"""Google's Cloud Billing Catalog SKUs turned into a price table (pure: SKU dicts in, table out).

A SKU (`GET /v1/services/{service}/skus`, FACTS.md) names what it prices in its description and
category (resourceGroup, usageType OnDemand or Preemptible = Spot), the regions it applies to in
serviceRegions, and its price in the last pricingInfo's tieredRates[].unitPrice {units, nanos}
per usageUnit ("h" for cores and GPUs, "GiBy.h" for memory). The rules below say which SKU is
which part of spotorch's table; their description prefixes follow Cyclenerd's mapping.csv
(github.com/Cyclenerd/google-cloud-pricing-cost-calculator, build/mapping.csv, snapshot dac3128):
a SKU no rule matches is not used. Cloud TPU SKUs live in another service and are not read here.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from spotorch.core.pipeline import Capacity
from spotorch.core.prices import PriceTable, Rate, UnitRates

COMPUTE_ENGINE = "6F81-5844-456A"  # the Catalog's service id of Compute Engine
USAGE_CAPACITY: Mapping[str, Capacity] = {"OnDemand": Capacity.STANDARD,
                                          "Preemptible": Capacity.SPOT}


@dataclass(frozen=True)
class SkuRule:
    """A SKU whose resourceGroup is `group` and whose description starts with `prefix` is the
    `part` ("vcpu", "gib" or "unit") of family or accelerator `key`."""

    key: str
    part: str
    group: str
    prefix: str


def _family(key: str, name: str, group_core: str = "CPU", group_ram: str = "RAM",
            core: str = "Instance", ram: str = "Instance") -> tuple[SkuRule, ...]:
    return (SkuRule(key, "vcpu", group_core, f"{name} {core}"),
            SkuRule(key, "vcpu", group_core, f"Spot Preemptible {name} {core}"),
            SkuRule(key, "gib", group_ram, f"{name} {ram}"),
            SkuRule(key, "gib", group_ram, f"Spot Preemptible {name} {ram}"))


def _gpu(key: str, name: str) -> tuple[SkuRule, ...]:
    return (SkuRule(key, "unit", "GPU", f"{name} running"),
            SkuRule(key, "unit", "GPU", f"{name} attached to Spot"))


RULES: tuple[SkuRule, ...] = (
    *_family("n1", "N1", "N1Standard", "N1Standard", "Predefined Instance Core",
             "Predefined Instance Ram"),
    *_family("n2", "N2"), *_family("e2", "E2"), *_family("g2", "G2"),
    *_family("a2", "A2"), *_family("a3", "A3"),
    *_family("c2", "Compute optimized", core="Core", ram="Ram"),
    *_gpu("NVIDIA_TESLA_T4", "Nvidia Tesla T4 GPU"),
    *_gpu("NVIDIA_TESLA_V100", "Nvidia Tesla V100 GPU"),
    *_gpu("NVIDIA_TESLA_P100", "Nvidia Tesla P100 GPU"),
    *_gpu("NVIDIA_TESLA_P4", "Nvidia Tesla P4 GPU"),
    *_gpu("NVIDIA_TESLA_K80", "Nvidia Tesla K80 GPU"),
    *_gpu("NVIDIA_L4", "Nvidia L4 GPU"),
    *_gpu("NVIDIA_TESLA_A100", "Nvidia Tesla A100 GPU"),
    *_gpu("NVIDIA_A100_80GB", "Nvidia Tesla A100 80GB GPU"),
    *_gpu("NVIDIA_H100_80GB", "Nvidia H100 80GB GPU"),
    *_gpu("NVIDIA_H100_MEGA_80GB", "Nvidia H100 80GB Mega GPU"),
    *_gpu("NVIDIA_RTX_PRO_6000", "RTX 6000 96GB"),
)
_FAMILY_KEYS = frozenset(r.key for r in RULES if r.part != "unit")
# A unit of each part's usageUnit: cores and GPUs by the hour, memory by the GiB-hour.
_UNITS: Mapping[str, str] = {"vcpu": "h", "unit": "h", "gib": "GiBy.h"}


def unit_price(sku: Mapping[str, Any]) -> tuple[float, str] | None:
    """(price, usageUnit) of a SKU: its latest pricingInfo's first tier; None if it has none."""
    infos = sku.get("pricingInfo") or []
    if not infos:
        return None
    expression = infos[-1].get("pricingExpression") or {}
    tiers = expression.get("tieredRates") or []
    if not tiers:
        return None
    price = tiers[0].get("unitPrice") or {}
    return int(price.get("units") or 0) + int(price.get("nanos") or 0) / 1e9, \
        str(expression.get("usageUnit", ""))


def rule_of(sku: Mapping[str, Any]) -> tuple[SkuRule, Capacity] | None:
    """The rule a SKU falls under and its capacity; None for anything else (commitments...)."""
    category = sku.get("category") or {}
    capacity = USAGE_CAPACITY.get(str(category.get("usageType", "")))
    if capacity is None:
        return None
    description, group = str(sku.get("description", "")), str(category.get("resourceGroup", ""))
    spot = description.startswith("Spot Preemptible ") or " attached to Spot" in description
    for rule in RULES:
        rule_spot = rule.prefix.startswith("Spot Preemptible ") or rule.prefix.endswith(
            "attached to Spot")
        if rule.group == group and description.startswith(rule.prefix) and rule_spot == spot \
                and rule_spot == (capacity is Capacity.SPOT):
            return rule, capacity
    return None


def table_from_skus(skus: Iterable[Mapping[str, Any]], *, as_of: str, source: str,
                    regions: frozenset[str] | None = None) -> tuple[PriceTable, list[str]]:
    """The price table of these SKUs (only `regions`, when given), and what was left out: a
    part with only one capacity priced, or a SKU in a unit spotorch does not read."""
    found: dict[tuple[str, str, str], dict[Capacity, tuple[float, str]]] = {}
    notes: list[str] = []
    for sku in skus:
        matched = rule_of(sku)
        priced = unit_price(sku)
        if matched is None or priced is None:
            continue
        rule, capacity = matched
        price, unit = priced
        if unit != _UNITS[rule.part]:
            notes.append(f"{sku.get('skuId')}: {sku.get('description')!r} is per {unit!r}, "
                         f"not per {_UNITS[rule.part]!r}: not used")
            continue
        for region in sku.get("serviceRegions") or ():
            if regions is None or region in regions:
                label = f"{sku.get('skuId')} {sku.get('description')}"
                found.setdefault((rule.key, rule.part, str(region)), {})[capacity] = (price, label)
    families: dict[str, dict[str, dict[str, Rate]]] = {}
    accelerators: dict[str, dict[str, Rate]] = {}
    for (key, part, region), by_capacity in sorted(found.items()):
        if set(by_capacity) != {Capacity.STANDARD, Capacity.SPOT}:
            notes.append(f"{key} {part} in {region}: only {sorted(map(str, by_capacity))} "
                         "priced: left out")
            continue
        (standard, a), (spot, b) = by_capacity[Capacity.STANDARD], by_capacity[Capacity.SPOT]
        rate = Rate(standard, spot, f"{source}: {a} / {b}", as_of)
        if part == "unit":
            accelerators.setdefault(key, {})[region] = rate
        else:
            families.setdefault(key, {}).setdefault(region, {})[part] = rate
    units = {key: {region: UnitRates(parts["vcpu"], parts["gib"])
                   for region, parts in by_region.items() if {"vcpu", "gib"} <= parts.keys()}
             for key, by_region in families.items() if key in _FAMILY_KEYS}
    return PriceTable(families={k: v for k, v in units.items() if v},
                      accelerators=accelerators, source=source, as_of=as_of), notes
