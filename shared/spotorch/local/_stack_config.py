"""The local stack's configuration: what runs, how it is wired, where it keeps its data."""

from __future__ import annotations

import dataclasses
import importlib.util
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from spotorch import settings as S

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
DEAD_LETTER_SUBSCRIPTION = S.SUBSCRIPTION_DEAD_LETTER_LOCAL

VERTEX_MODULE = "spotorch.local.vertex_emulator"
VERTEX_READY_LINE = "vertex emulator listening on"
DATAFLOW_MODULE = "spotorch.local.dataflow_emulator"
DATAFLOW_READY_LINE = "dataflow emulator listening on"
# The spec URI of spotorch's launcher flex template on the local stack (the emulator runs the
# launcher itself: it reads no template file).
DATAFLOW_LAUNCHER = "gs://spotorch-dataflow-templates/spotorch-launcher.json"
# issue 42: the local Dataproc, and where the stack puts spotorch's PySpark driver (the batches'
# main file, read from fake GCS as Dataproc reads it: SPOTORCH_SPARK_DRIVER).
DATAPROC_MODULE = "spotorch.local.dataproc_emulator"
DATAPROC_READY_LINE = "dataproc emulator listening on"
SPARK_DRIVER_BUCKET = "spotorch-spark-driver"
SPARK_DRIVER = f"gs://{SPARK_DRIVER_BUCKET}/spotorch_spark_main.py"

# How pushes reach the functions:
#   eventarc: through our adapter, which posts CloudEvents exactly as Eventarc would (default);
#   direct:   straight to functions-framework with the topic in the path (deploy/pubsub.tf does
#             this in production; functions-framework converts the raw push body itself).
PUSH_MODES = ("eventarc", "direct")
# How on_object_finalized gets GCS events: pubsub = the notification wrapped in messagePublished;
# storage = Eventarc's google.cloud.storage.object.v1.finalized (eventarc push mode only).
GCS_EVENT_FORMS = ("pubsub", "storage")

DEFAULT_RUN_DIR = Path(".spotorch/stack")
DEFAULT_STATE = Path(".spotorch/stack.json")
DATA_DIR = "data"  # under run_dir: what a durable stack keeps across stops


class StackError(RuntimeError):
    """The local stack could not be started, used or stopped."""


def repo_file(*parts: str) -> Path:
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
    functions_source: Path = field(default_factory=lambda: repo_file("functions", "main.py"))
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
    # The Vertex emulator checks every caller against deploy/'s grants (docs/local-stack.md,
    # "IAM"); deploy_dir: the Terraform whose grants count (a copy with a grant removed, in tests).
    vertex_iam: bool = True
    # issue 31: the local Dataflow (spotorch.local.dataflow_emulator) for preprocess steps; it
    # runs Beam in its own environment (make beam-venv; beam_python None: that one).
    dataflow: bool = False
    beam_python: Path | None = None
    # issue 42: the local Dataproc (spotorch.local.dataproc_emulator) for Spark steps; PySpark in
    # its own environment (make spark-venv; spark_python None: that one).
    dataproc: bool = False
    spark_python: Path | None = None
    deploy_dir: Path = field(default_factory=lambda: repo_file("deploy"))
    # Keep state across stops: Firestore exported at stop and imported at start, GCS on disk,
    # the Vertex emulator's jobs in a file (RUN_DIR/data/); docs/local-stack.md says what cannot.
    durable: bool = False
    fresh: bool = False  # a durable stack forgets what it kept, once, at start
    # Start a webhook and an SMTP receiver and route the pipelines' alert channels to them.
    receivers: bool = False
    pipeline_reload_s: float | None = None  # watch the pipelines' files this often (None: no)
    # The BigQuery emulator behind its front and on_table_changed (spotorch.local.bigquery);
    # turned on by any pipeline with trigger.bigquery.
    bigquery: bool = False
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


