"""The log lines Cloud Monitoring counts: a run's end, a preemption, a relaunch (deploy/monitoring.tf).

Each is one structured line through spotorch's logging path (spotorch.logs), with the field
METRIC_FIELD naming what it is and the fields its log-based metric extracts. They are written
after the change they describe is saved, once per change (a redelivered event changes nothing and
logs nothing).
"""

from __future__ import annotations

import logging

from spotorch.app.deps import Deps
from spotorch.core.cost import ledger
from spotorch.core.model import FailureClass, Run
from spotorch.logs import (
    METRIC_ATTEMPT_PREEMPTED,
    METRIC_ATTEMPT_RELAUNCHED,
    METRIC_FIELD,
    METRIC_RUN_ENDED,
)

log = logging.getLogger("spotorch.app.run_log")


def attempts_changed(old: Run, new: Run) -> None:
    """A line per attempt that was preempted, and per attempt that follows a failed one."""
    before = {a.number: a for a in old.attempts}
    for attempt in new.attempts:
        was = before.get(attempt.number)
        if attempt.failure is FailureClass.PREEMPTED and attempt.state.ended and \
                (was is None or not was.state.ended):
            log.info("run %s attempt %d preempted in %s", new.run_id, attempt.number,
                     attempt.region, extra={
                         METRIC_FIELD: METRIC_ATTEMPT_PREEMPTED, "run_id": new.run_id,
                         "pipeline": new.pipeline, "attempt": attempt.number,
                         "region": attempt.region, "capacity": str(attempt.capacity),
                         "ran_s": _seconds(attempt.started_at, attempt.ended_at)})
        previous = new.attempt(attempt.number - 1)
        if was is None and previous is not None and previous.failure is not None:
            relaunch_s = _seconds(previous.ended_at, attempt.created_at)
            log.info("run %s attempt %d follows attempt %d (%s) after %ss", new.run_id,
                     attempt.number, previous.number, previous.failure, relaunch_s, extra={
                         METRIC_FIELD: METRIC_ATTEMPT_RELAUNCHED, "run_id": new.run_id,
                         "pipeline": new.pipeline, "attempt": attempt.number,
                         "region": attempt.region, "capacity": str(attempt.capacity),
                         "after": str(previous.failure), "relaunch_s": relaunch_s})


def run_ended(deps: Deps, run: Run) -> None:
    """The run's end: its status and what the ledger says it cost."""
    pipeline = deps.pipelines.get(run.pipeline)
    book = ledger(run, pipeline, deps.clock.now(), deps.prices)
    log.info("run %s ended %s: %s", run.run_id, run.status, book.sentence(), extra={
        METRIC_FIELD: METRIC_RUN_ENDED, "run_id": run.run_id, "pipeline": run.pipeline,
        "status": str(run.status), "spent": round(book.total, 6), "currency": book.currency,
        "savings": None if book.savings is None else round(book.savings, 6),
        "result": str(book.result), "attempts": len(run.attempts),
        "preemptions": run.counters.preemptions,
        "duration_s": _seconds(run.created_at, run.updated_at or deps.clock.now())})


def _seconds(start: float | None, end: float | None) -> float | None:
    if start is None or end is None or not start:
        return None
    return round(max(0.0, end - start), 3)
