"""The trainer helper in a multi-replica job: rank and world size, shards, one voice, one stop."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from spotorch_trainer import (
    Cluster,
    ClusterError,
    ListReporter,
    Preempted,
    Run,
    TrainerEnv,
    latest_checkpoint,
    list_checkpoints,
    shard_range,
    write_checkpoint,
)

# Vertex AI's CLUSTER_SPEC for a chief, two workers, a parameter server and an evaluator.
POOLS = {"workerpool0": ["cmle-training-workerpool0-ab-0:2222"],
         "workerpool1": ["cmle-training-workerpool1-ab-0:2222",
                         "cmle-training-workerpool1-ab-1:2222"],
         "workerpool2": ["cmle-training-workerpool2-ab-0:2222"],
         "workerpool3": ["cmle-training-workerpool3-ab-0:2222"]}


def vertex(kind: str, index: int, pools: dict[str, list[str]] = POOLS) -> dict[str, str]:
    return {"CLUSTER_SPEC": json.dumps({"cluster": pools, "environment": "cloud",
                                        "task": {"type": kind, "index": index}})}


def test_ranks_come_from_cluster_spec_chief_first() -> None:
    chief = Cluster.from_env(vertex("workerpool0", 0))
    assert (chief.rank, chief.world_size, chief.chief, chief.distributed) == (0, 3, True, True)
    assert chief.init_method == "tcp://cmle-training-workerpool0-ab-0:2222"
    second = Cluster.from_env(vertex("workerpool1", 1))
    assert (second.rank, second.world_size, second.chief) == (2, 3, False)
    assert second.master_addr == "cmle-training-workerpool0-ab-0"
    for kind in ("workerpool2", "workerpool3"):  # not in the training world
        other = Cluster.from_env(vertex(kind, 0))
        assert not other.trainer and not other.chief and not other.distributed


def test_torchrun_variables_are_the_fallback_and_alone_is_rank_0_of_1() -> None:
    ranked = Cluster.from_env({"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "10.0.0.2",
                               "MASTER_PORT": "29400"})
    assert (ranked.rank, ranked.world_size, ranked.chief) == (1, 2, False)
    assert ranked.init_method == "tcp://10.0.0.2:29400"
    alone = Cluster.from_env({})
    assert (alone.rank, alone.world_size, alone.chief, alone.distributed) == (0, 1, True, False)
    # CLUSTER_SPEC wins over torchrun's variables (Vertex sets it on every replica).
    both = Cluster.from_env({**vertex("workerpool1", 0), "RANK": "0", "WORLD_SIZE": "1"})
    assert (both.rank, both.world_size) == (1, 3)


@pytest.mark.parametrize("env", [
    {"CLUSTER_SPEC": "not json"},
    {"CLUSTER_SPEC": json.dumps({"cluster": {}, "task": {"type": "workerpool0", "index": 0}})},
    vertex("workerpool1", 5),
    {"WORLD_SIZE": "2", "RANK": "2"},
    {"WORLD_SIZE": "two"},
])
def test_a_cluster_that_cannot_be_read_is_refused_and_the_env_falls_back_to_alone(
        env: dict[str, str]) -> None:
    with pytest.raises(ClusterError):
        Cluster.from_env(env)
    trainer_env = TrainerEnv.from_env(env)
    assert not trainer_env.cluster.distributed
    # Alone; silent unless the task it names (if any) is the chief's.
    assert trainer_env.chief == ("workerpool1" not in env.get("CLUSTER_SPEC", ""))


def test_the_env_knows_rank_and_chief() -> None:
    env = TrainerEnv.from_env(vertex("workerpool1", 0))
    assert (env.cluster.rank, env.cluster.world_size, env.chief) == (1, 3, False)
    assert TrainerEnv.from_env({"RANK": "0", "WORLD_SIZE": "2"}).chief


@pytest.mark.parametrize("count, world", [(10, 3), (3, 4), (256, 2), (0, 2), (7, 1)])
def test_shards_cover_every_item_once_in_contiguous_near_equal_pieces(count: int,
                                                                      world: int) -> None:
    pieces = [list(range(count))[shard_range(count, r, world)] for r in range(world)]
    assert [i for piece in pieces for i in piece] == list(range(count))
    assert max(map(len, pieces)) - min(map(len, pieces)) <= 1
    cluster = Cluster(rank=world - 1, world_size=world)
    assert list(cluster.shard(list(range(count)))) == pieces[-1]
    with pytest.raises(ClusterError):
        shard_range(count, world, world)


def replica_env(tmp_path: Path, kind: str, index: int) -> TrainerEnv:
    env = TrainerEnv.from_env(vertex(kind, index, {k: POOLS[k] for k in ("workerpool0",
                                                                         "workerpool1")}))
    return TrainerEnv(run_id="run-1", attempt=1, pipeline="p", managed=True,
                      checkpoint_uri=str(tmp_path / "ckpt"), model_uri=str(tmp_path / "model"),
                      chief=env.chief, cluster=env.cluster)


def lockstep(runs: list[Run], total: int, sigterm: tuple[int, int] | None) -> dict[int, int]:
    """Drive the replicas' loops step by step as an all-reduce would; SIGTERM one of them
    (replica, at step) for real. -> replica -> the step it stopped after."""
    loops = [run.steps() for run in runs]
    stopped: dict[int, int] = {}
    for step in range(total + 1):
        for r, loop in enumerate(loops):
            if r in stopped:
                continue
            try:
                assert next(loop) == step
            except Preempted as exc:
                stopped[r] = exc.step
            except StopIteration:
                stopped[r] = total
        if len(stopped) == len(runs):
            break
        assert not stopped, f"replicas stopped at different steps: {stopped}"
        if sigterm is not None and sigterm[1] == step:
            os.kill(os.getpid(), signal.SIGTERM)  # to the replica whose handler is installed
        votes = sum(run.stop_vote() for run in runs)  # the flag rides in the gradient all-reduce
        for run in runs:
            run.agree_stop(votes)
            if run.checkpoint_due():
                run.checkpoint({"step": step + 1})
    return stopped


@pytest.mark.parametrize("preempted", [0, 1])
def test_sigterm_on_any_replica_stops_all_after_one_step_with_one_chief_checkpoint(
        tmp_path: Path, preempted: int) -> None:
    reporters = [ListReporter(), ListReporter()]
    runs = [Run(total_steps=20, checkpoint_every=5, env=replica_env(tmp_path, kind, 0),
                reporter=reporter, handle_sigterm=(r == preempted))
            for r, (kind, reporter) in enumerate(zip(("workerpool0", "workerpool1"), reporters,
                                                     strict=True))]
    for run in runs:
        run.start()
    stopped = lockstep(runs, 20, sigterm=(preempted, 7))
    assert stopped == {0: 8, 1: 8}  # every replica stopped after the same step
    for run in runs:
        run.close(Preempted(run.step, run.last_checkpoint))
    assert [c.step for c in list_checkpoints(str(tmp_path / "ckpt"))] == [5, 8]
    assert reporters[1].messages == []  # the worker has no voice; the chief reports for all
    kinds = reporters[0].kinds
    assert kinds[0] == "started" and kinds[-1] == "preempting"
    assert reporters[0].messages[-1][0]["step"] == 8


def test_every_replica_resumes_the_step_the_chief_agreed(tmp_path: Path) -> None:
    root = str(tmp_path / "ckpt")
    for step in (4, 8):
        write_checkpoint(root, step, {"state.pkl": b"x"})
    worker = replica_env(tmp_path, "workerpool1", 0)
    # The chief saw step 4 (say the latest was written after it looked): the worker follows it.
    seen: list[int] = []

    def chief_says(step: int, answer: int) -> Any:
        def agree(mine: int) -> int:
            seen.append(mine)
            return answer
        return agree

    run = Run(total_steps=10, env=worker, reporter=ListReporter(), handle_sigterm=False,
              agree_step=chief_says(4, 4))
    assert run.restore() is not None and run.start_step == 4 and seen == [8]
    fresh = Run(total_steps=10, env=worker, reporter=ListReporter(), handle_sigterm=False,
                agree_step=chief_says(-1, -1))
    assert fresh.restore() is None and fresh.start_step == 0
    single = TrainerEnv(run_id="run-1", checkpoint_uri=root, model_uri=str(tmp_path / "m"))
    alone = Run(total_steps=10, env=single, reporter=ListReporter(), handle_sigterm=False,
                agree_step=chief_says(-1, -1))
    assert alone.start().start_step == 8  # alone: nobody to agree with, the latest wins
    assert latest_checkpoint(root) == (8, f"{root}/step-0000000008")


def test_the_chief_reports_every_replicas_own_step_time_carried_in_the_all_reduce(
        tmp_path: Path) -> None:
    reporters = [ListReporter(), ListReporter()]
    runs = [Run(total_steps=6, env=replica_env(tmp_path, kind, 0), reporter=reporter,
                handle_sigterm=False, progress_interval_s=0.0)
            for kind, reporter in zip(("workerpool0", "workerpool1"), reporters, strict=True)]
    loops = [run.steps() for run in runs]
    for _ in range(6):
        votes = []
        for r, (run, loop) in enumerate(zip(runs, loops, strict=True)):
            next(loop)
            if r == 1:
                time.sleep(0.03)  # the worker's own step is slower (a slow VM)
            votes.append(run.step_time_vote())  # its step is done: the collective comes next
        assert votes[0][1] == 0.0 and votes[1][0] == 0.0  # each fills its own rank's place
        summed = [a + b for a, b in zip(*votes, strict=True)]
        for run in runs:
            run.agree_step_times(summed)
    for loop in loops:
        next(loop, None)
    progress = [m for m, _ in reporters[0].messages if m["kind"] == "progress"]
    # A world of three (CLUSTER_SPEC's chief and two workers); the third never ran here: 0.
    assert progress and all(len(m["replica_step_s"]) == 3 for m in progress)
    chief_s, worker_s, absent = progress[-1]["replica_step_s"]
    assert worker_s >= 0.025 and chief_s < worker_s / 2 and absent == 0.0
    assert reporters[1].messages == []  # the worker still has no voice of its own
