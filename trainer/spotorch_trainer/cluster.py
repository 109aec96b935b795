"""Where this replica sits in a multi-replica job: rank, world size, the chief's address, its shard.

Vertex AI describes the cluster in CLUSTER_SPEC on every replica (docs/trainer-guide.md): pools
workerpool0 (the chief, one replica) and workerpool1 (workers) form the training world, in that
order; workerpool2 (parameter servers or Reduction Server) and workerpool3 (evaluators) are not
part of it. Without CLUSTER_SPEC, torchrun's RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT are
read; without either, the replica is alone (rank 0 of 1). Standard library only.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

CLUSTER_SPEC = "CLUSTER_SPEC"
TRAINING_POOLS = ("workerpool0", "workerpool1")  # the data-parallel world, chief first
DEFAULT_PORT = 29500  # torchrun's, for a single replica that still opens a process group

T = TypeVar("T")


class ClusterError(ValueError):
    """CLUSTER_SPEC or the torchrun variables are set but do not describe a cluster."""


@dataclass(frozen=True)
class Cluster:
    """This replica's place: rank among the training replicas, their number, the chief's address."""

    rank: int = 0
    world_size: int = 1
    master_addr: str = "127.0.0.1"
    master_port: int = DEFAULT_PORT
    task_type: str = "local"  # Vertex's pool name (workerpool0...), "torchrun" or "local"
    task_index: int = 0
    trainer: bool = True  # False on parameter servers, Reduction Server and evaluators

    @property
    def chief(self) -> bool:
        """Whether this replica is the one that checkpoints and reports (rank 0 of the world)."""
        return self.trainer and self.rank == 0

    @property
    def distributed(self) -> bool:
        """Whether there are other training replicas to agree with."""
        return self.trainer and self.world_size > 1

    @property
    def init_method(self) -> str:
        """The rendezvous URL for torch.distributed.init_process_group (the chief's address)."""
        return f"tcp://{self.master_addr}:{self.master_port}"

    def shard(self, items: Sequence[T]) -> Sequence[T]:
        """This replica's contiguous share of items (the last ranks get one fewer when uneven)."""
        return items[shard_range(len(items), self.rank, self.world_size)]

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Cluster:
        """Read CLUSTER_SPEC, else torchrun's variables, else a single replica."""
        env = os.environ if environ is None else environ
        if (env.get(CLUSTER_SPEC) or "").strip():
            return _from_cluster_spec(env[CLUSTER_SPEC])
        if (env.get("WORLD_SIZE") or "").strip():
            return _from_torchrun(env)
        return cls()


def shard_range(count: int, rank: int, world_size: int) -> slice:
    """The slice of count items that rank owns: contiguous, sizes differ by at most one."""
    if world_size < 1 or not 0 <= rank < world_size:
        raise ClusterError(f"rank {rank} is not in a world of {world_size}")
    base, extra = divmod(count, world_size)
    start = rank * base + min(rank, extra)
    return slice(start, start + base + (1 if rank < extra else 0))


def _split(address: str) -> tuple[str, int]:
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        raise ClusterError(f"{address!r} is not host:port")
    return host, int(port)


def _from_cluster_spec(raw: str) -> Cluster:
    try:
        spec = json.loads(raw)
        pools: Mapping[str, list[str]] = spec["cluster"]
        task_type, index = str(spec["task"]["type"]), int(spec["task"]["index"])
    except (ValueError, KeyError, TypeError) as exc:
        raise ClusterError(f"{CLUSTER_SPEC} is not Vertex AI's cluster description: {exc}") \
            from exc
    chiefs, workers = (list(pools.get(p) or []) for p in TRAINING_POOLS)
    world = chiefs + workers
    if not world:
        raise ClusterError(f"{CLUSTER_SPEC} has no workerpool0")
    host, port = _split(world[0])
    trainer = task_type in TRAINING_POOLS
    rank = (index if task_type == TRAINING_POOLS[0] else len(chiefs) + index) if trainer else 0
    if trainer and rank >= len(world):
        raise ClusterError(f"{CLUSTER_SPEC}: {task_type} index {index} is not in the cluster")
    return Cluster(rank=rank, world_size=len(world), master_addr=host, master_port=port,
                   task_type=task_type, task_index=index, trainer=trainer)


def _from_torchrun(env: Mapping[str, str]) -> Cluster:
    try:
        world, rank = int(env["WORLD_SIZE"]), int(env.get("RANK") or 0)
        port = int(env.get("MASTER_PORT") or DEFAULT_PORT)
    except ValueError as exc:
        raise ClusterError(f"RANK/WORLD_SIZE/MASTER_PORT: {exc}") from exc
    if world < 1 or not 0 <= rank < world:
        raise ClusterError(f"RANK={rank} is not in WORLD_SIZE={world}")
    return Cluster(rank=rank, world_size=world,
                   master_addr=env.get("MASTER_ADDR") or "127.0.0.1", master_port=port,
                   task_type="torchrun", task_index=rank)
