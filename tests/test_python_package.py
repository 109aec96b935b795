"""Your code without Docker: a pipeline names a source folder (or a built package) and a Vertex
prebuilt training container; spotorch builds reproducible, content-addressed source
distributions (spotorch_trainer beside it), uploads the missing ones before a launch, launches
python_package_spec, and the Vertex emulator installs and runs the package honestly offline."""

from __future__ import annotations

import hashlib
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from fakes import fake_deps
from spotorch.adapters.gcp.vertex import build_custom_job
from spotorch.adapters.memory.twins import InMemoryLauncher, InMemoryObjectStore
from spotorch.app.runs import start_run
from spotorch.core.pipeline import Capacity, JobTemplate, PythonPackage, WorkerPool
from spotorch.local import _vertex_packages as vp
from spotorch.ports.jobs import LABEL_ATTEMPT, LABEL_RUN, LaunchSpec
from spotorch.spec.loader import check_file, load_pipeline
from spotorch.spec.packages import build_sdist, stage

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "trainer"
SKLEARN = "us-docker.pkg.dev/vertex-ai/training/sklearn-cpu.1-0:latest"


def _pipeline_file(tmp: Path, pool: dict[str, object], job: dict[str, object] | None = None
                   ) -> Path:
    path = tmp / "p.yaml"
    path.write_text(yaml.safe_dump({
        "version": 1, "name": "pkg", "trigger": {"bucket": "my-landing"},
        "checkpoint_uri": "gs://my-checkpoints/pkg", "output_uri": "gs://my-models/pkg",
        "job": {**(job or {}), "worker_pools": [{"machine_type": "n1-standard-4", **pool}]}}))
    return path


def test_a_pool_names_an_image_or_a_package_and_every_problem_is_listed(tmp_path: Path) -> None:
    path = _pipeline_file(tmp_path, {"image_uri": "python:3.11-slim", "python_package": {
        "source": "trainer", "package_uri": "gs://b/x.tar.gz",
        "executor_image_uri": "us-docker.pkg.dev/vertex-ai/training/no-such:1",
        "python_module": "trainer.task"}})
    pipeline, problems = check_file(path)
    said = "\n".join(str(p) for p in problems)
    assert pipeline is None
    assert "needs image_uri (your image) or python_package" in said
    assert "needs exactly one of source, package, package_uri (got source, package_uri)" in said
    assert "job.staging_uri: is required by job.worker_pools[0].python_package.source" in said
    assert "'us-docker.pkg.dev/vertex-ai/training/no-such:1' is not one of Vertex AI's" in said
    bare = _pipeline_file(tmp_path, {"replica_count": 1})
    assert "needs image_uri or python_package" in "\n".join(map(str, check_file(bare)[1]))
    good = _pipeline_file(tmp_path, {"python_package": {
        "source": "trainer", "executor_image_uri": SKLEARN, "python_module": "trainer.task"}},
        {"staging_uri": "gs://my-staging/pkg"})
    assert check_file(good)[1] == ()


def test_the_source_distribution_is_reproducible_and_named_by_its_content(
        tmp_path: Path) -> None:
    first = build_sdist(EXAMPLE)
    assert first == build_sdist(EXAMPLE)  # same bytes from the same source, whenever built
    copy = tmp_path / "trainer"
    import shutil

    shutil.copytree(EXAMPLE, copy)
    (copy / "spotorch_example" / "extra.py").write_text("X = 1\n")
    assert build_sdist(copy)[1] != first[1]
    assert not list(copy.glob("*.egg-info"))  # built in a copy: the user's folder stays clean


def test_staging_builds_the_demo_package_and_spotorch_trainer_under_their_hashes(
        tmp_path: Path) -> None:
    (pipeline,) = stage((load_pipeline(ROOT / "examples/pipelines/demo.yaml"),), tmp_path)
    package = pipeline.job.worker_pools[0].python_package
    assert package is not None and package.executor_image_uri == SKLEARN
    assert len(package.package_uris) == len(package.staged_files) == 2
    for uri, staged in zip(package.package_uris, package.staged_files, strict=True):
        data = (tmp_path / staged).read_bytes()
        digest = hashlib.sha256(data).hexdigest()[:16]
        assert uri == f"gs://spotorch-staging/demo/packages/{digest}/{Path(staged).name}"
    assert package.package_uris[0].endswith("spotorch_trainer-0.1.0.tar.gz")


def test_a_source_that_does_not_build_is_a_config_error_naming_the_pool(tmp_path: Path) -> None:
    from spotorch.core.errors import ConfigError

    demo = load_pipeline(ROOT / "examples/pipelines/demo.yaml")
    pool = demo.job.worker_pools[0]
    assert pool.python_package is not None
    broken = replace(demo, job=replace(demo.job, worker_pools=(replace(
        pool, python_package=replace(pool.python_package, source=str(tmp_path))),)))
    with pytest.raises(ConfigError, match=r"worker_pools\[0\].python_package.*no pyproject"):
        stage((broken,), tmp_path / "out")


def _package_spec(package: PythonPackage) -> LaunchSpec:
    pool = WorkerPool(machine_type="n1-standard-4", python_package=package, args=("--x", "1"),
                      env=(("EXAMPLE_TOTAL_STEPS", "10"),))
    return LaunchSpec(run_id="r1", pipeline="pkg", attempt=1, capacity=Capacity.SPOT,
                      region="us-central1", template=JobTemplate(worker_pools=(pool,)),
                      env={"SPOTORCH_RUN_ID": "r1"}, labels={LABEL_RUN: "r1", LABEL_ATTEMPT: "1"},
                      display_name="r1")


def test_the_launcher_builds_python_package_spec_instead_of_a_container() -> None:
    uris = ("gs://s/packages/a/spotorch_trainer-0.1.0.tar.gz", "gs://s/packages/b/x-1.tar.gz")
    job = build_custom_job(_package_spec(PythonPackage(executor_image_uri=SKLEARN,
                                                       python_module="x.train",
                                                       package_uris=uris)))
    pool = job.job_spec.worker_pool_specs[0]
    spec = pool.python_package_spec
    assert (spec.executor_image_uri, list(spec.package_uris), spec.python_module) == \
        (SKLEARN, list(uris), "x.train")
    assert list(spec.args) == ["--x", "1"] and not pool.container_spec.image_uri
    assert {e.name: e.value for e in spec.env} == {"EXAMPLE_TOTAL_STEPS": "10",
                                                   "SPOTORCH_RUN_ID": "r1"}
    with pytest.raises(ValueError, match="no package_uris"):
        build_custom_job(_package_spec(PythonPackage(executor_image_uri=SKLEARN,
                                                     python_module="x.train")))


def test_the_service_uploads_the_packages_the_staging_bucket_lacks_before_it_launches(
        tmp_path: Path) -> None:
    (pipeline,) = stage((load_pipeline(ROOT / "examples/pipelines/demo.yaml"),), tmp_path)
    package = pipeline.job.worker_pools[0].python_package
    assert package is not None
    located = replace(package, staged_files=tuple(str(tmp_path / f) for f in package.staged_files))
    pipeline = replace(pipeline, job=replace(pipeline.job, worker_pools=(replace(
        pipeline.job.worker_pools[0], python_package=located),)))
    deps = fake_deps(pipeline)
    objects = deps.objects
    assert isinstance(objects, InMemoryObjectStore) and isinstance(deps.launcher, InMemoryLauncher)
    run = start_run(deps, "demo", run_id="r1", data_uri="gs://b/d/", snapshot_id="s", reason="t")
    assert run is not None and deps.launcher.created == 1
    stored = {f"gs://{b}/{n}": data for (b, n, _), data in objects.objects.items()}
    assert set(stored) == set(package.package_uris)
    assert stored[package.package_uris[1]] == Path(located.staged_files[1]).read_bytes()
    assert not objects.ensure_file(package.package_uris[0], located.staged_files[0])  # once


def test_the_emulator_installs_each_package_set_once_and_refuses_unmet_requirements(
        tmp_path: Path) -> None:
    trainer = stage((load_pipeline(ROOT / "examples/pipelines/demo.yaml"),), tmp_path)[0]
    package = trainer.job.worker_pools[0].python_package
    assert package is not None
    archives = [(Path(f).name, (tmp_path / f).read_bytes()) for f in package.staged_files]
    cache = tmp_path / "cache"
    site = vp.install(cache, archives)
    assert (site / "spotorch_example" / "train.py").is_file()
    assert vp.unmet(site) == []  # spotorch-trainer from the set, numpy from this environment
    (site / "marker").write_text("kept")
    assert vp.install(cache, archives) == site and (site / "marker").exists()  # cached
    needy = tmp_path / "needy"
    (needy / "needy").mkdir(parents=True)
    (needy / "needy" / "__init__.py").write_text("")
    (needy / "pyproject.toml").write_text(
        '[build-system]\nrequires = ["setuptools>=61"]\nbuild-backend = "setuptools.build_meta"\n'
        '[project]\nname = "needy"\nversion = "1"\n'
        'dependencies = ["definitely-not-installed-here>=1"]\n')
    missing = vp.unmet(vp.install(cache, [build_sdist(needy)]))
    assert missing == ["definitely-not-installed-here>=1 (from needy)"]


def test_deploy_grants_the_staging_bucket_to_the_functions_and_the_jobs(tmp_path: Path) -> None:
    import importlib.util
    import sys

    spec = importlib.util.spec_from_file_location("spotorch_deploy_package",
                                                  ROOT / "deploy/package.py")
    assert spec is not None and spec.loader is not None
    package = sys.modules.get(spec.name) or importlib.util.module_from_spec(spec)
    if spec.name not in sys.modules:
        sys.modules[spec.name] = package
        spec.loader.exec_module(package)
    needs = package.pipeline_needs([ROOT / "examples/pipelines/demo.yaml"])
    assert needs.tfvars()["pipeline_staging_buckets"] == ["spotorch-staging"]
    from spotorch.operate.deploy_check import check

    report = check(ROOT / "deploy")
    staging = [f for f in report.findings if str(f.scope) == "buckets:staging"]
    assert staging and report.ok
    assert {str(f.identity) for f in staging} >= {"functions", "training"}
    assert all(f.granted_by for f in staging)
