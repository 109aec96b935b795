"""Process supervision of the local stack: ports, command lines, readiness, stop and restart.

Every address is known before anything starts (the functions' env names the emulators and the
Vertex endpoint, the adapter's routes name the functions), so ports are reserved up front and a
child counts as ready only once it is alive, answers as the service it is meant to be, and
holds the listening socket itself. When another process takes a reserved port first, the
child dies with "address in use" and the whole group starts again on new ports.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from spotorch import settings as S
from spotorch.local import _stack_emulators as _emu
from spotorch.local import emulators
from spotorch.local._stack_config import (
    CLOUDEVENT,
    DATA_DIR,
    DATAFLOW_LAUNCHER,
    DATAFLOW_MODULE,
    DATAFLOW_READY_LINE,
    DATAPROC_MODULE,
    DATAPROC_READY_LINE,
    HOST,
    VERTEX_MODULE,
    VERTEX_READY_LINE,
    StackConfig,
    StackError,
)
from spotorch.local._stack_emulators import HEALTH_ANSWERS, HEALTH_PATHS
from spotorch.local._stack_iam import IAM_FILE, StackIdentities
from spotorch.local._stack_procs import (
    Child,
    Probe,
    http_probe,
    log_probe,
    log_tail,
    owned_probe,
    spawn,
    stop_groups,
    wait_ready,
)
from spotorch.local._stack_pubsub import pushed_routes, subscription_name

EMULATORS = tuple(HEALTH_PATHS)  # firestore, pubsub, gcs
EnvOf = Callable[[Mapping[str, str] | None], dict[str, str]]


def _not_found(status: int, body: bytes) -> bool:
    # functions-framework's answer to GET /robots.txt: 404 (http) or 405 (cloudevent: POST
    # only), checked with create_app(...).test_client(); it never runs the function.
    return status in (404, 405)


def _adapter_ok(status: int, body: bytes) -> bool:
    return status == 200 and body == b"ok\n"


class StackProcesses:
    """The stack's child processes by name: emulator:NAME, function:NAME, push-adapter, vertex."""

    def __init__(self, config: StackConfig, run_dir: Path, child_env: EnvOf,
                 identities: StackIdentities | None = None) -> None:
        self.config = config
        self.run_dir = run_dir
        self._child_env = child_env
        self.identities = identities or StackIdentities()
        self.children: dict[str, Child] = {}
        self.emulator_ports: dict[str, int] = {}
        self.function_ports: dict[str, int] = {}
        self.adapter_port: int | None = None
        self.vertex_port: int | None = None
        self.dataflow_port: int | None = None
        self.dataproc_port: int | None = None
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ names and places

    def pushed_functions(self) -> list[str]:
        """Functions some topic pushes to, once each."""
        return list(dict.fromkeys(f for fs in self.config.routes.values() for f in fs
                                  if self.config.functions.get(f) == CLOUDEVENT))

    def function_url(self, name: str) -> str:
        try:
            return f"http://{HOST}:{self.function_ports[name]}/"
        except KeyError:
            raise StackError(f"no function {name!r} in this stack") from None

    @property
    def data_dir(self) -> Path:
        return self.run_dir / DATA_DIR

    @property
    def vertex_workdir(self) -> Path:
        return (self.config.vertex_workdir or self.run_dir / "vertex").resolve()

    def ff_binary(self) -> Path:
        return self.config.bin_dir / "functions-framework"

    def piece(self, name: str) -> str:
        """The child a user names: firestore, pubsub, gcs, vertex, adapter, or a function."""
        aliases = {**{e: f"emulator:{e}" for e in EMULATORS},
                   **{f: f"function:{f}" for f in self.config.functions},
                   "adapter": "push-adapter", "vertex-emulator": "vertex",
                   "dataflow-emulator": "dataflow", "dataproc-emulator": "dataproc"}
        key = aliases.get(name, name)
        if key not in self.children:
            known = sorted(set(aliases) | set(self.children))
            raise StackError(f"no piece {name!r} in this stack; pieces: {', '.join(known)}")
        return key

    # ------------------------------------------------------------------ spawning

    def reserve_ports(self) -> None:
        cfg = self.config
        need_adapter = bool(self.pushed_functions())  # it delivers every subscription
        self.emulator_ports = {name: emulators.free_port() for name in EMULATORS}
        self.function_ports = {name: emulators.free_port() for name in cfg.functions}
        self.adapter_port = emulators.free_port() if need_adapter else None
        self.vertex_port = emulators.free_port() if cfg.vertex else None
        self.dataflow_port = emulators.free_port() if cfg.dataflow else None
        self.dataproc_port = emulators.free_port() if cfg.dataproc else None

    def spawn_emulator(self, name: str) -> tuple[Child, Probe]:
        cfg = self.config
        port = self.emulator_ports[name]
        durable = self.data_dir if cfg.durable else None
        if name == "firestore":
            export = _emu.latest_export(durable / "firestore") if durable else None
            argv = _emu.firestore_argv(port, export)
        elif name == "pubsub":
            argv = _emu.pubsub_argv(port, self.run_dir / "pubsub-data")
        else:
            root = durable / "gcs" if durable else None
            if root:
                root.mkdir(parents=True, exist_ok=True)
            argv = _emu.gcs_argv(port, cfg.project, S.TOPIC_GCS_NOTIFICATIONS, root)
        env = self._child_env(None)
        child = spawn(f"{name} emulator", argv, self.run_dir / f"{name}.log",
                      _emu.pubsub_env(env) if name == "pubsub" else env, port=port)
        self.children[f"emulator:{name}"] = child
        health = http_probe(f"http://{HOST}:{port}{HEALTH_PATHS[name]}", HEALTH_ANSWERS[name])
        return child, owned_probe(child, port, health)

    def spawn_function(self, name: str) -> tuple[Child, Probe]:
        cfg = self.config
        port = self.function_ports[name]
        argv = [str(self.ff_binary()), "--target", name, "--source",
                str(cfg.functions_source.resolve()), "--signature-type", cfg.functions[name],
                "--port", str(port), "--host", HOST]
        env = self._child_env(cfg.extra_env)
        env.pop(S.ENV_VERTEX_TOKEN, None)
        if cfg.vertex_iam:  # every function runs as the functions' service account of deploy/
            env.update(self.identities.function_env())
        child = spawn(f"function {name}", argv, self.run_dir / f"function-{name}.log",
                      env, cwd=cfg.cwd, port=port)
        self.children[f"function:{name}"] = child
        return child, owned_probe(child, port, http_probe(f"http://{HOST}:{port}/robots.txt",
                                                          _not_found))

    def spawn_adapter(self) -> tuple[Child, Probe]:
        """The push adapter: it delivers each function's subscription as Pub/Sub push does,
        with the subscriptions' retry policy (spotorch.local._push_adapter)."""
        cfg = self.config
        port = self.adapter_port
        assert port is not None
        argv = [sys.executable, "-m", "spotorch.local._push_adapter", "--host", HOST,
                "--port", str(port), "--pubsub", f"{HOST}:{self.emulator_ports['pubsub']}",
                "--project", cfg.project, "--mode", cfg.push,
                "--max-backoff", str(cfg.max_backoff_s),
                "--max-delivery-attempts", str(cfg.max_delivery_attempts),
                "--ack-deadline", str(cfg.ack_deadline_s)]
        if cfg.min_backoff_s is not None:
            argv += ["--min-backoff", str(cfg.min_backoff_s)]
        for topic, function in pushed_routes(cfg):
            argv += ["--deliver", f"{subscription_name(topic, function)}={topic}={function}="
                                  f"{self.function_url(function)}"]
        if cfg.gcs_events == "storage":
            argv += ["--storage-topic", S.TOPIC_GCS_NOTIFICATIONS]
        child = spawn("push adapter", argv, self.run_dir / "push-adapter.log",
                      self._child_env(None), port=port)
        self.children["push-adapter"] = child
        return child, owned_probe(child, port, http_probe(f"http://{HOST}:{port}/", _adapter_ok))

    def spawn_vertex(self) -> tuple[Child, Probe]:
        cfg = self.config
        port = self.vertex_port
        assert port is not None
        workdir = self.vertex_workdir
        workdir.mkdir(parents=True, exist_ok=True)
        argv = [sys.executable, "-m", VERTEX_MODULE, "--host", HOST, "--port", str(port),
                "--project", cfg.project, "--job-events-topic", S.TOPIC_JOB_EVENTS,
                "--workdir", str(workdir)]
        options: tuple[tuple[str, Path | float | None], ...] = (
            ("--schedule", cfg.vertex_schedule), ("--trace", cfg.vertex_trace),
            ("--trace-speed", cfg.vertex_trace_speed), ("--grace-s", cfg.vertex_grace_s))
        for flag, value in options:
            if value is not None:
                argv += [flag, str(value.resolve() if isinstance(value, Path) else value)]
        if cfg.durable:
            argv.append("--persist")
        if cfg.vertex_iam:
            argv += ["--iam", str(self.identities.write_policy(
                self.run_dir / IAM_FILE, cfg.deploy_dir.resolve(), cfg.project))]
        argv += list(cfg.vertex_args)
        log_path = self.run_dir / "vertex.log"
        # Its workers inherit this env: they publish trainer events and write checkpoints (as
        # the job's account: no token of the operator's).
        env = self._child_env(cfg.extra_env)
        env.pop(S.ENV_VERTEX_TOKEN, None)
        child = spawn("vertex emulator", argv, log_path, env, cwd=cfg.cwd, port=port)
        self.children["vertex"] = child
        ready = log_probe(log_path, f"{VERTEX_READY_LINE} {HOST}:{port}\n")
        return child, owned_probe(child, port, ready)

    def spawn_dataflow(self) -> tuple[Child, Probe]:
        """The local Dataflow: statusChanged events go to on_job_event, as deploy/'s trigger."""
        cfg = self.config
        port = self.dataflow_port
        assert port is not None
        workdir = (self.run_dir / "dataflow").resolve()
        argv = [sys.executable, "-m", DATAFLOW_MODULE, "--host", HOST, "--port", str(port),
                "--project", cfg.project, "--workdir", str(workdir),
                "--launcher-template", DATAFLOW_LAUNCHER]
        if cfg.beam_python is not None:
            argv += ["--beam-python", str(cfg.beam_python)]
        if "on_job_event" in self.function_ports:
            argv += ["--events-url", self.function_url("on_job_event")]
        if cfg.vertex_iam:  # the same tokens and deploy/ grants as the Vertex emulator's
            argv += ["--iam", str(self.identities.write_policy(
                self.run_dir / IAM_FILE, cfg.deploy_dir.resolve(), cfg.project))]
        log_path = self.run_dir / "dataflow.log"
        env = self._child_env(None)
        env.pop(S.ENV_VERTEX_TOKEN, None)
        child = spawn("dataflow emulator", argv, log_path, env, cwd=cfg.cwd, port=port)
        self.children["dataflow"] = child
        ready = log_probe(log_path, f"{DATAFLOW_READY_LINE} {HOST}:{port}\n")
        return child, owned_probe(child, port, ready)

    def spawn_dataproc(self) -> tuple[Child, Probe]:
        """The local Dataproc (issue 42): Spark batches, followed by the tick's GetBatch; a
        batch's end audit entry goes to on_job_event, as deploy/'s trigger."""
        cfg = self.config
        port = self.dataproc_port
        assert port is not None
        workdir = (self.run_dir / "dataproc").resolve()
        argv = [sys.executable, "-m", DATAPROC_MODULE, "--host", HOST, "--port", str(port),
                "--project", cfg.project, "--workdir", str(workdir)]
        if "on_job_event" in self.function_ports:
            argv += ["--events-url", self.function_url("on_job_event")]
        if cfg.spark_python is not None:
            argv += ["--spark-python", str(cfg.spark_python)]
        if cfg.vertex_iam:  # the same tokens and deploy/ grants as the Vertex emulator's
            argv += ["--iam", str(self.identities.write_policy(
                self.run_dir / IAM_FILE, cfg.deploy_dir.resolve(), cfg.project))]
        log_path = self.run_dir / "dataproc.log"
        env = self._child_env(None)
        env.pop(S.ENV_VERTEX_TOKEN, None)
        child = spawn("dataproc emulator", argv, log_path, env, cwd=cfg.cwd, port=port)
        self.children["dataproc"] = child
        ready = log_probe(log_path, f"{DATAPROC_READY_LINE} {HOST}:{port}\n")
        return child, owned_probe(child, port, ready)

    # ------------------------------------------------------------------ the whole group

    def launch(self, on_pubsub: Callable[[], None], on_pubsub_up: Callable[[], None]) -> bool:
        """Start every process at once on ports reserved up front; False if one lost its port.

        on_pubsub runs while Pub/Sub boots (build clients); on_pubsub_up once it answers
        (create topics), before the Vertex emulator starts (it publishes to a topic).
        """
        cfg = self.config
        self.reserve_ports()
        pending: dict[str, tuple[Child, Probe]] = {}
        for name in EMULATORS:
            pending[f"emulator:{name}"] = self.spawn_emulator(name)
        for name in cfg.functions:
            pending[f"function:{name}"] = self.spawn_function(name)
        if self.adapter_port is not None:
            pending["push-adapter"] = self.spawn_adapter()
        clients = threading.Thread(target=on_pubsub, daemon=True)
        clients.start()
        # Pub/Sub first: the topics must exist before anything can publish.
        first = {"emulator:pubsub": pending.pop("emulator:pubsub")}
        dead = wait_ready(first, cfg.startup_timeout_s)
        clients.join()
        if not dead:
            on_pubsub_up()
            if cfg.vertex:
                pending["vertex"] = self.spawn_vertex()
            if cfg.dataflow:
                pending["dataflow"] = self.spawn_dataflow()
            if cfg.dataproc:
                pending["dataproc"] = self.spawn_dataproc()
            dead = wait_ready(pending, cfg.startup_timeout_s)
        if not dead:
            return True
        self._raise_unless_port_taken(dead)
        self.stop(list(self.children))
        self.children.clear()
        return False

    def _raise_unless_port_taken(self, dead: Sequence[str]) -> None:
        for name in dead:
            child = self.children[name]
            if not child.port_was_taken():
                raise StackError(f"{child.name} exited with {child.process.returncode}:\n"
                                 f"{log_tail(child.log_path)}\n(log {child.log_path})")

    def stop(self, names: Sequence[str]) -> None:
        """Stop these children: the emulators last (the others may still talk to them)."""
        timeout = self.config.stop_timeout_s
        for phase in (False, True):
            children = [self.children[n] for n in names
                        if n in self.children and n.startswith("emulator:") == phase]
            if children:
                stop_groups([c.pid for c in children], timeout,
                            owned=[c.process for c in children])

    _SPAWNERS: Mapping[str, str] = {"emulator": "spawn_emulator", "function": "spawn_function"}

    def respawn(self, *keys: str) -> None:
        """Stop these children and start them again on their ports, all at once (a reload
        restarts every function: one after the other took their sum, tens of seconds on a
        loaded machine); wait until every one is ready."""
        with self._lock:
            self.stop(list(keys))
            started: dict[str, tuple[Child, Probe]] = {}
            for key in keys:
                kind, _, name = key.partition(":")
                if kind in self._SPAWNERS:
                    started[key] = getattr(self, self._SPAWNERS[kind])(name)
                else:
                    started[key] = (self.spawn_adapter() if key == "push-adapter"
                                    else self.spawn_dataflow() if key == "dataflow"
                                    else self.spawn_dataproc() if key == "dataproc"
                                    else self.spawn_vertex())
            dead = wait_ready(started, self.config.startup_timeout_s)
            if dead:
                child = self.children[dead[0]]
                raise StackError(f"{child.name} did not come back (exit "
                                 f"{child.process.returncode}):\n{log_tail(child.log_path)}")
