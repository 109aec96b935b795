"""Price tables as files: the JSON form `spotorch prices refresh` writes and SPOTORCH_PRICES names.

{"source": ..., "as_of": "YYYY-MM-DD", "currency": "USD",
 "families": {"n1": {"us-central1": {"vcpu": RATE, "gib": RATE}}},
 "machines": {"a2-highgpu-1g": {"us-central1": RATE}},
 "accelerators": {"NVIDIA_L4": {"us-central1": RATE}},
 "dataflow": {"batch_vcpu": {"us-central1": RATE}}}
with RATE = {"standard": 0.56, "spot": 0.22, "source": "...", "as_of": "YYYY-MM-DD"}, prices per
hour (per vCPU-hour, GiB-hour or accelerator-hour for units; Dataflow's per vCPU-, GB- of memory
and GB- of persistent disk hour, standard only). A table without a `dataflow` section (one
written before it existed) keeps the shipped Dataflow prices. Every problem is listed at once.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from datetime import date
from pathlib import Path
from typing import Any

from spotorch.core.errors import ConfigError, Problem
from spotorch.core.price_list import LIST_PRICES
from spotorch.core.prices import DATAFLOW_RESOURCES, PriceTable, Rate, UnitRates

PRICES_ENV = "SPOTORCH_PRICES"


def _rate_doc(rate: Rate) -> dict[str, Any]:
    return {"standard": rate.standard, "spot": rate.spot, "source": rate.source,
            "as_of": rate.as_of}


def table_doc(table: PriceTable) -> dict[str, Any]:
    """A price table as JSON."""
    return {
        "source": table.source, "as_of": table.as_of, "currency": table.currency,
        "families": {f: {r: {"vcpu": _rate_doc(u.vcpu), "gib": _rate_doc(u.gib)}
                         for r, u in by_region.items()} for f, by_region in table.families.items()},
        "machines": {m: {r: _rate_doc(rate) for r, rate in by_region.items()}
                     for m, by_region in table.machines.items()},
        "accelerators": {a: {r: _rate_doc(rate) for r, rate in by_region.items()}
                         for a, by_region in table.accelerators.items()},
        "dataflow": {k: {r: _rate_doc(rate) for r, rate in by_region.items()}
                     for k, by_region in table.dataflow.items()},
    }


def _rate(doc: Any, path: str, problems: list[Problem], file: str) -> Rate | None:
    if not isinstance(doc, Mapping):
        problems.append(Problem(file, path, "must be an object with standard, spot, source, as_of"))
        return None
    bad = len(problems)
    prices = {}
    for key in ("standard", "spot"):
        value = doc.get(key)
        if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
            problems.append(Problem(file, f"{path}.{key}", "must be a price: a number >= 0"))
        else:
            prices[key] = float(value)
    if not isinstance(doc.get("source"), str) or not doc.get("source"):
        problems.append(Problem(file, f"{path}.source", "must say where the price comes from"))
    try:
        date.fromisoformat(str(doc.get("as_of")))
    except ValueError:
        problems.append(Problem(file, f"{path}.as_of", "must be an ISO 8601 date (YYYY-MM-DD)"))
    if len(problems) > bad:
        return None
    return Rate(prices["standard"], prices["spot"], str(doc["source"]), str(doc["as_of"]))


def _by_region(doc: Any, path: str, problems: list[Problem], file: str) -> dict[str, Any]:
    if not isinstance(doc, Mapping):
        problems.append(Problem(file, path, "must be an object of region -> price"))
        return {}
    return dict(doc)


def table_from_doc(doc: Any, file: str = "<prices>") -> PriceTable:
    """A price table from its JSON form; ConfigError listing every problem."""
    problems: list[Problem] = []
    if not isinstance(doc, Mapping):
        raise ConfigError([Problem(file, "", "a price table must be a JSON object")])
    families: dict[str, dict[str, UnitRates]] = {}
    for family, by_region in (doc.get("families") or {}).items():
        for region, units in _by_region(by_region, f"families.{family}", problems, file).items():
            path = f"families.{family}.{region}"
            units = units if isinstance(units, Mapping) else {}
            vcpu = _rate(units.get("vcpu"), f"{path}.vcpu", problems, file)
            gib = _rate(units.get("gib"), f"{path}.gib", problems, file)
            if vcpu and gib:
                families.setdefault(str(family), {})[str(region)] = UnitRates(vcpu, gib)
    tables: dict[str, dict[str, dict[str, Rate]]] = {"machines": {}, "accelerators": {},
                                                     "dataflow": {}}
    for section, out in tables.items():
        for key, by_region in (doc.get(section) or {}).items():
            for region, rate_doc in _by_region(by_region, f"{section}.{key}", problems,
                                               file).items():
                rate = _rate(rate_doc, f"{section}.{key}.{region}", problems, file)
                if rate is not None:
                    out.setdefault(str(key), {})[str(region)] = rate
    unknown = sorted(set(tables["dataflow"]) - set(DATAFLOW_RESOURCES))
    if unknown:
        problems.append(Problem(file, "dataflow", f"unknown Dataflow resources {unknown}: "
                                f"known are {list(DATAFLOW_RESOURCES)}"))
    if problems:
        raise ConfigError(problems)
    dataflow = tables["dataflow"] if "dataflow" in doc else LIST_PRICES.dataflow
    return PriceTable(families=families, machines=tables["machines"],
                      accelerators=tables["accelerators"], dataflow=dataflow,
                      source=str(doc.get("source", file)),
                      as_of=str(doc.get("as_of", "")), currency=str(doc.get("currency", "USD")))


def load_table(path: str | os.PathLike[str]) -> PriceTable:
    """A price table file; ConfigError (every problem) when it is unreadable or invalid."""
    file = str(path)
    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError([Problem(file, "", f"cannot read the price table: {exc}")]) from None
    return table_from_doc(doc, file)


def price_table(environ: Mapping[str, str] | None = None) -> PriceTable:
    """The table this process prices with: SPOTORCH_PRICES' file, else the shipped list prices."""
    env = os.environ if environ is None else environ
    path = env.get(PRICES_ENV)
    return load_table(path) if path else LIST_PRICES
