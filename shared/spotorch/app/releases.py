"""A registered version's way out (issue 37): the promotion gate, then serving when it passed.

Registration calls `after_registration` once, after the upload returned the version's name.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from spotorch.app import promotions, serving
from spotorch.core.errors import SpotorchError
from spotorch.core.model import Run
from spotorch.core.promotion import Decision
from spotorch.ports.registry import LABEL_MODEL_RUN, RegistryError, model_id

if TYPE_CHECKING:
    from spotorch.app.deps import Deps
    from spotorch.core.pipeline import Pipeline

log = logging.getLogger("spotorch.promotion")


def after_registration(deps: Deps, run: Run | str, version: str) -> Decision | None:
    """Judge the version (spotorch.app.promotions); when it holds the alias, roll it out on the
    pipeline's endpoint (spotorch.app.serving). Redelivery-safe: a decision is made once, and a
    version already serving, watched or queued is not queued again. `run`: the run, or its id
    (a sweep's winning trial)."""
    if isinstance(run, str):
        found, _ = deps.runs.load(run)
        if found is None:
            log.warning("model %s: run %s not found; not judged", version, run)
            return None
        run = found
    decision = promotions.after_registration(deps, run, version)
    if decision is None or not decision.promoted:
        return decision
    record = promotions.champion_record(deps, promotions.model_of(version))
    if record is None or record.champion is None or record.champion.version != version:
        return decision  # promoted once, since replaced or rolled back: not deployed again
    serving.on_promoted(deps, deps.pipeline(run.pipeline), version)
    return decision


# --- operators: `spotorch models`, `promote`, `rollback` (through the api) -----------------------


class NoSuchModel(SpotorchError):
    """The pipeline has no promoted model, or the version is not known."""


def _model_of_pipeline(deps: Deps, pipeline_name: str) -> tuple[Pipeline, str, str]:
    pipeline = deps.pipeline(pipeline_name)
    model = pipeline.model
    if model is None or model.promote is None:
        raise NoSuchModel(f"pipeline {pipeline_name} has no model.promote")
    region = promotions.model_region(pipeline)
    name = f"projects/{deps.project}/locations/{region}/models/{model_id(pipeline_name)}"
    return pipeline, name, model.promote.alias


def models_view(deps: Deps, pipeline_name: str) -> dict[str, Any]:
    """The pipeline's judged versions (metric, verdict, aliases), its champion, and what its
    endpoint serves with what share."""
    pipeline, model, alias = _model_of_pipeline(deps, pipeline_name)
    record = promotions.champion_record(deps, model)
    versions: list[dict[str, Any]] = []
    for decision in reversed(record.decisions if record else ()):
        if any(v["name"] == decision.version for v in versions):
            continue
        aliases: list[str] = []
        if deps.models is not None:
            try:
                aliases = list(deps.models.version(decision.version).aliases)
            except RegistryError as exc:
                aliases = [f"? ({exc.code or 'error'})"]
        versions.append({"name": decision.version, "run_id": decision.run_id,
                         "metric": decision.metric, "promoted": decision.promoted,
                         "rule": decision.rule, "reason": decision.reason, "at": decision.at,
                         "aliases": aliases})
    rollout = serving.rollout_of(deps, pipeline)
    endpoint: dict[str, Any] | None = None
    if rollout is not None:
        endpoint = {"endpoint": rollout.endpoint, "phase": rollout.phase,
                    "serving": rollout.serving, "canary": rollout.canary,
                    "pending": rollout.pending, "reason": rollout.reason,
                    "history": [{"at": at, "what": what} for at, what in rollout.history]}
        endpoint["node_hours"], endpoint["cost"], endpoint["price_notes"] = \
            _serving_cost(deps, pipeline, rollout)
        if deps.endpoints is not None and rollout.endpoint:
            state = deps.endpoints.get(rollout.endpoint)
            endpoint["traffic_split"] = {d.model: state.traffic.get(d.id, 0)
                                         for d in state.deployed}
    return {"pipeline": pipeline_name, "model": model, "alias": alias,
            "champion": record.champion.version if record and record.champion else None,
            "versions": versions, "endpoint": endpoint}


def _serving_cost(deps: Deps, pipeline: Pipeline, rollout: Any) -> tuple[float, float | None,
                                                                          list[str]]:
    """The endpoint's node-hours so far and their price by the one price table (None: a
    machine it does not know)."""
    from spotorch.core.canary import node_hours
    from spotorch.core.cost import machine_hourly

    region = promotions.model_region(pipeline)
    hours = node_hours(rollout, deps.clock.now())
    cost: float | None = 0.0
    notes: list[str] = []
    for (_, machine), used in hours.items():
        rate, why = machine_hourly(machine, region, deps.prices)
        notes += [n for n in why if n not in notes]
        cost = None if rate is None or cost is None else cost + rate * used
    return round(sum(hours.values()), 6), None if cost is None else round(cost, 6), notes


def promote_version(deps: Deps, version: str, reason: str = "promoted by an operator") -> \
        dict[str, Any]:
    """An operator's promotion: the version takes the alias without the gate (its run's
    evaluation recorded as it is), then rolls out as any promoted version."""
    if deps.models is None:
        raise NoSuchModel("no model registry configured")
    try:
        found = deps.models.version(version)
    except RegistryError as exc:
        raise NoSuchModel(f"no model version {version!r}: {exc}") from None
    run_id = found.labels.get(LABEL_MODEL_RUN, "")
    run, _ = deps.runs.load(run_id) if run_id else (None, None)
    if run is None:
        raise NoSuchModel(f"{version} names no spotorch run (label {LABEL_MODEL_RUN})")
    pipeline, _, _ = _model_of_pipeline(deps, run.pipeline)
    promotions.force(deps, pipeline, run, version, reason)
    serving.on_promoted(deps, pipeline, version)
    return models_view(deps, run.pipeline)


def rollback_endpoint(deps: Deps, endpoint_id: str,
                      reason: str = "rolled back by an operator") -> dict[str, Any]:
    """Roll the endpoint's running canary back now (its promotion undone); the endpoint is named
    by its id, as a pipeline's model.serve.endpoint names it."""
    owners = [p for p in deps.pipelines.values()
              if p.model is not None and p.model.serve is not None
              and p.model.serve.endpoint == endpoint_id]
    if not owners:
        raise NoSuchModel(f"no pipeline serves on an endpoint {endpoint_id!r} (model.serve)")
    serving.abort_canary(deps, owners[0], reason)
    return models_view(deps, owners[0].name)
