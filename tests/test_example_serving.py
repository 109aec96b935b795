"""The example trainer's model as Vertex's prebuilt scikit-learn container serves it
(model.joblib), and its held-out evaluation reported for the promotion gate (issue 37)."""

from __future__ import annotations

import io
import re
import subprocess
import sys
from pathlib import Path

import numpy as np

from spotorch_trainer.evaluation import ENV_EVAL_DATA_URI
from test_example_workload import MAKE_DATA, TRAIN, model_arrays, worker_env


def test_the_example_writes_a_servable_model_and_scores_the_held_out_folder(
        tmp_path: Path) -> None:
    import joblib

    data, holdout = tmp_path / "data", tmp_path / "holdout"
    for out, seed in ((data, "1"), (holdout, "2")):
        subprocess.run([sys.executable, str(MAKE_DATA), str(out), "--rows", "600", "--seed", seed],
                       check=True, capture_output=True, timeout=60)
    done = subprocess.run([sys.executable, str(TRAIN), "--total-steps", "150",
                           "--checkpoint-every", "0"], capture_output=True, text=True, timeout=120,
                          env={**worker_env(tmp_path, "r1", str(data)),
                               ENV_EVAL_DATA_URI: str(holdout)})
    assert done.returncode == 0, done.stderr
    model_dir = tmp_path / "r1" / "model"
    served = joblib.load(io.BytesIO((model_dir / "model.joblib").read_bytes()))
    params = model_arrays((model_dir / "model.npz").read_bytes())
    x = np.random.default_rng(0).normal(size=(64, params["w1"].shape[0])) * 2
    h = np.tanh((x - params["x_mean"]) / params["x_std"] @ params["w1"] + params["b1"])
    want = (h @ params["w2"] + params["b2"]).argmax(axis=1)
    assert (served.predict(x) == want).all()  # the same model, raw rows in as the container does
    found = re.search(r"held-out (\S+): accuracy ([0-9.]+), p95 predict ([0-9.]+) ms", done.stderr)
    assert found is not None, done.stderr
    assert found[1] == str(holdout) and 0.0 <= float(found[2]) <= 1.0 and float(found[3]) > 0
