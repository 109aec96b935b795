"""The pure core: runs, attempts, their states, and decide(run, observation) -> run with intents.

No I/O here. The service layer loads a run, feeds it observations through `decide`, saves the result
(with its outbox of intents) in one conditional write, then carries the intents out.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field, replace
from enum import StrEnum
from typing import Any, ClassVar

from spotorch import hardware as hw
from spotorch import health as hp
from spotorch.events import build_event
from spotorch.ledger import hourly_rate, ledger, ledger_dict
from spotorch.pipeline import Capacity, EscalationKind, Pipeline, RecoveryPolicy
from spotorch.policy import PolicyView, ProbeTerms, choose_capacity, probe_worth, slack_of
from spotorch.prices import hourly_price
from spotorch.shapes import run_pipeline
from spotorch_trainer.contract import rfc3339

# ---------------------------------------------------------------- vocabulary

class JobPhase(StrEnum):
    """Where a job is in its life, in Vertex AI's terms (mapped from JobState)."""

    QUEUED = "QUEUED"  # accepted; waiting for capacity (a SPOT job without capacity stays here)
    PENDING = "PENDING"  # capacity found; VMs and containers starting
    RUNNING = "RUNNING"  # workers running
    SUCCEEDED = "SUCCEEDED"  # every worker exited 0
    FAILED = "FAILED"  # ended with an error; see the failure class
    CANCELLING = "CANCELLING"  # cancel requested, workers stopping
    CANCELLED = "CANCELLED"  # stopped by a cancel

    @property
    def terminal(self) -> bool:
        return self in _TERMINAL_PHASES

    @property
    def rank(self) -> int:
        """Order of phases in a job's life; a later report never moves a job backwards."""
        return _PHASE_RANK[self]


_TERMINAL_PHASES = frozenset({JobPhase.SUCCEEDED, JobPhase.FAILED, JobPhase.CANCELLED})
_PHASE_RANK = {JobPhase.QUEUED: 0, JobPhase.PENDING: 1, JobPhase.RUNNING: 2,
               JobPhase.CANCELLING: 3, JobPhase.SUCCEEDED: 4, JobPhase.FAILED: 4,
               JobPhase.CANCELLED: 4}


class FailureClass(StrEnum):
    """Why an attempt ended without success; each class has its own retry budget."""

    PREEMPTED = "preempted"  # Spot VMs taken back while running
    STOCKOUT = "stockout"  # no capacity: a SPOT job queued too long, or a STOCKOUT error at start
    USER_ERROR = "user_error"  # the training code exited non-zero
    INFRA = "infra"  # Google-side internal error, quota, API failure
    TIMEOUT = "timeout"  # the job hit its scheduling timeout
    CANCELLED = "cancelled"  # cancelled (by spotorch or by someone else)
    LAUNCH_REJECTED = "launch_rejected"  # the API refused the job for good (bad spec, permissions)
    LOST = "lost"  # Vertex no longer knows the job (NOT_FOUND, poll after poll): infrastructure
    HUNG = "hung"  # the trainer went silent while its job ran (or crawled): cancelled, relaunched
    OUT_OF_MEMORY = "out_of_memory"  # OOM-killed or an out-of-memory error: never the same machine
    DIVERGED = "diverged"  # a divergence rule fired and the pipeline relaunches from before it


@dataclass(frozen=True)
class JobStatus:
    """What the launcher knows about one job right now."""

    job_name: str
    phase: JobPhase
    failure: FailureClass | None = None
    exit_code: int | None = None
    message: str = ""
    labels: Mapping[str, str] = field(default_factory=dict)
    create_time: float | None = None
    start_time: float | None = None
    end_time: float | None = None


@dataclass(frozen=True)
class Checkpoint:
    """A complete checkpoint: its step and where it is."""

    step: int
    uri: str



class RunStatus(StrEnum):
    """Where a run is; terminal members never change (see TRANSITIONS)."""

    QUEUED = "QUEUED"  # waiting for an earlier run of its pipeline to end (on_active_run: queue)
    PENDING = "PENDING"  # created; its first attempt is not launched yet
    PROBING = "PROBING"  # hardware candidates are probed; the first attempt waits for the choice
    STARTING = "STARTING"  # the current attempt's job is being created or waits for capacity
    RUNNING = "RUNNING"  # the current attempt's job is running
    RECOVERING = "RECOVERING"  # the last attempt ended; the next waits for its backoff or a cancel
    CANCELLING = "CANCELLING"  # cancel requested; waiting for the job to stop
    REGISTERING = "REGISTERING"  # the job succeeded; its model is being registered (`model`)
    SUCCEEDED = "SUCCEEDED"  # the training job finished successfully
    CANCELLED = "CANCELLED"  # stopped by an operator, superseded, or cancelled outside spotorch
    FAILED = "FAILED"  # the training code failed more often than its user-error budget allows
    FAILED_PREEMPTED = "FAILED_PREEMPTED"  # preempted more often than the preemption budget
    FAILED_NO_RESOURCE = "FAILED_NO_RESOURCE"  # no capacity: stockouts beyond their budget
    FAILED_NO_PROGRESS = "FAILED_NO_PROGRESS"  # attempts kept ending without a newer checkpoint
    FAILED_INFRA = "FAILED_INFRA"  # infrastructure errors beyond their budget
    FAILED_TIMEOUT = "FAILED_TIMEOUT"  # the job hit its timeout more often than allowed
    FAILED_LAUNCH = "FAILED_LAUNCH"  # Vertex AI refused the job for good (bad spec, permissions)
    FAILED_BUDGET = "FAILED_BUDGET"  # the estimated cost passed the pipeline's budget; job stopped
    FAILED_HUNG = "FAILED_HUNG"  # attempts kept hanging (no trainer report) beyond the hung budget
    FAILED_DIVERGED = "FAILED_DIVERGED"  # a divergence rule fired (NaN, spike, plateau); job stopped
    FAILED_OUT_OF_MEMORY = "FAILED_OUT_OF_MEMORY"  # out of memory with no larger machine to move to

    @property
    def terminal(self) -> bool:
        return not TRANSITIONS[self]

    @property
    def failed(self) -> bool:
        return self.value.startswith("FAILED")


_FAILED = frozenset(s for s in RunStatus if s.value.startswith("FAILED"))
_ENDINGS = _FAILED | {RunStatus.SUCCEEDED, RunStatus.CANCELLED}

# Allowed transitions. A run may always end (succeed, fail, be cancelled) from a live status.
TRANSITIONS: Mapping[RunStatus, frozenset[RunStatus]] = {
    RunStatus.QUEUED: frozenset({RunStatus.PENDING, RunStatus.STARTING, RunStatus.PROBING,
                                 RunStatus.CANCELLED}),
    RunStatus.PENDING: frozenset({RunStatus.QUEUED, RunStatus.STARTING, RunStatus.PROBING,
                                  RunStatus.CANCELLED}) | _FAILED,
    RunStatus.PROBING: frozenset({RunStatus.STARTING, RunStatus.CANCELLED}) | _FAILED,
    RunStatus.STARTING: frozenset({RunStatus.RUNNING, RunStatus.RECOVERING, RunStatus.CANCELLING,
                                   RunStatus.REGISTERING}) | _ENDINGS,
    RunStatus.RUNNING: frozenset({RunStatus.RECOVERING, RunStatus.STARTING, RunStatus.CANCELLING,
                                  RunStatus.REGISTERING}) | _ENDINGS,
    RunStatus.RECOVERING: frozenset({RunStatus.STARTING, RunStatus.CANCELLING,
                                     RunStatus.REGISTERING}) | _ENDINGS,
    RunStatus.CANCELLING: frozenset({RunStatus.CANCELLED, RunStatus.SUCCEEDED,
                                     RunStatus.FAILED_BUDGET, RunStatus.FAILED_DIVERGED,
                                     RunStatus.REGISTERING}),
    RunStatus.REGISTERING: frozenset({RunStatus.SUCCEEDED}),
    **{s: frozenset() for s in _ENDINGS},
}


class InvalidTransition(Exception):
    """A decision tried a transition the table does not allow (a bug, never bad input)."""


class AttemptState(StrEnum):
    """Where an attempt's job is: LAUNCHING until the job exists, then its JobPhase."""

    LAUNCHING = "LAUNCHING"
    QUEUED = "QUEUED"
    PENDING = "PENDING"
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    CANCELLING = "CANCELLING"
    CANCELLED = "CANCELLED"

    @property
    def ended(self) -> bool:
        return self in (AttemptState.SUCCEEDED, AttemptState.FAILED, AttemptState.CANCELLED)

    @property
    def rank(self) -> int:
        return -1 if self is AttemptState.LAUNCHING else JobPhase(self.value).rank


# Why spotorch itself cancelled an attempt; decides what its CANCELLED end means.
CANCEL_BY_OPERATOR = "operator"
CANCEL_STOCKOUT = "stockout"
CANCEL_SWITCH = "switch"
CANCEL_ORPHAN = "orphan"
CANCEL_HUNG = "hung"  # no trainer report for hang_after
CANCEL_SLOW = "slow"  # step rate collapsed and the pipeline relaunches (health.step_rate_relaunch)
CANCEL_DIVERGED = "diverged"  # a divergence rule fired and the pipeline relaunches


@dataclass(frozen=True)
class Attempt:
    """One Vertex AI custom job of a run."""

    number: int
    capacity: Capacity
    region: str
    state: AttemptState = AttemptState.LAUNCHING
    job_name: str | None = None
    created_at: float = 0.0
    queued_since: float | None = None
    started_at: float | None = None
    ended_at: float | None = None
    end_reason: str | None = None
    failure: FailureClass | None = None
    exit_code: int | None = None
    resumed_from_step: int | None = None
    resumed_from_uri: str | None = None
    progress_step: int | None = None
    cancel_reason: str | None = None
    missing_polls: int = 0  # polls in a row that Vertex answered NOT_FOUND for this job
    missing_since: float | None = None
    machine_type: str | None = None  # None: the pipeline's own machine (health.fallback_machines)
    last_report_at: float | None = None  # the attempt's latest trainer report (hang detection)
    cancel_detail: str | None = None  # what a health rule found, when it cancelled the attempt

    @property
    def live(self) -> bool:
        return not self.state.ended


# ---------------------------------------------------------------- Spot probes (vocabulary)

PROBE_CAPACITY = "capacity"  # a Spot capacity probe (hardware.PROBE_LABEL's value on its job)
PROBE_HARDWARE = "hardware"  # a hardware candidate's probe, run before the first attempt
PROBES_LIMIT = 20  # the newest probes a run remembers (Counters.probes counts them all)
CANCEL_PROBE_ANSWERED = "answered"  # the probe ran: capacity confirmed, its job is not needed
CANCEL_PROBE_NO_CAPACITY = "no capacity"  # queued past its wait
CANCEL_PROBE_MOVED_ON = "run moved on"  # the run left standard, or ended


def probe_key(number: int) -> str:
    """A probe job's LABEL_ATTEMPT value: never an attempt number, so never found as one."""
    return f"probe-{number}"


@dataclass(frozen=True)
class Probe:
    """A Spot capacity probe of a run on standard VMs: a minimal Spot job of the run's shape.

    It answers one question, is Spot back in `region`: yes once its job runs (it is then
    cancelled), no when it waited `spot_probes.wait` without capacity (cancelled too). It never
    counts as an attempt, never trains, and a run has at most one live probe.
    """

    number: int
    region: str
    state: AttemptState = AttemptState.LAUNCHING
    job_name: str | None = None
    created_at: float = 0.0
    queued_since: float | None = None
    started_at: float | None = None  # capacity found: its job ran (billed from here)
    ended_at: float | None = None
    found: bool | None = None  # the answer; None: none yet (or it failed without one)
    cancel_reason: str | None = None
    end_reason: str | None = None
    # A hardware probe (kind PROBE_HARDWARE) runs the training code for probe_steps steps on one
    # candidate instead; its answer is a measurement (spotorch.hardware.ProbeResult).
    kind: str = PROBE_CAPACITY
    candidate: str | None = None

    @property
    def live(self) -> bool:
        return not self.state.ended


@dataclass(frozen=True)
class LaunchIntent:
    """Create the job of an attempt (or adopt the one a lost creation left behind)."""

    id: str
    attempt: int
    capacity: Capacity
    region: str
    resume_step: int | None = None
    resume_uri: str | None = None
    claimed_until: float = 0.0  # an executor owns it until then; afterwards the tick may take it
    machine_type: str | None = None  # overrides the first worker pool's (out-of-memory fallback)
    resume_exact: bool = False  # resume from resume_uri only, never a newer one (after divergence)
    kind: ClassVar[str] = "launch"


@dataclass(frozen=True)
class CancelIntent:
    """Ask Vertex AI to stop the job of an attempt."""

    id: str
    attempt: int  # 0 for a probe's job
    job_name: str
    reason: str
    claimed_until: float = 0.0
    probe: int = 0  # the probe whose job this is; 0: an attempt's
    kind: ClassVar[str] = "cancel"


@dataclass(frozen=True)
class LaunchProbeIntent:
    """Create the job of a Spot capacity probe (or adopt the one a lost creation left)."""

    id: str
    probe: int
    region: str
    claimed_until: float = 0.0
    kind: ClassVar[str] = "launch_probe"


@dataclass(frozen=True)
class PublishIntent:
    """Publish one of spotorch's own CloudEvents (structured JSON form)."""

    id: str
    event: Mapping[str, Any]
    claimed_until: float = 0.0
    kind: ClassVar[str] = "publish"


@dataclass(frozen=True)
class DeleteCheckpointsIntent:
    """Delete complete checkpoints under a run's root: retention, or the diverged ones.

    Retention (above is None): of the complete checkpoints listed, keep the newest keep_newest
    and the steps in keep; delete the others that are older than the newest kept one. Rollback
    (above set): delete every complete checkpoint after step `above` (written while diverging).
    Incomplete checkpoints are never deleted.
    """

    id: str
    root: str
    keep_newest: int = 1
    keep: tuple[int, ...] = ()
    above: int | None = None
    ending: bool = False  # decided when the run ended
    claimed_until: float = 0.0
    kind: ClassVar[str] = "delete_checkpoints"


@dataclass(frozen=True)
class RegisterModelIntent:
    """Register a succeeded run's model in Vertex AI Model Registry; run.succeeded waits for it."""

    id: str
    artifact_uri: str
    succeeded: Mapping[str, Any]  # the run.succeeded data, published with the model's name
    claimed_until: float = 0.0
    kind: ClassVar[str] = "register_model"


# A side effect decided in a transaction and carried out after it commits (the outbox).
Intent = (LaunchIntent | CancelIntent | PublishIntent | DeleteCheckpointsIntent
          | RegisterModelIntent | LaunchProbeIntent)
_INTENT_TYPES: Mapping[str, type[Intent]] = {
    t.kind: t for t in (LaunchIntent, CancelIntent, PublishIntent, DeleteCheckpointsIntent,
                        RegisterModelIntent, LaunchProbeIntent)}


def intent_to_dict(intent: Intent) -> dict[str, Any]:
    """An intent as stored in the run document: its fields plus its kind."""
    doc = asdict(intent)
    doc["kind"] = intent.kind
    if isinstance(intent, LaunchIntent):
        doc["capacity"] = str(intent.capacity)
    return doc


def intent_from_dict(doc: Mapping[str, Any]) -> Intent:
    data = {k: v for k, v in doc.items() if k != "kind"}
    kind = _INTENT_TYPES[str(doc["kind"])]
    if kind is LaunchIntent:
        data["capacity"] = Capacity(data["capacity"])
    if kind is DeleteCheckpointsIntent:
        data["keep"] = tuple(int(s) for s in data.get("keep", ()))
    return kind(**data)


@dataclass(frozen=True)
class Counters:
    """Failures so far, one budget each."""

    preemptions: int = 0
    stockouts: int = 0
    user_errors: int = 0
    infra_errors: int = 0
    timeouts: int = 0
    no_progress: int = 0  # consecutive attempts that ended without a newer checkpoint
    lost: int = 0  # jobs Vertex stopped knowing (NOT_FOUND on every poll)
    hangs: int = 0  # attempts cancelled as hung (or as crawling, with step_rate_relaunch)
    divergences: int = 0  # relaunches after a divergence rule fired
    out_of_memory: int = 0  # attempts that ran out of memory
    probes: int = 0  # Spot capacity probes launched (never attempts; no budget)


@dataclass(frozen=True)
class Progress:
    """What the trainer last said about its progress, and the measured step rate."""

    step: int = 0
    total_steps: int | None = None
    at: float | None = None
    rate: float | None = None  # steps per second, measured over the current attempt
    metrics: Mapping[str, float] = field(default_factory=dict)


KNOWN_CHECKPOINTS_LIMIT = 64  # the newest complete checkpoints a run remembers (retention, advice)


@dataclass(frozen=True)
class RunHealth:
    """What the training-health rules track of a run (section "training health" below)."""

    reports: int = 0  # trainer reports received: > 0 means the code uses spotorch_trainer
    report_interval_s: float | None = None  # the trainer's own progress interval ("started")
    longest_gap_s: float = 0.0  # longest gap between two reports of one attempt
    rate: hp.RateState = field(default_factory=hp.RateState)
    loss: hp.LossState = field(default_factory=hp.LossState)
    checkpoints: tuple[hp.KnownCheckpoint, ...] = ()  # complete checkpoints reported, oldest first
    checkpoint_at: float | None = None  # when the latest checkpoint became known
    stale_warned: str | None = None  # "attempt:step" the stale-checkpoint warning fired for
    machine_type: str | None = None  # the machine the next attempts take (out-of-memory fallback)
    rollback: Checkpoint | None = None  # the next launch resumes exactly from here (divergence)
    trust_until_step: int | None = None  # until the diverged checkpoints are deleted: lookups
    # of newer ones are not believed
    deleted_checkpoints: int = 0
    bytes_reclaimed: int = 0


@dataclass(frozen=True)
class MetricPoint:
    """One value of a sweep's metric at a step (a map in Firestore: no nested arrays there)."""

    step: int
    value: float


@dataclass(frozen=True)
class HistoryEntry:
    at: float
    what: str
    reason: str = ""


@dataclass(frozen=True)
class Run:
    """One training run for one data snapshot (or manual submit), and everything that happened to it."""

    run_id: str
    pipeline: str
    status: RunStatus
    created_at: float
    data_uri: str
    checkpoint_uri: str
    output_uri: str
    snapshot_id: str | None = None
    deadline_at: float | None = None
    updated_at: float = 0.0
    attempts: tuple[Attempt, ...] = ()
    counters: Counters = Counters()
    progress: Progress = Progress()
    latest_checkpoint: Checkpoint | None = None
    next_action_at: float | None = None
    next_capacity: Capacity | None = None
    next_reason: str | None = None  # why the next attempt runs on next_capacity
    region_index: int = 0
    spot_unavailable_until: float | None = None  # after a stockout or preemption: don't count on Spot
    escalated: Mapping[str, Any] | None = None
    deadline_warned: bool = False
    stop_status: RunStatus | None = None  # how a CANCELLING run ends (None: CANCELLED)
    end_reason: str | None = None
    history: tuple[HistoryEntry, ...] = ()
    outbox: tuple[Intent, ...] = ()
    event_seq: int = 0
    intent_seq: int = 0
    seen: tuple[str, ...] = ()
    retry_of: str | None = None
    # issue 19: the hardware choice (spotorch.hardware.HardwareChoice.to_doc()) the run runs on
    hardware: Mapping[str, Any] | None = None
    health: RunHealth = RunHealth()
    # ---- sweeps (spotorch.sweep): a trial run knows its sweep, its parameters and its curve
    sweep_id: str | None = None
    params: Mapping[str, Any] = field(default_factory=dict)  # handed to the trainer as JSON
    curve: tuple[MetricPoint, ...] = ()  # the sweep's metric by step, for the median rule
    # ---- Model Registry: the registered version (projects/P/locations/L/models/M@V)
    model_name: str | None = None
    # ---- Spot probes while on standard (section "Spot probes"); the newest PROBES_LIMIT
    probes: tuple[Probe, ...] = ()
    next_region: str | None = None  # where the next attempt goes (a probe found Spot there)
    # ---- hardware probing (issue 19): candidate -> ProbeResult.to_doc(), cached or measured
    hardware_results: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)

    @property
    def active(self) -> bool:
        return not self.status.terminal

    @property
    def current(self) -> Attempt | None:
        return self.attempts[-1] if self.attempts else None

    @property
    def bucket(self) -> int:
        """The run's reconcile bucket: a stable hash, so a tick can fan out by bucket."""
        return reconcile_bucket(self.run_id)

    def attempt(self, number: int) -> Attempt | None:
        return self.attempts[number - 1] if 0 < number <= len(self.attempts) else None

    def probe(self, number: int) -> Probe | None:
        return next((p for p in self.probes if p.number == number), None)

    @property
    def live_probe(self) -> Probe | None:
        """The live Spot capacity probe (at most one)."""
        return next((p for p in self.probes if p.live and p.kind == PROBE_CAPACITY), None)

    def to_dict(self) -> dict[str, Any]:
        """The Firestore document of this run (plus `active` for the tick's query)."""
        doc = asdict(self)
        doc["active"] = self.active
        # Indexed by Firestore like any field: a shard of the tick queries its buckets' live runs.
        doc["active_bucket"] = self.bucket if self.active else None
        doc["latest_checkpoint"] = asdict(self.latest_checkpoint) if self.latest_checkpoint else None
        doc["outbox"] = [intent_to_dict(i) for i in self.outbox]
        return doc

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> Run:
        data = {k: v for k, v in doc.items() if k not in ("active", "active_bucket")}
        data["status"] = RunStatus(data["status"])
        data["attempts"] = tuple(_attempt_from(a) for a in data.get("attempts", ()))
        data["counters"] = Counters(**data.get("counters", {}))
        progress = dict(data.get("progress") or {})
        progress["metrics"] = dict(progress.get("metrics") or {})
        data["progress"] = Progress(**progress)
        ckpt = data.get("latest_checkpoint")
        data["latest_checkpoint"] = Checkpoint(**ckpt) if ckpt else None
        data["next_capacity"] = Capacity(data["next_capacity"]) if data.get("next_capacity") else None
        data["stop_status"] = RunStatus(data["stop_status"]) if data.get("stop_status") else None
        data["history"] = tuple(HistoryEntry(**h) for h in data.get("history", ()))
        data["outbox"] = tuple(intent_from_dict(i) for i in data.get("outbox", ()))
        data["seen"] = tuple(data.get("seen", ()))
        data["health"] = _health_from(data.get("health") or {})
        data["params"] = dict(data.get("params") or {})
        data["curve"] = tuple(MetricPoint(**p) for p in data.get("curve", ()))
        data["probes"] = tuple(_probe_from(p) for p in data.get("probes", ()))
        data["hardware_results"] = {str(k): dict(v) for k, v in
                                    (data.get("hardware_results") or {}).items()}
        return cls(**data)


def _health_from(doc: Mapping[str, Any]) -> RunHealth:
    data = dict(doc)
    rate = dict(data.get("rate") or {})
    rate["samples"] = tuple(float(x) for x in rate.get("samples", ()))
    data["rate"] = hp.RateState(**rate)
    data["loss"] = hp.LossState(**(data.get("loss") or {}))
    data["checkpoints"] = tuple(hp.KnownCheckpoint(**c) for c in data.get("checkpoints", ()))
    data["rollback"] = Checkpoint(**data["rollback"]) if data.get("rollback") else None
    return RunHealth(**data)


def _probe_from(doc: Mapping[str, Any]) -> Probe:
    return Probe(**{**doc, "state": AttemptState(doc.get("state", AttemptState.LAUNCHING))})


def _attempt_from(doc: Mapping[str, Any]) -> Attempt:
    data = dict(doc)
    data["capacity"] = Capacity(data["capacity"])
    data["state"] = AttemptState(data["state"])
    data["failure"] = FailureClass(data["failure"]) if data.get("failure") else None
    return Attempt(**data)


RECONCILE_BUCKETS = 64


def reconcile_bucket(run_id: str) -> int:
    return int.from_bytes(hashlib.sha256(run_id.encode()).digest()[:4], "big") % RECONCILE_BUCKETS


# ---------------------------------------------------------------- observations

@dataclass(frozen=True)
class JobObserved:
    """The launcher (a poll or a job event) reports an attempt's job status."""

    attempt: int
    status: JobStatus
    checkpoint: Checkpoint | None = None  # latest complete checkpoint, looked up when the job ended
    # Vertex's own answer (GetCustomJob, ListCustomJobs). A log line or a forged message is only
    # a hint: it may move a job forward, never end it (one live job per run depends on it).
    confirmed: bool = True


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
    reason: str


Observation = (JobObserved | JobMissing | TrainerReported | LaunchDone | LaunchFailed | IntentDone | Tick
               | Promote | CancelRequested | CheckpointsDeleted | ModelRegistered
               | ProbeLaunched | ProbeLaunchFailed | ProbeObserved | ProbeMissing)


@dataclass(frozen=True)
class Context:
    """What a decision needs besides the run: its pipeline and the time."""

    pipeline: Pipeline
    now: float
    # The pipeline's regions, best first for this run's shape, from the shared record of Spot
    # behaviour (service.spot_regions); None: the pipeline's own order.
    region_order: tuple[str, ...] | None = None
    # What the hardware choice assumes of Spot per candidate (the shared record); None: nothing
    outlook: hw.Outlook | None = None
    hardware_cache: Mapping[str, hw.ProbeResult] | None = None  # a queued run's, at its promotion

    @property
    def regions(self) -> tuple[str, ...]:
        configured = self.pipeline.job.regions or ("us-central1",)
        if not self.region_order:
            return configured
        ranked = tuple(r for r in self.region_order if r in configured)
        return ranked + tuple(r for r in configured if r not in ranked)

    @property
    def recovery(self) -> RecoveryPolicy:
        return self.pipeline.recovery

    @property
    def health(self) -> hp.HealthPolicy:
        return self.pipeline.health


# ---------------------------------------------------------------- small pure helpers

SEEN_LIMIT = 200
HISTORY_LIMIT = 400
LAUNCH_LEASE_S = 120.0


def _note(run: Run, ctx: Context, what: str, reason: str = "") -> Run:
    history = (*run.history, HistoryEntry(ctx.now, what, reason))[-HISTORY_LIMIT:]
    return replace(run, history=history)


def _to(run: Run, status: RunStatus, ctx: Context, reason: str = "") -> Run:
    if status == run.status:
        return run
    if status not in TRANSITIONS[run.status]:
        raise InvalidTransition(f"{run.run_id}: {run.status} -> {status} is not allowed")
    run = replace(run, status=status, end_reason=reason if status.terminal else run.end_reason)
    return _note(run, ctx, f"status {status}", reason)


def _next_intent_id(run: Run) -> tuple[Run, str]:
    return replace(run, intent_seq=run.intent_seq + 1), f"{run.run_id}/{run.intent_seq + 1}"


def _add(run: Run, intent: Intent) -> Run:
    return replace(run, outbox=(*run.outbox, intent))


def _publish(run: Run, ctx: Context, kind: str, **data: Any) -> Run:
    seq = run.event_seq + 1
    event = build_event(run_id=run.run_id, pipeline=run.pipeline, sequence=seq, kind=kind,
                        data=data, time=ctx.now)
    run, intent_id = _next_intent_id(replace(run, event_seq=seq))
    return _add(run, PublishIntent(intent_id, event, claimed_until=ctx.now + LAUNCH_LEASE_S))


def _with_attempt(run: Run, attempt: Attempt) -> Run:
    attempts = list(run.attempts)
    attempts[attempt.number - 1] = attempt
    return replace(run, attempts=tuple(attempts))


def _jitter(run_id: str, n: int) -> float:
    """Deterministic jitter in [0.5, 1.0): replays decide the same, runs spread their retries."""
    digest = hashlib.sha256(f"{run_id}:{n}".encode()).digest()
    return 0.5 + digest[0] / 512


def backoff_s(recovery: RecoveryPolicy, run_id: str, failures: int) -> float:
    """Capped, jittered exponential backoff after the n-th failure in a row."""
    raw = recovery.backoff_base_s * (2 ** max(failures - 1, 0))
    return float(min(recovery.backoff_cap_s, raw) * _jitter(run_id, failures))


# ---------------------------------------------------------------- creating a run

def new_run(*, run_id: str, pipeline: Pipeline, now: float, data_uri: str,
            snapshot_id: str | None, queued: bool = False,
            resume_from: Checkpoint | None = None, retry_of: str | None = None,
            reason: str = "", sweep_id: str | None = None,
            params: Mapping[str, Any] | None = None,
            hardware: Mapping[str, Any] | None = None,
            region_order: tuple[str, ...] | None = None,
            hardware_cache: Mapping[str, hw.ProbeResult] | None = None,
            outlook: hw.Outlook | None = None) -> Run:
    """A new run: created, announced, and (unless queued) its first attempt launched.

    hardware: the choice among the pipeline's hardware candidates (issue 19), if one was made;
    region_order: the regions ranked by the shared Spot record (Context.region_order);
    hardware_cache: the pipeline's cached probe results: with candidates and no choice made,
    the run probes those without a fresh result first (status PROBING)."""
    deadline = now + pipeline.deadline_s if pipeline.deadline_s else None
    run = Run(run_id=run_id, pipeline=pipeline.name, status=RunStatus.PENDING, created_at=now,
              updated_at=now, data_uri=data_uri, snapshot_id=snapshot_id, deadline_at=deadline,
              checkpoint_uri=pipeline.run_checkpoint_uri(retry_of or run_id),
              output_uri=pipeline.run_output_uri(run_id), latest_checkpoint=resume_from,
              retry_of=retry_of, sweep_id=sweep_id, params=dict(params or {}),
              hardware=hardware)
    ctx = Context(pipeline, now, region_order=region_order, outlook=outlook)
    run = _note(run, ctx, "created", reason)
    run = _publish(run, ctx, "run.created", status=str(RunStatus.PENDING), data_uri=data_uri,
                   snapshot_id=snapshot_id, deadline=_iso(deadline), reason=reason)
    if hardware is not None:  # issue 19: the table travels with the event
        run = _announce_hardware(run, ctx, hardware)
    if queued:
        return _to(run, RunStatus.QUEUED, ctx, "waiting for the active run of the pipeline")
    if hardware is None and pipeline.hardware is not None and hardware_cache is not None:
        return _probe_hardware(run, ctx, hardware_cache)
    return _first_launch(run, ctx, "first attempt")


def _first_launch(run: Run, ctx: Context, reason: str) -> Run:
    return _launch(run, ctx, _policy_capacity(run, ctx, current=None, spot_available=True),
                   reason)


def _announce_hardware(run: Run, ctx: Context, hardware: Mapping[str, Any]) -> Run:
    run = _note(run, ctx, "hardware chosen", str(hardware.get("reason", "")))
    return _publish(run, ctx, "run.hardware_chosen", **{
        k: hardware.get(k) for k in ("chosen", "reason", "warning", "expected_compute_s",
                                     "deadline_s", "rows")})


def _iso(ts: float | None) -> str | None:
    return None if ts is None else rfc3339(ts)


# ---------------------------------------------------------------- the escalation policy

def _work_estimates(run: Run, ctx: Context) -> tuple[float | None, float]:
    """Estimated compute of the whole task and the part already checkpointed, in seconds."""
    total_steps = run.progress.total_steps
    total_s = ctx.recovery.expected_compute_s
    measured = (run.hardware or {}).get("expected_compute_s")  # probed before the run (issue 19)
    if isinstance(measured, int | float) and measured > 0:
        total_s = float(measured)
    if total_steps and run.progress.rate:
        total_s = total_steps / run.progress.rate
    if total_s is None or not total_steps:
        return total_s, 0.0
    done_steps = run.latest_checkpoint.step if run.latest_checkpoint else 0
    return total_s, total_s * min(done_steps, total_steps) / total_steps


def policy_view(run: Run, ctx: Context, *, current: Capacity | None,
                spot_available: bool, assumed: bool | None = None) -> PolicyView:
    total_s, done_s = _work_estimates(run, ctx)
    deadline_s = None if run.deadline_at is None else run.deadline_at - run.created_at
    changeovers = sum(1 for a, b in zip(run.attempts, run.attempts[1:], strict=False)
                      if a.capacity != b.capacity)
    history = spot_history(run, ctx.now)
    return PolicyView(now_s=ctx.now - run.created_at, deadline_s=deadline_s,
                      work_total_s=total_s, work_done_s=done_s,
                      restart_overhead_s=ctx.recovery.restart_overhead_s, current=current,
                      spot_available=spot_available, preemptions=run.counters.preemptions,
                      changeovers=changeovers, tick_s=ctx.recovery.decision_interval_s,
                      spot_run_s=history.run_s, spot_wait_s=history.wait_s,
                      spot_waits=history.waits,
                      spot_down_at_s=None if history.down_at is None
                      else history.down_at - run.created_at,
                      spot_assumed=current is Capacity.STANDARD if assumed is None else assumed)


# A Spot attempt queued longer than this is waiting for capacity, not just being provisioned.
SPOT_QUEUE_GRACE_S = 60.0


@dataclass(frozen=True)
class SpotHistory:
    """What this run's own Spot attempts showed of Spot capacity (nothing is seen on standard)."""

    run_s: float = 0.0  # time Spot attempts ran, until preemption, cancel or now
    wait_s: float = 0.0  # time Spot attempts waited for capacity beyond provisioning
    waits: int = 0  # Spot attempts that waited for capacity and then started
    down_at: float | None = None  # last time a Spot attempt found no capacity (epoch seconds)


def spot_history(run: Run, now: float) -> SpotHistory:
    """Sum up the Spot attempts: running time, waits for capacity, and the last sign of none."""
    run_s = wait_s = 0.0
    waits = 0
    down_at: float | None = None
    for a in run.attempts:
        if a.capacity is not Capacity.SPOT:
            continue
        queued_from = a.queued_since or a.created_at
        queued_to = a.started_at or a.ended_at or now
        waited = max(queued_to - queued_from - SPOT_QUEUE_GRACE_S, 0.0)
        wait_s += waited
        if waited > 0:
            down_at = max(down_at or 0.0, queued_to if a.started_at is None else queued_from)
            waits += a.started_at is not None
        if a.started_at is not None:
            run_s += max((a.ended_at or now) - a.started_at, 0.0)
        if a.failure is FailureClass.PREEMPTED and a.ended_at is not None:
            down_at = max(down_at or 0.0, a.ended_at)
    for p in run.probes:
        if p.found is False:  # a probe that waited in vain saw no capacity until it gave up
            down_at = max(down_at or 0.0, p.ended_at or now)
    return SpotHistory(run_s, wait_s, waits, down_at)


def _policy_capacity(run: Run, ctx: Context, *, current: Capacity | None,
                     spot_available: bool) -> Capacity:
    view = policy_view(run, ctx, current=current, spot_available=spot_available)
    return choose_capacity(view, ctx.recovery)


# ---------------------------------------------------------------- launching

def _launch(run: Run, ctx: Context, capacity: Capacity, reason: str) -> Run:
    previous = run.current
    number = len(run.attempts) + 1
    regions = ctx.regions
    region = run.next_region if run.next_region in regions and capacity is Capacity.SPOT \
        else regions[run.region_index % len(regions)]
    exact = run.health.trust_until_step is not None  # diverged checkpoints may still be there
    ckpt = run.health.rollback if exact else run.latest_checkpoint
    machine = run.health.machine_type
    attempt = Attempt(number=number, capacity=capacity, region=region, created_at=ctx.now,
                      resumed_from_step=ckpt.step if ckpt else None,
                      resumed_from_uri=ckpt.uri if ckpt else None, machine_type=machine)
    run = replace(run, attempts=(*run.attempts, attempt), next_action_at=None, next_capacity=None,
                  next_reason=None, next_region=None)
    if previous is not None and previous.capacity != capacity:
        run = replace(run, escalated={"from": str(previous.capacity), "to": str(capacity),
                                      "reason": reason, "at": ctx.now})
        run = _publish(run, ctx, "run.escalated", **{"from": str(previous.capacity)},
                       to=str(capacity), reason=reason)
        run = _note(run, ctx, f"escalated to {capacity}", reason)
    run = _to(run, RunStatus.STARTING, ctx, reason)
    run = _note(run, ctx, f"launch attempt {number} on {capacity} in {region}"
                + (f" ({machine})" if machine else ""),
                reason + (f"; resume from step {ckpt.step}" if ckpt else "; fresh start"))
    run, intent_id = _next_intent_id(run)
    return _add(run, LaunchIntent(intent_id, number, capacity, region,
                                  resume_step=ckpt.step if ckpt else None,
                                  resume_uri=ckpt.uri if ckpt else None,
                                  claimed_until=ctx.now + LAUNCH_LEASE_S,
                                  machine_type=machine, resume_exact=exact))


# ---------------------------------------------------------------- decide

def decide(run: Run, obs: Observation, ctx: Context) -> Run:
    """Apply one observation: the new run, with any new intents in its outbox."""
    if run.status.terminal and not isinstance(obs, IntentDone | LaunchDone | JobObserved | JobMissing
                                              | CheckpointsDeleted | ProbeLaunched
                                              | ProbeLaunchFailed | ProbeObserved | ProbeMissing):
        return run
    handler = _HANDLERS[type(obs)]
    new = _probes_follow(_retention(run, handler(run, obs, ctx), ctx), ctx)
    return new if new == run else replace(new, updated_at=ctx.now)


def _on_intent_done(run: Run, obs: Observation, ctx: Context) -> Run:
    assert isinstance(obs, IntentDone)
    return replace(run, outbox=tuple(i for i in run.outbox if i.id != obs.intent_id))


def _on_launch_done(run: Run, obs: Observation, ctx: Context) -> Run:
    assert isinstance(obs, LaunchDone)
    run = replace(run, outbox=tuple(i for i in run.outbox if i.id != obs.intent_id))
    attempt = run.attempt(obs.attempt)
    if attempt is None:
        return run
    if attempt.job_name == obs.job_name:
        return run
    attempt = replace(attempt, job_name=obs.job_name,
                      state=AttemptState.QUEUED if attempt.state is AttemptState.LAUNCHING
                      else attempt.state,
                      queued_since=attempt.queued_since or ctx.now)
    run = _with_attempt(run, attempt)
    if run.status.terminal or run.status is RunStatus.CANCELLING or attempt is not run.current:
        # The job was created after the run moved on: stop it, it must not train twice.
        reason = CANCEL_BY_OPERATOR if run.status is RunStatus.CANCELLING else CANCEL_ORPHAN
        return _cancel_attempt(run, ctx, attempt, reason)
    run = _publish(run, ctx, "attempt.launched", attempt=attempt.number,
                   capacity=str(attempt.capacity), region=attempt.region, job_name=obs.job_name,
                   resumed_from_step=attempt.resumed_from_step,
                   resumed_from_uri=attempt.resumed_from_uri)
    return _note(run, ctx, f"attempt {attempt.number} job created", obs.job_name)


def _on_launch_failed(run: Run, obs: Observation, ctx: Context) -> Run:
    assert isinstance(obs, LaunchFailed)
    attempt = run.attempt(obs.attempt)
    if not obs.permanent or attempt is None or not attempt.live:
        # Transient: the intent stays in the outbox. Refused for quota, its claim is given up so
        # that the tick's retry pass (or another instance) takes it again as the budget refills;
        # otherwise the tick retries it once its claim expires.
        if obs.code == QUOTA_REFUSED:
            run = replace(run, outbox=tuple(replace(i, claimed_until=ctx.now)
                                            if i.id == obs.intent_id else i for i in run.outbox))
        note = f"launch of attempt {obs.attempt} failed, will retry"
        if run.history and run.history[-1].what == note:
            return run  # retried until it goes: one line in the history, not one per try
        return _note(run, ctx, note, obs.message)
    run = replace(run, outbox=tuple(i for i in run.outbox if i.id != obs.intent_id))
    attempt = replace(attempt, state=AttemptState.FAILED, ended_at=ctx.now,
                      failure=FailureClass.LAUNCH_REJECTED, end_reason=obs.message)
    run = _with_attempt(run, attempt)
    return _fail(run, ctx, RunStatus.FAILED_LAUNCH, f"Vertex AI refused the job: {obs.message}",
                 FailureClass.LAUNCH_REJECTED)


def _on_trainer(run: Run, obs: Observation, ctx: Context) -> Run:
    assert isinstance(obs, TrainerReported)
    attempt = run.attempt(obs.attempt)
    if attempt is None:
        return run
    progress = run.progress
    fresh_rate: float | None = None
    if obs.step is not None and obs.step >= progress.step:
        rate = progress.rate
        if progress.at is not None and obs.at > progress.at and obs.step > progress.step \
                and attempt.started_at is not None and progress.at >= attempt.started_at:
            rate = fresh_rate = (obs.step - progress.step) / (obs.at - progress.at)
        progress = Progress(step=obs.step, total_steps=obs.total_steps or progress.total_steps,
                            at=obs.at, rate=rate, metrics=dict(obs.metrics) or progress.metrics)
    run = replace(run, progress=progress)
    if obs.step is not None and (attempt.progress_step or -1) < obs.step:
        run = _with_attempt(run, replace(attempt, progress_step=obs.step))
    if obs.checkpoint_uri and obs.step is not None:
        run = _newer_checkpoint(run, Checkpoint(obs.step, obs.checkpoint_uri))
    if obs.kind == "started" and attempt.started_at is None:
        run = _with_attempt(run, replace(run.attempt(obs.attempt) or attempt, started_at=obs.at))
    return _sweep_curve(_trainer_health(run, obs, ctx, fresh_rate), obs, ctx)


# ---------------------------------------------------------------- Model Registry

def _register_model(run: Run, ctx: Context, attempt: Attempt, succeeded: Mapping[str, Any]) -> Run:
    """The job succeeded: register the model first; run.succeeded then names its version."""
    run = _to(run, RunStatus.REGISTERING, ctx, f"attempt {attempt.number} succeeded")
    run, intent_id = _next_intent_id(run)
    return _add(run, RegisterModelIntent(intent_id, run.output_uri, dict(succeeded),
                                         claimed_until=ctx.now + LAUNCH_LEASE_S))


def _on_model_registered(run: Run, obs: Observation, ctx: Context) -> Run:
    assert isinstance(obs, ModelRegistered)
    intent = next((i for i in run.outbox if i.id == obs.intent_id), None)
    if not isinstance(intent, RegisterModelIntent) or run.status is not RunStatus.REGISTERING:
        return run  # a redelivered result
    run = replace(run, outbox=tuple(i for i in run.outbox if i.id != obs.intent_id),
                  model_name=obs.model_name)
    note = f"model registered: {obs.model_name}" if obs.model_name else \
        f"model not registered: {obs.error}"
    why = f"attempt {run.current.number} succeeded" if run.current else "succeeded"
    run = _to(_note(run, ctx, note), RunStatus.SUCCEEDED, ctx, why)
    return _publish(run, ctx, "run.succeeded", status=str(run.status), **intent.succeeded,
                    model_name=obs.model_name, model_error=obs.error)


# ---------------------------------------------------------------- sweeps: a trial's curve

CURVE_LIMIT = 200


def _sweep_curve(run: Run, obs: TrainerReported, ctx: Context) -> Run:
    """A trial keeps its sweep metric by step; a resumed attempt rewrites the steps it repeats."""
    spec = ctx.pipeline.sweep
    if run.sweep_id is None or spec is None or obs.step is None:
        return run
    value = obs.metrics.get(spec.metric)
    if value is None or not math.isfinite(value):
        return run
    kept = tuple(p for p in run.curve if p.step < obs.step)
    return replace(run, curve=(*kept, MetricPoint(obs.step, float(value)))[-CURVE_LIMIT:])


def _newer_checkpoint(run: Run, ckpt: Checkpoint | None, *, looked_up: bool = False) -> Run:
    if ckpt is None or (run.latest_checkpoint and run.latest_checkpoint.step >= ckpt.step):
        return run
    trusted = run.health.trust_until_step
    if looked_up and trusted is not None and ckpt.step > trusted:
        return run  # possibly written while diverging, and not deleted yet
    return replace(run, latest_checkpoint=ckpt)


_PHASE_TO_STATE = {phase: AttemptState(phase.value) for phase in JobPhase}


def _on_job_missing(run: Run, obs: Observation, ctx: Context) -> Run:
    assert isinstance(obs, JobMissing)
    attempt = run.attempt(obs.attempt)
    if attempt is None or attempt.job_name != obs.job_name or not attempt.live:
        return run
    since = attempt.missing_since if attempt.missing_since is not None else ctx.now
    attempt = replace(attempt, missing_polls=attempt.missing_polls + 1, missing_since=since)
    run = _with_attempt(run, attempt)
    if attempt.missing_polls < LOST_AFTER_POLLS or ctx.now - since < LOST_AFTER_S:
        return run
    status = JobStatus(obs.job_name, JobPhase.FAILED, failure=FailureClass.LOST,
                       message=f"NOT_FOUND on {attempt.missing_polls} polls over "
                               f"{ctx.now - since:.0f}s")
    run = _note(run, ctx, f"attempt {attempt.number} job lost", status.message)
    attempt = replace(attempt, state=AttemptState.FAILED)
    run = _with_attempt(run, attempt)
    if run.status.terminal or attempt is not run.current:
        return run
    return _attempt_ended(run, ctx, attempt, status)


def _on_job(run: Run, obs: Observation, ctx: Context) -> Run:
    assert isinstance(obs, JobObserved)
    attempt = run.attempt(obs.attempt)
    if attempt is None:
        return run
    if attempt.job_name is not None and obs.status.job_name not in ("", attempt.job_name):
        return run  # news of another job (a forged or crossed message) says nothing of this one
    state = _PHASE_TO_STATE[obs.status.phase]
    if state.ended and not obs.confirmed:
        return run  # only Vertex's own terminal state ends an attempt
    run = _newer_checkpoint(run, obs.checkpoint, looked_up=True)
    if attempt.job_name is None:
        attempt = replace(attempt, job_name=obs.status.job_name)
    if attempt.missing_polls and obs.confirmed:
        attempt = replace(attempt, missing_polls=0, missing_since=None)  # Vertex knows it again
    if state.rank <= attempt.state.rank or attempt.state.ended:
        return _with_attempt(run, attempt)  # late or repeated news never moves an attempt back
    attempt = replace(attempt, state=state)
    if state in (AttemptState.QUEUED, AttemptState.PENDING):
        attempt = replace(attempt, queued_since=attempt.queued_since or ctx.now)
    if state is AttemptState.RUNNING:
        attempt = replace(attempt, started_at=attempt.started_at or obs.status.start_time or ctx.now)
    run = _with_attempt(run, attempt)
    if run.status.terminal:
        return run
    if attempt is not run.current:
        if state is AttemptState.RUNNING or state is AttemptState.QUEUED:
            return _cancel_attempt(run, ctx, attempt, CANCEL_ORPHAN)
        return run
    if state is AttemptState.RUNNING and run.status is RunStatus.STARTING:
        return _to(run, RunStatus.RUNNING, ctx, f"attempt {attempt.number} running")
    if state.ended:
        return _attempt_ended(run, ctx, attempt, obs.status)
    return run


def _end_attempt(attempt: Attempt, ctx: Context, status: JobStatus, reason: str,
                 failure: FailureClass | None) -> Attempt:
    return replace(attempt, ended_at=status.end_time or ctx.now, end_reason=reason,
                   failure=failure, exit_code=status.exit_code)


def _attempt_ended(run: Run, ctx: Context, attempt: Attempt, status: JobStatus) -> Run:
    if attempt.state is AttemptState.SUCCEEDED:
        attempt = _end_attempt(attempt, ctx, status, "succeeded", None)
        run = _announce_end(_with_attempt(run, attempt), ctx, attempt)
        succeeded = {"attempts": len(run.attempts), "preemptions": run.counters.preemptions,
                     "cost_estimate": round(cost_estimate(run, ctx), 4),
                     "model_uri": run.output_uri, "cost": _cost(run, ctx)}
        if ctx.pipeline.model is not None and run.sweep_id is None:
            return _register_model(run, ctx, attempt, succeeded)
        run = _to(run, RunStatus.SUCCEEDED, ctx, f"attempt {attempt.number} succeeded")
        return _publish(run, ctx, "run.succeeded", status=str(run.status), **succeeded)
    failure = _failure_of(attempt, status)
    reason = _END_REASONS[failure](attempt, status)
    attempt = _end_attempt(attempt, ctx, status, reason, failure)
    run = _with_attempt(run, attempt)
    run = _announce_end(run, ctx, attempt)
    if failure is FailureClass.CANCELLED:
        if run.status is RunStatus.CANCELLING and run.stop_status is not None:
            return _fail(run, ctx, run.stop_status, run.end_reason or "stopped",
                         _STOP_FAILURES.get(run.stop_status))
        if run.status is RunStatus.CANCELLING or attempt.cancel_reason is None:
            why = run.end_reason if run.status is RunStatus.CANCELLING else \
                "the job was cancelled outside spotorch"
            run = _to(run, RunStatus.CANCELLED, ctx, why or "cancelled")
            return _publish(run, ctx, "run.cancelled", status=str(run.status),
                            reason=run.end_reason, cost=_cost(run, ctx))
        if attempt.cancel_reason == CANCEL_SWITCH:
            return _launch(run, ctx, run.next_capacity or Capacity.STANDARD,
                           run.next_reason or "capacity switch")
    return _recover(run, ctx, attempt, failure)


def _announce_end(run: Run, ctx: Context, attempt: Attempt) -> Run:
    run = _note(run, ctx, f"attempt {attempt.number} ended", attempt.end_reason or "")
    if attempt.failure is FailureClass.PREEMPTED:
        return _publish(run, ctx, "attempt.preempted", attempt=attempt.number,
                        capacity=str(attempt.capacity), job_name=attempt.job_name,
                        progress_step=attempt.progress_step,
                        preemptions=run.counters.preemptions + 1)
    return _publish(run, ctx, "attempt.ended", attempt=attempt.number,
                    capacity=str(attempt.capacity), job_name=attempt.job_name,
                    state=str(attempt.state), end_reason=attempt.end_reason,
                    failure_class=str(attempt.failure) if attempt.failure else None,
                    exit_code=attempt.exit_code)


# How a stopped run ends -> the failure class its run.failed names (others: none).
_STOP_FAILURES: Mapping[RunStatus, FailureClass] = {RunStatus.FAILED_DIVERGED: FailureClass.DIVERGED}

# Why spotorch cancelled an attempt -> the failure class its end counts as (others: CANCELLED).
_CANCEL_FAILURES: Mapping[str, FailureClass] = {
    CANCEL_STOCKOUT: FailureClass.STOCKOUT,
    CANCEL_HUNG: FailureClass.HUNG,
    CANCEL_SLOW: FailureClass.HUNG,
    CANCEL_DIVERGED: FailureClass.DIVERGED,
}


def _failure_of(attempt: Attempt, status: JobStatus) -> FailureClass:
    if attempt.state is AttemptState.CANCELLED or attempt.cancel_reason is not None:
        return _CANCEL_FAILURES.get(attempt.cancel_reason or "", FailureClass.CANCELLED)
    return status.failure or FailureClass.INFRA


_END_REASONS: Mapping[FailureClass, Callable[[Attempt, JobStatus], str]] = {
    FailureClass.PREEMPTED: lambda a, s: "preempted" + (f": {s.message}" if s.message else ""),
    FailureClass.STOCKOUT: lambda a, s: "stockout: no capacity" + (
        f" ({s.message})" if s.message else " within the stockout wait"),
    FailureClass.USER_ERROR: lambda a, s: f"user error: exit code {s.exit_code}"
    + (f" ({s.message})" if s.message else ""),
    FailureClass.INFRA: lambda a, s: f"infrastructure error: {s.message or 'unknown'}",
    FailureClass.TIMEOUT: lambda a, s: f"timeout: {s.message or 'the job hit its timeout'}",
    FailureClass.CANCELLED: lambda a, s: f"cancelled ({a.cancel_reason or 'outside spotorch'})",
    FailureClass.LAUNCH_REJECTED: lambda a, s: f"launch rejected: {s.message}",
    FailureClass.LOST: lambda a, s: f"lost: {s.message or 'Vertex AI no longer knows the job'}",
    FailureClass.HUNG: lambda a, s: f"hung: {a.cancel_detail or 'no trainer report'}",
    FailureClass.OUT_OF_MEMORY: lambda a, s: "out of memory" + (
        f" (exit code {s.exit_code})" if s.exit_code is not None else "")
    + (f": {s.message}" if s.message else ""),
    FailureClass.DIVERGED: lambda a, s: f"diverged: {a.cancel_detail or 'a divergence rule fired'}",
}

# Failure class -> (counter field, budget field, status when the budget runs out, budget name).
_BUDGETS: Mapping[FailureClass, tuple[str, str, RunStatus, str]] = {
    FailureClass.PREEMPTED: ("preemptions", "max_preemptions", RunStatus.FAILED_PREEMPTED,
                             "preemptions"),
    FailureClass.STOCKOUT: ("stockouts", "max_stockouts", RunStatus.FAILED_NO_RESOURCE,
                            "stockouts"),
    FailureClass.USER_ERROR: ("user_errors", "max_user_errors", RunStatus.FAILED, "user_errors"),
    FailureClass.INFRA: ("infra_errors", "max_infra_errors", RunStatus.FAILED_INFRA,
                         "infra_errors"),
    FailureClass.TIMEOUT: ("timeouts", "max_timeouts", RunStatus.FAILED_TIMEOUT, "timeouts"),
    FailureClass.LOST: ("lost", "max_lost_jobs", RunStatus.FAILED_INFRA, "lost_jobs"),
    # The health classes' limits live in the pipeline's health policy (Context.health).
    FailureClass.HUNG: ("hangs", "max_hangs", RunStatus.FAILED_HUNG, "hangs"),
    FailureClass.DIVERGED: ("divergences", "max_divergences", RunStatus.FAILED_DIVERGED,
                            "divergences"),
}

# Not the job's fault, or nothing to wait for: relaunch without a backoff.
_RELAUNCH_AT_ONCE = frozenset({FailureClass.PREEMPTED, FailureClass.HUNG, FailureClass.DIVERGED})

# A job Vertex answers NOT_FOUND for this many polls in a row, over at least this long, is lost.
# (Defaults until the pipeline format carries them; a transient poll error never counts.)
LOST_AFTER_POLLS = 3
LOST_AFTER_S = 120.0
MAX_LOST_JOBS = 3


def _recover(run: Run, ctx: Context, attempt: Attempt, failure: FailureClass) -> Run:
    """Count the failure against its budget, then relaunch (now or after a backoff) or give up."""
    recovery = ctx.recovery
    if failure is FailureClass.USER_ERROR and attempt.exit_code in recovery.retryable_exit_codes:
        failure = FailureClass.INFRA  # declared retryable: counts against the infra budget
    if failure is FailureClass.OUT_OF_MEMORY:
        return _recover_out_of_memory(run, ctx, attempt)
    counter, limit_field, failed_status, budget = _BUDGETS[failure]
    used = getattr(run.counters, counter) + 1
    progressed = (run.latest_checkpoint is not None
                  and run.latest_checkpoint.step > (attempt.resumed_from_step or -1))
    ran = attempt.started_at is not None  # one that never ran says nothing about progress
    no_progress = 0 if progressed else run.counters.no_progress + (1 if ran else 0)
    run = replace(run, counters=replace(run.counters, **{counter: used, "no_progress": no_progress}))
    limit = int(getattr(recovery, limit_field, getattr(ctx.health, limit_field, MAX_LOST_JOBS)))
    if used > limit:
        run = _publish(run, ctx, "run.budget_exceeded", budget=budget, limit=limit, used=used)
        return _fail(run, ctx, failed_status,
                     f"{budget} budget exhausted: {used} > {limit} (last: {_brief(attempt)})",
                     failure)
    if failure is FailureClass.STOCKOUT:
        run = replace(run, region_index=run.region_index + 1)
    if failure in (FailureClass.PREEMPTED, FailureClass.STOCKOUT):
        run = replace(run, spot_unavailable_until=spot_cooldown_until(ctx.now,
                                                                    recovery.spot_cooldown_s))
    if no_progress >= recovery.max_no_progress_attempts and (
            attempt.capacity is not Capacity.SPOT or recovery.escalation is EscalationKind.NEVER):
        run = _publish(run, ctx, "run.budget_exceeded", budget="no_progress",
                       limit=recovery.max_no_progress_attempts, used=no_progress)
        return _fail(run, ctx, RunStatus.FAILED_NO_PROGRESS,
                     f"{no_progress} attempts in a row ended without a newer checkpoint", failure)
    capacity, reason = _next_capacity(run, ctx, attempt, failure)
    if failure is FailureClass.DIVERGED:
        run = _roll_back(run, ctx)
    if failure in _RELAUNCH_AT_ONCE:
        return _launch(run, ctx, capacity, reason)
    failures_in_row = used if failure is not FailureClass.STOCKOUT else run.counters.stockouts
    wait = backoff_s(recovery, run.run_id, failures_in_row)
    run = replace(run, next_action_at=ctx.now + wait, next_capacity=capacity, next_reason=reason)
    return _to(run, RunStatus.RECOVERING, ctx, f"{reason}; next attempt in {wait:.0f}s")


def _next_capacity(run: Run, ctx: Context, attempt: Attempt,
                   failure: FailureClass) -> tuple[Capacity, str]:
    """Where the next attempt runs after a failure, and why; the first rule that applies wins."""
    recovery = ctx.recovery
    spot_lost = failure in (FailureClass.PREEMPTED, FailureClass.STOCKOUT)
    capacity = _policy_capacity(run, ctx, current=None, spot_available=not spot_lost)
    escalating = attempt.capacity is Capacity.SPOT and \
        recovery.escalation is not EscalationKind.NEVER
    regions = max(len(ctx.pipeline.job.regions), 1)
    if escalating and run.counters.no_progress >= recovery.max_no_progress_attempts:
        # Spot keeps failing before a checkpoint: stop paying for work that is lost.
        return Capacity.STANDARD, (f"{run.counters.no_progress} attempts in a row without a "
                                   "newer checkpoint")
    if escalating and failure is FailureClass.STOCKOUT and run.counters.stockouts >= regions:
        # Waited for Spot in every region: stop waiting.
        return Capacity.STANDARD, (f"no Spot capacity in any of {regions} region(s) within "
                                   "the stockout wait")
    if capacity is Capacity.STANDARD and attempt.capacity is Capacity.SPOT:
        return capacity, _escalation_reason(run, ctx, failure)
    return capacity, f"after {_brief(attempt)} of attempt {attempt.number}"


_BRIEF: Mapping[FailureClass, str] = {
    FailureClass.PREEMPTED: "preemption", FailureClass.STOCKOUT: "stockout",
    FailureClass.USER_ERROR: "user error", FailureClass.INFRA: "infrastructure error",
    FailureClass.TIMEOUT: "timeout", FailureClass.CANCELLED: "cancel",
    FailureClass.LAUNCH_REJECTED: "launch rejection", FailureClass.LOST: "lost job",
    FailureClass.HUNG: "hang", FailureClass.OUT_OF_MEMORY: "out of memory",
    FailureClass.DIVERGED: "divergence",
}


def _brief(attempt: Attempt) -> str:
    """A few words on how an attempt ended (its end_reason keeps the full message)."""
    words = _BRIEF.get(attempt.failure, "failure") if attempt.failure else "end"
    return f"{words} (exit code {attempt.exit_code})" if attempt.exit_code is not None else words


def _escalation_reason(run: Run, ctx: Context, failure: FailureClass) -> str:
    recovery = ctx.recovery
    if recovery.escalation is EscalationKind.COUNT:
        return f"{run.counters.preemptions} preemptions (escalate after " \
               f"{recovery.escalate_after_preemptions})"
    if recovery.escalation is EscalationKind.ALWAYS_STANDARD:
        return "pipeline runs on standard VMs"
    return f"deadline: Spot too risky after {failure} (time left " \
           f"{_fmt_s((run.deadline_at or ctx.now) - ctx.now)})"


def _fmt_s(seconds: float) -> str:
    return f"{seconds / 3600:.1f}h" if seconds >= 3600 else f"{seconds:.0f}s"


def _fail(run: Run, ctx: Context, status: RunStatus, reason: str,
          failure: FailureClass | None) -> Run:
    run = _to(run, status, ctx, reason)
    return _publish(run, ctx, "run.failed", status=str(status), reason=reason,
                    failure_class=str(failure) if failure else None, attempts=len(run.attempts),
                    preemptions=run.counters.preemptions, cost=_cost(run, ctx))


def _cancel_attempt(run: Run, ctx: Context, attempt: Attempt, why: str) -> Run:
    if attempt.cancel_reason is not None and why != CANCEL_BY_OPERATOR:
        return run
    attempt = replace(attempt, cancel_reason=why)
    run = _with_attempt(run, attempt)
    if attempt.job_name is None:
        return run  # not created yet: LaunchDone cancels it when it appears
    run, intent_id = _next_intent_id(run)
    return _add(run, CancelIntent(intent_id, attempt.number, attempt.job_name, why,
                                  claimed_until=ctx.now + LAUNCH_LEASE_S))


def _on_cancel(run: Run, obs: Observation, ctx: Context) -> Run:
    assert isinstance(obs, CancelRequested)
    if run.status is RunStatus.REGISTERING:
        return run  # the model is trained: only its registration is left to finish
    return _stop(run, ctx, obs.reason, None)


def _stop(run: Run, ctx: Context, reason: str, ends_as: RunStatus | None) -> Run:
    """Stop a run: cancel its live job, then end as ends_as (None: CANCELLED)."""
    if run.status is RunStatus.CANCELLING:
        return run
    live = run.current if run.current is not None and run.current.live else None
    if live is None:
        if ends_as is not None:
            return _fail(run, ctx, ends_as, reason, None)
        run = _to(run, RunStatus.CANCELLED, ctx, reason)
        return _publish(run, ctx, "run.cancelled", status=str(run.status), reason=reason,
                        cost=_cost(run, ctx))
    run = _to(run, RunStatus.CANCELLING, ctx, reason)
    run = replace(run, end_reason=reason, stop_status=ends_as)
    # If the job is not created yet, LaunchDone cancels it when it appears.
    return _cancel_attempt(run, ctx, live, CANCEL_BY_OPERATOR)


def _over_budget(run: Run, ctx: Context) -> Run | None:
    """Stop a run whose estimated cost passed the pipeline's budget; None when within it."""
    budget = ctx.pipeline.max_cost
    if budget is None or run.status not in (RunStatus.STARTING, RunStatus.RUNNING,
                                            RunStatus.RECOVERING):
        return None
    spent = cost_estimate(run, ctx)
    if spent <= budget:
        return None
    run = _publish(run, ctx, "run.budget_exceeded", budget="cost", limit=budget,
                   used=round(spent, 4))
    return _stop(run, ctx, f"cost budget exhausted: {spent:.2f} > {budget:.2f}",
                 RunStatus.FAILED_BUDGET)


def _on_promote(run: Run, obs: Observation, ctx: Context) -> Run:
    if run.status is not RunStatus.QUEUED:
        return run
    if run.hardware is None and ctx.pipeline.hardware is not None:
        return _probe_hardware(run, ctx, ctx.hardware_cache or {})
    return _first_launch(run, ctx, "the pipeline's previous run ended")


def _on_tick(run: Run, obs: Observation, ctx: Context) -> Run:
    if run.status is RunStatus.PROBING:
        return _tick_hardware(run, ctx)
    stopped = _over_budget(run, ctx)
    if stopped is not None:
        return stopped
    current = run.current
    if run.status is RunStatus.RECOVERING:
        if run.next_action_at is not None and ctx.now >= run.next_action_at:
            return _launch(run, ctx, run.next_capacity or Capacity.SPOT,
                           run.next_reason or "backoff elapsed")
        return run
    if current is None or not current.live or current.cancel_reason is not None:
        return run
    run = _tick_health(run, ctx, current)
    current = run.current
    if current is None or current.cancel_reason is not None:
        return run
    waiting = current.state in (AttemptState.QUEUED, AttemptState.PENDING)
    queued_for = ctx.now - (current.queued_since or current.created_at)
    if waiting and queued_for > ctx.recovery.stockout_wait_s \
            and current.capacity is not Capacity.FLEX_START:
        run = _note(run, ctx, f"attempt {current.number} queued {queued_for:.0f}s",
                    "stockout: cancelling to try elsewhere")
        return _cancel_attempt(run, ctx, current, CANCEL_STOCKOUT)
    if run.status not in (RunStatus.STARTING, RunStatus.RUNNING) or \
            current.capacity is Capacity.FLEX_START:
        return run
    if current.capacity is Capacity.STANDARD and _probing(ctx) and (
            run.live_probe is not None or _probe_judged(run, ctx)):
        return _tick_probe(run, ctx, current)  # on standard, Spot is seen only through probes
    spot_waiting = current.capacity is Capacity.SPOT and waiting and queued_for > 60.0
    cooling = spot_cooling(ctx.now, run.spot_unavailable_until)
    wanted = _policy_capacity(run, ctx, current=current.capacity,
                              spot_available=not (spot_waiting or cooling))
    run = _deadline_warning(run, ctx, wanted, current)
    if wanted == current.capacity or (wanted is Capacity.SPOT and cooling):
        return run  # back to Spot only once it may have capacity again
    reason = (f"deadline policy: switch {current.capacity} -> {wanted} "
              f"(time left {_fmt_s((run.deadline_at or ctx.now) - ctx.now)})")
    if spot_waiting:  # giving up on a Spot queue is evidence too: don't come straight back
        run = replace(run, spot_unavailable_until=spot_cooldown_until(
            ctx.now, ctx.recovery.spot_cooldown_s))
    run = replace(run, next_capacity=wanted, next_reason=reason)
    run = _note(run, ctx, f"switch to {wanted}", reason)
    return _cancel_attempt(run, ctx, current, CANCEL_SWITCH)


def _deadline_warning(run: Run, ctx: Context, wanted: Capacity, current: Attempt) -> Run:
    if run.deadline_warned or run.deadline_at is None or wanted is not Capacity.STANDARD \
            or current.capacity is not Capacity.SPOT:
        return run
    total_s, done_s = _work_estimates(run, ctx)
    deadline_at = run.deadline_at
    run = replace(run, deadline_warned=True)
    return _publish(run, ctx, "run.deadline_at_risk", deadline=_iso(deadline_at),
                    remaining_work_s=None if total_s is None else max(total_s - done_s, 0.0),
                    time_left_s=deadline_at - ctx.now, action="switching to standard VMs")


# ---------------------------------------------------------------- training health
#
# Rules over the trainer's reports (hung, step rate, divergence), over time (the tick: hung,
# stale checkpoints), over failed attempts (out of memory) and over checkpoints (retention).
# The rules themselves are pure functions in spotorch.health; this section feeds them the run's
# signals and turns what they find into history, events, cancels and relaunches. A rule only
# looks at the current, live attempt of a STARTING/RUNNING run that nothing is cancelling.

def _watched(run: Run, attempt: Attempt) -> bool:
    current = run.current
    return (run.status in (RunStatus.STARTING, RunStatus.RUNNING) and current is not None
            and attempt.number == current.number and attempt.live
            and attempt.cancel_reason is None)


def _loss_of(obs: TrainerReported, metric: str) -> float | None:
    """The loss a report carries: NaN when the trainer flagged it non-finite."""
    if metric in obs.nonfinite:
        return math.nan
    return obs.metrics.get(metric)


def _trainer_health(run: Run, obs: TrainerReported, ctx: Context,
                    fresh_rate: float | None) -> Run:
    attempt = run.attempt(obs.attempt)
    if attempt is None or not _watched(run, attempt):
        return run
    policy, health = ctx.health, run.health
    gap = obs.at - attempt.last_report_at if attempt.last_report_at is not None else 0.0
    rate, slow = health.rate, None
    if fresh_rate is not None:
        rate, slow = hp.rate_sample(policy, health.rate, fresh_rate, obs.step)
    loss, diverged = health.loss, None
    value = _loss_of(obs, policy.loss_metric)
    if value is not None and obs.step is not None and obs.kind == "progress":
        loss, diverged = hp.loss_sample(policy, health.loss, obs.step, value)
    health = replace(health, reports=health.reports + 1,
                     longest_gap_s=max(health.longest_gap_s, gap),
                     report_interval_s=obs.report_interval_s or health.report_interval_s,
                     rate=rate, loss=loss)
    attempts = list(run.attempts)  # one copy of the run for attempt and health together
    attempts[attempt.number - 1] = replace(attempt, last_report_at=max(
        obs.at, attempt.last_report_at or obs.at))
    run = replace(run, attempts=tuple(attempts), health=health)
    if obs.checkpoint_uri and obs.step is not None:
        run = _known_checkpoint(run, ctx, obs)
    if slow is not None:
        run = _on_slow(run, ctx, slow)
    current = run.current
    if diverged is not None and current is not None and _watched(run, current):
        run = _on_diverged(run, ctx, diverged)
    return run


def _known_checkpoint(run: Run, ctx: Context, obs: TrainerReported) -> Run:
    """Remember a reported checkpoint (with its metric, for keep-best) and when it arrived."""
    assert obs.step is not None and obs.checkpoint_uri
    metric_name = ctx.health.keep_best_metric
    metric = obs.metrics.get(metric_name) if metric_name else None
    known = hp.KnownCheckpoint(obs.step, obs.checkpoint_uri, obs.at, metric, obs.checkpoint_s)
    others = tuple(c for c in run.health.checkpoints if c.step != obs.step)
    checkpoints = tuple(sorted((*others, known), key=lambda c: c.step))[-KNOWN_CHECKPOINTS_LIMIT:]
    health = replace(run.health, checkpoints=checkpoints)
    if run.latest_checkpoint is not None and run.latest_checkpoint.step == obs.step:
        health = replace(health, checkpoint_at=obs.at)
    return replace(run, health=health)


def _cancel_for_health(run: Run, ctx: Context, why: str, detail: str) -> Run:
    current = run.current
    assert current is not None
    run = _with_attempt(run, replace(current, cancel_detail=detail))
    return _cancel_attempt(run, ctx, run.current or current, why)


def _on_slow(run: Run, ctx: Context, finding: hp.Finding) -> Run:
    current = run.current
    assert current is not None
    relaunch = ctx.health.step_rate_relaunch
    run = _publish(run, ctx, "run.step_rate_degraded", attempt=current.number,
                   step=finding.step, rate=finding.values.get("rate"),
                   median=finding.values.get("median"),
                   fraction=finding.values.get("fraction"), reason=finding.message,
                   action="relaunch" if relaunch else "warn")
    run = _note(run, ctx, f"step rate collapsed on attempt {current.number}", finding.message)
    if not relaunch:
        return run
    return _cancel_for_health(run, ctx, CANCEL_SLOW, f"{finding.rule}: {finding.message}")


def _on_diverged(run: Run, ctx: Context, finding: hp.Finding) -> Run:
    """A divergence rule fired: fail the run, or relaunch from before the divergence began."""
    current = run.current
    assert current is not None
    policy = ctx.health
    relaunch = policy.divergence_action is hp.DivergenceAction.RELAUNCH
    safe = hp.resume_point(((c.step, c.uri) for c in run.health.checkpoints),
                           finding.good_until_step)
    run = _publish(run, ctx, "run.diverged", attempt=current.number, rule=str(finding.rule),
                   step=finding.step, values=dict(finding.values), reason=finding.message,
                   action="relaunch" if relaunch else "fail",
                   resume_step=safe[0] if safe and relaunch else None)
    run = _note(run, ctx, f"diverged: {finding.rule} at step {finding.step}", finding.message)
    if not relaunch:
        return _stop(run, ctx, f"diverged ({finding.rule}): {finding.message}",
                     RunStatus.FAILED_DIVERGED)
    rollback = Checkpoint(*safe) if safe else None
    run = replace(run, health=replace(run.health, rollback=rollback))
    return _cancel_for_health(run, ctx, CANCEL_DIVERGED, f"{finding.rule}: {finding.message}")


def _roll_back(run: Run, ctx: Context) -> Run:
    """Before relaunching a diverged run: resume from the safe checkpoint, delete the later ones."""
    health = run.health
    safe = health.rollback
    trusted = safe.step if safe else -1
    progress = replace(run.progress, step=max(trusted, 0), at=None, rate=None)
    health = replace(health, trust_until_step=trusted, loss=hp.LossState(),
                     checkpoints=tuple(c for c in health.checkpoints if c.step <= trusted))
    run = replace(run, latest_checkpoint=safe, progress=progress, health=health)
    run = _note(run, ctx, "roll back", f"resume from step {safe.step}" if safe
                else "no checkpoint before the divergence: fresh start")
    run, intent_id = _next_intent_id(run)
    return _add(run, DeleteCheckpointsIntent(intent_id, run.checkpoint_uri, above=trusted,
                                             claimed_until=ctx.now + LAUNCH_LEASE_S))


def _base_machine(ctx: Context) -> str:
    pools = ctx.pipeline.job.worker_pools
    return pools[0].machine_type if pools else ""


def _recover_out_of_memory(run: Run, ctx: Context, attempt: Attempt) -> Run:
    """Out of memory: never the same machine again; the next larger fallback, or fail."""
    run = replace(run, counters=replace(run.counters,
                                        out_of_memory=run.counters.out_of_memory + 1))
    current = attempt.machine_type or _base_machine(ctx)
    larger = hp.next_machine(ctx.health, current)
    if larger is None:
        why = (f"{current} is the largest of health.fallback_machines"
               if ctx.health.fallback_machines else "no health.fallback_machines listed")
        return _fail(run, ctx, RunStatus.FAILED_OUT_OF_MEMORY,
                     f"out of memory on {current}; not retried on the same machine ({why})",
                     FailureClass.OUT_OF_MEMORY)
    reason = f"out of memory on {current}: next attempt on {larger}"
    # Another machine, another normal step rate: the median starts over.
    run = replace(run, health=replace(run.health, machine_type=larger, rate=hp.RateState()))
    run = _publish(run, ctx, "run.machine_changed", **{"from": current}, to=larger,
                   reason=reason, attempt=attempt.number)
    run = _note(run, ctx, f"machine {current} -> {larger}", reason)
    return _launch(run, ctx, attempt.capacity, reason)


def _tick_health(run: Run, ctx: Context, current: Attempt) -> Run:
    """Time-based rules: hung attempts, stale checkpoints (runs that use the trainer helper)."""
    if run.status is not RunStatus.RUNNING or current.state is not AttemptState.RUNNING \
            or run.health.reports == 0 or not _watched(run, current):
        return run
    health = run.health
    silent_since = current.last_report_at or current.started_at or ctx.now
    starting = (current.progress_step or 0) <= (current.resumed_from_step or 0)
    found = hp.hung(ctx.health, silent_s=ctx.now - silent_since,
                    report_interval_s=health.report_interval_s,
                    longest_gap_s=health.longest_gap_s, step=run.progress.step,
                    starting=starting)
    if found is not None:
        run = _publish(run, ctx, "attempt.hung", attempt=current.number,
                       job_name=current.job_name, step=run.progress.step,
                       silent_s=found.values["silent_s"],
                       hang_after_s=found.values["hang_after_s"],
                       last_report=_iso(current.last_report_at), reason=found.message)
        run = _note(run, ctx, f"attempt {current.number} hung", found.message)
        return _cancel_for_health(run, ctx, CANCEL_HUNG, found.message)
    latest = run.latest_checkpoint
    key = f"{current.number}:{latest.step if latest else -1}"
    if health.stale_warned == key:
        return run
    since = max(health.checkpoint_at or 0.0, current.started_at or ctx.now)
    found = hp.stale_checkpoint(ctx.health, since_s=ctx.now - since, step=run.progress.step)
    if found is None:
        return run
    run = replace(run, health=replace(health, stale_warned=key))
    run = _publish(run, ctx, "run.checkpoint_stale", attempt=current.number,
                   step=run.progress.step, checkpoint_step=latest.step if latest else None,
                   since_s=found.values["since_s"], stale_after_s=found.values["stale_after_s"],
                   reason=found.message)
    return _note(run, ctx, "checkpoint stale", found.message)


def _retention(before: Run, run: Run, ctx: Context) -> Run:
    """Decide a retention pass when a newer checkpoint became known, and when the run ends."""
    policy = ctx.health
    ending = before.active and not run.active
    newer = run.active and run.latest_checkpoint is not None \
        and run.latest_checkpoint != before.latest_checkpoint
    if policy.keep_last is None or not (ending or newer) or (ending and not policy.prune_on_end):
        return run
    if run.latest_checkpoint is None and not run.health.checkpoints:
        return run  # nothing was ever written
    if any(isinstance(i, DeleteCheckpointsIntent) and (i.above is not None or i.ending == ending)
           for i in run.outbox):
        return run  # a pass (or the diverged checkpoints' deletion) is pending: it comes first
    protect = {a.resumed_from_step for a in run.attempts if a.live}
    protect |= {i.resume_step for i in run.outbox if isinstance(i, LaunchIntent)}
    protect |= {c.step for c in (run.latest_checkpoint, run.health.rollback) if c is not None}
    if policy.keep_best_metric:
        protect.add(hp.best_step(run.health.checkpoints, policy.keep_best_mode))
    keep = tuple(sorted(s for s in protect if s is not None))
    run, intent_id = _next_intent_id(run)
    return _add(run, DeleteCheckpointsIntent(
        intent_id, run.checkpoint_uri,
        keep_newest=policy.keep_last_on_end if ending else policy.keep_last, keep=keep,
        ending=ending, claimed_until=ctx.now + LAUNCH_LEASE_S))


def _on_checkpoints_deleted(run: Run, obs: Observation, ctx: Context) -> Run:
    assert isinstance(obs, CheckpointsDeleted)
    intent = next((i for i in run.outbox if i.id == obs.intent_id), None)
    run = replace(run, outbox=tuple(i for i in run.outbox if i.id != obs.intent_id))
    if not isinstance(intent, DeleteCheckpointsIntent):
        return run
    gone = set(obs.steps)
    health = run.health
    health = replace(health, deleted_checkpoints=health.deleted_checkpoints + len(gone),
                     bytes_reclaimed=health.bytes_reclaimed + obs.bytes,
                     checkpoints=tuple(c for c in health.checkpoints if c.step not in gone))
    rollback = intent.above is not None
    if rollback:
        health = replace(health, trust_until_step=None, rollback=None)
    run = replace(run, health=health)
    if not gone:
        return run
    why = "divergence" if rollback else "retention"
    run = _note(run, ctx, f"{len(gone)} checkpoint(s) deleted ({why})",
                f"steps {sorted(gone)}; {obs.bytes} bytes reclaimed")
    if not run.active:
        return run  # a terminal run publishes nothing after its last event; history has it
    return _publish(run, ctx, "run.checkpoints_deleted", steps=sorted(gone),
                    bytes_reclaimed=obs.bytes, total_bytes_reclaimed=health.bytes_reclaimed,
                    reason=why)


def checkpoint_advice(run: Run, now: float) -> hp.CheckpointAdvice:
    """The run's checkpoint interval against the Young/Daly optimum (for `spotorch show`)."""
    history = spot_history(run, now)
    known = run.health.checkpoints
    return hp.checkpoint_advice([c.at for c in known],
                                [c.seconds for c in known if c.seconds is not None],
                                history.run_s, run.counters.preemptions)


# ---------------------------------------------------------------- Spot probes
#
# Production cannot see Spot capacity while a run is on standard VMs. With
# recovery.spot_probes enabled (escalation: deadline), each tick on standard asks
# policy.probe_worth whether a probe pays for itself now; if so a minimal Spot job of the run's
# shape is launched in the best region. Its RUNNING is the answer yes: the probe is cancelled at
# once and the deadline policy is asked again with Spot seen; a switch goes through the usual
# cancel-and-relaunch, in the probe's region. Queued past its wait, the answer is no. Probes
# never count as attempts and never touch a budget; the cost ledger bills them.

def _probing(ctx: Context) -> bool:
    return ctx.recovery.spot_probes.enabled and ctx.recovery.escalation is EscalationKind.DEADLINE


def _with_probe(run: Run, probe: Probe) -> Run:
    kept = tuple(probe if p.number == probe.number else p for p in run.probes)
    if all(p.number != probe.number for p in run.probes):
        kept = (*kept, probe)
    # Forget the oldest ended probes first; a live one is never forgotten.
    while len(kept) > PROBES_LIMIT and any(not p.live for p in kept):
        oldest = next(p for p in kept if not p.live)
        kept = tuple(p for p in kept if p is not oldest)
    return replace(run, probes=kept)


def probe_terms(run: Run, ctx: Context, region: str) -> ProbeTerms:
    """What a probe of this run's shape costs, and what finding Spot back saves per second."""
    shaped = run_pipeline(ctx.pipeline, run.hardware)
    spot = hourly_rate(shaped, Capacity.SPOT, region).per_hour / 3600.0
    standard = hourly_rate(shaped, Capacity.STANDARD, region).per_hour / 3600.0
    probes = ctx.recovery.spot_probes
    return ProbeTerms(hit_cost=probes.billed_s * spot, saving_per_s=max(standard - spot, 0.0),
                      wait_s=probes.wait_s)


def _probe_judged(run: Run, ctx: Context) -> bool:
    """Whether probe_worth can weigh a probe: it needs the slack (a deadline and the work).
    Without it the run falls back to the cooldown's assumption that Spot is back."""
    view = policy_view(run, ctx, current=Capacity.STANDARD, spot_available=False, assumed=False)
    return slack_of(view) is not None


def _tick_probe(run: Run, ctx: Context, current: Attempt) -> Run:
    """On standard: give up a probe past its wait; launch one when the policy says it pays."""
    probe = run.live_probe
    if probe is not None:
        waited = ctx.now - (probe.queued_since or probe.created_at)
        if probe.job_name is not None and probe.cancel_reason is None and probe.found is None \
                and probe.state is not AttemptState.RUNNING \
                and waited > ctx.recovery.spot_probes.wait_s:
            run = _note(run, ctx, f"probe {probe.number}: no Spot capacity in {probe.region}",
                        f"queued {waited:.0f}s")
            probe = replace(probe, found=False)
            run = _publish(_with_probe(run, probe), ctx, "run.spot_probed", probe=probe.number,
                           region=probe.region, found=False, switching=False,
                           reason=f"no capacity within {waited:.0f}s")
            return _cancel_probe(run, ctx, probe, CANCEL_PROBE_NO_CAPACITY)
        return run
    if current.state is not AttemptState.RUNNING or current.cancel_reason is not None:
        return run
    region = ctx.regions[0]
    view = policy_view(run, ctx, current=Capacity.STANDARD, spot_available=False, assumed=False)
    if not probe_worth(view, probe_terms(run, ctx, region),
                       lambda seen: choose_capacity(seen, ctx.recovery)):
        return run
    number = run.counters.probes + 1
    run = replace(run, counters=replace(run.counters, probes=number))
    run = _with_probe(run, Probe(number, region, created_at=ctx.now))
    run = _note(run, ctx, f"probe {number}: looking for Spot capacity in {region}",
                "finding Spot back would pay for the probe")
    run, intent_id = _next_intent_id(run)
    return _add(run, LaunchProbeIntent(intent_id, number, region,
                                       claimed_until=ctx.now + LAUNCH_LEASE_S))


def _cancel_probe(run: Run, ctx: Context, probe: Probe, why: str) -> Run:
    if probe.cancel_reason is not None:
        return run
    probe = replace(probe, cancel_reason=why)
    run = _with_probe(run, probe)
    if probe.job_name is None:
        return run  # not created yet: ProbeLaunched cancels it when it appears
    return _stop_probe_job(run, ctx, probe)


def _stop_probe_job(run: Run, ctx: Context, probe: Probe) -> Run:
    assert probe.job_name is not None
    run, intent_id = _next_intent_id(run)
    return _add(run, CancelIntent(intent_id, 0, probe.job_name, f"probe: {probe.cancel_reason}",
                                  claimed_until=ctx.now + LAUNCH_LEASE_S, probe=probe.number))


def _probes_follow(run: Run, ctx: Context) -> Run:
    """A capacity probe lives only while its run runs on standard, a hardware probe only while
    its run is PROBING: otherwise it is cancelled."""
    current = run.current
    on_standard = (run.status in (RunStatus.STARTING, RunStatus.RUNNING) and current is not None
                   and current.live and current.capacity is Capacity.STANDARD
                   and current.cancel_reason is None)
    for probe in run.probes:
        if not probe.live or probe.cancel_reason is not None:
            continue
        wanted = run.status is RunStatus.PROBING if probe.kind == PROBE_HARDWARE else on_standard
        if not wanted:
            run = _cancel_probe(run, ctx, probe, CANCEL_PROBE_MOVED_ON)
    return run


def _drop_intent(run: Run, intent_id: str) -> Run:
    return replace(run, outbox=tuple(i for i in run.outbox if i.id != intent_id))


def _on_probe_launched(run: Run, obs: Observation, ctx: Context) -> Run:
    assert isinstance(obs, ProbeLaunched)
    run = _drop_intent(run, obs.intent_id)
    probe = run.probe(obs.probe)
    if probe is None or probe.job_name == obs.job_name:
        return run
    probe = replace(probe, job_name=obs.job_name, queued_since=probe.queued_since or ctx.now,
                    state=AttemptState.QUEUED if probe.state is AttemptState.LAUNCHING
                    else probe.state)
    run = _with_probe(run, probe)
    if probe.cancel_reason is not None:  # created after the run moved on: stop it now
        return _stop_probe_job(run, ctx, probe)
    return _note(run, ctx, f"probe {probe.number} job created", obs.job_name)


def _on_probe_launch_failed(run: Run, obs: Observation, ctx: Context) -> Run:
    assert isinstance(obs, ProbeLaunchFailed)
    probe = run.probe(obs.probe)
    if not obs.permanent or probe is None:
        return run  # transient: the intent stays; the tick retries it when its claim expires
    run = _drop_intent(run, obs.intent_id)
    probe = replace(probe, state=AttemptState.FAILED, ended_at=ctx.now, end_reason=obs.message)
    run = _note(_with_probe(run, probe), ctx, f"probe {probe.number} not launched", obs.message)
    return _hardware_measured(run, ctx, probe, None, f"could not launch: {obs.message}")


def _on_probe_missing(run: Run, obs: Observation, ctx: Context) -> Run:
    assert isinstance(obs, ProbeMissing)
    probe = run.probe(obs.probe)
    if probe is None or probe.job_name != obs.job_name or not probe.live:
        return run
    probe = replace(probe, state=AttemptState.FAILED, ended_at=ctx.now,
                    end_reason="Vertex AI no longer knows the probe's job")
    return _hardware_measured(_with_probe(run, probe), ctx, probe, None,
                              "probe job lost: Vertex AI no longer knows it")


def _on_probe(run: Run, obs: Observation, ctx: Context) -> Run:
    assert isinstance(obs, ProbeObserved)
    probe = run.probe(obs.probe)
    if probe is None or (probe.job_name is not None and obs.status.job_name != probe.job_name):
        return run
    state = _PHASE_TO_STATE[obs.status.phase]
    if probe.state.ended or state.rank <= probe.state.rank:
        return run  # late or repeated news
    status = obs.status
    ran = state is AttemptState.RUNNING or (state.ended and status.start_time is not None)
    probe = replace(probe, state=state, job_name=probe.job_name or status.job_name)
    if state in (AttemptState.QUEUED, AttemptState.PENDING):
        probe = replace(probe, queued_since=probe.queued_since or ctx.now)
    if ran and probe.started_at is None:
        probe = replace(probe, started_at=status.start_time or ctx.now)
    if state.ended:
        probe = replace(probe, ended_at=status.end_time or ctx.now,
                        end_reason=status.message or str(state))
    run = _with_probe(run, probe)
    if probe.kind == PROBE_HARDWARE:
        if not state.ended:
            return run
        return _hardware_measured(run, ctx, probe, obs.result,
                                  f"ended {state} without a measurement"
                                  + (f": {status.message}" if status.message else ""))
    if not ran or probe.found is not None:
        return run
    probe = replace(probe, found=True)
    run = _with_probe(run, probe)
    if probe.live:
        run = _cancel_probe(run, ctx, probe, CANCEL_PROBE_ANSWERED)
    return _spot_found(run, ctx, probe)


def _spot_found(run: Run, ctx: Context, probe: Probe) -> Run:
    """A probe ran: Spot has capacity in its region. Ask the policy again, with Spot seen."""
    run = replace(run, spot_unavailable_until=None)  # capacity confirmed: the guess is void
    current = run.current
    on_standard = (run.status in (RunStatus.STARTING, RunStatus.RUNNING) and current is not None
                   and current.live and current.capacity is Capacity.STANDARD
                   and current.cancel_reason is None)
    wanted = Capacity.STANDARD
    if on_standard:
        view = policy_view(run, ctx, current=Capacity.STANDARD, spot_available=True,
                           assumed=False)
        wanted = choose_capacity(view, ctx.recovery)
    switching = on_standard and wanted is Capacity.SPOT
    time_left = _fmt_s((run.deadline_at or ctx.now) - ctx.now)
    why = (f"probe {probe.number} found Spot capacity in {probe.region}: switch standard -> spot "
           f"(time left {time_left})" if switching else
           f"probe {probe.number} found Spot capacity in {probe.region}; staying on standard")
    run = _note(run, ctx, "Spot capacity found", why)
    run = _publish(run, ctx, "run.spot_probed", probe=probe.number, region=probe.region,
                   found=True, switching=switching, reason=why)
    if not switching or current is None:
        return run
    run = replace(run, next_capacity=Capacity.SPOT, next_reason=why, next_region=probe.region)
    return _cancel_attempt(run, ctx, current, CANCEL_SWITCH)


# ---------------------------------------------------------------- hardware probes (issue 19)
#
# A pipeline with hardware candidates and no fresh cached result for each probes them first
# (status PROBING): one Spot job per candidate, all at once, within the probe budget, each running
# the training code for probe_steps steps (spotorch_trainer writes a report and exits). Each
# ended probe's measurement comes in with its ProbeObserved (the service reads the report);
# one past probe_timeout is cancelled and unfit. With every candidate measured, cached or left
# out, spotorch.hardware.choose picks the shape and the first attempt launches on it.

def _probe_hardware(run: Run, ctx: Context, cache: Mapping[str, hw.ProbeResult]) -> Run:
    plan = hw.plan_probes(ctx.pipeline, cache, ctx.now)
    results = {r.candidate: r.to_doc() for r in (*plan.cached, *plan.skipped)}
    run = replace(run, hardware_results=results)
    if not plan.probe:
        return _hardware_decided(run, ctx)
    names = ", ".join(c.name for c in plan.probe)
    run = _to(run, RunStatus.PROBING, ctx, f"probing {len(plan.probe)} hardware candidate(s): "
                                          f"{names}")
    region = ctx.regions[0]
    for candidate in plan.probe:
        number = run.counters.probes + 1
        run = replace(run, counters=replace(run.counters, probes=number))
        run = _with_probe(run, Probe(number, region, created_at=ctx.now, kind=PROBE_HARDWARE,
                                     candidate=candidate.name))
        run, intent_id = _next_intent_id(run)
        run = _add(run, LaunchProbeIntent(intent_id, number, region,
                                          claimed_until=ctx.now + LAUNCH_LEASE_S))
    return run


def _tick_hardware(run: Run, ctx: Context) -> Run:
    """Cancel hardware probes past their time limit: unfit, timed out."""
    search = ctx.pipeline.hardware
    if search is None:
        return _hardware_decided(run, ctx)
    for probe in run.probes:
        if probe.kind != PROBE_HARDWARE or not probe.live or probe.cancel_reason is not None:
            continue
        # The job's own scheduling timeout is probe_timeout; a tick of grace for its end to show.
        if ctx.now - probe.created_at > search.probe_timeout_s + ctx.recovery.decision_interval_s:
            run = _cancel_probe(run, ctx, probe, "timed out")
            run = _hardware_measured(run, ctx, run.probe(probe.number) or probe, None,
                                     f"timed out: not done within {search.probe_timeout_s:.0f}s")
            if run.status is not RunStatus.PROBING:
                return run
    return run


def _hardware_measured(run: Run, ctx: Context, probe: Probe, result: Mapping[str, Any] | None,
                       unfit: str) -> Run:
    """A hardware probe's answer (or the reason it has none); the choice once all are in."""
    if probe.kind != PROBE_HARDWARE or probe.candidate is None or \
            probe.candidate in run.hardware_results or run.status is not RunStatus.PROBING:
        return run
    doc = dict(result) if result is not None else hw.ProbeResult(
        probe.candidate, False, reason=unfit, measured_at=ctx.now,
        job_name=probe.job_name or "").to_doc()
    run = replace(run, hardware_results={**run.hardware_results, probe.candidate: doc})
    fit = "fit" if doc.get("fit") else f"unfit: {doc.get('reason', '')}"
    run = _note(run, ctx, f"probe {probe.number} ({probe.candidate}) measured", fit)
    search = ctx.pipeline.hardware
    if search is None or any(c.name not in run.hardware_results for c in search.candidates):
        return run
    return _hardware_decided(run, ctx)


def _hardware_decided(run: Run, ctx: Context) -> Run:
    """Every candidate has a result: choose, and launch the first attempt on the choice."""
    results = {name: hw.ProbeResult.from_doc(doc) for name, doc in run.hardware_results.items()}
    left = None if run.deadline_at is None else max(run.deadline_at - ctx.now, 0.0)
    choice = hw.choose(ctx.pipeline, results, left, ctx.outlook or hw.NO_HISTORY)
    if choice.chosen is None:
        run = _note(run, ctx, "no hardware chosen", f"{choice.reason}: {choice.warning}; "
                    "running on the pipeline's own worker pools")
        return _first_launch(run, ctx, "no hardware candidate is fit")
    doc = choice.to_doc()
    if ctx.outlook is not None:  # what the expected hours assumed of Spot, per candidate
        doc["outlook"] = {"preemptions_per_hour": dict(ctx.outlook.preemptions_per_hour)}
    run = _announce_hardware(replace(run, hardware=doc), ctx, doc)
    return _first_launch(run, ctx, f"hardware chosen: {choice.chosen}")


_HANDLERS: Mapping[type, Callable[[Run, Observation, Context], Run]] = {
    IntentDone: _on_intent_done,
    ModelRegistered: _on_model_registered,
    LaunchDone: _on_launch_done,
    LaunchFailed: _on_launch_failed,
    TrainerReported: _on_trainer,
    JobObserved: _on_job,
    JobMissing: _on_job_missing,
    Tick: _on_tick,
    Promote: _on_promote,
    CancelRequested: _on_cancel,
    CheckpointsDeleted: _on_checkpoints_deleted,
    ProbeLaunched: _on_probe_launched,
    ProbeLaunchFailed: _on_probe_launch_failed,
    ProbeObserved: _on_probe,
    ProbeMissing: _on_probe_missing,
}


# ---------------------------------------------------------------- cost

def _cost(run: Run, ctx: Context) -> dict[str, object]:
    """The run's cost ledger (spotorch.ledger) as its terminal event carries it."""
    return ledger_dict(ledger(run, ctx.pipeline, ctx.now))


def cost_estimate(run: Run, ctx: Context) -> float:
    """Estimated compute cost so far: billed running time of every attempt at list prices."""
    total = 0.0
    for a in run.attempts:
        if a.started_at is None:
            continue  # queued or preempted time is not billed
        end = a.ended_at if a.ended_at is not None else ctx.now
        total += max(end - a.started_at, 0.0) / 3600 * hourly_price(ctx.pipeline, a.capacity)
    return total if math.isfinite(total) else 0.0


# ---------------------------------------------------------------- outbox helpers

def claimable(run: Run, now: float) -> tuple[Intent, ...]:
    """Intents whose executor's claim has expired (crashed or lost): the tick may carry them out."""
    return tuple(i for i in run.outbox if i.claimed_until <= now)


def claim(run: Run, intents: tuple[Intent, ...], now: float) -> Run:
    """Take over intents for LAUNCH_LEASE_S (in the same conditional write that reads them)."""
    ids = {i.id for i in intents}
    outbox = tuple(replace(i, claimed_until=now + LAUNCH_LEASE_S) if i.id in ids else i
                   for i in run.outbox)
    return replace(run, outbox=outbox)


def remember(run: Run, event_id: str | None) -> Run:
    """Record an event id as handled (bounded), so a redelivery is recognised without work."""
    if not event_id:
        return run
    return replace(run, seen=(*run.seen, event_id)[-SEEN_LIMIT:])


# ---------------------------------------------------------------- plausibility

# No optimizer step is this fast: a report implying more steps per second is not true.
MAX_STEPS_PER_S = 100_000.0
MAX_STEP = 2 ** 53  # beyond this a step is no longer an exact number anywhere on its way


def implausible(run: Run, report: TrainerReported, now: float | None = None) -> str | None:
    """Why a trainer report cannot be true of this run, or None when it may be.

    Progress only moves within what the run can have done: never past total_steps, never
    faster than MAX_STEPS_PER_S since the last thing known (a report, a checkpoint, the resume
    step of the attempt). A rejected report changes nothing, so one bad report cannot set the
    run's progress for good.
    """
    step = report.step
    if step is None:
        return None
    if step < 0 or step > MAX_STEP:
        return f"step {step} is out of range [0, {MAX_STEP}]"
    total = report.total_steps or run.progress.total_steps
    if total is not None and step > total:
        return f"step {step} is past total_steps {total}"
    attempt = run.attempt(report.attempt)
    known = max(run.progress.step,
                run.latest_checkpoint.step if run.latest_checkpoint else 0,
                (attempt.resumed_from_step or 0) if attempt else 0)
    since = run.progress.at if run.progress.at is not None and run.progress.step >= known \
        else (attempt.created_at if attempt else run.created_at)
    at = min(report.at, now) if now is not None else report.at
    if step - known > MAX_STEPS_PER_S * max(at - since, 1.0):
        return (f"step {step} jumps {step - known} steps from {known} in {max(at - since, 0):.0f}s"
                f" (more than {MAX_STEPS_PER_S:.0f} steps per second)")
    return None


# ---- rules shared with the simulator
# Small pure rules the trace simulator (spotorch.sim) replays exactly as production applies them.

def spot_cooldown_until(now: float, cooldown_s: float) -> float:
    """Until when Spot counts as unavailable after a sign of none (preemption, stockout, queue)."""
    return now + cooldown_s


def spot_cooling(now: float, unavailable_until: float | None) -> bool:
    """True while Spot counts as unavailable: no move back to Spot, and standard not told of it."""
    return now < (unavailable_until or 0.0)
