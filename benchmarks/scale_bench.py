"""Scale: N active runs reconciled by the tick on the emulators, within Vertex AI's quotas.

    .venv/bin/python benchmarks/scale_bench.py --runs 1000 [--runs 100 ...] [--json]
        [--results docs/scale.json] [--plot docs/img/scale.svg]

The Firestore and Pub/Sub emulators, and the Vertex AI emulator in its synthetic-job mode (no
worker process per job: a job runs until preempted or for an hour), which enforces Vertex's
default quotas (600 resource-management requests and 60 job submissions per minute per region)
while anything is measured. Setting up N runs needs N job submissions, more than a minute's
quota: the setup runs with the quotas lifted (and the launcher's budget off), the measurement
with the quotas on and the launcher taking every call from the request budget shared through
Firestore (spotorch.adapters.budget, as deployed with SPOTORCH_SHARED_BUDGET=1).

Everything measured goes through the functions' entry points (spotorch.entrypoints.functions) with real
CloudEvents: the tick as Cloud Scheduler's Pub/Sub message, each shard of a fanned-out tick as
the tick topic's shard message, and trainer reports through functions/main.py's on_job_event on
functions-framework, as a function instance receives them. Printed per N:

- a steady-state tick (every job RUNNING): its wall time (the parent's listing and hand-out,
  plus the slowest shard: in production each shard is an invocation of its own, running at the
  same time; here they run one after another, and their sum is printed too), Vertex requests
  per tick (counted on the client side), Firestore reads and writes per tick;
- trainer reports: one per run from many runs at once (8 threads), events per second, and the
  latency of one report alone; Firestore reads and writes per report;
- Firestore reads and writes per run-hour: the tick's share (one tick per TICK_PERIOD_S) plus
  the reports' (one every REPORT_INTERVAL_S);
- 10% of the jobs preempted with every job event lost: how many one tick relaunched, and how
  long after the jobs ended (p50/p99) the relaunch was decided (`relaunch_*`) and its job created
  in Vertex (`launched_*`; the submission quota decides how many one tick can create: those left
  wait in the outbox for the next tick, TICK_PERIOD_S later, which is not included);
- a cost model per 1,000 runs per day at list prices, stated with its assumptions.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
for extra in (REPO / "shared", REPO / "trainer"):
    sys.path.insert(0, str(extra))

from cloudevents.conversion import to_structured
from cloudevents.http import CloudEvent

from spotorch.adapters.memory.twins import (
    InMemoryCheckpoints,
    InMemoryObjectStore,
    InMemoryPublisher,
    InMemoryShardDispatcher,
)
from spotorch.app import bootstrap
from spotorch.app.deps import Deps
from spotorch.app.run_store import DocumentRunStore
from spotorch.app.runs import start_run
from spotorch.core.model import RunStatus
from spotorch.core.pipeline import (
    EscalationKind,
    JobTemplate,
    OnActiveRun,
    Pipeline,
    RecoveryPolicy,
    Trigger,
    WorkerPool,
)
from spotorch.entrypoints import functions as entry
from spotorch.entrypoints.wiring import SystemClock
from spotorch.local.emulators import running
from spotorch.ports.store import AddTo

PROJECT = "spotorch-scale"
REGION = "us-central1"
TICK_PERIOD_S = 300.0  # the deployment's Cloud Scheduler period (deploy/variables.tf tick_schedule)
REPORT_INTERVAL_S = 10.0  # the trainer's default progress interval (spotorch_trainer.run)
SETUP_THREADS = 8  # runs are created concurrently, as a burst of data arrivals would start them
EVENT_THREADS = 8
MAX_EVENT_RUNS = 2000  # trainer reports in the burst: one per run, at most this many runs
MAIN = str(REPO / "functions" / "main.py")


class CountingDocs:
    """A DocumentStore that counts what it asks of Firestore (reads include query results)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.reads = self.writes = 0
        self._lock = threading.Lock()

    def _add(self, reads: int = 0, writes: int = 0) -> None:
        with self._lock:
            self.reads += reads
            self.writes += writes

    def get(self, collection: str, key: str) -> Any:
        self._add(reads=1)
        return self.inner.get(collection, key)

    def put(self, collection: str, key: str, data: Mapping[str, Any], version: Any,
            adds: Sequence[AddTo] = ()) -> Any:
        self._add(writes=1 + len(adds))  # one commit: the document and the record's increments
        return self.inner.put(collection, key, data, version, adds)

    def query(self, collection: str, field_name: str, value: Any) -> Any:
        found = self.inner.query(collection, field_name, value)
        self._add(reads=max(len(found), 1))  # Firestore bills a query at least one read
        return found

    def reset(self) -> tuple[int, int]:
        with self._lock:
            counts = (self.reads, self.writes)
            self.reads = self.writes = 0
            return counts


class CountingClient:
    """Wraps the real aiplatform_v1 JobServiceClient and counts its requests by method.

    A list call is counted once per page fetched (the pager fetches lazily)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.calls: dict[str, int] = {}
        self._lock = threading.Lock()

    def _count(self, method: str) -> None:
        with self._lock:
            self.calls[method] = self.calls.get(method, 0) + 1

    def create_custom_job(self, **kwargs: Any) -> Any:
        self._count("create")
        return self.inner.create_custom_job(**kwargs)

    def get_custom_job(self, **kwargs: Any) -> Any:
        self._count("get")
        return self.inner.get_custom_job(**kwargs)

    def cancel_custom_job(self, **kwargs: Any) -> Any:
        self._count("cancel")
        return self.inner.cancel_custom_job(**kwargs)

    def list_custom_jobs(self, **kwargs: Any) -> Any:
        self._count("list")
        pager = self.inner.list_custom_jobs(**kwargs)
        counter = self

        class Pages:
            @property
            def pages(self) -> Iterator[Any]:
                for i, page in enumerate(pager.pages):
                    if i:
                        counter._count("list")
                    yield page

            def __iter__(self) -> Iterator[Any]:
                for page in self.pages:
                    yield from page.custom_jobs
        return Pages()

    def total(self) -> int:
        return sum(self.calls.values())


@dataclass
class World:
    deps: Deps
    docs: CountingDocs  # the runs, jobs, snapshots... everything the service reads and writes
    budget_docs: CountingDocs  # the shared request budget's documents, counted on their own
    client: CountingClient
    launcher: Any
    dispatcher: InMemoryShardDispatcher
    emulator: Any


@contextmanager
def world(log_dir: Path) -> Iterator[World]:
    from spotorch.local._vertex_quota import QuotaLimits
    from spotorch.local.vertex_emulator import VertexEmulator

    with running(PROJECT, log_dir, gcs=False) as emulators:
        os.environ.update(emulators.env())
        emulator = VertexEmulator(PROJECT, synthetic_run_s=3600.0, job_events_topic=None,
                                  queued_s=0.05, pending_s=0.05, tick_s=0.5, grace_s=1.0,
                                  workdir=log_dir / "vertex", quotas=QuotaLimits.unlimited())
        emulator.start()
        saved = entry.deps
        try:
            built = build(emulator)
            entry.deps = lambda: built.deps  # type: ignore[assignment]  # what entry.deps() builds
            yield built
        finally:
            entry.deps = saved
            emulator.stop()


def build(emulator: Any) -> World:
    import grpc
    from google.cloud import aiplatform_v1 as v1
    from google.cloud.aiplatform_v1.services.job_service.transports.grpc import (
        JobServiceGrpcTransport,
    )

    from spotorch.adapters.gcp.firestore import FirestoreDocumentStore
    from spotorch.adapters.gcp.vertex import VertexJobLauncher
    from spotorch.adapters.gcp.vertex_budgets import RequestBudget
    from spotorch.adapters.gcp.vertex_calls import RetryPolicy
    from spotorch.ports.budget import CRUD, SUBMIT

    firestore = FirestoreDocumentStore(project=PROJECT)
    docs, budget_docs = CountingDocs(firestore), CountingDocs(firestore)
    channel = grpc.insecure_channel(emulator.address)
    client = CountingClient(v1.JobServiceClient(transport=JobServiceGrpcTransport(channel=channel)))
    launcher = VertexJobLauncher(PROJECT, client_factory=lambda region: client, regions=(REGION,),
                                 retry=RetryPolicy(attempts=3, base_s=0.2),
                                 budget=RequestBudget({CRUD: 1e9, SUBMIT: 1e9}))  # setup: none
    pool = WorkerPool(command=("python3", "-c", "pass"))
    pipeline = Pipeline(name="scale", trigger=Trigger(bucket="b", on_active_run=OnActiveRun.PARALLEL),
                        checkpoint_uri="gs://c/scale", output_uri="gs://m/scale",
                        job=JobTemplate(worker_pools=(pool,), regions=(REGION,)),
                        recovery=RecoveryPolicy(escalation=EscalationKind.NEVER,
                                                max_preemptions=100))
    dispatcher = InMemoryShardDispatcher()
    deps = bootstrap.deps(runs=DocumentRunStore(docs), docs=docs, launcher=launcher,
                checkpoints=InMemoryCheckpoints(), publisher=InMemoryPublisher(),
                clock=SystemClock(), pipelines={"scale": pipeline}, objects=InMemoryObjectStore(),
                shards=dispatcher)
    return World(deps, docs, budget_docs, client, launcher, dispatcher, emulator)


def pubsub_event(body: bytes, attributes: Mapping[str, str], event_id: str) -> CloudEvent:
    return CloudEvent({"type": "google.cloud.pubsub.topic.v1.messagePublished", "id": event_id,
                       "source": f"//pubsub.googleapis.com/projects/{PROJECT}/topics/t"},
                      {"message": {"data": base64.b64encode(body).decode(),
                                   "attributes": dict(attributes), "messageId": event_id},
                       "subscription": f"projects/{PROJECT}/subscriptions/s"})


def run_tick(w: World, label: str, *, parallel: bool = False) -> dict[str, Any]:
    """One tick as the function runs it: the scheduler's message, then each shard's message.

    Shards run one after another (their times are then each shard's own, not two cores shared
    by eight), or with `parallel` at once, as production's invocations do: a preemption tick's
    shards each spend up to the launch retry window waiting for the shared budget, and one
    after another those windows would add up where production's overlap."""
    w.dispatcher.shards.clear()
    w.client.calls.clear()
    w.docs.reset()
    w.budget_docs.reset()
    t0 = time.perf_counter()
    entry.tick_event(pubsub_event(b"{}", {}, f"tick-{label}"))
    parent_s = time.perf_counter() - t0

    def one(shard: Mapping[str, Any]) -> float:
        body = json.dumps(shard).encode()
        started = time.perf_counter()
        entry.tick_event(pubsub_event(body, {entry.ATTR_SHARD: str(shard["shard"])},
                                      f"tick-{label}-{shard['shard']}"))
        return time.perf_counter() - started

    shards = list(w.dispatcher.shards)
    if parallel and shards:
        with ThreadPoolExecutor(len(shards)) as pool:
            shard_s = list(pool.map(one, shards))
    else:
        shard_s = [one(shard) for shard in shards]
    reads, writes = w.docs.reset()
    budget_reads, budget_writes = w.budget_docs.reset()
    return {"tick_wall_s": round(parent_s + max(shard_s, default=0.0), 2),
            "tick_parent_s": round(parent_s, 2), "shards": len(shard_s),
            "tick_slowest_shard_s": round(max(shard_s, default=0.0), 2),
            "tick_sequential_s": round(parent_s + sum(shard_s), 2),
            "vertex_requests_per_tick": w.client.total(),
            "vertex_requests_by_method": dict(w.client.calls),
            "firestore_reads_per_tick": reads, "firestore_writes_per_tick": writes,
            "budget_reads_per_tick": budget_reads, "budget_writes_per_tick": budget_writes,
            "largest_shard_message_bytes": max((len(json.dumps(s)) for s in w.dispatcher.shards),
                                               default=0)}


def _iso(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + f".{int(t % 1 * 1e6):06d}Z"


def report_event(run_id: str, step: int, at: float, key: str) -> CloudEvent:
    """A progress report as spotorch_trainer publishes it, signed with its attempt's key."""
    from spotorch_trainer import contract

    report = {"event_id": f"{run_id}/1/progress/{step}", "kind": "progress", "run_id": run_id,
              "attempt": 1, "step": step, "total_steps": 1_000_000, "time": _iso(at),
              "report_interval_s": REPORT_INTERVAL_S}
    data = json.dumps(report).encode()
    return pubsub_event(data, {"spotorch_source": "trainer", "attempt": "1",
                               contract.ATTR_SIGNATURE: contract.sign_report(key, data)},
                        f"m-{run_id}-{step}")


def attempt_keys(w: World, run_ids: Sequence[str]) -> dict[str, str]:
    """Each run's first attempt's report key: what its job finds in its environment."""
    keys: dict[str, str] = {}
    for run_id in run_ids:
        run, _ = w.deps.runs.load(run_id)
        keys[run_id] = run.attempts[0].report_key if run is not None and run.attempts else ""
    return keys


def trainer_reports(w: World, run_ids: Sequence[str]) -> dict[str, Any]:
    """Progress reports through functions/main.py's on_job_event, as functions-framework gets them."""
    import functions_framework

    local = threading.local()

    def post(event: CloudEvent) -> float:
        if not hasattr(local, "client"):
            local.client = functions_framework.create_app("on_job_event", MAIN,
                                                          "cloudevent").test_client()
        headers, body = to_structured(event)
        t0 = time.perf_counter()
        answer = local.client.post("/", headers=headers, data=body)
        elapsed = time.perf_counter() - t0
        if answer.status_code != 200:
            raise RuntimeError(f"on_job_event answered {answer.status_code}: {answer.data[:200]!r}")
        return elapsed

    def rejected() -> int:
        from spotorch.settings import COLLECTION_REJECTED
        return len(w.docs.inner.client.collection(COLLECTION_REJECTED).get())

    rejected_before = rejected()
    keys = attempt_keys(w, run_ids)
    alone_ids = run_ids[: min(100, len(run_ids))]
    w.docs.reset()
    alone = [post(report_event(r, 10, time.time(), keys[r])) for r in alone_ids]  # one by one
    time.sleep(1.1)  # past the coalescing interval: the burst's reports are all written
    w.docs.reset()
    burst = [report_event(r, 20, time.time(), keys[r]) for r in run_ids]
    t0 = time.perf_counter()
    with ThreadPoolExecutor(EVENT_THREADS) as pool:
        latencies = sorted(pool.map(post, burst))
    burst_s = time.perf_counter() - t0
    reads, writes = w.docs.reset()
    return {"events": len(burst), "events_per_s": round(len(burst) / burst_s, 1),
            "event_latency_alone_p50_s": round(statistics.median(alone), 4),
            "event_latency_burst_p99_s": round(latencies[int(len(latencies) * 0.99) - 1], 4),
            "firestore_reads_per_report": round(reads / len(burst), 2),
            "firestore_writes_per_report": round(writes / len(burst), 2),
            "reports_rejected": rejected() - rejected_before}


def percentile(values: Sequence[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, max(0, int(len(ordered) * q + 0.5) - 1))], 2)


def measure(n: int, log_dir: Path) -> dict[str, Any]:
    from spotorch.adapters.gcp.vertex_budgets import SharedRequestBudget
    from spotorch.local._vertex_quota import QuotaLimits

    with world(log_dir) as w:
        t0 = time.perf_counter()

        def start(i: int) -> None:
            start_run(w.deps, "scale", run_id=f"s{n}-{i:05d}", data_uri=f"gs://b/{i}",
                              snapshot_id=None, reason="scale benchmark")
        with ThreadPoolExecutor(SETUP_THREADS) as pool:
            list(pool.map(start, range(n)))
        setup_s = time.perf_counter() - t0
        w.emulator.quotas = QuotaLimits()  # Vertex's defaults from here on
        budget = SharedRequestBudget(w.budget_docs)
        w.launcher.budget = budget
        time.sleep(61.0)  # the setup's calls leave the quota's one-minute window
        run_tick(w, "warm")  # STARTING -> RUNNING for every run
        steady = run_tick(w, "steady")
        active = w.deps.runs.active()

        # 10% preempted, every job event lost: one tick must find and relaunch them.
        victims = [r.current.job_name for r in active[: max(n // 10, 1)]
                   if r.current and r.current.job_name]
        for name in victims:
            w.emulator.preempt(name)
        time.sleep(w.emulator.grace_s + 1.0)  # SIGTERM, the grace period, then FAILED
        ended_at = time.time()  # latencies count from here: the jobs have ended
        preempt_tick = run_tick(w, "preempted", parallel=True)
        decided, launched, waiting = [], [], 0
        for run in w.deps.runs.active():
            if len(run.attempts) < 2 or run.attempts[-2].ended_at is None:
                continue
            decided.append(run.attempts[-1].created_at - ended_at)
            job = run.attempts[-1].job_name
            if job:
                launched.append(w.emulator.job(job).create_time.timestamp() - ended_at)
            else:
                waiting += 1
        quota_refusals = sum(1 for r in w.deps.runs.active() for h in r.history
                             if h.what.startswith("launch of attempt")
                             and "RESOURCE_EXHAUSTED" in h.reason)
        # Reports last: a run that reported is watched for hangs, and a benchmark's trainer
        # falls silent after its reports (a later tick would cancel it as hung).
        preempted_runs = {r.run_id for r in active[: max(n // 10, 1)]}
        reporting = [r.run_id for r in active if r.run_id not in preempted_runs]
        reports = trainer_reports(w, reporting[:MAX_EVENT_RUNS])
        return {"runs": n, "setup_s": round(setup_s, 1), **steady, **reports,
                "preempted": len(victims), "relaunched_by_one_tick": len(decided),
                "preempt_tick_wall_s": preempt_tick["tick_wall_s"],
                "preempt_tick_sequential_s": preempt_tick["tick_sequential_s"],
                "preempt_tick_vertex_requests": preempt_tick["vertex_requests_per_tick"],
                "preempt_tick_vertex_by_method": preempt_tick["vertex_requests_by_method"],
                "relaunch_p50_s": percentile(decided, 0.5),
                "relaunch_p99_s": percentile(decided, 0.99),
                "launched_in_that_tick": len(launched), "launches_waiting": waiting,
                "launched_p50_s": percentile(launched, 0.5),
                "launched_p99_s": percentile(launched, 0.99),
                "launch_refusals_recorded": quota_refusals,
                "budget_leases": budget.leases_taken, "budget_fallbacks": budget.fallbacks,
                "all_running": all(r.status in (RunStatus.RUNNING, RunStatus.STARTING)
                                   for r in w.deps.runs.active())}


def per_run_hour(result: Mapping[str, Any]) -> dict[str, float]:
    """Firestore operations per run-hour: the tick's share plus the trainer's reports."""
    ticks, reports = 3600.0 / TICK_PERIOD_S, 3600.0 / REPORT_INTERVAL_S
    n = result["runs"]
    tick_reads = (result["firestore_reads_per_tick"] + result["budget_reads_per_tick"]) / n
    tick_writes = (result["firestore_writes_per_tick"] + result["budget_writes_per_tick"]) / n
    return {"firestore_reads_per_run_hour": round(ticks * tick_reads
                                                  + reports * result["firestore_reads_per_report"], 1),
            "firestore_writes_per_run_hour": round(ticks * tick_writes
                                                   + reports * result["firestore_writes_per_report"], 1),
            "tick_reads_per_run_hour": round(ticks * tick_reads, 2),
            "tick_writes_per_run_hour": round(ticks * tick_writes, 2)}


# List prices (USD) used below. None of them is in ../shared/FACTS.md; they are from memory of
# Google's pricing pages (checked against a copy of the Firestore page where said), to be
# replaced by the billing export of a real deployment:
# - Firestore Standard, regional us-central1 (deploy/ puts the database in var.region): reads
#   $0.03 and writes $0.09 per 100,000 (multi-region nam5 is twice that: $0.06 and $0.18, as a
#   copy of Google's page says).
# - Cloud Run functions (2nd gen, request-based billing, tier 1): $0.40 per million invocations,
#   $0.000024 per vCPU-second, $0.0000025 per GiB-second; deploy/ gives 512 MiB.
# - Pub/Sub: $40 per TiB of throughput, publish and each delivery counted apart, at least 1 KB
#   per message (a request of one message).
# - Cloud Logging: $0.50 per GiB ingested; every invocation writes Cloud Run's request log entry
#   (LOG_BYTES_PER_INVOCATION, an estimate) besides spotorch's own lines (INFO and up: the tick's
#   few; a trainer report logs only at DEBUG).
# Free tiers are left out (they do not scale with runs). Vertex AI's training itself is not here:
# that is what the runs cost, not what orchestrating them costs.
PRICES = {"read": 0.03 / 1e5, "write": 0.09 / 1e5, "invocation": 0.40 / 1e6,
          "vcpu_s": 0.000024, "gib_s": 0.0000025, "pubsub_byte": 40.0 / 2 ** 40,
          "logging_byte": 0.50 / 2 ** 30}
FUNCTION_GIB = 0.5
LOG_BYTES_PER_INVOCATION = 1_000
PUBSUB_MIN_BYTES = 1_000


def cost_per_1000_runs_day(result: Mapping[str, Any]) -> dict[str, float]:
    """USD per day for 1,000 runs active all day, each reporting every REPORT_INTERVAL_S.

    Compute: each invocation billed as 1 vCPU and FUNCTION_GIB for the wall time measured here
    (the tick: its parent and every shard; a report: its latency alone)."""
    n = result["runs"]
    scale = 1000 / n
    hours = 24 * 1000
    ops = per_run_hour(result)
    firestore = hours * (ops["firestore_reads_per_run_hour"] * PRICES["read"]
                         + ops["firestore_writes_per_run_hour"] * PRICES["write"])
    ticks = 86400 / TICK_PERIOD_S
    reports = hours * 3600 / REPORT_INTERVAL_S
    tick_invocations = ticks * (1 + result["shards"])
    invocations = (tick_invocations + reports) * PRICES["invocation"]
    per_second = PRICES["vcpu_s"] + FUNCTION_GIB * PRICES["gib_s"]
    compute = (ticks * result["tick_sequential_s"] * scale
               + reports * result["event_latency_alone_p50_s"]) * per_second
    shard_bytes = result["largest_shard_message_bytes"] * result["shards"] * scale
    pubsub = 2 * (reports * PUBSUB_MIN_BYTES + ticks * (PUBSUB_MIN_BYTES + shard_bytes)) \
        * PRICES["pubsub_byte"]
    logging = (tick_invocations + reports) * LOG_BYTES_PER_INVOCATION * PRICES["logging_byte"]
    parts = {"firestore_usd": firestore, "function_compute_usd": compute,
             "invocations_usd": invocations, "pubsub_usd": pubsub, "logging_usd": logging}
    return {**{k: round(v, 2) for k, v in parts.items()}, "total_usd": round(sum(parts.values()), 2)}


def plot(results: Sequence[Mapping[str, Any]], path: Path) -> None:
    """Cost per 1,000 runs per day and tick wall time against N (log N), as an SVG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = sorted(results, key=lambda r: r["runs"])
    ns = [r["runs"] for r in rows]
    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 3.4))
    left.plot(ns, [r["tick_wall_s"] for r in rows], "o-", label="tick wall (parent + slowest shard)")
    left.plot(ns, [r["tick_sequential_s"] for r in rows], "s--", label="all shards one after another")
    left.set(xscale="log", yscale="log", xlabel="active runs N", ylabel="seconds",
             title="Steady-state tick")
    left.legend(fontsize=7)
    costs = [r["cost_per_1000_runs_day"] for r in rows]
    bottom = [0.0] * len(rows)
    for key, label in (("firestore_usd", "Firestore"), ("invocations_usd", "invocations"),
                       ("function_compute_usd", "compute"), ("logging_usd", "Logging"),
                       ("pubsub_usd", "Pub/Sub")):
        values = [c[key] for c in costs]
        right.bar([str(n) for n in ns], values, bottom=bottom, label=label)
        bottom = [b + v for b, v in zip(bottom, values, strict=True)]
    right.set(xlabel="active runs N (measured at)", ylabel="USD per 1,000 runs per day",
              title="Orchestration cost (list prices)")
    right.legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="svg", metadata={"Date": None})
    plt.close(fig)


def summary(result: Mapping[str, Any]) -> str:
    n, cost, hour = result["runs"], result["cost_per_1000_runs_day"], result["per_run_hour"]
    return (f"N={n}: tick {result['tick_wall_s']} s (parent {result['tick_parent_s']} s + slowest "
            f"of {result['shards']} shards {result['tick_slowest_shard_s']} s; one after another "
            f"{result['tick_sequential_s']} s), {result['vertex_requests_per_tick']} Vertex "
            f"requests/tick (target <= {n // 50 + 1}), Firestore "
            f"{result['firestore_reads_per_tick']} reads / {result['firestore_writes_per_tick']} "
            f"writes per tick (+{result['budget_reads_per_tick']}/{result['budget_writes_per_tick']}"
            f" for the budget); per run-hour {hour['firestore_reads_per_run_hour']} reads / "
            f"{hour['firestore_writes_per_run_hour']} writes; trainer reports "
            f"{result['events_per_s']} events/s ({result['events']} runs at once, "
            f"{EVENT_THREADS} threads), {result['event_latency_alone_p50_s']} s alone; "
            f"{result['preempted']} preempted with events lost: {result['relaunched_by_one_tick']}"
            f" relaunches decided by one tick ({result['preempt_tick_wall_s']} s; p50 "
            f"{result['relaunch_p50_s']} s, p99 {result['relaunch_p99_s']} s after the jobs "
            f"ended), {result['launched_in_that_tick']} jobs created in it (p50 "
            f"{result['launched_p50_s']} s, p99 {result['launched_p99_s']} s), "
            f"{result['launches_waiting']} waiting for the next tick; cost/1000 runs/day "
            f"${cost['total_usd']} (setup {result['setup_s']} s)")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, action="append", help="N (repeatable; default 100, 1000)")
    parser.add_argument("--json", action="store_true", help="print one JSON object per N")
    parser.add_argument("--results", type=Path,
                        help="a JSON file of results by N: this run's are merged into it")
    parser.add_argument("--plot", type=Path, help="write the SVG plot (of --results if given)")
    args = parser.parse_args(argv)
    stored: dict[str, Any] = {}
    if args.results and args.results.exists():
        stored = json.loads(args.results.read_text())
    for n in args.runs or [100, 1000]:
        with tempfile.TemporaryDirectory(prefix=f"scale-{n}-") as tmp:
            result = measure(n, Path(tmp))
        result["per_run_hour"] = per_run_hour(result)
        result["cost_per_1000_runs_day"] = cost_per_1000_runs_day(result)
        stored[str(n)] = result
        if args.results:
            args.results.write_text(json.dumps(stored, indent=1, sort_keys=True) + "\n")
        print(json.dumps(result) if args.json else summary(result), flush=True)
    if args.plot:
        plot(list(stored.values()), args.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
