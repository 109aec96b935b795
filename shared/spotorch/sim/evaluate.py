"""Replaying many windows through many policies, and their aggregates."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from spotorch.sim.model import Outcome, Scenario, ScenarioError, Window, load_trace, windows_of
from spotorch.sim.optimal import optimal
from spotorch.sim.replay import online_policies, run_online, run_standard

POLICIES = ("standard", "greedy", "count", "deadline", "uniform_progress", "optimal")

@dataclass(frozen=True)
class RunRecord:
    """Every policy's outcome on one window."""

    trace: str
    family: str
    start_s: float
    outcomes: Mapping[str, Outcome]


def evaluate(windows: Sequence[Window], scenario: Scenario,
             policies: Sequence[str] = POLICIES) -> list[RunRecord]:
    """Replay every window through every named policy."""
    unknown = set(policies) - set(POLICIES)
    if unknown:
        raise ScenarioError(f"unknown policies: {sorted(unknown)}")
    online = online_policies(scenario)
    best = optimal(windows, scenario) if "optimal" in policies else None
    records = []
    for index, window in enumerate(windows):
        outcomes: dict[str, Outcome] = {}
        for name in policies:
            if name == "optimal":
                assert best is not None
                outcomes[name] = best[index]
            elif name == "standard":
                outcomes[name] = run_standard(window, scenario)
            else:
                outcomes[name] = run_online(window, scenario, online[name])
        records.append(RunRecord(window.trace, window.family, window.start_s, outcomes))
    return records


def evaluate_trace(job: tuple[Path, Path | None, Scenario, float | None, tuple[str, ...]]
                   ) -> list[RunRecord]:
    """One trace file's windows (a top-level function, so worker processes can run it)."""
    path, root, scenario, stride_s, policies = job
    return evaluate(windows_of(load_trace(path, root), scenario, stride_s), scenario, policies)


def evaluate_files(files: Sequence[tuple[Path, Path | None]], scenario: Scenario,
                   stride_s: float | None, policies: Sequence[str] = POLICIES,
                   workers: int = 1) -> list[RunRecord]:
    """Evaluate many trace files, in worker processes when workers > 1."""
    jobs = [(path, root, scenario, stride_s, tuple(policies)) for path, root in files]
    if workers <= 1:
        return [r for job in jobs for r in evaluate_trace(job)]
    import multiprocessing  # why lazy: most callers run one process

    with multiprocessing.get_context("fork").Pool(workers) as pool:
        return [r for part in pool.map(evaluate_trace, jobs, chunksize=1) for r in part]


@dataclass(frozen=True)
class PolicySummary:
    """Aggregates of one policy over many windows."""

    mean_cost: float
    p95_cost: float
    deadline_met_fraction: float
    mean_cost_ratio_to_optimal: float | None
    mean_preemptions: float
    mean_changeovers: float
    mean_probes: float = 0.0
    mean_probe_cost: float = 0.0

    def as_json(self) -> dict[str, float | None]:
        """The summary as `spotorch simulate --json` prints it."""
        return {"mean_cost": self.mean_cost, "p95_cost": self.p95_cost,
                "deadline_met_fraction": self.deadline_met_fraction,
                "mean_cost_ratio_to_optimal": self.mean_cost_ratio_to_optimal,
                "mean_preemptions": self.mean_preemptions,
                "mean_changeovers": self.mean_changeovers,
                "mean_probes": self.mean_probes, "mean_probe_cost": self.mean_probe_cost}


def summarize(records: Sequence[RunRecord]) -> dict[str, PolicySummary]:
    """Per-policy aggregates; ratios are taken per window against the optimum, then averaged."""
    if not records:
        return {}
    names = list(records[0].outcomes)
    best = (np.array([r.outcomes["optimal"].cost for r in records])
            if "optimal" in names else None)
    out = {}
    for name in names:
        outcomes = [r.outcomes[name] for r in records]
        costs = np.array([o.cost for o in outcomes])
        ratio = None
        if best is not None:
            ok = np.isfinite(best) & (best > 0)
            ratio = float(np.mean(costs[ok] / best[ok])) if ok.any() else None
        out[name] = PolicySummary(
            mean_cost=float(np.mean(costs)), p95_cost=float(np.percentile(costs, 95)),
            deadline_met_fraction=float(np.mean([o.met_deadline for o in outcomes])),
            mean_cost_ratio_to_optimal=ratio,
            mean_preemptions=float(np.mean([o.preemptions for o in outcomes])),
            mean_changeovers=float(np.mean([o.changeovers for o in outcomes])),
            mean_probes=float(np.mean([o.probes for o in outcomes])),
            mean_probe_cost=float(np.mean([o.probe_cost for o in outcomes])))
    return out


def format_table(summary: Mapping[str, PolicySummary]) -> str:
    """A fixed-width table of the summary."""
    lines = [f"{'policy':<17}{'mean cost':>11}{'p95 cost':>11}{'met':>8}{'vs opt':>9}"
             f"{'preempt':>9}{'switches':>9}{'probes':>8}{'probe $':>9}"]
    for name, s in summary.items():
        ratio = "-" if s.mean_cost_ratio_to_optimal is None else \
            f"{s.mean_cost_ratio_to_optimal:.3f}"
        lines.append(f"{name:<17}{s.mean_cost:>11.2f}{s.p95_cost:>11.2f}"
                     f"{s.deadline_met_fraction:>8.3f}{ratio:>9}"
                     f"{s.mean_preemptions:>9.2f}{s.mean_changeovers:>9.2f}"
                     f"{s.mean_probes:>8.1f}{s.mean_probe_cost:>9.2f}")
    return "\n".join(lines)
