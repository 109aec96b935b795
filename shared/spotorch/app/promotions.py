"""The promotion gate, the use case: after a version is registered, judge it against the champion
(spotorch.core.promotion.gate) and move the pipeline's promotion alias only when it passes.

The per-model champion record (collection model_champions) is the one truth of who holds the
alias: it changes by one conditional write, so two runs ending together are judged one after the
other and at most the better one ends holding it; a version already decided keeps its decision
(a redelivered registration changes nothing, and republishes the same event id). The registry's
alias follows the record (sync_alias), re-read after each move so that a late mover never leaves
the alias on a version the record no longer names.

Registration calls it (through spotorch.app.releases.after_registration, which resolves the run)
once, after the upload returned the version's name. Every write of the champion record goes
through `update_record`, app.updates' one conditional-update loop.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from spotorch.app import updates
from spotorch.core import promotion as gate
from spotorch.core import servable
from spotorch.core.events import build_event
from spotorch.core.model import Run
from spotorch.core.promotion import Candidate, ChampionRecord, Decision, PromotionPolicy
from spotorch.ports.registry import RegistryError
from spotorch.settings import COLLECTION_CHAMPIONS

if TYPE_CHECKING:
    from spotorch.app.deps import Deps
    from spotorch.core.pipeline import Pipeline

log = logging.getLogger("spotorch.promotion")

SYNC_ROUNDS = 4
# The sequence of a version's one promotion event: {run_id}:900000, far above a run's own events.
EVENT_SEQUENCE = 900_000
LISTING_PAGES = 10  # an artifact folder's listing: at most this many pages of 1000 objects


def model_region(pipeline: Pipeline) -> str:
    """Where the pipeline's model is registered and served: its `model.region`, else its first
    job region (registration, serving and the operators' views all ask this)."""
    model = pipeline.model
    return model.region if model and model.region else pipeline.job.regions[0]


def model_of(version: str) -> str:
    """The model of a version's name: projects/P/locations/L/models/M@V -> …/models/M."""
    return version.partition("@")[0]


def record_key(model: str) -> str:
    """The champion record's document id: location and model id (no '/' in Firestore ids)."""
    parts = model.split("/")
    return f"{parts[3]}~{parts[5]}" if len(parts) >= 6 else model.replace("/", "~")


def candidate_of(pipeline: Pipeline, run: Run, version: str) -> Candidate:
    """A registered run's version as the gate sees it: its evaluation metrics and the identity of
    the held-out data they were measured on, when its training data was taken, its latency."""
    model = pipeline.model
    reported = dict(run.progress.metrics)
    metrics = gate.evaluation_metrics(reported)
    data = (run.provenance or {}).get("data")
    recorded = (run.provenance or {}).get("evaluation")  # the trainer's own (provenance), if any
    identity = (str(recorded["identity"]) if isinstance(recorded, dict) and recorded.get("identity")
                else gate.evaluation_identity(model.evaluation if model else None, data))
    return Candidate(version=version, run_id=run.run_id, metrics=metrics,
                     evaluation=identity if metrics else None,
                     data_time=gate.data_time(data, run.created_at, run.rerun_of is not None),
                     latency_p95_ms=gate.latency_of(reported))


def read_record(deps: Deps, model: str) -> tuple[ChampionRecord | None, Any]:
    """The model's champion record as stored (None if none yet) and its version."""
    doc, version = deps.docs.get(COLLECTION_CHAMPIONS, record_key(model))
    return (ChampionRecord.from_doc(doc) if doc else None), version


def load_record(deps: Deps, model: str, alias: str) -> tuple[ChampionRecord, Any]:
    """The model's champion record and its version (a fresh one, version None, if absent)."""
    record, version = read_record(deps, model)
    return (record if record is not None else ChampionRecord(model=model, alias=alias)), version


def update_record(deps: Deps, model: str,
                  decide: Callable[[ChampionRecord | None], ChampionRecord | None]) -> \
        ChampionRecord | None:
    """The champion record's change through app.updates' loop (the record is one more document
    kind): the record written, or None when decide changed nothing (None). ConflictError after
    updates.WRITE_ATTEMPTS conflicts in a row (the caller's intent or event is retried)."""
    written = updates.conditional_update(
        lambda: read_record(deps, model), decide,
        lambda new, version: deps.docs.put(COLLECTION_CHAMPIONS, record_key(model),
                                           new.to_doc(), version),
        what=f"champion record of {model}")
    return None if written is None else written.doc


def judge(deps: Deps, policy: PromotionPolicy, candidate: Candidate) -> tuple[ChampionRecord,
                                                                               Decision]:
    """Decide once, in one conditional write of the champion record; a racing writer makes us
    read again and judge against whoever holds the alias now."""
    model = model_of(candidate.version)
    judged: list[tuple[ChampionRecord, Decision]] = []  # each reading's record and decision

    def decide(found: ChampionRecord | None) -> ChampionRecord | None:
        record = found if found is not None else ChampionRecord(model=model, alias=policy.alias)
        new, decision = gate.consider(record, policy, candidate, deps.clock.now())
        judged.append((record, decision))
        return None if new == record else new

    written = update_record(deps, model, decide)
    record, decision = judged[-1]
    if written is None:
        return record, decision  # decided before: a redelivery
    log.info("model %s %s: %s", candidate.version,
             "promoted" if decision.promoted else "not promoted", decision.reason)
    return written, decision


def sync_alias(deps: Deps, model: str, alias: str) -> str | None:
    """Move the registry's alias to the record's champion, until a read after the move finds
    the record unchanged (a writer that lost the race ends on the winner). The champion's
    version, or None when there is none."""
    assert deps.models is not None
    moved: str | None = None
    for _ in range(SYNC_ROUNDS):
        record, _ = load_record(deps, model, alias)
        target = record.champion.version if record.champion else None
        if target is None or target == moved:
            return target
        deps.models.move_alias(target, alias)
        moved = target
    return moved


def event_of(pipeline: str, policy: PromotionPolicy, record: ChampionRecord,
             decision: Decision, candidate: Candidate) -> dict[str, Any]:
    """The model.promoted or model.rejected event of a decision (its id stable per version)."""
    return build_event(
        run_id=decision.run_id, pipeline=pipeline, sequence=EVENT_SEQUENCE,
        kind="model.promoted" if decision.promoted else "model.rejected", time=decision.at,
        data={"model_name": decision.version, "model": model_of(decision.version),
              "alias": policy.alias, "promoted": decision.promoted, "reason": decision.reason,
              "rule": decision.rule, "metric": policy.metric, "value": decision.metric,
              "champion": (decision.version if decision.promoted else
                           record.champion.version if record.champion else None),
              "replaced": decision.replaced, "evaluation": candidate.evaluation,
              "latency_p95_ms": candidate.latency_p95_ms})


def after_registration(deps: Deps, run: Run, version: str) -> Decision | None:
    """The gate for a version just registered (through spotorch.app.releases): judged once,
    the alias moved when it passed, model.promoted or model.rejected published. None when the
    pipeline has no model.promote. A transient failure raises: the registration intent stays in
    the outbox and the retry finds the decision already made."""
    pipeline = deps.pipeline(run.pipeline)
    policy = pipeline.model.promote if pipeline.model else None
    if policy is None or deps.models is None:
        return None
    candidate = candidate_of(pipeline, run, version)
    record, decision = judge(deps, policy, candidate)
    try:
        sync_alias(deps, model_of(version), policy.alias)
    except RegistryError as exc:
        if not exc.permanent:
            raise
        log.warning("alias %s of %s not moved: %s", policy.alias, model_of(version), exc)
    deps.publisher.publish(event_of(run.pipeline, policy, record, decision, candidate))
    return decision


def champion_record(deps: Deps, model: str) -> ChampionRecord | None:
    """A model's champion record as stored (operators, the demo); None if none yet."""
    return read_record(deps, model)[0]


def check_servable(deps: Deps, serving_image: str, artifact_uri: str) -> None:
    """Refuse, before the upload, an artifact its prebuilt serving container cannot load
    (spotorch.core.servable): RegistryError(permanent, FAILED_PRECONDITION) naming what is there
    and what the container loads. A listing that fails is transient (the intent is retried)."""
    if servable.framework_of(serving_image) is None or not artifact_uri.startswith("gs://"):
        return
    bucket, _, path = artifact_uri.removeprefix("gs://").partition("/")
    prefix = f"{path.rstrip('/')}/" if path else ""
    names: list[str] = []
    token: str | None = None
    for _ in range(LISTING_PAGES):
        page = deps.objects.list_page(bucket, prefix, token, 1000)
        names += [o.name[len(prefix):] for o in page.objects if "/" not in o.name[len(prefix):]]
        token = page.next_page_token
        if token is None:
            break
    problem = servable.servable_problem(serving_image, artifact_uri, names)
    if problem:
        raise RegistryError(problem, permanent=True, code="FAILED_PRECONDITION")


def force(deps: Deps, pipeline: Pipeline, run: Run, version: str, reason: str) -> ChampionRecord:
    """An operator's promotion: the version becomes the champion without the gate (the one it
    replaces kept as previous), the alias follows, model.promoted is published."""
    model = pipeline.model
    assert model is not None and model.promote is not None
    policy = model.promote
    candidate = candidate_of(pipeline, run, version)
    name = model_of(version)
    forced: list[tuple[ChampionRecord, Decision | None]] = []  # each reading's record, decision

    def decide(found: ChampionRecord | None) -> ChampionRecord | None:
        record = found if found is not None else ChampionRecord(model=name, alias=policy.alias)
        if record.champion is not None and record.champion.version == version:
            forced.append((record, None))
            return None  # the champion already: a repeated promotion changes nothing
        decision = Decision(version=version, run_id=run.run_id, promoted=True,
                            reason=f"operator: {reason}", rule="operator",
                            at=deps.clock.now(), metric=candidate.metrics.get(policy.metric),
                            replaced=record.champion.version if record.champion else None)
        forced.append((record, decision))
        return replace(record, champion=candidate, previous=record.champion,
                       decisions=(*record.decisions, decision)[-gate.DECISIONS_KEPT:])

    written = update_record(deps, name, decide)
    record, decision = forced[-1]
    if written is not None and decision is not None:
        record = written
        deps.publisher.publish(event_of(run.pipeline, policy, written, decision, candidate))
    sync_alias(deps, name, policy.alias)
    return record
