"""Runs as people start and stop them: start (once per snapshot), cancel, retry, submit; rejected events."""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import tempfile
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from spotorch.app.deps import (
    Deps,
    NotRetryable,
    UnknownRun,
    hardware_outlook,
    key_seed,
    probe_cache,
    region_order,
    region_records,
)
from spotorch.app.snapshots import SnapshotReady
from spotorch.app.spot_record import shape_of
from spotorch.app.unit_of_work import apply, carry_out
from spotorch.core import provenance, shapes
from spotorch.core.decide import new_run
from spotorch.core.ids import check_id
from spotorch.core.model import Checkpoint, Run, RunStatus
from spotorch.core.observations import CancelRequested, error_line
from spotorch.core.pipeline import Pipeline
from spotorch.core.triggers import split_gs_uri
from spotorch.logs import shorten
from spotorch.ports.store import ConflictError, DocumentStore
from spotorch.settings import COLLECTION_REJECTED

log = logging.getLogger("spotorch.app.runs")



# ---------------------------------------------------------------- starting runs

def start_run(deps: Deps, pipeline_name: str, *, run_id: str, data_uri: str,
              snapshot_id: str | None, reason: str,
              resume_from: Checkpoint | None = None, retry_of: str | None = None,
              sweep_id: str | None = None,
              params: Mapping[str, Any] | None = None,
              objects: Sequence[tuple[str, int]] = (),
              bigquery: Mapping[str, Any] | None = None,
              hardware: Mapping[str, Any] | None = None,
              rerun_of: Run | None = None, rerun_hardware: str = "recorded") -> Run | None:
    """Create the run of a snapshot exactly once; apply the pipeline's rule for an active run.

    A sweep's trial (sweep_id set) runs alongside the others: its sweep decides parallelism.
    objects (name, generation) and bigquery (the snapshot's map) go into the run's provenance;
    rerun_of: the run whose recorded inputs this one runs on (spotorch.core.provenance)."""
    pipeline = deps.pipeline(pipeline_name)
    existing, _ = deps.runs.load(run_id)
    if existing is not None:
        return existing
    rule = "parallel" if sweep_id else pipeline.trigger.on_active_run.value
    active = [] if rule == "parallel" else \
        [r for r in deps.runs.active_for_pipeline(pipeline.name) if r.run_id != run_id]
    if active and rule == "skip":
        log.info("snapshot %s skipped: run %s is active", snapshot_id, active[0].run_id)
        return None
    now = deps.clock.now()
    if rerun_of is not None and rerun_of.provenance:
        prov = provenance.for_rerun(rerun_of.provenance, rerun_of.run_id, pipeline)
        recorded = prov.get("hardware") or {}
        # Asked for: today's machines. Or the origin's machines were chosen by hardware probes
        # after it was created (its provenance names the pipeline's own pools): the choice's.
        if rerun_hardware == "current" or (hardware is not None and not recorded.get("candidate")):
            prov["hardware"] = provenance.hardware_of(
                shapes.run_pipeline(pipeline, hardware).job, hardware)
    else:
        prov = _provenance(pipeline, run_id, data_uri, objects, bigquery, params, hardware)
    write_inputs_manifest(deps, prov, objects)
    # A hardware choice given (a rerun's) is final: no probing.
    cache = probe_cache(deps, pipeline) if pipeline.hardware is not None and hardware is None \
        else None
    run = new_run(run_id=run_id, pipeline=pipeline, now=now,
                         data_uri=data_uri, snapshot_id=snapshot_id,
                         queued=bool(active) and rule == "queue", resume_from=resume_from,
                         retry_of=retry_of, reason=reason, sweep_id=sweep_id, params=params,
                         region_order=region_order(deps, pipeline, shape_of(pipeline, None),
                                                   now),
                         region_records=region_records(deps, pipeline,
                                                       shape_of(pipeline, None), now),
                         hardware_cache=cache,
                         outlook=hardware_outlook(deps, pipeline, now) if cache else None,
                         prices=deps.prices, key_seed=key_seed(), hardware=hardware,
                         provenance=prov, rerun_of=rerun_of.run_id if rerun_of else None)
    try:
        version = deps.runs.save(run, None)
    except ConflictError:
        return deps.runs.load(run_id)[0]  # created concurrently by a duplicate delivery
    run = carry_out(deps, run, version, tuple(i.id for i in run.outbox))
    if active and rule == "supersede":
        for old in active:
            cancel_run(deps, old.run_id, f"superseded by run {run_id}")
    return run


def _provenance(pipeline: Pipeline, run_id: str, data_uri: str,
                objects: Sequence[tuple[str, int]], bigquery: Mapping[str, Any] | None,
                params: Mapping[str, Any] | None,
                hardware: Mapping[str, Any] | None) -> dict[str, Any]:
    """A new run's provenance, from its snapshot and the pipeline as the run launches it."""
    bucket = split_gs_uri(data_uri)[0] if data_uri.startswith("gs://") else None
    data = provenance.data_of(pipeline, data_uri, bucket or None, objects, bigquery)
    return provenance.build(pipeline=pipeline, run_id=run_id, data=data, params=params,
                            hardware=hardware,
                            template=shapes.run_pipeline(pipeline, hardware).job)


def write_inputs_manifest(deps: Deps, prov: Mapping[str, Any],
                          objects: Sequence[tuple[str, int]]) -> None:
    """The inputs manifest the trainer reads its objects from, at their generations: written
    once (create-if-absent; its name is its objects' digest), before the run exists, so a crash
    leaves at most an unused manifest. A rerun's is its origin's, there already."""
    data = prov.get("data") or {}
    uri = data.get("manifest_uri")
    if not uri or not objects:
        return
    body = json.dumps(provenance.manifest(data, objects), sort_keys=True).encode()
    with tempfile.NamedTemporaryFile(suffix=".json") as tmp:
        tmp.write(body)
        tmp.flush()
        deps.objects.ensure_file(str(uri), tmp.name)


def snapshot_objects(deps: Deps, snap: SnapshotReady) -> tuple[tuple[str, int], ...]:
    """The snapshot's objects with their generations, for the run's provenance. The intake
    tracks them for every batch mode but a plain marker (the marker alone makes that snapshot):
    there the folder is listed now, at the decision, the producer having written the marker
    last. More than MAX_PINNED_OBJECTS: none (the run's data is then not pinned; logged)."""
    from spotorch.core.pipeline import BatchMode

    tracked = tuple(zip(snap.objects, snap.generations, strict=True))
    trigger = deps.pipeline(snap.pipeline).trigger
    # getattr: a trigger of another source (a BigQuery table) has no batch mode of this kind.
    if snap.manual or getattr(trigger, "batch", None) is not BatchMode.MARKER \
            or getattr(trigger, "manifest", False):
        return tracked
    return folder_objects(deps, snap.data_uri, tracked)


MAX_PINNED_OBJECTS = 2000  # a folder's objects listed for a run's provenance, at most
FOLDER_PAGE_SIZE = 500


def folder_objects(deps: Deps, data_uri: str, tracked: tuple[tuple[str, int], ...] = (),
                   ) -> tuple[tuple[str, int], ...]:
    """Every object under a gs:// folder with its live generation (and those already tracked),
    listed now; () for another URI, or beyond MAX_PINNED_OBJECTS (logged)."""
    if not data_uri.startswith("gs://"):
        return tracked
    bucket, prefix = split_gs_uri(data_uri)
    found: dict[str, int] = dict(tracked)
    token: str | None = None
    while True:
        page = deps.objects.list_page(bucket, prefix, token, FOLDER_PAGE_SIZE)
        found.update((o.name, o.generation) for o in page.objects if not o.name.endswith("/"))
        if len(found) > MAX_PINNED_OBJECTS:
            log.warning("%s has more than %d objects: its run's data is not pinned",
                        data_uri, MAX_PINNED_OBJECTS)
            return ()
        token = page.next_page_token
        if token is None:
            return tuple(sorted(found.items()))


# ---------------------------------------------------------------- operator actions

def cancel_run(deps: Deps, run_id: str, reason: str = "cancelled by an operator") -> Run:
    """Cancel a run and stop its job."""
    run = apply(deps, run_id, [CancelRequested(reason)])
    if run is None:
        raise UnknownRun(f"no run {run_id!r}")
    return run


def retry_run(deps: Deps, run_id: str, request_id: str = "1") -> Run:
    """Start a new run that resumes a failed or cancelled run from its latest checkpoint."""
    old, _ = deps.runs.load(run_id)
    if old is None:
        raise UnknownRun(f"no run {run_id!r}")
    if old.active or old.status is RunStatus.SUCCEEDED:
        raise NotRetryable(f"run {run_id} is {old.status}; only a run that failed or was "
                           "cancelled can be retried")
    resume = deps.checkpoints.latest(old.checkpoint_uri) or old.latest_checkpoint
    new_id = check_id(f"{run_id}-retry-{request_id}"[:63].rstrip("."), "retry run id")
    run = start_run(deps, old.pipeline, run_id=new_id, data_uri=old.data_uri,
                    snapshot_id=old.snapshot_id, reason=f"retry of {run_id}",
                    resume_from=resume, retry_of=old.retry_of or run_id)
    if run is None:
        raise NotRetryable(f"pipeline {old.pipeline} skips new runs while one is active")
    return run


RERUN_HARDWARE = ("recorded", "current")


def rerun_run(deps: Deps, run_id: str, request_id: str = "1", *,
              hardware: str = "recorded") -> Run:
    """A new run of the same pipeline on exactly a run's recorded inputs: the same object
    generations, package URIs or image, seed, parameters and hardware (spotorch.core.provenance).
    Linked by rerun_of; the same request id gives the same run (a repeated request starts none).
    hardware "current": on the machines the pipeline names today instead of the recorded ones."""
    if hardware not in RERUN_HARDWARE:
        raise NotRetryable(f"hardware must be one of {', '.join(RERUN_HARDWARE)}, "
                           f"not {hardware!r}")
    old, _ = deps.runs.load(run_id)
    if old is None:
        raise UnknownRun(f"no run {run_id!r}")
    if not old.provenance:
        raise NotRetryable(f"run {run_id} has no recorded provenance (created before spotorch "
                           "recorded it): it cannot be rerun exactly")
    if old.sweep_id:
        raise NotRetryable(f"run {run_id} is a trial of sweep {old.sweep_id}: rerun its sweep")
    if len(request_id) > 200:
        raise NotRetryable("request_id is longer than 200 characters")
    origin = old.rerun_of or run_id  # a rerun of a rerun names the first run's id
    digest = hashlib.sha256(f"{run_id}\n{request_id}\n{hardware}".encode()).hexdigest()[:8]
    base = f"{origin}"[:63 - len("-rerun-") - len(digest)].rstrip("-.")
    new_id = check_id(f"{base}-rerun-{digest}", "rerun run id")
    prov = old.provenance
    run = start_run(deps, old.pipeline, run_id=new_id, data_uri=old.data_uri,
                    snapshot_id=old.snapshot_id, reason=f"rerun of {run_id}",
                    params=dict(prov.get("params") or old.params),
                    hardware=old.hardware if hardware == "recorded" else None,
                    rerun_of=old, rerun_hardware=hardware)
    if run is None:
        raise NotRetryable(f"pipeline {old.pipeline} skips new runs while one is active")
    return run


REJECTED_REASON_CHARS = 4000


def record_rejected(docs: DocumentStore, *, event_id: str, event_type: str, reason: str,
                    now: float, payload: Mapping[str, Any] | None = None) -> None:
    """Keep a malformed event for people to look at; it is acknowledged, never retried."""
    key = (event_id or f"unknown-{now}").replace("/", "_")[:200]
    # Firestore refuses a string over 1 MiB and a document over 1 MiB: a reason quoting hostile
    # input (a 1 MiB object name) is cut, so the record is written all the same.
    doc = {"event_id": shorten(str(event_id), 1500), "event_type": shorten(str(event_type), 500),
           "reason": shorten(reason, REJECTED_REASON_CHARS), "at": now,
           "payload": repr(payload)[:4000] if payload is not None else None,
           # A timestamp, not a number: Firestore's TTL policy only acts on timestamps.
           "expires_at": datetime.fromtimestamp(now + 30 * 24 * 3600, UTC)}
    with contextlib.suppress(ConflictError):  # recorded by an earlier delivery
        docs.put(COLLECTION_REJECTED, key, doc, None)


def run_summary(run: Run) -> dict[str, Any]:
    """A run as people and the demo read it."""
    return {
        "run_id": run.run_id,
        "pipeline": run.pipeline,
        "status": str(run.status),
        "end_reason": run.end_reason,
        "preemptions": run.counters.preemptions,
        "model_name": run.model_name,
        "sweep_id": run.sweep_id,
        "params": dict(run.params),
        "rerun_of": run.rerun_of,
        "provenance": provenance.summary(run.provenance),
        "escalated": None if not run.escalated else {
            "to": run.escalated["to"], "reason": run.escalated["reason"]},
        "attempts": [{
            "attempt": a.number, "capacity": str(a.capacity), "region": a.region,
            "state": str(a.state), "job_name": a.job_name, "end_reason": a.end_reason,
            "failure_class": str(a.failure) if a.failure else None, "exit_code": a.exit_code,
            "created_at": a.created_at, "started_at": a.started_at, "ended_at": a.ended_at,
            "resumed_from_step": a.resumed_from_step, "progress_reached": a.progress_step,
            "machine_type": a.machine_type, "error": error_line(a.error_tail),
            "error_tail": list(a.error_tail),
        } for a in run.attempts],
        "health": {
            "hangs": run.counters.hangs, "divergences": run.counters.divergences,
            "out_of_memory": run.counters.out_of_memory,
            "checkpoints_deleted": run.health.deleted_checkpoints,
            "bytes_reclaimed": run.health.bytes_reclaimed,
        },
        "probes": [{
            "probe": p.number, "region": p.region, "state": str(p.state), "job_name": p.job_name,
            "found": p.found, "created_at": p.created_at, "started_at": p.started_at,
            "ended_at": p.ended_at, "cancel_reason": p.cancel_reason, "kind": p.kind,
            "candidate": p.candidate,
        } for p in run.probes],
        "preprocess": dict(run.preprocess) if run.preprocess else None,  # issue 31
        "history": [{"at": h.at, "what": h.what, "reason": h.reason} for h in run.history],
    }


def submit(deps: Deps, pipeline_name: str, data_uri: str, *, request_id: str = "") -> Run | None:
    """Start a run by hand for a data URI (CLI/API); the same request id gives the same run.
    The folder's objects are listed now, at the decision: the run's provenance pins their
    generations (a repeated request finds its run before listing again)."""
    from spotorch.app.snapshots import manual_snapshot, run_id_for

    pipeline = deps.pipeline(pipeline_name)
    snap = manual_snapshot(pipeline, data_uri, request_id=request_id, now=deps.clock.now())
    run_id = run_id_for(pipeline.name, snap.snapshot_id)
    from spotorch.app.submissions import check_data_uri

    check_data_uri(deps, pipeline, data_uri)  # 400/404 before anything starts (issue 39)
    existing, _ = deps.runs.load(run_id)
    if existing is not None:
        return existing
    return start_run(deps, pipeline.name, run_id=run_id,
                     data_uri=snap.data_uri, snapshot_id=snap.snapshot_id,
                     reason=f"submitted by hand for {data_uri}",
                     objects=folder_objects(deps, snap.data_uri))
