"""The demo's distributed story: two replicas averaging gradients over gloo, one preempted.

A Spot job of two pools (the chief and one worker) trains spotorch_example.distributed; the
Vertex emulator takes back the worker's VM alone mid-run (a single-replica schedule rule; what
that does is the emulator's `--replica-preemption`, default: the job fails with STOCKOUT). Both
replicas stop after the same step, the chief writes that step's checkpoint, spotorch relaunches,
and both replicas resume the chief's step. At the end the same training runs once more here,
never preempted, on the same snapshot: the report compares the two models (bit for bit).

Registered in demo_scenarios.SCENARIOS by name; the settings are plain values so that this
module needs nothing of the demo's at import.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[3]
MODULE = "spotorch_example.distributed"
# Vertex AI's prebuilt PyTorch training container for CPU (the XLA image); not run locally.
EXECUTOR = "us-docker.pkg.dev/vertex-ai/training/pytorch-xla.2-4.py310:latest"
PREEMPTED_REPLICA = (1, 0)  # workerpool1-0: the worker
# The unpreempted run must match the resumed one exactly: same data order, same world size,
# float64 state, one all-reduce of two addends (commutative): bitwise equal parameters.
TOLERANCE = {"params_sha256": "equal", "test_accuracy": 0.0}
# The worker's steps take 30 ms more than the chief's (the example sleeps longer on rank 1):
# the local stack cannot make one VM slower, the training code stands in for it.
_SLOW_WORKER = "1:0.03"
_TRAINER_ENV = {"EXAMPLE_TOTAL_STEPS": "600", "EXAMPLE_STEP_SLEEP": "0.02",
                "EXAMPLE_SLOW_RANK": _SLOW_WORKER,
                "EXAMPLE_CHECKPOINT_EVERY": "25", "EXAMPLE_PROGRESS_INTERVAL": "1",
                "EXAMPLE_COLLECTIVE_TIMEOUT": "30", "OMP_NUM_THREADS": "1",
                "OPENBLAS_NUM_THREADS": "1"}
_SPOT_VM = re.compile(r"Spot VM of (workerpool\d+-\d+) was preempted")


def document(doc: dict[str, Any]) -> dict[str, Any]:
    """The demo pipeline with a chief and a worker pool running the data-parallel module."""
    chief = doc["job"]["worker_pools"][0]
    chief["role"] = "chief"
    chief["python_package"] = {**chief["python_package"], "python_module": MODULE,
                               "executor_image_uri": EXECUTOR}
    worker = json.loads(json.dumps(chief))
    worker.update(role="workers", replica_count=1)
    doc["job"]["worker_pools"] = [chief, worker]
    return doc


def extend(report: dict[str, Any], run: Any, stack: Any) -> None:
    """Add what Vertex ran per attempt (pools, replicas, which replica's VM went) and the
    comparison with a run never preempted."""
    for attempt in report.get("attempts", []):
        attempt.update(_job_facts(stack, attempt.get("job_name")))
    report["single_replica_preemptions"] = [
        {"attempt": a["attempt"], "replica": a["preempted_replica"]}
        for a in report.get("attempts", []) if a.get("preempted_replica")]
    resumed = [a for a in report.get("attempts", [])[1:] if a.get("resumed_from_step")]
    report["resumed_from_chief_checkpoint"] = bool(resumed)
    metrics = report.get("metrics") or {}
    # The same seed as the run's (spotorch hands each run one; a run that does not get it
    # would draw other batches and end with other parameters).
    seed = ((run.provenance or {}).get("seed") if run is not None else None)
    reference = _unpreempted(run.data_uri, seed) if run is not None else None
    report["reference"] = reference
    report["tolerance"] = dict(TOLERANCE)
    report["comparison"] = None if reference is None or not metrics else {
        "params_equal": metrics.get("params_sha256") == reference.get("params_sha256"),
        "test_accuracy": metrics.get("test_accuracy"),
        "reference_test_accuracy": reference.get("test_accuracy"),
        "test_accuracy_diff": abs(float(metrics.get("test_accuracy", 0.0))
                                  - float(reference.get("test_accuracy", 0.0))),
    }
    if report["comparison"] is not None:
        c = report["comparison"]
        c["within_tolerance"] = bool(c["params_equal"]
                                     and c["test_accuracy_diff"] <= TOLERANCE["test_accuracy"])


def _job_facts(stack: Any, job_name: str | None) -> dict[str, Any]:
    """Pools and replicas of an attempt's job, and whose Spot VM went, as GetCustomJob says."""
    if not job_name:
        return {"replicas": 0, "pools": [], "preempted_replica": None}
    from google.cloud.aiplatform_v1 import JobServiceClient
    from google.cloud.aiplatform_v1.services.job_service.transports.grpc import (
        JobServiceGrpcTransport,
    )

    from spotorch import settings as S
    from spotorch.adapters.gcp.vertex_calls import emulator_channel

    client = JobServiceClient(transport=JobServiceGrpcTransport(channel=emulator_channel(
        stack.env[S.ENV_VERTEX_ENDPOINT], stack.env.get(S.ENV_VERTEX_TOKEN))))
    job = client.get_custom_job(name=job_name)
    pools = [{"pool": i, "replica_count": p.replica_count,
              "machine_type": p.machine_spec.machine_type}
             for i, p in enumerate(job.job_spec.worker_pool_specs) if p.replica_count]
    found = _SPOT_VM.search(job.error.message or "")
    return {"replicas": sum(p["replica_count"] for p in pools), "pools": pools,
            "preempted_replica": found.group(1) if found else None}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _unpreempted(data_uri: str, seed: int | None) -> dict[str, Any] | None:
    """The same training on the same snapshot and seed, two local replicas, never preempted."""
    out = Path(tempfile.mkdtemp(prefix="spotorch-demo-reference-"))
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SPOTORCH_", "CLUSTER_SPEC", "TF_CONFIG"))}
    env.update(_TRAINER_ENV)
    env.update({"PYTHONPATH": os.pathsep.join([str(REPO / "examples" / "trainer"),
                                               str(REPO / "trainer")]),
                "EXAMPLE_DATA": data_uri, "EXAMPLE_MODEL_DIR": str(out / "model"),
                "SPOTORCH_CHECKPOINT_URI": str(out / "checkpoints"), "EXAMPLE_STEP_SLEEP": "0",
                "EXAMPLE_SLOW_RANK": "",
                **({"SPOTORCH_SEED": str(seed)} if seed is not None else {}),
                "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port()), "WORLD_SIZE": "2"})
    procs = []
    for rank in (0, 1):
        with (out / f"rank{rank}.log").open("ab") as log:
            procs.append(subprocess.Popen([sys.executable, "-m", MODULE],
                                          env={**env, "RANK": str(rank)}, stdout=log,
                                          stderr=subprocess.STDOUT,
                                          stdin=subprocess.DEVNULL))
    try:
        codes = [p.wait(timeout=180) for p in procs]
    except subprocess.TimeoutExpired:
        for p in procs:
            p.kill()
        return None
    metrics = out / "model" / "metrics.json"
    if codes != [0, 0] or not metrics.exists():
        return {"error": f"the reference run exited {codes}; logs in {out}"}
    loaded: dict[str, Any] = json.loads(metrics.read_text())
    shutil.rmtree(out, ignore_errors=True)  # kept only when it failed (its logs)
    return loaded


SETTINGS: Mapping[str, Any] = {
    "name": "distributed",
    "title": "two replicas, one preempted",
    "setup": "A Spot job of two replicas (the chief and one worker) trains a data-parallel MLP, "
             "averaging gradients over torch.distributed (gloo, CPU); the worker's steps take "
             "longer than the chief's (its code sleeps 30 ms more per step, standing in for a "
             "slower VM). 14 s after it starts "
             "running, the Vertex emulator takes back the worker's Spot VM alone "
             "(--replica-preemption fail_job: the job fails with STOCKOUT once that replica is "
             "gone). At the end the same training runs here once more, never preempted, to "
             "compare the models.",
    "expected_status": "SUCCEEDED",
    "recovery": {"escalation": "never", "backoff_base": "1s", "decision_interval": "2s",
                 "restart_overhead": "5s",
                 # a replica that lost its peer (spotorch_trainer.contract.EXIT_PEER_LOST)
                 "retryable_exit_codes": [75]},
    # From RUNNING: the first attempt installs its package, starts torch on both replicas
    # (seconds), then trains 600 steps of 50 ms; the worker's VM goes 14 s in.
    "vertex_schedule": {"preempt": [{"attempt": 1, "after_s": 14.0,
                                     "pool": PREEMPTED_REPLICA[0],
                                     "index": PREEMPTED_REPLICA[1]}]},
    "vertex_args": ("--replica-preemption", "fail_job"),
    "trainer_env": _TRAINER_ENV,
    "document": document,
    "extend": extend,
}
