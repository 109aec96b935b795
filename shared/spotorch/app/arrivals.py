"""Data arrival: object events and listings of the landing buckets, into snapshots and their runs."""

from __future__ import annotations

import contextlib
import logging

from spotorch.app import unmatched
from spotorch.app.deps import Deps
from spotorch.app.runs import snapshot_objects, start_run
from spotorch.app.snapshots import SnapshotReady
from spotorch.core.errors import InvalidEvent, SpotorchError
from spotorch.core.model import Run
from spotorch.core.triggers import ObjectEvent, ObjectEventKind
from spotorch.ports.store import ConflictError
from spotorch.settings import COLLECTION_LISTINGS

log = logging.getLogger("spotorch.app.arrivals")




# ---------------------------------------------------------------- data arrival

def data_arrived(deps: Deps, obj: ObjectEvent, *, listed: bool = False) -> list[Run]:
    """An object event (Eventarc, a GCS notification, or a listing): batch it, start what it completes.

    A finalize event counts only if that generation exists (one metadata read), so a forged or
    stale event cannot start a run.
    """
    from spotorch.app import snapshots as intake

    pipelines = tuple(deps.pipelines.values())
    if not unmatched.matches_any(obj, pipelines):
        misses = unmatched.unintended_misses(obj, pipelines)
        why = ("; ".join(f"{m.pipeline}: {m.text}" for m in misses) if misses
               else unmatched.why_unmatched(obj, pipelines))
        # A listing feeds the same objects tick after tick for a while: only events say it.
        log.log(logging.DEBUG if listed else logging.INFO, "object %s matches no pipeline: %s",
                obj.uri, why, extra={"event_id": obj.event_id})
        # Recorded for people (spotorch snapshots, one alert): only objects that exist.
        if misses is not None and (listed or deps.objects.exists(obj.bucket, obj.name,
                                                                  obj.generation)):
            unmatched.record_unmatched(deps.docs, obj, misses, deps.clock.now())
        return []
    if obj.kind == ObjectEventKind.FINALIZE and not listed and \
            not deps.objects.exists(obj.bucket, obj.name, obj.generation):
        raise InvalidEvent(f"{obj.uri} generation {obj.generation} does not exist",
                           event_id=obj.event_id)
    ready = intake.handle_object_event(obj, pipelines=pipelines, docs=deps.docs,
                                       now=deps.clock.now(), reader=deps.objects)
    return [run for snap in ready if (run := start_snapshot_run(deps, snap, "complete"))]


def start_snapshot_run(deps: Deps, snap: SnapshotReady, why: str) -> Run | None:
    """The one run of a completed snapshot; then the snapshot is marked dispatched."""
    from spotorch.app import snapshots as intake

    if deps.pipeline(snap.pipeline).sweep is not None:  # a sweep pipeline: the snapshot's sweep
        from spotorch.app import sweeps as sweep_service

        sweep = sweep_service.start_snapshot_sweep(deps, snap, why)
        intake.mark_dispatched(snap, docs=deps.docs, started=sweep.sweep_id)
        return None
    run = start_run(deps, snap.pipeline, run_id=intake.run_id_for(snap.pipeline, snap.snapshot_id),
                    data_uri=snap.data_uri, snapshot_id=snap.snapshot_id,
                    reason=f"data snapshot {snap.data_uri} {why}",
                    objects=snapshot_objects(deps, snap),
                    # A BigQuery snapshot's map (the bq intake's), carried into provenance as is.
                    bigquery=snap.bigquery)
    # Also when skipped (no run): it must not come back.
    intake.mark_dispatched(snap, docs=deps.docs, started=run.run_id if run else None)
    log.info("snapshot %s ready", snap.snapshot_id,
             extra={"run_id": run.run_id if run else None, "pipeline": snap.pipeline})
    return run


LISTING_PAGE_SIZE = 500
LISTING_PAGES_PER_TICK = 4  # bounded work per invocation; a long listing goes on next tick
# Objects older than the first listing of a prefix by more than this predate spotorch's watch
# (or their events were handled then): a first deploy on a full bucket starts no old runs.
LISTING_LOOKBACK_S = 3600.0
# Objects updated this long before the start of the last completed pass are not fed again (they
# were, by that pass); the margin covers the gap between GCS's clock and ours.
LISTING_MARGIN_S = 600.0


def list_landing(deps: Deps) -> int:
    """Feed the objects of every landing prefix to intake, as events would: what events missed.

    Each (bucket, prefix) keeps a cursor in Firestore, so a tick reads at most
    LISTING_PAGES_PER_TICK pages and the next one carries on; at the end the cursor starts over.
    Listed objects go through the same intake as events (by object generation), so an object
    whose event did arrive changes nothing; a snapshot starts its run exactly once either way.
    Returns the number of objects listed.
    """
    from spotorch.app import snapshots as intake

    listed = 0
    now = deps.clock.now()
    for bucket, prefix in intake.landing_prefixes(tuple(deps.pipelines.values())):
        key = f"{bucket}:{prefix}".replace("/", "|")[:1400]
        doc, version = deps.docs.get(COLLECTION_LISTINGS, key)
        state = doc or {}
        token = state.get("page_token")
        since = float(state.get("watching_since") or now)
        # A pass over the prefix spans ticks; what a completed pass listed is not fed again.
        pass_started = now if token is None else float(state.get("pass_started") or now)
        fed_before = state.get("fed_before")
        skip_before = since - LISTING_LOOKBACK_S
        if fed_before is not None:
            skip_before = max(skip_before, float(fed_before) - LISTING_MARGIN_S)
        for _ in range(LISTING_PAGES_PER_TICK):
            page = deps.objects.list_page(bucket, prefix, token, LISTING_PAGE_SIZE)
            for info in page.objects:
                if info.updated is not None and info.updated < skip_before:
                    continue
                listed += 1
                try:
                    data_arrived(deps, intake.listed_event(info), listed=True)
                except SpotorchError as exc:
                    log.warning("listed object gs://%s/%s: %s", info.bucket, info.name, exc)
            token = page.next_page_token
            if token is None:
                fed_before = pass_started  # everything older was listed by this pass
                break
        with contextlib.suppress(ConflictError):  # another tick listed it meanwhile: fine
            deps.docs.put(COLLECTION_LISTINGS, key, {
                "page_token": token, "bucket": bucket, "prefix": prefix, "watching_since": since,
                "pass_started": pass_started, "fed_before": fed_before, "listed_at": now},
                version)
    return listed
