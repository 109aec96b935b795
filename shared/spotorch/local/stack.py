"""The local stack: emulators, topics, push subscriptions, functions, Vertex emulator and ticker.

In-process (demo, end-to-end tests):

    with DevStack(pipelines_dir="examples/pipelines") as stack:
        stack.upload("landing", "data/part-0.csv", b"...")
        stack.pull_published(10)

In the background (`spotorch dev up` / `spotorch dev down`): up_main starts a detached supervisor
process that owns a DevStack and records it in .spotorch/stack.json; down_main stops it.
docs/local-stack.md describes the wiring.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib.util
import json
import os
import shlex
import shutil
import signal
import sys
import threading
import time
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

from spotorch import settings as S
from spotorch.local import _stack_emulators as _emu
from spotorch.local import emulators
from spotorch.local._stack_emulators import HEALTH_PATHS
from spotorch.local._stack_procs import (
    Child,
    Probe,
    any_probe,
    http_probe,
    is_same_process,
    log_probe,
    log_tail,
    proc_start_time,
    spawn,
    stop_groups,
    tcp_probe,
    wait_ready,
)
from spotorch_trainer.contract import rfc3339

HOST = "127.0.0.1"
CLOUDEVENT, HTTP = "cloudevent", "http"

# Entry points of functions/main.py and their functions-framework signature types.
DEFAULT_FUNCTIONS: Mapping[str, str] = {
    "on_object_finalized": CLOUDEVENT,
    "on_job_event": CLOUDEVENT,
    "on_tick": CLOUDEVENT,
    "on_run_event": CLOUDEVENT,
    "api": HTTP,
}

# Topic -> functions it feeds (what Eventarc triggers / push subscriptions do in production).
DEFAULT_ROUTES: Mapping[str, tuple[str, ...]] = {
    S.TOPIC_GCS_NOTIFICATIONS: ("on_object_finalized",),
    S.TOPIC_JOB_EVENTS: ("on_job_event",),
    S.TOPIC_TRAINER_EVENTS: ("on_job_event",),
    S.TOPIC_TICK: ("on_tick",),
    S.TOPIC_EVENTS: ("on_run_event",),
}

TOPICS = (S.TOPIC_GCS_NOTIFICATIONS, S.TOPIC_JOB_EVENTS, S.TOPIC_TRAINER_EVENTS, S.TOPIC_TICK,
          S.TOPIC_EVENTS, S.TOPIC_DEAD_LETTER)

# Pull subscriptions for observers: the demo reads what spotorch published, and dead letters.
OBSERVER_SUBSCRIPTION = "spotorch-events-observer"
DEAD_LETTER_SUBSCRIPTION = "spotorch-dead-letter-observer"

VERTEX_MODULE = "spotorch.local.vertex_emulator"
VERTEX_READY_LINE = "vertex emulator listening on"

# How pushes reach the functions:
#   eventarc: through our adapter, which posts CloudEvents exactly as Eventarc would (default);
#   direct:   straight to functions-framework with the topic in the path (deploy/pubsub.tf does
#             this in production; functions-framework converts the raw push body itself).
PUSH_MODES = ("eventarc", "direct")
# How on_object_finalized gets GCS events: pubsub = the notification wrapped in messagePublished;
# storage = Eventarc's google.cloud.storage.object.v1.finalized (eventarc push mode only).
GCS_EVENT_FORMS = ("pubsub", "storage")

_PUBSUB_KINDS = ("publisher", "subscriber")

DEFAULT_RUN_DIR = Path(".spotorch/stack")
DEFAULT_STATE = Path(".spotorch/stack.json")


class StackError(RuntimeError):
    """The local stack could not be started, used or stopped."""


def _repo_file(*parts: str) -> Path:
    """A file of the repository this package lives in (falls back to the working directory)."""
    repo = Path(__file__).resolve().parents[3]
    candidate = repo.joinpath(*parts)
    return candidate if candidate.exists() else Path.cwd().joinpath(*parts)


def vertex_available() -> bool:
    """True when the local Vertex AI emulator module is installed."""
    try:
        return importlib.util.find_spec(VERTEX_MODULE) is not None
    except ImportError:
        return False


@dataclass(frozen=True)
class StackConfig:
    """Everything a DevStack needs; DevStack(**overrides) replaces any of these fields."""

    project: str = "spotorch-local"
    run_dir: Path = DEFAULT_RUN_DIR  # logs, emulator data, vertex workdir
    pipelines_dir: Path | None = None  # SPOTORCH_PIPELINES for the functions (None: not set)
    functions_source: Path = field(default_factory=lambda: _repo_file("functions", "main.py"))
    functions: Mapping[str, str] = field(default_factory=lambda: dict(DEFAULT_FUNCTIONS))
    routes: Mapping[str, Sequence[str]] = field(default_factory=lambda: dict(DEFAULT_ROUTES))
    extra_env: Mapping[str, str] = field(default_factory=dict)  # alert receivers etc.
    cwd: Path | None = None  # working directory of the functions (None: ours)
    push: str = "eventarc"  # binary CloudEvents as Eventarc delivers; "direct": raw push, as deploy/pubsub.tf
    gcs_events: str = "pubsub"
    ordered_topics: Sequence[str] = (S.TOPIC_EVENTS,)  # as deploy/pubsub.tf
    max_delivery_attempts: int = 5  # then the message goes to the dead-letter topic
    # Retry policy of the push subscriptions; min_backoff_s None: no policy, Pub/Sub's default
    # (redeliver at once; the emulator waits about 1 s). With a policy the emulator waits at
    # least about 3 s between attempts, whatever the minimum.
    min_backoff_s: float | None = 1.0
    max_backoff_s: float = 10.0
    ack_deadline_s: int = 60
    tick_seconds: float | None = 5.0  # None or 0: no ticker (stack.tick() still works)
    vertex: bool = True
    vertex_schedule: Path | None = None
    vertex_trace: Path | None = None
    vertex_trace_speed: float | None = None
    vertex_grace_s: float | None = None
    vertex_workdir: Path | None = None  # None: run_dir/vertex
    vertex_args: Sequence[str] = ()  # more options, e.g. ("--every-spot-job-after-s", "20")
    startup_timeout_s: float = 60.0
    stop_timeout_s: float = 10.0
    bin_dir: Path = field(default_factory=lambda: Path(sys.executable).parent)  # the venv's bin

    def __post_init__(self) -> None:
        if self.push not in PUSH_MODES:
            raise StackError(f"push must be one of {PUSH_MODES}, not {self.push!r}")
        if self.gcs_events not in GCS_EVENT_FORMS:
            raise StackError(f"gcs_events must be one of {GCS_EVENT_FORMS}")
        if self.gcs_events == "storage" and self.push != "eventarc":
            raise StackError("gcs_events='storage' needs push='eventarc'")
        if not 5 <= self.max_delivery_attempts <= 100:  # Pub/Sub's limits, the emulator's too
            raise StackError("max_delivery_attempts must be within 5..100")
        if self.min_backoff_s is not None \
                and not 0 <= self.min_backoff_s <= self.max_backoff_s <= 600:
            raise StackError("need 0 <= min_backoff_s <= max_backoff_s <= 600")
        bad = {n: t for n, t in self.functions.items() if t not in (CLOUDEVENT, HTTP)}
        if bad:
            raise StackError(f"unknown signature types: {bad}")

    def to_json(self) -> dict[str, Any]:
        """A JSON-able form (the supervisor of `spotorch dev up` reads it back)."""
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, Path):
                value = str(value)
            elif isinstance(value, Mapping):
                value = {k: list(v) if isinstance(v, (list, tuple)) else v
                         for k, v in value.items()}
            elif isinstance(value, tuple):
                value = list(value)
            out[f.name] = value
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> StackConfig:
        """Inverse of to_json."""
        paths = {f.name for f in dataclasses.fields(cls) if "Path" in str(f.type)}
        kwargs: dict[str, Any] = {}
        for key, value in data.items():
            if key in paths and value is not None:
                value = Path(value)
            elif key == "routes":
                value = {k: tuple(v) for k, v in value.items()}
            elif key in ("ordered_topics", "vertex_args"):
                value = tuple(value)
            kwargs[key] = value
        return cls(**kwargs)


@dataclass(frozen=True)
class PulledMessage:
    """A message pulled from an observer subscription."""

    message_id: str
    data: bytes
    attributes: Mapping[str, str]
    publish_time: str
    ordering_key: str = ""

    def json(self) -> Any:
        """The data parsed as JSON."""
        return json.loads(self.data)


def _now_rfc3339() -> str:
    return rfc3339(time.time())


def _spotorch_root() -> str:
    """The directory holding the spotorch package, for children's PYTHONPATH."""
    return str(Path(__file__).resolve().parents[2])


# ------------------------------------------------------------------ ticker

class Ticker:
    """Publishes {"time": RFC3339} to the tick topic every interval (Cloud Scheduler, locally)."""

    def __init__(self, publish: Any, interval_s: float, log_path: Path) -> None:
        self._publish = publish
        self.interval_s = interval_s
        self.log_path = log_path
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="spotorch-ticker", daemon=True)
        self.count = 0

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)

    def _run(self) -> None:
        with self.log_path.open("a") as log:
            while not self._stop.wait(self.interval_s):
                try:
                    message_id = self._publish()
                    self.count += 1
                    log.write(f"{_now_rfc3339()} tick {message_id}\n")
                except Exception as exc:  # keep ticking: the emulator may be restarting
                    log.write(f"{_now_rfc3339()} tick failed: {exc!r}\n")
                log.flush()


# ------------------------------------------------------------------ the stack

class DevStack:
    """The whole local stack on free ports; a context manager that always cleans up."""

    def __init__(self, config: StackConfig | None = None, /, **overrides: Any) -> None:
        base = config or StackConfig()
        for key in ("run_dir", "pipelines_dir", "functions_source", "cwd", "vertex_schedule",
                    "vertex_trace", "vertex_workdir", "bin_dir"):
            if isinstance(overrides.get(key), str):
                overrides[key] = Path(overrides[key])
        try:
            self.config = dataclasses.replace(base, **overrides)
        except TypeError as exc:
            raise StackError(f"DevStack: {exc}") from exc
        self.run_dir = self.config.run_dir.resolve()
        self._emulator_ports: dict[str, int] = {}  # firestore, pubsub, gcs
        self._children: dict[str, Child] = {}  # "emulator:pubsub", "function:on_tick", ...
        self._function_ports: dict[str, int] = {}
        self._adapter_port: int | None = None
        self._vertex_port: int | None = None
        self._subscriptions: dict[str, dict[str, str]] = {}
        self._buckets: set[str] = set()
        self._ticker: Ticker | None = None
        self._clients: dict[str, Any] = {}
        self._lock = threading.Lock()
        self._started = False
        self._stopped = False
        self.startup_s: float | None = None

    # -------------------------------------------------------------- lifecycle

    def __enter__(self) -> DevStack:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    @property
    def project(self) -> str:
        return self.config.project

    @property
    def running(self) -> bool:
        return self._started and not self._stopped

    def start(self) -> DevStack:
        """Start everything; on any failure stop what was started and raise StackError."""
        if self._started or self._stopped:
            raise StackError("a DevStack starts once: make a new one")
        self._started = True
        began = time.monotonic()
        try:
            self._start()
        except BaseException as exc:
            self.stop()
            if isinstance(exc, StackError) or not isinstance(exc, Exception):
                raise
            raise StackError(f"the local stack did not start: {exc}") from exc
        self.startup_s = round(time.monotonic() - began, 2)
        return self

    def _start(self) -> None:
        cfg = self.config
        self._check_prerequisites()
        self.run_dir.mkdir(parents=True, exist_ok=True)
        # Stale emulator data from an earlier run would resurrect old subscriptions.
        shutil.rmtree(self.run_dir / "pubsub-data", ignore_errors=True)
        for _attempt in range(3):
            if self._launch():
                break
        else:
            raise StackError("processes lost their reserved ports three times in a row")
        self._create_subscriptions()
        if cfg.tick_seconds:
            self._ticker = Ticker(self.tick, cfg.tick_seconds, self.run_dir / "ticker.log")
            self._ticker.start()

    def _check_prerequisites(self) -> None:
        cfg = self.config
        if cfg.functions and not cfg.functions_source.exists():
            raise StackError(f"functions source {cfg.functions_source} does not exist")
        if cfg.functions and not self._ff_binary().exists():
            raise StackError(f"{self._ff_binary()} not found: is functions-framework installed "
                             "in this virtualenv?")
        if cfg.vertex and not vertex_available():
            raise StackError(f"{VERTEX_MODULE} is not installed: start with vertex=False")

    def _ff_binary(self) -> Path:
        return self.config.bin_dir / "functions-framework"

    def _launch(self) -> bool:
        """Start every process at once on ports reserved up front; False if one lost its port.

        Every address is known before anything starts (the functions' env names the emulators
        and the Vertex endpoint, the adapter's routes name the functions), so when another
        process grabs one of the ports meanwhile, the whole group starts again on new ones.
        """
        cfg = self.config
        need_adapter = cfg.push == "eventarc" and bool(self._pushed_functions())
        ports = self._emulator_ports = {name: emulators.free_port() for name in HEALTH_PATHS}
        self._function_ports = {name: emulators.free_port() for name in cfg.functions}
        self._adapter_port = emulators.free_port() if need_adapter else None
        self._vertex_port = emulators.free_port() if cfg.vertex else None
        env = self._child_env()  # names every address above
        argvs = {"firestore": _emu.firestore_argv(ports["firestore"]),
                 "pubsub": _emu.pubsub_argv(ports["pubsub"], self.run_dir / "pubsub-data"),
                 "gcs": _emu.gcs_argv(ports["gcs"], cfg.project, S.TOPIC_GCS_NOTIFICATIONS)}
        pending: dict[str, tuple[Child, Probe]] = {}
        for name, argv in argvs.items():
            child = spawn(f"{name} emulator", argv, self.run_dir / f"{name}.log",
                          _emu.pubsub_env(env) if name == "pubsub" else env, port=ports[name])
            self._children[f"emulator:{name}"] = child
            pending[f"emulator:{name}"] = (
                child, http_probe(f"http://{HOST}:{ports[name]}{HEALTH_PATHS[name]}"))
        for name in cfg.functions:
            pending[f"function:{name}"] = self._spawn_function(name)
        if need_adapter:
            pending["push-adapter"] = self._spawn_adapter()
        # Import and build the Pub/Sub clients while the emulators boot (no connection yet).
        clients = threading.Thread(target=lambda: [self._pubsub(k) for k in _PUBSUB_KINDS],
                                   daemon=True)
        clients.start()
        # Pub/Sub first: the topics must exist before anything can publish.
        first = {"emulator:pubsub": pending.pop("emulator:pubsub")}
        dead = wait_ready(first, cfg.startup_timeout_s)
        clients.join()
        if not dead:
            self._create_topics()
            if cfg.vertex:
                pending["vertex"] = self._spawn_vertex()
            dead = wait_ready(pending, cfg.startup_timeout_s)
        if not dead:
            return True
        for name in dead:
            child = self._children[name]
            if not child.port_was_taken():
                raise StackError(f"{child.name} exited with {child.process.returncode}:\n"
                                 f"{log_tail(child.log_path)}\n(log {child.log_path})")
        self._stop_children(list(self._children))
        self._children.clear()
        return False

    def _child_env(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items()
               if not k.endswith("_EMULATOR_HOST") and k != "DEBUG"}
        env.update(self.env)
        env["PYTHONUNBUFFERED"] = "1"
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (_spotorch_root(), os.environ.get("PYTHONPATH", "")) if p)
        env.update(extra or {})
        return env

    def _spawn_function(self, name: str) -> tuple[Child, Probe]:
        cfg = self.config
        port = self._function_ports[name]
        argv = [str(self._ff_binary()), "--target", name, "--source",
                str(cfg.functions_source.resolve()), "--signature-type", cfg.functions[name],
                "--port", str(port), "--host", HOST]
        child = spawn(f"function {name}", argv, self.run_dir / f"function-{name}.log",
                      self._child_env(cfg.extra_env), cwd=cfg.cwd, port=port)
        self._children[f"function:{name}"] = child
        # GET /robots.txt: any answer means the worker serves, and it never runs the function.
        return child, http_probe(f"http://{HOST}:{port}/robots.txt")

    def _pushed_functions(self) -> list[str]:
        """Functions some topic pushes to, once each."""
        return list(dict.fromkeys(f for fs in self.config.routes.values() for f in fs
                                  if self.config.functions.get(f) == CLOUDEVENT))

    def _spawn_adapter(self) -> tuple[Child, Probe]:
        port = self._adapter_port
        assert port is not None
        argv = [sys.executable, "-m", "spotorch.local._push_adapter", "--host", HOST,
                "--port", str(port)]
        for name in self._pushed_functions():
            argv += ["--route", f"{name}={self.function_url(name)}"]
        if self.config.gcs_events == "storage":
            argv += ["--storage-topic", S.TOPIC_GCS_NOTIFICATIONS]
        child = spawn("push adapter", argv, self.run_dir / "push-adapter.log",
                      self._child_env(), port=port)
        self._children["push-adapter"] = child
        return child, http_probe(f"http://{HOST}:{port}/")

    def _spawn_vertex(self) -> tuple[Child, Probe]:
        cfg = self.config
        port = self._vertex_port
        assert port is not None
        workdir = (cfg.vertex_workdir or self.run_dir / "vertex").resolve()
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
        argv += list(cfg.vertex_args)
        log_path = self.run_dir / "vertex.log"
        # Its workers inherit this env: they publish trainer events and write checkpoints.
        child = spawn("vertex emulator", argv, log_path, self._child_env(cfg.extra_env),
                      cwd=cfg.cwd, port=port)
        self._children["vertex"] = child
        return child, any_probe(log_probe(log_path, VERTEX_READY_LINE), tcp_probe(HOST, port))

    def _stop_children(self, names: Sequence[str]) -> None:
        """Stop these children: the emulators last (the others may still talk to them)."""
        timeout = self.config.stop_timeout_s
        for phase in (False, True):
            children = [self._children[n] for n in names
                        if n in self._children and n.startswith("emulator:") == phase]
            if children:
                stop_groups([c.pid for c in children], timeout,
                            owned=[c.process for c in children])

    def stop(self) -> None:
        """Stop everything (idempotent); afterwards no process of the stack is left."""
        with self._lock:
            if self._stopped:
                return
            self._stopped = True
        if self._ticker:
            self._ticker.stop()
        for client in self._clients.values():
            with contextlib.suppress(Exception):
                closer = getattr(getattr(client, "transport", None), "close", None) \
                    or getattr(client, "close", None)
                if closer:
                    closer()
        self._clients.clear()
        self._stop_children(list(self._children))

    # -------------------------------------------------------------- addresses

    def emulator_address(self, name: str) -> str:
        """host:port of the firestore, pubsub or gcs emulator."""
        if name not in self._emulator_ports:
            raise StackError(f"no {name} emulator in this stack")
        return f"{HOST}:{self._emulator_ports[name]}"

    @property
    def env(self) -> dict[str, str]:
        """Environment for anything that talks to this stack (clients, trainers, the CLI)."""
        cfg = self.config
        env: dict[str, str] = {"GOOGLE_CLOUD_PROJECT": cfg.project,
                               "GCLOUD_PROJECT": cfg.project}
        if self._emulator_ports:
            env["FIRESTORE_EMULATOR_HOST"] = self.emulator_address("firestore")
            env["PUBSUB_EMULATOR_HOST"] = self.emulator_address("pubsub")
            env["STORAGE_EMULATOR_HOST"] = f"http://{self.emulator_address('gcs')}"
        env.update({
            S.ENV_PROJECT: cfg.project,
            S.ENV_EVENTS_TOPIC: S.TOPIC_EVENTS,
            S.ENV_TRAINER_EVENTS_TOPIC: S.TOPIC_TRAINER_EVENTS,
        })
        if cfg.pipelines_dir is not None:
            env[S.ENV_PIPELINES] = str(cfg.pipelines_dir.resolve())
        if self._vertex_port is not None:
            env[S.ENV_VERTEX_ENDPOINT] = f"{HOST}:{self._vertex_port}"
        if "api" in self._function_ports:
            env["SPOTORCH_API_URL"] = self.function_url("api")
        return env

    def function_url(self, name: str) -> str:
        """Base URL of a function, e.g. http://127.0.0.1:PORT/."""
        try:
            return f"http://{HOST}:{self._function_ports[name]}/"
        except KeyError:
            raise StackError(f"no function {name!r} in this stack") from None

    def push_endpoint(self, topic: str, function: str) -> str:
        """Where the push subscription of topic -> function delivers."""
        topic_path = f"projects/{self.config.project}/topics/{topic}"
        if self.config.push == "direct":
            return f"{self.function_url(function)}{topic_path}"
        if self._adapter_port is None:
            raise StackError("the push adapter is not running")
        return f"http://{HOST}:{self._adapter_port}/{function}/{topic_path}"

    def subscription_name(self, topic: str, function: str) -> str:
        return f"{topic}--{function.replace('_', '-')}--push"

    def describe(self) -> dict[str, Any]:
        """Addresses, ports, pids, env and log paths, JSON-able."""
        processes = {name: c.record() for name, c in self._children.items()}
        return {
            "project": self.config.project,
            "running": self.running,
            "startup_s": self.startup_s,
            "run_dir": str(self.run_dir),
            "env": self.env,
            "function_env": {**self.env, **self.config.extra_env},
            "emulators": {n: self.emulator_address(n) for n in self._emulator_ports},
            "functions": {
                name: {"url": self.function_url(name), "signature_type": sig,
                       "pid": self._children[f"function:{name}"].pid
                       if f"function:{name}" in self._children else None,
                       "log": str(self.run_dir / f"function-{name}.log")}
                for name, sig in self.config.functions.items()},
            "push": {"mode": self.config.push, "gcs_events": self.config.gcs_events,
                     "adapter": f"http://{HOST}:{self._adapter_port}/"
                     if self._adapter_port else None},
            "vertex": ({"address": f"{HOST}:{self._vertex_port}",
                        "log": str(self.run_dir / "vertex.log")}
                       if self._vertex_port else None),
            "topics": list(TOPICS),
            "subscriptions": dict(self._subscriptions),
            "observers": {"events": OBSERVER_SUBSCRIPTION,
                          "dead_letter": DEAD_LETTER_SUBSCRIPTION},
            "ticker": ({"interval_s": self._ticker.interval_s,
                        "log": str(self._ticker.log_path)} if self._ticker else None),
            "processes": processes,
            "logs": {name: rec["log"] for name, rec in processes.items()},
        }

    # -------------------------------------------------------------- Pub/Sub

    def _pubsub(self, kind: str) -> Any:
        """A GAPIC publisher or subscriber on a channel to our emulator (never os.environ's)."""
        with self._lock:
            if kind not in self._clients:
                import grpc
                from google.pubsub_v1 import PublisherClient, SubscriberClient
                from google.pubsub_v1.services.publisher.transports import PublisherGrpcTransport
                from google.pubsub_v1.services.subscriber.transports import (
                    SubscriberGrpcTransport,
                )

                channel = grpc.insecure_channel(self.emulator_address("pubsub"))
                self._clients[kind] = (
                    PublisherClient(transport=PublisherGrpcTransport(channel=channel))
                    if kind == "publisher"
                    else SubscriberClient(transport=SubscriberGrpcTransport(channel=channel)))
            return self._clients[kind]

    def topic_path(self, topic: str) -> str:
        return topic if topic.startswith("projects/") else \
            f"projects/{self.config.project}/topics/{topic}"

    def subscription_path(self, name: str) -> str:
        return f"projects/{self.config.project}/subscriptions/{name}"

    def _admin_create_topic(self, topic: str) -> None:
        from google.api_core.exceptions import AlreadyExists

        with contextlib.suppress(AlreadyExists):
            self._pubsub("publisher").create_topic(name=self.topic_path(topic))

    def _create_topics(self) -> None:
        for topic in TOPICS:
            self._admin_create_topic(topic)

    def _create_subscriptions(self) -> None:
        """Push subscriptions to the functions, with retry backoff and dead letters; observers."""
        from google.protobuf import duration_pb2
        from google.pubsub_v1.types import DeadLetterPolicy, PushConfig, RetryPolicy

        cfg = self.config

        def duration(seconds: float) -> duration_pb2.Duration:
            return duration_pb2.Duration(seconds=int(seconds),
                                         nanos=round(seconds % 1 * 1e9))

        sub = self._pubsub("subscriber")
        for topic, functions in cfg.routes.items():
            for function in functions:
                if cfg.functions.get(function) != CLOUDEVENT:
                    continue  # not started here (or HTTP): nothing to push to
                name = self.subscription_name(topic, function)
                endpoint = self.push_endpoint(topic, function)
                sub.create_subscription(request={
                    "name": self.subscription_path(name),
                    "topic": self.topic_path(topic),
                    "push_config": PushConfig(push_endpoint=endpoint),
                    "ack_deadline_seconds": cfg.ack_deadline_s,
                    "enable_message_ordering": topic in cfg.ordered_topics,
                    "dead_letter_policy": DeadLetterPolicy(
                        dead_letter_topic=self.topic_path(S.TOPIC_DEAD_LETTER),
                        max_delivery_attempts=cfg.max_delivery_attempts),
                    "retry_policy": None if cfg.min_backoff_s is None else RetryPolicy(
                        minimum_backoff=duration(cfg.min_backoff_s),
                        maximum_backoff=duration(cfg.max_backoff_s)),
                })
                self._subscriptions[name] = {"topic": topic, "function": function,
                                             "push_endpoint": endpoint}
        for name, topic in ((OBSERVER_SUBSCRIPTION, S.TOPIC_EVENTS),
                            (DEAD_LETTER_SUBSCRIPTION, S.TOPIC_DEAD_LETTER)):
            sub.create_subscription(request={"name": self.subscription_path(name),
                                             "topic": self.topic_path(topic),
                                             "ack_deadline_seconds": 60})
            self._subscriptions[name] = {"topic": topic, "function": "", "push_endpoint": ""}

    def publish(self, topic: str, data: bytes | str | Mapping[str, Any] = b"",
                ordering_key: str = "", **attributes: str) -> str:
        """Publish one message (a mapping is sent as JSON); returns its message id."""
        from google.pubsub_v1 import PubsubMessage

        if isinstance(data, Mapping):
            data = json.dumps(data)
        if isinstance(data, str):
            data = data.encode()
        response = self._pubsub("publisher").publish(
            topic=self.topic_path(topic),
            messages=[PubsubMessage(data=data, attributes=attributes, ordering_key=ordering_key)])
        return str(response.message_ids[0])

    def tick(self) -> str:
        """Publish one tick now, as the ticker does: data {"time": RFC3339}."""
        return self.publish(S.TOPIC_TICK, {"time": _now_rfc3339()})

    def _pull(self, subscription: str, max_messages: int, timeout_s: float) -> list[PulledMessage]:
        """Pull and acknowledge up to max_messages, waiting up to timeout_s for the first."""
        sub = self._pubsub("subscriber")
        path = self.subscription_path(subscription)
        out: list[PulledMessage] = []
        deadline = time.monotonic() + timeout_s
        while len(out) < max_messages:
            with warnings.catch_warnings():
                # Deprecated in Pub/Sub, but the emulator otherwise holds an empty pull for ~2 s.
                warnings.simplefilter("ignore", DeprecationWarning)
                response = sub.pull(request={"subscription": path, "return_immediately": True,
                                             "max_messages": max_messages - len(out)},
                                    timeout=10)
            received = list(response.received_messages)
            if received:
                sub.acknowledge(subscription=path, ack_ids=[m.ack_id for m in received])
                out += [PulledMessage(
                    message_id=m.message.message_id, data=bytes(m.message.data),
                    attributes=dict(m.message.attributes),
                    publish_time=m.message.publish_time.isoformat()
                    if m.message.publish_time else "",
                    ordering_key=m.message.ordering_key) for m in received]
                continue  # there may be more right away
            if out or time.monotonic() >= deadline:
                break
            time.sleep(0.1)
        return out

    def pull_published(self, max_messages: int = 100, timeout_s: float = 2.0) -> list[bytes]:
        """Data of what spotorch published to its events topic since the last pull (acked)."""
        return [m.data for m in self.pull_messages(OBSERVER_SUBSCRIPTION, max_messages, timeout_s)]

    def pull_messages(self, subscription: str, max_messages: int = 100, timeout_s: float = 2.0
                      ) -> list[PulledMessage]:
        """Pull and acknowledge up to max_messages from a pull subscription, with attributes."""
        return self._pull(subscription, max_messages, timeout_s)

    def pull_dead_letters(self, max_messages: int = 100, timeout_s: float = 2.0
                          ) -> list[PulledMessage]:
        """Messages that exhausted their delivery attempts (attributes name the source)."""
        return self._pull(DEAD_LETTER_SUBSCRIPTION, max_messages, timeout_s)

    # -------------------------------------------------------------- GCS

    def _storage(self) -> Any:
        with self._lock:
            if "storage" not in self._clients:
                storage = importlib.import_module("google.cloud.storage")
                credentials = importlib.import_module("google.auth.credentials")
                self._clients["storage"] = storage.Client(
                    project=self.config.project, credentials=credentials.AnonymousCredentials(),
                    client_options={"api_endpoint": f"http://{self.emulator_address('gcs')}"})
            return self._clients["storage"]

    def create_buckets(self, names: Sequence[str]) -> None:
        """Create buckets in fake-gcs-server (existing ones are fine)."""
        from google.api_core.exceptions import Conflict

        client = self._storage()
        for name in names:
            if name in self._buckets:
                continue
            with contextlib.suppress(Conflict):
                client.create_bucket(name)
            self._buckets.add(name)

    def upload(self, bucket: str, name: str, data: bytes,
               content_type: str = "application/octet-stream") -> str:
        """Upload an object (creating the bucket if needed); returns its gs:// URI."""
        self.create_buckets([bucket])
        self._storage().bucket(bucket).blob(name).upload_from_string(
            data, content_type=content_type)
        return f"gs://{bucket}/{name}"


# ------------------------------------------------------------------ spotorch dev up / down

def _write_json(path: Path, data: Mapping[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, path)


def _read_state(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _supervisor_alive(state: Mapping[str, Any]) -> bool:
    sup = state.get("supervisor") or {}
    pid = sup.get("pid")
    return isinstance(pid, int) and is_same_process(pid, sup.get("start_time"))


def exports(env: Mapping[str, str]) -> str:
    """Shell lines that export env (for `eval "$(spotorch dev up)"`)."""
    return "".join(f"export {k}={shlex.quote(v)}\n" for k, v in sorted(env.items()))


def _summary(state: Mapping[str, Any]) -> str:
    lines = [f"# spotorch local stack (project {state.get('project')}), "
             f"logs in {state.get('run_dir')}"]
    for name, info in (state.get("functions") or {}).items():
        lines.append(f"#   {name:<20} {info.get('url')}")
    if state.get("vertex"):
        lines.append(f"#   {'vertex emulator':<20} {state['vertex']['address']}")
    lines.append(f"#   {'observer':<20} {OBSERVER_SUBSCRIPTION} (pull spotorch's events)")
    return "\n".join(lines) + "\n"


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="spotorch dev up",
                                     description="Start the local stack in the background.")
    parser.add_argument("--state", type=Path, default=DEFAULT_STATE)
    parser.add_argument("--run-dir", type=Path, default=DEFAULT_RUN_DIR)
    parser.add_argument("--project", default=StackConfig.project)
    parser.add_argument("--pipelines", type=Path)
    parser.add_argument("--functions-source", type=Path)
    parser.add_argument("--function", action="append", metavar="NAME[=SIGNATURE]",
                        help="only these functions (default: all of functions/main.py)")
    parser.add_argument("--push", choices=PUSH_MODES, default="eventarc")
    parser.add_argument("--gcs-events", choices=GCS_EVENT_FORMS, default="pubsub")
    parser.add_argument("--no-vertex", action="store_true")
    parser.add_argument("--schedule", type=Path, help="Vertex emulator preemption schedule")
    parser.add_argument("--trace", type=Path, help="Vertex emulator spot trace")
    parser.add_argument("--trace-speed", type=float)
    parser.add_argument("--grace-s", type=float)
    parser.add_argument("--vertex-arg", action="append", default=[], metavar="ARG",
                        help="pass ARG on to the Vertex emulator, e.g. "
                             "--vertex-arg=--every-spot-job-after-s=20")
    parser.add_argument("--tick-s", type=float, default=5.0, help="0: no ticker")
    parser.add_argument("--max-delivery-attempts", type=int, default=5)
    parser.add_argument("--env", action="append", default=[], metavar="KEY=VALUE",
                        help="extra environment for the functions (alert receivers etc.)")
    parser.add_argument("--timeout", type=float, default=90.0)
    return parser


def _config_from_args(args: argparse.Namespace) -> StackConfig:
    overrides: dict[str, Any] = {
        "project": args.project, "run_dir": args.run_dir.resolve(), "push": args.push,
        "gcs_events": args.gcs_events, "vertex": not args.no_vertex,
        "vertex_schedule": args.schedule, "vertex_trace": args.trace,
        "vertex_trace_speed": args.trace_speed, "vertex_grace_s": args.grace_s,
        "vertex_args": tuple(args.vertex_arg),
        "tick_seconds": args.tick_s or None, "max_delivery_attempts": args.max_delivery_attempts,
        "extra_env": dict(kv.split("=", 1) for kv in args.env), "cwd": Path.cwd(),
    }
    if args.pipelines:
        overrides["pipelines_dir"] = args.pipelines.resolve()
    if args.functions_source:
        overrides["functions_source"] = args.functions_source.resolve()
    if args.function:
        overrides["functions"] = {
            n: (s or DEFAULT_FUNCTIONS.get(n, CLOUDEVENT))
            for n, _, s in (f.partition("=") for f in args.function)}
    return dataclasses.replace(StackConfig(), **overrides)


def up_main(argv: Sequence[str]) -> int:
    """`spotorch dev up`: start the stack under a detached supervisor; print env exports."""
    args = _build_parser().parse_args(list(argv))
    state_path: Path = args.state.resolve()
    state = _read_state(state_path)
    if state and _supervisor_alive(state) and state.get("status") == "ready":
        sys.stderr.write(f"local stack already running (state {state_path})\n"
                         + _summary(state))
        sys.stdout.write(exports(state.get("env") or {}))
        return 0
    if state:  # a dead or half-started stack: clear what is left of it
        _stop_recorded(state, quiet=True)
        state_path.unlink(missing_ok=True)
    try:
        config = _config_from_args(args)
    except (StackError, ValueError) as exc:
        sys.stderr.write(f"spotorch dev up: {exc}\n")
        return 2
    if config.vertex and not vertex_available():
        sys.stderr.write(f"spotorch dev up: {VERTEX_MODULE} is not installed; "
                         "use --no-vertex\n")
        return 2
    run_dir = config.run_dir
    run_dir.mkdir(parents=True, exist_ok=True)
    config_path = run_dir / "config.json"
    _write_json(config_path, config.to_json())
    log_path = run_dir / "supervisor.log"
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (_spotorch_root(), env.get("PYTHONPATH")) if p)
    env["PYTHONUNBUFFERED"] = "1"
    child = spawn("supervisor", [sys.executable, "-m", "spotorch.local.stack", "supervise",
                                 "--config", str(config_path), "--state", str(state_path)],
                  log_path, env)
    deadline = time.monotonic() + args.timeout
    while time.monotonic() < deadline:
        state = _read_state(state_path)
        if state and state.get("supervisor", {}).get("pid") == child.pid:
            if state.get("status") == "ready":
                sys.stderr.write(_summary(state))
                sys.stdout.write(exports(state.get("env") or {}))
                return 0
            if state.get("status") == "failed":
                break
        if not child.alive():
            break
        time.sleep(0.1)
    else:
        sys.stderr.write(f"spotorch dev up: not ready within {args.timeout:.0f}s\n")
    state = _read_state(state_path) or {}
    sys.stderr.write(f"spotorch dev up failed: {state.get('error', '')}\n"
                     f"{log_tail(log_path, 25)}\n(log {log_path})\n")
    stop_groups([child.pid], 15, owned=[child.process])
    if state:
        _stop_recorded(state, quiet=True)
    state_path.unlink(missing_ok=True)
    return 1


def _stop_recorded(state: Mapping[str, Any], quiet: bool = False) -> list[str]:
    """Stop the supervisor of a recorded stack, then any recorded process still alive."""
    stopped: list[str] = []
    sup = state.get("supervisor") or {}
    if _supervisor_alive(state):
        pid = int(sup["pid"])
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 2 * float(state.get("stop_timeout_s", 10)) + 10
        while is_same_process(pid, sup.get("start_time")) and time.monotonic() < deadline:
            time.sleep(0.1)
        if is_same_process(pid, sup.get("start_time")):
            stop_groups([pid], 1)
        stopped.append(f"supervisor {pid}")
    leftovers = {name: rec for name, rec in (state.get("processes") or {}).items()
                 if isinstance(rec.get("pid"), int)
                 and is_same_process(rec["pid"], rec.get("start_time"))}
    if leftovers:
        killed = stop_groups([rec["pgid"] for rec in leftovers.values()],
                             float(state.get("stop_timeout_s", 10)))
        stopped += [f"{name} {rec['pid']}" + (" (killed)" if rec["pgid"] in killed else "")
                    for name, rec in leftovers.items()]
    if not quiet:
        for line in stopped:
            sys.stderr.write(f"stopped {line}\n")
    return stopped


def down_main(argv: Sequence[str]) -> int:
    """`spotorch dev down`: stop everything the state file records (idempotent)."""
    parser = argparse.ArgumentParser(prog="spotorch dev down",
                                     description="Stop the background local stack.")
    parser.add_argument("--state", type=Path, default=DEFAULT_STATE)
    args = parser.parse_args(list(argv))
    state_path: Path = args.state.resolve()
    state = _read_state(state_path)
    if state is None:
        sys.stderr.write("no local stack is running (no state file "
                         f"{state_path})\n")
        return 0
    stopped = _stop_recorded(state)
    state_path.unlink(missing_ok=True)
    if not stopped:
        sys.stderr.write("local stack was not running any more; state file removed\n")
    return 0


def _supervise(config_path: Path, state_path: Path) -> int:
    """The detached owner of a background stack: start it, record it, stop it on SIGTERM."""
    me = {"pid": os.getpid(), "start_time": proc_start_time(os.getpid()),
          "log": str(config_path.parent / "supervisor.log")}
    config = StackConfig.from_json(json.loads(config_path.read_text()))
    base = {"supervisor": me, "project": config.project, "run_dir": str(config.run_dir),
            "stop_timeout_s": config.stop_timeout_s}

    def terminate(signum: int, _frame: Any) -> None:
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, signal.SIG_IGN)  # a second signal must not cut the cleanup short
        raise SystemExit(0)

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, terminate)
    _write_json(state_path, {**base, "status": "starting"})
    stack = DevStack(config)
    try:
        try:
            stack.start()
        except Exception as exc:
            print(f"start failed: {exc}", flush=True)
            _write_json(state_path, {**base, "status": "failed", "error": str(exc)})
            return 1
        _write_json(state_path, {**base, **stack.describe(), "status": "ready"})
        print(f"stack ready in {stack.startup_s}s", flush=True)
        reported: set[str] = set()
        while True:
            time.sleep(1)
            for name, child in stack._children.items():
                if not child.alive() and name not in reported:
                    reported.add(name)
                    print(f"{name} exited with {child.process.returncode}; see {child.log_path}",
                          flush=True)
    finally:
        stack.stop()
        state = _read_state(state_path)
        if state and (state.get("supervisor") or {}).get("pid") == me["pid"] \
                and state.get("status") != "failed":
            state_path.unlink(missing_ok=True)
        print("stack stopped", flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m spotorch.local.stack up|down|supervise ...` (the CLI wires up/down itself)."""
    args = list(sys.argv[1:] if argv is None else argv)
    command, rest = (args[0], args[1:]) if args else ("", [])
    if command == "up":
        return up_main(rest)
    if command == "down":
        return down_main(rest)
    if command == "supervise":
        parser = argparse.ArgumentParser(prog="spotorch-stack-supervisor")
        parser.add_argument("--config", type=Path, required=True)
        parser.add_argument("--state", type=Path, required=True)
        ns = parser.parse_args(rest)
        return _supervise(ns.config, ns.state)
    sys.stderr.write("usage: python -m spotorch.local.stack up|down [options]\n")
    return 2


if __name__ == "__main__":
    sys.exit(main())
