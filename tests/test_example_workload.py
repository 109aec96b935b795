"""The example workload as real processes: SIGTERM mid-run, exit 143, resume, bit-identical."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from spotorch_trainer import contract, latest_checkpoint

ROOT = Path(__file__).resolve().parent.parent
TRAIN = ROOT / "examples" / "train.py"
MAKE_DATA = ROOT / "examples" / "make_data.py"
ARGS = ["--total-steps", "300", "--checkpoint-every", "50", "--progress-interval", "1"]
MODEL_KEYS = ["b1", "b2", "w1", "w2", "x_mean", "x_std"]


def worker_env(tmp: Path, name: str, data: str, attempt: int = 1, **extra: str) -> dict[str, str]:
    """The environment spotorch gives a worker (no events topic unless asked), one BLAS thread."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SPOTORCH_", "EXAMPLE_"))}
    env.update({contract.ENV_RUN_ID: name, contract.ENV_ATTEMPT: str(attempt),
                contract.ENV_PIPELINE: "example", contract.ENV_DATA_URI: data,
                contract.ENV_CHECKPOINT_URI: str(tmp / name / "ckpt"),
                contract.ENV_MODEL_URI: str(tmp / name / "model"),
                "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", **extra})
    return env


def model_arrays(raw: bytes) -> dict[str, np.ndarray]:
    with np.load(io.BytesIO(raw)) as npz:
        return {k: npz[k] for k in npz.files}


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    out = tmp_path_factory.mktemp("snapshot")
    subprocess.run([sys.executable, str(MAKE_DATA), str(out), "--rows", "1500"], check=True,
                   capture_output=True, timeout=60)
    return str(out)


def test_preempted_run_resumes_to_a_bit_identical_model(data_dir: str, tmp_path: Path) -> None:
    # The uninterrupted reference runs alongside the run that gets preempted.
    reference = subprocess.Popen([sys.executable, str(TRAIN), *ARGS],
                                 env=worker_env(tmp_path, "reference", data_dir),
                                 stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    victim = subprocess.Popen([sys.executable, str(TRAIN), *ARGS, "--step-sleep", "0.01"],
                              env=worker_env(tmp_path, "victim", data_dir),
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    ckpt_root = str(tmp_path / "victim" / "ckpt")
    deadline = time.monotonic() + 30
    while latest_checkpoint(ckpt_root) is None:  # preempt once it is well under way
        assert victim.poll() is None and time.monotonic() < deadline, "no checkpoint in time"
        time.sleep(0.05)
    victim.send_signal(signal.SIGTERM)
    _, victim_log = victim.communicate(timeout=30)
    assert victim.returncode == contract.EXIT_PREEMPTED, victim_log
    assert "after SIGTERM" in victim_log  # the final checkpoint was written on the way out
    final = latest_checkpoint(ckpt_root)
    assert final is not None and 50 <= final.step < 300
    assert not (tmp_path / "victim" / "model").exists()

    # Attempt 2, launched the way spotorch launches it: told where to resume from.
    resumed = subprocess.run([sys.executable, str(TRAIN), *ARGS], capture_output=True, text=True,
                             timeout=60, env=worker_env(
                                 tmp_path, "victim", data_dir, attempt=2,
                                 **{contract.ENV_RESUME_FROM: final.uri,
                                    contract.ENV_RESUME_STEP: str(final.step)}))
    assert resumed.returncode == 0, resumed.stderr
    assert f"resuming from {final.uri} (step {final.step})" in resumed.stderr

    _, reference_log = reference.communicate(timeout=60)
    assert reference.returncode == 0, reference_log
    got = model_arrays((tmp_path / "victim" / "model" / "model.npz").read_bytes())
    want = model_arrays((tmp_path / "reference" / "model" / "model.npz").read_bytes())
    assert sorted(got) == sorted(want) == MODEL_KEYS
    for key in MODEL_KEYS:
        assert np.array_equal(got[key], want[key]), key
    got_metrics = json.loads((tmp_path / "victim" / "model" / "metrics.json").read_text())
    want_metrics = json.loads((tmp_path / "reference" / "model" / "metrics.json").read_text())
    assert got_metrics["test_accuracy"] == want_metrics["test_accuracy"] > 0.6  # it learned
    # what serving will see (issue 38): measured on the held-out rows, the model's bytes
    assert got_metrics["latency_p95_ms"] >= got_metrics["latency_p50_ms"] > 0
    assert got_metrics["model_size_bytes"] > 0
    assert got_metrics["test_loss"] == want_metrics["test_loss"]


def test_fail_at_step_exits_1_without_a_model(data_dir: str, tmp_path: Path) -> None:
    failed = subprocess.run([sys.executable, str(TRAIN), *ARGS], capture_output=True, text=True,
                            timeout=60, env=worker_env(tmp_path, "bad", data_dir,
                                                       EXAMPLE_FAIL_AT_STEP="120"))
    assert failed.returncode == contract.EXIT_USER_ERROR
    assert "DeliberateFailure: failing at step 120" in failed.stderr
    assert not (tmp_path / "bad" / "model").exists()
    ckpt = latest_checkpoint(str(tmp_path / "bad" / "ckpt"))
    assert ckpt is not None and ckpt.step == 100  # the periodic ones before the failure are there


def test_resuming_with_other_hyperparameters_is_refused(data_dir: str, tmp_path: Path) -> None:
    first = subprocess.run([sys.executable, str(TRAIN), "--total-steps", "60",
                            "--checkpoint-every", "20"], capture_output=True, text=True,
                           timeout=60, env=worker_env(tmp_path, "r", data_dir))
    assert first.returncode == 0, first.stderr
    second = subprocess.run([sys.executable, str(TRAIN), "--total-steps", "60", "--hidden", "8"],
                            capture_output=True, text=True, timeout=60,
                            env=worker_env(tmp_path, "r", data_dir, attempt=2))
    assert second.returncode == 1
    assert "other data or hyper-parameters" in second.stderr


@pytest.mark.emulator
def test_example_on_fake_gcs_reports_to_pubsub(emulators: Any, tmp_path: Path) -> None:
    """The demo path in small: data, checkpoints and model in a bucket, events on a topic."""
    from google.cloud import pubsub_v1, storage

    bucket = storage.Client().create_bucket(f"demo-{uuid.uuid4().hex[:8]}").name
    publisher, subscriber = pubsub_v1.PublisherClient(), pubsub_v1.SubscriberClient()
    name = f"events-{uuid.uuid4().hex[:8]}"
    topic = publisher.topic_path(emulators.project, name)
    subscription = subscriber.subscription_path(emulators.project, name)
    publisher.create_topic(name=topic)
    subscriber.create_subscription(name=subscription, topic=topic)

    data = f"gs://{bucket}/data/snapshot-1"
    subprocess.run([sys.executable, str(MAKE_DATA), data, "--rows", "600"], check=True,
                   capture_output=True, timeout=60)
    env = worker_env(tmp_path, "gcs-run", data, **{
        contract.ENV_CHECKPOINT_URI: f"gs://{bucket}/checkpoints/gcs-run",
        contract.ENV_MODEL_URI: f"gs://{bucket}/models/gcs-run",
        contract.ENV_EVENTS_TOPIC: topic})
    done = subprocess.run([sys.executable, str(TRAIN), "--total-steps", "100",
                           "--checkpoint-every", "40"], capture_output=True, text=True,
                          timeout=60, env=env)
    assert done.returncode == 0, done.stderr

    blobs = storage.Client().bucket(bucket)
    metrics = json.loads(blobs.blob("models/gcs-run/metrics.json").download_as_bytes())
    assert {"test_accuracy", "test_loss", "train_accuracy", "train_loss", "steps"} <= set(metrics)
    assert sorted(model_arrays(blobs.blob("models/gcs-run/model.npz").download_as_bytes())) == \
        MODEL_KEYS
    assert latest_checkpoint(f"gs://{bucket}/checkpoints/gcs-run") == (
        80, f"gs://{bucket}/checkpoints/gcs-run/step-0000000080")

    kinds: list[str] = []
    deadline = time.monotonic() + 15
    while "completed" not in kinds and time.monotonic() < deadline:
        response = subscriber.pull(subscription=subscription, max_messages=50, timeout=5)
        for received in response.received_messages:
            kinds.append(received.message.attributes["kind"])
            if received.message.attributes["kind"] == "completed":
                completed = json.loads(received.message.data)
        if response.received_messages:
            subscriber.acknowledge(subscription=subscription,
                                   ack_ids=[m.ack_id for m in response.received_messages])
    assert sorted(set(kinds)) == ["checkpoint", "completed", "progress", "started"]
    assert completed["metrics"]["test_accuracy"] == metrics["test_accuracy"]
    assert completed["run_id"] == "gcs-run" and completed["step"] == 100
