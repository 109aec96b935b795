"""A pipeline: what starts a run, what job it launches, how it recovers, and whom it tells."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from spotorch.sweep_spec import ModelRegistration, SweepSpec


class Capacity(StrEnum):
    """The kind of VM an attempt runs on."""

    SPOT = "spot"  # preemptible, cheap; may be unavailable or taken back at any time
    STANDARD = "standard"  # on-demand; reliable, full price
    FLEX_START = "flex"  # Dynamic Workload Scheduler: waits for capacity, then runs to completion


@dataclass(frozen=True)
class WorkerPool:
    """One worker pool of a Vertex AI custom job."""

    machine_type: str = "n1-standard-4"
    replica_count: int = 1
    accelerator_type: str | None = None
    accelerator_count: int = 0
    boot_disk_type: str = "pd-ssd"
    boot_disk_size_gb: int = 100
    image_uri: str = ""
    command: tuple[str, ...] = ()
    args: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class JobTemplate:
    """How to build the Vertex AI CustomJob of each attempt."""

    worker_pools: tuple[WorkerPool, ...] = (WorkerPool(),)
    regions: tuple[str, ...] = ("us-central1",)  # first is preferred; stockouts move down the list
    service_account: str | None = None
    network: str | None = None
    labels: tuple[tuple[str, str], ...] = ()
    timeout_s: float = 7 * 24 * 3600.0
    flex_max_wait_s: float = 24 * 3600.0
    base_output_uri: str | None = None  # Vertex's base_output_directory; AIP_MODEL_DIR lives below


class EscalationKind(StrEnum):
    """How a run chooses between Spot and standard VMs."""

    NEVER = "never"  # Spot only, within the retry budgets
    COUNT = "count"  # standard after N preemptions (Flyte's interruptible last retry)
    DEADLINE = "deadline"  # stay on Spot while the deadline is safe; the default
    ALWAYS_STANDARD = "always_standard"  # standard VMs from the start


@dataclass(frozen=True)
class RecoveryPolicy:
    """Retry budgets per failure class, backoff, stockout handling and the escalation policy."""

    max_preemptions: int = 50
    max_stockouts: int = 10
    max_user_errors: int = 1
    max_infra_errors: int = 5
    max_timeouts: int = 1
    retryable_exit_codes: tuple[int, ...] = ()
    max_no_progress_attempts: int = 3  # consecutive attempts that ended without a newer checkpoint
    backoff_base_s: float = 5.0
    backoff_cap_s: float = 300.0
    stockout_wait_s: float = 900.0  # a SPOT attempt queued longer than this counts as a stockout
    # After a stockout, a preemption or a Spot queue given up, no move back to Spot before this:
    # production cannot see Spot capacity while on standard (docs/policy-benchmark.md: 2 h keeps
    # the deadline policy at or below Uniform Progress when replayed the way production sees it).
    spot_cooldown_s: float = 7200.0
    escalation: EscalationKind = EscalationKind.DEADLINE
    escalate_after_preemptions: int = 3  # for COUNT
    restart_overhead_s: float = 600.0  # time lost per relaunch: scheduling, image pull, restore
    decision_interval_s: float = 300.0  # longest gap between decisions: the reconcile tick period
    expected_compute_s: float | None = None  # estimate of the whole task on standard VMs, if known
    preemption_patterns: tuple[str, ...] = ("(?i)preempt", "(?i)stockout", r"(?i)\bspot\b",
                                            "(?i)resources? (are|were|is) (un)?available",
                                            "(?i)capacity")
    infra_patterns: tuple[str, ...] = ("(?i)internal error", "(?i)unavailable", "(?i)quota")
    timeout_patterns: tuple[str, ...] = ("(?i)timeout", "(?i)deadline exceeded",
                                         "(?i)timed out")


class OnActiveRun(StrEnum):
    """What a new snapshot does while a run of the same pipeline is still active."""

    QUEUE = "queue"  # wait until the active run ends, then start
    SUPERSEDE = "supersede"  # cancel the active run, start the new one
    SKIP = "skip"  # record the snapshot, start nothing
    PARALLEL = "parallel"  # start it alongside the active run


class BatchMode(StrEnum):
    """When a set of arriving objects becomes a complete data snapshot."""

    EACH_OBJECT = "each_object"  # every matching object is its own snapshot
    MARKER = "marker"  # complete when a marker object (e.g. _SUCCESS, or a manifest) appears
    QUIET_PERIOD = "quiet_period"  # complete after no new objects for a while (the tick notices)
    MIN_OBJECTS = "min_objects"  # complete once this many objects have arrived


@dataclass(frozen=True)
class Trigger:
    """Which objects start runs, and how they are grouped into snapshots."""

    bucket: str
    prefix: str = ""
    glob: str | None = None  # fnmatch pattern on the object name below the prefix
    suffixes: tuple[str, ...] = ()
    ignore: tuple[str, ...] = ("*.tmp", "*/_temporary/*", "*/.*")
    batch: BatchMode = BatchMode.EACH_OBJECT
    marker: str = "_SUCCESS"
    manifest: bool = False  # the marker lists the snapshot's objects: wait for all of them
    quiet_period_s: float = 300.0
    min_objects: int = 1
    snapshot_depth: int = 1  # path segments below the prefix that name a snapshot (0: the prefix)
    on_active_run: OnActiveRun = OnActiveRun.QUEUE


@dataclass(frozen=True)
class Route:
    """Which event types go to which alert channel."""

    channel: str  # "chat", "slack" or "email"
    events: tuple[str, ...]  # event type suffixes, e.g. "run.failed"; "*" for all
    target: str = ""  # secret reference or env variable name holding the webhook URL / recipients


@dataclass(frozen=True)
class Pipeline:
    """Everything spotorch needs to know to turn data into a trained model."""

    name: str
    trigger: Trigger
    job: JobTemplate = field(default_factory=JobTemplate)
    checkpoint_uri: str = ""  # root; each run checkpoints under {checkpoint_uri}/{run_id}
    output_uri: str = ""  # root; each run writes its model under {output_uri}/{run_id}
    recovery: RecoveryPolicy = field(default_factory=RecoveryPolicy)
    deadline_s: float | None = None  # from run creation; None: no deadline
    max_cost: float | None = None  # budget in currency units; None: unlimited
    prices: tuple[tuple[str, float], ...] = ()  # capacity -> price per replica-hour (overrides)
    routes: tuple[Route, ...] = ()
    source: str = ""  # the file it was loaded from, for error messages
    sweep: SweepSpec | None = None  # a hyperparameter sweep: each data snapshot starts one
    model: ModelRegistration | None = None  # register successful models in Vertex AI

    def run_checkpoint_uri(self, run_id: str) -> str:
        return f"{self.checkpoint_uri.rstrip('/')}/{run_id}"

    def run_output_uri(self, run_id: str) -> str:
        return f"{self.output_uri.rstrip('/')}/{run_id}"
