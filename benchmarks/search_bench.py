"""How fast each search finds a good trial: vizier against random and grid, same trial budget.

    .venv/bin/python benchmarks/search_bench.py [--seeds 7] [--budget 32] [--json] [--emulator]

Objectives with a known optimum, each searched by the three of spotorch's sweep searches with
the same number of trials, one trial at a time:

- `surface`: a validation loss over log10(lr), log2(batch size) and dropout, a bowl with an
  interaction term; its minimum is 0.25 at lr = 10**-2.5, batch 64, dropout 0.2.
- `branin`: the Branin function on [-5, 10] x [0, 15]; its minimum is 0.397887.
- `tradeoff` (two objectives): validation loss and p95 latency over lr and the layer width; the
  hypervolume of each search's front against a fixed reference point, and its share of the true
  front's (measured on a dense grid of 40,000 points).
- `trainer`: the example trainer (examples/trainer, spotorch_example.train's numpy MLP, 300
  steps on 3,000 synthetic rows, in process): held-out loss over lr, hidden width, weight decay
  and momentum. Its optimum is not known: "within 1%" is of the best value any search found.

`grid` is spotorch's grid (the cartesian product of each parameter's values, in order, cut at
the budget), `random` spotorch's own draws (core.sweeps.trial_params with the seed), `vizier` the
Vertex emulator's optimizer (Optuna's TPE behind spotorch.adapters.memory.vizier; --emulator goes
through the emulator's VizierService and the real aiplatform_v1 client instead). Per objective
and search it reports, over the seeds, the median number of trials to get within 1% of the
optimum (None: never within the budget) and the median best value; the target: vizier reaches
random's best of `budget` trials within budget/2 trials on the median seed (exit 1 if missed).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO / "shared"), str(REPO / "trainer")]

from spotorch.core.pareto import Objective, hypervolume
from spotorch.core.sweep_spec import Goal, Parameter, Scale, SearchKind, SweepSpec
from spotorch.core.sweeps import trial_params
from spotorch.ports.vizier import StudyConfig, TrialSearch

Params = Mapping[str, Any]
LOSS, LATENCY = Objective("loss", Goal.MINIMIZE), Objective("latency_p95_ms", Goal.MINIMIZE)


@dataclass(frozen=True)
class Problem:
    """An objective with a known optimum, its search space for random/vizier and for grid."""

    name: str
    space: tuple[Parameter, ...]
    grid: tuple[Parameter, ...]  # the same parameters as lists of values
    value: Callable[[Params], Mapping[str, float]]
    objectives: tuple[Objective, ...]
    optimum: float | None = None  # single objective: the minimum (None: the best found)
    reference: Mapping[str, float] | None = None  # several: the hypervolume's reference point


def _surface(p: Params) -> Mapping[str, float]:
    a = math.log10(float(p["lr"])) + 2.5
    b = (math.log2(float(p["batch"])) - 6.0) / 2.0
    c = (float(p["dropout"]) - 0.2) / 0.2
    return {"loss": 0.25 + 0.08 * a * a + 0.03 * b * b + 0.02 * c * c + 0.03 * a * b}


def _branin(p: Params) -> Mapping[str, float]:
    x1, x2 = float(p["x1"]), float(p["x2"])
    return {"loss": (x2 - 5.1 / (4 * math.pi ** 2) * x1 ** 2 + 5 / math.pi * x1 - 6) ** 2
            + 10 * (1 - 1 / (8 * math.pi)) * math.cos(x1) + 10}


def _tradeoff(p: Params) -> Mapping[str, float]:
    a = math.log10(float(p["lr"])) + 2.5
    width = float(p["width"])
    return {"loss": 0.2 + 0.1 * a * a + 2.0 / math.sqrt(width),
            "latency_p95_ms": 0.5 + 0.02 * width}


_TRAINER: dict[str, Any] = {}


def _trainer(p: Params) -> Mapping[str, float]:
    """The example trainer's held-out loss after 300 steps with these hyperparameters."""
    import importlib

    if not _TRAINER:
        sys.path[:0] = [str(REPO / "examples"), str(REPO / "examples" / "trainer")]
        make_data = importlib.import_module("make_data")
        train = importlib.import_module("spotorch_example.train")
        x, y = make_data.make_dataset(rows=3000, features=16, classes=3, seed=0)
        _TRAINER.update(train=train, data=train.split(x, y, 0.2, 0, "bench"))
    train, data = _TRAINER["train"], _TRAINER["data"]
    import numpy as np

    cfg = train.Config(total_steps=300, lr=float(p["lr"]), hidden=int(p["hidden"]),
                       weight_decay=float(p["weight_decay"]), momentum=float(p["momentum"]))
    state = train.fresh_state(cfg, data)
    rng = np.random.Generator(np.random.PCG64())
    rng.bit_generator.state = state["rng"]
    with np.errstate(all="ignore"):
        for step in range(cfg.total_steps):
            train.train_step(cfg, state, rng, data, step)
        loss = float(train.evaluate(cfg, state["params"], data)["test_loss"])
    return {"loss": loss if math.isfinite(loss) else 10.0}  # a diverged model: a poor value


def _values(low: float, high: float, n: int, log: bool = False) -> tuple[float, ...]:
    if log:
        return tuple(round(10 ** (math.log10(low) + i * (math.log10(high) - math.log10(low))
                                  / (n - 1)), 8) for i in range(n))
    return tuple(round(low + i * (high - low) / (n - 1), 6) for i in range(n))


PROBLEMS = (
    Problem("surface",
            (Parameter("lr", low=1e-5, high=1.0, scale=Scale.LOG),
             Parameter("batch", low=8, high=512, scale=Scale.LOG, integer=True),
             Parameter("dropout", low=0.0, high=0.6)),
            (Parameter("lr", values=_values(1e-5, 1.0, 4, log=True)),
             Parameter("batch", values=(8, 32, 128, 512)),
             Parameter("dropout", values=(0.0, 0.5))),
            _surface, (LOSS,), optimum=0.25),
    Problem("branin", (Parameter("x1", low=-5.0, high=10.0), Parameter("x2", low=0.0, high=15.0)),
            (Parameter("x1", values=_values(-5, 10, 6)), Parameter("x2", values=_values(0, 15, 6))),
            _branin, (LOSS,), optimum=0.397887),
    Problem("tradeoff",
            (Parameter("lr", low=1e-5, high=1.0, scale=Scale.LOG),
             Parameter("width", low=4, high=1024, scale=Scale.LOG, integer=True)),
            (Parameter("lr", values=_values(1e-5, 1.0, 4, log=True)),
             Parameter("width", values=(4, 16, 64, 256, 512, 768, 896, 1024))),
            _tradeoff, (LOSS, LATENCY), reference={"loss": 2.0, "latency_p95_ms": 25.0}),
    Problem("trainer",
            (Parameter("lr", low=1e-3, high=1.0, scale=Scale.LOG),
             Parameter("hidden", low=4, high=256, scale=Scale.LOG, integer=True),
             Parameter("weight_decay", low=1e-6, high=1e-1, scale=Scale.LOG),
             Parameter("momentum", low=0.0, high=0.95)),
            (Parameter("lr", values=(0.001, 0.01, 0.1, 1.0)), Parameter("hidden", values=(4, 32)),
             Parameter("weight_decay", values=(1e-5, 1e-3)),
             Parameter("momentum", values=(0.5, 0.9))),
            _trainer, (LOSS,)),
)


def _grid(problem: Problem, budget: int) -> list[Params]:
    return list(trial_params(SweepSpec(parameters=problem.grid, search=SearchKind.GRID,
                                       trials=budget)))


def _random(problem: Problem, budget: int, seed: int) -> list[Params]:
    return list(trial_params(SweepSpec(parameters=problem.space, search=SearchKind.RANDOM,
                                       trials=budget, seed=seed)))


def _vizier(problem: Problem, budget: int, seed: int, search: TrialSearch,
            name: str) -> list[Mapping[str, float]]:
    study = search.study(StudyConfig(display_name=name, region="us-central1",
                                     parameters=problem.space, objectives=problem.objectives))
    values = []
    for i in range(budget):
        trial, = search.suggest(study, f"{name}-t{i + 1}")
        got = problem.value(trial.params)
        search.complete(trial.name, {o.name: got[o.name] for o in problem.objectives})
        values.append(got)
    return values


def trials_to(values: Sequence[float], target: float) -> int | None:
    """The first trial (1-based) whose best so far is at most the target."""
    best = math.inf
    for i, v in enumerate(values, start=1):
        best = min(best, v)
        if best <= target:
            return i
    return None


def _median(xs: Sequence[int | None], budget: int) -> float | None:
    """Median trials, a miss counting as past the budget (None when the median is a miss)."""
    m = statistics.median([x if x is not None else budget + 1 for x in xs])
    return None if m > budget else m


def _true_front_hv(problem: Problem) -> float:
    lr, width = problem.space
    assert lr.low is not None and lr.high is not None and width.low is not None \
        and width.high is not None
    pts = [problem.value({"lr": 10 ** (math.log10(lr.low) + i / 199 * math.log10(lr.high / lr.low)),
                          "width": round(width.low * (width.high / width.low) ** (j / 199))})
           for i in range(200) for j in range(200)]
    assert problem.reference is not None
    # Two objectives, both minimised: sorted by the first, the front is each point whose second
    # is below every earlier one's (the pure core.pareto.front is quadratic: for trial counts).
    first, second = (o.name for o in problem.objectives)
    kept, low = [], math.inf
    for p in sorted(pts, key=lambda q: (q[first], q[second])):
        if p[second] < low:
            kept.append(p)
            low = p[second]
    return hypervolume(kept, problem.objectives, problem.reference)


def run(seeds: int, budget: int, emulator: Any = None) -> dict[str, Any]:
    """Every problem, search and seed: the figures per problem and search."""
    from spotorch.adapters.memory.vizier import MemoryTrialSearch

    out: dict[str, Any] = {"budget": budget, "seeds": seeds, "problems": {}}
    for problem in PROBLEMS:
        per: dict[str, dict[str, list[Any]]] = {s: {"values": [], "time_s": []}
                                                for s in ("vizier", "random", "grid")}
        for seed in range(seeds):
            search = emulator(seed) if emulator else MemoryTrialSearch(seed=seed)
            started = time.perf_counter()
            per["vizier"]["values"].append(_vizier(problem, budget, seed, search,
                                                   f"{problem.name}-{seed}"))
            per["vizier"]["time_s"].append(time.perf_counter() - started)
            per["random"]["values"].append([problem.value(p) for p in
                                            _random(problem, budget, seed)])
            per["grid"]["values"].append([problem.value(p) for p in _grid(problem, budget)])
        out["problems"][problem.name] = _figures(problem, per, budget)
    return out


def _figures(problem: Problem, per: Mapping[str, Mapping[str, list[Any]]],
             budget: int) -> dict[str, Any]:
    result: dict[str, Any] = {"objectives": [o.name for o in problem.objectives]}
    if problem.reference is None:
        optimum = problem.optimum if problem.optimum is not None else min(
            v["loss"] for got in per.values() for run in got["values"] for v in run)
        result["optimum" if problem.optimum is not None else "best_found"] = round(optimum, 6)
        target = optimum * 1.01
        for name, got in per.items():
            losses = [[v["loss"] for v in run] for run in got["values"]]
            result[name] = {
                "trials_to_1pct": _median([trials_to(ls, target) for ls in losses], budget),
                "reached_1pct": sum(trials_to(ls, target) is not None for ls in losses),
                "median_best": statistics.median(min(ls) for ls in losses)}
        vizier = [[v["loss"] for v in r] for r in per["vizier"]["values"]]
        random_best = [min(v["loss"] for v in r) for r in per["random"]["values"]]
        reach = [trials_to(v, best) for v, best in zip(vizier, random_best, strict=True)]
        result["vizier_trials_to_random_best"] = sorted(x if x is not None else budget + 1
                                                        for x in reach)
        result["vizier_median_trials_to_random_best"] = _median(reach, budget)
        result["target_met"] = (result["vizier_median_trials_to_random_best"] is not None
                                and result["vizier_median_trials_to_random_best"] <= budget / 2)
    else:
        best = _true_front_hv(problem)
        result["true_front_hypervolume"] = round(best, 4)
        for name, got in per.items():
            hvs = [hypervolume(run, problem.objectives, problem.reference) for run in got["values"]]
            result[name] = {"median_hypervolume": round(statistics.median(hvs), 4),
                            "share_of_true_front": round(statistics.median(hvs) / best, 4)}
    if per["vizier"]["time_s"]:
        result["vizier_s_per_trial"] = round(statistics.median(per["vizier"]["time_s"]) / budget, 4)
    return result


def _table(result: Mapping[str, Any]) -> str:
    lines = [f"budget {result['budget']} trials, {result['seeds']} seeds (medians over seeds)", ""]
    for name, fig in result["problems"].items():
        if "true_front_hypervolume" in fig:
            lines.append(f"{name} (hypervolume; true front {fig['true_front_hypervolume']}):")
            for s in ("vizier", "random", "grid"):
                lines.append(f"  {s:<7} {fig[s]['median_hypervolume']:>8}  "
                             f"({fig[s]['share_of_true_front']:.1%} of the true front's)")
        else:
            of = "the optimum" if "optimum" in fig else f"the best found ({fig['best_found']:.4g})"
            lines.append(f"{name}: trials to within 1% of {of} / seeds reaching it / median best")
            for s in ("vizier", "random", "grid"):
                lines.append(f"  {s:<7} {fig[s]['trials_to_1pct']!s:>6} / "
                             f"{fig[s]['reached_1pct']} / {fig[s]['median_best']:.4f}")
            lines.append(f"  vizier reaches random's best of {result['budget']} in "
                         f"{fig['vizier_median_trials_to_random_best']} trials on the median "
                         f"seed (all seeds: {fig['vizier_trials_to_random_best']}); target "
                         f"<= {result['budget'] // 2}: "
                         f"{'met' if fig['target_met'] else 'MISSED'}")
        lines.append("")
    return "\n".join(lines)


def _emulator_factory(stack: list[Any]) -> Callable[[int], TrialSearch]:
    """A Vertex emulator per seed (its seed seeds the suggestions), through the real client."""
    from spotorch.adapters.gcp.vizier import VertexTrialSearch
    from spotorch.local.vertex_emulator import VertexEmulator

    def make(seed: int) -> TrialSearch:
        for old in stack:
            old.stop()
        stack.clear()
        emulator = VertexEmulator("bench", seed=seed, job_events_topic=None)
        emulator.registry.operation_s = 0.0
        stack.append(emulator)
        return VertexTrialSearch("bench", endpoint=emulator.start())
    return make


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--seeds", type=int, default=7)
    parser.add_argument("--budget", type=int, default=32)
    parser.add_argument("--json", action="store_true", help="one JSON object on stdout")
    parser.add_argument("--emulator", action="store_true",
                        help="vizier through the Vertex emulator's VizierService over gRPC")
    args = parser.parse_args(argv)
    stack: list[Any] = []
    try:
        result = run(args.seeds, args.budget, _emulator_factory(stack) if args.emulator else None)
    finally:
        for emulator in stack:
            emulator.stop()
    result["command"] = "benchmarks/search_bench.py " + " ".join(argv or sys.argv[1:])
    print(json.dumps(result, indent=2) if args.json else _table(result))
    met = all(f.get("target_met", True) for f in result["problems"].values())
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
