"""A pipeline: what starts a run, what job it launches, how it recovers, and whom it tells.

These dataclasses are the one definition of the pipeline file format: each field's annotation
says its name in the file (validation_alias), its description, constraints and wording.
spotorch.spec.loader reads files into them through pydantic; `python -m spotorch.spec.loader schema`
writes schemas/pipeline.schema.json from them. Code that builds them directly is not validated.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Annotated, ClassVar, Literal

from spotorch.core.fields import (
    AddedTo,
    Duration,
    Field,
    FileSection,
    Matches,
    OneOf,
    Pairs,
    StringOrNumber,
    Unique,
)
from spotorch.core.health import HealthPolicy
from spotorch.core.sweep_spec import ModelRegistration, SweepSpec


class Capacity(StrEnum):
    """The kind of VM an attempt runs on."""

    SPOT = "spot"  # preemptible, cheap; may be unavailable or taken back at any time
    STANDARD = "standard"  # on-demand; reliable, full price
    FLEX_START = "flex"  # Dynamic Workload Scheduler: waits for capacity, then runs to completion


# --- field forms shared by several sections -----------------------------------------------------

_BUCKET = r"^[a-z0-9][a-z0-9._-]{1,220}[a-z0-9]$"
GcsUri = Annotated[str, Matches(r"^gs://[a-z0-9][a-z0-9._-]{1,220}[a-z0-9](/.*)?$",
                                "must be a gs://bucket/path URI")]
Region = Annotated[str, Matches(r"^[a-z]+(-[a-z]+)+[0-9]+$",
                                "must be a Google Cloud region like us-central1 or europe-west4 "
                                "(not a zone)")]
NonEmpty = Annotated[str, Field(min_length=1)]
Patterns = Annotated[tuple[NonEmpty, ...], Field(description="Regular expressions (Python re).")]
_ENV_NAME = Annotated[str, Matches(r"^[A-Za-z_][A-Za-z0-9_]*$",
                                   "must be an environment variable name (letters, digits, '_')")]
_LABEL_KEY = Annotated[str, Matches(r"^[a-z][a-z0-9_-]{0,62}$",
                                    "must be a label key: lowercase letters, digits, '_' and '-', "
                                    "starting with a letter, at most 63")]
_LABEL_VALUE = Annotated[str, Matches(r"^[a-z0-9_-]{0,63}$",
                                      "must be a label value: lowercase letters, digits, '_' and "
                                      "'-', at most 63")]


@dataclass(frozen=True)
class PythonPackage(FileSection):
    """Your code without an image: a Python package Vertex AI installs on one of its prebuilt
    training containers and runs as `python -m python_module` (python_package_spec)."""

    FILE_REQUIRES: ClassVar[tuple[str, ...]] = ("executor_image_uri", "python_module")
    FILE_OMITS: ClassVar[tuple[str, ...]] = ("package_uris", "staged_files")

    source: Annotated[str | None, Field(
        min_length=1, description="A folder with your package's pyproject.toml (relative to the "
                                  "pipeline file): spotorch builds its source distribution "
                                  "when the pipeline is deployed.")] = None
    package: Annotated[str | None, Field(
        min_length=1, description="A source distribution or wheel you built (relative to the "
                                  "pipeline file).")] = None
    package_uri: Annotated[GcsUri | None, Field(
        description="A built package already in Cloud Storage, used as it is.")] = None
    executor_image_uri: Annotated[str, Field(
        min_length=1, description="One of Vertex AI's prebuilt training containers, e.g. "
                                  "us-docker.pkg.dev/vertex-ai/training/sklearn-cpu.1-0:latest "
                                  "(spotorch/spec/training_containers.json).")] = ""
    python_module: Annotated[str, Matches(
        r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$",
        "must be a Python module name like trainer.task"),
        Field(description="The entry point, run as `python -m MODULE ARGS`.")] = ""
    # Filled where the pipeline is validated (deploy, the local stack): the gs:// URIs of the
    # built packages by content hash (spotorch_trainer's first), and the bundled files they are
    # uploaded from when missing.
    package_uris: tuple[str, ...] = ()
    staged_files: tuple[str, ...] = ()


class PoolRole(StrEnum):
    """What a worker pool's replicas do in a distributed job (Vertex AI's pool positions)."""

    CHIEF = "chief"  # workerPoolSpecs[0]: the primary replica; the job ends when it exits 0
    WORKERS = "workers"  # [1]: more training replicas (the data-parallel world with the chief)
    REDUCTION_SERVER = "reduction_server"  # [2]: Vertex's all-reduce servers (its own image)
    PARAMETER_SERVERS = "parameter_servers"  # [2]: parameter servers (TensorFlow's ps)
    EVALUATOR = "evaluator"  # [3]: evaluators


# The position of each role in Vertex AI's workerPoolSpecs[]; unused positions are sent empty.
POOL_POSITIONS: dict[PoolRole, int] = {
    PoolRole.CHIEF: 0, PoolRole.WORKERS: 1, PoolRole.REDUCTION_SERVER: 2,
    PoolRole.PARAMETER_SERVERS: 2, PoolRole.EVALUATOR: 3}
ROLE_AT: tuple[PoolRole, ...] = (PoolRole.CHIEF, PoolRole.WORKERS, PoolRole.PARAMETER_SERVERS,
                                 PoolRole.EVALUATOR)  # the role of an unnamed pool by position
# Vertex AI's Reduction Server image (the distributed-training page's workerPoolSpecs[2]).
REDUCTION_SERVER_IMAGE = "us-docker.pkg.dev/vertex-ai-restricted/training/reductionserver:latest"


@dataclass(frozen=True)
class WorkerPool(FileSection):
    """One worker pool of a Vertex AI custom job."""

    FILE_REQUIRES: ClassVar[tuple[str, ...]] = ("machine_type",)

    role: Annotated[PoolRole | None, Field(
        description="chief, workers, reduction_server, parameter_servers or evaluator, in "
                    "Vertex AI's order; omitted: the role of the pool's place (the first is "
                    "the chief, then workers, parameter servers, evaluators).")] = None

    machine_type: Annotated[str, Matches(
        r"^[a-z][a-z0-9]*(-[a-z0-9]+)+$",
        "must be a Compute Engine machine type like n1-standard-8 or a2-highgpu-8g")] = \
        "n1-standard-4"
    replica_count: Annotated[int, Field(ge=1)] = 1
    accelerator_type: Annotated[str | None, Matches(
        r"^(NVIDIA_[A-Z0-9_]+|TPU_[A-Z0-9_]+)$",
        "must be a Vertex AI accelerator type like NVIDIA_TESLA_A100, NVIDIA_L4 or TPU_V5_LITEPOD"),
        Field(description="Both or neither of accelerator_type and accelerator_count.")] = None
    accelerator_count: Annotated[int, Field(ge=0)] = 0
    boot_disk_type: Annotated[str, OneOf(("pd-ssd", "pd-standard", "pd-balanced",
                                          "hyperdisk-balanced"))] = "pd-ssd"
    boot_disk_size_gb: Annotated[int, Field(ge=100, le=64000)] = 100
    image_uri: Annotated[str, Field(
        min_length=1, description="Your training image (container_spec); or python_package.")] = ""
    python_package: Annotated[PythonPackage | None, Field(
        description="Your code as a Python package on a prebuilt container, instead of an "
                    "image.")] = None
    command: tuple[str, ...] = ()
    args: tuple[str, ...] = ()
    env: Annotated[tuple[tuple[str, str], ...], Pairs(_ENV_NAME, Annotated[str, StringOrNumber()]),
                   Field(description="Names to strings or numbers; SPOTORCH_* and AIP_* are "
                                     "reserved.")] = ()
    tpu_topology: Annotated[str | None, Matches(
        r"^[0-9]+(x[0-9]+){1,2}$", "must be a TPU topology like 2x2 or 2x2x1"),
        Field(description="Vertex AI machine_spec.tpu_topology, for TPU machine types.")] = None


@dataclass(frozen=True)
class JobTemplate(FileSection):
    """How to build the Vertex AI CustomJob of each attempt."""

    FILE_REQUIRES: ClassVar[tuple[str, ...]] = ("worker_pools",)

    worker_pools: Annotated[tuple[WorkerPool, ...], Field(
        min_length=1, max_length=4,
        description="The first pool is the chief (replica_count 1); then workers, a reduction "
                    "server or parameter servers, evaluators (role).")] = (WorkerPool(),)
    # first is preferred; stockouts move down the list
    regions: Annotated[tuple[Region, ...], Field(
        min_length=1, description="First preferred; stockouts move down the list."), Unique()] = \
        ("us-central1",)
    service_account: Annotated[str | None, Matches(
        r"^[^@\s]+@[^@\s]+\.gserviceaccount\.com$",
        "must be a service account email (...@PROJECT.iam.gserviceaccount.com)")] = None
    network: Annotated[str | None, Matches(
        r"^projects/[^/]+/global/networks/[^/]+$",
        "must be projects/PROJECT_NUMBER/global/networks/NETWORK")] = None
    labels: Annotated[tuple[tuple[str, str], ...], Pairs(_LABEL_KEY, _LABEL_VALUE, max_entries=48),
                      Field(description="Vertex AI labels; spotorch-* keys are reserved.")] = ()
    timeout_s: Annotated[float, Duration(), Field(
        validation_alias="timeout",
        description="Vertex AI scheduling.timeout of each attempt.")] = 7 * 24 * 3600.0
    flex_max_wait_s: Annotated[float, Duration(), Field(
        validation_alias="flex_max_wait", description="FLEX_START max_wait_duration.")] = \
        24 * 3600.0
    # Vertex's base_output_directory; AIP_MODEL_DIR lives below
    base_output_uri: Annotated[GcsUri | None, Field(
        description="Vertex AI base_output_directory.")] = None
    staging_uri: Annotated[GcsUri | None, Field(
        description="Where spotorch stores the Python packages it builds (python_package.source "
                    "or package), under their content hash; the functions read and write it.")] \
        = None


def pool_role(pools: tuple[WorkerPool, ...], index: int) -> PoolRole:
    """The role of pools[index]: its own, else that of the next Vertex position after the last."""
    return pools[index].role or ROLE_AT[min(pool_positions(pools)[index], len(ROLE_AT) - 1)]


def training_world(pools: tuple[WorkerPool, ...]) -> int:
    """How many replicas train together: the chief's and the workers' (not servers, evaluators)."""
    return sum(p.replica_count for i, p in enumerate(pools)
               if pool_role(pools, i) in (PoolRole.CHIEF, PoolRole.WORKERS))


def rank_replica(rank: int) -> str:
    """The Vertex replica (workerpoolP-I) of a training rank: the chief is rank 0, the workers
    follow in order (CLUSTER_SPEC's workerpool0 then workerpool1, as spotorch_trainer ranks them)."""
    return "workerpool0-0" if rank == 0 else f"workerpool1-{rank - 1}"


def pool_positions(pools: tuple[WorkerPool, ...]) -> tuple[int, ...]:
    """Each pool's place in Vertex AI's workerPoolSpecs[]: its role's, or the one after the
    previous pool's (an unnamed first pool is the chief). Validated files have them increasing."""
    positions: list[int] = []
    for pool in pools:
        positions.append(POOL_POSITIONS[pool.role] if pool.role is not None
                         else (positions[-1] + 1 if positions else 0))
    return tuple(positions)


class EscalationKind(StrEnum):
    """How a run chooses between Spot and standard VMs."""

    NEVER = "never"  # Spot only, within the retry budgets
    COUNT = "count"  # standard after N preemptions (Flyte's interruptible last retry)
    DEADLINE = "deadline"  # stay on Spot while the deadline is safe; the default
    ALWAYS_STANDARD = "always_standard"  # standard VMs from the start


_Budget = Annotated[int, Field(ge=0)]


@dataclass(frozen=True)
class SpotProbes(FileSection):
    """Spot capacity probes: how a run on standard VMs finds out that Spot is back."""

    # Production cannot see Spot capacity while it runs on standard (docs/policy-benchmark.md):
    # a probe is a minimal Spot job of the run's shape, cancelled as soon as it runs. The policy
    # (policy.probe_worth) launches one only when finding Spot back would pay for it.
    enabled: Annotated[bool, Field(
        description="Probe for Spot capacity while on standard VMs (escalation: deadline).")] = \
        True
    wait_s: Annotated[float, Duration(), Field(
        validation_alias="wait",
        description="A probe without capacity this long is cancelled: no Spot for now.")] = 600.0
    # Vertex bills a Spot job from provisioning to its end; how long a probe cancelled at once
    # is billed is not documented: a pessimistic estimate, used to judge whether it pays.
    billed_s: Annotated[float, Duration(), Field(
        validation_alias="billed_estimate",
        description="Billed time assumed for a probe that finds capacity (its price is "
                    "weighed against the saving).")] = 300.0
    command: Annotated[tuple[NonEmpty, ...], Field(
        min_length=1,
        description="The probe container's command, on the first worker pool's image; it only "
                    "has to start (the probe is cancelled once it runs).")] = (
        "python", "-c", "import time; time.sleep(3600)")


@dataclass(frozen=True)
class RecoveryPolicy(FileSection):
    """Retry budgets per failure class, backoff, stockout handling and the escalation policy."""

    max_preemptions: _Budget = 50
    max_stockouts: _Budget = 10
    max_user_errors: _Budget = 0  # the code's own error is deterministic: retrying it costs an
    # attempt for the same traceback (issue 41); a flaky one can allow retries
    max_infra_errors: _Budget = 5
    max_timeouts: _Budget = 1
    retryable_exit_codes: Annotated[tuple[Annotated[int, Field(ge=1, le=255)], ...], Unique(),
                                    Field(description="Exit codes retried as infrastructure "
                                                      "errors.")] = ()
    # consecutive attempts that ended without a newer checkpoint
    max_no_progress_attempts: Annotated[int, Field(ge=1)] = 3
    backoff_base_s: Annotated[float, Duration(), Field(validation_alias="backoff_base")] = 5.0
    backoff_cap_s: Annotated[float, Duration(), Field(validation_alias="backoff_cap")] = 300.0
    # a SPOT attempt queued longer than this counts as a stockout
    stockout_wait_s: Annotated[float, Duration(), Field(
        validation_alias="stockout_wait",
        description="A Spot attempt queued longer is a stockout.")] = 900.0
    # After a stockout, a preemption or a Spot queue given up, no move back to Spot before this:
    # production cannot see Spot capacity while on standard. Without Spot probes this blind wait
    # is the largest cost left (docs/policy-benchmark.md, production view without probes).
    spot_cooldown_s: Annotated[float, Duration(), Field(
        validation_alias="spot_cooldown",
        description="After a stockout or preemption, how long before a run on standard VMs may "
                    "move back to Spot.")] = 7200.0
    escalation: EscalationKind = EscalationKind.DEADLINE
    spot_probes: SpotProbes = field(default_factory=SpotProbes)
    escalate_after_preemptions: Annotated[int, Field(
        ge=0, description="For escalation: count.")] = 3
    # time lost per relaunch: scheduling, image pull, restore
    restart_overhead_s: Annotated[float, Duration(), Field(
        validation_alias="restart_overhead", description="Time lost per relaunch.")] = 600.0
    # longest gap between decisions: the reconcile tick period
    decision_interval_s: Annotated[float, Duration(), Field(
        validation_alias="decision_interval",
        description="Longest time between two decisions: the reconcile tick's period (5m in "
                    "production).")] = 300.0
    # estimate of the whole task on standard VMs, if known
    expected_compute_s: Annotated[float | None, Duration(), Field(
        validation_alias="expected_compute",
        description="Estimate of the whole task on standard VMs.")] = None
    # A checkpoint's size: what an attempt in another region than the checkpoint's copies, at
    # the inter-region egress price (core.regions.MovePrices; the ledger charges it).
    checkpoint_gb: Annotated[float, Field(
        ge=0, description="Checkpoint size in GB: a move to another region copies it "
                          "(egress, transfer time).")] = 0.0
    preemption_patterns: Patterns = ("(?i)preempt", "(?i)stockout", r"(?i)\bspot\b",
                                     "(?i)resources? (are|were|is) (un)?available",
                                     "(?i)capacity")
    infra_patterns: Patterns = ("(?i)internal error", "(?i)unavailable", "(?i)quota")
    timeout_patterns: Patterns = ("(?i)timeout", "(?i)deadline exceeded", "(?i)timed out")
    # A RESOURCE_EXHAUSTED (or a failed job) whose message matches is a resource quota, which
    # waiting never lifts (spotorch.core.quotas); any other RESOURCE_EXHAUSTED is a request rate.
    quota_patterns: Annotated[tuple[NonEmpty, ...], Field(
        description="Regular expressions (Python re) that tell a resource quota's "
                    "RESOURCE_EXHAUSTED from a request rate's.")] = (
        "(?i)quota metrics exceed quota limits", "(?i)exceeds the allowed maximum of")


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


BUILTIN_IGNORE = ("*.tmp", "*/_temporary/*", "*/.*")


# project.dataset.table; BigQuery's own limits: project ids 6-30 (or domain:project), dataset ids
# letters, digits and '_', table ids up to 1024 (letters, digits, '_', '-', ' ' and more: kept lax).
_TABLE = r"^[a-z][a-z0-9:.-]{4,61}[a-z0-9]\.[A-Za-z0-9_]{1,1024}\.[A-Za-z0-9_-]{1,1024}$"
_DATASET = r"^[a-z][a-z0-9:.-]{4,61}[a-z0-9]\.[A-Za-z0-9_]{1,1024}$"


@dataclass(frozen=True)
class BigQuerySource(FileSection):
    """BigQuery tables that start runs: a change (load or DML job) batched like object arrivals;
    each run trains on a snapshot of the tables at one time, exported to Cloud Storage as
    Parquet (docs/pipelines.md)."""

    FILE_REQUIRES: ClassVar[tuple[str, ...]] = ("tables", "snapshot_dataset", "export_uri")

    tables: Annotated[tuple[Annotated[str, Matches(
        _TABLE, "must be a fully qualified table: project.dataset.table")], ...], Field(
        min_length=1, max_length=20,
        description="The watched tables, fully qualified (project.dataset.table); each run "
                    "snapshots every one at the same time. With query: every table the query "
                    "reads (their changes start runs)."), Unique()] = ()
    query: Annotated[str | None, Field(
        min_length=1,
        description="A GoogleSQL SELECT whose result, as of the snapshot time, is the run's data "
                    "(one snapshot table, one export) instead of the tables themselves; it names "
                    "each table it reads `project.dataset.table`, all of them in tables.")] = None
    min_rows_changed: Annotated[int, Field(
        ge=1, description="Rows inserted, deleted or changed (over all the tables) before a "
                          "snapshot is taken.")] = 1
    quiet_period_s: Annotated[float, Duration(), Field(
        validation_alias="quiet_period",
        description="After the last change, wait this long before the snapshot (the tick "
                    "notices); 0: at once.")] = 0.0
    min_interval_s: Annotated[float, Duration(), Field(
        validation_alias="min_interval",
        description="At most one snapshot per interval; changes meanwhile wait for the "
                    "next.")] = 0.0
    snapshot_dataset: Annotated[str, Matches(
        _DATASET, "must be a dataset: project.dataset")] = ""
    snapshot_ttl_s: Annotated[float, Duration(), Field(
        validation_alias="snapshot_ttl",
        description="Each snapshot table expires this long after it was taken (the Parquet "
                    "export stays: it is the run's data).")] = 7 * 24 * 3600.0
    export_uri: Annotated[GcsUri, Field(
        description="Root of the Parquet exports; each snapshot is exported below "
                    "{export_uri}/{pipeline}/{snapshot_id}/.")] = ""


@dataclass(frozen=True)
class Trigger(FileSection):
    """Which objects (or BigQuery table changes) start runs, and how they are grouped into
    snapshots."""

    bucket: Annotated[str, Matches(
        _BUCKET, "must be a bucket name (lowercase letters, digits, '-', '_' and '.'; no gs://)"),
        Field(description="The Cloud Storage bucket watched; or bigquery.")] = ""
    prefix: Annotated[str, Matches(
        r"^([^/].*/)?$",
        "must be empty or a folder: no leading '/', ending with '/' (e.g. datasets/demo/)")] = ""
    # fnmatch pattern on the object name below the prefix
    glob: Annotated[str | None, Field(
        min_length=1,
        description="fnmatch pattern on the name below the prefix; '*' also matches '/'.")] = None
    suffixes: Annotated[tuple[NonEmpty, ...], Field(min_length=1), Unique()] = ()
    ignore: Annotated[tuple[NonEmpty, ...], Unique(), AddedTo(BUILTIN_IGNORE), Field(
        description="Extra fnmatch patterns (on the object name, also tried with a leading '/') "
                    "added to the built-in *.tmp, */_temporary/*, */.*")] = BUILTIN_IGNORE
    batch: BatchMode = BatchMode.EACH_OBJECT
    marker: Annotated[str, Matches(
        r"^[^/]+$", "must be a file name inside the snapshot folder (no '/')")] = "_SUCCESS"
    # the marker lists the snapshot's objects: wait for all of them
    manifest: Annotated[bool, Field(description="The marker lists the snapshot's objects (batch "
                                                "marker).")] = False
    quiet_period_s: Annotated[float, Duration(), Field(validation_alias="quiet_period")] = 300.0
    min_objects: Annotated[int, Field(ge=1, le=2000)] = 1
    # path segments below the prefix that name a snapshot (0: the prefix)
    snapshot_depth: Annotated[int, Field(
        ge=0, le=16,
        description="Path segments below the prefix that name a snapshot folder.")] = 1
    on_active_run: Annotated[OnActiveRun, OneOf(("queue", "supersede", "skip"))] = \
        OnActiveRun.QUEUE
    bigquery: Annotated[BigQuerySource | None, Field(
        description="BigQuery tables watched instead of a bucket.")] = None


@dataclass(frozen=True)
class Route(FileSection):
    """Which event types go to which alert channel."""

    channel: Annotated[str, OneOf(("chat", "slack", "email"))]  # "chat", "slack" or "email"
    # event type suffixes, e.g. "run.failed"; "*" for all
    events: Annotated[tuple[NonEmpty, ...], Field(
        min_length=1,
        description="Event kinds like run.failed, patterns like run.* or *.failed, or * for "
                    "all."), Unique()]
    # secret reference or env variable name holding the webhook URL / recipients
    target: Annotated[str, Matches(
        r"^([A-Z_][A-Z0-9_]*|sm://projects/[^/]+/secrets/[^/]+(/versions/[^/]+)?"
        r"|[^@\s,:/]+@[^@\s,:/]+(\s*,\s*[^@\s,:/]+@[^@\s,:/]+)*)$",
        "must name an environment variable (e.g. CHAT_WEBHOOK_URL) or a Secret Manager secret "
        "(sm://projects/P/secrets/S[/versions/V]) that holds the destination; email routes may "
        "list addresses")] = ""


_Price = Annotated[float, Field(ge=0)]


# --- hardware candidates (issue 19): probed, then the cheapest that meets the deadline wins ------

_CANDIDATE_NAME = Annotated[str, Matches(
    r"^[a-z]([a-z0-9-]{0,18}[a-z0-9])?$",
    "must be 1-20 lowercase letters, digits and dashes, starting with a letter (it becomes part "
    "of probe job labels)")]


@dataclass(frozen=True)
class HardwareCandidate(FileSection):
    """One machine shape the chief pool may run on: CPU, GPU or TPU."""

    FILE_REQUIRES: ClassVar[tuple[str, ...]] = ("name", "machine_type")

    name: _CANDIDATE_NAME
    machine_type: Annotated[str, Matches(
        r"^[a-z][a-z0-9]*(-[a-z0-9]+)+$",
        "must be a Compute Engine machine type like n1-standard-8 or ct5lp-hightpu-4t")]
    accelerator_type: Annotated[str | None, Matches(
        r"^(NVIDIA_[A-Z0-9_]+|TPU_[A-Z0-9_]+)$",
        "must be a Vertex AI accelerator type like NVIDIA_L4 or TPU_V5_LITEPOD"),
        Field(description="Both or neither of accelerator_type and accelerator_count.")] = None
    accelerator_count: Annotated[int, Field(ge=0)] = 0
    replica_count: Annotated[int, Field(ge=1)] = 1
    tpu_topology: Annotated[str | None, Matches(
        r"^[0-9]+(x[0-9]+){1,2}$", "must be a TPU topology like 2x2 or 2x2x1"),
        Field(description="Vertex AI machine_spec.tpu_topology, for TPU machine types.")] = None
    env: Annotated[tuple[tuple[str, str], ...], Pairs(_ENV_NAME, Annotated[str, StringOrNumber()]),
                   Field(description="Added to the chief pool's env on this shape (e.g. a "
                                     "framework flag); SPOTORCH_* and AIP_* are reserved.")] = ()


@dataclass(frozen=True)
class HardwareSearch(FileSection):
    """Candidates probed before the full run; the cheapest expected to meet the deadline wins."""

    FILE_REQUIRES: ClassVar[tuple[str, ...]] = ("candidates", "total_steps")

    candidates: Annotated[tuple[HardwareCandidate, ...], Field(
        min_length=1, max_length=8,
        description="Shapes for the chief pool (worker_pools[0]); names must be unique.")] = ()
    total_steps: Annotated[int, Field(
        ge=1, description="Steps of the full run: projected time is total_steps / measured "
                          "rate.")] = 1
    probe_steps: Annotated[int, Field(
        ge=1, description="Steps each probe runs (SPOTORCH_PROBE_STEPS); the first is not "
                          "timed.")] = 50
    probe_timeout_s: Annotated[float, Duration(), Field(
        validation_alias="probe_timeout",
        description="A probe still running after this is cancelled and unfit.")] = 1800.0
    probe_budget: Annotated[float | None, Field(
        ge=0, description="Most the probes may cost together (Spot prices, probe_timeout each); "
                          "candidates beyond it are not probed.")] = None
    cache_ttl_s: Annotated[float, Duration(), Field(
        validation_alias="cache_ttl",
        description="How long probe results of the same code and candidate are reused.")] = \
        7 * 24 * 3600.0


# --- a preprocessing step before training (issue 31): Apache Beam on Dataflow ----------------------

_PIPELINE_OPTION = Annotated[str, Matches(
    r"^[a-z][a-zA-Z0-9_]*$", "must be a Beam pipeline option name like num_shards or "
                             "worker_disk_type (no leading --)")]
# Options spotorch sets itself on every launch: a file naming them would fight the launcher.
RESERVED_PREPROCESS_OPTIONS = ("runner", "project", "region", "job_name", "temp_location",
                               "staging_location", "input", "output", "max_num_workers",
                               "worker_machine_type", "machine_type", "service_account_email",
                               "inputs", "options", "module", "packages")  # the launcher's


class PreprocessKind(StrEnum):
    """What runs the preprocess step (issue 42)."""

    BEAM = "beam"  # an Apache Beam pipeline on Dataflow
    SPARK = "spark"  # a PySpark batch on Dataproc Serverless


_SPARK_PROPERTY = Annotated[str, Matches(
    r"^spark\.[A-Za-z0-9_.-]+$", "must be a Spark property name like spark.executor.cores")]


@dataclass(frozen=True)
class Preprocess(FileSection):
    """An Apache Beam pipeline run on Dataflow before training; the training reads its output.

    Its output is cached by input: {output_uri}/{cache key}/, the key made of the data snapshot,
    the step's code (the package's content hash, or the template) and its options, so a run
    whose key is complete reuses it and a relaunched training never repeats it."""

    FILE_REQUIRES: ClassVar[tuple[str, ...]] = ("output_uri",)

    python_module: Annotated[str | None, Matches(
        r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$",
        "must be a Python module name like trainer.preprocess"),
        Field(description="A Beam pipeline in your code package (the chief pool's "
                          "python_package), run as `python -m MODULE --input URI --output URI "
                          "OPTIONS` by spotorch's launcher flex template on Dataflow; or "
                          "template_uri.")] = None
    template_uri: Annotated[GcsUri | None, Field(
        description="Your own Dataflow flex template spec (gs://.../template.json), launched "
                    "with the parameters input, output and options; or python_module.")] = None
    options: Annotated[tuple[tuple[str, str], ...], Pairs(_PIPELINE_OPTION,
                                                          Annotated[str, StringOrNumber()]),
                       Field(description="Pipeline options (flex template parameters) as names "
                                         "to strings or numbers; part of the cache key.")] = ()
    output_uri: Annotated[GcsUri, Field(
        description="Root of the step's outputs; each cache key writes under "
                    "{output_uri}/{key}/ and the training reads it (SPOTORCH_DATA_URI).")] = ""
    machine_type: Annotated[str, Matches(
        r"^[a-z][a-z0-9]*(-[a-z0-9]+)+$",
        "must be a Compute Engine machine type like n1-standard-4")] = "n1-standard-1"
    max_workers: Annotated[int, Field(ge=1, le=1000, description="Dataflow's autoscaling "
                                                                 "ceiling.")] = 10
    region: Annotated[Region, Field(description="Dataflow's regional endpoint for the "
                                                "job.")] = "us-central1"
    service_account: Annotated[str | None, Matches(
        r"^[^@\s]+@[^@\s]+\.gserviceaccount\.com$",
        "must be a service account email (...@PROJECT.iam.gserviceaccount.com)"),
        Field(description="The Dataflow worker service account (absent: spotorch-dataflow, "
                          "SPOTORCH_DATAFLOW_SERVICE_ACCOUNT).")] = None
    network: Annotated[str | None, Matches(
        r"^([a-z]([-a-z0-9]{0,61}[a-z0-9])?|projects/[^/\s]+/global/networks/[^/\s]+)$",
        "must be a VPC network name, or projects/PROJECT/global/networks/NAME"),
        Field(description="The VPC network of the workers (absent: the deployment's "
                          "SPOTORCH_DATAFLOW_NETWORK, else Dataflow's `default`).")] = None
    subnetwork: Annotated[str | None, Matches(
        r"^(https://www\.googleapis\.com/compute/v1/projects/[^/\s]+/)?regions/[a-z0-9-]+/"
        r"subnetworks/[^/\s]+$",
        "must be regions/REGION/subnetworks/NAME or its https://www.googleapis.com/compute/v1/"
        "projects/PROJECT/... URL"),
        Field(description="The workers' subnetwork, needed on a custom-mode network (absent: "
                          "the deployment's SPOTORCH_DATAFLOW_SUBNETWORK).")] = None
    timeout_s: Annotated[float, Duration(), Field(
        validation_alias="timeout",
        description="A job still running after this is cancelled and counted a timeout.")] = \
        6 * 3600.0
    # The step's own budgets: a failed transform is the user's code and rarely passes on a
    # second try; the service's errors and quotas are worth a few.
    max_user_errors: Annotated[int, Field(ge=0,
        description="Relaunches after a failure of your pipeline's code.")] = 0
    max_infra_errors: Annotated[int, Field(ge=0,
        description="Relaunches after a Dataflow-side failure.")] = 3
    max_quota_errors: Annotated[int, Field(ge=0,
        description="Relaunches after a quota refused the job's workers.")] = 1
    # A Spark step (issue 42, docs/preprocess.md "Spark on Dataproc Serverless"): the module runs
    # as a PySpark batch; machine_type and max_workers are Dataflow's and unused there.
    kind: Annotated[PreprocessKind, Field(
        description="beam: an Apache Beam pipeline on Dataflow; spark: a PySpark module of your "
                    "code package as a Dataproc Serverless batch.")] = PreprocessKind.BEAM
    runtime_version: Annotated[str | None, Matches(
        r"^[0-9]+\.[0-9]+(\.[0-9]+)?$", "must be a Dataproc Serverless runtime version like 2.2"),
        Field(description="kind spark: the batch's runtime_config.version (absent: Dataproc's "
                          "default runtime).")] = None
    properties: Annotated[tuple[tuple[str, str], ...], Pairs(_SPARK_PROPERTY,
                                                             Annotated[str, StringOrNumber()]),
                          Field(description="kind spark: Spark properties of the batch "
                                            "(runtime_config.properties); part of the cache "
                                            "key.")] = ()


@dataclass(frozen=True)
class Pipeline(FileSection):
    """Everything spotorch needs to know to turn data into a trained model."""

    FILE_REQUIRES: ClassVar[tuple[str, ...]] = ("job", "checkpoint_uri", "output_uri")
    FILE_OMITS: ClassVar[tuple[str, ...]] = ("source",)

    name: Annotated[str, Matches(
        r"^[a-z]([a-z0-9-]{0,38}[a-z0-9])?$",
        "must be 1-40 lowercase letters, digits and dashes, starting with a letter and not ending "
        "with a dash (it becomes part of run ids and job labels)"),
        Field(description="Unique across the deployment; part of every run id.")]
    trigger: Trigger
    job: JobTemplate = field(default_factory=JobTemplate)
    # root; each run checkpoints under {checkpoint_uri}/{run_id}
    checkpoint_uri: Annotated[GcsUri, Field(
        description="Root of checkpoints; each run checkpoints under "
                    "{checkpoint_uri}/{run_id}.")] = ""
    # root; each run writes its model under {output_uri}/{run_id}
    output_uri: Annotated[GcsUri, Field(
        description="Root of models; each run writes its model under "
                    "{output_uri}/{run_id}.")] = ""
    recovery: RecoveryPolicy = field(default_factory=RecoveryPolicy)
    # from run creation; None: no deadline
    deadline_s: Annotated[float | None, Duration(), Field(
        validation_alias="deadline", description="From run creation; absent: no deadline.")] = None
    # budget in currency units; None: unlimited
    max_cost: Annotated[float | None, Field(
        ge=0, description="Budget in currency units; absent: unlimited.")] = None
    # capacity -> price per replica-hour (overrides)
    prices: Annotated[tuple[tuple[str, float], ...], Pairs(Capacity, _Price, sort=True), Field(
        description="Price per replica-hour by capacity, overriding the built-in list "
                    "prices.")] = ()
    routes: tuple[Route, ...] = ()
    health: HealthPolicy = field(default_factory=HealthPolicy)
    source: str = ""  # the file it was loaded from, for error messages
    version: Annotated[Literal[1], Field(description="Format version of this file; 1.")] = 1
    description: str = ""
    hardware: Annotated[HardwareSearch | None, Field(
        description="Hardware candidates to probe before the full run (docs/hardware.md).")] = None
    sweep: SweepSpec | None = None  # a hyperparameter sweep: each data snapshot starts one
    model: ModelRegistration | None = None  # register successful models in Vertex AI
    preprocess: Annotated[Preprocess | None, Field(
        description="An Apache Beam pipeline on Dataflow before training, cached by input "
                    "(docs/preprocess.md).")] = None

    def run_checkpoint_uri(self, run_id: str) -> str:
        """The run's own checkpoint folder: a report naming anything else is refused."""
        return f"{self.checkpoint_uri.rstrip('/')}/{run_id}"

    def run_output_uri(self, run_id: str) -> str:
        """Where the run's model is written (Vertex's base output directory)."""
        return f"{self.output_uri.rstrip('/')}/{run_id}"
