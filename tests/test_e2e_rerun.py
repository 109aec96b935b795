"""Issue 30 on the local stack: a run records its inputs; after one of its data objects is
overwritten, `spotorch rerun` trains on exactly what the run trained on (the same generations,
package, seed) and reproduces its metrics; a fresh snapshot of the new data does not."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from spotorch.adapters.gcp.firestore import FirestoreDocumentStore
from spotorch.core.model import Run
from spotorch.local import demo
from spotorch.local.demo_scenarios import SCENARIOS, pipeline_document
from spotorch.local.stack import DevStack

pytestmark = [pytest.mark.emulator, pytest.mark.slow]
ROOT = Path(__file__).resolve().parent.parent
TICK_S = 2.0
TRAINER_ENV = {"EXAMPLE_TOTAL_STEPS": "60", "EXAMPLE_STEP_SLEEP": "0.0",
               "EXAMPLE_CHECKPOINT_EVERY": "20", "EXAMPLE_PROGRESS_INTERVAL": "1"}


def _csv(seed: int) -> bytes:
    sys.path.insert(0, str(ROOT / "examples"))
    from make_data import make_dataset, to_csv

    x, y = make_dataset(rows=600, features=8, classes=3, seed=seed)
    return bytes(to_csv(x, y))


def _wait(docs: FirestoreDocumentStore, what: str, found: Callable[[list[Run]], Run | None],
          timeout_s: float = 240.0) -> Run:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        runs = [Run.from_dict(d) for d in docs.query("runs", "pipeline", demo.PIPELINE)]
        hit = found(runs)
        if hit is not None and hit.status.terminal:
            return hit
        time.sleep(1.0)
    raise AssertionError(f"{what}: no finished run after {timeout_s}s")


def _metrics(run: Run) -> dict[str, Any]:
    """The run's final metrics, less the serving latencies the trainer measures on its machine
    (spotorch_trainer.latency.MEASURED: timings, which no rerun reproduces to the bit)."""
    from spotorch_trainer import GcsStorage
    from spotorch_trainer.latency import MEASURED

    loaded: dict[str, Any] = json.loads(GcsStorage().read(f"{run.output_uri}/metrics.json"))
    assert set(loaded) >= MEASURED, "the example trainer reports its serving latencies"
    return {k: v for k, v in loaded.items() if k not in MEASURED}


def test_a_rerun_after_an_overwrite_reproduces_the_metrics_exactly(tmp_path: Path) -> None:
    (tmp_path / "pipelines").mkdir()
    document = pipeline_document(SCENARIOS["default"])
    document["job"]["worker_pools"][0]["env"] = TRAINER_ENV
    document["recovery"]["escalation"] = "never"
    document.pop("routes", None)
    (tmp_path / "pipelines" / "demo.yaml").write_text(yaml.safe_dump(document))
    with DevStack(pipelines_dir=tmp_path / "pipelines", run_dir=tmp_path / "stack",
                  tick_seconds=TICK_S) as stack:
        saved = dict(os.environ)
        os.environ.update(stack.env)
        try:
            stack.create_buckets([demo.LANDING, demo.CHECKPOINTS, demo.MODELS])
            docs = FirestoreDocumentStore(project=stack.project)
            folder = f"{demo.DATA_PREFIX}rerun/"
            stack.upload(demo.LANDING, f"{folder}part-0.csv", _csv(1))
            stack.upload(demo.LANDING, f"{folder}part-1.csv", _csv(2))
            stack.upload(demo.LANDING, f"{folder}_SUCCESS", b"")
            first = _wait(docs, "first run", lambda runs: runs[0] if runs else None)
            assert first.status == "SUCCEEDED", first.history
            prov = first.provenance
            assert prov is not None and prov["data"]["pinned"]
            recorded = {o["name"]: o["generation"] for o in prov["data"]["objects"]}
            assert set(recorded) == {f"{folder}part-0.csv", f"{folder}part-1.csv",
                                     f"{folder}_SUCCESS"}
            original = _metrics(first)

            # The data changes under the same name: a new generation of part-0.csv.
            stack.upload(demo.LANDING, f"{folder}part-0.csv", _csv(99))
            cli = subprocess.run([sys.executable, "-m", "spotorch.operate.cli", "rerun",
                                  first.run_id, "--request-id", "after-overwrite", "--json"],
                                 env={**os.environ, "COLUMNS": "200"}, capture_output=True,
                                 text=True, timeout=120, cwd=ROOT)
            assert cli.returncode == 0, cli.stderr
            rerun_id = json.loads(cli.stdout)["run_id"]
            again = _wait(docs, "rerun", lambda runs: next(
                (r for r in runs if r.run_id == rerun_id), None))
            assert again.status == "SUCCEEDED", again.history
            assert again.rerun_of == first.run_id
            assert again.provenance is not None
            assert again.provenance["data"] == prov["data"]
            assert again.provenance["seed"] == prov["seed"]
            assert again.provenance["code"] == prov["code"]
            assert _metrics(again) == original  # every figure, the data digest and the config

            # A fresh snapshot of the folder (a new marker) trains on the new generation.
            stack.upload(demo.LANDING, f"{folder}_SUCCESS", b"")
            fresh = _wait(docs, "fresh run", lambda runs: next(
                (r for r in runs if r.run_id not in (first.run_id, rerun_id)), None))
            assert fresh.status == "SUCCEEDED", fresh.history
            assert fresh.provenance is not None
            now = {o["name"]: o["generation"] for o in fresh.provenance["data"]["objects"]}
            assert now[f"{folder}part-0.csv"] != recorded[f"{folder}part-0.csv"]
            assert now[f"{folder}part-1.csv"] == recorded[f"{folder}part-1.csv"]
            changed = _metrics(fresh)
            assert changed["data_sha256"] != original["data_sha256"]
            assert changed != original
        finally:
            os.environ.clear()
            os.environ.update(saved)
