"""The names validation knows: regions, machine types, accelerator types and which fit which.

The table ships with spotorch (spotorch/machines.json, with its sources, date and notes);
$SPOTORCH_MACHINES names more files of the same shape (separated by the OS path separator),
whose regions, machine types and accelerators are added to it or replace the built-in ones.
"""

from __future__ import annotations

import difflib
import functools
import json
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from spotorch.core.errors import ConfigError, Problem

CATALOG_ENV = "SPOTORCH_MACHINES"
# Beside __init__.py: the function bundle carries the spotorch package's own data files.
BUILTIN = Path(__file__).resolve().parent / "machines.json"

# accelerator type -> the counts a machine type takes; None: not known, so not checked.
Fits = Mapping[str, tuple[int, ...]] | None


@dataclass(frozen=True)
class Catalog:
    """What exists, as far as the table knows (see its notes for what it could not verify)."""

    date: str
    regions: frozenset[str]
    machine_types: Mapping[str, Fits]
    accelerator_regions: Mapping[str, frozenset[str] | None]  # None: regions not known
    files: tuple[str, ...]  # the built-in table and the extensions, in order

    def where(self) -> str:
        """Which tables this catalog came from, for messages."""
        return f"spotorch's table of {self.date}" + (
            f" extended by {', '.join(self.files[1:])}" if len(self.files) > 1 else "")


def _machine_types(table: Mapping[str, Any], file: str) -> dict[str, Fits]:
    sets = table.get("accelerator_sets", {})
    out: dict[str, Fits] = {}
    for entry in table.get("machine_types", ()):
        names = entry.get("names") or [entry["family"].format(n) for n in entry.get("sizes", ())]
        for name in names:
            fits = entry.get("accelerators", {})
            if isinstance(fits, str):
                if fits not in sets:
                    raise ConfigError([Problem(file, f"machine_types[{name}].accelerators",
                                               f"names no accelerator_sets entry {fits!r}")])
                fits = sets[fits]
            if "fixed" in entry:  # the family's number is its GPU count: a2-highgpu-4g, 4 A100
                fits = {entry["fixed"]: [int(name.rsplit("-", 1)[1].rstrip("gt"))]}
            out[name] = None if fits is None else {k: tuple(v) for k, v in fits.items()}
    return out


def _read(path: Path) -> Mapping[str, Any]:
    try:
        table = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ConfigError([Problem(str(path), "", f"cannot read the machine table: {exc}")]) \
            from exc
    if not isinstance(table, Mapping):
        raise ConfigError([Problem(str(path), "", "a machine table must be a JSON object")])
    return table


@functools.cache
def _load(extensions: tuple[str, ...]) -> Catalog:
    files = (str(BUILTIN), *extensions)
    date, regions = "", set[str]()
    machines: dict[str, Fits] = {}
    accelerators: dict[str, frozenset[str] | None] = {}
    for file in files:
        table = _read(Path(file))
        date = date or str(table.get("date", ""))
        regions |= set(table.get("regions", ()))
        machines |= _machine_types(table, file)
        for name, spec in table.get("accelerators", {}).items():
            listed = spec.get("regions") if isinstance(spec, Mapping) else None
            accelerators[name] = None if listed is None else frozenset(listed)
    return Catalog(date, frozenset(regions), machines, accelerators, files)


def load_catalog(environ: Mapping[str, str] | None = None) -> Catalog:
    """The built-in table plus the files named by $SPOTORCH_MACHINES (read once per process)."""
    env = os.environ if environ is None else environ
    extensions = tuple(p for p in env.get(CATALOG_ENV, "").split(os.pathsep) if p)
    return _load(extensions)


# --- checks of a pipeline document -----------------------------------------------------------------

_Found = Iterator[tuple[str, str]]


def _unknown(what: str, name: str, known: Sequence[str], catalog: Catalog) -> str:
    close = difflib.get_close_matches(name, known, n=1, cutoff=0.75)
    hint = f"did you mean {close[0]!r}? " if close else ""
    return (f"{name!r} is not a {what} in {catalog.where()}; {hint}if it exists, add it to "
            f"your own table (${CATALOG_ENV}, see docs/pipelines.md)")


def _pools(doc: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    job = doc.get("job")
    pools = job.get("worker_pools") if isinstance(job, Mapping) else None
    return [p if isinstance(p, Mapping) else {} for p in pools] if isinstance(pools, list) else []


def _candidates(doc: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    hardware = doc.get("hardware")
    found = hardware.get("candidates") if isinstance(hardware, Mapping) else None
    return [c if isinstance(c, Mapping) else {} for c in found] if isinstance(found, list) else []


def _shapes(doc: Mapping[str, Any]) -> Iterator[tuple[str, Mapping[str, Any]]]:
    """(field path, mapping) of every machine shape: the worker pools, then the candidates."""
    for i, pool in enumerate(_pools(doc)):
        yield f"job.worker_pools[{i}]", pool
    for i, candidate in enumerate(_candidates(doc)):
        yield f"hardware.candidates[{i}]", candidate


def _regions(doc: Mapping[str, Any]) -> list[Any]:
    job = doc.get("job")
    regions = job.get("regions", ["us-central1"]) if isinstance(job, Mapping) else []
    return regions if isinstance(regions, list) else []


def check_names(doc: Mapping[str, Any], catalog: Catalog) -> _Found:
    """Problems: names the table does not know, and accelerators on machines they do not fit."""
    for i, region in enumerate(_regions(doc)):
        if isinstance(region, str) and region not in catalog.regions:
            yield f"job.regions[{i}]", _unknown("region", region, sorted(catalog.regions), catalog)
    for where, pool in _shapes(doc):
        machine, kind = pool.get("machine_type"), pool.get("accelerator_type")
        count = pool.get("accelerator_count", 0)
        if isinstance(machine, str) and machine not in catalog.machine_types:
            yield f"{where}.machine_type", _unknown("machine type", machine,
                                                    sorted(catalog.machine_types), catalog)
        if isinstance(kind, str) and kind not in catalog.accelerator_regions:
            yield f"{where}.accelerator_type", _unknown("accelerator type", kind,
                                                        sorted(catalog.accelerator_regions),
                                                        catalog)
        fits = catalog.machine_types.get(machine) if isinstance(machine, str) else None
        if fits is None or not isinstance(kind, str) or kind not in catalog.accelerator_regions:
            continue
        if kind not in fits:
            takes = ", ".join(sorted(fits)) or "no accelerators"
            yield f"{where}.accelerator_type", f"{kind} does not attach to {machine} (it takes " \
                                               f"{takes})"
        elif isinstance(count, int) and count and count not in fits[kind]:
            counts = " or ".join(map(str, fits[kind]))
            yield f"{where}.accelerator_count", f"{machine} takes {counts} x {kind}, not {count}"


def accelerator_region_warnings(doc: Mapping[str, Any], catalog: Catalog) -> _Found:
    """Warnings: an accelerator in a region the table says does not offer it (only where the
    table lists the accelerator's regions; the built-in one lists none)."""
    for where, pool in _shapes(doc):
        kind = pool.get("accelerator_type")
        offered = catalog.accelerator_regions.get(kind) if isinstance(kind, str) else None
        if offered is None:
            continue
        for j, region in enumerate(_regions(doc)):
            if isinstance(region, str) and region not in offered:
                yield f"job.regions[{j}]", (f"{kind} ({where}) is not offered in "
                                            f"{region} according to {catalog.where()}")
