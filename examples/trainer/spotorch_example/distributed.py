"""Data-parallel example: the MLP of spotorch_example.train on every training replica, gradients
averaged with torch.distributed over gloo (CPU), preemptible on any replica.

    python -m spotorch_example.distributed        (one process per replica; EXAMPLE_* options)

Each replica of workerpool0 (the chief) and workerpool1 takes its contiguous share of every global
batch (spotorch_trainer.Cluster.shard_range). One all_reduce per step sums the share-weighted
gradients, the loss and the replicas' stop votes, so every replica applies the same update and a
SIGTERM on any one stops all after the same step; only the chief writes checkpoints, and every
replica resumes the step the chief broadcasts. The batch of a step is a pure function of the seed
and the step, and the state is float64 numpy, so a run preempted and resumed with the same world
size ends with the same parameters, bit for bit, as one that was never preempted (metrics.json:
params_sha256). torch is imported here only: spotorch_example.train does not need it.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import logging
import os
import sys
import time
from typing import Any

import numpy as np

from spotorch_example.train import (
    METRICS_FILE,
    MODEL_FILE,
    Config,
    Dataset,
    evaluate,
    fresh_state,
    gradients,
    learning_rate,
    load_shards,
    npz_bytes,
    parse_config,
    split,
)
from spotorch_trainer import (
    Cluster,
    Preempted,
    Run,
    join,
    shard_range,
    snapshot_objects,
    write_bytes,
)
from spotorch_trainer.contract import EXIT_PEER_LOST, EXIT_PREEMPTED

log = logging.getLogger("example.distributed")
TIMEOUT_ENV = "EXAMPLE_COLLECTIVE_TIMEOUT"  # seconds a collective waits for a peer (gloo: 30 min)
# "R:S": rank R sleeps S seconds more per step: a slower VM, for the straggler rule's demo
SLOW_RANK_ENV = "EXAMPLE_SLOW_RANK"


def extra_sleep(rank: int, setting: str) -> float:
    """The seconds more per step EXAMPLE_SLOW_RANK gives this rank (0 for the others)."""
    slow_rank, _, seconds = setting.partition(":")
    return float(seconds) if slow_rank.strip() and int(slow_rank) == rank else 0.0


def params_digest(params: dict[str, np.ndarray]) -> str:
    """sha256 of the parameters' bytes, in name order: equal digests, equal models."""
    digest = hashlib.sha256()
    for name in sorted(params):
        digest.update(name.encode() + np.ascontiguousarray(params[name]).tobytes())
    return digest.hexdigest()


def batch_of(cfg: Config, data: Dataset, step: int) -> np.ndarray:
    """The global batch of a step: a pure function of the seed and the step."""
    return np.random.default_rng([cfg.seed, 4, step]).integers(0, len(data.y_train),
                                                                 cfg.batch_size)


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    cfg = parse_config(argv)
    cluster = Cluster.from_env()
    if not cluster.trainer:
        log.info("%s-%d is not a training replica: nothing to do", cluster.task_type,
                 cluster.task_index)
        return 0
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)  # one core per replica
    timeout = datetime.timedelta(seconds=float(os.environ.get(TIMEOUT_ENV) or 60))
    if cluster.distributed:
        dist.init_process_group("gloo", init_method=cluster.init_method, rank=cluster.rank,
                                world_size=cluster.world_size, timeout=timeout)
    log.info("rank %d of %d (%s-%d), chief at %s", cluster.rank, cluster.world_size,
             cluster.task_type, cluster.task_index, cluster.init_method)

    def from_chief(step: int) -> int:
        value = torch.tensor([step], dtype=torch.int64)
        dist.broadcast(value, src=0)
        return int(value.item())

    try:
        return _train(cfg, cluster, from_chief, torch, dist)
    except RuntimeError as exc:  # a peer died (at once) or hung (after the timeout)
        log.error("rank %d lost a peer: %s", cluster.rank, str(exc)[:300])
        logging.shutdown()
        os._exit(EXIT_PEER_LOST)  # the chief's last complete checkpoint stays the resume point
    except Preempted as stop:
        # Reported, checkpointed and flushed (the Run's exit). Leave without the interpreter's
        # teardown: gloo's process group, its peer already gone, could abort it (SIGABRT, -6)
        # instead of the 143 Vertex and spotorch expect.
        logging.shutdown()
        os._exit(int(stop.code) if isinstance(stop.code, int) else EXIT_PREEMPTED)


def _train(cfg: Config, cluster: Cluster, from_chief: Any, torch: Any, dist: Any) -> int:
    with Run(total_steps=cfg.total_steps, checkpoint_every=cfg.checkpoint_every or None,
             keep_last=cfg.keep, progress_interval_s=cfg.progress_interval,
             samples_per_step=cfg.batch_size, agree_step=from_chief) as run:
        data_uri = cfg.data or run.env.data_uri
        if not data_uri:
            raise SystemExit("no data: set SPOTORCH_DATA_URI or pass --data")
        pinned = snapshot_objects(run.env.inputs_uri or "") if not cfg.data else None
        x, y, sha = load_shards(data_uri, pinned)
        data = split(x, y, cfg.holdout, cfg.seed, sha)
        ckpt = run.restore()
        state = ckpt.state if ckpt else fresh_state(cfg, data)
        params, velocity = state["params"], state["velocity"]
        names = sorted(params)
        mine = shard_range(cfg.batch_size, cluster.rank, cluster.world_size)
        share = (mine.stop - mine.start) / cfg.batch_size
        log.info("rank %d: %d train rows, batch share %d of %d, from step %d", cluster.rank,
                 len(data.y_train), mine.stop - mine.start, cfg.batch_size, run.start_step)
        sleep = cfg.step_sleep + extra_sleep(cluster.rank, os.environ.get(SLOW_RANK_ENV, ""))
        world = cluster.world_size
        for step in run.steps():
            if sleep:
                time.sleep(sleep)  # stands in for a heavier step; SIGTERM lands here
            idx = batch_of(cfg, data, step)[mine]
            loss, grads = gradients(params, data.x_train[idx], data.y_train[idx])
            # One collective: the share-weighted gradients (their sum is the global batch's
            # mean gradient), the loss, the stop votes and each replica's own step time.
            flat = np.concatenate([grads[n].ravel() * share for n in names]
                                  + [np.array([loss * share, run.stop_vote(),
                                               *run.step_time_vote()])])
            buf = torch.from_numpy(flat)
            if cluster.distributed:
                dist.all_reduce(buf, op=dist.ReduceOp.SUM)
            total = buf.numpy()
            run.agree_stop(float(total[-world - 1]))
            run.agree_step_times(total[-world:].tolist())
            at = 0
            lr = learning_rate(cfg, step)
            for n in names:
                g = total[at:at + params[n].size].reshape(params[n].shape)
                at += params[n].size
                v = velocity[n]
                v *= cfg.momentum
                v += g + cfg.weight_decay * params[n]
                params[n] -= lr * v
            run.log_metrics(loss=float(total[-world - 2]))
            if run.checkpoint_due():
                run.checkpoint(state)
        if cluster.chief:
            _write_outputs(cfg, run, data, params, cluster)
    if cluster.distributed:
        dist.destroy_process_group()
    return 0


def _write_outputs(cfg: Config, run: Run, data: Dataset, params: dict[str, np.ndarray],
                   cluster: Cluster) -> None:
    model_dir = cfg.model_dir or run.env.model_uri
    metrics = evaluate(cfg, params, data)
    write_bytes(join(model_dir, MODEL_FILE),
                npz_bytes({**params, "x_mean": data.mean, "x_std": data.std}))
    summary = {**metrics, "steps": cfg.total_steps, "world_size": cluster.world_size,
               "resumed_from_step": run.start_step, "params_sha256": params_digest(params),
               "data_sha256": data.sha256}
    write_bytes(join(model_dir, METRICS_FILE), json.dumps(summary, indent=2,
                                                          sort_keys=True).encode())
    run.log_metrics(**metrics)
    log.info("done: test accuracy %.4f, params %s", metrics["test_accuracy"],
             summary["params_sha256"][:16])


if __name__ == "__main__":
    sys.exit(main())
