"""What the use cases talk to (Deps), their errors, and the context a decision about a run needs."""

from __future__ import annotations

import logging
import secrets
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from spotorch.app import hardware_probes as probes
from spotorch.app.spot_record import SpotRecord, shape_key, shape_of
from spotorch.core import hardware, shapes
from spotorch.core.context import Context
from spotorch.core.errors import SpotorchError
from spotorch.core.model import Run, RunStatus
from spotorch.core.observations import Observation
from spotorch.core.pipeline import Pipeline
from spotorch.core.policy import RegionRecord
from spotorch.core.price_list import LIST_PRICES
from spotorch.core.prices import PriceTable
from spotorch.settings import COLLECTION_JOBS

if TYPE_CHECKING:  # the ports only name Deps' fields: a cold start imports those its adapters use
    from spotorch.ports.clock import Clock
    from spotorch.ports.job_logs import JobLogs
    from spotorch.ports.jobs import JobLauncher
    from spotorch.ports.messages import EventPublisher, ShardDispatcher
    from spotorch.ports.registry import ExperimentTracker, ModelRegistry
    from spotorch.ports.serving import Endpoints, EndpointTraffic
    from spotorch.ports.steps import StepLauncher, StepOutputs
    from spotorch.ports.storage import CheckpointStore, ObjectStore
    from spotorch.ports.store import DocumentStore, RunStore
    from spotorch.ports.tables import TableSource
    from spotorch.ports.vizier import TrialSearch

log = logging.getLogger("spotorch.app.deps")




class UnknownRun(SpotorchError):
    """No run has this id."""


class UnknownPipeline(SpotorchError):
    """No pipeline has this name."""


class NotRetryable(SpotorchError):
    """Only a run that ended without success can be retried."""


class UnknownAttempt(SpotorchError):
    """The run has no attempt with this number."""


class NotOurJob(SpotorchError):
    """A job spotorch never created (or whose record is gone): acknowledged, counted, not recorded."""


class ImplausibleReport(SpotorchError):
    """A trainer report that cannot be true of this run (progress past the end, too fast)."""


class ForgedReport(SpotorchError):
    """A trainer message its attempt's key did not sign (unsigned, mis-signed, another attempt)."""


class OtherProject(SpotorchError):
    """A log entry of another project's job: never attributed to one of ours."""


class ContradictedLine(SpotorchError):
    """A job-state line Vertex's own answer contradicts (applied: Vertex's answer; recorded)."""


@dataclass
class Deps:
    """What the service layer talks to; adapters are real in production and fakes in unit tests."""

    runs: RunStore
    docs: DocumentStore
    launcher: JobLauncher
    checkpoints: CheckpointStore
    publisher: EventPublisher
    clock: Clock
    pipelines: Mapping[str, Pipeline]
    objects: ObjectStore  # the landing buckets: manifests, existence checks, listings
    events_topic: str = ""  # trainer events topic handed to jobs (projects/P/topics/T)
    # The project whose jobs these are: a log entry naming another is not ours. "": not checked
    # (unit tests); production sets SPOTORCH_PROJECT.
    project: str = ""
    shards: ShardDispatcher | None = None  # None: the tick reconciles every run itself
    models: ModelRegistry | None = None  # Vertex AI Model Registry (pipelines with `model`)
    experiments: ExperimentTracker | None = None  # Vertex AI Experiments (sweep trials)
    # issue 37: Vertex AI endpoints (pipelines with model.serve) and their traffic's metrics
    endpoints: Endpoints | None = None
    endpoint_traffic: EndpointTraffic | None = None
    search: TrialSearch | None = None  # Vertex AI Vizier (sweeps with search: vizier)
    # Spot seen by every run, per region and shape: ranks regions for the next Spot attempt.
    spot: SpotRecord = field(default_factory=SpotRecord)
    owners: JobOwners = field(default_factory=lambda: JobOwners())  # the job records, cached
    prices: PriceTable = LIST_PRICES  # the ledger's price table (SPOTORCH_PRICES, if set)
    # Told at once when a run ends, after its write (a sweep hears of its trial's end; the sweep's
    # tick is the backstop). Wired in one place: spotorch.app.bootstrap.
    on_run_ended: tuple[Callable[[Deps, Run], object], ...] = ()
    # What a failed job's replicas wrote to stderr (Cloud Logging; the Vertex emulator locally).
    job_logs: JobLogs | None = None
    tables: TableSource | None = None  # BigQuery (pipelines with trigger.bigquery)
    # How long one invocation may wait for a BigQuery snapshot's jobs before it returns and
    # leaves the rest to the next event or tick (never a job's full duration).
    table_wait_s: float = 5.0
    # An upload that matched no pipeline is alerted on once it was quiet this long.
    unmatched_alert_after_s: float = 600.0
    # issue 31: the preprocess step's Dataflow jobs and its cached outputs (None: a deployment
    # whose pipelines have no preprocess step; one that does fails its step's intents loudly).
    steps: StepLauncher | None = None
    step_outputs: StepOutputs | None = None
    spark_steps: StepLauncher | None = None  # Dataproc Serverless batches (issue 42)

    def pipeline(self, name: str) -> Pipeline:
        """The loaded pipeline of this name; UnknownPipeline if there is none."""
        try:
            return self.pipelines[name]
        except KeyError:
            raise UnknownPipeline(f"no pipeline named {name!r}") from None


ObservationSource = Sequence[Observation] | Callable[[Run], Sequence[Observation]]


def context(deps: Deps, run: Run, now: float) -> Context:
    """What a decision about this run needs: its pipeline, the time, and (for a pipeline with
    several regions) the regions ranked by the shared record of Spot for the run's shape."""
    pipeline = deps.pipeline(run.pipeline)
    shape = shape_key(pipeline, run)
    ctx = Context(pipeline, now, region_order=region_order(deps, pipeline, shape, now),
                  region_records=region_records(deps, pipeline, shape, now),
                  prices=deps.prices, key_seed=key_seed())
    if pipeline.hardware is None or run.hardware is not None or \
            run.status not in (RunStatus.QUEUED, RunStatus.PROBING, RunStatus.PREPROCESSING):
        return ctx
    # A queued run, or one whose preprocess output may be complete now, may start probing.
    cache = probe_cache(deps, pipeline) if run.status in (RunStatus.QUEUED,
                                                          RunStatus.PREPROCESSING) else None
    return replace(ctx, outlook=hardware_outlook(deps, pipeline, now), hardware_cache=cache)


def key_seed() -> bytes:
    """Fresh random bytes for one decision: the report keys of the attempts it launches."""
    return secrets.token_bytes(32)


def probe_cache(deps: Deps, pipeline: Pipeline) -> dict[str, hardware.ProbeResult] | None:
    """The pipeline's cached hardware probe results, None if unreadable (logged, not fatal)."""
    try:
        return probes.load_cache(deps.docs, pipeline.name)
    except Exception as exc:  # None: the run starts on the pipeline's own worker pools
        log.warning("probe cache of %s unreadable: %s", pipeline.name, exc)
        return None


def hardware_outlook(deps: Deps, pipeline: Pipeline, now: float) -> hardware.Outlook | None:
    """Expected preemptions per hour of each candidate's shape, from the shared Spot record
    (every run's Spot attempts in the pipeline's regions); None when nothing was observed."""
    search = pipeline.hardware
    if search is None:
        return None
    rates: dict[str, float] = {}
    try:
        for candidate in search.candidates:
            shape = shape_of(shapes.on_candidate(pipeline, candidate), None)
            records = deps.spot.records(deps.docs, shape, pipeline.job.regions, now)
            available_h = sum(r.available_s for r in records) / 3600.0
            if available_h > 0:
                rates[candidate.name] = sum(r.preemptions for r in records) / available_h
    except Exception as exc:
        log.warning("no Spot history for %s's candidates: %s", pipeline.name, exc)
        return None
    overhead = pipeline.recovery.restart_overhead_s
    return hardware.Outlook(rates, rework_s_per_preemption=overhead) if rates else None


def region_order(deps: Deps, pipeline: Pipeline, shape: str, now: float) -> tuple[str, ...] | None:
    """The pipeline's regions best first for this shape; None: one region, or no record."""
    if len(pipeline.job.regions) < 2:
        return None
    try:
        return deps.spot.order(deps.docs, shape, pipeline.job.regions, now)
    except Exception as exc:  # advice only: the fixed order still works
        log.warning("spot record unreadable, regions in the pipeline's order: %s", exc)
        return None


def region_records(deps: Deps, pipeline: Pipeline, shape: str, now: float
                   ) -> dict[str, RegionRecord] | None:
    """The shared record's figures per region (the priors of core.region_moves' estimates);
    None: one region, or no record. Read through the same cache as region_order."""
    if len(pipeline.job.regions) < 2:
        return None
    try:
        records = deps.spot.records(deps.docs, shape, pipeline.job.regions, now)
    except Exception as exc:  # advice only: flat priors still work
        log.warning("spot record unreadable, flat priors for the regions: %s", exc)
        return None
    return dict(zip(pipeline.job.regions, records, strict=True))


def job_id_of(job_name: str) -> str:
    """The job's id: the last part of its resource name."""
    return job_name.rsplit("/", 1)[-1]


@dataclass(frozen=True)
class JobOwner:
    """What the job record says of a job: its full name (with region), run and attempt."""

    job_name: str
    run_id: str
    attempt: int
    probe: int = 0  # a Spot probe's job (attempt 0)


@dataclass
class JobOwners:
    """The job records' answers, kept per instance: which run each job id belongs to."""

    # A job record never changes once written (a job id names one run's attempt or probe for
    # good), so a found owner can be kept; a missing record is asked again every time (it may
    # be a forged id now and a real one never, or one whose record write failed). An attempt
    # sends several lines (provisioning, running, its end) and the launching instance records
    # the job itself: each hit saves a Firestore read on the job-event path.
    limit: int = 10_000
    _known: dict[str, JobOwner] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def find(self, docs: DocumentStore, job_id: str) -> JobOwner | None:
        """The owner the job record names, kept once found; None if there is no record."""
        known = self._known.get(job_id)
        if known is not None:
            return known
        doc, _ = docs.get(COLLECTION_JOBS, job_id)
        if doc is None:
            return None
        owner = JobOwner(str(doc["job_name"]), str(doc["run_id"]), int(doc["attempt"]),
                         int(doc.get("probe") or 0))
        self.remember(job_id, owner)
        return owner

    def remember(self, job_id: str, owner: JobOwner) -> None:
        """Keep a job's owner, forgetting the oldest past `limit`."""
        with self._lock:
            if len(self._known) >= self.limit:  # the oldest first: dicts keep insertion order
                del self._known[next(iter(self._known))]
            self._known[job_id] = owner


def job_owner(deps: Deps, job_id: str) -> JobOwner | None:
    """The run and attempt a job id belongs to, by its job record; None if it has none."""
    return deps.owners.find(deps.docs, job_id)
