"""The local stack: emulators, topics, push subscriptions, functions, Vertex emulator and ticker.

In-process (demo, end-to-end tests):

    with DevStack(pipelines_dir="examples/pipelines") as stack:
        stack.upload("landing", "data/part-0.csv", b"...")
        stack.pull_published(10)

In the background (`spotorch dev up` / `spotorch dev down`, spotorch.local.dev): a
detached supervisor process owns a DevStack and records it in .spotorch/stack.json.
docs/local-stack.md describes the wiring.

DevStack composes: StackProcesses (the children, their ports, readiness, restarts), PubSubAdmin
(topics, subscriptions, publish, pull), GcsAdmin (buckets, uploads), the pipelines it serves
(_stack_pipelines), the alert receivers (_stack_alerts) and the Ticker.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

from spotorch import settings as S
from spotorch.local import _stack_emulators as _emu
from spotorch.local._deploy_iam import account_email
from spotorch.local._stack_alerts import ALERTS_FILE, AlertReceivers, read_alerts
from spotorch.local._stack_config import (
    CLOUDEVENT,
    DATAFLOW_LAUNCHER,
    DATAPROC_MODULE,
    DEAD_LETTER_SUBSCRIPTION,
    DEFAULT_FUNCTIONS,
    DEFAULT_ROUTES,
    DEFAULT_RUN_DIR,
    DEFAULT_STATE,
    GCS_EVENT_FORMS,
    HOST,
    HTTP,
    OBSERVER_SUBSCRIPTION,
    PUSH_MODES,
    SPARK_DRIVER,
    SPARK_DRIVER_BUCKET,
    TOPICS,
    VERTEX_MODULE,
    VERTEX_READY_LINE,
    StackConfig,
    StackError,
    vertex_available,
)
from spotorch.local._stack_gcs import GcsAdmin
from spotorch.local._stack_iam import StackIdentities
from spotorch.local._stack_launch import StackProcesses
from spotorch.local._stack_pipelines import PipelineSet, activate, check_pipelines, fingerprint
from spotorch.local._stack_pubsub import PubSubAdmin, PulledMessage, subscription_name
from spotorch.local._stack_ticker import Ticker, now_rfc3339
from spotorch.local.emulators import EmulatorError

__all__ = [
    "CLOUDEVENT", "DEAD_LETTER_SUBSCRIPTION", "DEFAULT_FUNCTIONS", "DEFAULT_ROUTES",
    "DEFAULT_RUN_DIR", "DEFAULT_STATE", "GCS_EVENT_FORMS", "HOST", "HTTP",
    "OBSERVER_SUBSCRIPTION", "PUSH_MODES", "TOPICS", "VERTEX_MODULE", "VERTEX_READY_LINE",
    "DevStack", "PulledMessage", "StackConfig", "StackError", "Ticker", "vertex_available",
]

ACTIVE_PIPELINES = "pipelines-active"  # under run_dir: the valid files the functions read
VERTEX_JOBS = "jobs.json"


def _spotorch_root() -> str:
    """The directory holding the spotorch package, for children's PYTHONPATH."""
    return str(Path(__file__).resolve().parents[2])


class DevStack:
    """The whole local stack on free ports; a context manager that always cleans up."""

    def __init__(self, config: StackConfig | None = None, /, **overrides: Any) -> None:
        base = config or StackConfig()
        for key in ("run_dir", "pipelines_dir", "functions_source", "cwd", "vertex_schedule",
                    "vertex_trace", "vertex_workdir", "bin_dir", "deploy_dir"):
            if isinstance(overrides.get(key), str):
                overrides[key] = Path(overrides[key])
        try:
            self.config = dataclasses.replace(base, **overrides)
        except TypeError as exc:
            raise StackError(f"DevStack: {exc}") from exc
        self.run_dir = self.config.run_dir.resolve()
        self.identities = StackIdentities()
        self.processes = StackProcesses(self.config, self.run_dir, self._child_env,
                                        self.identities)
        self._pubsub_admin = PubSubAdmin(self.config,
                                         lambda: self.emulator_address("pubsub"))
        self._gcs = GcsAdmin(self.config.project, lambda: self.emulator_address("gcs"))
        self.receivers: AlertReceivers | None = None
        self.pipelines: PipelineSet | None = None
        self._pipelines_source = self.config.pipelines_dir
        self._ticker: Ticker | None = None
        self._watcher: threading.Thread | None = None
        self._lock = threading.Lock()
        self._reload_lock = threading.Lock()
        self._started = False
        self._stopped = threading.Event()
        self.startup_s: float | None = None
        self._bigquery: Any = None  # spotorch.local.emulators.Emulator, when BigQuery runs
        self._bigquery_front: Any = None  # spotorch.local.bigquery.BigQueryFront

    # -------------------------------------------------------------- lifecycle

    def __enter__(self) -> DevStack:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    @property
    def project(self) -> str:
        """The Google Cloud project the stack pretends to be."""
        return self.config.project

    @property
    def running(self) -> bool:
        """Whether the stack was started and not stopped since."""
        return self._started and not self._stopped.is_set()

    @property
    def _children(self) -> dict[str, Any]:
        return self.processes.children

    def start(self) -> DevStack:
        """Start everything; on any failure stop what was started and raise StackError."""
        if self._started or self._stopped.is_set():
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
        # The Pub/Sub emulator keeps nothing in its --dir (checked), but stale files from older
        # emulators could resurrect subscriptions.
        shutil.rmtree(self.run_dir / "pubsub-data", ignore_errors=True)
        if cfg.fresh:
            self.wipe_data()
        if self._pipelines_source is not None:
            self._activate(check_pipelines(self._pipelines_source.resolve(),
                                           dataflow=self.config.dataflow,
                                           dataproc=self.config.dataproc))
        if cfg.bigquery or (self.pipelines is not None and any(
                p.pipeline is not None and p.pipeline.trigger.bigquery is not None
                for p in self.pipelines.loaded)):
            self._start_bigquery()
        if cfg.receivers:
            self.receivers = AlertReceivers(self.run_dir / ALERTS_FILE)
            self.receivers.start()
        for _attempt in range(3):
            if self.processes.launch(self._pubsub_admin.build_clients,
                                     self._pubsub_admin.create_topics):
                break
            self._pubsub_admin.close()  # its channel names the old port
        else:
            raise StackError("processes lost their reserved ports three times in a row")
        self._pubsub_admin.create_subscriptions(self.push_endpoint)
        if self.pipelines is not None:
            self._gcs.create_buckets(self.pipelines.buckets, self.pipelines.landing_buckets)
        if cfg.dataproc:
            self._stage_spark_driver()
        if cfg.tick_seconds:
            self._ticker = Ticker(self.tick, cfg.tick_seconds, self.run_dir / "ticker.log")
            self._ticker.start()
        if cfg.pipeline_reload_s and self._pipelines_source is not None:
            self._watcher = threading.Thread(target=self._watch_pipelines,
                                             name="spotorch-pipelines", daemon=True)
            self._watcher.start()

    def _start_bigquery(self) -> None:
        """The BigQuery emulator and its front, before the functions (their env names it), and
        on_table_changed among the functions, fed the front's audit entries as Eventarc would."""
        from spotorch.local import bigquery as bq
        from spotorch.local._eventarc import deliver_audit_entry

        if "on_table_changed" not in self.config.functions:
            self.config = dataclasses.replace(self.config, functions={
                **self.config.functions, "on_table_changed": CLOUDEVENT})
            self.processes.config = self.config
        gcs_root = self.run_dir / "bigquery-gcs"
        self._bigquery = bq.start_bigquery(self.run_dir, self.config.project, gcs_root)

        def upload(bucket: str, name: str, path: Path) -> None:
            from google.api_core.exceptions import PreconditionFailed

            with contextlib.suppress(PreconditionFailed):  # only if absent: uploaded once
                self._gcs.client().bucket(bucket).blob(name).upload_from_filename(
                    str(path), if_generation_match=0)

        def on_job_done(entry: dict[str, Any]) -> None:
            url = lambda: self.function_url("on_table_changed")  # noqa: E731
            threading.Thread(target=deliver_audit_entry, args=(url, entry), daemon=True,
                             name="bigquery-audit").start()

        def bucket_exists(bucket: str) -> bool:
            return self._gcs.client().lookup_bucket(bucket) is not None

        self._bigquery_front = bq.BigQueryFront(f"http://{self._bigquery.address}", gcs_root,
                                                upload, on_job_done, bucket_exists).start()

    def _stage_spark_driver(self) -> None:
        """spotorch's PySpark driver where SPOTORCH_SPARK_DRIVER says (deploy/ uploads it to
        the staging bucket in a deployment; here the stack does)."""
        from spotorch.local.dataproc_emulator import DRIVER

        self._gcs.create_buckets([SPARK_DRIVER_BUCKET])
        self._gcs.client().bucket(SPARK_DRIVER_BUCKET).blob(
            SPARK_DRIVER.removeprefix(f"gs://{SPARK_DRIVER_BUCKET}/")).upload_from_filename(
            str(DRIVER))

    def _check_prerequisites(self) -> None:
        cfg = self.config
        if cfg.functions and not cfg.functions_source.exists():
            raise StackError(f"functions source {cfg.functions_source} does not exist")
        if cfg.functions and not self.processes.ff_binary().exists():
            raise StackError(f"{self.processes.ff_binary()} not found: is functions-framework "
                             "installed in this virtualenv?")
        if cfg.vertex and not vertex_available():
            raise StackError(f"{VERTEX_MODULE} is not installed: start with vertex=False")
        if cfg.dataproc:
            from spotorch.local.dataproc_emulator import DEFAULT_SPARK_PYTHON, spark_available

            if not spark_available(cfg.spark_python or DEFAULT_SPARK_PYTHON):
                raise StackError(f"{DATAPROC_MODULE}: no Spark environment (or no java): "
                                 "make spark-venv")

    def wipe_data(self) -> None:
        """Forget what a durable stack kept: Firestore exports, GCS objects, Vertex jobs."""
        shutil.rmtree(self.processes.data_dir, ignore_errors=True)
        (self.processes.vertex_workdir / VERTEX_JOBS).unlink(missing_ok=True)

    def stop(self) -> None:
        """Stop everything (idempotent); afterwards no process of the stack is left.

        A durable stack exports Firestore once the functions and the Vertex emulator are
        stopped (nothing writes any more) and before the emulators stop.
        """
        with self._lock:
            if self._stopped.is_set():
                return
            self._stopped.set()
        if self._ticker:
            self._ticker.stop()
        if self._watcher is not None:
            self._watcher.join(timeout=5)
        children = list(self.processes.children)
        self.processes.stop([n for n in children if not n.startswith("emulator:")])
        if self.config.durable and self._started:
            self.export_data()
        self._pubsub_admin.close()
        self.processes.stop(children)
        if self.receivers is not None:
            self.receivers.stop()
        if self._bigquery_front is not None:
            self._bigquery_front.stop()
        if self._bigquery is not None:
            self._bigquery.stop()

    def export_data(self) -> Path | None:
        """Export Firestore into the data directory now (durable stacks; None if it is down)."""
        child = self.processes.children.get("emulator:firestore")
        if child is None or not child.alive():
            return None
        try:
            return _emu.export_firestore(self.emulator_address("firestore"), self.project,
                                         self.processes.data_dir / "firestore")
        except (OSError, EmulatorError) as exc:
            self._note(f"Firestore export failed: {exc}")
            return None

    def _note(self, text: str) -> None:
        with (self.run_dir / "stack.log").open("a") as out:
            out.write(f"{now_rfc3339()} {text}\n")

    # -------------------------------------------------------------- one piece

    def restart(self, piece: str) -> str:
        """Restart one piece on its port (firestore, pubsub, gcs, vertex, adapter, a function);
        returns the child's name. What the piece held in memory is lost unless the stack is
        durable (docs/local-stack.md); Pub/Sub's topics and subscriptions are made again."""
        key = self.processes.piece(piece)
        if key == "emulator:firestore" and self.config.durable:
            self.export_data()
        if key == "emulator:pubsub":
            self._pubsub_admin.close()
        self.processes.respawn(key)
        if key == "emulator:pubsub":
            self._pubsub_admin.create_topics()
            self._pubsub_admin.create_subscriptions(self.push_endpoint)
        if key == "emulator:gcs":
            self._gcs.forget()
            if self.pipelines is not None:
                self._gcs.create_buckets(self.pipelines.buckets, self.pipelines.landing_buckets)
        self._note(f"restarted {key}")
        return key

    def stop_piece(self, piece: str) -> str:
        """Stop one piece (a function, the adapter, vertex) and leave it down; returns its name.
        Messages for a stopped function wait in its subscription (retried, then dead-lettered)."""
        key = self.processes.piece(piece)
        if key.startswith("emulator:"):
            raise StackError("an emulator is restarted, not stopped: use restart()")
        self.processes.stop([key])
        self._note(f"stopped {key}")
        return key

    def start_piece(self, piece: str) -> str:
        """Start a piece stop_piece stopped, on its port; returns its name."""
        key = self.processes.piece(piece)
        self.processes.respawn(key)
        self._note(f"started {key}")
        return key

    # -------------------------------------------------------------- pipelines

    def _activate(self, pipelines: PipelineSet) -> PipelineSet:
        pipelines = activate(pipelines, self.run_dir / ACTIVE_PIPELINES)
        self.pipelines = pipelines
        lines = [f"pipelines from {pipelines.source}: "
                 f"{', '.join(p.name for p in pipelines.loaded) or 'none loaded'}"]
        for file, problems in pipelines.rejected.items():
            lines.append(f"left out {file}: " + "; ".join(problems))
        self._note("\n".join(lines))
        return pipelines

    def reload_pipelines(self, source: Path | None = None) -> PipelineSet:
        """Check the pipeline files again (from source, if given, from now on), serve the valid
        ones, create their buckets, and restart the functions (they load pipelines once)."""
        with self._reload_lock:
            if source is not None:
                self._pipelines_source = source.resolve()
            if self._pipelines_source is None:
                raise StackError("this stack serves no pipelines directory")
            pipelines = self._activate(check_pipelines(self._pipelines_source,
                                                      dataflow=self.config.dataflow,
                                                      dataproc=self.config.dataproc))
            self._gcs.create_buckets(pipelines.buckets, pipelines.landing_buckets)
            self.processes.respawn(*[k for k in self.processes.children
                                     if k.startswith("function:")])
            return pipelines

    def _watch_pipelines(self) -> None:
        assert self.config.pipeline_reload_s
        source = self._pipelines_source
        seen = fingerprint(source) if source else ()
        while not self._stopped.wait(self.config.pipeline_reload_s):
            source = self._pipelines_source
            now = fingerprint(source) if source else ()
            if now != seen:
                seen = now
                try:
                    self.reload_pipelines()
                except Exception as exc:  # keep watching: the next change may fix it
                    self._note(f"pipeline reload failed: {exc}")

    # -------------------------------------------------------------- addresses

    def _child_env(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items()
               if not k.endswith("_EMULATOR_HOST") and k != "DEBUG"}
        env.update(self.env)
        env["PYTHONUNBUFFERED"] = "1"
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (_spotorch_root(), os.environ.get("PYTHONPATH", "")) if p)
        if extra is not None and self.receivers is not None:
            # The receivers take every channel the pipelines use; what the user set wins.
            env.update(self.receivers.env(self.pipelines.routes if self.pipelines else ()))
        env.update(extra or {})
        return env

    def emulator_address(self, name: str) -> str:
        """host:port of the firestore, pubsub or gcs emulator."""
        if name not in self.processes.emulator_ports:
            raise StackError(f"no {name} emulator in this stack")
        return f"{HOST}:{self.processes.emulator_ports[name]}"

    @property
    def env(self) -> dict[str, str]:
        """Environment for anything that talks to this stack (clients, trainers, the CLI)."""
        cfg = self.config
        procs = self.processes
        env: dict[str, str] = {"GOOGLE_CLOUD_PROJECT": cfg.project,
                               "GCLOUD_PROJECT": cfg.project}
        if procs.emulator_ports:
            env["FIRESTORE_EMULATOR_HOST"] = self.emulator_address("firestore")
            env["PUBSUB_EMULATOR_HOST"] = self.emulator_address("pubsub")
            env["STORAGE_EMULATOR_HOST"] = f"http://{self.emulator_address('gcs')}"
        env.update({
            S.ENV_PROJECT: cfg.project,
            S.ENV_EVENTS_TOPIC: S.TOPIC_EVENTS,
            S.ENV_TRAINER_EVENTS_TOPIC: S.TOPIC_TRAINER_EVENTS,
        })
        if self._pipelines_source is not None:
            env[S.ENV_PIPELINES] = str(self.run_dir / ACTIVE_PIPELINES)
        if procs.vertex_port is not None:
            env[S.ENV_VERTEX_ENDPOINT] = f"{HOST}:{procs.vertex_port}"
            # The Vertex emulator also answers Cloud Logging's ListLogEntries for its jobs.
            env[S.ENV_LOGGING_ENDPOINT] = f"{HOST}:{procs.vertex_port}"
            # ... and Cloud Monitoring's ListTimeSeries for its endpoints (a canary's traffic).
            env[S.ENV_MONITORING_ENDPOINT] = f"{HOST}:{procs.vertex_port}"
            if self.config.vertex_iam:  # this process and the CLI call as the operator
                env.update(self.identities.operator_env())
        if procs.dataflow_port is not None:  # issue 31: preprocess steps on the local Dataflow
            env[S.ENV_DATAFLOW_ENDPOINT] = f"http://{HOST}:{procs.dataflow_port}"
            env[S.ENV_DATAFLOW_LAUNCHER] = DATAFLOW_LAUNCHER
            # As deploy/functions.tf sets it: the jobs run as spotorch-dataflow, which the
            # local Dataflow checks the functions may act as (deploy/'s actAs grant).
            env[S.ENV_DATAFLOW_SERVICE_ACCOUNT] = account_email(
                cfg.deploy_dir.resolve(), cfg.project, "dataflow")
        if procs.dataproc_port is not None:  # issue 42: Spark steps on the local Dataproc
            env[S.ENV_DATAPROC_ENDPOINT] = f"{HOST}:{procs.dataproc_port}"
            env[S.ENV_SPARK_DRIVER] = SPARK_DRIVER
            # As deploy/functions.tf sets it: the batches run as spotorch-dataproc, which the
            # local Dataproc checks the functions may act as (deploy/'s actAs grant).
            env[S.ENV_DATAPROC_SERVICE_ACCOUNT] = account_email(
                cfg.deploy_dir.resolve(), cfg.project, "dataproc")
        if "api" in procs.function_ports:
            env["SPOTORCH_API_URL"] = self.function_url("api")
        if self._bigquery_front is not None:
            env[S.ENV_BIGQUERY_ENDPOINT] = self._bigquery_front.url
        return env

    def function_url(self, name: str) -> str:
        """Base URL of a function, e.g. http://127.0.0.1:PORT/."""
        return self.processes.function_url(name)

    def push_endpoint(self, topic: str, function: str) -> str:
        """Where the push subscription of topic -> function delivers."""
        # The push adapter pulls the subscription and posts here (spotorch.local._push_adapter).
        topic_path = f"projects/{self.config.project}/topics/{topic}"
        if self.config.push == "direct":
            return f"{self.function_url(function)}{topic_path}"
        return self.function_url(function)

    def subscription_name(self, topic: str, function: str) -> str:
        """The name of the local push subscription that feeds topic to function."""
        return subscription_name(topic, function)

    def alerts(self) -> list[dict[str, Any]]:
        """What the receivers got so far (empty without receivers)."""
        return read_alerts(self.run_dir / ALERTS_FILE)

    def describe(self) -> dict[str, Any]:
        """Addresses, ports, pids, env, pipelines, receivers and log paths, JSON-able."""
        procs = self.processes
        processes = {name: c.record() for name, c in procs.children.items()}
        return {
            "project": self.config.project,
            "running": self.running,
            "startup_s": self.startup_s,
            "run_dir": str(self.run_dir),
            "durable": self.config.durable,
            "data_dir": str(procs.data_dir) if self.config.durable else None,
            "env": self.env,
            "function_env": self._child_env(self.config.extra_env),
            "emulators": {n: self.emulator_address(n) for n in procs.emulator_ports},
            "functions": {
                name: {"url": self.function_url(name), "signature_type": sig,
                       "pid": procs.children[f"function:{name}"].pid
                       if f"function:{name}" in procs.children else None,
                       "log": str(self.run_dir / f"function-{name}.log")}
                for name, sig in self.config.functions.items()},
            "push": {"mode": self.config.push, "gcs_events": self.config.gcs_events,
                     "adapter": f"http://{HOST}:{procs.adapter_port}/"
                     if procs.adapter_port else None},
            "vertex": ({"address": f"{HOST}:{procs.vertex_port}",
                        "log": str(self.run_dir / "vertex.log"),
                        "workdir": str(procs.vertex_workdir)}
                       if procs.vertex_port else None),
            "pipelines": self.pipelines.to_json() if self.pipelines else None,
            "receivers": ({**self.receivers.urls(),
                           "alerts": str(self.run_dir / ALERTS_FILE)}
                          if self.receivers else None),
            "topics": list(TOPICS),
            "subscriptions": dict(self._pubsub_admin.subscriptions),
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
        return self._pubsub_admin.client(kind)

    def topic_path(self, topic: str) -> str:
        """The full resource name of a topic on the Pub/Sub emulator."""
        return self._pubsub_admin.topic_path(topic)

    def subscription_path(self, name: str) -> str:
        """The full resource name of a subscription on the Pub/Sub emulator."""
        return self._pubsub_admin.subscription_path(name)

    def publish(self, topic: str, data: bytes | str | Mapping[str, Any] = b"",
                ordering_key: str = "", **attributes: str) -> str:
        """Publish one message (a mapping is sent as JSON); returns its message id."""
        return self._pubsub_admin.publish(topic, data, ordering_key, **attributes)

    def tick(self) -> str:
        """Publish one tick now, as the ticker does: data {"time": RFC3339}."""
        return self.publish(S.TOPIC_TICK, {"time": now_rfc3339()})

    def pull_published(self, max_messages: int = 100, timeout_s: float = 2.0) -> list[bytes]:
        """Data of what spotorch published to its events topic since the last pull (acked)."""
        return [m.data for m in self.pull_messages(OBSERVER_SUBSCRIPTION, max_messages, timeout_s)]

    def pull_messages(self, subscription: str, max_messages: int = 100, timeout_s: float = 2.0
                      ) -> list[PulledMessage]:
        """Pull and acknowledge up to max_messages from a pull subscription, with attributes."""
        return self._pubsub_admin.pull(subscription, max_messages, timeout_s)

    def pull_dead_letters(self, max_messages: int = 100, timeout_s: float = 2.0
                          ) -> list[PulledMessage]:
        """Messages that exhausted their delivery attempts (attributes name the source)."""
        return self._pubsub_admin.pull(DEAD_LETTER_SUBSCRIPTION, max_messages, timeout_s)

    # -------------------------------------------------------------- GCS

    @property
    def unversioned_buckets(self) -> frozenset[str]:
        """Landing buckets made without the object versioning they were asked for (a durable
        stack's fake-gcs-server refuses it): a rerun there cannot read an overwritten object."""
        return frozenset(self._gcs.unversioned)

    def create_buckets(self, names: Sequence[str], versioned: Sequence[str] = ()) -> None:
        """Create buckets in fake-gcs-server (existing ones are fine); `versioned` ones, and
        the pipelines' landing buckets, with object versioning (spotorch.local._stack_gcs)."""
        landing = self.pipelines.landing_buckets if self.pipelines is not None else ()
        self._gcs.create_buckets(names, (*versioned, *landing))

    def upload(self, bucket: str, name: str, data: bytes,
               content_type: str = "application/octet-stream") -> str:
        """Upload an object (creating the bucket if needed); returns its gs:// URI."""
        return self._gcs.upload(bucket, name, data, content_type)
