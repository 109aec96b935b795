"""Serving, the use case (issue 37): a promoted version rolls out on the pipeline's endpoint as
a canary (spotorch.core.canary), taking all traffic or rolled back with its promotion undone.

The per-endpoint rollout record (collection endpoint_rollouts) changes by conditional writes
only; `advance` performs the record's next step with idempotent calls (a deploy finds the
version already there, an undeploy of a model gone is done, a split is set as a whole) and then
writes the outcome, so a crash between the two repeats the step and the tick (reconcile_rollouts)
carries every unfinished rollout on. One rollout at a time per endpoint: a version promoted
meanwhile waits as `pending`.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from spotorch.app import promotions
from spotorch.core import canary
from spotorch.core.canary import Rollout, ServeSpec
from spotorch.core.errors import SpotorchError
from spotorch.core.promotion import ChampionRecord, demoted
from spotorch.ports.store import ConflictError
from spotorch.settings import COLLECTION_CHAMPIONS, COLLECTION_ROLLOUTS

if TYPE_CHECKING:
    from spotorch.app.deps import Deps
    from spotorch.core.pipeline import Pipeline

log = logging.getLogger("spotorch.serving")

MAX_STEPS = 8  # steps one advance takes before leaving the rest to the tick
MAX_CONFLICT_RETRIES = 8


def rollout_key(region: str, endpoint_id: str) -> str:
    """The rollout record's id: region and endpoint id."""
    return f"{region}~{endpoint_id}"


def _spec_of(deps: Deps, pipeline: Pipeline) -> tuple[ServeSpec, str] | None:
    model = pipeline.model
    if model is None or model.serve is None or deps.endpoints is None:
        return None
    return model.serve, model.region or pipeline.job.regions[0]


def _load(deps: Deps, key: str) -> tuple[Rollout, Any]:
    doc, version = deps.docs.get(COLLECTION_ROLLOUTS, key)
    return (Rollout.from_doc(doc) if doc else Rollout(key=key)), version


def on_promoted(deps: Deps, pipeline: Pipeline, version: str) -> Rollout | None:
    """A version took the alias: queue it on the pipeline's endpoint and carry the rollout on."""
    found = _spec_of(deps, pipeline)
    if found is None:
        return None
    spec, region = found
    key = rollout_key(region, spec.endpoint)
    for _ in range(MAX_CONFLICT_RETRIES):
        rollout, stored = _load(deps, key)
        new = canary.promoted(rollout, version, deps.clock.now())
        if new == rollout:
            break
        try:
            deps.docs.put(COLLECTION_ROLLOUTS, key, {**new.to_doc(), "pipeline": pipeline.name},
                          stored)
            break
        except ConflictError:
            continue
    return advance(deps, pipeline, key)


def advance(deps: Deps, pipeline: Pipeline, key: str) -> Rollout:
    """Take the rollout's next steps until it waits (a canary's window) or is idle."""
    found = _spec_of(deps, pipeline)
    assert found is not None and deps.endpoints is not None
    spec, region = found
    rollout, stored = _load(deps, key)
    for _ in range(MAX_STEPS):
        now = deps.clock.now()
        todo = canary.step(rollout, spec)
        if todo.kind == "none":
            return rollout
        if not rollout.endpoint:
            name = deps.endpoints.create(region, spec.endpoint, f"{pipeline.name} {spec.endpoint}")
            new = canary.noted(_with_endpoint(rollout, name), now, f"endpoint {name}")
        elif todo.kind == "deploy":
            if rollout.phase == "idle":
                new = canary.started(rollout, now)
            else:
                assert todo.version is not None and todo.traffic is not None
                deployed_id = deps.endpoints.deploy(
                    rollout.endpoint, todo.version, machine_type=spec.machine_type,
                    min_replicas=spec.min_replicas, max_replicas=spec.max_replicas,
                    traffic=todo.traffic)
                new = canary.deployed(rollout, deployed_id, spec, now)
        elif todo.kind == "judge":
            assert rollout.canary_id is not None and rollout.started_at is not None
            traffic = deps.endpoint_traffic
            if traffic is None:
                return rollout  # nothing to judge by: the tick looks again
            window = traffic.window(rollout.endpoint, rollout.canary_id, rollout.started_at)
            new = canary.judge(rollout, spec, window, now)
            if new == rollout:
                return rollout  # keep watching
        elif todo.kind == "finish":
            assert todo.traffic is not None and rollout.canary_id is not None
            deps.endpoints.set_traffic(rollout.endpoint, todo.traffic)
            if rollout.serving_id is not None:
                deps.endpoints.undeploy(rollout.endpoint, rollout.serving_id, {})
            new = canary.finished(rollout, now)
        elif todo.kind == "roll_back":
            assert todo.traffic is not None and rollout.canary_id is not None
            deps.endpoints.set_traffic(rollout.endpoint, todo.traffic)
            deps.endpoints.undeploy(rollout.endpoint, rollout.canary_id, {})
            if rollout.canary is not None:
                undo_promotion(deps, rollout.canary, rollout.reason)
            new = canary.rolled_back(rollout, now)
        else:
            raise ValueError(f"unknown step {todo.kind}")
        try:
            stored = deps.docs.put(COLLECTION_ROLLOUTS, key,
                                   {**new.to_doc(), "pipeline": pipeline.name}, stored)
        except ConflictError:
            rollout, stored = _load(deps, key)  # someone else moved it: look again
            continue
        log.info("rollout %s: %s", key, new.history[-1][1] if new.history else new.phase)
        rollout = new
    return rollout


def _with_endpoint(r: Rollout, name: str) -> Rollout:
    return replace(r, endpoint=name)


def undo_promotion(deps: Deps, version: str, reason: str) -> None:
    """The canary of `version` was rolled back: the previous champion holds the alias again."""
    model = promotions.model_of(version)
    key = promotions.record_key(model)
    for _ in range(MAX_CONFLICT_RETRIES):
        doc, stored = deps.docs.get(COLLECTION_CHAMPIONS, key)
        if not doc:
            return
        record = ChampionRecord.from_doc(doc)
        new = demoted(record, version, reason, deps.clock.now())
        if new == record:
            break
        try:
            deps.docs.put(COLLECTION_CHAMPIONS, key, new.to_doc(), stored)
            break
        except ConflictError:
            continue
    promotions.sync_alias(deps, model, record.alias)


def abort_canary(deps: Deps, pipeline: Pipeline, reason: str) -> Rollout:
    """An operator's rollback: the endpoint's running canary goes back now (SpotorchError when
    no canary runs: nothing to roll back)."""
    found = _spec_of(deps, pipeline)
    if found is None:
        raise NothingToRollBack(f"pipeline {pipeline.name} serves on no endpoint (model.serve)")
    spec, region = found
    key = rollout_key(region, spec.endpoint)
    for _ in range(MAX_CONFLICT_RETRIES):
        rollout, stored = _load(deps, key)
        if rollout.phase == "rolling_back":
            break
        if rollout.phase not in ("canary", "finishing"):
            raise NothingToRollBack(
                f"no canary on {spec.endpoint} ({rollout.phase}, serving {rollout.serving}): "
                "nothing to roll back; promote the version you want (`spotorch promote`)")
        new = canary.noted(replace(rollout, phase="rolling_back", reason=reason),
                           deps.clock.now(), f"canary {rollout.canary} rolled back: {reason}")
        try:
            deps.docs.put(COLLECTION_ROLLOUTS, key, {**new.to_doc(), "pipeline": pipeline.name},
                          stored)
            break
        except ConflictError:
            continue
    return advance(deps, pipeline, key)


class NothingToRollBack(SpotorchError):
    """The endpoint runs no canary."""


def reconcile_rollouts(deps: Deps) -> list[Rollout]:
    """The tick: carry every unfinished rollout on (watch canaries, repair after a crash)."""
    out = []
    for doc in deps.docs.query(COLLECTION_ROLLOUTS, "active", True):
        name = doc.get("pipeline")
        pipeline = deps.pipelines.get(str(name)) if name else None
        if pipeline is None or _spec_of(deps, pipeline) is None:
            continue
        try:
            out.append(advance(deps, pipeline, str(doc["key"])))
        except Exception as exc:  # one endpoint's trouble must not stop the others
            log.warning("rollout %s not advanced: %s", doc.get("key"), exc)
    return out


def rollout_of(deps: Deps, pipeline: Pipeline) -> Rollout | None:
    """The pipeline's endpoint rollout as stored (operators, the demo)."""
    found = _spec_of(deps, pipeline)
    if found is None:
        return None
    spec, region = found
    doc, _ = deps.docs.get(COLLECTION_ROLLOUTS, rollout_key(region, spec.endpoint))
    return Rollout.from_doc(doc) if doc else None
