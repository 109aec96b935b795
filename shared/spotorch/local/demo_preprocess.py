"""The demo's preprocess stories (issue 31): a Beam step on the local Dataflow, then training.

`preprocess`: the pipeline gets a preprocess step (examples/trainer's spotorch_example.preprocess:
each feature scaled to zero mean and unit variance, written as two CSV shards). The upload's run
goes PREPROCESSING: the local Dataflow runs the Beam module with the DirectRunner, its statusChanged
events reach on_job_event, and once GetJob says JOB_STATE_DONE the training starts on the step's
output; Spot takes back its first attempt, which resumes. Then a second snapshot with the same
files lands in another folder: its run finds the output of the same key complete and reuses it
(cache_hit), launching no Dataflow job. The report's `preprocess` section names the job, its
final state and its output, and whether the trainer read exactly that output (the data digest
its metrics.json records, against the output's files).

`preprocess-error`: the step is told the model takes 8 features (--expected_features 8) while
the snapshot has 16: the Beam transform that parses rows raises, the Dataflow job fails, and the
run ends FAILED (a user error) with the transform's error text.

Registered in demo_scenarios.SCENARIOS by name; plain values, so that importing this module
needs nothing of the demo's.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Mapping
from typing import Any

MODULE = "spotorch_example.preprocess"
PREPROCESS_BUCKET = "spotorch-preprocess"
_TRAINER_ENV = {"EXAMPLE_TOTAL_STEPS": "400", "EXAMPLE_STEP_SLEEP": "0.03",
                "EXAMPLE_CHECKPOINT_EVERY": "50", "EXAMPLE_PROGRESS_INTERVAL": "1"}


def _step(options: Mapping[str, Any]) -> dict[str, Any]:
    return {"python_module": MODULE, "output_uri": f"gs://{PREPROCESS_BUCKET}/demo",
            "machine_type": "n1-standard-2", "max_workers": 2, "options": dict(options),
            "timeout": "10m"}


def document(doc: dict[str, Any]) -> dict[str, Any]:
    """The demo pipeline with a preprocess step that normalizes the shards."""
    doc["preprocess"] = _step({"num_shards": 2})
    return doc


def error_document(doc: dict[str, Any]) -> dict[str, Any]:
    """The demo pipeline with a preprocess step that refuses the snapshot's rows."""
    doc["preprocess"] = _step({"num_shards": 2, "expected_features": 8})
    return doc


def preprocess_section(run: Any, stack: Any) -> dict[str, Any] | None:
    """The run's preprocess step as its record says, checked against GetJob, and whether the
    trainer read exactly its output."""
    from spotorch.core.preprocessing import step_of

    step = step_of(run) if run is not None else None
    if step is None:
        return None
    section: dict[str, Any] = {
        "job_name": step.job_name, "job_id": step.job_id, "state": step.state,
        "phase": str(step.phase), "output_uri": step.output_uri, "cache_key": step.cache_key,
        "cache_hit": step.cache_hit, "launches": step.launches,
        "failure_class": str(step.failure) if step.failure else None, "error": step.error,
        "billed": {"vcpu_s": round(step.vcpu_s, 1), "memory_gb_s": round(step.memory_gb_s, 1)}}
    if step.job_name:
        view = _steps(stack).get(step.job_name, step.region)
        section["dataflow_state"] = view.state if view is not None else None
    section["output_files"] = _csv_files(step.output_uri)
    return section


def _steps(stack: Any) -> Any:
    from spotorch import settings as S
    from spotorch.adapters.gcp.dataflow import DataflowStepLauncher

    return DataflowStepLauncher(stack.project, endpoint=stack.env[S.ENV_DATAFLOW_ENDPOINT],
                                token=stack.env.get(S.ENV_VERTEX_TOKEN))


def _csv_files(uri: str) -> list[str]:
    from spotorch_trainer.storage import list_files

    try:
        return [n for n in list_files(uri) if n.endswith(".csv")]
    except Exception:
        return []


def data_digest(uri: str) -> str | None:
    """The digest the example trainer records as data_sha256 for the CSV shards under uri
    (spotorch_example.train.load_csv_shards: each name, a NUL, its bytes, in name order)."""
    from spotorch_trainer.storage import join, list_files, read_bytes

    names = [n for n in list_files(uri) if n.endswith(".csv")]
    if not names:
        return None
    digest = hashlib.sha256()
    for name in names:
        digest.update(name.encode() + b"\0" + read_bytes(join(uri, name)))
    return digest.hexdigest()


def extend(report: dict[str, Any], run: Any, stack: Any) -> None:
    """The first run's preprocess section; then a second snapshot of the same files, followed
    to its end: its run's preprocess section (the cache)."""
    section = preprocess_section(run, stack)
    report["preprocess"] = section
    metrics = report.get("metrics") or {}
    if section is not None and section["phase"] == "DONE":
        section["trained_on_output"] = metrics.get("data_sha256") == data_digest(
            section["output_uri"]) if metrics else None
    report["second_run"] = _second_run(run, stack) if run is not None and \
        str(run.status) == "SUCCEEDED" else None


def error_extend(report: dict[str, Any], run: Any, stack: Any) -> None:
    """The failed step's section: its job, state and the transform's error."""
    report["preprocess"] = preprocess_section(run, stack)


def _second_run(first: Any, stack: Any, timeout_s: float = 180.0) -> dict[str, Any]:
    """Upload the first snapshot's files again under a new folder; follow the run it starts."""
    from spotorch.adapters.gcp.firestore import FirestoreDocumentStore
    from spotorch.core.model import Run
    from spotorch_trainer.storage import join, list_files, read_bytes

    bucket_path = first.data_uri.removeprefix("gs://")
    bucket = bucket_path.split("/", 1)[0]
    folder = first.data_uri.rstrip("/").rsplit("/", 1)[0] + f"/again-{int(time.time())}/"
    names = [n for n in list_files(first.data_uri) if n.endswith(".csv")]
    for name in names:
        stack.upload(bucket, folder.removeprefix(f"gs://{bucket}/") + name,
                     read_bytes(join(first.data_uri, name)))
    stack.upload(bucket, folder.removeprefix(f"gs://{bucket}/") + "_SUCCESS", b"")
    docs = FirestoreDocumentStore(project=stack.project)
    until = time.monotonic() + timeout_s
    second = None
    while time.monotonic() < until:
        runs = [Run.from_dict(d) for d in docs.query("runs", "pipeline", first.pipeline)]
        others = [r for r in runs if r.run_id != first.run_id and r.data_uri == folder]
        second = others[0] if others else None
        if second is not None and not second.active:
            break
        time.sleep(0.5)
    if second is None:
        return {"run_id": None, "status": "NO_RUN", "data_uri": folder}
    return {"run_id": second.run_id, "status": str(second.status), "data_uri": folder,
            "attempts": len(second.attempts),
            "preprocess": preprocess_section(second, stack)}


SETTINGS: Mapping[str, Any] = {
    "name": "preprocess",
    "title": "a Beam preprocess step, cached by input",
    "setup": "The pipeline has a preprocess step: an Apache Beam module of the example package "
             "(scale each feature to zero mean and unit variance, two CSV shards), run by the "
             "local Dataflow with Beam's DirectRunner; Spot preempts the training's attempt 1 "
             "after 10 s of running. Then the same three shards land again in another folder.",
    "expected_status": "SUCCEEDED",
    "recovery": {"escalation": "never", "backoff_base": "1s", "decision_interval": "2s",
                 "restart_overhead": "5s"},
    "vertex_schedule": {"preempt": [{"attempt": 1, "after_s": 10.0}]},
    "trainer_env": _TRAINER_ENV,
    "document": document,
    "extend": extend,
    "dataflow": True,
    "buckets": (PREPROCESS_BUCKET,),
}

ERROR_SETTINGS: Mapping[str, Any] = {
    "name": "preprocess-error",
    "title": "a Beam transform that fails",
    "setup": "The pipeline's preprocess step is told the model takes 8 features "
             "(--expected_features 8); the snapshot's rows have 16.",
    "expected_status": "FAILED",
    "recovery": {"escalation": "never", "backoff_base": "1s", "decision_interval": "2s"},
    "trainer_env": _TRAINER_ENV,
    "document": error_document,
    "extend": error_extend,
    "dataflow": True,
    "buckets": (PREPROCESS_BUCKET,),
}
