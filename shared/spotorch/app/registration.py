"""Registration, for runs and sweeps alike: a trained model to Vertex AI Model Registry (a new
version of the pipeline's model, its labels, the aliases that move to it) and its run or trial
to Vertex AI Experiments.

`aliases_to_move` decides which aliases a new version takes at upload (the pipeline's, and `best`
for a sweep's winner); the promotion gate (`model.promote`, spotorch.app.releases) runs after
every upload, of a run or of a sweep's winner, and alone moves the champion's alias. Before any
upload, `promotions.check_servable` refuses an artifact its prebuilt container cannot load.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING

from spotorch.app import promotions, releases
from spotorch.app.deps import Deps
from spotorch.app.promotions import model_region as model_region  # where its model lives
from spotorch.core import provenance
from spotorch.core.context import Context
from spotorch.core.intents import RegisterModelIntent
from spotorch.core.model import Run
from spotorch.core.moves import spent
from spotorch.core.observations import ModelRegistered, Observation
from spotorch.core.pipeline import Pipeline
from spotorch.core.sweep_spec import ModelRegistration
from spotorch.ports.registry import (
    ALIAS_BEST,
    LABEL_MODEL_PIPELINE,
    LABEL_MODEL_RUN,
    LABEL_MODEL_SNAPSHOT,
    LABEL_MODEL_SWEEP,
    ExperimentRun,
    ModelUpload,
    RegistryError,
)

if TYPE_CHECKING:  # a sweep's types: imported by its calls alone (a run's cold start skips them)
    from spotorch.core.sweeps import LogTrial, RegisterModel, Sweep

MAX_MODEL_LABELS = 64  # Vertex AI: at most 64 labels on a resource

log = logging.getLogger("spotorch.service")


def aliases_to_move(pipeline: Pipeline, *, sweep_winner: bool = False) -> tuple[str, ...]:
    """The aliases a new version of the pipeline's model takes (each moves from the version
    that had it): the pipeline's `model.aliases`, and `best` for a sweep's winner."""
    model = pipeline.model
    aliases = model.aliases if model is not None else ()
    return tuple(dict.fromkeys((*aliases, ALIAS_BEST))) if sweep_winner else tuple(aliases)


def model_labels(model: ModelRegistration, *, pipeline: str, run_id: str,
                 snapshot_id: str | None, sweep_id: str | None = None,
                 found: Mapping[str, str] | None = None) -> dict[str, str]:
    """A version's labels: the pipeline's, spotorch's own, then the run's provenance labels
    when there is room for them all (Vertex refuses a 65th label)."""
    labels = {**dict(model.labels), LABEL_MODEL_PIPELINE: pipeline, LABEL_MODEL_RUN: run_id}
    if sweep_id is not None:
        labels[LABEL_MODEL_SWEEP] = sweep_id
    labels[LABEL_MODEL_SNAPSHOT] = snapshot_id or ""
    found = found or {}
    if len(labels) + len(found) <= MAX_MODEL_LABELS:
        labels.update(found)
    else:
        log.warning("run %s: the pipeline's model labels leave no room for provenance labels",
                    run_id, extra={"run_id": run_id})
    return labels


# ---------------------------------------------------------------- a run

def register_run_model(deps: Deps, run: Run, intent: RegisterModelIntent) -> Observation | None:
    """UploadModel as a new version of the pipeline's model (idempotent: found by the run's
    label); a permanent refusal ends the run SUCCEEDED without a model name, saying why. A
    transient one raises: the intent stays in the outbox and the tick retries it."""
    pipeline = deps.pipeline(run.pipeline)
    model = pipeline.model
    if model is None or deps.models is None:
        return ModelRegistered(intent.id, error="no model registry configured")
    labels = model_labels(model, pipeline=run.pipeline, run_id=run.run_id,
                          snapshot_id=run.snapshot_id,
                          found=provenance.labels(run.provenance or {}))
    try:
        promotions.check_servable(deps, model.serving_image, intent.artifact_uri)
        name = deps.models.upload(ModelUpload(
            pipeline=run.pipeline, run_id=run.run_id, region=model_region(pipeline),
            display_name=model.display_name or run.pipeline, artifact_uri=intent.artifact_uri,
            serving_image=model.serving_image, labels=labels,
            aliases=aliases_to_move(pipeline)))
    except RegistryError as exc:
        if not exc.permanent:
            raise  # stays in the outbox; the tick retries it
        return ModelRegistered(intent.id, error=str(exc))
    releases.after_registration(deps, run, name)  # model.promote: the gate, then serving
    if model.experiments and deps.experiments is not None:
        log_run_experiment(deps, run, region=model_region(pipeline))
    return ModelRegistered(intent.id, model_name=name)


def log_run_experiment(deps: Deps, run: Run, *, region: str) -> None:
    """The run in its pipeline's Vertex AI Experiment: parameters, final metrics and cost
    (best effort: a failure is logged, the model is registered either way)."""
    assert deps.experiments is not None
    ctx = Context(deps.pipeline(run.pipeline), deps.clock.now(), prices=deps.prices)
    metrics = {**{k: float(v) for k, v in run.progress.metrics.items()},
               "cost": round(spent(run, ctx), 6),
               "preemptions": float(run.counters.preemptions), "step": float(run.progress.step)}
    try:
        deps.experiments.log_run(ExperimentRun(experiment=run.pipeline, run_id=run.run_id,
                                               region=region, params=dict(run.params),
                                               metrics=metrics,
                                               provenance=provenance.metadata(run.provenance)))
    except RegistryError as exc:
        log.warning("run %s not logged to Experiments: %s", run.run_id, exc,
                    extra={"run_id": run.run_id})


# ---------------------------------------------------------------- a sweep

def register_sweep_model(deps: Deps, sw: Sweep,
                         intent: RegisterModel) -> tuple[str | None, str | None]:
    """UploadModel of a sweep's winning trial as a new version of the pipeline's model (its
    aliases and `best`), then the promotion gate: the version and the gate's word on it (a
    `best` worse than the champion says so). An artifact its serving container cannot load
    registers nothing (None, logged); any other failure raises (deferred and retried)."""
    pipeline = deps.pipeline(sw.pipeline)
    model = pipeline.model
    assert model is not None and deps.models is not None
    try:
        promotions.check_servable(deps, model.serving_image, intent.artifact_uri)
    except RegistryError as exc:
        if not exc.permanent:
            raise
        log.warning("sweep %s: the winner's model is not registered: %s", sw.sweep_id, exc)
        return None, None
    labels = model_labels(model, pipeline=sw.pipeline, run_id=intent.run_id,
                          snapshot_id=sw.snapshot_id, sweep_id=sw.sweep_id)
    name = deps.models.upload(ModelUpload(
        pipeline=sw.pipeline, run_id=intent.run_id, region=model_region(pipeline),
        display_name=model.display_name or sw.pipeline, artifact_uri=intent.artifact_uri,
        serving_image=model.serving_image, labels=labels,
        aliases=aliases_to_move(pipeline, sweep_winner=True)))
    decision = releases.after_registration(deps, intent.run_id, name)  # model.promote (gate)
    if decision is None or model.promote is None:
        return name, None
    if decision.promoted:
        return name, f"promoted to {model.promote.alias}: {decision.reason}"
    return name, (f"`best` of this sweep but not promoted to {model.promote.alias}: "
                  f"{decision.reason}")


def log_trial(deps: Deps, sw: Sweep, intent: LogTrial) -> str:
    """An ended trial in its pipeline's Vertex AI Experiment: parameters, final metric, cost."""
    from spotorch.core.sweeps import TrialStatus

    assert deps.experiments is not None
    trial = sw.trial(intent.trial)
    pipeline = deps.pipeline(sw.pipeline)
    metric = pipeline.sweep.metric if pipeline.sweep else "metric"
    # Every metric the trainer last reported (loss, quality, latency, model size), not only the
    # sweep's, and the trial's cost from the one ledger.
    found, _ = deps.runs.load(trial.run_id)
    metrics = {k: float(v) for k, v in (found.progress.metrics if found else {}).items()}
    metrics |= {k: float(v) for k, v in trial.metrics.items()}
    metrics |= {"cost": trial.cost, "preemptions": float(trial.preemptions)}
    if trial.metric is not None:
        metrics[pipeline.sweep.quality if pipeline.sweep else metric] = trial.metric
    if trial.step is not None:
        metrics["step"] = float(trial.step)
    if trial.status is TrialStatus.STOPPED:
        metrics["stopped_early"] = 1.0
    # The SDK's run states (Execution.State) have no STOPPED: an early-stopped trial is
    # CANCELLED, as its run is in `spotorch runs`; only a failed one is FAILED.
    state = {TrialStatus.SUCCEEDED: "COMPLETE", TrialStatus.STOPPED: "CANCELLED",
             TrialStatus.CANCELLED: "CANCELLED"}.get(trial.status, "FAILED")
    return deps.experiments.log_run(ExperimentRun(
        experiment=sw.pipeline, run_id=trial.run_id, region=model_region(pipeline),
        params=dict(trial.params), metrics=metrics, state=state))
