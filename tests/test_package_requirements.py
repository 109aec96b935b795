"""Your code's dependencies on the local stack (issue 41): the Vertex emulator installs what a
trainer package declares and spotorch's environment lacks from PyPI, as python_package_spec does
on the prebuilt container, into an environment per (executor image, requirement set) cached for
every later job, stack and test run; a requirement that cannot be installed fails the job with
pip's message."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from spotorch.adapters.gcp.vertex import VertexJobLauncher
from spotorch.core.model import JobPhase
from spotorch.core.pipeline import Capacity, JobTemplate, PythonPackage, WorkerPool
from spotorch.local import _vertex_packages as vp
from spotorch.local._vertex_quota import QuotaLimits
from spotorch.local.emulators import EmulatorSet
from spotorch.local.vertex_emulator import VertexEmulator
from spotorch.ports.jobs import LaunchSpec
from spotorch.spec.packages import build_sdist

SKLEARN = "us-docker.pkg.dev/vertex-ai/training/sklearn-cpu.1-0:latest"


def test_the_image_names_its_framework() -> None:
    assert vp.image_framework(SKLEARN) == ("scikit-learn", "1.0.*")
    assert vp.image_framework("us-docker.pkg.dev/vertex-ai/training/tf-cpu.2-15.py310:latest") \
        == ("tensorflow", "2.15.*")
    assert vp.image_framework(
        "us-docker.pkg.dev/vertex-ai/training/pytorch-gpu.2-4.py310:latest") == ("torch", "2.4.*")
    assert vp.image_framework("python:3.11") is None


def _package(tmp: Path, name: str, requirement: str) -> tuple[str, bytes]:
    root = tmp / name
    (root / name).mkdir(parents=True)
    (root / name / "__init__.py").write_text("")
    (root / name / "task.py").write_text(
        "import tabulate\n"
        "print('table:', tabulate.tabulate([[1, 2]], headers=['a', 'b'], tablefmt='plain')"
        ".replace('\\n', ' | '))\n")
    (root / "pyproject.toml").write_text(
        '[build-system]\nrequires = ["setuptools>=61"]\nbuild-backend = "setuptools.build_meta"\n'
        f'[project]\nname = "{name}"\nversion = "1"\ndependencies = ["{requirement}"]\n'
        f'[tool.setuptools]\npackages = ["{name}"]\n')
    return build_sdist(root)


def _run(launcher: VertexJobLauncher, uri: str, module: str, run_id: str) -> tuple[JobPhase, str]:
    pool = WorkerPool(machine_type="n1-standard-4", python_package=PythonPackage(
        executor_image_uri=SKLEARN, python_module=module, package_uris=(uri,)))
    name = launcher.launch(LaunchSpec(run_id=run_id, pipeline="deps", attempt=1,
                                      capacity=Capacity.STANDARD, region="us-central1",
                                      template=JobTemplate(worker_pools=(pool,)), env={},
                                      labels={}, display_name=f"deps-{run_id}"))
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        status = launcher.get(name)
        if status.phase.terminal:
            return status.phase, status.message or ""
        time.sleep(0.3)
    raise AssertionError(f"{name} did not end")


@pytest.mark.emulator
def test_a_package_declaring_a_dependency_spotorch_lacks_runs_on_the_local_vertex(
        tmp_path: Path, emulators: EmulatorSet, monkeypatch: pytest.MonkeyPatch) -> None:
    from google.cloud import storage

    with pytest.raises(ImportError):
        __import__("tabulate")  # not in spotorch's environment: the job must install it
    client = storage.Client.create_anonymous_client()
    client.project = emulators.project
    bucket = client.lookup_bucket("deps-staging") or client.create_bucket("deps-staging")
    uris = {}
    for name, requirement in (("needs_tabulate", "tabulate>=0.9"),
                              ("needs_nothing_real", "no-such-dist-spotorch-41>=1")):
        archive, data = _package(tmp_path, name, requirement)
        bucket.blob(f"pk/{archive}").upload_from_string(data)
        uris[name] = f"gs://deps-staging/pk/{archive}"
    emulator = VertexEmulator(emulators.project, workdir=tmp_path / "vertex", grace_s=0.5,
                              queued_s=0.05, pending_s=0.05, job_events_topic=None,
                              quotas=QuotaLimits.unlimited())
    address = emulator.start()
    try:
        launcher = VertexJobLauncher(emulators.project, endpoint=address)
        phase, message = _run(launcher, uris["needs_tabulate"], "needs_tabulate.task", "ok")
        log = "\n".join(p.read_text() for p in (tmp_path / "vertex").rglob("workerpool0-0.log"))
        assert phase is JobPhase.SUCCEEDED, (message, log)
        assert "table:" in log and "a    b |   1    2" in log, log
        assert "tabulate>=0.9" in log and ("installed in" in log or "cached" in log), log
        phase, message = _run(launcher, uris["needs_nothing_real"], "needs_nothing_real.task",
                              "bad")
        assert phase is JobPhase.FAILED
        errors = "\n".join(p.read_text() for p in (tmp_path / "vertex").rglob("*.stderr"))
        assert "no-such-dist-spotorch-41" in errors + message, (message, errors)
        assert "requirements failed" in errors + message or "satisf" in errors + message
    finally:
        emulator.stop()


def test_the_images_framework_is_pinned_where_it_can_be_had(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import subprocess

    calls: list[list[str]] = []

    def pip(target: Path, requirements: list[str], only_binary: tuple[str, ...] = ()
            ) -> subprocess.CompletedProcess[str]:
        calls.append([*requirements, *(f"--only-binary={b}" for b in only_binary)])
        pinned = any("==1.6.*" in r for r in requirements)
        if pinned and "no-wheel" in str(target):
            return subprocess.CompletedProcess([], 1, "", "ERROR: No matching distribution")
        target.mkdir(parents=True, exist_ok=True)
        return subprocess.CompletedProcess([], 0, "Successfully installed scikit-learn-1.6.1\n",
                                           "")

    monkeypatch.setattr(vp, "_pip", pip)
    said: list[str] = []
    image = "us-docker.pkg.dev/vertex-ai/training/sklearn-cpu.1-6:latest"
    vp.requirement_env(tmp_path / "ok", image, ["scikit-learn>=1.2", "tabulate"], said.append)
    assert calls == [["scikit-learn==1.6.*,>=1.2", "tabulate", "--only-binary=scikit-learn"]]
    assert "Successfully installed scikit-learn-1.6.1" in said
    assert any(line.startswith("installed in") for line in said)
    vp.requirement_env(tmp_path / "ok", image, ["tabulate", "scikit-learn>=1.2"], said.append)
    assert len(calls) == 1 and ": cached (installed in " in said[-1]  # one env per set
    calls.clear()
    vp.requirement_env(tmp_path / "no-wheel", image, ["scikit-learn"], said.append)
    assert calls == [["scikit-learn==1.6.*", "--only-binary=scikit-learn"], ["scikit-learn"]]
    assert any("cannot be had for Python" in line for line in said)
