"""Worker pool roles: chief, workers, reduction server or parameter servers, evaluator (issue 32)."""

from __future__ import annotations

from pathlib import Path

import pytest
from google.cloud import aiplatform_v1 as v1

from spotorch.adapters.gcp.vertex import build_custom_job
from spotorch.core.errors import ConfigError
from spotorch.core.pipeline import (
    REDUCTION_SERVER_IMAGE,
    Capacity,
    JobTemplate,
    PoolRole,
    WorkerPool,
    pool_positions,
    pool_role,
    training_world,
)
from spotorch.ports.jobs import LaunchSpec
from spotorch.spec.loader import load_pipeline

HEAD = """\
name: dist
trigger: {bucket: landing, prefix: data/}
checkpoint_uri: gs://ckpt/dist
output_uri: gs://models/dist
job:
  worker_pools:
"""
TRAINER = "machine_type: n1-standard-4\n      image_uri: python:3.11-slim"


def pools_file(tmp_path: Path, *pools: str) -> Path:
    body = "".join(f"    - {p}\n" for p in pools)
    path = tmp_path / "p.yaml"
    path.write_text(HEAD + body)
    return path


def problems_of(path: Path) -> dict[str, str]:
    with pytest.raises(ConfigError) as caught:
        load_pipeline(path)
    found: dict[str, str] = {}
    for p in caught.value.problems:  # every message of a field, joined
        found[p.path] = f"{found[p.path]} | {p.message}" if p.path in found else p.message
    return found


def test_a_full_cluster_loads_with_its_roles(tmp_path: Path) -> None:
    path = pools_file(tmp_path, f"role: chief\n      {TRAINER}",
                      f"role: workers\n      replica_count: 3\n      {TRAINER}",
                      f"role: reduction_server\n      replica_count: 2\n"
                      f"      machine_type: n1-highcpu-16\n      image_uri: {REDUCTION_SERVER_IMAGE}",
                      f"role: evaluator\n      {TRAINER}")
    pools = load_pipeline(path).job.worker_pools
    assert [p.role for p in pools] == [PoolRole.CHIEF, PoolRole.WORKERS,
                                       PoolRole.REDUCTION_SERVER, PoolRole.EVALUATOR]
    assert pool_positions(pools) == (0, 1, 2, 3)


def test_unnamed_pools_take_the_role_of_their_place() -> None:
    pools = (WorkerPool(), WorkerPool(replica_count=2), WorkerPool(role=PoolRole.EVALUATOR))
    assert pool_positions(pools) == (0, 1, 3)
    assert [pool_role(pools, i) for i in range(3)] == [PoolRole.CHIEF, PoolRole.WORKERS,
                                                       PoolRole.EVALUATOR]


def test_every_role_problem_is_listed_at_once(tmp_path: Path) -> None:
    path = pools_file(tmp_path, f"role: workers\n      replica_count: 2\n      {TRAINER}",
                      f"role: evaluator\n      {TRAINER}",
                      f"role: parameter_servers\n      {TRAINER}",
                      "role: reduction_server\n      machine_type: n1-highcpu-16\n"
                      "      image_uri: python:3.11-slim\n      accelerator_type: NVIDIA_L4\n"
                      "      accelerator_count: 1")
    found = problems_of(path)
    assert "must be 1" in found["job.worker_pools[0].replica_count"]
    assert "must be chief" in found["job.worker_pools[0].role"]
    assert "cannot come here" in found["job.worker_pools[2].role"]
    assert "cannot come here" in found["job.worker_pools[3].role"]
    assert REDUCTION_SERVER_IMAGE in found["job.worker_pools[3].image_uri"]
    assert "no accelerators" in found["job.worker_pools[3].accelerator_type"]


def test_an_unknown_role_is_refused_by_name(tmp_path: Path) -> None:
    found = problems_of(pools_file(tmp_path, TRAINER, f"role: learner\n      {TRAINER}"))
    assert "job.worker_pools[1].role" in found


def spec_of(*pools: WorkerPool) -> LaunchSpec:
    return LaunchSpec(run_id="r", pipeline="p", attempt=1, capacity=Capacity.SPOT,
                      region="us-central1", template=JobTemplate(worker_pools=pools),
                      env={}, labels={}, display_name="r")


def test_the_job_carries_every_pool_at_its_place_and_empty_places_between() -> None:
    chief = WorkerPool(image_uri="img", command=("python", "-m", "t"))
    evaluator = WorkerPool(role=PoolRole.EVALUATOR, machine_type="n1-standard-8",
                           replica_count=2, image_uri="img", command=("python", "-m", "e"))
    job = build_custom_job(spec_of(chief, evaluator))
    specs = job.job_spec.worker_pool_specs
    assert len(specs) == 4
    assert specs[1] == v1.WorkerPoolSpec() and specs[2] == v1.WorkerPoolSpec()
    assert specs[3].replica_count == 2 and specs[3].machine_spec.machine_type == "n1-standard-8"
    assert list(specs[3].container_spec.command) == ["python", "-m", "e"]
    # Spot is the job's scheduling strategy: every pool or none, as Vertex AI allows.
    assert job.job_spec.scheduling.strategy == v1.Scheduling.Strategy.SPOT


def test_a_training_world_of_several_restarts_as_a_whole_and_one_replica_alone_does_not() -> None:
    chief = WorkerPool(image_uri="img", command=("python", "-m", "t"))
    workers = WorkerPool(replica_count=2, image_uri="img", command=("python", "-m", "t"))
    evaluator = WorkerPool(role=PoolRole.EVALUATOR, image_uri="img", command=("python", "-m", "e"))
    assert [training_world(p) for p in ((chief,), (chief, workers), (chief, evaluator))] == \
        [1, 3, 1]
    flags = [build_custom_job(spec_of(*p)).job_spec.scheduling.restart_job_on_worker_restart
             for p in ((chief,), (chief, workers), (chief, evaluator))]
    assert flags == [False, True, False]


def test_a_hardware_candidate_reshapes_the_training_pools_and_keeps_the_others() -> None:
    from spotorch.core.pipeline import HardwareCandidate
    from spotorch.core.shapes import apply

    chief = WorkerPool(role=PoolRole.CHIEF, image_uri="img", command=("python", "-m", "t"))
    workers = WorkerPool(role=PoolRole.WORKERS, replica_count=3, image_uri="img",
                         command=("python", "-m", "t"))
    servers = WorkerPool(machine_type="n1-standard-8", image_uri="img",
                         command=("python", "-m", "e"))  # unnamed: the third place's role
    template = JobTemplate(worker_pools=(chief, workers, servers))
    two = apply(template, HardwareCandidate(name="l4", machine_type="g2-standard-8",
                                            accelerator_type="NVIDIA_L4", accelerator_count=1,
                                            replica_count=2))
    assert [(p.role, p.replica_count, p.machine_type) for p in two.worker_pools] == [
        (PoolRole.CHIEF, 1, "g2-standard-8"), (PoolRole.WORKERS, 1, "g2-standard-8"),
        (PoolRole.PARAMETER_SERVERS, 1, "n1-standard-8")]
    one = apply(template, HardwareCandidate(name="cpu", machine_type="n1-standard-16"))
    assert pool_positions(one.worker_pools) == (0, 2)  # the kept pool keeps its place
    assert training_world(one.worker_pools) == 1
