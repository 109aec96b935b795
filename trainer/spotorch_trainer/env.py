"""spotorch's environment as training code sees it: a frozen dataclass, local defaults."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field

from spotorch_trainer import contract
from spotorch_trainer.cluster import Cluster, ClusterError

# Vertex AI sets these on custom jobs; used when spotorch's own variables are absent.
AIP_MODEL_DIR = "AIP_MODEL_DIR"
AIP_CHECKPOINT_DIR = "AIP_CHECKPOINT_DIR"
CLUSTER_SPEC = "CLUSTER_SPEC"  # JSON; task.type "workerpool0" with index 0 is the chief

# Where a plain local run (no spotorch, no Vertex) keeps its files, relative to the working dir.
LOCAL_ROOT = ".spotorch/local"
LOCAL_RUN_ID = "local"
LOCAL_PIPELINE = "local"


class EnvError(ValueError):
    """A spotorch variable is set but cannot be parsed."""


def _get(env: Mapping[str, str], name: str) -> str | None:
    """A variable's value, with empty meaning unset (spotorch writes empty strings for 'none')."""
    value = env.get(name, "").strip()
    return value or None


def cluster_of(env: Mapping[str, str]) -> Cluster:
    """This replica's place in the job (CLUSTER_SPEC, else torchrun's variables, else alone)."""
    try:
        return Cluster.from_env(env)
    except ClusterError:
        pass
    # Unreadable: a single-worker job, silent unless its task (if any) names the chief.
    try:
        task = json.loads(env.get(CLUSTER_SPEC, "") or "{}").get("task") or {}
        kind, index = str(task.get("type", "workerpool0")), int(task.get("index", 0))
    except (ValueError, TypeError, AttributeError):
        return Cluster()
    return Cluster() if (kind, index) == ("workerpool0", 0) else \
        Cluster(task_type=kind, task_index=index, trainer=False)


def is_chief(env: Mapping[str, str]) -> bool:
    """Whether this replica is the chief: rank 0 of the training world (Vertex's workerpool0-0)."""
    return cluster_of(env).chief


def _int(env: Mapping[str, str], name: str) -> int | None:
    value = _get(env, name)
    if value is None:
        return None
    try:
        return int(value)
    except ValueError as exc:
        raise EnvError(f"{name}={value!r} is not an integer") from exc


@dataclass(frozen=True)
class TrainerEnv:
    """What spotorch told this worker: who it is, where checkpoints, data and model live."""

    run_id: str = LOCAL_RUN_ID
    attempt: int = 1
    pipeline: str = LOCAL_PIPELINE
    checkpoint_uri: str = f"{LOCAL_ROOT}/checkpoints"
    resume_from: str | None = None
    resume_step: int | None = None
    data_uri: str | None = None
    model_uri: str = f"{LOCAL_ROOT}/model"
    events_topic: str | None = None
    managed: bool = False  # True when spotorch launched this worker (SPOTORCH_RUN_ID is set)
    chief: bool = True  # only the chief replica writes checkpoints and reports events
    cluster: Cluster = field(default_factory=Cluster)  # rank, world size, the chief's address
    probe_steps: int | None = None  # a probe: run this many steps, report the rate, exit 0
    resume_exact: bool = False  # resume from resume_from only (spotorch sets it after divergence)
    # The attempt's key for signing reports (SPOTORCH_REPORT_KEY); kept out of repr and logs.
    report_key: str | None = field(default=None, repr=False)
    seed: int | None = None  # SPOTORCH_SEED: the run's seed (a rerun gets its origin's)
    inputs_uri: str | None = None  # SPOTORCH_INPUTS: the snapshot's objects at their generations

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> TrainerEnv:
        """Read the contract's variables; missing ones fall back to Vertex's, then defaults."""
        env = os.environ if environ is None else environ
        run_id = _get(env, contract.ENV_RUN_ID)
        resume_from = _get(env, contract.ENV_RESUME_FROM)
        resume_step = _int(env, contract.ENV_RESUME_STEP)
        if resume_from is not None and resume_step is None:
            resume_step = contract.parse_checkpoint_step(resume_from)
        if resume_from is None:
            resume_step = None  # a step without a checkpoint to load is meaningless
        attempt = _int(env, contract.ENV_ATTEMPT)
        return cls(
            run_id=run_id or LOCAL_RUN_ID,
            attempt=cls.attempt if attempt is None else attempt,
            pipeline=_get(env, contract.ENV_PIPELINE) or LOCAL_PIPELINE,
            checkpoint_uri=(_get(env, contract.ENV_CHECKPOINT_URI) or _get(env, AIP_CHECKPOINT_DIR)
                            or cls.checkpoint_uri),
            resume_from=resume_from,
            resume_step=resume_step,
            data_uri=_get(env, contract.ENV_DATA_URI),
            model_uri=(_get(env, contract.ENV_MODEL_URI) or _get(env, AIP_MODEL_DIR)
                       or cls.model_uri),
            events_topic=_get(env, contract.ENV_EVENTS_TOPIC),
            managed=run_id is not None,
            chief=cluster_of(env).chief,
            cluster=cluster_of(env),
            probe_steps=_int(env, contract.ENV_PROBE_STEPS),
            resume_exact=_get(env, contract.ENV_RESUME_EXACT) in ("1", "true", "yes"),
            report_key=_get(env, contract.ENV_REPORT_KEY),
            seed=_int(env, contract.ENV_SEED),
            inputs_uri=_get(env, contract.ENV_INPUTS),
        )


def params(env: Mapping[str, str] | None = None) -> dict[str, int | float | str | bool]:
    """A sweep trial's parameters (SPOTORCH_PARAMS, a JSON object); {} outside a sweep."""
    raw = _get(os.environ if env is None else env, contract.ENV_PARAMS)
    if raw is None:
        return {}
    try:
        value = json.loads(raw)
    except ValueError as exc:
        raise EnvError(f"{contract.ENV_PARAMS} is not JSON: {exc}") from exc
    if not isinstance(value, dict):
        raise EnvError(f"{contract.ENV_PARAMS} is not a JSON object")
    return value
