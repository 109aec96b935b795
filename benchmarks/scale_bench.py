"""Scale: N active runs reconciled by the tick on the emulators, within Vertex AI's quotas.

    .venv/bin/python benchmarks/scale_bench.py --runs 1000 [--runs 100 ...] [--json]

The Firestore and Pub/Sub emulators, and the Vertex AI emulator in its synthetic-job mode (no
worker process per job: a job runs until preempted or for an hour), which enforces Vertex's
default quotas (600 resource-management requests and 60 job submissions per minute per region)
while the tick is measured. Setting up N runs needs N job submissions, more than a minute's
quota: the setup runs with the quotas lifted, the measurement with them on.

Printed per N: the tick's wall time with every job RUNNING (a steady-state tick), Vertex requests
per tick (counted on the client side), Firestore reads and writes per tick, and a tick after 10%
of the jobs were preempted with every job event lost: how many runs were relaunched by that one
tick and how long after the preemption (p50/p99 from the jobs' end, the tick period of the
deployment not included: without the job event a preemption waits up to one period for the tick,
TICK_PERIOD_S).
A cost model per 1,000 runs per day at list prices follows, stated with its assumptions.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
for extra in (REPO / "shared", REPO / "trainer"):
    sys.path.insert(0, str(extra))

from spotorch import service  # noqa: E402
from spotorch.domain import RunStatus  # noqa: E402
from spotorch.local.emulators import running  # noqa: E402
from spotorch.memory import InMemoryCheckpoints, InMemoryObjectStore, InMemoryPublisher  # noqa: E402
from spotorch.pipeline import (  # noqa: E402
    EscalationKind,
    JobTemplate,
    OnActiveRun,
    Pipeline,
    RecoveryPolicy,
    Trigger,
    WorkerPool,
)
from spotorch.service import Deps  # noqa: E402
from spotorch.store import DocumentRunStore  # noqa: E402
from spotorch.wiring import SystemClock  # noqa: E402

PROJECT = "spotorch-scale"
REGION = "us-central1"
TICK_PERIOD_S = 60.0  # the deployment's Cloud Scheduler period (deploy/variables.tf)


class CountingDocs:
    """A DocumentStore that counts what it asks of Firestore (reads include query results)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.reads = self.writes = 0

    def get(self, collection: str, key: str) -> Any:
        self.reads += 1
        return self.inner.get(collection, key)

    def put(self, collection: str, key: str, data: Mapping[str, Any], version: Any) -> Any:
        self.writes += 1
        return self.inner.put(collection, key, data, version)

    def query(self, collection: str, field_name: str, value: Any) -> Any:
        found = self.inner.query(collection, field_name, value)
        self.reads += max(len(found), 1)  # Firestore bills a query at least one read
        return found


class CountingClient:
    """Wraps the real aiplatform_v1 JobServiceClient and counts its requests by method.

    A list call is counted once per page fetched (the pager fetches lazily)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.calls: dict[str, int] = {}

    def _count(self, method: str) -> None:
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


@contextmanager
def world(log_dir: Path) -> Iterator[tuple[Any, Any]]:
    import os

    from spotorch.local._vertex_quota import QuotaLimits
    from spotorch.local.vertex_emulator import VertexEmulator

    with running(PROJECT, log_dir, gcs=False) as emulators:
        os.environ.update(emulators.env())
        emulator = VertexEmulator(PROJECT, synthetic_run_s=3600.0, job_events_topic=None,
                                  queued_s=0.05, pending_s=0.05, tick_s=0.5, grace_s=1.0,
                                  workdir=log_dir / "vertex", quotas=QuotaLimits.unlimited())
        emulator.start()
        try:
            yield emulators, emulator
        finally:
            emulator.stop()


def build(emulator: Any) -> tuple[Deps, CountingDocs, CountingClient]:
    import grpc
    from google.cloud import aiplatform_v1 as v1
    from google.cloud.aiplatform_v1.services.job_service.transports.grpc import (
        JobServiceGrpcTransport,
    )

    from spotorch.budget import CRUD, SUBMIT, RequestBudget
    from spotorch.store_firestore import FirestoreDocumentStore
    from spotorch.vertex import RetryPolicy, VertexJobLauncher

    docs = CountingDocs(FirestoreDocumentStore(project=PROJECT))
    channel = grpc.insecure_channel(emulator.address)
    client = CountingClient(v1.JobServiceClient(transport=JobServiceGrpcTransport(channel=channel)))
    launcher = VertexJobLauncher(PROJECT, client_factory=lambda region: client, regions=(REGION,),
                                 retry=RetryPolicy(attempts=3, base_s=0.2),
                                 budget=RequestBudget({CRUD: 1e9, SUBMIT: 1e9}))
    pool = WorkerPool(command=("python3", "-c", "pass"))
    pipeline = Pipeline(name="scale", trigger=Trigger(bucket="b", on_active_run=OnActiveRun.PARALLEL),
                        checkpoint_uri="gs://c/scale", output_uri="gs://m/scale",
                        job=JobTemplate(worker_pools=(pool,), regions=(REGION,)),
                        recovery=RecoveryPolicy(escalation=EscalationKind.NEVER,
                                                max_preemptions=100))
    deps = Deps(runs=DocumentRunStore(docs), docs=docs, launcher=launcher,
                checkpoints=InMemoryCheckpoints(), publisher=InMemoryPublisher(),
                clock=SystemClock(), pipelines={"scale": pipeline}, objects=InMemoryObjectStore())
    return deps, docs, client


def measure(n: int, log_dir: Path) -> dict[str, Any]:
    from spotorch.local._vertex_quota import QuotaLimits

    with world(log_dir) as (_, emulator):
        deps, docs, client = build(emulator)
        t0 = time.perf_counter()
        for i in range(n):
            service.start_run(deps, "scale", run_id=f"s{n}-{i:05d}", data_uri=f"gs://b/{i}",
                              snapshot_id=None, reason="scale benchmark")
        setup_s = time.perf_counter() - t0
        emulator.quotas = QuotaLimits()  # Vertex's defaults from here on
        time.sleep(61.0)  # the setup's calls leave the quota's one-minute window
        service.reconcile_runs(deps)  # STARTING -> RUNNING for every run
        client.calls.clear()
        docs.reads = docs.writes = 0
        t0 = time.perf_counter()
        touched = service.reconcile_runs(deps)
        tick_s = time.perf_counter() - t0
        steady = {"tick_wall_s": round(tick_s, 2), "vertex_requests_per_tick": client.total(),
                  "vertex_requests_by_method": dict(client.calls),
                  "firestore_reads_per_tick": docs.reads, "firestore_writes_per_tick": docs.writes,
                  "runs_reconciled": len(touched)}
        # 10% preempted, every job event lost: one tick must relaunch them all.
        victims = [r.current.job_name for r in deps.runs.active()[: max(n // 10, 1)]
                   if r.current and r.current.job_name]
        preempted_at = time.time()
        for name in victims:
            emulator.preempt(name)
        time.sleep(emulator.grace_s + 1.0)  # SIGTERM, the grace period, then FAILED
        preempted_at = time.time()  # relaunch latency counts from here: the jobs have ended
        client.calls.clear()
        t0 = time.perf_counter()
        service.reconcile_runs(deps)
        preempt_tick_s = time.perf_counter() - t0
        relaunch = []  # from the end of the preempted attempt (Vertex's FAILED) to the relaunch
        for run in deps.runs.active():
            if len(run.attempts) > 1 and run.attempts[-2].ended_at is not None:
                relaunch.append(run.attempts[-1].created_at - preempted_at)
        relaunch.sort()
        quota_errors = sum(1 for r in deps.runs.active() for h in r.history
                           if h.what.startswith("launch of attempt")
                           and "RESOURCE_EXHAUSTED" in h.reason)
        return {"runs": n, "setup_s": round(setup_s, 1), **steady,
                "preempted": len(victims), "relaunched_by_one_tick": len(relaunch),
                "preempt_tick_wall_s": round(preempt_tick_s, 2),
                "preempt_tick_vertex_requests": client.total(),
                "relaunch_p50_s": round(statistics.median(relaunch), 2) if relaunch else None,
                "relaunch_p99_s": round(relaunch[int(len(relaunch) * 0.99) - 1 if len(relaunch) > 1
                                                 else 0], 2) if relaunch else None,
                "quota_refusals_seen": quota_errors,
                "all_running": all(r.status in (RunStatus.RUNNING, RunStatus.STARTING)
                                   for r in deps.runs.active())}


# List prices (USD), November 2026 pages: Firestore reads $0.06 / 100k, writes $0.18 / 100k;
# Cloud Functions (2nd gen, Cloud Run) invocations $0.40 / million, CPU $0.000024 / vCPU-s,
# memory $0.0000025 / GiB-s. Assumptions: one tick a minute, each run lives 24 h, a tick
# invocation runs 1 vCPU / 512 MiB for its wall time, trainer reports 1 per minute per run.
PRICES = {"read": 0.06 / 1e5, "write": 0.18 / 1e5, "invocation": 0.40 / 1e6,
          "vcpu_s": 0.000024, "gib_s": 0.0000025}


def cost_per_1000_runs_day(result: Mapping[str, Any]) -> dict[str, float]:
    n = result["runs"]
    ticks = 24 * 60
    scale = 1000 / n
    reads = result["firestore_reads_per_tick"] * ticks * scale
    writes = result["firestore_writes_per_tick"] * ticks * scale
    compute = result["tick_wall_s"] * ticks * scale * (PRICES["vcpu_s"] + 0.5 * PRICES["gib_s"])
    reports = 1000 * 24 * 60  # trainer reports: one read and one write each, one invocation
    firestore = (reads + reports) * PRICES["read"] + (writes + reports) * PRICES["write"]
    invocations = (ticks + reports) * PRICES["invocation"]
    return {"firestore_usd": round(firestore, 2), "function_compute_usd": round(compute, 2),
            "invocations_usd": round(invocations, 2),
            "total_usd": round(firestore + compute + invocations, 2)}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, action="append", help="N (repeatable; default 100, 1000)")
    parser.add_argument("--json", action="store_true", help="print one JSON object per N")
    args = parser.parse_args(argv)
    results = []
    for n in args.runs or [100, 1000]:
        with tempfile.TemporaryDirectory(prefix=f"scale-{n}-") as tmp:
            result = measure(n, Path(tmp))
        result["cost_per_1000_runs_day"] = cost_per_1000_runs_day(result)
        results.append(result)
        if args.json:
            print(json.dumps(result))
        else:
            print(f"N={n}: tick {result['tick_wall_s']} s, {result['vertex_requests_per_tick']} "
                  f"Vertex requests/tick (target <= {n // 50 + 1}), Firestore "
                  f"{result['firestore_reads_per_tick']} reads / {result['firestore_writes_per_tick']}"
                  f" writes per tick; {result['preempted']} preempted with events lost: "
                  f"{result['relaunched_by_one_tick']} relaunched by one tick "
                  f"({result['preempt_tick_wall_s']} s, p50 {result['relaunch_p50_s']} s, "
                  f"p99 {result['relaunch_p99_s']} s after the preemption); quota refusals "
                  f"{result['quota_refusals_seen']}; cost/1000 runs/day "
                  f"${result['cost_per_1000_runs_day']['total_usd']} (setup {result['setup_s']} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
