"""A pipeline's job on a hardware candidate's shape (issue 19): pure, below the ledger and the
domain so both can price and launch the shape a run's hardware choice names."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from spotorch.core.pipeline import (
    HardwareCandidate,
    JobTemplate,
    Pipeline,
    PoolRole,
    WorkerPool,
    pool_role,
)


def describe(candidate: HardwareCandidate) -> str:
    """The shape in a few words: "g2-standard-8 + 1 x NVIDIA_L4 (2x2), 2 replicas"."""
    text = candidate.machine_type
    if candidate.accelerator_type:
        text += f" + {candidate.accelerator_count} x {candidate.accelerator_type}"
    if candidate.tpu_topology:
        text += f" ({candidate.tpu_topology})"
    if candidate.replica_count > 1:
        text += f", {candidate.replica_count} replicas"
    return text


def _on_shape(pool: WorkerPool, candidate: HardwareCandidate, replicas: int) -> WorkerPool:
    env = {**dict(pool.env), **dict(candidate.env)}
    return replace(pool, machine_type=candidate.machine_type,
                   accelerator_type=candidate.accelerator_type,
                   accelerator_count=candidate.accelerator_count,
                   tpu_topology=candidate.tpu_topology, replica_count=replicas,
                   env=tuple(env.items()))


def apply(template: JobTemplate, candidate: HardwareCandidate) -> JobTemplate:
    """The job template on a candidate's shape.

    The chief pool takes the shape with one replica (Vertex's chief is alone in workerpool0); a
    candidate with replica_count N > 1 gets N - 1 more replicas of the same shape and container
    in workerpool1, in place of the template's own workers (a candidate is a whole training
    shape). Pools that do not train (a reduction server, parameter servers, evaluators) stay.
    """
    given = template.worker_pools
    chief = given[0]
    pools = [_on_shape(chief, candidate, 1)]
    if candidate.replica_count > 1:
        workers = _on_shape(chief, candidate, candidate.replica_count - 1)
        pools.append(replace(workers, role=PoolRole.WORKERS if chief.role else None))
    others = [p if p.role else replace(p, role=pool_role(given, i))
              for i, p in enumerate(given)
              if pool_role(given, i) not in (PoolRole.CHIEF, PoolRole.WORKERS)]
    return replace(template, worker_pools=(*pools, *others))


def on_candidate(pipeline: Pipeline, candidate: HardwareCandidate) -> Pipeline:
    """The pipeline whose job runs on the candidate's shape."""
    return replace(pipeline, job=apply(pipeline.job, candidate))


def chosen_candidate(pipeline: Pipeline, hardware: Mapping[str, Any] | None
                     ) -> HardwareCandidate | None:
    """The candidate a run's hardware choice (HardwareChoice.to_doc()) names, if the pipeline
    still lists it."""
    chosen = (hardware or {}).get("chosen")
    search = pipeline.hardware
    if search is None or not chosen:
        return None
    return next((c for c in search.candidates if c.name == chosen), None)


def run_pipeline(pipeline: Pipeline, hardware: Mapping[str, Any] | None) -> Pipeline:
    """The pipeline as a run with this hardware choice runs it: on the chosen shape, if any."""
    candidate = chosen_candidate(pipeline, hardware)
    return pipeline if candidate is None else on_candidate(pipeline, candidate)
