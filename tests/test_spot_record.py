"""The shared record of Spot per region and shape (issue 18): what runs observe ranks regions."""

from __future__ import annotations

from dataclasses import replace

from fakes import fake_deps
from spotorch.adapters.memory.twins import InMemoryLauncher, ManualClock
from spotorch.app.deps import Deps
from spotorch.app.job_events import job_changed
from spotorch.app.runs import start_run
from spotorch.app.spot_record import TTL_S, Seen, SpotRecord, doc_key
from spotorch.app.tick import tick
from spotorch.core.model import FailureClass, JobPhase, JobStatus, Run
from spotorch.core.pipeline import (
    Capacity,
    EscalationKind,
    JobTemplate,
    Pipeline,
    RecoveryPolicy,
    Trigger,
    WorkerPool,
)
from spotorch.settings import COLLECTION_SPOT_REGIONS

REGIONS = ("us-central1", "europe-west4", "us-east1")


def pipeline(name: str) -> Pipeline:
    pool = WorkerPool(machine_type="n1-standard-8", image_uri="img")
    return Pipeline(name=name, trigger=Trigger(bucket="b"), checkpoint_uri="gs://c/p",
                    output_uri="gs://m/p", job=JobTemplate(worker_pools=(pool,), regions=REGIONS),
                    recovery=RecoveryPolicy(escalation=EscalationKind.NEVER,
                                            stockout_wait_s=900.0, backoff_base_s=1.0,
                                            backoff_cap_s=1.0))


def parts(deps: Deps) -> tuple[InMemoryLauncher, ManualClock]:
    assert isinstance(deps.launcher, InMemoryLauncher) and isinstance(deps.clock, ManualClock)
    return deps.launcher, deps.clock


def start(deps: Deps, name: str, run_id: str) -> Run:
    run = start_run(deps, name, run_id=run_id, data_uri="gs://b/d/", snapshot_id=run_id,
                    reason="t")
    assert run is not None
    return run


def test_a_stockout_seen_by_one_run_sends_the_next_run_elsewhere_first() -> None:
    deps = fake_deps(pipeline("a"), pipeline("b"))
    launcher, clock = parts(deps)
    first = start(deps, "a", "a1")
    assert first.attempts[0].region == "us-central1"  # nothing known yet: the pipeline's order
    clock.advance(1000.0)  # queued past the stockout wait: cancelled
    tick(deps)
    tick(deps)
    doc, _ = deps.docs.get(COLLECTION_SPOT_REGIONS, doc_key(
        "us-central1", "n1-standard-8", first.bucket, int(clock.t // 86400)))
    assert doc is not None and doc["shape"] == "n1-standard-8"
    ((observed,),) = [list(doc["observed"].values())]
    assert observed >= 900.0 and sum(doc["available"].values()) == 0.0
    assert sum(doc["preemptions"].values()) == 0
    deps.spot.forget()
    second = start(deps, "b", "b1")  # another pipeline, the same shape
    assert second.attempts[0].region != "us-central1"
    assert launcher.jobs  # the record is advice: launches go on as before


def test_capacity_seen_running_ranks_a_region_first() -> None:
    deps = fake_deps(pipeline("a"), pipeline("b"))
    launcher, clock = parts(deps)
    run = start(deps, "a", "a1")
    # Its first region stocks out; the second gives it Spot for two hours without preemption.
    clock.advance(1000.0)
    tick(deps)
    tick(deps)
    clock.advance(5.0)
    tick(deps)
    loaded, _ = deps.runs.load("a1")
    assert loaded is not None
    run = loaded
    assert run.current is not None
    assert run.current.region == "europe-west4"
    launcher.set_status(run.current.job_name or "", JobPhase.RUNNING, start_time=clock.t)
    tick(deps)
    clock.advance(2 * 3600.0)
    launcher.set_status(run.current.job_name or "", JobPhase.SUCCEEDED,
                        start_time=clock.t - 7200.0, end_time=clock.t)
    tick(deps)
    deps.spot.forget()
    assert start(deps, "b", "b1").attempts[0].region == "europe-west4"


def test_observations_older_than_the_ttl_are_forgotten() -> None:
    deps = fake_deps(pipeline("a"), pipeline("b"))
    _, clock = parts(deps)
    start(deps, "a", "a1")
    clock.advance(1000.0)
    tick(deps)
    tick(deps)
    clock.advance(TTL_S + 3600.0)
    deps.spot.forget()
    assert start(deps, "b", "b1").attempts[0].region == "us-central1"


def test_the_ranking_is_cached_per_instance_and_a_broken_record_is_ignored() -> None:
    deps = fake_deps(pipeline("a"))
    record = SpotRecord(cache_s=60.0)
    now = 1_800_000_000.0
    hour, day = str(int(now // 3600)), int(now // 86400)
    deps.docs.put(COLLECTION_SPOT_REGIONS, doc_key("us-central1", "n1-standard-8", 3, day),
                  {"observed": {"nonsense": "x", hour: 3600.0}, "available": {hour: 0.0},
                   "preemptions": "not a map"}, None)
    order = record.order(deps.docs, "n1-standard-8", REGIONS, now)
    assert order[-1] == "us-central1"
    deps.docs.put(COLLECTION_SPOT_REGIONS, doc_key("europe-west4", "n1-standard-8", 5, day),
                  {"observed": {hour: 7200.0}, "available": {hour: 0.0}}, None)
    assert record.order(deps.docs, "n1-standard-8", REGIONS, now + 30) == order  # cached
    assert record.order(deps.docs, "n1-standard-8", REGIONS, now + 61)[-1] == "europe-west4"


def test_a_single_region_pipeline_reads_no_record() -> None:
    single = replace(pipeline("a"), job=JobTemplate(
        worker_pools=(WorkerPool(machine_type="n1-standard-8", image_uri="img"),),
        regions=("us-central1",)))
    deps = fake_deps(single)
    reads: list[str] = []
    original = deps.docs.get

    def counting(collection: str, key: str):  # type: ignore[no-untyped-def]
        reads.append(collection)
        return original(collection, key)

    deps.docs.get = counting  # type: ignore[method-assign]
    start(deps, "a", "a1")
    assert COLLECTION_SPOT_REGIONS not in reads
    assert Capacity.SPOT  # (the launch itself is the ordinary one)


def test_the_record_of_one_region_is_spread_over_shards_and_read_as_one() -> None:
    deps = fake_deps(pipeline("a"))
    record = SpotRecord()
    now = 1_800_000_000.0
    for shard in range(16):  # runs of many buckets end Spot attempts at once
        adds = record.additions("n1-standard-8", [Seen("us-central1", observed_s=100.0,
                                                       available_s=40.0, preemptions=1)], now,
                                shard=shard)
        deps.docs.put("ended", f"run-{shard}", {"shard": shard}, None, adds)
    keys = {doc_key("us-central1", "n1-standard-8", s, int(now // 86400)) for s in range(16)}
    assert len(keys) == 8  # at most SHARDS documents take the writes
    (total,) = record.records(deps.docs, "n1-standard-8", ("us-central1",), now)
    assert (total.observed_s, total.available_s, total.preemptions) == (1600.0, 640.0, 16)


def preempted_after_ten_minutes() -> tuple[Deps, JobStatus]:
    """Run a1 of pipeline a, its Spot attempt 1 seen running, then preempted 600 s later (the
    status Vertex gives; not yet told to the run)."""
    deps = fake_deps(pipeline("a"))
    launcher, clock = parts(deps)
    start(deps, "a", "a1")
    job = launcher.job_of("a1", 1)
    launcher.set_status(job, JobPhase.RUNNING)
    tick(deps)
    clock.advance(600.0)
    return deps, launcher.set_status(job, JobPhase.FAILED, failure=FailureClass.PREEMPTED)


def test_an_ended_spot_attempt_is_counted_once_in_the_runs_own_commit() -> None:
    """The observation commits with the run's change (no write of its own): a lost race and a
    redelivered event do not count it twice."""
    from spotorch.adapters.memory.twins import InMemoryDocumentStore
    from spotorch.ports.store import ConflictError
    from spotorch.settings import COLLECTION_RUNS

    deps, preempted = preempted_after_ten_minutes()
    _, clock = parts(deps)
    docs = deps.docs
    assert isinstance(docs, InMemoryDocumentStore)
    put = docs.put
    races = [1]
    record_writes: list[str] = []  # "run collection <- record collection", per put carrying them

    def losing_once(collection, key, data, version, adds=()):  # type: ignore[no-untyped-def]
        record_writes.extend(f"{collection} <- {a.collection}" for a in adds)
        if collection == COLLECTION_RUNS and adds and races[0]:
            races[0] -= 1
            current, _ = docs.get(collection, key)
            assert current is not None
            put(collection, key, current, version)  # another writer changes the run first
            raise ConflictError("simulated race")
        return put(collection, key, data, version, adds)

    docs.put = losing_once  # type: ignore[method-assign]
    job_changed(deps, "a1", 1, preempted, event_id="e-preempted")
    job_changed(deps, "a1", 1, preempted, event_id="e-preempted")  # redelivered
    job_changed(deps, "a1", 1, preempted, event_id="e-other-id")  # the same news, another id
    assert races == [0]
    # The record's write went with the run's commit: in the lost race, then in the retry.
    assert record_writes == [f"{COLLECTION_RUNS} <- {COLLECTION_SPOT_REGIONS}"] * 2
    deps.spot.forget()  # the instance's cached ranking, read at launch
    (total,) = deps.spot.records(deps.docs, "n1-standard-8", ("us-central1",), clock.t)
    assert total.preemptions == 1 and total.available_s == total.observed_s > 0


def test_a_spot_record_that_cannot_be_written_never_holds_up_the_run() -> None:
    deps, preempted = preempted_after_ten_minutes()

    def broken(*args, **kwargs):  # type: ignore[no-untyped-def]
        raise RuntimeError("a bug in the record (simulated)")

    deps.spot.additions = broken  # type: ignore[method-assign]
    run = job_changed(deps, "a1", 1, preempted, event_id="e-preempted")
    assert run.counters.preemptions == 1 and len(run.attempts) == 2  # relaunched all the same
