"""Runs and sweeps as operators see them: JSON-able views with ISO 8601 times and the cost
ledger."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from spotorch.core.cost import Ledger, ledger, ledger_dict
from spotorch.core.health import CheckpointAdvice
from spotorch.core.model import Attempt, Run, RunStatus
from spotorch.core.pipeline import Pipeline
from spotorch.core.price_list import LIST_PRICES
from spotorch.core.prices import PriceTable
from spotorch.core.sweeps import Sweep, Trial
from spotorch.core.sweeps import summary as trial_summary
from spotorch.core.training_health import checkpoint_advice
from spotorch_trainer.contract import rfc3339

# What each status means, for people (the enum's comments, said once).
STATUS_MEANING: Mapping[RunStatus, str] = {
    RunStatus.QUEUED: "waiting for an earlier run of its pipeline to end",
    RunStatus.PENDING: "created; its first attempt is not launched yet",
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
}


def iso(ts: float | None) -> str | None:
    """ISO 8601 UTC with seconds, or None."""
    return None if ts is None else rfc3339(ts, "seconds")


def job_id(job_name: str | None) -> str | None:
    """The numeric id at the end of a Vertex AI job name (what Cloud Logging filters on)."""
    return job_name.rsplit("/", 1)[-1] if job_name else None


def reason(run: Run) -> str | None:
    """Why the run is where it is: its end reason, or what it waits for."""
    if run.status.terminal:
        return run.end_reason
    if run.status is RunStatus.RECOVERING and run.next_reason:
        return run.next_reason
    return run.history[-1].reason or run.history[-1].what if run.history else None


def progress_fraction(run: Run) -> float | None:
    total = run.progress.total_steps
    return None if not total else min(run.progress.step / total, 1.0)


def attempt_view(a: Attempt) -> dict[str, Any]:
    return {
        "attempt": a.number, "capacity": str(a.capacity), "region": a.region,
        "state": str(a.state), "job_name": a.job_name, "job_id": job_id(a.job_name),
        "created_at": iso(a.created_at or None), "queued_since": iso(a.queued_since),
        "started_at": iso(a.started_at), "ended_at": iso(a.ended_at),
        "end_reason": a.end_reason, "failure_class": str(a.failure) if a.failure else None,
        "exit_code": a.exit_code, "resumed_from_step": a.resumed_from_step,
        "resumed_from_uri": a.resumed_from_uri, "progress_step": a.progress_step,
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
        "currency": book.currency,
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
        "checkpoint_advice": advice_view(checkpoint_advice(run, now)),
        "cost": ledger_dict(book),
        "history": [{"at": iso(h.at), "what": h.what, "reason": h.reason} for h in run.history],
    }


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
    return (spec.metric, str(spec.goal)) if spec is not None else (None, None)


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
    trials = [{**trial_summary(t), "run_status": t.run_status, "best": t.number == sw.best}
              for t in sw.trials]
    return {
        **sweep_row(sw, pipeline),
        "data_uri": sw.data_uri, "snapshot_id": sw.snapshot_id, "end_reason": sw.end_reason,
        "best": trial_summary(best) if best else None,
        "stopped_early": sum(1 for t in sw.trials if t.stopped_early),
        "cost_estimate": round(sum(t.cost for t in sw.trials), 6),
        "trials": trials,
        "history": [{"at": iso(at), "what": what} for at, what in sw.history],
    }
