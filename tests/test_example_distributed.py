"""The data-parallel example on two local processes (torchrun's variables): a SIGTERM on one
replica stops both after the same step with one chief checkpoint, and the resumed run ends with
the parameters of a run never preempted, bit for bit."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "examples"))
from make_data import make_dataset, to_csv  # noqa: E402

from spotorch_trainer.contract import EXIT_PEER_LOST  # noqa: E402

pytestmark = pytest.mark.slow
pytest.importorskip("torch")


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("data")
    x, y = make_dataset(rows=1500, features=16, classes=3, seed=0)
    for i, rows in enumerate(range(0, len(y), 500)):
        (folder / f"part-{i:05d}.csv").write_bytes(to_csv(x[rows:rows + 500], y[rows:rows + 500]))
    return folder


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def replicas(out: Path, data: Path, *, sleep: float = 0.0,
             sigterm_rank_after_s: tuple[int, float] | None = None,
             sig: signal.Signals = signal.SIGTERM, timeout_s: float = 20) -> list[int]:
    """Run both replicas to their end; optionally signal one of them. -> exit codes."""
    env = {**os.environ, "PYTHONPATH": f"{REPO / 'examples' / 'trainer'}:{REPO / 'trainer'}",
           "EXAMPLE_DATA": str(data), "EXAMPLE_MODEL_DIR": str(out / "model"),
           "SPOTORCH_CHECKPOINT_URI": str(out / "ckpt"), "EXAMPLE_TOTAL_STEPS": "200",
           "EXAMPLE_CHECKPOINT_EVERY": "25", "EXAMPLE_STEP_SLEEP": str(sleep),
           "EXAMPLE_COLLECTIVE_TIMEOUT": str(timeout_s), "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(free_port()), "WORLD_SIZE": "2"}
    env.pop("CLUSTER_SPEC", None)
    procs = [subprocess.Popen([sys.executable, "-m", "spotorch_example.distributed"],
                              env={**env, "RANK": str(rank)}, stdout=subprocess.DEVNULL,
                              stderr=(out / f"rank{rank}.log").open("ab"))
             for rank in (0, 1)]
    if sigterm_rank_after_s is not None:
        rank, after = sigterm_rank_after_s
        deadline = time.monotonic() + 60
        while not (out / "ckpt").exists() and time.monotonic() < deadline:
            time.sleep(0.05)  # training has begun (the first checkpoint folder)
        time.sleep(after)
        procs[rank].send_signal(sig)
    if sig is signal.SIGSTOP:  # the survivor's collective times out; then take the hung one away
        survivor = procs[1 - rank].wait(timeout=60)
        procs[rank].kill()
        codes = [0, 0]
        codes[1 - rank], codes[rank] = survivor, procs[rank].wait(timeout=10)
        return codes
    return [p.wait(timeout=120) for p in procs]


@pytest.mark.parametrize("rank", [1])
def test_a_preempted_replica_stops_both_and_the_resumed_model_is_bitwise_the_same(
        tmp_path: Path, data: Path, rank: int) -> None:
    reference, preempted = tmp_path / "reference", tmp_path / "preempted"
    for d in (reference, preempted):
        d.mkdir()
    assert replicas(reference, data) == [0, 0]
    assert replicas(preempted, data, sleep=0.02, sigterm_rank_after_s=(rank, 0.5)) == [143, 143]
    steps = sorted(p.name for p in (preempted / "ckpt").iterdir())
    stopped = int(steps[-1].removeprefix("step-"))
    assert 25 < stopped < 200 and not (preempted / "model").exists()
    assert replicas(preempted, data) == [0, 0]  # resumed: the chief's step, on both
    want = json.loads((reference / "model" / "metrics.json").read_text())
    got = json.loads((preempted / "model" / "metrics.json").read_text())
    assert got["resumed_from_step"] == stopped
    assert got["params_sha256"] == want["params_sha256"]
    assert got["test_accuracy"] == want["test_accuracy"] > 0.8


def test_a_hung_replica_ends_its_peer_with_the_peer_lost_code_and_no_new_checkpoint(
        tmp_path: Path, data: Path) -> None:
    began = time.monotonic()
    codes = replicas(tmp_path, data, sleep=0.02, sigterm_rank_after_s=(1, 0.3),
                     sig=signal.SIGSTOP, timeout_s=3)
    assert codes[0] == EXIT_PEER_LOST  # the chief: its all-reduce timed out
    assert time.monotonic() - began < 40
    steps = sorted(int(p.name.removeprefix("step-")) for p in (tmp_path / "ckpt").iterdir())
    assert steps and steps[-1] % 25 == 0  # only the periodic checkpoints: none half-made
    assert "lost a peer" in (tmp_path / "rank0.log").read_text()
