"""A run's provenance: what it trained on, with what code, under which pipeline, seed and hardware.

Built once, when the run is created (the decision), and never recomputed: a later overwrite of
an object, a rebuilt package or an edited pipeline file changes nothing recorded here. A rerun
(`spotorch rerun`) starts from it: the same object generations, the same package URIs or image,
the same seed, parameters and hardware. See docs/reproducibility.md.

Pure: no I/O. The document is plain JSON (Firestore map, event data, `spotorch show --json`).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from spotorch.core.ids import label_value
from spotorch.core.pipeline import JobTemplate, Pipeline, WorkerPool
from spotorch.core.pipeline_form import to_form
from spotorch.core.promotion import evaluation_record
from spotorch.core.shapes import run_pipeline

FORMAT = 1
# Objects listed on the run document itself up to this many bytes of names; beyond it the run
# keeps their count and digest, and the inputs manifest in GCS (written once, content-addressed)
# lists them all. A Firestore document holds at most 1 MiB, and a run's document holds more.
INLINE_OBJECTS_BYTES = 100_000
# The inputs manifest: {pipeline.checkpoint_uri}/INPUTS_FOLDER/{objects digest[:16]}.json
INPUTS_FOLDER = "spotorch-inputs"
MANIFEST_FORMAT = "spotorch.inputs"
HASH_PREFIX = 16  # hex digits of a digest in labels and manifest names
SEED_MODULUS = 2**31 - 1  # a seed every framework takes (numpy, torch, jax, random)

# An image reference pinned to its content: ...@sha256:<64 hex>. A tag (:latest, :2.3) is not.
_DIGEST = re.compile(r"@(sha256:[0-9a-f]{64})$")


def digest(value: Any) -> str:
    """SHA-256 of a JSON value in canonical form (sorted keys, no spaces)."""
    canonical = json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()


def seed_for(run_id: str) -> int:
    """The seed spotorch picks for a run: a stable function of its id (a rerun reuses its origin's)."""
    return int.from_bytes(hashlib.sha256(f"seed\n{run_id}".encode()).digest()[:8], "big") \
        % SEED_MODULUS


def pipeline_hash(pipeline: Pipeline) -> str:
    """Digest of the compiled pipeline (its validated attribute form), not of where it was loaded
    from: the same definition in another checkout has the same hash."""
    return digest(_scrub(to_form(pipeline)))


_LOCAL_FIELDS = frozenset({"source", "staged_files"})  # paths on the machine that built it


def _scrub(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _scrub(v) for k, v in value.items() if k not in _LOCAL_FIELDS}
    if isinstance(value, list | tuple):
        return [_scrub(v) for v in value]
    return value


def image_digest(image_uri: str) -> str | None:
    """The content digest an image reference pins (…@sha256:…), None for a tag."""
    found = _DIGEST.search(image_uri or "")
    return found.group(1) if found else None


_PACKAGE_HASH = re.compile(r"/packages/([0-9a-f]{16})/[^/]+$")


def package_hash(uri: str) -> str | None:
    """The content hash (sha256 prefix) spotorch names a built package by (spotorch.spec.packages:
    {staging_uri}/packages/{sha256[:16]}/{file}); None for a package URI given by hand."""
    found = _PACKAGE_HASH.search(uri)
    return found.group(1) if found else None


def pool_code(pool: WorkerPool) -> dict[str, Any]:
    """What one worker pool runs, and whether it is pinned to its content."""
    package = pool.python_package
    if package is not None:
        hashes = [package_hash(u) for u in package.package_uris]
        executor = image_digest(package.executor_image_uri)
        return {"kind": "python_package", "package_uris": list(package.package_uris),
                "package_hashes": hashes, "executor_image_uri": package.executor_image_uri,
                "executor_image_digest": executor, "python_module": package.python_module,
                "args": list(pool.args),
                # Built packages are named by their content; the prebuilt executor image is a
                # tag unless the pipeline names it by digest.
                "pinned": bool(hashes) and all(hashes) and executor is not None}
    image = image_digest(pool.image_uri)
    return {"kind": "container", "image_uri": pool.image_uri, "image_digest": image,
            "command": list(pool.command), "args": list(pool.args), "pinned": image is not None}


def code_of(template: JobTemplate) -> dict[str, Any]:
    """The code section: each pool's code, a digest of them all, pinned only if every pool is."""
    pools = [pool_code(p) for p in template.worker_pools]
    return {"pools": pools, "hash": digest(pools), "pinned": all(p["pinned"] for p in pools)}


def hardware_of(template: JobTemplate, choice: Mapping[str, Any] | None) -> dict[str, Any]:
    """The machines each pool runs on, as launched (after any hardware choice)."""
    return {"pools": [{"machine_type": p.machine_type, "replica_count": p.replica_count,
                       "accelerator_type": p.accelerator_type,
                       "accelerator_count": p.accelerator_count,
                       "tpu_topology": p.tpu_topology} for p in template.worker_pools],
            "candidate": (choice or {}).get("chosen")}


def machines_text(hardware: Mapping[str, Any] | None) -> str:
    """A hardware record's pools in a few words, as show, the UI and the pipelines page say
    them: "1x n1-standard-8 + 1x NVIDIA_L4; 2x n1-standard-8"."""
    return "; ".join(f"{p.get('replica_count')}x {p.get('machine_type')}"
                     + (f" + {p.get('accelerator_count')}x {p.get('accelerator_type')}"
                        if p.get("accelerator_type") else "")
                     for p in (hardware or {}).get("pools") or ())


def with_hardware(prov: Mapping[str, Any] | None, pipeline: Pipeline,
                  choice: Mapping[str, Any]) -> dict[str, Any] | None:
    """The provenance once hardware probes chose the run's machines (before its first launch):
    the chosen candidate's pools. Later changes (a quota or out-of-memory fallback) are the
    attempts' own record; a rerun starts on this choice."""
    if not prov:
        return None
    return {**prov, "hardware": hardware_of(run_pipeline(pipeline, choice).job, choice)}


def objects_hash(objects: Sequence[Mapping[str, Any]]) -> str:
    """Digest of a snapshot's objects (name and generation, sorted by name)."""
    return digest(sorted([str(o["name"]), int(o["generation"])] for o in objects))


def manifest_uri(pipeline: Pipeline, objects_digest: str) -> str:
    """Where a snapshot's inputs manifest is written: content-addressed under the checkpoint root."""
    return f"{pipeline.checkpoint_uri.rstrip('/')}/{INPUTS_FOLDER}/" \
           f"{objects_digest[:HASH_PREFIX]}.json"


def fits_inline(objects: Sequence[tuple[str, int]]) -> bool:
    """Whether a list of (name, generation) is small enough to keep in a document (a run's,
    a sweep's) rather than only in its manifest: INLINE_OBJECTS_BYTES."""
    return sum(len(str(name).encode()) + 24 for name, _ in objects) <= INLINE_OBJECTS_BYTES


def data_of(pipeline: Pipeline, data_uri: str, bucket: str | None,
            objects: Sequence[tuple[str, int]],
            bigquery: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The data section: the bucket and every object with its generation (when a snapshot names
    them), and a BigQuery snapshot's map as the intake stored it, untouched."""
    listed: list[dict[str, Any]] = [{"name": n, "generation": int(g)} for n, g in sorted(objects)]
    data: dict[str, Any] = {"uri": data_uri, "bucket": bucket, "count": len(listed),
                            "pinned": bool(listed)}
    if listed:
        data["objects_hash"] = objects_hash(listed)
        data["manifest_uri"] = manifest_uri(pipeline, data["objects_hash"])
        data["objects"] = listed if fits_inline(objects) else None
    if bigquery is not None:
        data["bigquery"] = dict(bigquery)
    return data


def build(*, pipeline: Pipeline, run_id: str, data: Mapping[str, Any],
          params: Mapping[str, Any] | None, hardware: Mapping[str, Any] | None,
          template: JobTemplate, seed: int | None = None) -> dict[str, Any]:
    """A new run's provenance. template: the job as the run launches it (its hardware choice
    applied); seed: None picks the run's own (seed_for)."""
    return {
        "format": FORMAT,
        "data": dict(data),
        "code": code_of(template),
        "pipeline": {"name": pipeline.name, "hash": pipeline_hash(pipeline)},
        "params": dict(params or {}),
        "seed": seed_for(run_id) if seed is None else int(seed),
        "hardware": hardware_of(template, hardware),
        "rerun_of": None,
        **({"preprocess": step_code_of(pipeline)} if pipeline.preprocess is not None else {}),
        **_evaluation_of(pipeline, data),
    }


def _evaluation_of(pipeline: Pipeline, data: Mapping[str, Any]) -> dict[str, Any]:
    """issue 37: the held-out data the run's model is evaluated on (model.evaluation)."""
    record = evaluation_record(pipeline.model.evaluation if pipeline.model else None, data)
    return {"evaluation": record} if record else {}


def step_code_of(pipeline: Pipeline) -> dict[str, Any]:
    """What the preprocess step runs besides the code package (recorded under code): its Beam
    module or template and its options, so a rerun's step runs as its origin's did."""
    step = pipeline.preprocess
    assert step is not None
    recorded: dict[str, Any] = {"python_module": step.python_module,
                                "template_uri": step.template_uri, "options": dict(step.options)}
    if str(step.kind) == "spark":  # issue 42: the batch's kind, Spark properties and runtime
        recorded.update(kind="spark", properties=dict(step.properties),
                        runtime_version=step.runtime_version)
    return recorded


def for_rerun(origin: Mapping[str, Any], origin_run: str, pipeline: Pipeline) -> dict[str, Any]:
    """A rerun's provenance: its origin's, word for word, and the pipeline it runs under now
    (recovery, routes and deadlines may have changed; data, code, seed, params, hardware not)."""
    now_hash = pipeline_hash(pipeline)
    recorded = dict(origin.get("pipeline") or {})
    return {**origin, "rerun_of": origin_run,
            "pipeline": {"name": pipeline.name, "hash": now_hash,
                         "origin_hash": recorded.get("hash"),
                         "changed": recorded.get("hash") != now_hash}}


def manifest(data: Mapping[str, Any], objects: Sequence[tuple[str, int]]) -> dict[str, Any]:
    """The inputs manifest the trainer reads (spotorch_trainer.snapshot_objects): the bucket and
    each object at its generation."""
    return {"format": MANIFEST_FORMAT, "version": FORMAT, "bucket": data.get("bucket"),
            "data_uri": data.get("uri"), "objects_hash": data.get("objects_hash"),
            "objects": [{"name": n, "generation": int(g)} for n, g in sorted(objects)]}


def pinned_template(template: JobTemplate, code: Mapping[str, Any],
                    hardware: Mapping[str, Any] | None = None) -> JobTemplate:
    """The job template with each pool's code and machines as recorded (a rerun's): the same
    package URIs, executor image and module, or the same image and command; the same machine
    type, replica count and accelerators. Pools beyond the record keep theirs, and so does a
    pool whose kind (package or image) changed since."""
    machines = list((hardware or {}).get("pools") or ())
    shaped = tuple(_on_machine(pool, machines[i]) if i < len(machines) else pool
                   for i, pool in enumerate(template.worker_pools))
    recorded = list(code.get("pools") or ())
    pools: list[WorkerPool] = []
    for i, pool in enumerate(shaped):
        rec = recorded[i] if i < len(recorded) else None
        if rec is None:
            pools.append(pool)
        elif rec.get("kind") == "python_package" and pool.python_package is not None:
            package = replace(pool.python_package,
                              package_uris=tuple(rec.get("package_uris") or ()),
                              executor_image_uri=str(rec.get("executor_image_uri") or ""),
                              python_module=str(rec.get("python_module") or ""),
                              staged_files=())  # the recorded packages are in GCS already
            pools.append(replace(pool, python_package=package,
                                 args=tuple(rec.get("args") or ())))
        elif rec.get("kind") == "container" and pool.python_package is None:
            pools.append(replace(pool, image_uri=str(rec.get("image_uri") or pool.image_uri),
                                 command=tuple(rec.get("command") or ()),
                                 args=tuple(rec.get("args") or ())))
        else:
            pools.append(pool)
    return replace(template, worker_pools=tuple(pools))


def _on_machine(pool: WorkerPool, rec: Mapping[str, Any]) -> WorkerPool:
    return replace(pool, machine_type=str(rec.get("machine_type") or pool.machine_type),
                   replica_count=int(rec.get("replica_count") or pool.replica_count),
                   accelerator_type=rec.get("accelerator_type"),
                   accelerator_count=int(rec.get("accelerator_count") or 0),
                   tpu_topology=rec.get("tpu_topology"))


def labels(prov: Mapping[str, Any]) -> dict[str, str]:
    """Provenance as Vertex AI labels (Model Registry versions): digest prefixes, the seed."""
    data = prov.get("data") or {}
    code = prov.get("code") or {}
    out = {"spotorch_pipeline_hash": str((prov.get("pipeline") or {}).get("hash") or "")[:16],
           "spotorch_code_hash": str(code.get("hash") or "")[:16],
           "spotorch_code_pinned": "true" if code.get("pinned") else "false",
           "spotorch_seed": str(prov.get("seed", "")),
           "spotorch_data_objects": str(data.get("count", 0))}
    if data.get("objects_hash"):
        out["spotorch_data_hash"] = str(data["objects_hash"])[:16]
    bq = data.get("bigquery")
    if isinstance(bq, Mapping):
        out["spotorch_bq_snapshot"] = digest(dict(bq))[:16]
    if prov.get("rerun_of"):
        out["spotorch_rerun_of"] = str(prov["rerun_of"])
    evaluation = prov.get("evaluation")
    if isinstance(evaluation, Mapping) and evaluation.get("identity"):
        out["spotorch_eval"] = digest(str(evaluation["identity"]))[:16]
    return {k: label_value(v) for k, v in out.items() if v != ""}


EVENT_OBJECTS = 100  # objects an event lists itself; beyond, its manifest_uri and digest do


def event_form(prov: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """Provenance as events carry it: all of it, but a long object list only by its manifest
    (an event waits in the run document's outbox, which holds at most 1 MiB)."""
    if not prov:
        return None
    data = dict(prov.get("data") or {})
    if len(data.get("objects") or ()) > EVENT_OBJECTS:
        data["objects"] = None
    return {**prov, "data": data}


def metadata(prov: Mapping[str, Any] | None) -> dict[str, str]:
    """Provenance as an Experiments run's metadata: full digests, the seed, the manifest, the
    pinning, each a string (the run's document keeps the rest)."""
    if not prov:
        return {}
    data, code = prov.get("data") or {}, prov.get("code") or {}
    out = {"pipeline_hash": (prov.get("pipeline") or {}).get("hash"),
           "code_hash": code.get("hash"), "code_pinned": str(bool(code.get("pinned"))).lower(),
           "seed": prov.get("seed"), "data_uri": data.get("uri"),
           "data_objects": data.get("count"), "data_hash": data.get("objects_hash"),
           "inputs_manifest": data.get("manifest_uri"), "rerun_of": prov.get("rerun_of")}
    if isinstance(data.get("bigquery"), Mapping):
        out["bigquery_snapshot"] = json.dumps(data["bigquery"], sort_keys=True)[:2000]
        # whole, whatever the cut above leaves of a long query
        out["bigquery_query_sha256"] = data["bigquery"].get("query_sha256")
    return {k: str(v) for k, v in out.items() if v is not None}


def summary(prov: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """A short form for people and metadata: hashes, seed, counts; no object list."""
    if not prov:
        return None
    data = dict(prov.get("data") or {})
    data.pop("objects", None)
    code = prov.get("code") or {}
    return {"data": data, "code_hash": code.get("hash"), "code_pinned": code.get("pinned"),
            "pipeline": prov.get("pipeline"), "params": prov.get("params"),
            "seed": prov.get("seed"), "hardware": prov.get("hardware"),
            "rerun_of": prov.get("rerun_of")}
