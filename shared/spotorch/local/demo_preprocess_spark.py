"""The demo's Spark preprocess stories (issue 42): a PySpark step on the local Dataproc, then training.

`preprocess-spark`: the pipeline gets a `preprocess.kind: spark` step (examples/trainer's
spotorch_example.features_spark: each feature scaled to zero mean and unit variance with Spark,
two CSV shards). The upload's run goes PREPROCESSING: the functions create a Dataproc batch
(CreateBatch under a deterministic id) that the local Dataproc runs with PySpark in local mode;
no event says a batch ended, so the tick's GetBatch follows it, and once it says SUCCEEDED the
training starts on the step's output. Then a second snapshot with the same files lands: its run
finds the output of the same key complete (cache_hit) and creates no batch. The report's
`preprocess` section names the batch (projects/P/locations/L/batches/B), its final state as
GetBatch answers it now, its DCU usage and the ledger's cost of it.

`preprocess-spark-error`: the step is told the model takes 8 features while the snapshot has 16:
parsing a row raises on an executor, the driver fails, the batch ends FAILED and the run FAILED
(a user error) with the Spark exception in its reason (`spotorch show`).

Registered in demo_scenarios.SCENARIOS by name; plain values, so that importing this module
needs nothing of the demo's.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from spotorch.local import demo_preprocess as beam

MODULE = "spotorch_example.features_spark"


def _step(options: Mapping[str, Any]) -> dict[str, Any]:
    return {"kind": "spark", "python_module": MODULE,
            "output_uri": f"gs://{beam.PREPROCESS_BUCKET}/spark",
            "properties": {"spark.executor.instances": 2}, "options": dict(options),
            "timeout": "10m"}


def document(doc: dict[str, Any]) -> dict[str, Any]:
    """The demo pipeline with a Spark step that normalizes the shards."""
    doc["preprocess"] = _step({"num_shards": 2})
    return doc


def error_document(doc: dict[str, Any]) -> dict[str, Any]:
    """The demo pipeline with a Spark step that refuses the snapshot's rows."""
    doc["preprocess"] = _step({"num_shards": 2, "expected_features": 8})
    return doc


def section(run: Any, stack: Any) -> dict[str, Any] | None:
    """The run's Spark step as its record says, the batch as GetBatch answers now, its cost."""
    from spotorch import settings as S
    from spotorch.adapters.gcp.dataproc import DataprocStepLauncher
    from spotorch.core.cost import step_cost
    from spotorch.core.preprocessing import step_of
    from spotorch.spec.prices import price_table

    step = step_of(run) if run is not None else None
    if step is None:
        return None
    out: dict[str, Any] = {
        "kind": step.kind, "batch": step.job_id, "batch_id": step.job_name,
        "state": step.state, "phase": str(step.phase), "output_uri": step.output_uri,
        "cache_key": step.cache_key, "cache_hit": step.cache_hit, "launches": step.launches,
        "failure_class": str(step.failure) if step.failure else None, "error": step.error,
        "usage": {"milli_dcu_seconds": step.milli_dcu_s,
                  "dcu_hours": round(step.milli_dcu_s / 1000 / 3600, 6),
                  "shuffle_storage_gb_seconds": step.shuffle_gb_s}}
    cost = step_cost(step.to_doc(), price_table())
    out["cost"] = {"usd": round(cost.cost, 6), "basis": list(cost.basis),
                   "unpriced": list(cost.unknown)}
    if step.job_name:
        launcher = DataprocStepLauncher(stack.project, endpoint=stack.env[S.ENV_DATAPROC_ENDPOINT],
                                        token=stack.env.get(S.ENV_VERTEX_TOKEN))
        view = launcher.get(step.job_name, step.region)
        out["dataproc_state"] = view.state if view is not None else None
    out["output_files"] = beam._csv_files(step.output_uri)
    return out


def _second(first: Any, stack: Any) -> dict[str, Any]:
    second = beam._second_run(first, stack)
    if second.get("run_id"):
        from spotorch.adapters.gcp.firestore import FirestoreDocumentStore
        from spotorch.core.model import Run

        doc, _ = FirestoreDocumentStore(project=stack.project).get("runs", second["run_id"])
        second["preprocess"] = section(Run.from_dict(doc), stack) if doc else None
    return second


def extend(report: dict[str, Any], run: Any, stack: Any) -> None:
    """The first run's Spark step, whether training read its output; then the second snapshot."""
    found = section(run, stack)
    report["preprocess"] = found
    metrics = report.get("metrics") or {}
    if found is not None and found["phase"] == "DONE":
        found["trained_on_output"] = metrics.get("data_sha256") == beam.data_digest(
            found["output_uri"]) if metrics else None
    report["second_run"] = _second(run, stack) if run is not None and \
        str(run.status) == "SUCCEEDED" else None


def error_extend(report: dict[str, Any], run: Any, stack: Any) -> None:
    """The failed step's section: its batch, state and the Spark exception."""
    report["preprocess"] = section(run, stack)


_COMMON: Mapping[str, Any] = {
    "trainer_env": beam._TRAINER_ENV,
    "dataproc": True,
    "buckets": (beam.PREPROCESS_BUCKET,),
}

SETTINGS: Mapping[str, Any] = {
    **_COMMON,
    "name": "preprocess-spark",
    "title": "a PySpark preprocess step on Dataproc Serverless, cached by input",
    "setup": "The pipeline has a Spark preprocess step: a PySpark module of the example package "
             "(scale each feature to zero mean and unit variance, two CSV shards), run as a "
             "Dataproc batch by the local Dataproc with PySpark in local mode. Then the same "
             "three shards land again in another folder.",
    "expected_status": "SUCCEEDED",
    "recovery": {"escalation": "never", "backoff_base": "1s", "decision_interval": "2s",
                 "restart_overhead": "5s"},
    "document": document,
    "extend": extend,
}

ERROR_SETTINGS: Mapping[str, Any] = {
    **_COMMON,
    "name": "preprocess-spark-error",
    "title": "a PySpark step that raises",
    "setup": "The pipeline's Spark step is told the model takes 8 features "
             "(--expected_features 8); the snapshot's rows have 16.",
    "expected_status": "FAILED",
    "recovery": {"escalation": "never", "backoff_base": "1s", "decision_interval": "2s"},
    "document": error_document,
    "extend": error_extend,
}
