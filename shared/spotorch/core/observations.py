"""Observations: what happened to a run, as decide() receives it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from spotorch.core.model import Checkpoint, JobStatus
from spotorch_trainer.contract import parse_checkpoint_step

# ---------------------------------------------------------------- observations

@dataclass(frozen=True)
class JobObserved:
    """The launcher (a poll or a job event) reports an attempt's job status."""

    attempt: int
    status: JobStatus
    checkpoint: Checkpoint | None = None  # latest complete checkpoint, looked up when the job ended
    # Vertex's own answer (GetCustomJob, ListCustomJobs). A log line or a forged message is only
    # a hint: it changes nothing by itself; it makes spotorch ask Vertex (one live job per run
    # and every attempt state depend on it).
    confirmed: bool = True
    # A failed job's replicas' last stderr lines (ports.job_logs), looked up when it failed.
    error_tail: tuple[str, ...] = ()


ERROR_TAIL_LINES = 20  # lines of a failed attempt's stderr kept with it
ERROR_LINE_CHARS = 300  # characters per line kept
ERROR_TAIL_CHARS = 3000  # characters in all: a run document stays far under Firestore's 1 MiB


def bounded_tail(lines: Sequence[str]) -> tuple[str, ...]:
    """The last lines that fit the bounds, each cut to ERROR_LINE_CHARS, blank ones at the
    end dropped."""
    kept = [line.rstrip()[:ERROR_LINE_CHARS] for line in lines]
    while kept and not kept[-1]:
        kept.pop()
    kept = kept[-ERROR_TAIL_LINES:]
    while kept and sum(len(line) + 1 for line in kept) > ERROR_TAIL_CHARS:
        kept.pop(0)
    return tuple(kept)


def error_line(tail: Sequence[str]) -> str | None:
    """The line that says what went wrong: the last one (a traceback ends with the exception)."""
    return next((line.strip() for line in reversed(tail) if line.strip()), None)


@dataclass(frozen=True)
class JobMissing:
    """A poll found no job by the attempt's job name (NOT_FOUND from Vertex itself)."""

    attempt: int
    job_name: str


@dataclass(frozen=True)
class TrainerReported:
    """The training code reported something about itself (spotorch_trainer events)."""

    attempt: int
    kind: str
    at: float
    step: int | None = None
    total_steps: int | None = None
    checkpoint_uri: str | None = None
    metrics: Mapping[str, float] = field(default_factory=dict)
    exit_code: int | None = None
    nonfinite: tuple[str, ...] = ()  # metrics whose value was NaN or infinite (not in metrics)
    report_interval_s: float | None = None  # the trainer's progress interval (on "started")
    checkpoint_s: float | None = None  # how long the reported checkpoint took to write
    # each training replica's own mean step time since the chief's last report, by rank
    replica_step_s: tuple[float, ...] = ()

    @property
    def checkpoint(self) -> Checkpoint | None:
        """The checkpoint the report names, at its own step (its directory's name): a
        `completed` or `preempting` report names the last checkpoint, taken at or before the
        report's step; None when there is none, or the URI names no checkpoint directory."""
        if not self.checkpoint_uri:
            return None
        step = parse_checkpoint_step(self.checkpoint_uri)
        return None if step is None else Checkpoint(step, self.checkpoint_uri.rstrip("/"))


@dataclass(frozen=True)
class LaunchDone:
    """The launch intent created (or adopted) the attempt's job."""

    intent_id: str
    attempt: int
    job_name: str


@dataclass(frozen=True)
class LaunchFailed:
    """The launch intent failed; permanent failures end the run, transient ones are retried."""

    intent_id: str
    attempt: int
    message: str
    permanent: bool
    code: str = ""  # Vertex's (or the request budget's) error code, e.g. RESOURCE_EXHAUSTED


# A launch refused for quota: it may go again as soon as the budget refills (within a minute).
QUOTA_REFUSED = "RESOURCE_EXHAUSTED"


@dataclass(frozen=True)
class CheckpointsDeleted:
    """A delete-checkpoints intent was carried out: which steps went, how many bytes."""

    intent_id: str
    steps: tuple[int, ...]
    bytes: int


@dataclass(frozen=True)
class IntentDone:
    """A publish or cancel intent was carried out."""

    intent_id: str


@dataclass(frozen=True)
class IntentDeferred:
    """An intent was not carried out this time (a launch waits for an earlier job to be
    confirmed ended, or a call failed): its claim is given up, so the next tick takes it.
    code: the refusal's status, QUOTA_REFUSED when a spent request budget or rate limit stopped
    it (the tick's quick retry pass takes those again as the budget refills)."""

    intent_id: str
    reason: str
    code: str = ""


@dataclass(frozen=True)
class ModelRegistered:
    """The register-model intent was carried out (model_name) or refused for good (error)."""

    intent_id: str
    model_name: str | None = None
    error: str | None = None


@dataclass(frozen=True)
class ProbeLaunched:
    """The launch-probe intent created (or adopted) the probe's job."""

    intent_id: str
    probe: int
    job_name: str


@dataclass(frozen=True)
class ProbeLaunchFailed:
    """The launch-probe intent failed (permanent: the probe ends without an answer)."""

    intent_id: str
    probe: int
    message: str
    permanent: bool


@dataclass(frozen=True)
class ProbeObserved:
    """Vertex's own status of a probe's job (GetCustomJob or ListCustomJobs, never a log line:
    a probe's RUNNING moves a run off standard)."""

    probe: int
    status: JobStatus
    # A hardware probe that ended: its measurement (ProbeResult.to_doc(), from its report)
    result: Mapping[str, Any] | None = None


@dataclass(frozen=True)
class ProbeMissing:
    """Vertex answered NOT_FOUND for a probe's job: nothing left to cancel, no answer."""

    probe: int
    job_name: str


@dataclass(frozen=True)
class Tick:
    """The reconcile tick: fire due timers and re-evaluate the escalation policy."""


@dataclass(frozen=True)
class Promote:
    """The active run of the pipeline ended: a queued run may start."""


@dataclass(frozen=True)
class CancelRequested:
    """Someone asked to cancel the run, with why."""
    reason: str


Observation = (JobObserved | JobMissing | TrainerReported | LaunchDone | LaunchFailed | IntentDone
               | IntentDeferred | Tick
               | Promote | CancelRequested | CheckpointsDeleted | ModelRegistered
               | ProbeLaunched | ProbeLaunchFailed | ProbeObserved | ProbeMissing)
