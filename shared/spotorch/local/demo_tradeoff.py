"""The demo's trade-off story: a sweep searched by Vizier on quality, cost and latency.

The Vertex emulator's VizierService (Optuna's TPE, docs/vertex-emulator.md) suggests each
trial's learning rate and width; every trial trains the example MLP on Spot and measures its
prediction latency and model size on the held-out rows (spotorch_trainer.latency). Spot takes
back trial 3's first attempt (trials 1 and 2 pay the first install of the example package; the
third trains at once); the trial resumes from its checkpoint on the same Vizier trial. The
choice is the best test accuracy among the trials within the constraints (p95 latency at most
20 ms per request, the model at most 20 kB: small enough for the edge). The emulator is seeded,
so Vizier's first suggestions are the same each time. The report adds the sweep's search, each
trial's quality, cost, latency and attempts, the Pareto front and the constraints.

Registered in demo_scenarios.SCENARIOS by name; the settings are plain values so that this
module needs nothing of the demo's at import.
"""

from __future__ import annotations

from typing import Any

QUALITY = "test_accuracy"
CONSTRAINTS = {"latency_p95_ms": {"max": 20.0}, "model_size_bytes": {"max": 20000}}
# 400 steps of 0.03 s (12 s) outlast the preemption at 6 s even when the package is cached and
# the trial trains at once; a checkpoint every 25 steps leaves one to resume from by then.
_TRAINER_ENV = {"EXAMPLE_TOTAL_STEPS": "400", "EXAMPLE_STEP_SLEEP": "0.03",
                "EXAMPLE_CHECKPOINT_EVERY": "25", "EXAMPLE_PROGRESS_INTERVAL": "1",
                "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "LATENCY_BATCH_SIZE": "32",
                "EXAMPLE_EVAL_EVERY": "20"}  # held-out accuracy as it trains: Vizier's measurements


def extend(report: dict[str, Any], run: Any, stack: Any) -> None:
    """Add the trade-off: search, objectives, constraints, the front, the choice and why, and
    per trial its quality, cost, latency, model size, Vizier trial and attempts."""
    from spotorch.adapters.gcp.firestore import FirestoreDocumentStore
    from spotorch.adapters.gcp.vizier import VertexTrialSearch
    from spotorch.core.model import Run
    from spotorch.core.sweeps import Sweep, trade_off
    from spotorch.settings import COLLECTION_SWEEPS, Settings
    from spotorch.spec.loader import load_pipelines

    sweep_id = report.get("sweep_id")
    if not sweep_id:
        return
    docs = FirestoreDocumentStore(project=stack.project)
    settings = Settings.from_env()  # the demo talks to the stack's emulators as the functions do
    search = VertexTrialSearch(settings.project, endpoint=settings.vertex_endpoint,
                               token=settings.vertex_token)
    doc, _ = docs.get(COLLECTION_SWEEPS, sweep_id)
    if not doc:
        return
    sw = Sweep.from_dict(doc)
    pipeline = next(p for p in load_pipelines(stack.config.pipelines_dir) if p.name == sw.pipeline)
    assert pipeline.sweep is not None
    made = trade_off(sw, pipeline.sweep)
    trials = []
    for trial in sw.trials:
        run_doc, _ = docs.get("runs", trial.run_id)
        trial_run = Run.from_dict(run_doc) if run_doc else None
        attempts = [{"number": a.number, "state": str(a.state),
                     "failure_class": str(a.failure) if a.failure else None,
                     "resumed_from_step": a.resumed_from_step}
                    for a in (trial_run.attempts if trial_run else ())]
        measured = search.trial(trial.study_trial) if trial.study_trial else None
        trials.append({"trial": trial.number, "status": str(trial.status),
                       "metric": trial.metric, "step": trial.step,
                       "resumed_from_step": attempts[-1]["resumed_from_step"] if attempts else None,
                       "vizier": None if measured is None else {
                           "state": measured.state, "infeasible": measured.infeasible,
                           "measured_steps": [m.step for m in measured.measurements],
                           "final": dict(measured.final or {})},
                       "params": dict(trial.params), "study_trial": trial.study_trial,
                       QUALITY: trial.metrics.get(QUALITY), "cost": round(trial.cost, 6),
                       "latency_p50_ms": trial.metrics.get("latency_p50_ms"),
                       "latency_p95_ms": trial.metrics.get("latency_p95_ms"),
                       "model_size_bytes": trial.metrics.get("model_size_bytes"),
                       "preemptions": trial.preemptions, "attempts": attempts,
                       "experiment_run": trial.experiment_run})
    report.update(search=made["search"], objectives=made["objectives"],
                  constraints=made["constraints"], pareto=made["pareto"],
                  pareto_feasible=made["pareto_feasible"],
                  chosen=made["chosen"], why=made["why"], misses=made["misses"],
                  study=sw.study, trials=trials)


SETTINGS: dict[str, Any] = {
    "name": "tradeoff",
    "title": "a Vizier sweep of quality, cost and latency, one trial preempted",
    "setup": "A sweep of 4 trials searched by Vizier (the Vertex emulator's VizierService) over "
             "the learning rate and the hidden width, 2 at once on Spot, with 3 objectives "
             "(test accuracy up, p95 latency and cost down) and constraints: latency_p95_ms at "
             "most 20 ms per request, model_size_bytes at most 20000; Spot preempts trial 3's "
             "attempt 1 after 6 s; the Vertex emulator's suggestions are seeded (0).",
    "expected_status": "SUCCEEDED",
    "recovery": {"escalation": "never", "backoff_base": "1s", "decision_interval": "2s"},
    "vertex_schedule": {"preempt": [{"attempt": 1, "run_suffix": "-t3", "after_s": 6.0}]},
    "vertex_args": ("--seed", "0"),
    "trainer_env": _TRAINER_ENV,
    "sweep": {"search": "vizier", "trials": 4, "parallelism": 2,
              "parameters": [{"name": "lr", "low": 0.003, "high": 0.3, "scale": "log"},
                             {"name": "hidden", "values": [4, 32, 256]}],
              "metrics": [{"name": QUALITY, "goal": "maximize"},
                          {"name": "latency_p95_ms", "goal": "minimize"},
                          {"name": "cost", "goal": "minimize"}],
              "constraints": CONSTRAINTS},
    "model": {"serving_image": "us-docker.pkg.dev/vertex-ai/prediction/sklearn-cpu.1-3:latest"},
    "extend": extend,
}
