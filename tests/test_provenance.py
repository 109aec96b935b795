"""Provenance (spotorch.core.provenance) and reruns (spotorch.app.runs.rerun_run), in memory."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from fakes import fake_deps
from spotorch.adapters.memory.twins import InMemoryLauncher, InMemoryObjectStore, InMemoryPublisher
from spotorch.app.arrivals import start_snapshot_run
from spotorch.app.deps import Deps, NotRetryable, UnknownRun
from spotorch.app.job_events import job_changed
from spotorch.app.runs import rerun_run, run_summary, start_run
from spotorch.app.snapshots import SnapshotReady
from spotorch.core import provenance
from spotorch.core.model import JobPhase, Run, RunStatus
from spotorch.core.pipeline import (
    EscalationKind,
    JobTemplate,
    OnActiveRun,
    Pipeline,
    PythonPackage,
    RecoveryPolicy,
    Trigger,
    WorkerPool,
)
from spotorch.spec.event_schemas import validate_event

DIGEST = "sha256:" + "ab" * 32
PKG = "gs://stage/p/packages/0123456789abcdef/trainer-1.0.tar.gz"


def pipeline(**job: object) -> Pipeline:
    return Pipeline(name="p", trigger=Trigger(bucket="b", on_active_run=OnActiveRun.QUEUE),
                    checkpoint_uri="gs://c/p", output_uri="gs://m/p",
                    job=JobTemplate(**job),  # type: ignore[arg-type]
                    recovery=RecoveryPolicy(escalation=EscalationKind.NEVER))


def deps_for(p: Pipeline) -> Deps:
    return fake_deps(p, events_topic="projects/x/topics/t")


OBJECTS = (("d/a.csv", 11), ("d/b.csv", 7))


def snapshot(**extra: object) -> SnapshotReady:
    snap = SnapshotReady(pipeline="p", snapshot_id="0123456789abcdef", data_uri="gs://b/d/",
                         objects=tuple(n for n, _ in OBJECTS),
                         generations=tuple(g for _, g in OBJECTS), completed_at=1.0)
    for key, value in extra.items():  # a field the bq intake adds (SnapshotReady.bigquery)
        object.__setattr__(snap, key, value)
    return snap


def started(deps: Deps, snap: SnapshotReady | None = None) -> Run:
    run = start_snapshot_run(deps, snap or snapshot(), "complete")
    assert run is not None
    return run


# ---------------------------------------------------------------- pure


def test_seed_is_stable_per_run_and_differs_between_runs() -> None:
    assert provenance.seed_for("r1") == provenance.seed_for("r1")
    assert provenance.seed_for("r1") != provenance.seed_for("r2")
    assert 0 <= provenance.seed_for("r1") < provenance.SEED_MODULUS


def test_image_and_package_pins() -> None:
    assert provenance.image_digest(f"us-docker.pkg.dev/p/r/img@{DIGEST}") == DIGEST
    assert provenance.image_digest("us-docker.pkg.dev/p/r/img:latest") is None
    assert provenance.package_hash(PKG) == "0123456789abcdef"
    assert provenance.package_hash("gs://mine/trainer.tar.gz") is None
    pinned = provenance.pool_code(WorkerPool(image_uri=f"img@{DIGEST}"))
    assert pinned["pinned"] and pinned["image_digest"] == DIGEST
    tagged = provenance.pool_code(WorkerPool(image_uri="img:2.3"))
    assert tagged["pinned"] is False and tagged["image_digest"] is None
    pkg = PythonPackage(executor_image_uri="us-docker.pkg.dev/vertex-ai/training/x:latest",
                        python_module="m", package_uris=(PKG,))
    code = provenance.pool_code(WorkerPool(python_package=pkg))
    assert code["package_hashes"] == ["0123456789abcdef"] and code["pinned"] is False  # tag
    by_digest = replace(pkg, executor_image_uri=f"x@{DIGEST}")
    assert provenance.pool_code(WorkerPool(python_package=by_digest))["pinned"] is True


def test_pipeline_hash_ignores_where_it_was_loaded_and_follows_what_it_says() -> None:
    p = pipeline()
    assert provenance.pipeline_hash(p) == provenance.pipeline_hash(replace(p, source="/x.yaml"))
    assert provenance.pipeline_hash(p) != provenance.pipeline_hash(replace(p, output_uri="gs://o"))


def test_labels_are_valid_vertex_labels() -> None:
    data = provenance.data_of(pipeline(), "gs://b/d/", "b", OBJECTS,
                              {"tables": ["P.D.T"], "snapshot_time": "2026-01-01T00:00:00Z"})
    prov = provenance.build(pipeline=pipeline(), run_id="r1", data=data, params={},
                            hardware=None, template=pipeline().job)
    labels = provenance.labels({**prov, "rerun_of": "R" * 80})
    assert {"spotorch_code_hash", "spotorch_data_hash", "spotorch_seed",
            "spotorch_bq_snapshot", "spotorch_rerun_of"} <= set(labels)
    for key, value in labels.items():
        assert len(key) <= 63 and len(value) <= 63
        assert all(c.islower() or c.isdigit() or c in "_-" for c in key + value), (key, value)


def test_a_long_object_list_stays_off_the_run_document_and_out_of_events() -> None:
    many = [(f"d/{'x' * 200}-{i:05d}.csv", i + 1) for i in range(2000)]
    data = provenance.data_of(pipeline(), "gs://b/d/", "b", many)
    assert data["objects"] is None and data["count"] == 2000 and data["manifest_uri"]
    few = provenance.data_of(pipeline(), "gs://b/d/", "b", many[:150])
    assert len(few["objects"]) == 150
    assert provenance.event_form({"data": few})["data"]["objects"] is None  # type: ignore[index]


# ---------------------------------------------------------------- the service


def test_a_snapshot_run_records_generations_code_seed_and_hardware_once() -> None:
    p = pipeline(worker_pools=(WorkerPool(machine_type="n1-standard-8", replica_count=2,
                                          image_uri=f"img@{DIGEST}"),))
    deps = deps_for(p)
    run = started(deps)
    prov = run.provenance
    assert prov is not None
    assert prov["data"]["bucket"] == "b"
    assert prov["data"]["objects"] == [{"name": "d/a.csv", "generation": 11},
                                       {"name": "d/b.csv", "generation": 7}]
    assert prov["code"]["pinned"] and prov["code"]["pools"][0]["image_digest"] == DIGEST
    assert prov["hardware"]["pools"][0] == {"machine_type": "n1-standard-8", "replica_count": 2,
                                            "accelerator_type": None, "accelerator_count": 0,
                                            "tpu_topology": None}
    assert prov["seed"] == provenance.seed_for(run.run_id)
    assert prov["pipeline"]["hash"] == provenance.pipeline_hash(p)
    # The stored document round-trips it.
    stored, _ = deps.runs.load(run.run_id)
    assert stored is not None and stored.provenance == prov
    # The trainer gets the seed and the manifest, which lists each object at its generation.
    launcher = deps.launcher
    assert isinstance(launcher, InMemoryLauncher)
    env = launcher.jobs[launcher.job_of(run.run_id, 1)].spec.env
    assert env["SPOTORCH_SEED"] == str(prov["seed"])
    assert env["SPOTORCH_INPUTS"] == prov["data"]["manifest_uri"]
    objects = deps.objects
    assert isinstance(objects, InMemoryObjectStore)
    bucket, _, name = env["SPOTORCH_INPUTS"].removeprefix("gs://").partition("/")
    manifest = json.loads(objects.read(bucket, name, 1, 1 << 20))
    assert manifest["bucket"] == "b" and manifest["objects"] == prov["data"]["objects"]
    # The created event carries it, and validates against its schema.
    publisher = deps.publisher
    assert isinstance(publisher, InMemoryPublisher)
    created = next(e for e in publisher.events if e["type"].endswith("run.created.v1"))
    assert created["data"]["provenance"]["data"]["objects_hash"] == prov["data"]["objects_hash"]
    assert validate_event(created) == []
    broken = json.loads(json.dumps(created))
    broken["data"]["provenance"]["seed"] = "42"
    broken["data"]["provenance"]["data"]["objects"][0]["generation"] = -1
    assert len(validate_event(broken)) == 2  # the schema checks what it says
    assert run_summary(run)["provenance"]["code_hash"] == prov["code"]["hash"]


def test_a_bigquery_snapshot_map_is_carried_untouched() -> None:
    bq = {"tables": ["proj.ds.events"], "snapshot_time": "2026-12-02T01:00:00Z",
          "snapshot_tables": ["proj.ds.events_snap_1"],
          "export_uris": ["gs://exports/r1/part-*.parquet"],
          "objects": [{"name": "r1/part-000000000000.parquet", "generation": 5}]}
    run = started(deps_for(pipeline()), snapshot(bigquery=bq))
    assert run.provenance is not None and run.provenance["data"]["bigquery"] == bq


def test_a_query_snapshot_s_hash_survives_a_long_query_in_the_experiments_metadata() -> None:
    query = "SELECT x FROM `proj.ds.events` WHERE " + " OR ".join(
        f"x = {i}" for i in range(400))
    bq = {"tables": ["proj.ds.events"], "snapshot_time": "2026-12-02T01:00:00Z",
          "query": query, "query_sha256": "ab" * 32, "snapshot_tables": ["proj.ds.query__1"],
          "export_uris": ["gs://exports/r1/query/part-*.parquet"],
          "objects": [{"name": "r1/query/part-000000000000.parquet", "generation": 5}]}
    run = started(deps_for(pipeline()), snapshot(bigquery=bq))
    meta = provenance.metadata(run.provenance)
    assert len(meta["bigquery_snapshot"]) == 2000  # the map is cut...
    assert meta["bigquery_query_sha256"] == "ab" * 32  # ...its query's hash is not


def test_succeeded_event_carries_provenance() -> None:
    deps = deps_for(pipeline())
    run = started(deps)
    launcher = deps.launcher
    assert isinstance(launcher, InMemoryLauncher)
    job = launcher.job_of(run.run_id, 1)
    done = job_changed(deps, run.run_id, 1, launcher.set_status(job, JobPhase.SUCCEEDED))
    assert done is not None and done.status is RunStatus.SUCCEEDED
    publisher = deps.publisher
    assert isinstance(publisher, InMemoryPublisher)
    ok = next(e for e in publisher.events if e["type"].endswith("run.succeeded.v1"))
    assert ok["data"]["provenance"]["seed"] == run.provenance["seed"]  # type: ignore[index]
    assert validate_event(ok) == []


def _finish(deps: Deps, run_id: str) -> None:
    launcher = deps.launcher
    assert isinstance(launcher, InMemoryLauncher)
    job_changed(deps, run_id, 1, launcher.set_status(launcher.job_of(run_id, 1),
                                                     JobPhase.SUCCEEDED))


def test_rerun_runs_the_recorded_code_seed_data_and_hardware_once_per_request() -> None:
    pkg = PythonPackage(executor_image_uri="exec:1", python_module="trainer.task",
                        package_uris=(PKG,))
    p = pipeline(worker_pools=(WorkerPool(machine_type="n1-standard-4", python_package=pkg),))
    deps = deps_for(p)
    first = started(deps)
    _finish(deps, first.run_id)
    # The pipeline is rebuilt since: a new package, a bigger machine.
    newer = replace(pkg, package_uris=("gs://stage/p/packages/fedcba9876543210/trainer-2.tar.gz",))
    deps.pipelines = {"p": replace(p, job=JobTemplate(worker_pools=(
        WorkerPool(machine_type="n1-standard-16", python_package=newer),)))}
    again = rerun_run(deps, first.run_id, "req-1")
    assert again.rerun_of == first.run_id and again.run_id != first.run_id
    assert again.provenance is not None and first.provenance is not None
    assert again.provenance["seed"] == first.provenance["seed"]
    assert again.provenance["data"] == first.provenance["data"]
    assert again.provenance["code"] == first.provenance["code"]
    assert again.provenance["pipeline"]["changed"] is True
    launcher = deps.launcher
    assert isinstance(launcher, InMemoryLauncher)
    spec = launcher.jobs[launcher.job_of(again.run_id, 1)].spec
    pool = spec.template.worker_pools[0]
    assert pool.python_package is not None and pool.python_package.package_uris == (PKG,)
    assert pool.machine_type == "n1-standard-4"  # the recorded machine, not today's
    assert spec.env["SPOTORCH_SEED"] == str(first.provenance["seed"])
    assert spec.env["SPOTORCH_INPUTS"] == first.provenance["data"]["manifest_uri"]
    # The same request again: the same run, no second job.
    created = launcher.created
    assert rerun_run(deps, first.run_id, "req-1").run_id == again.run_id
    assert launcher.created == created
    second = rerun_run(deps, first.run_id, "req-2")
    assert second.run_id != again.run_id
    _finish(deps, again.run_id)
    _finish(deps, second.run_id)
    # Asked for: today's machines (the recorded code all the same).
    today = rerun_run(deps, first.run_id, "req-3", hardware="current")
    assert today.provenance is not None
    assert today.provenance["hardware"]["pools"][0]["machine_type"] == "n1-standard-16"
    spec = launcher.jobs[launcher.job_of(today.run_id, 1)].spec
    assert spec.template.worker_pools[0].machine_type == "n1-standard-16"
    assert spec.template.worker_pools[0].python_package.package_uris == (PKG,)  # type: ignore[union-attr]
    with pytest.raises(NotRetryable, match="hardware must be one of"):
        rerun_run(deps, first.run_id, "req-4", hardware="bigger")


def test_rerun_follows_the_active_run_rule_and_refuses_what_it_cannot_reproduce() -> None:
    p = replace(pipeline(), trigger=Trigger(bucket="b", on_active_run=OnActiveRun.SKIP))
    deps = deps_for(p)
    first = started(deps)
    with pytest.raises(NotRetryable, match="skips new runs"):
        rerun_run(deps, first.run_id)  # the first is still running
    with pytest.raises(UnknownRun):
        rerun_run(deps, "nope")
    deps = deps_for(pipeline())  # a run stored before provenance was recorded
    old = start_run(deps, "p", run_id="old", data_uri="gs://b/x/", snapshot_id=None, reason="t")
    assert old is not None
    stored, version = deps.runs.load("old")
    assert stored is not None
    deps.runs.save(replace(stored, provenance=None), version)
    with pytest.raises(NotRetryable, match="no recorded provenance"):
        rerun_run(deps, "old")


def test_a_plain_marker_snapshot_lists_its_folder_at_the_decision() -> None:
    from spotorch.core.pipeline import BatchMode

    p = replace(pipeline(), trigger=Trigger(bucket="b", prefix="d/", batch=BatchMode.MARKER,
                                            marker="_SUCCESS", snapshot_depth=0))
    deps = deps_for(p)
    objects = deps.objects
    assert isinstance(objects, InMemoryObjectStore)
    objects.put("b", "d/a.csv", 3, b"x")
    objects.put("b", "d/a.csv", 5, b"y")  # overwritten before the marker: the live one counts
    objects.put("b", "d/b.csv", 2, b"z")
    objects.put("b", "other/c.csv", 9, b"w")  # not in the folder
    snap = SnapshotReady(pipeline="p", snapshot_id="0123456789abcdef", data_uri="gs://b/d/",
                         objects=("d/_SUCCESS",), generations=(4,), completed_at=1.0)
    run = started(deps, snap)
    assert run.provenance is not None
    assert run.provenance["data"]["objects"] == [
        {"name": "d/_SUCCESS", "generation": 4}, {"name": "d/a.csv", "generation": 5},
        {"name": "d/b.csv", "generation": 2}]


def test_machines_chosen_by_hardware_probes_are_the_recorded_ones_and_a_rerun_keeps_them() -> None:
    from operator_runs import deps_for as operator_deps
    from operator_runs import hardware_run

    deps = operator_deps()
    run = hardware_run(deps)
    assert run.provenance is not None
    chosen = run.provenance["hardware"]
    assert chosen["candidate"] == "l4"
    assert chosen["pools"][0]["machine_type"] == "g2-standard-8"
    assert chosen["pools"][0]["accelerator_type"] == "NVIDIA_L4"
    _finish(deps, run.run_id)
    again = rerun_run(deps, run.run_id, "hw")
    assert again.provenance is not None and again.provenance["hardware"] == chosen
    launcher = deps.launcher
    assert isinstance(launcher, InMemoryLauncher)
    pool = launcher.jobs[launcher.job_of(again.run_id, 1)].spec.template.worker_pools[0]
    assert (pool.machine_type, pool.accelerator_type) == ("g2-standard-8", "NVIDIA_L4")
    assert [p.candidate for p in again.probes] == []  # no probing again: the recorded choice


def test_a_submit_by_hand_pins_the_folder_as_listed_at_the_decision() -> None:
    from spotorch.app.runs import submit

    deps = deps_for(pipeline())
    objects = deps.objects
    assert isinstance(objects, InMemoryObjectStore)
    objects.put("b", "by-hand/x.csv", 8, b"x")
    run = submit(deps, "p", "gs://b/by-hand/", request_id="one")
    assert run is not None and run.provenance is not None
    assert run.provenance["data"]["objects"] == [{"name": "by-hand/x.csv", "generation": 8}]
    objects.put("b", "by-hand/x.csv", 9, b"y")
    again = submit(deps, "p", "gs://b/by-hand/", request_id="one")  # the same request
    assert again is not None and again.provenance == run.provenance


def test_show_and_the_ui_name_a_query_snapshot_s_hash() -> None:
    from rich.console import Console

    from spotorch.operate.render import provenance_lines
    from spotorch.operate.ui.pages import _provenance

    def shown(prov: object) -> str:
        console = Console(record=True, width=300)
        console.print(*provenance_lines(prov))  # type: ignore[arg-type]
        return console.export_text()

    bq = {"tables": ["proj.ds.events"], "snapshot_time": "2026-12-02T01:00:00Z",
          "query": "SELECT 1", "query_sha256": "cd" * 32,
          "export_uris": ["gs://exports/r1/query/part-*.parquet"]}
    run = started(deps_for(pipeline()), snapshot(bigquery=bq))
    assert "(query sha256 cdcdcdcdcdcd)" in shown(run.provenance)
    assert f"query sha256 {'cd' * 32}" in _provenance(run.provenance)
    plain = started(deps_for(pipeline()), snapshot(bigquery={**bq, "query_sha256": None}))
    assert "query sha256" not in shown(plain.provenance)


def test_every_pool_is_named_one_way_in_show_the_ui_and_the_pipelines_page() -> None:
    from spotorch.operate.ui.pages_data import pipeline_row

    p = pipeline(worker_pools=(
        WorkerPool(machine_type="g2-standard-8", accelerator_type="NVIDIA_L4",
                   accelerator_count=1),
        WorkerPool(machine_type="n1-standard-8", replica_count=2)))
    text = provenance.machines_text(provenance.hardware_of(p.job, None))
    assert text == "1x g2-standard-8 + 1x NVIDIA_L4; 2x n1-standard-8"
    assert pipeline_row(p)["machine"] == text  # every pool, not the first alone
    assert provenance.machines_text(None) == ""
