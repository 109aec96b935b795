"""What a job or its trainer says: job-state changes, log lines (hints), trainer reports."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from spotorch.app import preprocess_steps
from spotorch.app.deps import (
    ContradictedLine,
    Deps,
    ForgedReport,
    ImplausibleReport,
    NotOurJob,
    OtherProject,
    UnknownAttempt,
    UnknownRun,
    job_owner,
)
from spotorch.app.launch_specs import hardware_result
from spotorch.app.unit_of_work import apply
from spotorch.core import preprocess as pp
from spotorch.core.model import Checkpoint, FailureClass, JobPhase, JobStatus, Run
from spotorch.core.observations import (
    ERROR_TAIL_LINES,
    JobObserved,
    Observation,
    PreprocessObserved,
    ProbeMissing,
    ProbeObserved,
    TrainerReported,
)
from spotorch.core.preprocessing import step_of
from spotorch.core.recovery import WORKER_FAILURES, classify
from spotorch.core.trust import SignedMessage, checkpoint_outside, implausible, unproven
from spotorch.ports.jobs import LaunchError

log = logging.getLogger("spotorch.app.job_events")



# ---------------------------------------------------------------- events and the tick

def job_changed(deps: Deps, run_id: str, attempt: int, status: JobStatus,
                event_id: str | None = None, *, confirmed: bool = True) -> Run:
    """A job's state changed; when it ended, look up the checkpoint it left first."""
    def observe(run: Run) -> Sequence[Observation]:
        if run.attempt(attempt) is None:
            raise UnknownAttempt(f"run {run_id} has no attempt {attempt}")
        if not confirmed:
            return [JobObserved(attempt, status, None, confirmed=False)]
        return [JobObserved(attempt, status, checkpoint_if_ended(deps, run, status),
                            error_tail=error_tail_if_failed(deps, run, attempt, status))]
    return _apply_known(deps, run_id, observe, event_id)


def probe_changed(deps: Deps, run_id: str, probe: int, status: JobStatus,
                  event_id: str | None = None) -> Run:
    """Vertex's own status of a probe's job."""
    def observe(run: Run) -> Sequence[Observation]:
        known = run.probe(probe)
        if known is None:
            raise UnknownAttempt(f"run {run_id} has no probe {probe}")
        return [ProbeObserved(probe, status, hardware_result(deps, run, known, status))]
    return _apply_known(deps, run_id, observe, event_id)


def job_line_reported(deps: Deps, job_id: str, phase: JobPhase, message: str,
                      event_id: str | None = None, *, project: str | None = None) -> Run:
    """A job's service log line (log sink): a hint that makes spotorch ask Vertex.

    The line names only a job (and a project); the job record says whose it is and where
    (region). Whatever the line says, only Vertex's answer (GetCustomJob) is applied: anyone who
    may write log entries in the project can write such a line. A line that says more than
    Vertex (CANCELLING, an ending, of a job Vertex runs) is recorded as contradicted once
    Vertex's answer is applied. A transient failure of the check raises, so the message comes
    back; NOT_FOUND is left to the tick's polling (lost after polls and time).
    """
    if project is not None and deps.project and project != deps.project:
        raise OtherProject(f"job {job_id} is a job of project {project!r}, not {deps.project!r}")
    owner = job_owner(deps, job_id)
    if owner is None:
        raise NotOurJob(f"job {job_id} is not one spotorch created (no job record)")
    try:
        status = deps.launcher.get(owner.job_name)
    except LaunchError as exc:
        if exc.code != "NOT_FOUND":
            raise
        if owner.probe:
            gone = ProbeMissing(owner.probe, owner.job_name)
            return _apply_known(deps, owner.run_id, lambda _run: [gone], event_id)
        run, _ = deps.runs.load(owner.run_id)
        if run is None:
            raise UnknownRun(f"no run {owner.run_id!r}") from None
        return run  # the tick counts it as missing and, in time, as lost
    if owner.probe:
        run = probe_changed(deps, owner.run_id, owner.probe, status, event_id)
    else:
        run = job_changed(deps, owner.run_id, owner.attempt, status, event_id)
    if phase != status.phase and phase.rank >= status.phase.rank:
        raise ContradictedLine(f"job {job_id}: the line says {phase}, Vertex says "
                               f"{status.phase} (Vertex's answer applied)")
    return run


def checkpoint_if_ended(deps: Deps, run: Run, status: JobStatus) -> Checkpoint | None:
    """The run's latest checkpoint once its job has ended; None while it runs or if unreadable."""
    if not status.phase.terminal:
        return None
    try:
        return deps.checkpoints.latest(run.checkpoint_uri)
    except Exception as exc:  # the decision can go on with what the trainer reported
        log.warning("checkpoint lookup for %s failed: %s", run.run_id, exc)
        return None


def _classified(deps: Deps, run: Run, status: JobStatus) -> FailureClass:
    """A failed job's class by its run's pipeline's patterns (the defaults if it is gone)."""
    pipeline = deps.pipelines.get(run.pipeline)
    return classify(status, pipeline.recovery if pipeline else None,
                    pipeline.health if pipeline else None) or FailureClass.INFRA


def error_tail_if_failed(deps: Deps, run: Run, number: int, status: JobStatus) -> tuple[str, ...]:
    """The last stderr lines of a job Vertex says failed through its code's doing, looked up
    once: while the attempt has not ended yet. Without them the decision goes on (a log read
    failing, over quota say, never holds up a run)."""
    attempt = run.attempt(number)
    if (deps.job_logs is None or attempt is None or not attempt.live
            or status.phase is not JobPhase.FAILED
            or _classified(deps, run, status) not in WORKER_FAILURES):
        return ()
    job_name = status.job_name or attempt.job_name
    if not job_name:
        return ()
    try:
        # Since the job's creation: started_at is when spotorch heard it run, which may be after
        # its first lines (a hint's time, a poll's).
        return deps.job_logs.error_tail(job_name, since=attempt.created_at or None,
                                        limit=ERROR_TAIL_LINES)
    except Exception as exc:
        log.warning("error lines of %s not read: %s", job_name, exc, extra={"run_id": run.run_id})
        return ()


def trainer_message(deps: Deps, run_id: str, report: TrainerReported, message: SignedMessage,
                    event_id: str | None = None) -> Run:
    """A trainer event from Pub/Sub: applied only if its attempt's key signed it.

    Anyone who may publish to the trainer-events topic (every job of every pipeline) can send
    any JSON: an unsigned, mis-signed or other-attempt message is refused (ForgedReport) and
    recorded by the entry point, whatever it says."""
    verified: list[bool] = []  # a conflict re-reads the run; the attempt's key never changes

    def observe(run: Run) -> Sequence[Observation]:
        if not verified:
            why = unproven(run, report, message)
            if why is not None:
                raise ForgedReport(f"run {run_id}: {why}")
            verified.append(True)
        return _believed(deps, run, report)
    return _apply_known(deps, run_id, observe, event_id)


def trainer_reported(deps: Deps, run_id: str, report: TrainerReported,
                     event_id: str | None = None) -> Run:
    """The trainer of an attempt reported progress, a checkpoint, or its end; for a report whose
    origin is already proven (trainer_message checks the signature of one from Pub/Sub)."""
    return _apply_known(deps, run_id, lambda run: _believed(deps, run, report), event_id)


def _believed(deps: Deps, run: Run, report: TrainerReported) -> Sequence[Observation]:
    """The report as an observation, if it may be true of this run: its attempt exists, its
    progress is plausible, and a checkpoint it names is the run's own and complete."""
    if run.attempt(report.attempt) is None:
        raise UnknownAttempt(f"run {run.run_id} has no attempt {report.attempt}")
    why = implausible(run, report, deps.clock.now())
    if why is None and report.checkpoint_uri:
        why = _checkpoint_problem(deps, run, report)
    if why is not None:
        raise ImplausibleReport(f"run {run.run_id} attempt {report.attempt}: {why}")
    return [] if _coalesced(run, report) else [report]


def _checkpoint_problem(deps: Deps, run: Run, report: TrainerReported) -> str | None:
    """Why the checkpoint a report names may not become the run's (None: it may): it must be
    the run's own checkpoint of the reported step, complete in storage now."""
    uri, step, named = report.checkpoint_uri or "", report.step, report.checkpoint
    if step is None:
        return f"checkpoint {uri[:200]!r} reported without its step"
    outside = checkpoint_outside(run, uri, step)
    if outside is not None or named is None:
        return outside or f"checkpoint {uri[:200]!r} names no checkpoint directory"
    if run.latest_checkpoint == named:
        return None  # already checked (a repeated report of the latest checkpoint)
    found = deps.checkpoints.complete_step(uri)  # a transient storage error raises: redelivered
    if found != named.step:
        return (f"no complete checkpoint of step {named.step} at {uri[:200]!r}"
                + (f" (its marker says step {found})" if found is not None else ""))
    return None


def _apply_known(deps: Deps, run_id: str, observe: Callable[[Run], Sequence[Observation]],
                 event_id: str | None) -> Run:
    """apply() for an event about a run that must exist: an unknown run is an error to record."""
    run = apply(deps, run_id, observe, event_id=event_id)
    if run is None:
        raise UnknownRun(f"no run {run_id!r}")
    return run


# Firestore sustains about one write per second per document: plain progress reports closer
# than this to the last one written are acknowledged without a write (the next one carries the
# news, metrics included). Checkpoints, starts and ends are always written.
COALESCE_S = 1.0


def _coalesced(run: Run, report: TrainerReported) -> bool:
    last = run.progress.at
    return (report.kind == "progress" and report.checkpoint_uri is None
            and not report.nonfinite  # a diverging loss is news now (training health)
            and last is not None and 0.0 <= report.at - last < COALESCE_S
            and (report.step or 0) >= run.progress.step)


# ------------------------------------------ a preprocess step's job or batch: hints from events

def status_changed(deps: Deps, hint: pp.StatusHint, event_id: str) -> Run | None:
    """A Dataflow statusChanged event: a hint about a Beam step's job (step_hinted)."""
    return step_hinted(deps, hint, event_id, "beam")


def batch_hinted(deps: Deps, hint: pp.StatusHint, event_id: str) -> Run | None:
    """A Dataproc audit entry about a batch (entrypoints.batch_entries): a hint about a Spark
    step's batch (step_hinted)."""
    return step_hinted(deps, hint, event_id, "spark")


def step_hinted(deps: Deps, hint: pp.StatusHint, event_id: str, kind: str) -> Run | None:
    """An event says a preprocess step's job (Dataflow) or batch (Dataproc) may have moved: a
    hint only. What spotorch launched under that name is read with GetJob or GetBatch and that
    answer (never the event's claim) is what the run decides on; a job or batch spotorch did not
    launch, of another project, or of the other kind of step, is ignored (None)."""
    service = preprocess_steps.service_of(kind)
    if deps.project and hint.project != deps.project:
        log.debug("%s event of project %s ignored", service, hint.project)
        return None
    run_id = preprocess_steps.owner_of(deps, hint.job_name) if hint.job_name else None
    if run_id is None:
        log.debug("%s event of %s (not spotorch's) ignored", service, hint.job_name)
        return None
    launcher = preprocess_steps.step_launcher(deps, kind)

    def observe(fresh: Run) -> list[Observation]:
        step = step_of(fresh)
        if step is None or step.job_name != hint.job_name or not step.live \
                or (step.kind == "spark") != (kind == "spark"):  # one service never speaks
            return []  # for the other; an earlier launch's job, or a step that has ended
        # By the id GetJob gave before, never the event's (a forged event names any id).
        return [PreprocessObserved(launcher.get(hint.job_name, step.region, step.job_id))]

    return apply(deps, run_id, observe, event_id=event_id)
