"""Choosing the hardware from measurements (issue 19): candidates, probe results, the choice.

Pure. A pipeline lists `hardware.candidates` (machine shapes for its chief pool); a short probe job
per candidate runs the real training code for `probe_steps` steps and reports its rate and peak
memory (spotorch_trainer writes `probe.json`, read back by spotorch.app.hardware_probes); `choose` turns the
measurements and the price table into a table of rows and picks the cheapest candidate expected to
meet the deadline (ties: the faster); when none does, the fastest fit one, with a warning.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

from spotorch.core.cost import hourly_rate
from spotorch.core.health import OOM_PATTERNS, is_out_of_memory
from spotorch.core.pipeline import Capacity, HardwareCandidate, Pipeline
from spotorch.core.price_list import LIST_PRICES
from spotorch.core.prices import PriceTable
from spotorch.core.shapes import apply, describe, on_candidate

__all__ = ["apply", "describe", "on_candidate"]  # re-exported: callers find the shapes here

# On every probe job: "1" (spotorch advise), or the probe's kind ("capacity", "hardware") on a
# run's own probes (spotorch.domain.Probe). A probe is never an attempt of a run.
PROBE_LABEL = "spotorch_probe"
PROBE_CANDIDATE_LABEL = "spotorch_candidate"
PROBE_REPORT = "probe.json"  # what the trainer writes under its checkpoint root at the end

# Why a probe is unfit, from what its job and its report say (first match wins): out of memory
# by the one list of out-of-memory wordings (spotorch.core.health.OOM_PATTERNS, or the
# pipeline's health.oom_patterns), or by the exit status the OOM killer leaves.
OOM_EXIT_CODES = frozenset({137})  # 128 + SIGKILL: what the OOM killer leaves


def candidate_price(pipeline: Pipeline, candidate: HardwareCandidate, capacity: Capacity,
                    prices: PriceTable = LIST_PRICES) -> float | None:
    """Price per hour of the whole job on this candidate (all replicas) in the pipeline's first
    region: the ledger's price table, so the table and the run's ledger agree; None: unknown."""
    return hourly_rate(on_candidate(pipeline, candidate), capacity,
                       pipeline.job.regions[0], prices).per_hour


def _price_order(pipeline: Pipeline, candidate: HardwareCandidate,
                 prices: PriceTable) -> tuple[bool, float]:
    """Cheapest first on Spot; a candidate without a known price last."""
    price = candidate_price(pipeline, candidate, Capacity.SPOT, prices)
    return price is None, price or 0.0


def cache_key(pipeline: Pipeline, candidate: HardwareCandidate, probe_steps: int) -> str:
    """Probe results are reused for the same pipeline, code (image, command, args, env) and shape."""
    chief = pipeline.job.worker_pools[0]
    code = {"pipeline": pipeline.name, "image": chief.image_uri, "command": list(chief.command),
            "args": list(chief.args), "env": sorted(map(list, chief.env)),
            "candidate": asdict(candidate), "probe_steps": probe_steps}
    package = chief.python_package
    if package is not None:  # the built archives are named by their content
        code["package"] = {"uris": list(package.package_uris), "module": package.python_module,
                           "image": package.executor_image_uri}
    digest = hashlib.sha256(json.dumps(code, sort_keys=True, default=str).encode()).hexdigest()
    return digest[:16]


# --- probe results --------------------------------------------------------------------------


@dataclass(frozen=True)
class ProbeResult:
    """What one probe measured, or why the candidate is unfit."""

    candidate: str
    fit: bool
    reason: str = ""  # why unfit; empty when fit
    steps_per_s: float | None = None  # mean over the timed steps (the first is warm-up)
    samples_per_s: float | None = None
    step_time_cv: float = 0.0  # coefficient of variation of step times: how noisy the rate is
    peak_host_rss_mb: float | None = None
    peak_accelerator_mb: float | None = None  # where the framework exposes it
    steps: int = 0
    measured_at: float = 0.0
    key: str = ""  # cache_key of the probe
    job_name: str = ""
    # The probe never gave the candidate's answer: it could not be launched, its job was lost,
    # it never got a machine. Not a verdict on the candidate: never reused from the cache.
    infra: bool = False

    def to_doc(self) -> dict[str, Any]:
        """The result as stored in the probe cache and the run."""
        return asdict(self)

    @classmethod
    def from_doc(cls, doc: Mapping[str, Any]) -> ProbeResult:
        """The result a stored document holds; fields unknown to this version are dropped."""
        known = {k: doc[k] for k in cls.__dataclass_fields__ if k in doc}
        return cls(**known)


def _num(report: Mapping[str, Any], key: str) -> float | None:
    value = report.get(key)
    return float(value) if isinstance(value, int | float) and math.isfinite(value) else None


def unfit_reason(exit_code: int | None, message: str,
                 patterns: Sequence[str] = OOM_PATTERNS) -> str:
    """Why a failed probe is unfit: out of memory when its exit code or message says so."""
    if exit_code in OOM_EXIT_CODES or is_out_of_memory(message, patterns):
        return f"out of memory ({message.strip()[:160] or f'exit {exit_code}'})"
    return f"failed ({message.strip()[:160] or f'exit {exit_code}'})"


def result_of(candidate: str, report: Mapping[str, Any] | None, *, succeeded: bool,
              exit_code: int | None = None, message: str = "", now: float = 0.0, key: str = "",
              job_name: str = "", oom_patterns: Sequence[str] = OOM_PATTERNS) -> ProbeResult:
    """A probe's result from its job's end and the trainer's report (None: none was written)."""
    base = ProbeResult(candidate, False, measured_at=now, key=key, job_name=job_name)
    if report is not None and report.get("oom"):
        return replace(base, reason=unfit_reason(None, str(report.get("error") or
                                                         "out of memory"), oom_patterns))
    if not succeeded:  # the trainer's own account of the error says more than the job's
        said = str((report or {}).get("error") or "")
        return replace(base, reason=unfit_reason(exit_code, said or message, oom_patterns))
    rate = _num(report or {}, "steps_per_s")
    if rate is None or rate <= 0:
        return replace(base, reason="no measurement: the trainer wrote no probe report "
                                    "(does the training code use spotorch_trainer.Run.steps?)")
    return replace(base, fit=True, steps_per_s=rate,
                   samples_per_s=_num(report or {}, "samples_per_s"),
                   step_time_cv=max(0.0, _num(report or {}, "step_time_cv") or 0.0),
                   peak_host_rss_mb=_num(report or {}, "peak_host_rss_mb"),
                   peak_accelerator_mb=_num(report or {}, "peak_accelerator_mb"),
                   steps=int(_num(report or {}, "steps") or 0))


def fresh(result: ProbeResult | None, key: str, now: float, ttl_s: float) -> bool:
    """Whether a cached result is for the same code and shape and young enough to reuse."""
    return result is not None and not result.infra and result.key == key \
        and now - result.measured_at <= ttl_s


# --- planning the probes --------------------------------------------------------------------


@dataclass(frozen=True)
class ProbePlan:
    """Which candidates to probe now, which reuse a cached result, which the budget leaves out."""

    probe: tuple[HardwareCandidate, ...]
    cached: tuple[ProbeResult, ...]
    skipped: tuple[ProbeResult, ...]
    budget_used: float  # worst case: every probe runs to probe_timeout on Spot


def plan_probes(pipeline: Pipeline, cache: Mapping[str, ProbeResult], now: float,
                prices: PriceTable = LIST_PRICES) -> ProbePlan:
    """Probe each candidate without a fresh cached result, cheapest first, within the budget."""
    search = pipeline.hardware
    if search is None:
        return ProbePlan((), (), (), 0.0)
    probe: list[HardwareCandidate] = []
    cached: list[ProbeResult] = []
    skipped: list[ProbeResult] = []
    used = 0.0
    hours = search.probe_timeout_s / 3600.0
    by_price = sorted(search.candidates, key=lambda c: _price_order(pipeline, c, prices))
    for candidate in by_price:
        key = cache_key(pipeline, candidate, search.probe_steps)
        hit = cache.get(candidate.name)
        if hit is not None and fresh(hit, key, now, search.cache_ttl_s):
            cached.append(hit)
            continue
        price = candidate_price(pipeline, candidate, Capacity.SPOT, prices)
        if price is None and search.probe_budget is not None:
            skipped.append(ProbeResult(candidate.name, False, key=key, measured_at=now,
                                       reason="not probed: its price is unknown, so the probe "
                                              "budget cannot cover it"))
            continue
        cost = (price or 0.0) * hours
        if search.probe_budget is not None and used + cost > search.probe_budget:
            skipped.append(ProbeResult(candidate.name, False, key=key, measured_at=now,
                                       reason=f"not probed: its worst case ({cost:.2f}) is over "
                                              f"what is left of the probe budget "
                                              f"({search.probe_budget - used:.2f})"))
            continue
        used += cost
        probe.append(candidate)
    return ProbePlan(tuple(probe), tuple(cached), tuple(skipped), used)


# --- the choice -----------------------------------------------------------------------------


@dataclass(frozen=True)
class ChoiceRow:
    """One line of the table: a candidate, what it measured, what it is expected to take."""

    candidate: str
    shape: str
    fit: bool
    reason: str  # unfit: why; fit: what was decided about it
    steps_per_s: float | None = None
    samples_per_s: float | None = None
    peak_host_rss_mb: float | None = None
    peak_accelerator_mb: float | None = None
    expected_hours: float | None = None  # on Spot, with restart overheads
    compute_hours: float | None = None  # total_steps at the conservative rate, no restarts
    spot_cost: float | None = None
    standard_cost: float | None = None
    meets_deadline: bool | None = None  # None: no deadline
    chosen: bool = False


@dataclass(frozen=True)
class HardwareChoice:
    """The table, the chosen candidate and why; stored on the run as `hardware`."""

    rows: tuple[ChoiceRow, ...]
    chosen: str | None
    reason: str
    warning: str = ""
    expected_compute_s: float | None = None  # of the chosen candidate: feeds the deadline policy
    deadline_s: float | None = None

    def to_doc(self) -> dict[str, Any]:
        """The choice as stored in the run and its run.hardware_chosen event."""
        doc = asdict(self)
        doc["rows"] = list(doc["rows"])  # JSON arrays: the doc travels in run.hardware_chosen
        return doc

    def row(self, name: str) -> ChoiceRow | None:
        """The row of the candidate of this name, None if it is not in the choice."""
        return next((r for r in self.rows if r.candidate == name), None)


@dataclass(frozen=True)
class Outlook:
    """What the choice assumes about Spot on these shapes (from history, or the defaults)."""

    preemptions_per_hour: Mapping[str, float]  # candidate name -> expected preemptions per hour
    default_preemptions_per_hour: float = 0.0
    # each preemption loses the restart overhead plus, on average, half a checkpoint interval of
    # redone work; the redone part is billed
    rework_s_per_preemption: float = 0.0

    def rate(self, candidate: str) -> float:
        """Expected preemptions per hour of a candidate, the default when none were seen."""
        return self.preemptions_per_hour.get(candidate, self.default_preemptions_per_hour)


NO_HISTORY = Outlook({})


def _row(pipeline: Pipeline, candidate: HardwareCandidate, result: ProbeResult | None,
         deadline_s: float | None, outlook: Outlook, prices: PriceTable = LIST_PRICES) -> ChoiceRow:
    search = pipeline.hardware
    assert search is not None
    shape = describe(candidate)
    if result is None:
        return ChoiceRow(candidate.name, shape, False, "not probed")
    if not result.fit or not result.steps_per_s:
        return ChoiceRow(candidate.name, shape, False, result.reason or "unfit",
                         peak_host_rss_mb=result.peak_host_rss_mb,
                         peak_accelerator_mb=result.peak_accelerator_mb)
    # A noisy rate is taken at its slow side: one standard deviation of step time slower.
    rate = result.steps_per_s / (1.0 + result.step_time_cv)
    compute_s = search.total_steps / rate
    preemptions = outlook.rate(candidate.name) * compute_s / 3600.0
    overhead = pipeline.recovery.restart_overhead_s
    # one launch, plus a relaunch and the redone work per expected preemption
    expected_s = compute_s + overhead + preemptions * (overhead + outlook.rework_s_per_preemption)
    billed_spot_h = (compute_s + preemptions * outlook.rework_s_per_preemption) / 3600.0
    meets = None if deadline_s is None else expected_s <= deadline_s
    spot_price = candidate_price(pipeline, candidate, Capacity.SPOT, prices)
    standard_price = candidate_price(pipeline, candidate, Capacity.STANDARD, prices)
    if spot_price is None or standard_price is None:
        return ChoiceRow(candidate.name, shape, False, "price unknown: the price table has no "
                         "price for its machine or accelerator",
                         steps_per_s=result.steps_per_s, samples_per_s=result.samples_per_s,
                         expected_hours=expected_s / 3600.0, compute_hours=compute_s / 3600.0,
                         meets_deadline=meets)
    return ChoiceRow(
        candidate.name, shape, True, "", steps_per_s=result.steps_per_s,
        samples_per_s=result.samples_per_s, peak_host_rss_mb=result.peak_host_rss_mb,
        peak_accelerator_mb=result.peak_accelerator_mb, expected_hours=expected_s / 3600.0,
        compute_hours=compute_s / 3600.0,
        spot_cost=billed_spot_h * spot_price, standard_cost=compute_s / 3600.0 * standard_price,
        meets_deadline=meets)


def _hours(h: float | None) -> str:
    return "?" if h is None else f"{h:.2f} h"


def _unfit_warning(candidates: Sequence[HardwareCandidate],
                   results: Mapping[str, ProbeResult]) -> str:
    """Why no candidate is fit, as it is: failed probes, probes that gave no answer, or none."""
    unprobed = [c.name for c in candidates if c.name not in results]
    infra = [c.name for c in candidates if c.name in results and results[c.name].infra]
    if not unprobed and not infra:
        return "every candidate failed its probe; the run cannot start on any of them"
    parts = []
    if unprobed:
        parts.append(f"not probed (no fresh result: never probed, or expired): "
                     f"{', '.join(unprobed)}")
    if infra:
        parts.append(f"the probe gave no answer (could not run; not held against the "
                     f"candidate): {', '.join(infra)}")
    return "no candidate has a usable probe result; " + "; ".join(parts)


def choose(pipeline: Pipeline, results: Mapping[str, ProbeResult],
           deadline_s: float | None = None, outlook: Outlook = NO_HISTORY,
           prices: PriceTable = LIST_PRICES) -> HardwareChoice:
    """The cheapest fit candidate (expected Spot cost) expected to meet the deadline; ties: the
    faster. None meets it: the fastest fit one, with a warning. None fit: no choice, a warning.

    `deadline_s`: time left for the run (the pipeline's deadline minus time already spent,
    probes included); None: no deadline.
    """
    search = pipeline.hardware
    if search is None:
        return HardwareChoice((), None, "the pipeline lists no hardware candidates")
    rows = [_row(pipeline, c, results.get(c.name), deadline_s, outlook, prices)
            for c in search.candidates]
    fit = [r for r in rows if r.fit]
    if not fit:
        return HardwareChoice(tuple(rows), None, "no candidate is fit",
                              warning=_unfit_warning(search.candidates, results),
                              deadline_s=deadline_s)
    meeting = [r for r in fit if r.meets_deadline is not False]
    warning = ""
    if meeting:
        best = min(meeting, key=lambda r: (r.spot_cost or 0.0, r.expected_hours or 0.0))
        others = [r for r in meeting if r is not best]
        reason = (f"{best.candidate}: cheapest expected Spot cost ({best.spot_cost:.4f}) "
                  + ("of the fit candidates" if deadline_s is None else
                     f"among those expected to meet the deadline ({_hours(best.expected_hours)} "
                     f"<= {_hours(deadline_s / 3600.0)})")
                  + (f"; beats {', '.join(r.candidate for r in others)}" if others else ""))
    else:
        best = min(fit, key=lambda r: (r.expected_hours or 0.0, r.spot_cost or 0.0))
        reason = f"{best.candidate}: the fastest fit candidate ({_hours(best.expected_hours)})"
        warning = (f"no candidate is expected to meet the deadline ({_hours((deadline_s or 0.0) / 3600.0)}"
                   f" left); the fastest is {_hours(best.expected_hours)}")
    marked = []
    for r in rows:
        if r is best:
            r = replace(r, chosen=True, reason="chosen")
        elif r.fit and r.meets_deadline is False:
            r = replace(r, reason=f"expected {_hours(r.expected_hours)}, misses the deadline")
        elif r.fit:
            r = replace(r, reason=f"costs more ({r.spot_cost:.4f} on Spot)" if
                        (r.spot_cost or 0.0) > (best.spot_cost or 0.0) else "slower at the "
                        "same cost")
        marked.append(r)
    compute_s = None if best.compute_hours is None else best.compute_hours * 3600.0
    return HardwareChoice(tuple(marked), best.candidate, reason, warning, compute_s, deadline_s)


# --- the table as text (spotorch advise, spotorch show) -----------------------------------------

_COLUMNS = ("candidate", "shape", "steps/s", "samples/s", "peak RSS", "hours", "spot cost",
            "standard cost", "fits", "")


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def table_lines(choice: HardwareChoice) -> list[str]:
    """The table, one line per candidate, then the reason and any warning."""
    cells = [list(_COLUMNS)]
    for r in choice.rows:
        fits = ("yes" if r.meets_deadline is not False else "misses deadline") if r.fit else "no"
        cells.append([r.candidate + (" *" if r.chosen else ""), r.shape,
                      _fmt(r.steps_per_s, ".2f"), _fmt(r.samples_per_s, ".1f"),
                      _fmt(r.peak_host_rss_mb, ".0f") + (" MB" if r.peak_host_rss_mb else ""),
                      _fmt(r.expected_hours, ".3f"), _fmt(r.spot_cost, ".4f"),
                      _fmt(r.standard_cost, ".4f"), fits, r.reason])
    widths = [max(len(row[i]) for row in cells) for i in range(len(_COLUMNS))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
             for row in cells]
    lines.append(f"chosen: {choice.reason}")
    if choice.warning:
        lines.append(f"warning: {choice.warning}")
    return lines
