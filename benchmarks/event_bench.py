"""Event handling against the emulators: throughput, Firestore round trips per event, duplicate storms.

    .venv/bin/python benchmarks/event_bench.py [--runs 20] [--events 600] [--storm 1000] [--threads 8]

Starts its own Firestore and Pub/Sub emulators. Events go through the same decode-and-delegate
code the Cloud Functions run (spotorch.entrypoints.functions), into the Firestore-backed store,
publishing to the Pub/Sub emulator; launches go to the in-memory launcher, which counts job creations.
"""

from __future__ import annotations

import argparse
import base64
import dataclasses
import json
import os
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO / "shared"), str(REPO / "trainer")]

from cloudevents.http import CloudEvent

from spotorch.adapters.gcp.firestore import FirestoreDocumentStore
from spotorch.adapters.gcp.pubsub import PubSubPublisher
from spotorch.adapters.memory.twins import InMemoryCheckpoints, InMemoryLauncher, InMemoryObjectStore
from spotorch.app import bootstrap
from spotorch.app.deps import Deps, JobOwners
from spotorch.app.job_events import job_changed
from spotorch.app.run_store import DocumentRunStore
from spotorch.app.runs import start_run
from spotorch.core.model import JobPhase
from spotorch.core.pipeline import EscalationKind, OnActiveRun, Pipeline, RecoveryPolicy, Trigger
from spotorch.entrypoints import functions as entry
from spotorch.entrypoints.wiring import SystemClock
from spotorch.local.emulators import running
from spotorch.ports.store import ConflictError


def message(payload: dict[str, Any], attributes: dict[str, str], event_id: str) -> CloudEvent:
    return CloudEvent({"type": "google.cloud.pubsub.topic.v1.messagePublished", "id": event_id,
                       "source": "//pubsub.googleapis.com/projects/p/topics/t"},
                      {"message": {"data": base64.b64encode(json.dumps(payload).encode()).decode(),
                                   "attributes": attributes, "messageId": event_id},
                       "subscription": "projects/p/subscriptions/s"})


def progress_event(run_id: str, step: int, key: str) -> CloudEvent:
    """A progress report as spotorch_trainer publishes it, signed with its attempt's key."""
    from spotorch_trainer import contract

    report = {"event_id": f"{run_id}/1/progress/{step}", "kind": "progress", "run_id": run_id,
              "attempt": 1, "step": step, "total_steps": 100000,
              "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    signature = contract.sign_report(key, json.dumps(report).encode())  # message() dumps alike
    return message(report, {"spotorch_source": "trainer", "attempt": "1",
                            contract.ATTR_SIGNATURE: signature}, f"m-{run_id}-{step}")


def build(project: str) -> tuple[Deps, FirestoreDocumentStore, InMemoryLauncher]:
    from google.cloud import pubsub_v1

    topic = f"projects/{project}/topics/spotorch-events"
    pubsub_v1.PublisherClient().create_topic(name=topic)
    docs = FirestoreDocumentStore(project=project)
    launcher = InMemoryLauncher()
    pipeline = Pipeline(name="bench", trigger=Trigger(bucket="b", on_active_run=OnActiveRun.PARALLEL), checkpoint_uri="gs://c/bench",
                        output_uri="gs://m/bench",
                        recovery=RecoveryPolicy(escalation=EscalationKind.NEVER))
    deps = bootstrap.deps(runs=DocumentRunStore(docs), docs=docs, launcher=launcher,
                checkpoints=InMemoryCheckpoints(), publisher=PubSubPublisher(topic),
                clock=SystemClock(), pipelines={"bench": pipeline},
                objects=InMemoryObjectStore())
    return deps, docs, launcher


def bench_throughput(deps: Deps, docs: FirestoreDocumentStore, runs: int, events: int,
                     threads: int) -> dict[str, Any]:
    run_ids = [f"bench-run-{i}" for i in range(runs)]
    for run_id in run_ids:
        start_run(deps, "bench", run_id=run_id, data_uri="gs://b/x/", snapshot_id=run_id,
                  reason="benchmark")
    keys = {}
    for run_id in run_ids:  # what each run's job finds in its environment
        run, _ = deps.runs.load(run_id)
        keys[run_id] = run.attempts[0].report_key if run is not None else ""
    # Spread progress reports over the runs, as many trainers reporting at once would.
    work = [progress_event(run_ids[i % runs], i + 1, keys[run_ids[i % runs]])
            for i in range(events)]
    latencies: list[float] = []
    lock = threading.Lock()
    docs.round_trips = 0

    def handle(event: CloudEvent) -> None:
        t0 = time.perf_counter()
        entry.job_event(event)
        with lock:
            latencies.append(time.perf_counter() - t0)

    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=threads) as pool:
        list(pool.map(handle, work))
    elapsed = time.perf_counter() - t0
    latencies.sort()
    return {"events": events, "runs": runs, "threads": threads, "seconds": round(elapsed, 2),
            "events_per_s": round(events / elapsed, 1),
            "p50_ms": round(latencies[len(latencies) // 2] * 1000, 1),
            "p95_ms": round(latencies[int(len(latencies) * 0.95)] * 1000, 1),
            "firestore_round_trips_per_event": round(docs.round_trips / events, 2)}


def job_event(run_id: str, job: str, line: str, n: int) -> CloudEvent:
    """A job's service line as a Cloud Logging sink exports it: job id and text, nothing else."""
    project, job_id = job.split("/")[1], job.rsplit("/", 1)[1]
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    entry_ = {"logName": f"projects/{project}/logs/ml.googleapis.com%2F{job_id}",
              "resource": {"type": "ml_job", "labels": {"job_id": job_id, "project_id": "bench-p",
                                                        "task_name": "service"}},
              "textPayload": line, "timestamp": stamp, "receiveTimestamp": stamp,
              "severity": "INFO", "insertId": f"{run_id}-{n}"}
    data = json.dumps(entry_).encode()
    return CloudEvent({"type": "google.cloud.pubsub.topic.v1.messagePublished",
                       "id": f"j-{run_id}-{n}", "source": "//pubsub.googleapis.com/p"},
                      {"message": {"data": base64.b64encode(data).decode(),
                                   "attributes": {"logging.googleapis.com/timestamp": stamp},
                                   "messageId": f"j-{run_id}-{n}"}})


def bench_job_events(deps: Deps, docs: FirestoreDocumentStore, launcher: InMemoryLauncher,
                     runs: int, threads: int, prefix: str = "bench-job") -> dict[str, Any]:
    """Job state events that change runs and publish: RUNNING, then SUCCEEDED, for many runs."""
    ids = [f"{prefix}-{i}" for i in range(runs)]
    for run_id in ids:
        start_run(deps, "bench", run_id=run_id, data_uri="gs://b/j/", snapshot_id=run_id,
                  reason="benchmark")
    jobs = {run_id: launcher.job_of(run_id, 1) for run_id in ids}
    # The job-event function is another deployment than the one that launched: its instances
    # have not seen the launches, so a job's first line reads the job record (its later lines
    # find the owner in the instance's cache, as here where one process handles them all).
    line_deps = dataclasses.replace(deps, owners=JobOwners())
    entry.deps = lambda: line_deps  # type: ignore[assignment]
    for job in jobs.values():  # what GetCustomJob answers when a terminal line is confirmed
        launcher.set_status(job, JobPhase.SUCCEEDED)
    work = [job_event(r, jobs[r], "Job is running.", 1) for r in ids] + \
        [job_event(r, jobs[r], "Job completed successfully.", 2) for r in ids]
    docs.round_trips = 0
    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=threads) as pool:
        list(pool.map(entry.job_event, work[:runs]))  # every job runs before it ends
        list(pool.map(entry.job_event, work[runs:]))
    elapsed = time.perf_counter() - t0
    entry.deps = lambda: deps  # type: ignore[assignment]
    done = sum(1 for r in ids if getattr(deps.runs.load(r)[0], "status", None) == "SUCCEEDED")
    return {"events": len(work), "seconds": round(elapsed, 2),
            "events_per_s": round(len(work) / elapsed, 1), "runs_succeeded": done,
            "firestore_round_trips_per_event": round(docs.round_trips / len(work), 2)}


def bench_state_changes(deps: Deps, docs: FirestoreDocumentStore,
                        launcher: InMemoryLauncher) -> dict[str, Any]:
    """Round trips of events that decide and carry out side effects (launch, publish)."""
    start_run(deps, "bench", run_id="bench-sc", data_uri="gs://b/y/", snapshot_id="sc",
              reason="benchmark")
    job = launcher.job_of("bench-sc", 1)
    cases = {}
    for name, phase in (("running", JobPhase.RUNNING), ("preempted", JobPhase.FAILED)):
        from spotorch.core.model import FailureClass

        failure = FailureClass.PREEMPTED if phase is JobPhase.FAILED else None
        status = launcher.set_status(job, phase, failure=failure)
        docs.round_trips = 0
        job_changed(deps, "bench-sc", 1, status, event_id=f"sc-{name}")
        cases[name] = docs.round_trips
        docs.round_trips = 0
        job_changed(deps, "bench-sc", 1, status, event_id=f"sc-{name}")
        cases[f"{name}_redelivered"] = docs.round_trips
    return cases


def bench_storm(deps: Deps, launcher: InMemoryLauncher, storm: int, threads: int) -> dict[str, Any]:
    """A preemption event delivered `storm` times (several ids, many threads): one relaunch only."""
    start_run(deps, "bench", run_id="bench-storm", data_uri="gs://b/z/", snapshot_id="storm",
              reason="benchmark")
    job = launcher.job_of("bench-storm", 1)
    from spotorch.core.model import FailureClass

    status = launcher.set_status(job, JobPhase.FAILED, failure=FailureClass.PREEMPTED)
    before = launcher.created
    t0 = time.perf_counter()
    redelivered = 0

    def deliver(i: int) -> None:
        nonlocal redelivered
        while True:  # Pub/Sub redelivers what the function failed (raised) on
            try:
                job_changed(deps, "bench-storm", 1, status, event_id=f"storm-{i % 25}")
                return
            except ConflictError:
                redelivered += 1

    with ThreadPoolExecutor(max_workers=threads) as pool:
        list(pool.map(deliver, range(storm)))
    elapsed = time.perf_counter() - t0
    run, _ = deps.runs.load("bench-storm")
    assert run is not None
    return {"duplicates": storm, "seconds": round(elapsed, 2), "redelivered": redelivered,
            "launches": launcher.created - before, "extra_launches": launcher.created - before - 1,
            "attempts": len(run.attempts), "preemptions_counted": run.counters.preemptions}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--events", type=int, default=600)
    parser.add_argument("--storm", type=int, default=1000)
    parser.add_argument("--threads", type=int, default=8)
    # Job-state events: two per run (RUNNING, then SUCCEEDED), after a warm-up of --warm-runs
    # runs that is reported apart (the emulator's JIT and the clients' channels are cold at
    # first: 100 runs alone read 20-40% below the steady rate on this machine).
    parser.add_argument("--job-runs", type=int, default=300)
    parser.add_argument("--warm-runs", type=int, default=50)
    args = parser.parse_args()
    project = "spotorch-bench"
    with running(project, Path(tempfile.mkdtemp()), gcs=False) as stack:
        os.environ.update(stack.env())
        deps, docs, launcher = build(project)
        entry.deps = lambda: deps  # type: ignore[assignment]
        results: dict[str, Any] = {
            "throughput": bench_throughput(deps, docs, args.runs, args.events, args.threads),
            "job_state_events_warm_up": bench_job_events(deps, docs, launcher, args.warm_runs,
                                                         args.threads, prefix="bench-warm"),
            "job_state_events": bench_job_events(deps, docs, launcher, args.job_runs,
                                                 args.threads),
            "round_trips_by_event": bench_state_changes(deps, docs, launcher),
            "duplicate_storm": bench_storm(deps, launcher, args.storm, args.threads),
            "cpus": os.cpu_count(),
        }
    print(json.dumps(results, indent=2))
    ok = (results["throughput"]["events_per_s"] >= 50
          and results["job_state_events"]["events_per_s"] >= 50
          and results["duplicate_storm"]["extra_launches"] == 0)
    print(f"targets: >=50 events/s: trainer reports {results['throughput']['events_per_s']}, "
          f"job-state lines {results['job_state_events']['events_per_s']}; "
          f"extra launches in storm: {results['duplicate_storm']['extra_launches']}; "
          f"round trips/event: {results['throughput']['firestore_round_trips_per_event']}",
          file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
