"""What Vertex AI Experiments gets of a sweep's trials (issue 41): every metric the trainer
reported (not only the sweep's), and an early-stopped trial as CANCELLED, as its run is in
`spotorch runs` (the SDK's run states have no STOPPED), never FAILED."""

from __future__ import annotations

from spotorch.adapters.memory.registry import MemoryExperimentTracker
from spotorch.app.job_events import job_changed, trainer_reported
from spotorch.app.sweeps import start_sweep
from spotorch.app.tick import tick
from spotorch.core.model import FailureClass, JobPhase
from spotorch.core.observations import TrainerReported
from test_sweep_service import make, parts


def test_trials_reach_experiments_with_all_their_metrics_and_one_word_for_stopped() -> None:
    deps = make()
    launcher, _, clock = parts(deps)
    start_sweep(deps, "p", sweep_id="sw", data_uri="gs://b/d/", snapshot_id="d")
    for run_id, loss in (("sw-t1", 0.5), ("sw-t2", 0.4), ("sw-t3", 0.9)):
        clock.advance(2)
        trainer_reported(deps, run_id, TrainerReported(
            1, "progress", clock.now(), step=10, total_steps=100,
            metrics={"loss": loss, "predict_latency_ms": 3.5}))
    tick(deps)
    job3 = launcher.job_of("sw-t3", 1)
    job_changed(deps, "sw-t3", 1, launcher.set_status(job3, JobPhase.CANCELLED,
                                                      failure=FailureClass.CANCELLED))
    tick(deps)
    assert isinstance(deps.experiments, MemoryExperimentTracker)
    logged = {r.run_id: r for r in deps.experiments.runs.values()}
    assert "sw-t3" in logged, logged
    stopped = logged["sw-t3"]
    assert stopped.state == "CANCELLED"
    assert stopped.metrics["predict_latency_ms"] == 3.5 and stopped.metrics["loss"] == 0.9
    assert stopped.metrics["stopped_early"] == 1.0
