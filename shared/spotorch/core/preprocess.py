"""The preprocessing step of a run (issue 31): an Apache Beam pipeline on Dataflow, cached by input.

Pure: the step's record on the run, its cache key, the Dataflow job's name and states, how a
failed job is classified, what the Eventarc statusChanged event says (decoded at the edge:
spotorch.entrypoints.dataflow_events), and the step's state machine
(`step_decision`). A statusChanged event is a hint only: the service layer reads the job with
GetJob (the source of truth) and hands what it read to step_decision, which the reconcile tick
calls too, so a lost event is repaired within one tick.

The step's output is keyed by its input (the snapshot), its code (the package's content hash or
the template URI) and its options; {preprocess.output_uri}/{key}/ holds it and a completion
marker that spotorch writes only after GetJob said JOB_STATE_DONE, so a later run with the same
key reuses the output (cache_hit) and a relaunched training never repeats a finished step.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field, replace
from enum import StrEnum
from typing import Any

from spotorch.core.model import FailureClass, Run, RunStatus
from spotorch.core.pipeline import Pipeline, Preprocess
from spotorch.core.provenance import package_hash, pinned_template
from spotorch.core.spark_batches import (
    BATCH_CANCELLING,
    BATCH_LIVE_STATES,
    BATCH_SUCCEEDED,
    batch_id,
    classify_batch,
)

# Dataflow's JobState names (google.dataflow.v1beta3.JobState), as GetJob and the event send them.
JOB_STATE_DONE = "JOB_STATE_DONE"
JOB_STATE_FAILED = "JOB_STATE_FAILED"
JOB_STATE_CANCELLED = "JOB_STATE_CANCELLED"
# A batch job that ends in one of these never changes again (UPDATED and DRAINED are streaming's
# endings, listed so a job replaced or drained by someone else still ends the step).
TERMINAL_STATES = frozenset({JOB_STATE_DONE, JOB_STATE_FAILED, JOB_STATE_CANCELLED,
                             "JOB_STATE_UPDATED", "JOB_STATE_DRAINED"})
LIVE_STATES = frozenset({"JOB_STATE_UNKNOWN", "JOB_STATE_STOPPED", "JOB_STATE_PENDING",
                         "JOB_STATE_QUEUED", "JOB_STATE_RUNNING", "JOB_STATE_CANCELLING",
                         "JOB_STATE_DRAINING", "JOB_STATE_RESOURCE_CLEANING_UP"})
STATUS_CHANGED_TYPE = "google.cloud.dataflow.job.v1beta3.statusChanged"
MARKER_NAME = "_SPOTORCH_PREPROCESS.json"  # written by spotorch after GetJob said DONE
# The run's inputs manifest, copied beside the output for the job (spotorch-dataflow reads the
# preprocess buckets, not the checkpoint bucket the manifest is written to).
INPUTS_NAME = "_SPOTORCH_INPUTS.json"

_JOB_NAME_RE = re.compile(r"[^a-z0-9-]+")


class StepPhase(StrEnum):
    """Where the preprocessing step of a run is."""

    WAITING = "WAITING"  # not launched yet: the cache is looked up, then the job is created
    LAUNCHING = "LAUNCHING"  # the launch intent is recorded; the job may or may not exist yet
    RUNNING = "RUNNING"  # GetJob answered a live state
    DONE = "DONE"  # the output is complete (the job ended JOB_STATE_DONE, or the cache had it)
    FAILED = "FAILED"  # the job failed beyond its class's budget; the run fails with its error
    CANCELLED = "CANCELLED"  # cancelled with its run, or by someone else


@dataclass(frozen=True)
class PreprocessStep:
    """The preprocessing step's record on its run (Run.preprocess holds its to_doc())."""

    cache_key: str
    output_uri: str  # {preprocess.output_uri}/{cache_key}/
    phase: StepPhase = StepPhase.WAITING
    cache_hit: bool = False
    launches: int = 0  # jobs created so far; the job name carries the number
    job_name: str | None = None
    job_id: str | None = None
    region: str = ""
    state: str | None = None  # the job's currentState as GetJob last answered
    launched_at: float | None = None
    started_at: float | None = None  # first seen live (Dataflow bills its workers from then)
    ended_at: float | None = None
    failure: FailureClass | None = None
    error: str | None = None  # the failed job's error text, as its error messages say it
    failures: Mapping[str, int] = field(default_factory=dict)  # class -> count, for the budgets
    # Billed resources as GetJobMetrics reports them (TotalVcpuTime, TotalMemoryUsage in MB-s,
    # TotalPdUsage in GB-s): Dataflow bills these, not the machine type times the wall clock.
    vcpu_s: float = 0.0
    memory_gb_s: float = 0.0
    pd_gb_s: float = 0.0
    # A Spark step (issue 42): its kind, and the batch's UsageMetrics (milli_dcu_seconds,
    # shuffle_storage_gb_seconds; UsageSnapshot's while it runs).
    kind: str = "beam"
    milli_dcu_s: float = 0.0
    shuffle_gb_s: float = 0.0
    usage_at: float | None = None  # when a running batch's UsageSnapshot was last added in

    @property
    def live(self) -> bool:
        """Whether a Dataflow job of the step may be running (launching or running)."""
        return self.phase in (StepPhase.LAUNCHING, StepPhase.RUNNING)

    @property
    def ended(self) -> bool:
        """Whether the step will never change again."""
        return self.phase in (StepPhase.DONE, StepPhase.FAILED, StepPhase.CANCELLED)

    def to_doc(self) -> dict[str, Any]:
        """The step as stored on the run's document and shown by `spotorch show --json`."""
        doc = asdict(self)
        doc["phase"] = str(self.phase)
        doc["failure"] = str(self.failure) if self.failure else None
        doc["failures"] = dict(self.failures)
        return doc

    @classmethod
    def from_doc(cls, doc: Mapping[str, Any]) -> PreprocessStep:
        """The step a stored document holds (the inverse of to_doc)."""
        data = dict(doc)
        data["phase"] = StepPhase(data.get("phase", StepPhase.WAITING))
        data["failure"] = FailureClass(data["failure"]) if data.get("failure") else None
        data["failures"] = {str(k): int(v) for k, v in (data.get("failures") or {}).items()}
        return cls(**data)


# --- the cache key -------------------------------------------------------------------------------


def code_identity(pipeline: Pipeline) -> str | None:
    """What the step's code is, by content: the template URI, or the module and the content-hashed
    URIs of the code package it comes from. None when the package is not built yet (a pipeline
    not validated where spotorch stages packages): then nothing can be cached safely."""
    step = pipeline.preprocess
    if step is None:
        return None
    if step.template_uri:
        return f"template:{step.template_uri}"
    chief = pipeline.job.worker_pools[0].python_package
    # Only URIs that name their content (spotorch's {staging}/packages/{sha256}/...): a package
    # given by hand can be overwritten in place, and would reuse another code's output.
    if chief is None or not chief.package_uris \
            or any(package_hash(u) is None for u in chief.package_uris):
        return None
    kind = "spark-module" if str(step.kind) == "spark" else "module"
    return f"{kind}:{step.python_module}:" + ",".join(chief.package_uris)


def cache_key(input_id: str, code: str, options: tuple[tuple[str, str], ...]) -> str:
    """The key of one output: the same input, code and options give the same key, any change
    another (option order does not matter). 20 hex digits: part of a GCS folder name."""
    body = json.dumps({"input": input_id, "code": code, "options": sorted(options)},
                      sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(body.encode()).hexdigest()[:20]


def input_identity(snapshot_id: str | None, data_uri: str, content_digest: str | None) -> str:
    """What the step reads: the snapshot's content digest when known (two snapshots with the same
    objects share it; for a pinned run the digest of its recorded generations, so a rerun after
    an overwrite has its origin's), else the snapshot id, else the data URI (a manual submit)."""
    if content_digest:
        return f"content:{content_digest}"
    return f"snapshot:{snapshot_id}" if snapshot_id else f"uri:{data_uri}"


def folder_digest(objects: Iterable[tuple[str, int, str]]) -> str:
    """The content digest of a folder from its objects' (name below the folder, size, CRC32C),
    in any order: the same files under another snapshot folder give the same digest."""
    body = json.dumps(sorted([str(n), int(s), str(c)] for n, s, c in objects),
                      separators=(",", ":"))
    return hashlib.sha256(body.encode()).hexdigest()[:32]


def step_pipeline(pipeline: Pipeline, run: Run) -> Pipeline:
    """The pipeline as the run's step runs it: a rerun's chief pool has its origin's recorded
    code (the package URIs provenance holds, not today's build), so its key and job are the
    origin's; any other run's is the pipeline as it is."""
    code = (run.provenance or {}).get("code")
    if not run.rerun_of or not code:
        return pipeline
    pinned = replace(pipeline, job=pinned_template(pipeline.job, code))
    recorded = (run.provenance or {}).get("preprocess")
    if pinned.preprocess is None or not isinstance(recorded, Mapping):
        return pinned  # recorded before the step's own record existed: today's module
    return replace(pinned, preprocess=replace(
        pinned.preprocess, python_module=recorded.get("python_module"),
        template_uri=recorded.get("template_uri"),
        options=tuple((str(k), str(v)) for k, v in (recorded.get("options") or {}).items()),
        **_recorded_spark(recorded)))


def _recorded_spark(recorded: Mapping[str, Any]) -> dict[str, Any]:
    """A Spark step's recorded properties and runtime (issue 42); nothing for a Beam step's."""
    if recorded.get("kind") != "spark":
        return {}
    return {"properties": tuple((str(k), str(v))
                                for k, v in (recorded.get("properties") or {}).items()),
            "runtime_version": recorded.get("runtime_version")}


def reads_pinned(pipeline: Pipeline) -> bool:
    """Whether the step's job can be handed the run's pinned objects: spotorch's launcher passes
    them to the module (--inputs); a template of the user's gets input and output only."""
    return pipeline.preprocess is not None and bool(pipeline.preprocess.python_module)


def pinned_objects(run: Run) -> tuple[tuple[str, int], ...] | None:
    """The run's recorded (object name, generation) pairs when its document lists them; None
    when it does not (a long list: then only its manifest does; an unpinned run)."""
    data = (run.provenance or {}).get("data") or {}
    objects = data.get("objects")
    if not data.get("objects_hash") or not isinstance(objects, list):
        return None
    return tuple((str(o["name"]), int(o["generation"])) for o in objects)


def manifest_of(run: Run) -> str | None:
    """The run's inputs manifest URI (its objects at their generations), None if unpinned."""
    data = (run.provenance or {}).get("data") or {}
    uri = data.get("manifest_uri")
    return str(uri) if data.get("objects_hash") and uri else None


def inputs_uri(step: PreprocessStep) -> str:
    """Where the job's copy of the run's inputs manifest goes: beside the output's marker."""
    return step.output_uri + INPUTS_NAME


def new_step(pipeline: Pipeline, input_id: str) -> PreprocessStep:
    """The step of a new run: its key and output folder. Without a code identity the key is made
    unique to the input and the run's launch cannot hit another code's output (never a false hit):
    the code part is the literal 'unbuilt:' and the module, and such keys are never looked up."""
    step = pipeline.preprocess
    if step is None:
        raise ValueError(f"pipeline {pipeline.name} has no preprocess step")
    code = code_identity(pipeline) or f"unbuilt:{step.python_module}"
    # A Spark step's properties are part of its key (their names, spark.*, never a Beam option's).
    key = cache_key(input_id, code, step.options + step.properties)
    return PreprocessStep(cache_key=key, output_uri=f"{step.output_uri.rstrip('/')}/{key}/",
                          region=step.region, kind=str(step.kind))


def cacheable(pipeline: Pipeline) -> bool:
    """Whether outputs of this pipeline's step may be reused (its code is known by content)."""
    return code_identity(pipeline) is not None


def marker_uri(step: PreprocessStep) -> str:
    """The completion marker of the step's output folder."""
    return step.output_uri + MARKER_NAME


def marker_doc(step: PreprocessStep, run_id: str) -> dict[str, Any]:
    """What the completion marker says: which run's job produced the output, for provenance."""
    return {"cache_key": step.cache_key, "output_uri": step.output_uri, "run_id": run_id,
            "job_name": step.job_name, "job_id": step.job_id, "state": step.state}


# --- the Dataflow job ----------------------------------------------------------------------------


def job_name(run_id: str, launch: int) -> str:
    """The Dataflow job name of a run's launch number `launch`: deterministic, so a relaunched
    intent finds the job it already created (Dataflow refuses a second live job of one name).
    Dataflow's rule: [a-z]([-a-z0-9]{0,1022}[a-z0-9])?"""
    base = _JOB_NAME_RE.sub("-", run_id.lower()).strip("-") or "run"
    if len(base) > 60:  # cut, with a hash of the whole id: two long run ids never share a job
        digest = hashlib.sha256(run_id.encode()).hexdigest()[:8]
        base = f"{base[:51].strip('-')}-{digest}"
    return f"spotorch-{base}-pre{launch}"


@dataclass(frozen=True)
class JobView:
    """A Dataflow job as GetJob (and GetJobMetrics, ListJobMessages) answered: the source of truth."""

    job_id: str
    name: str
    state: str  # currentState, e.g. JOB_STATE_RUNNING
    error: str = ""  # the job's JOB_MESSAGE_ERROR texts, newest last
    vcpu_s: float = 0.0
    memory_gb_s: float = 0.0
    pd_gb_s: float = 0.0
    refused: bool = False  # the launch was refused for good (bad spec, permissions): no job
    milli_dcu_s: float = 0.0  # a Dataproc batch's usage (issue 42): UsageMetrics once ended
    shuffle_gb_s: float = 0.0
    milli_dcu_rate: float = 0.0  # a running batch's UsageSnapshot.milli_dcu (allocated now)


@dataclass(frozen=True)
class StatusHint:
    """What a statusChanged event claims about a job: a reason to call GetJob, nothing more."""

    project: str
    region: str
    job_id: str
    state: str
    job_name: str


# Classification of a failed job's error text. Dataflow reports a worker's Python exception as
# "Error message from worker: Traceback ..."; quotas and the service's own failures by name.
QUOTA_PATTERNS = (r"(?i)quota", r"(?i)QUOTA_EXCEEDED", r"(?i)exceeded rate limits")
INFRA_PATTERNS = (r"(?i)internal error", r"(?i)\bunavailable\b", r"(?i)ZONE_RESOURCE_POOL_EXHAUSTED",
                  r"(?i)startup of the worker pool .* failed", r"(?i)workers? (were|was) lost",
                  r"(?i)lost contact with the service")
USER_PATTERNS = (r"Traceback \(most recent call last\)", r"(?i)error message from worker",
                 r"(?i)\b[A-Za-z_.]*(Error|Exception)\b: ")
# The workers' network does not exist or cannot be used (a project without a `default` VPC, as
# organisation policy often leaves it): the deployment's setting, so a relaunch cannot help.
NETWORK_PATTERNS = (r"(?i)network \S+ is not accessible", r"(?i)network\S* \S+ (does not|doesn't) "
                    r"exist", r"(?i)(sub)?networks?/\S+ (was )?not found",
                    r"(?i)\bnetwork\b.*\b(was not found|cannot be found|does not exist)")
NETWORK_HINT = ("the Dataflow workers' VPC network is missing or not usable: set dataflow_network "
                "(and dataflow_subnetwork for a custom-mode network) in terraform.tfvars, or "
                "preprocess.network / preprocess.subnetwork in the pipeline (docs/deploy.md)")


def explain(error: str) -> str:
    """A failed job's (or refused launch's) error text, led by what to do when it is the
    network's: Dataflow's own words are kept after it."""
    if error and any(re.search(p, error) for p in NETWORK_PATTERNS) and NETWORK_HINT not in error:
        return f"{NETWORK_HINT}. Dataflow said: {error}"
    return error


def classify(state: str, error: str) -> FailureClass:
    """Why a job ended without JOB_STATE_DONE: cancelled, quota, infrastructure or user code.
    Quota and the service's named failures win over a traceback (a worker that never started
    cannot have run the user's code); an unexplained failure is infrastructure, which retries."""
    if state == JOB_STATE_CANCELLED:
        return FailureClass.CANCELLED
    if any(re.search(p, error) for p in NETWORK_PATTERNS):
        return FailureClass.USER_ERROR  # the deployment's setting: a relaunch cannot help
    if any(re.search(p, error) for p in QUOTA_PATTERNS):
        return FailureClass.QUOTA
    if any(re.search(p, error) for p in INFRA_PATTERNS):
        return FailureClass.INFRA
    if any(re.search(p, error) for p in USER_PATTERNS):
        return FailureClass.USER_ERROR
    return FailureClass.INFRA


def budget(spec: Preprocess, failure: FailureClass) -> int:
    """Relaunches the step allows after a failure of this class (cancelled and timeout: none)."""
    return {FailureClass.USER_ERROR: spec.max_user_errors,
            FailureClass.INFRA: spec.max_infra_errors,
            FailureClass.QUOTA: spec.max_quota_errors}.get(failure, 0)


# How the run ends when its step fails for good: a user error is the run's FAILED (the user's
# code), the others as for a training job of the same class.
RUN_STATUS_ON_FAILURE: Mapping[FailureClass, RunStatus] = {
    FailureClass.USER_ERROR: RunStatus.FAILED,
    FailureClass.INFRA: RunStatus.FAILED_INFRA,
    FailureClass.QUOTA: RunStatus.FAILED_QUOTA,
    FailureClass.TIMEOUT: RunStatus.FAILED_TIMEOUT,
    FailureClass.CANCELLED: RunStatus.CANCELLED,
    FailureClass.LAUNCH_REJECTED: RunStatus.FAILED_LAUNCH,
}


# --- the state machine ---------------------------------------------------------------------------


class StepAction(StrEnum):
    """What the service layer does after a decision on the step."""

    NONE = "none"  # nothing to do now (waiting for the job)
    LAUNCH = "launch"  # create the job named step.job_name (idempotent by that name)
    CANCEL = "cancel"  # cancel the job (timeout); the next decision sees it end
    TRAIN = "train"  # the output is complete: write the marker (unless a cache hit), go train
    FAIL = "fail"  # end the run: status and reason given


@dataclass(frozen=True)
class StepDecision:
    """The step after a decision, what to do, and for FAIL how the run ends and why."""

    step: PreprocessStep
    action: StepAction
    run_status: RunStatus | None = None
    reason: str = ""


def on_cache(step: PreprocessStep, complete: bool, run_id: str, now: float) -> StepDecision:
    """The cache looked up for a WAITING step: a complete output is reused, else a job launched
    (complete is False for a pipeline whose code is not known by content: never a false hit)."""
    if step.phase is not StepPhase.WAITING:
        return StepDecision(step, StepAction.NONE)
    if complete:
        done = replace(step, phase=StepPhase.DONE, cache_hit=True, ended_at=now)
        return StepDecision(done, StepAction.TRAIN, reason="output reused from the cache")
    return _launch(step, run_id, now)


def _launch(step: PreprocessStep, run_id: str, now: float) -> StepDecision:
    number = step.launches + 1
    name = batch_id(run_id, number) if step.kind == "spark" else job_name(run_id, number)
    launched = replace(step, phase=StepPhase.LAUNCHING, launches=number, job_name=name,
                       job_id=None, state=None, launched_at=now, started_at=None,
                       ended_at=None, failure=None, error=None)
    return StepDecision(launched, StepAction.LAUNCH)


def on_job(step: PreprocessStep, spec: Preprocess, job: JobView | None, now: float,
           run_id: str) -> StepDecision:
    """The step after GetJob answered for its current job (None: Dataflow does not know the job
    yet, e.g. the launch intent not carried out). Only the job of the step's current name moves
    it: an answer about an earlier launch's job, or any job of an ended step, changes nothing.
    A Spark step's job is its Dataproc batch (GetBatch; Batch.State names, issue 42)."""
    spark = step.kind == "spark"
    what = "Dataproc batch" if spark else "Dataflow job"
    if not step.live or (job is not None and job.name != step.job_name):
        return StepDecision(step, StepAction.NONE)
    if job is None:
        if step.launched_at is not None and now - step.launched_at > spec.timeout_s:
            return _fail(step, FailureClass.TIMEOUT, f"the {what} was never created", now)
        return StepDecision(step, StepAction.NONE)
    seen = replace(step, job_id=job.job_id, state=job.state,
                   vcpu_s=max(step.vcpu_s, job.vcpu_s),
                   memory_gb_s=max(step.memory_gb_s, job.memory_gb_s),
                   pd_gb_s=max(step.pd_gb_s, job.pd_gb_s),
                   milli_dcu_s=max(step.milli_dcu_s, job.milli_dcu_s),
                   shuffle_gb_s=max(step.shuffle_gb_s, job.shuffle_gb_s))
    if spark:
        seen = _batch_usage(seen, step, job, now)
    if job.state in (BATCH_LIVE_STATES if spark else LIVE_STATES) and not job.refused:
        running = replace(seen, phase=StepPhase.RUNNING,
                          started_at=step.started_at if step.started_at is not None else now)
        started = running.started_at if running.started_at is not None else now
        cancelling = BATCH_CANCELLING if spark else "JOB_STATE_CANCELLING"
        if now - started > spec.timeout_s and job.state != cancelling:
            return StepDecision(replace(running, failure=FailureClass.TIMEOUT), StepAction.CANCEL,
                                reason=f"the {what} ran longer than its timeout "
                                       f"({spec.timeout_s:g}s)")
        return StepDecision(running, StepAction.NONE)
    ended = replace(seen, ended_at=now)
    done = BATCH_SUCCEEDED if spark else JOB_STATE_DONE
    if job.state == done and not job.refused:
        return StepDecision(replace(ended, phase=StepPhase.DONE), StepAction.TRAIN,
                            reason=f"{what} {job.name} ended {done}")
    # A job we cancelled for its timeout ends CANCELLED: it is still the timeout.
    failure = (FailureClass.LAUNCH_REJECTED if job.refused
               else FailureClass.TIMEOUT if step.failure is FailureClass.TIMEOUT
               else classify_batch(job.state, job.error) if spark
               else classify(job.state, job.error))
    error = job.error.strip() or f"the {what} ended {job.state}"
    counts = {**step.failures, str(failure): step.failures.get(str(failure), 0) + 1}
    ended = replace(ended, failure=failure, error=error, failures=counts)
    if counts[str(failure)] <= budget(spec, failure):
        return _launch(ended, run_id, now)
    return _fail(ended, failure, error, now)


def _batch_usage(seen: PreprocessStep, step: PreprocessStep, job: JobView,
                 now: float) -> PreprocessStep:
    """A batch's DCU usage: while it runs, its UsageSnapshot's rate over the time since the last
    poll added in (an estimate, so a running step's cost shows); once it has ended, UsageMetrics'
    total, which is what Dataproc bills, replaces the estimate."""
    if job.state in BATCH_LIVE_STATES:
        since = step.usage_at if step.usage_at is not None else now
        return replace(seen, milli_dcu_s=step.milli_dcu_s + job.milli_dcu_rate * (now - since),
                       usage_at=now)
    if job.milli_dcu_s or job.shuffle_gb_s:
        return replace(seen, milli_dcu_s=job.milli_dcu_s, shuffle_gb_s=job.shuffle_gb_s)
    return seen


def _fail(step: PreprocessStep, failure: FailureClass, error: str, now: float) -> StepDecision:
    phase = StepPhase.CANCELLED if failure is FailureClass.CANCELLED else StepPhase.FAILED
    status = RUN_STATUS_ON_FAILURE.get(failure, RunStatus.FAILED_INFRA)
    ended = replace(step, phase=phase, failure=failure, error=error,
                    ended_at=step.ended_at if step.ended_at is not None else now)
    return StepDecision(ended, StepAction.FAIL, status,
                        f"preprocess failed ({failure}): {error}")


def on_run_cancelled(step: PreprocessStep, now: float) -> StepDecision:
    """The run is cancelled: a live job is cancelled too (the next GetJob sees it end)."""
    if not step.live:
        return StepDecision(step, StepAction.NONE)
    return StepDecision(replace(step, failure=FailureClass.CANCELLED), StepAction.CANCEL,
                        reason="the run was cancelled")


def training_data_uri(step: PreprocessStep | None, data_uri: str) -> str:
    """What the training reads: the step's output once it is DONE, else the run's own data."""
    return step.output_uri if step is not None and step.phase is StepPhase.DONE else data_uri
