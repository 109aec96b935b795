"""`spotorch simulate`: replay Spot traces through the escalation policies.

The model is described in spotorch.sim.replay; the parts live in spotorch.sim.model (traces,
scenario, windows), .replay (one online policy on one window, visible or production view),
.optimal (the offline optimum) and .evaluate (many windows, aggregates). This module is the
command line, and re-exports those names for callers of the old single module.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import click

from spotorch.commandline import run
from spotorch.sim.evaluate import (
    POLICIES,
    PolicySummary,
    RunRecord,
    evaluate,
    evaluate_files,
    evaluate_trace,
    format_table,
    summarize,
)
from spotorch.sim.model import (
    Flex,
    FlexWait,
    Outcome,
    Probes,
    RegionChoice,
    Scenario,
    ScenarioError,
    SimulateError,
    Trace,
    TraceError,
    View,
    Window,
    find_trace_files,
    load_trace,
    resample,
    windows_of,
    zone_windows,
)
from spotorch.sim.optimal import brute_force, optimal, optimal_at
from spotorch.sim.replay import OnlinePolicy, online_policies, run_online, run_standard

__all__ = [
    "POLICIES", "TRACES_ENV", "Flex", "FlexWait", "OnlinePolicy", "Outcome", "PolicySummary",
    "Probes", "RegionChoice", "RunRecord", "Scenario", "ScenarioError", "SimulateError",
    "Trace", "TraceError",
    "View", "Window", "brute_force", "default_trace_paths", "evaluate", "evaluate_files",
    "evaluate_trace", "find_trace_files", "format_table", "load_trace", "main",
    "online_policies", "optimal", "optimal_at", "resample", "run_online", "run_standard", "summarize",
    "windows_of", "zone_windows",
]

TRACES_ENV = "SPOTORCH_TRACES"
REPO_ROOT = Path(__file__).resolve().parents[3]  # shared/spotorch/sim/simulate.py
# The public spot-traces ship inside the package (2 MB; traces/README.md says where they come from),
# so `spotorch simulate` works from a clone with nothing beside it.
DEFAULT_TRACES = Path(__file__).resolve().parent / "traces"


# ---------------------------------------------------------------------------------------------
# Command line


def default_trace_paths() -> list[Path]:
    """SPOTORCH_TRACES (os.pathsep-separated) if set, else the traces shipped in spotorch.sim."""
    env = os.environ.get(TRACES_ENV)
    if env:
        return [Path(p) for p in env.split(os.pathsep) if p]
    return [DEFAULT_TRACES]


def _hours(value: float) -> float:
    return round(value * 3600.0)


@click.command(name="simulate")
@click.argument("traces", nargs=-1, type=click.Path(path_type=Path), metavar="[TRACE]...")
@click.option("--task-hours", default=48.0, help="Compute the task needs on standard VMs.")
@click.option("--deadline-hours", default=60.0, help="Time from start to the deadline.")
@click.option("--restart-overhead-hours", default=0.2, help="Lost to each (re)start.")
@click.option("--checkpoint-interval-hours", type=float, default=None,
              help="Work between checkpoints  [default: every tick]")
@click.option("--price-ratio", default=3.0,
              help="On-demand / Spot price (applied to the trace's mean Spot price when it has "
                   "prices).")
@click.option("--on-demand-price", type=float, default=None,
              help="On-demand price per node-hour (overrides --price-ratio).")
@click.option("--tick-minutes", default=5.0, help="Decision interval of the policies.")
@click.option("--window-stride-hours", type=float, default=None,
              help="Replay windows starting this far apart  [default: one per trace]")
@click.option("--nodes", default=1,
              help="Spot counts as available when the trace's count is at least this.")
@click.option("--count-after", default=3, help="Preemptions before the count policy escalates.")
@click.option("--view", type=click.Choice([v.value for v in View]), default=View.PRODUCTION.value,
              help="visible: Spot availability known at every tick (the papers' setting); "
                   "production: only what production observes, its own attempts and its Spot "
                   "probes.")
@click.option("--spot-cooldown-minutes", default=120.0,
              help="Production view: after Spot was seen unavailable, no switch back before "
                   "this (RecoveryPolicy.spot_cooldown_s); without probes, standard assumes "
                   "Spot back after it.")
@click.option("--no-probes", is_flag=True,
              help="Production view without Spot probes (standard only assumes).")
@click.option("--probe-billed-seconds", default=Probes.billed_s,
              help="Billed time of a probe that found capacity, at the Spot price.")
@click.option("--probe-latency-seconds", default=Probes.latency_s,
              help="From capacity found to the run knowing.")
@click.option("--probe-wait-seconds", default=Probes.wait_s,
              help="A probe without capacity this long is cancelled.")
@click.option("--flex", is_flag=True,
              help="Offer FLEX_START (Dynamic Workload Scheduler) to the policies.")
@click.option("--flex-price-ratio", default=Flex.price_ratio,
              help="FLEX_START price as a fraction of the on-demand price.")
@click.option("--flex-max-wait-hours", default=Flex.max_wait_s / 3600,
              help="Longest FLEX_START queue wait.")
@click.option("--flex-mean-wait-minutes", default=Flex.mean_wait_s / 60,
              help="Mean FLEX_START queue wait.")
@click.option("--flex-wait", type=click.Choice([w.value for w in FlexWait]),
              default=Flex.wait.value, help="Distribution of FLEX_START queue waits.")
@click.option("--seed", default=0, help="Seed of the FLEX_START waits.")
@click.option("--policies", default=",".join(POLICIES), help="Policies to replay (commas).")
@click.option("--workers", default=1, help="Processes replaying windows in parallel.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.option("--multi-region", is_flag=True,
              help="The traces are the zones of one run, aligned tick by tick (a zone per "
                   "file, named by its first part: us-east-1a_v100_1.json); moves between "
                   "regions are priced (spotorch.sim.multi_region).")
@click.option("--spot-price", default=1.0,
              help="Multi-region: Spot price per node-hour of every zone (on-demand: "
                   "--price-ratio x it, or --on-demand-price).")
@click.option("--region-prices", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help='Multi-region: JSON {"region or zone": {"spot": $/h, "standard": $/h}}.')
@click.option("--checkpoint-gb", default=0.0, help="Multi-region: checkpoint size, GB.")
@click.option("--data-gb", default=0.0,
              help="Multi-region: data an attempt outside the data's region reads, GB.")
@click.option("--data-region", default=None,
              help="Multi-region: where the data lives  [default: the first zone's region]")
@click.option("--egress-per-gb", type=float, default=None,
              help="Multi-region: $/GB between regions  [default: Google's inter-region "
                   "rates, core.regions.egress_per_gb]")
@click.option("--zone-order", type=click.Choice([c.value for c in RegionChoice]),
              default=RegionChoice.HISTORY.value,
              help="Multi-region, production view: zones the run has not seen are tried in "
                   "the shared record's order (history) or as given (fixed).")
@click.option("--transfer-gbps", default=8.0,
              help="Multi-region: inter-region copy rate, gigabits per second.")
@click.option("--plot", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Write cost vs deadline slack per policy (PNG).")
@click.option("--plot-deadline-hours", type=float, multiple=True,
              help="A deadline swept by --plot (repeat)  [default: task + 4, 12, 24, 48 h]")
@click.option("--pipeline", "pipeline_file", type=click.Path(dir_okay=False, path_type=Path),
              default=None,
              help="Task (recovery.expected_compute), deadline, restart overhead, nodes and "
                   "prices (the price table's, for its shape) from this pipeline file; options "
                   "given here win.")
def simulate(**options: Any) -> None:
    """Replay Spot traces (files or folders; default: $SPOTORCH_TRACES, else the shipped traces
    beside the repository) through the escalation policies and the offline optimum."""
    args = SimpleNamespace(**options)
    if args.pipeline_file is not None:
        context = click.get_current_context()
        args.explicit = {name for name in options
                         if context.get_parameter_source(name)
                         is click.core.ParameterSource.COMMANDLINE}
    code = _simulate(args)
    if code:
        raise click.exceptions.Exit(code)


def scenario_from_args(args: Any, deadline_hours: float) -> Scenario:
    """The scenario the command line's options describe, for one deadline."""
    checkpoint = args.checkpoint_interval_hours
    return Scenario(task_s=_hours(args.task_hours), deadline_s=_hours(deadline_hours),
                    overhead_s=_hours(args.restart_overhead_hours),
                    step_s=round(args.tick_minutes * 60.0),
                    checkpoint_s=None if checkpoint is None else _hours(checkpoint),
                    nodes=args.nodes, price_ratio=args.price_ratio,
                    od_price=args.on_demand_price, count_after=args.count_after,
                    spot_price=getattr(args, "spot_price", None),
                    view=View(args.view), spot_cooldown_s=round(args.spot_cooldown_minutes * 60.0),
                    probes=None if args.no_probes else Probes(
                        billed_s=args.probe_billed_seconds, latency_s=args.probe_latency_seconds,
                        wait_s=args.probe_wait_seconds),
                    flex=None if not args.flex else Flex(
                        price_ratio=args.flex_price_ratio,
                        max_wait_s=args.flex_max_wait_hours * 3600.0,
                        mean_wait_s=args.flex_mean_wait_minutes * 60.0,
                        wait=FlexWait(args.flex_wait), seed=args.seed))


@dataclass(frozen=True)
class SweepPoint:
    """Summaries at one deadline, for the plot."""

    slack_hours: float
    summary: Mapping[str, PolicySummary] = field(default_factory=dict)


def plot_sweep(points: Sequence[SweepPoint], path: Path) -> None:
    """Mean cost per policy against deadline slack."""
    import matplotlib  # why lazy: only --plot needs it, and it is slow to import

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8.5, 4.5))
    for name in points[0].summary:
        ax.plot([p.slack_hours for p in points], [p.summary[name].mean_cost for p in points],
                marker="o", label=name)
    ax.set_xlabel("deadline slack (hours beyond the task)")
    ax.set_ylabel("mean cost per run")
    ax.set_title("spotorch simulate: cost vs deadline slack")
    ax.grid(True, alpha=0.3)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    """Entry point of `spotorch simulate` (python -m spotorch.sim.simulate); the exit code."""
    return run(simulate, argv, prog_name="spotorch simulate")


def _simulate(args: SimpleNamespace) -> int:
    if args.multi_region:
        from spotorch.sim.multi_region import simulate_multi  # why lazy: its own mode

        try:
            scenario = scenario_from_args(args, args.deadline_hours)
        except SimulateError as exc:
            print(f"spotorch simulate: {exc}", file=sys.stderr)
            return 2
        return simulate_multi(args, scenario)
    policies = tuple(p.strip() for p in args.policies.split(",") if p.strip())
    try:
        terms = _from_pipeline(args) if getattr(args, "pipeline_file", None) else None
        files = find_trace_files(list(args.traces) or default_trace_paths())
        scenario = scenario_from_args(args, args.deadline_hours)
        records = evaluate_files(files, scenario, _stride(args), policies, args.workers)
        if not records:
            raise TraceError("no trace is long enough for the deadline")
        summary = summarize(records)
        if args.plot is not None:
            deadlines = list(args.plot_deadline_hours) or [args.task_hours + h
                                                           for h in (4, 12, 24, 48)]
            points = [SweepPoint(d - args.task_hours, summarize(evaluate_files(
                files, scenario_from_args(args, d), _stride(args), policies, args.workers)))
                for d in sorted(deadlines)]
            plot_sweep(points, args.plot)
    except SimulateError as exc:
        print(f"spotorch simulate: {exc}", file=sys.stderr)
        return 2
    if args.as_json:
        payload: dict[str, Any] = {"runs": len(records), "view": scenario.view.value,
                                   "policies": {name: s.as_json()
                                                for name, s in summary.items()}}
        if terms is not None:
            payload |= {**terms.to_json(), "costs_in": _costs_in(terms), "task_hours": args.task_hours,
                        "deadline_hours": args.deadline_hours,
                        "restart_overhead_hours": args.restart_overhead_hours,
                        "nodes": args.nodes}
        print(json.dumps(payload))
    else:
        print(f"{len(records)} runs over {len(files)} trace files; task {args.task_hours:g} h, "
              f"deadline {args.deadline_hours:g} h, overhead {args.restart_overhead_hours:.3g} h; "
              f"{describe_view(scenario)}")
        print(f"costs in {_costs_in(terms)}")
        print(format_table(summary))
    return 0


def _costs_in(terms: Any) -> str:
    if terms is None:
        return ("Spot node-hours (Spot = 1; a trace with prices: its own), on-demand at "
                "--price-ratio or --on-demand-price")
    return (f"{terms.currency}: the price table's {terms.shape} for pipeline {terms.name}, "
            f"Spot {terms.spot_per_node_hour:.4f} and standard "
            f"{terms.standard_per_node_hour:.4f} per node-hour (traces with prices scaled to "
            "that Spot mean)")


def _from_pipeline(args: Any) -> Any:
    """Fill args from the pipeline file (what the command line gave explicitly wins)."""
    from spotorch.sim.pipeline_terms import on_grid, pipeline_terms

    terms = pipeline_terms(args.pipeline_file)
    given: set[str] = getattr(args, "explicit", set())
    taken = {"task_hours": terms.task_hours, "deadline_hours": terms.deadline_hours,
             "restart_overhead_hours": terms.overhead_hours, "nodes": terms.nodes,
             "on_demand_price": terms.standard_per_node_hour}
    for name, value in taken.items():
        if name not in given and value is not None:
            setattr(args, name, value)
    if "task_hours" not in given and terms.task_hours is None:
        raise ScenarioError(f"--pipeline {args.pipeline_file}: recovery.expected_compute is not "
                            "set; give --task-hours")
    if "deadline_hours" not in given and terms.deadline_hours is None:
        raise ScenarioError(f"--pipeline {args.pipeline_file}: no deadline; give "
                            "--deadline-hours")
    args.spot_price = terms.spot_per_node_hour
    task_s, deadline_s = on_grid(args.task_hours * 3600.0, args.deadline_hours * 3600.0,
                                 round(args.restart_overhead_hours * 3600.0),
                                 round(args.tick_minutes * 60.0))
    args.task_hours, args.deadline_hours = task_s / 3600.0, deadline_s / 3600.0
    return terms


def describe_view(scenario: Scenario) -> str:
    """One line saying what the policies could see."""
    if scenario.view is View.VISIBLE:
        return "view visible (Spot availability known at every tick)"
    probes = scenario.probes
    seen = "no probes: standard assumes Spot back after the cooldown" if probes is None else (
        f"probes billed {probes.billed_s:.0f} s at the Spot price, latency "
        f"{probes.latency_s:.0f} s, wait {probes.wait_s:.0f} s")
    return f"view production (cooldown {scenario.spot_cooldown_s / 60:.0f} min; {seen})"


def _stride(args: Any) -> float | None:
    hours: float | None = args.window_stride_hours
    return None if hours is None else hours * 3600.0


if __name__ == "__main__":
    raise SystemExit(main())
