"""The Vertex emulator's workers: each replica of each worker pool as a local process."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# Vertex's TF_CONFIG task type of each worker pool, by index.
TF_TASK_TYPES = ("chief", "worker", "ps", "evaluator")
FIRST_WORKER_PORT = 2222  # Vertex's port on each replica's own host (here: free ports instead)
PYTHON_NAMES = frozenset({"python", "python3"})
STDERR_SUFFIX = ".stderr"  # a replica's stderr file beside its stdout (workerpoolP-I.log)


class SpawnError(RuntimeError):
    """A replica's command could not be started (Vertex would report exit status 127)."""

    def __init__(self, replica: str, reason: str) -> None:
        super().__init__(f"{replica}: {reason}")
        self.replica = replica


@dataclass
class Replica:
    """One running replica: which pool and index, its process and its log file."""

    pool: int
    index: int
    process: subprocess.Popen[bytes]
    log_path: Path
    argv: list[str] = field(default_factory=list)  # what it runs, to restart it in place
    env: dict[str, str] = field(default_factory=dict)
    restarts: int = 0  # times it was restarted in place (docs/vertex-emulator.md)

    @property
    def name(self) -> str:
        return f"workerpool{self.pool}-{self.index}"

    def exit_code(self) -> int | None:
        """The exit status as a shell reports it (128+N when killed by signal N); None: running."""
        code = self.process.poll()
        if code is None:
            return None
        return 128 - code if code < 0 else code

    def signal(self, sig: int) -> None:
        """Signal the replica's whole process group (its children too), as a VM stop would.

        Also after the leader exited: children it left behind keep the group (and so its id)
        alive, and a VM that goes away takes them with it.
        """
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, sig)


def argv_of(pool: Any, packages: Path | None = None) -> list[str]:
    """The command line of a worker pool (container or python package); [] when it has none.

    The image is ignored: the command runs on this machine. "python"/"python3" as the command
    becomes this interpreter, so workers see the same installed packages as the emulator. A
    python package is installed first (cached under `packages`; spotorch.local._vertex_packages).
    """
    if pool.python_package_spec and pool.python_package_spec.python_module:
        from spotorch.local import _vertex_packages

        spec = pool.python_package_spec
        return _vertex_packages.argv(packages or Path("packages"), spec.python_module,
                                     list(spec.package_uris), list(spec.args),
                                     spec.executor_image_uri)
    argv = [*pool.container_spec.command, *pool.container_spec.args]
    if argv and argv[0] in PYTHON_NAMES:
        argv[0] = sys.executable
    return argv


def free_ports(count: int) -> list[int]:
    """Ports free on loopback now, one per replica: every replica here shares one host, where on
    Vertex each has its own host and port 2222."""
    sockets = [socket.socket() for _ in range(count)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [int(s.getsockname()[1]) for s in sockets]
    finally:
        for s in sockets:
            s.close()


def cluster_spec(pools: Sequence[Any], pool: int, index: int,
                 ports: Sequence[int] | None = None) -> dict[str, Any]:
    """CLUSTER_SPEC as Vertex sets it: one host:port per replica, pool by pool (ports: one per
    replica in that order; None: 2222, 2223, ... as placeholders nothing listens on)."""
    total = sum(p.replica_count for p in pools)
    given = list(ports) if ports is not None else [FIRST_WORKER_PORT + j for j in range(total)]
    cluster: dict[str, list[str]] = {}
    at = 0
    for i, p in enumerate(pools):
        if p.replica_count:
            cluster[f"workerpool{i}"] = [f"127.0.0.1:{given[at + j]}"
                                         for j in range(p.replica_count)]
            at += p.replica_count
    return {"cluster": cluster, "environment": "cloud",
            "task": {"type": f"workerpool{pool}", "index": index}}


def tf_config(spec: Mapping[str, Any]) -> dict[str, Any]:
    """TF_CONFIG derived from CLUSTER_SPEC: workerpool0..3 -> chief, worker, ps, evaluator."""
    def tf_type(pool_name: str) -> str:
        index = int(pool_name.removeprefix("workerpool"))
        return TF_TASK_TYPES[index] if index < len(TF_TASK_TYPES) else pool_name

    task = spec["task"]
    return {"cluster": {tf_type(k): v for k, v in spec["cluster"].items()},
            "task": {"type": tf_type(task["type"]), "index": task["index"]},
            "environment": "cloud"}


def replica_env(job_spec: Any, job_id: str, pool: int, index: int,
                base_env: Mapping[str, str], ports: Sequence[int] | None = None) -> dict[str, str]:
    """The environment of one replica: base (the emulator's own), then Vertex's, then the pool's."""
    env = dict(base_env)
    output = job_spec.base_output_directory.output_uri_prefix.rstrip("/")
    if output:
        env.update(AIP_MODEL_DIR=f"{output}/model", AIP_CHECKPOINT_DIR=f"{output}/checkpoints",
                   AIP_TENSORBOARD_LOG_DIR=f"{output}/logs")
    spec = cluster_spec(job_spec.worker_pool_specs, pool, index, ports)
    env.update(CLOUD_ML_JOB_ID=job_id, CLUSTER_SPEC=json.dumps(spec),
               TF_CONFIG=json.dumps(tf_config(spec)), PYTHONUNBUFFERED="1")
    code = job_spec.worker_pool_specs[pool]
    code_env = code.python_package_spec.env if code.python_package_spec.python_module \
        else code.container_spec.env
    env.update({e.name: e.value for e in code_env})
    return env


SHIM = Path(__file__).with_name("_vertex_shim.py")


def _shimmed(argv: list[str], name: str) -> list[str]:
    """The replica's command under the shim that dies with the emulator (_vertex_shim)."""
    if not argv or (shutil.which(argv[0]) is None):
        raise SpawnError(name, f"cannot start {argv[:1]}: no such executable")
    return [sys.executable, "-I", str(SHIM), str(os.getpid()), "--", *argv]


def spawn(job_spec: Any, job_id: str, log_dir: Path, base_env: Mapping[str, str]) -> list[Replica]:
    """Start every replica of every pool; on failure, kill those started and raise SpawnError.

    Each replica is a process group of its own whose leader (the shim) SIGKILLs the group when
    the emulator dies: no worker outlives its job's VM, not even after a kill -9."""
    log_dir.mkdir(parents=True, exist_ok=True)
    replicas: list[Replica] = []
    pools = job_spec.worker_pool_specs
    ports = free_ports(sum(p.replica_count for p in pools))
    try:
        for p, pool in enumerate(pools):
            argv = argv_of(pool, log_dir.parent / "packages")
            for i in range(pool.replica_count):
                env = replica_env(job_spec, job_id, p, i, base_env, ports)
                replicas.append(_start(p, i, argv, env, log_dir / f"workerpool{p}-{i}.log"))
    except SpawnError:
        kill(replicas)
        raise
    return replicas


def _start(pool: int, index: int, argv: list[str], env: dict[str, str], log_path: Path,
           restarts: int = 0) -> Replica:
    name = f"workerpool{pool}-{index}"
    try:
        command = _shimmed(argv, name)
        # stdout and stderr apart, as Vertex logs them (INFO and ERROR entries): the error tail
        # of a failed job is its stderr (ListLogEntries, _vertex_logging).
        with log_path.open("ab") as log, \
                log_path.with_name(f"{name}{STDERR_SUFFIX}").open("ab") as err:
            # A session of its own: the emulator's Ctrl-C does not reach workers, and a stop
            # signals the whole process tree.
            process = subprocess.Popen(command, stdout=log, stderr=err, stdin=subprocess.DEVNULL,
                                       env=env, start_new_session=True)
    except OSError as exc:
        raise SpawnError(name, f"cannot start {argv[:1]}: {exc}") from exc
    return Replica(pool, index, process, log_path, argv, env, restarts)


def restart(replica: Replica) -> Replica:
    """The same replica started again in place: same command, environment and log file."""
    replica.signal(signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        replica.process.wait(timeout=5)
    return _start(replica.pool, replica.index, replica.argv, replica.env, replica.log_path,
                  replica.restarts + 1)


def kill(replicas: Sequence[Replica]) -> None:
    """SIGKILL every replica and reap it."""
    for r in replicas:
        r.signal(signal.SIGKILL)
    for r in replicas:
        with contextlib.suppress(subprocess.TimeoutExpired):
            r.process.wait(timeout=5)
