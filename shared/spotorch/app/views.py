"""Runs and sweeps as operators see them: JSON-able views with ISO 8601 times and the cost
ledger."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from spotorch.core.cost import Ledger, ledger, ledger_dict
from spotorch.core.health import CheckpointAdvice
from spotorch.core.launching import startup_loss
from spotorch.core.model import Attempt, Run, RunStatus
from spotorch.core.observations import error_line
from spotorch.core.pipeline import BatchMode, Pipeline
from spotorch.core.preprocess import PreprocessStep
from spotorch.core.price_list import LIST_PRICES
from spotorch.core.prices import PriceTable
from spotorch.core.sweeps import Sweep, Trial, trade_off
from spotorch.core.sweeps import summary as trial_summary
from spotorch_trainer.contract import rfc3339

if TYPE_CHECKING:
    from spotorch.app.snapshots import SnapshotState

# What each status means, for people (the enum's comments, said once).
STATUS_MEANING: Mapping[RunStatus, str] = {
    RunStatus.QUEUED: "waiting for an earlier run of its pipeline to end",
    RunStatus.PENDING: "created; its first attempt is not launched yet",
    RunStatus.PREPROCESSING: "the preprocess step (Beam on Dataflow, or Spark on Dataproc) "
                             "runs; training waits for its output",
    RunStatus.STARTING: "the current attempt's job is being created or waits for capacity",
    RunStatus.RUNNING: "the current attempt's job is running",
    RunStatus.RECOVERING: "the last attempt ended; the next waits for its backoff",
    RunStatus.CANCELLING: "cancel requested; waiting for the job to stop",
    RunStatus.SUCCEEDED: "the training job finished successfully",
    RunStatus.CANCELLED: "stopped by an operator, superseded, or cancelled outside spotorch",
    RunStatus.FAILED: "the training code failed more often than its user-error budget allows",
    RunStatus.FAILED_PREEMPTED: "preempted more often than the preemption budget allows",
    RunStatus.FAILED_NO_RESOURCE: "no capacity: stockouts beyond their budget",
    RunStatus.FAILED_NO_PROGRESS: "attempts kept ending without a newer checkpoint",
    RunStatus.FAILED_INFRA: "infrastructure errors beyond their budget",
    RunStatus.FAILED_TIMEOUT: "the job hit its timeout more often than allowed",
    RunStatus.FAILED_LAUNCH: "Vertex AI refused the job for good (bad spec, permissions)",
    RunStatus.FAILED_BUDGET: "the estimated cost passed the pipeline's budget",
    RunStatus.PROBING: "hardware candidates are probed; the first attempt waits for the choice",
    RunStatus.REGISTERING: "the job succeeded; its model is being registered",
    RunStatus.FAILED_HUNG: "attempts kept hanging (no trainer report) beyond the hung budget",
    RunStatus.FAILED_DIVERGED: "a divergence rule fired (NaN, spike, plateau); job stopped",
    RunStatus.FAILED_OUT_OF_MEMORY: "out of memory with no larger machine to move to",
    RunStatus.FAILED_QUOTA: "a resource quota refused it in every region, capacity and shape",
}


def preprocess_view(run: Run, cost: float) -> dict[str, Any] | None:
    """The run's preprocess step (issue 31): its Dataflow job, state, output and the cache."""
    if not run.preprocess:
        return None
    step = PreprocessStep.from_doc(run.preprocess)
    return {"phase": str(step.phase), "cache_hit": step.cache_hit, "cache_key": step.cache_key,
            "output_uri": step.output_uri, "job_name": step.job_name, "job_id": step.job_id,
            "region": step.region, "state": step.state, "launches": step.launches,
            "launched_at": iso(step.launched_at), "started_at": iso(step.started_at),
            "ended_at": iso(step.ended_at),
            "failure_class": str(step.failure) if step.failure else None, "error": step.error,
            "cost": round(cost, 4), "kind": step.kind,
            # a Spark step's batch usage (issue 42): UsageMetrics once it has ended
            **({"milli_dcu_seconds": step.milli_dcu_s,
                "shuffle_storage_gb_seconds": step.shuffle_gb_s} if step.kind == "spark" else {})}


JOB_NAME = re.compile(r"^projects/[^/]+/locations/[^/]+/\w+/[^/\s]+$")  # a resource name


def iso(ts: float | None) -> str | None:
    """ISO 8601 UTC with seconds, or None."""
    return None if ts is None else rfc3339(ts, "seconds")


def job_id(job_name: str | None) -> str | None:
    """The numeric id at the end of a Vertex AI job name (what Cloud Logging filters on)."""
    return job_name.rsplit("/", 1)[-1] if job_name else None


def reason(run: Run) -> str | None:
    """Why the run is where it is: its end reason, or what it waits for."""
    if run.status.terminal:
        # a run the code failed: the exception first, then the budget it exhausted
        error = error_line(run.attempts[-1].error_tail) if run.attempts else None
        if error and run.status is not RunStatus.SUCCEEDED:
            return f"{error} ({run.end_reason})" if run.end_reason else error
        return run.end_reason
    if run.status is RunStatus.RECOVERING and run.next_reason:
        return run.next_reason
    if not run.history:
        return None
    last = run.history[-1]
    if last.reason and JOB_NAME.match(last.reason):  # "attempt 2 job created": not its name
        return f"{last.what}; waiting for a machine" if run.status is RunStatus.STARTING \
            else last.what
    return last.reason or last.what


def progress_fraction(run: Run) -> float | None:
    """How far the run is, between 0 and 1; None without a total step count."""
    total = run.progress.total_steps
    return None if not total else min(run.progress.step / total, 1.0)


def attempt_view(a: Attempt) -> dict[str, Any]:
    """An attempt as operators see it, times in ISO 8601."""
    return {
        "attempt": a.number, "capacity": str(a.capacity), "region": a.region,
        "state": str(a.state), "job_name": a.job_name, "job_id": job_id(a.job_name),
        "created_at": iso(a.created_at or None), "queued_since": iso(a.queued_since),
        "started_at": iso(a.started_at), "ended_at": iso(a.ended_at),
        "end_reason": a.end_reason, "failure_class": str(a.failure) if a.failure else None,
        "exit_code": a.exit_code, "resumed_from_step": a.resumed_from_step,
        "resumed_from_uri": a.resumed_from_uri, "progress_step": a.progress_step,
        "machine_type": a.machine_type,
        # what its replicas last wrote to stderr when it failed; `error` is the line that says it
        "error": error_line(a.error_tail), "error_tail": list(a.error_tail),
        # preempted before its trainer reported: no checkpoint yet, and how long after start
        "startup_loss": startup_loss(a),
    }


def run_row(run: Run, pipeline: Pipeline | None, now: float,
            prices: PriceTable = LIST_PRICES) -> dict[str, Any]:
    """One line of a run listing."""
    book = ledger(run, pipeline, now, prices)
    current = run.current
    return {
        "run_id": run.run_id, "pipeline": run.pipeline, "status": str(run.status),
        "active": run.active, "created_at": iso(run.created_at),
        "updated_at": iso(run.updated_at or None), "attempts": len(run.attempts),
        "capacity": str(current.capacity) if current else None,
        "step": run.progress.step, "total_steps": run.progress.total_steps,
        "preemptions": run.counters.preemptions, "reason": reason(run),
        "cost": round(book.total, 4),
        "savings": None if book.savings is None else round(book.savings, 4),
        "savings_pct": None if book.savings_pct is None else round(book.savings_pct, 1),
        "currency": book.currency, "sweep_id": run.sweep_id,
    }


def run_view(run: Run, pipeline: Pipeline | None, now: float,
             prices: PriceTable = LIST_PRICES) -> dict[str, Any]:
    """Everything about one run (`spotorch show`, GET /run, the UI's run page)."""
    book: Ledger = ledger(run, pipeline, now, prices)
    p = run.progress
    checkpoints = [{"step": a.resumed_from_step, "uri": a.resumed_from_uri,
                    "resumed_by_attempt": a.number}
                   for a in run.attempts if a.resumed_from_step is not None]
    return {
        "run_id": run.run_id, "pipeline": run.pipeline, "status": str(run.status),
        "status_meaning": STATUS_MEANING[run.status], "active": run.active,
        "reason": reason(run), "end_reason": run.end_reason,
        "created_at": iso(run.created_at), "updated_at": iso(run.updated_at or None),
        "deadline_at": iso(run.deadline_at), "next_action_at": iso(run.next_action_at),
        "data_uri": run.data_uri, "snapshot_id": run.snapshot_id,
        "checkpoint_uri": run.checkpoint_uri, "model_uri": run.output_uri,
        "model_ready": run.status is RunStatus.SUCCEEDED, "retry_of": run.retry_of,
        "escalated": dict(run.escalated) if run.escalated else None,
        "hardware": dict(run.hardware) if run.hardware else None,  # issue 19: the probed table
        "preprocess": preprocess_view(run, book.preprocess_cost),  # issue 31
        # issue 30: what it trained on and with, as recorded at creation (the full record)
        "provenance": dict(run.provenance) if run.provenance else None,
        "rerun_of": run.rerun_of,
        "sweep_id": run.sweep_id, "params": dict(run.params), "model_name": run.model_name,
        "progress": {"step": p.step, "total_steps": p.total_steps,
                     "fraction": progress_fraction(run), "at": iso(p.at),
                     "steps_per_s": p.rate, "metrics": dict(p.metrics)},
        "counters": {"preemptions": run.counters.preemptions, "stockouts": run.counters.stockouts,
                     "user_errors": run.counters.user_errors,
                     "infra_errors": run.counters.infra_errors, "timeouts": run.counters.timeouts},
        "attempts": [attempt_view(a) for a in run.attempts],
        "latest_checkpoint": None if run.latest_checkpoint is None else {
            "step": run.latest_checkpoint.step, "uri": run.latest_checkpoint.uri},
        "checkpoints_resumed": checkpoints,
        "checkpoint_advice": advice_view(_checkpoint_advice(run, now)),
        "metric_history": [{"step": m.step, "at": iso(m.at), "attempt": m.attempt,
                            "values": dict(m.values)} for m in run.metric_history],
        "sweep_curve": [{"step": p.step, "value": p.value} for p in run.curve],
        # What an operator may do now (the api decides; these say which buttons make sense).
        "can_cancel": run.active, "can_retry": run.status.terminal and
        run.status is not RunStatus.SUCCEEDED,
        "can_rerun": run.status.terminal and bool(run.provenance) and not run.sweep_id,
        "cost": ledger_dict(book),
        "history": [{"at": iso(h.at), "what": h.what, "reason": h.reason} for h in run.history],
    }


def _checkpoint_advice(run: Run, now: float) -> CheckpointAdvice:
    # Imported here: listings (run_row) never need the training-health rules.
    from spotorch.core.training_health import checkpoint_advice

    return checkpoint_advice(run, now)


def advice_view(advice: CheckpointAdvice) -> dict[str, Any]:
    """How often the run checkpoints against the Young/Daly optimum, and what is missing for it."""
    missing = [what for what, value in (
        ("two checkpoints (an interval)", advice.interval_s),
        ("a checkpoint write time (the trainer's checkpoint_s)", advice.checkpoint_cost_s),
        ("a preemption on Spot (time between preemptions)", advice.mtbf_s)) if value is None]
    return {"interval_s": advice.interval_s, "checkpoint_cost_s": advice.checkpoint_cost_s,
            "mtbf_s": advice.mtbf_s, "optimal_s": advice.optimal_s, "verdict": advice.verdict,
            "missing": missing}


# ---------------------------------------------------------------- sweeps


def _metric_of(pipeline: Pipeline | None) -> tuple[str | None, str | None]:
    """The sweep's metric and goal, from its pipeline (the sweep document does not name them)."""
    spec = pipeline.sweep if pipeline is not None else None
    return (spec.quality, str(spec.quality_goal)) if spec is not None else (None, None)


def _best(sw: Sweep) -> Trial | None:
    return sw.trial(sw.best) if sw.best else None


def sweep_row(sw: Sweep, pipeline: Pipeline | None) -> dict[str, Any]:
    """One line of a sweep listing."""
    metric, goal = _metric_of(pipeline)
    best = _best(sw)
    return {
        "sweep_id": sw.sweep_id, "pipeline": sw.pipeline, "status": str(sw.status),
        "active": sw.active, "created_at": iso(sw.created_at),
        "updated_at": iso(sw.updated_at or None),
        "trials_done": sum(1 for t in sw.trials if t.status.ended),
        "trials_total": len(sw.trials), "metric": metric, "goal": goal,
        "best_trial": best.number if best else None,
        "best_metric": best.metric if best else None,
        "model_name": sw.model_name, "reason": sw.end_reason,
    }


def sweep_view(sw: Sweep, pipeline: Pipeline | None) -> dict[str, Any]:
    """Everything about one sweep (`spotorch sweep`, the UI's sweep page): its trials, the best
    one, the registered model."""
    best = _best(sw)
    trials = [{**trial_summary(t), "run_status": t.run_status, "best": t.number == sw.best,
               "curve": [[s, v] for s, v in t.curve]} for t in sw.trials]
    return {
        **sweep_row(sw, pipeline),
        "data_uri": sw.data_uri, "snapshot_id": sw.snapshot_id, "end_reason": sw.end_reason,
        "best": trial_summary(best) if best else None,
        "stopped_early": sum(1 for t in sw.trials if t.stopped_early),
        "cost_estimate": round(sum(t.cost for t in sw.trials), 6),
        "trials": trials,
        "history": [{"at": iso(at), "what": what} for at, what in sw.history],
        # the front of the objectives, the constraints and why the chosen trial was chosen
        "trade_off": trade_off(sw, pipeline.sweep) if pipeline and pipeline.sweep else None,
        "study": sw.study,
    }


# ---------------------------------------------------------------- data arrival

def _waiting_for(state: SnapshotState, pipeline: Pipeline | None) -> str:
    """What an open snapshot waits for, from its pipeline's trigger (when it is loaded)."""
    trigger = pipeline.trigger if pipeline is not None else None
    members = len(state.members())
    if state.batch == BatchMode.MARKER.value:
        marker = f"its marker {trigger.marker}" if trigger else "its marker"
        if state.expected is not None:
            seen = {e.name for e in state.entries}
            missing = sum(1 for n in state.expected if n not in seen)
            return f"{missing} of the {len(state.expected)} objects its manifest lists"
        sample = ", ".join(n.rsplit("/", 1)[-1] for n in state.early)
        return marker + (f" (objects seen: {sample}{', ...' if len(state.early) >= 5 else ''})"
                         if sample else "")
    if state.batch == BatchMode.QUIET_PERIOD.value:
        quiet = trigger.quiet_period_s if trigger else None
        due = iso(state.last_seen + quiet) if quiet is not None and state.last_seen else None
        return (f"quiet: nothing new for {quiet:.0f}s after the last object"
                + (f" (due {due})" if due else "")) if quiet is not None else \
            "quiet after the last object"
    if state.batch == BatchMode.MIN_OBJECTS.value:
        need = trigger.min_objects if trigger else None
        return f"{need} objects ({members} so far)" if need else f"more objects ({members} so far)"
    return "its objects"


def snapshot_view(doc: Mapping[str, Any], pipeline: Pipeline | None,
                  run_status: Callable[[str], str | None] | None = None) -> dict[str, Any]:
    """A snapshot folder as people read it: open (waiting for what), complete, or which run it
    started (and that run's status, when run_status can tell)."""
    from spotorch.app.snapshots import SnapshotState, run_id_for

    state = SnapshotState.from_doc(doc)
    started = state.started
    if started is None and state.snapshot_id and not state.pending_dispatch:
        guess = run_id_for(state.pipeline, state.snapshot_id)  # a document from before `started`
        started = guess if run_status is not None and run_status(guess) is not None else None
    status = run_status(started) if run_status is not None and started else None
    if state.open:
        what, summary = "open", f"open: waiting for {_waiting_for(state, pipeline)}"
    elif state.pending_dispatch:
        what, summary = "complete", "complete: its run is being started"
    elif started is not None:
        what = "started"
        summary = f"complete: started {started}" + (f" ({status})" if status else "")
    else:
        what, summary = "complete", "complete: no run (skipped: a run of its pipeline was active)"
    objects = len(state.members()) or len(state.ready) or len(state.early)
    return {
        "kind": "snapshot", "pipeline": state.pipeline, "data_uri": state.data_uri,
        "batch": state.batch, "state": what, "summary": summary,
        "cycle": state.cycle, "objects": objects, "truncated": state.truncated,
        "first_seen": iso(state.first_seen), "last_seen": iso(state.last_seen),
        "completed_at": iso(state.completed_at), "snapshot_id": state.snapshot_id,
        "started": started if what == "started" else None, "run_status": status,
        "started_kind": "sweep" if pipeline is not None and pipeline.sweep is not None else "run",
    }


def unmatched_view(doc: Mapping[str, Any]) -> dict[str, Any]:
    """A folder of uploads no pipeline took: its objects, per pipeline the rule each missed and
    what the pipeline expects; whether it was alerted on."""
    objects = [{"name": o.get("name"), "seen_at": iso(o.get("seen_at")),
                "misses": list(o.get("misses") or ())} for o in doc.get("objects") or ()]
    first = objects[0]["misses"] if objects else []
    watching = [m for m in first if m.get("rule") != "bucket"] or first
    return {
        "kind": "unmatched", "bucket": doc.get("bucket"), "folder": doc.get("folder"),
        "uri": f"gs://{doc.get('bucket')}/{doc.get('folder')}",
        "state": "resolved" if doc.get("resolved") else "unmatched",
        "summary": ("matches now (the pipelines changed)" if doc.get("resolved") else
                    f"matched no pipeline: {watching[0].get('text')}" if watching else
                    "matched no pipeline"),
        "objects": objects, "more_objects": bool(doc.get("overflow")),
        "first_seen": iso(doc.get("first_seen")), "last_seen": iso(doc.get("last_seen")),
        "alerted_at": iso(doc.get("alerted_at")),
    }


def totals(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Spend, savings and runs by status over run rows (run_row's): one period's figures."""
    by_status: dict[str, int] = {}
    for r in rows:
        by_status[r["status"]] = by_status.get(r["status"], 0) + 1
    return {"runs": len(rows), "by_status": dict(sorted(by_status.items())),
            "spend": round(sum(float(r.get("cost") or 0.0) for r in rows), 4),
            "savings": round(sum(float(r.get("savings") or 0.0) for r in rows), 4),
            "preemptions": sum(int(r.get("preemptions") or 0) for r in rows),
            "active": sum(1 for r in rows if r.get("active"))}
