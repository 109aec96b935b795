"""Runs, attempts and probes: the core's vocabulary, the status enum and its transition table."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import Any

from spotorch.core import health as hp
from spotorch.core.intents import Intent, intent_from_dict, intent_to_dict
from spotorch.core.pipeline import Capacity
from spotorch.core.regions import RegionMark

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
        """Whether the job has ended: no later report can change it."""
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
    QUOTA = "quota"  # a resource quota refused the job (region x capacity): waiting never helps


@dataclass(frozen=True)
class JobStatus:
    """What the launcher knows about one job right now: what the service said, unclassified.

    The failure class of a failed job is decided in the core, with the run's pipeline's patterns
    (spotorch.core.recovery.classify); an adapter reports the state, the error and the exit code.
    """

    job_name: str
    phase: JobPhase
    # A class the evidence itself fixes, when there is one: the core's own LOST (NOT_FOUND poll
    # after poll) or an in-memory twin's; None for what a real service reports.
    failure: FailureClass | None = None
    exit_code: int | None = None  # the replica's exit status, when the service names one
    message: str = ""  # the job's error message
    labels: Mapping[str, str] = field(default_factory=dict)
    create_time: float | None = None
    start_time: float | None = None
    end_time: float | None = None
    error_code: int = 0  # google.rpc.Code of the job's error (0: none)
    state: str = ""  # the service's own state name (e.g. EXPIRED) when the phase does not say it all
    started: bool | None = None  # whether the job ever ran (None: the service did not say)


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
    PREPROCESSING = "PREPROCESSING"  # the preprocess step (Beam on Dataflow) runs; training waits
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
    FAILED_QUOTA = "FAILED_QUOTA"  # a resource quota refused it in every region, capacity and shape

    @property
    def terminal(self) -> bool:
        """Whether the run has ended: no transition leads out of this status."""
        return not TRANSITIONS[self]

    @property
    def failed(self) -> bool:
        """Whether the run ended in one of the FAILED statuses."""
        return self.value.startswith("FAILED")


_FAILED = frozenset(s for s in RunStatus if s.value.startswith("FAILED"))
_ENDINGS = _FAILED | {RunStatus.SUCCEEDED, RunStatus.CANCELLED}

# Allowed transitions. A run may always end (succeed, fail, be cancelled) from a live status.
TRANSITIONS: Mapping[RunStatus, frozenset[RunStatus]] = {
    RunStatus.QUEUED: frozenset({RunStatus.PENDING, RunStatus.STARTING, RunStatus.PROBING,
                                 RunStatus.PREPROCESSING, RunStatus.CANCELLED}),
    RunStatus.PENDING: frozenset({RunStatus.QUEUED, RunStatus.STARTING, RunStatus.PROBING,
                                  RunStatus.PREPROCESSING, RunStatus.CANCELLED}) | _FAILED,
    RunStatus.PROBING: frozenset({RunStatus.STARTING, RunStatus.CANCELLED}) | _FAILED,
    # issue 31: training starts (or probes) only once the preprocess output is complete
    RunStatus.PREPROCESSING: frozenset({RunStatus.STARTING, RunStatus.PROBING,
                                        RunStatus.CANCELLING, RunStatus.CANCELLED}) | _FAILED,
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
        """Whether the attempt's job has ended, whatever the outcome."""
        return self in (AttemptState.SUCCEEDED, AttemptState.FAILED, AttemptState.CANCELLED)

    @property
    def rank(self) -> int:
        """Order of states in an attempt's life: LAUNCHING first, then its job phase's rank."""
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
    # The last lines its replicas wrote to stderr when it failed (bounded: core.observations
    # bounded_tail); empty when none were found or the failure was not the code's.
    error_tail: tuple[str, ...] = ()
    reported_exit: int | None = None  # the exit code the trainer said it exits with ("failed")
    reported_done_step: int | None = None  # the step a "completed" report claimed: a hint that
    # only Vertex's SUCCEEDED confirms (then progress moves there)
    # The attempt's own key for signed trainer reports (spotorch.core.trust): random, in its
    # job's environment and in the run document only; never in repr, logs, events or views.
    report_key: str = field(default="", repr=False)

    @property
    def live(self) -> bool:
        """Whether the attempt's job may still be running (or is being launched)."""
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
    # candidate instead; its answer is a measurement (spotorch.core.hardware.ProbeResult).
    kind: str = PROBE_CAPACITY
    candidate: str | None = None

    @property
    def live(self) -> bool:
        """Whether the probe's job may still be running (or is being launched)."""
        return not self.state.ended


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
    straggler: hp.StragglerState = field(default_factory=hp.StragglerState)
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
class MetricSample:
    """The trainer's metrics at one step (a map in Firestore: no nested arrays there)."""

    step: int
    at: float
    attempt: int
    values: Mapping[str, float] = field(default_factory=dict)


METRIC_SAMPLES_LIMIT = 100  # samples a run keeps; older ones thinned out to make room
METRIC_NAMES_LIMIT = 4  # metrics kept per sample: the first names the trainer reported


@dataclass(frozen=True)
class HistoryEntry:
    """One line of a run's history: when, what happened and why."""
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
    # Regions this run avoids for a while (a stockout, a preemption): spotorch.core.regions
    avoid_regions: tuple[RegionMark, ...] = ()
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
    # issue 19: the hardware choice (spotorch.core.hardware.HardwareChoice.to_doc()) the run runs on
    hardware: Mapping[str, Any] | None = None
    health: RunHealth = RunHealth()
    # ---- sweeps (spotorch.core.sweeps): a trial run knows its sweep, its parameters and its curve
    sweep_id: str | None = None
    params: Mapping[str, Any] = field(default_factory=dict)  # handed to the trainer as JSON
    curve: tuple[MetricPoint, ...] = ()  # the sweep's metric by step, for the median rule
    # ---- every run: the trainer's metrics by step, for people (charts); bounded, thinned
    metric_history: tuple[MetricSample, ...] = ()
    # ---- Model Registry: the registered version (projects/P/locations/L/models/M@V)
    model_name: str | None = None
    # ---- Spot probes while on standard (section "Spot probes"); the newest PROBES_LIMIT
    probes: tuple[Probe, ...] = ()
    next_region: str | None = None  # where the next attempt goes (a probe found Spot there)
    # ---- hardware probing (issue 19): candidate -> ProbeResult.to_doc(), cached or measured
    hardware_results: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    # ---- issue 31: the preprocess step (spotorch.core.preprocess.PreprocessStep.to_doc())
    preprocess: Mapping[str, Any] | None = None
    # ---- reproducibility (issue 30): spotorch.core.provenance.build(), recorded at creation only
    provenance: Mapping[str, Any] | None = None
    rerun_of: str | None = None  # the run this one reruns on exactly its recorded inputs

    @property
    def active(self) -> bool:
        """Whether the run is still going (stored too, for the tick's query)."""
        return not self.status.terminal

    @property
    def current(self) -> Attempt | None:
        """The newest attempt, None before the first launch."""
        return self.attempts[-1] if self.attempts else None

    @property
    def bucket(self) -> int:
        """The run's reconcile bucket: a stable hash, so a tick can fan out by bucket."""
        return reconcile_bucket(self.run_id)

    def attempt(self, number: int) -> Attempt | None:
        """The attempt with this number (numbers start at 1), None if there is none."""
        return self.attempts[number - 1] if 0 < number <= len(self.attempts) else None

    def probe(self, number: int) -> Probe | None:
        """The probe with this number, None if there is none."""
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
        """The run a stored document holds (the inverse of to_dict), older documents' fields upgraded."""
        data = {k: v for k, v in doc.items() if k not in ("active", "active_bucket")}
        data["status"] = RunStatus(data["status"])
        data.pop("region_index", None)  # before the region rule: an index into a re-ranked list
        data["avoid_regions"] = tuple(
            RegionMark(str(m["region"]), Capacity(m["capacity"]), float(m["until"]), str(m["why"]))
            for m in data.get("avoid_regions", ()))
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
        data["metric_history"] = tuple(
            MetricSample(int(m["step"]), float(m["at"]), int(m.get("attempt") or 0),
                         {str(k): float(v) for k, v in (m.get("values") or {}).items()})
            for m in data.get("metric_history", ()))
        data["probes"] = tuple(_probe_from(p) for p in data.get("probes", ()))
        data["hardware_results"] = {str(k): dict(v) for k, v in
                                    (data.get("hardware_results") or {}).items()}
        data["preprocess"] = dict(data["preprocess"]) if data.get("preprocess") else None
        return cls(**data)


def _health_from(doc: Mapping[str, Any]) -> RunHealth:
    data = dict(doc)
    rate = dict(data.get("rate") or {})
    rate["samples"] = tuple(float(x) for x in rate.get("samples", ()))
    data["rate"] = hp.RateState(**rate)
    data["loss"] = hp.LossState(**(data.get("loss") or {}))
    data["straggler"] = hp.StragglerState(**(data.get("straggler") or {}))
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
    data["error_tail"] = tuple(str(line) for line in data.get("error_tail") or ())
    return Attempt(**data)


RECONCILE_BUCKETS = 64


def reconcile_bucket(run_id: str) -> int:
    """The reconcile bucket of a run id: a stable hash, so the tick's shards split runs evenly."""
    return int.from_bytes(hashlib.sha256(run_id.encode()).digest()[:4], "big") % RECONCILE_BUCKETS


PHASE_TO_STATE = {phase: AttemptState(phase.value) for phase in JobPhase}
