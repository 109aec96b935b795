"""Probing hardware candidates (issue 19): one short Spot job per candidate, in parallel.

The imperative shell around spotorch.core.hardware: it launches a probe job per candidate through the
JobLauncher port (Spot; labelled as a probe, never an attempt of a run), polls them until they
end or the probe time limit passes (then cancels), reads each trainer's probe report and turns it
into a ProbeResult. It waits in-process, so it is for the CLI and the local stack (`spotorch
advise --probe`); a Cloud Function would have to spread the wait over reconcile ticks.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from spotorch.core.hardware import (
    PROBE_CANDIDATE_LABEL,
    PROBE_LABEL,
    PROBE_REPORT,
    ProbeResult,
    apply,
    cache_key,
    plan_probes,
    result_of,
)
from spotorch.core.model import JobPhase, JobStatus
from spotorch.core.pipeline import Capacity, HardwareCandidate, Pipeline
from spotorch.ports.jobs import LABEL_PIPELINE, JobLauncher, LaunchError, LaunchSpec
from spotorch.ports.store import ConflictError, DocumentStore
from spotorch.settings import COLLECTION_PROBES
from spotorch_trainer import contract

log = logging.getLogger(__name__)

# Reads a probe report by URI (gs:// or a local path); None when it is not there.
ReportReader = Callable[[str], bytes | None]
MAX_REPORT_BYTES = 64 * 1024


@dataclass(frozen=True)
class ProbeSession:
    """Where a round of probes writes, and how it is told apart from runs and other rounds."""

    probe_id: str  # e.g. "probe-demo-20261201t0800": part of every probe's run id label
    checkpoint_root: str  # each probe's SPOTORCH_CHECKPOINT_URI is {root}/{probe_id}/{candidate}
    data_uri: str  # the snapshot the probes train on
    region: str


def probe_run_id(session: ProbeSession, candidate: HardwareCandidate) -> str:
    """The run id a candidate's probe job is labelled with: the session's id and the candidate."""
    return f"{session.probe_id}-{candidate.name}"


def probe_root(session: ProbeSession, candidate: HardwareCandidate) -> str:
    """Where a candidate's probe writes its checkpoints and report."""
    return f"{session.checkpoint_root.rstrip('/')}/{session.probe_id}/{candidate.name}"


def probe_spec(pipeline: Pipeline, session: ProbeSession,
               candidate: HardwareCandidate) -> LaunchSpec:
    """The probe job of one candidate: the pipeline's job on the candidate's shape, on Spot,
    running probe_steps steps; no trainer events (a probe is not a run)."""
    search = pipeline.hardware
    assert search is not None
    run_id = probe_run_id(session, candidate)
    root = probe_root(session, candidate)
    env = {
        contract.ENV_RUN_ID: run_id,
        contract.ENV_ATTEMPT: "0",
        contract.ENV_PIPELINE: pipeline.name,
        contract.ENV_CHECKPOINT_URI: f"{root}/checkpoints",
        contract.ENV_RESUME_FROM: "",
        contract.ENV_RESUME_STEP: "",
        contract.ENV_DATA_URI: session.data_uri,
        contract.ENV_MODEL_URI: f"{root}/model",
        contract.ENV_EVENTS_TOPIC: "",
        contract.ENV_PROBE_STEPS: str(search.probe_steps),
    }
    template = replace(apply(pipeline.job, candidate), timeout_s=search.probe_timeout_s)
    return LaunchSpec(run_id=run_id, pipeline=pipeline.name, attempt=0, capacity=Capacity.SPOT,
                      region=session.region, template=template, env=env,
                      labels={PROBE_LABEL: "1", PROBE_CANDIDATE_LABEL: candidate.name,
                              LABEL_PIPELINE: pipeline.name},
                      display_name=f"spotorch-probe-{run_id}"[:128])


def _report(read: ReportReader, uri: str) -> Mapping[str, Any] | None:
    try:
        data = read(uri)
        doc = json.loads(data[:MAX_REPORT_BYTES]) if data else None
    except (OSError, ValueError) as exc:
        log.warning("cannot read probe report %s: %s", uri, exc)
        return None
    return doc if isinstance(doc, Mapping) else None


@dataclass
class _Probe:
    candidate: HardwareCandidate
    key: str
    job_name: str = ""
    result: ProbeResult | None = None
    statuses: list[JobStatus] = field(default_factory=list)


def _ended(probe: _Probe, status: JobStatus, read: ReportReader, session: ProbeSession,
           now: float) -> ProbeResult:
    uri = f"{probe_root(session, probe.candidate)}/checkpoints/{PROBE_REPORT}"
    report = _report(read, uri)
    return result_of(probe.candidate.name, report,
                     succeeded=status.phase is JobPhase.SUCCEEDED, exit_code=status.exit_code,
                     message=status.message or str(status.phase), now=now, key=probe.key,
                     job_name=status.job_name)


def run_probes(pipeline: Pipeline, session: ProbeSession, launcher: JobLauncher,
               read: ReportReader, *, cache: Mapping[str, ProbeResult] | None = None,
               clock: Callable[[], float] = time.time,
               sleep: Callable[[float], None] = time.sleep,
               poll_s: float = 5.0) -> dict[str, ProbeResult]:
    """Probe every candidate that has no fresh cached result (within the budget), in parallel;
    the result of every candidate, cached, skipped or measured, by name."""
    search = pipeline.hardware
    if search is None:
        return {}
    started = clock()
    plan = plan_probes(pipeline, cache or {}, started)
    results = {r.candidate: r for r in (*plan.cached, *plan.skipped)}
    probes: list[_Probe] = []
    for candidate in plan.probe:
        probe = _Probe(candidate, cache_key(pipeline, candidate, search.probe_steps))
        try:
            probe.job_name = launcher.launch(probe_spec(pipeline, session, candidate))
        except (LaunchError, ValueError) as exc:
            probe.result = ProbeResult(candidate.name, False, reason=f"could not launch: {exc}",
                                       measured_at=started, key=probe.key, infra=True)
        probes.append(probe)
    while any(p.result is None for p in probes):
        now = clock()
        for probe in (p for p in probes if p.result is None):
            try:
                status = launcher.get(probe.job_name)
            except LaunchError as exc:
                if exc.permanent:
                    probe.result = ProbeResult(probe.candidate.name, False, key=probe.key,
                                               reason=f"probe job lost: {exc}", measured_at=now,
                                               infra=True)
                continue
            if status.phase.terminal:
                probe.result = _ended(probe, status, read, session, now)
            elif now - started > search.probe_timeout_s:
                launcher.cancel(probe.job_name)
                probe.result = ProbeResult(
                    probe.candidate.name, False, key=probe.key, measured_at=now,
                    job_name=probe.job_name, infra=status.start_time is None,  # no machine
                    reason=f"timed out: not done within {search.probe_timeout_s:.0f}s "
                           f"({status.phase})")
        if any(p.result is None for p in probes):
            sleep(poll_s)
    results |= {p.candidate.name: p.result for p in probes if p.result is not None}
    return {c.name: results[c.name] for c in search.candidates if c.name in results}


# --- the probe cache: one document per pipeline, candidate name -> result --------------------



def load_cache(docs: DocumentStore, pipeline: str) -> dict[str, ProbeResult]:
    """The pipeline's cached probe results (fresh or not; plan_probes and choose judge)."""
    doc, _ = docs.get(COLLECTION_PROBES, pipeline)
    found = (doc or {}).get("results") or {}
    return {name: ProbeResult.from_doc(r) for name, r in found.items() if isinstance(r, Mapping)}


def save_cache(docs: DocumentStore, pipeline: str, results: Mapping[str, ProbeResult],
               now: float) -> None:
    """Merge results into the pipeline's cache (last writer wins: results are measurements). A
    probe that gave no answer (infra: not launched, lost, no machine) is no verdict on its
    candidate and is not cached: the next run probes it again."""
    results = {name: r for name, r in results.items() if not r.infra}
    if not results:
        return
    for _ in range(3):
        doc, version = docs.get(COLLECTION_PROBES, pipeline)
        merged = dict((doc or {}).get("results") or {})
        merged |= {name: r.to_doc() for name, r in results.items()}
        try:
            docs.put(COLLECTION_PROBES, pipeline, {"pipeline": pipeline, "results": merged,
                                                  "updated_at": now}, version)
            return
        except ConflictError:
            continue
    log.warning("probe cache of %s not saved: kept changing under us", pipeline)
