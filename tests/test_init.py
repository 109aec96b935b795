"""`spotorch init DIR`: a starting project that loads, lists what to fill in, and deploys once
filled in (packaging refuses it before)."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import hcl2
import pytest

from spotorch.operate import init_project
from spotorch.operate.init_project import PLACEHOLDER, placeholders, write_project
from spotorch.operate.terraform import load_tf
from spotorch.spec.loader import load_pipelines

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"


def _packager() -> Any:
    spec = importlib.util.spec_from_file_location("spotorch_deploy_package_init",
                                                  DEPLOY / "package.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _names(parsed: dict[str, Any]) -> set[str]:
    return {k for k in parsed if not k.startswith("__")}


@pytest.fixture
def project(tmp_path: Path) -> Path:
    directory = tmp_path / "proj"
    write_project(directory, "ranker", DEPLOY)
    return directory


def test_the_pipeline_loads_and_its_placeholders_are_named(project: Path) -> None:
    (pipeline,) = load_pipelines(str(project / "pipelines"))
    assert pipeline.name == "ranker" and pipeline.trigger.bucket == f"{PLACEHOLDER}-landing"
    left = placeholders(project / "pipelines" / "ranker.yaml")
    assert [line.rsplit(": ", 1)[1] for line in left] == [
        f"{PLACEHOLDER}-landing", f"gs://{PLACEHOLDER}-staging/ranker",
        f"gs://{PLACEHOLDER}-checkpoints/ranker", f"gs://{PLACEHOLDER}-models/ranker"]
    # a python package on a prebuilt container: no image, no Dockerfile
    package = pipeline.job.worker_pools[0].python_package
    assert package is not None and package.python_module == "ranker"
    assert not pipeline.job.worker_pools[0].image_uri
    assert not (project / "trainer" / "Dockerfile").exists()


def test_tfvars_explains_every_variable(project: Path) -> None:
    text = (project / "terraform.tfvars").read_text()
    variables = load_tf(DEPLOY).variables
    for name, spec in variables.items():
        assert f"\n{name} = " in text or f"\n# {name} = " in text, name
        first_words = " ".join(str(spec["description"]).split()[:6])
        assert first_words in " ".join(line.lstrip("# ") for line in text.splitlines()), name
    # what is set parses as tfvars, and so does every commented-out default once uncommented
    assert _names(hcl2.loads(text)) == {"project_id", "operators"}
    uncommented = "\n".join(line[2:] for line in text.splitlines() if line.startswith("# ")
                            and " = " in line and line[2:].split(" = ")[0] in variables)
    assert _names(hcl2.loads(uncommented)) | {"project_id", "operators"} == set(variables)
    terraform = shutil.which("terraform")
    if terraform:
        result = subprocess.run([terraform, "fmt", "-check", str(project / "terraform.tfvars")],
                                capture_output=True, text=True, timeout=60, check=False)
        assert result.returncode == 0, result.stdout


def test_packaging_refuses_placeholders_then_packages_once_filled(project: Path,
                                                                   tmp_path: Path) -> None:
    package = _packager()
    with pytest.raises(package.PackageError) as err:
        package.build(ROOT, project / "pipelines", tmp_path / "b.zip", validate=True)
    message = str(err.value)
    assert "fill in the placeholders" in message and "ranker.yaml:10:" in message
    assert not (tmp_path / "b.zip").exists()
    pipeline = project / "pipelines" / "ranker.yaml"
    pipeline.write_text(pipeline.read_text().replace(PLACEHOLDER, "acme"))
    tfvars = tmp_path / "generated.tfvars.json"
    bundle = package.build(ROOT, project / "pipelines", tmp_path / "b.zip", tfvars, validate=True)
    assert bundle.pipelines == ("ranker.yaml",)
    assert json.loads(tfvars.read_text())["pipeline_landing_buckets"] == ["acme-landing"]


def test_deploy_refuses_a_tfvars_with_placeholders(project: Path, tmp_path: Path) -> None:
    pipeline = project / "pipelines" / "ranker.yaml"
    pipeline.write_text(pipeline.read_text().replace(PLACEHOLDER, "acme"))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "terraform").write_text(f"#!/bin/sh\ntouch {tmp_path / 'ran'}\n")
    (bin_dir / "terraform").chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}",
           "PIPELINES": str(project / "pipelines"), "TFVARS": str(project / "terraform.tfvars"),
           "PYTHON": sys.executable}
    result = subprocess.run(["bash", str(DEPLOY / "deploy.sh"), "plan"], env=env, cwd=ROOT,
                            capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode != 0
    assert "fill in the placeholders (replace-me)" in result.stderr, result.stderr
    assert "project_id" in result.stderr and not (tmp_path / "ran").exists()


def test_the_trainer_trains_checkpoints_and_resumes(project: Path, tmp_path: Path) -> None:
    data = tmp_path / "snapshot"
    data.mkdir()
    (data / "part-0.csv").write_text("1,2,3\n4,5,6\n")
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "PYTHONPATH": ".",
           "SPOTORCH_CHECKPOINT_URI": str(tmp_path / "ckpt"),
           "SPOTORCH_MODEL_URI": str(tmp_path / "model"), "CHECKPOINT_EVERY": "10"}

    def train(steps: int) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "ranker", "--data", str(data)],
                              cwd=project / "trainer", env={**env, "TOTAL_STEPS": str(steps)},
                              capture_output=True, text=True, timeout=120, check=False)

    first = train(30)
    assert first.returncode == 0, first.stderr
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir())[-1] == "step-0000000030"
    assert "mean" in json.loads((tmp_path / "model" / "model.json").read_text())
    second = train(40)  # resumes at step 30: only ten more steps
    assert second.returncode == 0, second.stderr
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir())[-1] == "step-0000000040"
    # spotorch-trainer is a declared dependency (spotorch stages it), not a copy
    assert not (project / "trainer" / "spotorch_trainer").exists()
    assert '"spotorch-trainer"' in (project / "trainer" / "pyproject.toml").read_text()


def test_the_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "p"
    assert init_project.main([str(target), "--name", "nightly"]) == 0
    out = capsys.readouterr().out
    assert "The pipeline loads" in out and "nightly.yaml:10: replace-me-landing" in out
    assert f"PIPELINES={target.resolve()}/pipelines" in out
    assert init_project.main([str(target)]) == 1  # not empty
    assert "is not empty" in capsys.readouterr().err
    assert init_project.main([str(tmp_path / "q"), "--name", "Bad_Name"]) == 1
    result = subprocess.run([str(Path(sys.executable).parent / "spotorch"), "init",
                             str(tmp_path / "r")], capture_output=True, text=True, timeout=120,
                            check=False, cwd=ROOT)
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "r" / "pipelines" / "my-pipeline.yaml").is_file()


@pytest.mark.emulator
@pytest.mark.slow
def test_the_project_runs_on_the_local_stack_as_written(tmp_path: Path) -> None:
    """`spotorch init`, then `dev up --pipelines` and `dev upload` as the project README says:
    the package is built, installed by the Vertex emulator, trains and the run succeeds."""
    from google.cloud import storage

    from spotorch.adapters.gcp.firestore import FirestoreDocumentStore
    from spotorch.core.model import Run
    from spotorch.local._stack_upload import plan, upload
    from spotorch.local.stack import DevStack

    project = tmp_path / "proj"
    write_project(project, "ranker", DEPLOY)
    assert subprocess.run([str(Path(sys.executable).parent / "spotorch"), "validate",
                           str(project / "pipelines")], capture_output=True, text=True,
                          timeout=120, check=False).returncode == 0
    data = tmp_path / "snapshot"
    data.mkdir()
    (data / "part-0.csv").write_text("1,2,3\n4,5,6\n")
    with DevStack(pipelines_dir=project / "pipelines", run_dir=tmp_path / "stack",
                  tick_seconds=2.0) as stack:
        served = stack.pipelines
        assert served is not None
        assert [p.name for p in served.loaded] == ["ranker"], served.rejected
        saved = dict(os.environ)
        os.environ.update(stack.env)
        try:
            client = storage.Client.create_anonymous_client()
            client.project = stack.project
            bucket, objects, _ = plan(data, f"gs://{PLACEHOLDER}-landing/datasets/ranker/s1/",
                                      [p.pipeline for p in served.loaded
                                       if p.pipeline is not None])
            upload(bucket, objects, client)
            docs = FirestoreDocumentStore(project=stack.project)
            run = None
            deadline = time.monotonic() + 240
            while time.monotonic() < deadline:
                found = [Run.from_dict(d) for d in docs.query("runs", "pipeline", "ranker")]
                run = found[0] if found else None
                if run is not None and not run.active:
                    break
                time.sleep(1.0)
        finally:
            os.environ.clear()
            os.environ.update(saved)
    assert run is not None, "no run started"
    assert run.status == "SUCCEEDED", [(h.what, h.reason) for h in run.history]
