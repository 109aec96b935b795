"""Issues 30, 31 and 42 on the local stack: an exact rerun through a preprocess step, a Beam one
on the local Dataflow and a PySpark one on the local Dataproc. A run of the demo's preprocess
pipeline records its inputs; one of them is overwritten; `spotorch rerun` reuses the step's
cached output (the same key: the recorded generations and code), and with the cache deleted runs
the step's module again on the recorded generations: the same rows, and the training on them
reproduces the metrics."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from spotorch.adapters.gcp.firestore import FirestoreDocumentStore
from spotorch.core.model import Run
from spotorch.core.preprocessing import step_of
from spotorch.local import demo
from spotorch.local.dataflow_emulator import beam_available
from spotorch.local.dataproc_emulator import spark_available
from spotorch.local.demo_preprocess import PREPROCESS_BUCKET
from spotorch.local.demo_scenarios import SCENARIOS, pipeline_document
from spotorch.local.stack import DevStack
from test_e2e_rerun import TICK_S, TRAINER_ENV, _csv, _metrics, _wait

pytestmark = [pytest.mark.emulator, pytest.mark.slow]
KINDS = [
    pytest.param("preprocess", {"dataflow": True}, id="beam",
                 marks=pytest.mark.skipif(not beam_available(),
                                          reason="no Beam environment: make beam-venv")),
    pytest.param("preprocess-spark", {"dataproc": True}, id="spark",
                 marks=pytest.mark.skipif(not spark_available(),
                                          reason="no Spark environment: make spark-venv")),
]
ROOT = Path(__file__).resolve().parent.parent


def _rows(uri: str) -> list[str]:
    """Every data row of the step's output shards, sorted (the shards' order is Beam's)."""
    from google.cloud import storage

    bucket, _, prefix = uri.removeprefix("gs://").partition("/")
    client = storage.Client.create_anonymous_client()
    return sorted(line for b in client.list_blobs(bucket, prefix=prefix) if b.name.endswith(".csv")
                  for line in b.download_as_text().splitlines()[1:])


def _delete(uri: str) -> None:
    from google.cloud import storage

    bucket, _, prefix = uri.removeprefix("gs://").partition("/")
    client = storage.Client.create_anonymous_client()
    for blob in client.list_blobs(bucket, prefix=prefix):
        blob.delete()


def _rerun(run_id: str, request_id: str) -> str:
    cli = subprocess.run([sys.executable, "-m", "spotorch.operate.cli", "rerun", run_id,
                          "--request-id", request_id, "--json"],
                         env={**os.environ, "COLUMNS": "200"}, capture_output=True, text=True,
                         timeout=120, cwd=ROOT)
    assert cli.returncode == 0, cli.stderr
    return str(json.loads(cli.stdout)["run_id"])


def _step(run: Run) -> dict[str, object]:
    step = step_of(run)
    assert step is not None
    return step.to_doc()


@pytest.mark.parametrize(("scenario", "emulator"), KINDS)
def test_a_rerun_through_the_preprocess_step_reads_the_recorded_generations(
        tmp_path: Path, scenario: str, emulator: dict[str, bool]) -> None:
    (tmp_path / "pipelines").mkdir()
    document = pipeline_document(SCENARIOS[scenario])
    document["job"]["worker_pools"][0]["env"] = TRAINER_ENV
    document["recovery"]["escalation"] = "never"
    document.pop("routes", None)
    (tmp_path / "pipelines" / "demo.yaml").write_text(yaml.safe_dump(document))
    with DevStack(pipelines_dir=tmp_path / "pipelines", run_dir=tmp_path / "stack",
                  tick_seconds=TICK_S, **emulator) as stack:
        saved = dict(os.environ)
        os.environ.update(stack.env)
        try:
            stack.create_buckets([demo.LANDING, demo.CHECKPOINTS, demo.MODELS, PREPROCESS_BUCKET])
            docs = FirestoreDocumentStore(project=stack.project)
            folder = f"{demo.DATA_PREFIX}prerun/"
            stack.upload(demo.LANDING, f"{folder}part-0.csv", _csv(1))
            stack.upload(demo.LANDING, f"{folder}part-1.csv", _csv(2))
            stack.upload(demo.LANDING, f"{folder}_SUCCESS", b"")
            first = _wait(docs, "first run", lambda runs: runs[0] if runs else None, 300.0)
            assert first.status == "SUCCEEDED", first.history
            step = _step(first)
            assert step["launches"] == 1 and not step["cache_hit"]
            output = str(step["output_uri"])
            rows, original = _rows(output), _metrics(first)
            assert rows

            stack.upload(demo.LANDING, f"{folder}part-0.csv", _csv(99))  # overwritten
            cached_id = _rerun(first.run_id, "cached")
            cached = _wait(docs, "rerun (cached)", lambda runs: next(
                (r for r in runs if r.run_id == cached_id), None), 300.0)
            assert cached.status == "SUCCEEDED", cached.history
            again = _step(cached)
            assert again["cache_hit"] and again["launches"] == 0
            assert again["cache_key"] == step["cache_key"] and again["output_uri"] == output
            assert _metrics(cached) == original

            _delete(output)  # the cache is gone: the step runs again, on the recorded inputs
            fresh_id = _rerun(first.run_id, "no-cache")
            rebuilt = _wait(docs, "rerun (no cache)", lambda runs: next(
                (r for r in runs if r.run_id == fresh_id), None), 300.0)
            assert rebuilt.status == "SUCCEEDED", rebuilt.history
            third = _step(rebuilt)
            assert not third["cache_hit"] and third["launches"] == 1
            assert third["cache_key"] == step["cache_key"]
            assert _rows(output) == rows  # the recorded generations, not the overwrite
            assert _metrics(rebuilt) == original
        finally:
            os.environ.clear()
            os.environ.update(saved)
