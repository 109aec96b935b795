"""Serving, the use case (issue 37): a promoted version rolls out on the pipeline's endpoint as
a canary (spotorch.core.canary), taking all traffic or rolled back with its promotion undone.

The per-endpoint rollout record (collection endpoint_rollouts) changes by conditional writes
only; `advance` performs the record's next step with idempotent calls (an undeploy of a model
gone is done, a split is set as a whole) and then writes the outcome, so a crash between the two
repeats the step and the tick (reconcile_rollouts) carries every unfinished rollout on. A
deployment, which is not idempotent and outlasts a function, is claimed in the record first,
started once by the claimant, and its operation polled by whoever advances next
(spotorch.core.canary). One rollout at a time per endpoint: a version promoted
meanwhile waits as `pending`. The rollout record and the champion record change through
app.updates' one conditional-update loop (`_update`, `promotions.update_record`).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from spotorch.app import promotions, updates
from spotorch.app.updates import Written
from spotorch.core import canary
from spotorch.core.canary import Rollout, ServeSpec
from spotorch.core.errors import SpotorchError
from spotorch.core.promotion import ChampionRecord, demoted
from spotorch.ports.serving import ServingError
from spotorch.settings import COLLECTION_ROLLOUTS

if TYPE_CHECKING:
    from spotorch.app.deps import Deps
    from spotorch.core.pipeline import Pipeline

log = logging.getLogger("spotorch.serving")

MAX_STEPS = 8  # steps one advance takes before leaving the rest to the tick


def rollout_key(region: str, endpoint_id: str) -> str:
    """The rollout record's id: region and endpoint id."""
    return f"{region}~{endpoint_id}"


def _spec_of(deps: Deps, pipeline: Pipeline) -> tuple[ServeSpec, str] | None:
    model = pipeline.model
    if model is None or model.serve is None or deps.endpoints is None:
        return None
    return model.serve, promotions.model_region(pipeline)


def _load(deps: Deps, key: str) -> tuple[Rollout, Any]:
    doc, version = deps.docs.get(COLLECTION_ROLLOUTS, key)
    return (Rollout.from_doc(doc) if doc else Rollout(key=key)), version


def _update(deps: Deps, pipeline: Pipeline, key: str,
            decide: Callable[[Rollout], Rollout | None],
            known: Written[Rollout] | None = None) -> Written[Rollout] | None:
    """The rollout record's change through app.updates' loop (one more document kind): what
    was written, or None when decide changed nothing (None). `known`: the record as this caller
    just wrote it, its first reading (a conflict reads it again). ConflictError after
    updates.WRITE_ATTEMPTS conflicts in a row."""
    first = [] if known is None else [(known.doc, known.version)]

    def read() -> tuple[Rollout, Any]:
        return first.pop() if first else _load(deps, key)

    return updates.conditional_update(
        read, lambda found: decide(found if found is not None else Rollout(key=key)),
        lambda new, version: deps.docs.put(COLLECTION_ROLLOUTS, key,
                                           {**new.to_doc(), "pipeline": pipeline.name}, version),
        what=f"rollout {key}")


def on_promoted(deps: Deps, pipeline: Pipeline, version: str) -> Rollout | None:
    """A version took the alias: queue it on the pipeline's endpoint and carry the rollout on."""
    found = _spec_of(deps, pipeline)
    if found is None:
        return None
    spec, region = found
    key = rollout_key(region, spec.endpoint)

    def queue(rollout: Rollout) -> Rollout | None:
        new = canary.promoted(rollout, version, deps.clock.now())
        return None if new == rollout else new  # queued, watched or serving already

    _update(deps, pipeline, key, queue)
    return advance(deps, pipeline, key)


def advance(deps: Deps, pipeline: Pipeline, key: str) -> Rollout:
    """Take the rollout's next steps until it waits (a canary's window) or is idle: each step
    is performed on the record as read, then its outcome written on that reading's version (a
    conflict reads again and takes the step that is due now: the calls are idempotent)."""
    found = _spec_of(deps, pipeline)
    assert found is not None and deps.endpoints is not None
    spec, region = found
    seen: list[Rollout] = []  # the record each step found
    mine = _Claim(uuid.uuid4().hex)  # this advance's deploy claim, and what it started

    def step(rollout: Rollout) -> Rollout | None:
        seen.append(rollout)
        return _step(deps, pipeline, spec, region, rollout, mine)

    written: Written[Rollout] | None = None
    for _ in range(MAX_STEPS):
        written = _update(deps, pipeline, key, step, known=written)
        if written is None:
            return seen[-1]  # waits (a canary's window), or idle
        log.info("rollout %s: %s", key,
                 written.doc.history[-1][1] if written.doc.history else written.doc.phase)
    assert written is not None
    return written.doc


@dataclass
class _Claim:
    """One advance's deploy claim token, and the operations it started (version -> name): a
    write that lost a race is decided again, and must not start the deployment twice."""

    token: str
    started: dict[str, str] = field(default_factory=dict)


def _step(deps: Deps, pipeline: Pipeline, spec: ServeSpec, region: str,
          rollout: Rollout, mine: _Claim) -> Rollout | None:
    """Perform the rollout's next step (idempotent calls, or a claimed deployment); the record
    after it, or None when there is nothing to do now (idle, a canary's window still open, a
    deployment running or being started by another writer)."""
    assert deps.endpoints is not None
    now = deps.clock.now()
    todo = canary.step(rollout, spec, mine.token, now)
    if todo.kind == "none":
        return None
    if not rollout.endpoint:
        name = deps.endpoints.create(region, spec.endpoint, f"{pipeline.name} {spec.endpoint}")
        return canary.noted(_with_endpoint(rollout, name), now, f"endpoint {name}")
    if todo.kind == "start":
        return canary.started(rollout, now, mine.token)
    if todo.kind == "claim":
        return canary.claimed(rollout, now, mine.token)
    if todo.kind == "deploy":
        assert todo.version is not None and todo.traffic is not None
        there = deps.endpoints.get(rollout.endpoint).of_model(todo.version)
        if there is not None:  # deployed by a claimant that died before it wrote: adopted
            return canary.deployed(rollout, there.id, spec, now)
        if todo.version not in mine.started:
            mine.started[todo.version] = deps.endpoints.start_deploy(
                rollout.endpoint, todo.version, machine_type=spec.machine_type,
                min_replicas=spec.min_replicas, max_replicas=spec.max_replicas,
                traffic=todo.traffic)
        return canary.deploy_started(rollout, mine.started[todo.version], now)
    if todo.kind == "await_deploy":
        assert rollout.operation is not None
        try:
            deployed_id = deps.endpoints.deploy_result(rollout.operation)
        except ServingError as exc:
            if not exc.permanent:
                raise
            if rollout.canary is not None:
                undo_promotion(deps, rollout.canary, f"not deployed: {exc}")
            return canary.deploy_failed(rollout, str(exc), now)
        if deployed_id is None:
            return None  # the operation runs: the tick polls it again
        return canary.deployed(rollout, deployed_id, spec, now)
    if todo.kind == "judge":
        assert rollout.canary_id is not None and rollout.started_at is not None
        traffic = deps.endpoint_traffic
        if traffic is None:
            return None  # nothing to judge by: the tick looks again
        window = traffic.window(rollout.endpoint, rollout.canary_id, rollout.started_at)
        new = canary.judge(rollout, spec, window, now)
        return None if new == rollout else new  # unchanged: keep watching
    if todo.kind == "finish":
        assert todo.traffic is not None and rollout.canary_id is not None
        deps.endpoints.set_traffic(rollout.endpoint, todo.traffic)
        if rollout.serving_id is not None:
            deps.endpoints.undeploy(rollout.endpoint, rollout.serving_id, {})
        return canary.finished(rollout, now)
    if todo.kind == "roll_back":
        assert todo.traffic is not None and rollout.canary_id is not None
        deps.endpoints.set_traffic(rollout.endpoint, todo.traffic)
        deps.endpoints.undeploy(rollout.endpoint, rollout.canary_id, {})
        if rollout.canary is not None:
            undo_promotion(deps, rollout.canary, rollout.reason)
        return canary.rolled_back(rollout, now)
    raise ValueError(f"unknown step {todo.kind}")


def _with_endpoint(r: Rollout, name: str) -> Rollout:
    return replace(r, endpoint=name)


def undo_promotion(deps: Deps, version: str, reason: str) -> None:
    """The canary of `version` was rolled back: the previous champion holds the alias again."""
    model = promotions.model_of(version)
    seen: list[ChampionRecord] = []

    def undo(record: ChampionRecord | None) -> ChampionRecord | None:
        if record is None:
            return None  # no record: nothing was promoted
        seen.append(record)
        new = demoted(record, version, reason, deps.clock.now())
        return None if new == record else new  # not the champion (a repeated rollback)

    promotions.update_record(deps, model, undo)
    if seen:
        promotions.sync_alias(deps, model, seen[-1].alias)


def abort_canary(deps: Deps, pipeline: Pipeline, reason: str) -> Rollout:
    """An operator's rollback: the endpoint's running canary goes back now (SpotorchError when
    no canary runs: nothing to roll back)."""
    found = _spec_of(deps, pipeline)
    if found is None:
        raise NothingToRollBack(f"pipeline {pipeline.name} serves on no endpoint (model.serve)")
    spec, region = found
    key = rollout_key(region, spec.endpoint)

    def abort(rollout: Rollout) -> Rollout | None:
        if rollout.phase == "rolling_back":
            return None  # asked before: the rollback goes on
        if rollout.phase not in ("canary", "finishing"):
            raise NothingToRollBack(
                f"no canary on {spec.endpoint} ({rollout.phase}, serving {rollout.serving}): "
                "nothing to roll back; promote the version you want (`spotorch promote`)")
        return canary.noted(replace(rollout, phase="rolling_back", reason=reason),
                            deps.clock.now(), f"canary {rollout.canary} rolled back: {reason}")

    _update(deps, pipeline, key, abort)
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
