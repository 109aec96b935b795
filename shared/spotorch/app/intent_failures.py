"""How a failed side effect (an outbox intent) is answered (issue 39).

A call the service refuses for good (NotFound, PermissionDenied, InvalidArgument: HTTP 404, 403,
400) is tried again a couple of times within the invocation (PERMANENT_PAUSES_S, a second or
two: a bucket or a grant created a moment ago), then answered as a refusal the run decides on:
a launch fails the run (FAILED_LAUNCH) with the service's error, a preprocess step's launch
fails its step and the run the same way, a probe is given up, a model registration ends the run
without a model, saying why; run.failed carries the cause to its alert. Any other failure is
deferred (IntentDeferred): the tick tries it again, and the run's history says so at the first
failure, with the service's error (core.launching.on_intent_deferred).
"""

from __future__ import annotations

import logging
from http import HTTPStatus

from spotorch.core import preprocess as pp
from spotorch.core.intents import (
    PREPROCESS_LAUNCH,
    Intent,
    LaunchIntent,
    LaunchProbeIntent,
    PreprocessIntent,
    RegisterModelIntent,
)
from spotorch.core.observations import (
    IntentDeferred,
    LaunchFailed,
    ModelRegistered,
    Observation,
    PreprocessObserved,
    ProbeLaunchFailed,
)

log = logging.getLogger("spotorch.app.intent_failures")

# The HTTP statuses of refusals that trying again later cannot change (google.api_core's
# NotFound, PermissionDenied/Forbidden, InvalidArgument/BadRequest carry them as .code, for
# gRPC and HTTP calls alike).
PERMANENT_STATUSES = frozenset({HTTPStatus.BAD_REQUEST, HTTPStatus.FORBIDDEN,
                                HTTPStatus.NOT_FOUND})
# Pauses between the tries of a permanently refused call within one invocation: short and
# bounded (the function's time is billed and other intents wait).
PERMANENT_PAUSES_S: tuple[float, ...] = (0.5, 1.0)


def permanent_status(exc: BaseException) -> int | None:
    """The refusal's HTTP status when the service refused for good; None otherwise."""
    code = getattr(exc, "code", None)
    if isinstance(code, bool) or not isinstance(code, int):
        return None
    return int(code) if code in PERMANENT_STATUSES else None


def retry_after(exc: BaseException, tried: int) -> float | None:
    """How long to pause before trying a failed call again within this invocation: only when
    the service refused it for good, and only PERMANENT_PAUSES_S times; None: answer it now (a
    transient failure is the tick's to retry)."""
    if permanent_status(exc) is None or tried > len(PERMANENT_PAUSES_S):
        return None
    log.info("refused for good (try %d), trying once more: %s", tried, exc)
    return PERMANENT_PAUSES_S[tried - 1]


def answer(intent: Intent, exc: BaseException) -> Observation:
    """The observation a failed intent gives the run: a refusal for good where the run can act
    on one, else a deferral (the tick tries again)."""
    message = f"{type(exc).__name__}: {str(exc)[:400]}"
    status = permanent_status(exc)
    if status is not None:
        message = f"{message} (HTTP {status}: refused for good)"
        match intent:
            case LaunchIntent():
                return LaunchFailed(intent.id, intent.attempt, message, True, str(status))
            case PreprocessIntent() if intent.action == PREPROCESS_LAUNCH:
                job = pp.JobView(job_id="", name=intent.job_name, state=pp.JOB_STATE_FAILED,
                                 error=f"the preprocess launch failed: {message}",
                                 refused=True)
                return PreprocessObserved(job, intent.id)
            case LaunchProbeIntent():
                return ProbeLaunchFailed(intent.id, intent.probe, message, permanent=True)
            case RegisterModelIntent():
                return ModelRegistered(intent.id, error=message)
            case _:
                pass
    return IntentDeferred(intent.id, message, getattr(exc, "code", None) or "")
