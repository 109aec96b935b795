"""The reconcile tick: list live jobs, poll what events missed, fan out, finish what crashes left."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from spotorch.app import preprocess_steps, unmatched
from spotorch.app.arrivals import list_landing, start_snapshot_run
from spotorch.app.deps import Deps
from spotorch.app.job_events import checkpoint_if_ended, error_tail_if_failed
from spotorch.app.launch_specs import hardware_result
from spotorch.app.orphan_launches import adopt_orphans
from spotorch.app.unit_of_work import apply, promote_next
from spotorch.core.intents import LaunchIntent
from spotorch.core.model import (
    PROBE_CAPACITY,
    PROBE_HARDWARE,
    RECONCILE_BUCKETS,
    FailureClass,
    JobPhase,
    JobStatus,
    Run,
    RunStatus,
    probe_key,
)
from spotorch.core.observations import (
    QUOTA_REFUSED,
    JobMissing,
    JobObserved,
    Observation,
    ProbeMissing,
    ProbeObserved,
    Tick,
)
from spotorch.ports.jobs import LABEL_ATTEMPT, LABEL_BUCKET, LABEL_PROBE, LABEL_RUN, LaunchError, label_value

log = logging.getLogger("spotorch.app.tick")



@dataclass(frozen=True)
class Listing:
    """What ListCustomJobs said of spotorch's live jobs: their statuses, and where it could say.

    A live attempt whose job is absent from a listed region has ended (or vanished): only then is
    GetCustomJob asked. In a region whose listing failed, every live job is asked.
    """

    statuses: Mapping[str, JobStatus]
    regions: frozenset[str]


def list_live_jobs(deps: Deps, regions: Sequence[str]) -> Listing:
    """What ListCustomJobs says of live jobs, region by region; a failed region is left out."""
    statuses: dict[str, JobStatus] = {}
    listed: set[str] = set()
    for region in sorted(set(regions)):
        try:
            statuses.update((s.job_name, s) for s in deps.launcher.list_live(region))
        except LaunchError as exc:
            log.warning("listing live jobs in %s failed (each job is asked instead): %s",
                        region, exc)
            continue
        listed.add(region)
    return Listing(statuses, frozenset(listed))


def _regions_of(runs: Sequence[Run]) -> list[str]:
    return sorted({a.region for r in runs for a in r.attempts if a.live and a.job_name})


def tick(deps: Deps, *, buckets: Sequence[int] | None = None,
         listing: Listing | None = None) -> list[Run]:
    """Reconcile: every active run (or those of some buckets) against its job, timers fired,
    crashes' leftovers finished. Job states come from one listing per region, not a call per job."""
    runs = deps.runs.active() if buckets is None else deps.runs.active_in_buckets(buckets)
    if listing is None:
        listing = list_live_jobs(deps, _regions_of(runs))
    touched: list[Run] = []
    pipelines_with_queue: set[str] = set()
    for run in runs:
        if run.status is RunStatus.QUEUED:
            pipelines_with_queue.add(run.pipeline)
            continue
        result = apply(deps, run.run_id, _poll(deps, run, listing), take_over=True)
        if result is not None:
            touched.append(result)
    for name in pipelines_with_queue:
        promote_next(deps, name)
    _retry_deferred_launches(deps, touched)
    cancel_stray_probes(deps, runs, listing, buckets)
    if not buckets or 0 in buckets:  # sweeps are few: one shard (or the whole tick) takes them
        from spotorch.app import sweeps as sweep_service

        sweep_service.reconcile_sweeps(deps)
        if deps.endpoints is not None:  # issue 37: canaries watched, crashed rollouts repaired
            from spotorch.app import serving

            serving.reconcile_rollouts(deps)
    return touched


# A launch the request budget refused (Vertex allows 60 submissions a minute per region) is
# tried again by the same tick while the budget refills, rather than a whole tick later: 100
# relaunches after a mass preemption are then all created within about two minutes.
LAUNCH_RETRY_WINDOW_S = 150.0
LAUNCH_RETRY_PAUSE_S = 5.0


def _retry_deferred_launches(deps: Deps, runs: Sequence[Run]) -> None:
    def deferred(run: Run) -> bool:  # a launch refused for quota (its claim given up)
        now = deps.clock.now()
        return run.active and any(isinstance(i, LaunchIntent) and i.claimed_until <= now
                                  and i.deferred == QUOTA_REFUSED for i in run.outbox)

    waiting = [r.run_id for r in runs if deferred(r)]
    # Bounded in real time (the invocation's), whatever clock the decisions use.
    until = time.monotonic() + LAUNCH_RETRY_WINDOW_S
    while waiting and time.monotonic() < until:
        time.sleep(LAUNCH_RETRY_PAUSE_S)  # the budget refills by the minute
        for i, run_id in enumerate(waiting):
            if time.monotonic() >= until:  # each try may wait for the budget: bounded too
                waiting = waiting[i:]
                break
            run = apply(deps, run_id, [], take_over=True)
            if run is not None and deferred(run):
                waiting = waiting[i:]  # refused again: the budget is spent for now, the rest wait
                break
        else:
            waiting = []
    if waiting:
        log.info("tick: %d launch(es) wait for the next tick", len(waiting))


def _poll(deps: Deps, run: Run, listing: Listing) -> Callable[[Run], list[Observation]]:
    """Each live job's status from the listing, or from Vertex where the listing cannot answer;
    the checkpoint lookups wait for the fresh run."""
    statuses: list[tuple[int, JobStatus]] = []
    missing: list[Observation] = []
    for attempt in run.attempts:
        if not (attempt.live and attempt.job_name):
            continue
        listed = listing.statuses.get(attempt.job_name)
        if listed is not None:
            statuses.append((attempt.number, listed))
            continue
        try:
            statuses.append((attempt.number, deps.launcher.get(attempt.job_name)))
        except LaunchError as exc:
            if exc.code == "NOT_FOUND":
                missing.append(JobMissing(attempt.number, attempt.job_name))
            log.warning("polling %s failed: %s", attempt.job_name, exc,
                        extra={"run_id": run.run_id})
    probed = [*_poll_probes(deps, run, listing), *preprocess_steps.poll(deps, run),
              *adopt_orphans(deps, run)]  # a launch whose executor died (issue 39)

    def observe(fresh: Run) -> list[Observation]:
        polled: list[Observation] = [
            JobObserved(n, s, checkpoint_if_ended(deps, fresh, s),
                        error_tail=error_tail_if_failed(deps, fresh, n, s))
            for n, s in statuses]
        return [*polled, *missing, *probed, Tick()]
    return observe


def _poll_probes(deps: Deps, run: Run, listing: Listing) -> list[Observation]:
    """The live probe's status: from the listing, else asked (it ended, or is not listed)."""
    found: list[Observation] = []
    for probe in run.probes:
        if not (probe.live and probe.job_name):
            continue
        listed = listing.statuses.get(probe.job_name)
        if listed is not None:
            found.append(ProbeObserved(probe.number, listed))
            continue
        try:
            status = deps.launcher.get(probe.job_name)
            found.append(ProbeObserved(probe.number, status,
                                       hardware_result(deps, run, probe, status)))
        except LaunchError as exc:
            if exc.code == "NOT_FOUND":
                found.append(ProbeMissing(probe.number, probe.job_name))
            log.warning("polling probe %s failed: %s", probe.job_name, exc,
                        extra={"run_id": run.run_id})
    return found


def cancel_stray_probes(deps: Deps, runs: Sequence[Run], listing: Listing,
                        buckets: Sequence[int] | None = None) -> int:
    """Cancel listed live probe jobs that no active run is waiting on (the run ended, or lost
    track of it in a crash): a probe left behind bills Spot time for nothing."""
    by_label = {label_value(r.run_id): r for r in runs}
    cancelled = 0
    for status in listing.statuses.values():
        labels = status.labels
        if labels.get(LABEL_PROBE) not in (PROBE_CAPACITY, PROBE_HARDWARE):
            continue
        bucket = labels.get(LABEL_BUCKET, "")
        if buckets is not None and (not bucket.isdigit() or int(bucket) not in buckets):
            continue  # another shard's
        run = by_label.get(labels.get(LABEL_RUN, ""))
        if run is not None and _waits_on(run, status):
            continue
        if run is not None:  # it may have launched the probe since the tick loaded it
            fresh, _ = deps.runs.load(run.run_id)
            if fresh is not None and _waits_on(fresh, status):
                continue
        try:
            deps.launcher.cancel(status.job_name)
            cancelled += 1
            log.info("cancelled stray probe %s (run %s)", status.job_name, labels.get(LABEL_RUN))
        except LaunchError as exc:
            log.warning("cancelling stray probe %s failed: %s", status.job_name, exc)
    return cancelled


def _waits_on(run: Run, status: JobStatus) -> bool:
    """Whether a live probe of the run is this job (or this probe, its creation in flight)."""
    return any(probe.live and probe.cancel_reason is None and (
        probe.job_name == status.job_name
        or (probe.job_name is None
            and status.labels.get(LABEL_ATTEMPT) == probe_key(probe.number)))
        for probe in run.probes)


# ---------------------------------------------------------------- fanning the tick out

FANOUT_AFTER_JOBS = 500  # more live jobs than this: shards reconcile them in parallel
RECONCILE_SHARDS = 8  # each takes RECONCILE_BUCKETS / RECONCILE_SHARDS buckets


def _status_doc(status: JobStatus) -> dict[str, Any]:
    return {"job_name": status.job_name, "phase": str(status.phase),
            "failure": str(status.failure) if status.failure else None,
            "exit_code": status.exit_code, "message": status.message[:500],
            "labels": dict(status.labels), "create_time": status.create_time,
            "start_time": status.start_time, "end_time": status.end_time,
            "error_code": status.error_code, "state": status.state, "started": status.started}


def status_from_doc(doc: Mapping[str, Any]) -> JobStatus:
    """The JobStatus a shard message carries (the inverse of _status_doc)."""
    return JobStatus(job_name=str(doc["job_name"]), phase=JobPhase(doc["phase"]),
                     failure=FailureClass(doc["failure"]) if doc.get("failure") else None,
                     exit_code=doc.get("exit_code"), message=str(doc.get("message") or ""),
                     labels={str(k): str(v) for k, v in (doc.get("labels") or {}).items()},
                     create_time=doc.get("create_time"), start_time=doc.get("start_time"),
                     end_time=doc.get("end_time"), error_code=int(doc.get("error_code") or 0),
                     state=str(doc.get("state") or ""), started=doc.get("started"))


def shard_buckets(shard: int, shards: int = RECONCILE_SHARDS) -> list[int]:
    """The reconcile buckets one shard of the tick handles."""
    return [b for b in range(RECONCILE_BUCKETS) if b % shards == shard]


def reconcile_runs(deps: Deps) -> list[Run]:
    """List live jobs once per region; reconcile here, or hand the buckets out in shards."""
    regions = sorted({r for p in deps.pipelines.values() for r in p.job.regions}
                     | set(_regions_of(deps.runs.active()) if deps.shards is None else ()))
    listing = list_live_jobs(deps, regions)
    if deps.shards is None or len(listing.statuses) <= FANOUT_AFTER_JOBS:
        return tick(deps, listing=listing)
    by_shard: dict[int, list[dict[str, Any]]] = {k: [] for k in range(RECONCILE_SHARDS)}
    for status in listing.statuses.values():
        bucket = status.labels.get(LABEL_BUCKET, "")
        if bucket.isdigit():
            by_shard[int(bucket) % RECONCILE_SHARDS].append(_status_doc(status))
    for shard, docs in by_shard.items():
        deps.shards.dispatch({"shard": shard, "shards": RECONCILE_SHARDS,
                              "regions": sorted(listing.regions), "statuses": docs})
    log.info("tick: %d live jobs handed to %d shards", len(listing.statuses), RECONCILE_SHARDS)
    return []


def reconcile_shard(deps: Deps, shard: Mapping[str, Any]) -> list[Run]:
    """One shard of a fanned-out tick: its buckets' runs against the statuses it carries."""
    buckets = shard_buckets(int(shard["shard"]), int(shard["shards"]))
    statuses = {s.job_name: s for s in map(status_from_doc, shard.get("statuses") or ())}
    # Jobs of these buckets absent from the listing of a listed region are asked one by one.
    listing = Listing(statuses, frozenset(str(r) for r in shard.get("regions") or ()))
    return tick(deps, buckets=buckets, listing=listing)


def reconcile(deps: Deps) -> list[Run]:
    """The tick: close due snapshots, list the landing prefixes, then reconcile every active run."""
    from spotorch.app import snapshots as intake

    def run_exists(run_id: str) -> bool:
        return deps.runs.load(run_id)[0] is not None

    for snap in intake.close_due_snapshots(pipelines=tuple(deps.pipelines.values()),
                                           docs=deps.docs, now=deps.clock.now(),
                                           run_exists=run_exists):
        start_snapshot_run(deps, snap, "closed by the tick")
    try:
        from spotorch.app.table_intake import check_tables

        check_tables(deps)  # what BigQuery audit events missed
    except Exception as exc:  # a repair, like the listing below
        log.warning("checking the BigQuery tables failed: %s", exc)
    try:
        list_landing(deps)
    except Exception as exc:  # listing is a repair; the runs' reconcile must not wait for it
        log.warning("listing the landing buckets failed: %s", exc)
    try:
        unmatched.alert_quiet_uploads(deps.docs, deps.publisher, tuple(deps.pipelines.values()),
                                      deps.clock.now(), deps.unmatched_alert_after_s)
    except Exception as exc:  # an alert; the next tick tries again
        log.warning("alerting on unmatched uploads failed: %s", exc)
    return reconcile_runs(deps)
