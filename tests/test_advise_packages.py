"""`spotorch advise --probe` on a python-package pipeline through the local emulators (issue 41):
the package is built and uploaded as a deployment would, each candidate is probed by the Vertex
AI emulator installing and running it, and a probe that could not run (here: a machine the
emulator refuses) is reported but never cached as the candidate's verdict."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from spotorch.app.hardware_probes import load_cache
from spotorch.local._vertex_quota import QuotaLimits
from spotorch.local.emulators import EmulatorSet
from spotorch.local.vertex_emulator import VertexEmulator

ROOT = Path(__file__).resolve().parents[1]
pytestmark = [pytest.mark.emulator, pytest.mark.slow]


def _pipeline_file(tmp: Path) -> Path:
    doc = yaml.safe_load((ROOT / "examples" / "pipelines" / "demo.yaml").read_text())
    doc["name"] = "advise-pkg"
    doc["job"]["worker_pools"][0]["python_package"]["source"] = str(ROOT / "examples" /
                                                                   "trainer")
    doc["job"]["worker_pools"][0]["env"] = {"EXAMPLE_CHECKPOINT_EVERY": "0",
                                            "EXAMPLE_TOTAL_STEPS": "100000"}
    doc["hardware"] = {"total_steps": 100000, "probe_steps": 20, "probe_timeout": "2m",
                       "probe_budget": 5, "candidates": [
                           {"name": "cpu", "machine_type": "n1-standard-4"},
                           # a machine type the emulator's quota refuses: the probe cannot run
                           {"name": "big", "machine_type": "n1-standard-8"}]}
    path = tmp / "advise-pkg.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def test_advise_probes_a_python_package_pipeline_and_caches_no_infrastructure_failure(
        tmp_path: Path, firestore_emulator: EmulatorSet, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    from google.cloud import storage

    from spotorch.adapters.gcp.firestore import FirestoreDocumentStore
    from spotorch.operate.cli import main

    client = storage.Client.create_anonymous_client()
    client.project = firestore_emulator.project
    for bucket in ("spotorch-staging", "spotorch-checkpoints"):
        if client.lookup_bucket(bucket) is None:
            client.create_bucket(bucket)
    data = tmp_path / "data"
    subprocess.run([sys.executable, str(ROOT / "examples" / "make_data.py"), str(data),
                    "--rows", "600"], check=True, capture_output=True, timeout=120)
    emulator = VertexEmulator(firestore_emulator.project, workdir=tmp_path / "vertex",
                              grace_s=0.5, queued_s=0.05, pending_s=0.05, job_events_topic=None,
                              quotas=QuotaLimits.unlimited(),
                              resource_quotas={"*": {"custom_model_training_preemptible_cpus": 6}})
    address = emulator.start()
    # Found as `spotorch advise` finds a running local stack: by its state file alone.
    state = tmp_path / "stack.json"
    state.write_text(json.dumps({
        "status": "ready", "supervisor": {"pid": os.getpid()},
        "env": {**firestore_emulator.env(), "SPOTORCH_PROJECT": firestore_emulator.project,
                "SPOTORCH_VERTEX_ENDPOINT": address}}))
    monkeypatch.setenv("SPOTORCH_STATE", str(state))
    monkeypatch.delenv("SPOTORCH_PROJECT", raising=False)
    saved = os.environ.get("SPOTORCH_VERTEX_ENDPOINT")
    os.environ.pop("SPOTORCH_VERTEX_ENDPOINT", None)
    try:
        code = main(["advise", str(_pipeline_file(tmp_path)), "--probe", str(data), "--json"])
    finally:
        emulator.stop()
        os.environ.pop("SPOTORCH_VERTEX_ENDPOINT", None)  # the stack's, set by advise
        if saved is not None:
            os.environ["SPOTORCH_VERTEX_ENDPOINT"] = saved
    text = capsys.readouterr().out  # the emulator's log lines too: the object starts at "{"
    out = json.loads(text[text.index("\n{\n") + 1:] if not text.startswith("{\n") else text)
    rows = {r["candidate"]: r for r in out["hardware"]["rows"]}
    assert code == 0, out
    assert out["hardware"]["chosen"] == "cpu", out
    assert rows["cpu"]["fit"] and rows["cpu"]["steps_per_s"] > 0
    assert not rows["big"]["fit"] and "could not launch" in rows["big"]["reason"], rows["big"]
    docs = FirestoreDocumentStore(project=firestore_emulator.project)
    cache = load_cache(docs, "advise-pkg")
    assert set(cache) == {"cpu"}  # the refused launch is no verdict on "big"
    assert cache["cpu"].fit
