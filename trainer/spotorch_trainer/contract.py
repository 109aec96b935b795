"""The contract between spotorch and training code: env variables, checkpoints, exit codes, events.

Pure constants and tiny pure helpers, importable by both the trainer helper and the service.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from datetime import UTC, datetime

# Environment variables spotorch sets on every worker of every attempt.
ENV_RUN_ID = "SPOTORCH_RUN_ID"
ENV_ATTEMPT = "SPOTORCH_ATTEMPT"
ENV_PIPELINE = "SPOTORCH_PIPELINE"
ENV_CHECKPOINT_URI = "SPOTORCH_CHECKPOINT_URI"  # the run's checkpoint root: gs://... or local path
ENV_RESUME_FROM = "SPOTORCH_RESUME_FROM"  # URI of the checkpoint to resume from; empty: start fresh
ENV_RESUME_STEP = "SPOTORCH_RESUME_STEP"  # its step; empty: start fresh
ENV_DATA_URI = "SPOTORCH_DATA_URI"  # the data snapshot this run trains on
ENV_MODEL_URI = "SPOTORCH_MODEL_URI"  # where the final model goes (Vertex also sets AIP_MODEL_DIR)
# projects/P/topics/T for trainer events; empty: don't report.
ENV_EVENTS_TOPIC = "SPOTORCH_EVENTS_TOPIC"
# A sweep trial's parameters as a JSON object (set only on trials; see spotorch_trainer.params()).
ENV_PARAMS = "SPOTORCH_PARAMS"
# "1": resume from SPOTORCH_RESUME_FROM only, never a newer checkpoint under the root (set after
# a divergence, while checkpoints written during it may still exist). Unset or empty: the newest.
ENV_RESUME_EXACT = "SPOTORCH_RESUME_EXACT"
# The run's seed (an integer; spotorch picks it per run and a rerun reuses it): training code
# that has no seed of its own seeds its RNGs with it (spotorch_trainer.TrainerEnv.seed).
ENV_SEED = "SPOTORCH_SEED"
# gs:// URI of the run's inputs manifest: JSON {"bucket", "objects": [{"name", "generation"}]},
# every object of the snapshot at the generation the run was created with. Read with
# spotorch_trainer.snapshot_objects(); a later overwrite of an object changes nothing it reads.
ENV_INPUTS = "SPOTORCH_INPUTS"

TRAINER_ENV = (ENV_RUN_ID, ENV_ATTEMPT, ENV_PIPELINE, ENV_CHECKPOINT_URI, ENV_RESUME_FROM,
               ENV_RESUME_STEP, ENV_DATA_URI, ENV_MODEL_URI, ENV_EVENTS_TOPIC)

# Checkpoint layout: {checkpoint_uri}/step-{step:010d}/<files>, then the marker, written last.
CHECKPOINT_DIR_PREFIX = "step-"
COMPLETION_MARKER = "_COMPLETE"


def checkpoint_dir_name(step: int) -> str:
    """Directory name of the checkpoint taken at this step."""
    return f"{CHECKPOINT_DIR_PREFIX}{step:010d}"


def parse_checkpoint_step(name: str) -> int | None:
    """Step of a checkpoint directory name, or None when the name is not one."""
    name = name.rstrip("/").rsplit("/", 1)[-1]
    if not name.startswith(CHECKPOINT_DIR_PREFIX):
        return None
    digits = name[len(CHECKPOINT_DIR_PREFIX):]
    return int(digits) if digits.isdigit() else None


# Exit codes the trainer uses and spotorch recognises.
EXIT_PREEMPTED = 143  # 128 + SIGTERM: wrote a final checkpoint after SIGTERM and stopped
EXIT_USER_ERROR = 1
# 128 + SIGKILL: the kernel (out of memory), the VM going away or the runtime killed the process.
# Never what a Python exception exits with: spotorch counts it as infrastructure unless an
# out-of-memory signal says otherwise, or the trainer itself reported exiting with it.
EXIT_KILLED = 137
# A replica's collective lost a peer (dead, or hung past the collective's timeout): nothing is
# wrong with the code. EX_TEMPFAIL; a pipeline lists it in recovery.retryable_exit_codes to retry
# it as an infrastructure error (the demo's distributed story does).
EXIT_PEER_LOST = 75

# Trainer event kinds (data field "kind"; also the Pub/Sub attribute "kind").
EVENT_STARTED = "started"
EVENT_PROGRESS = "progress"
EVENT_CHECKPOINT = "checkpoint"
EVENT_PREEMPTING = "preempting"
EVENT_COMPLETED = "completed"
EVENT_FAILED = "failed"
EVENT_KINDS = (EVENT_STARTED, EVENT_PROGRESS, EVENT_CHECKPOINT, EVENT_PREEMPTING,
               EVENT_COMPLETED, EVENT_FAILED)

# Pub/Sub attribute that marks a message as a trainer event (on_job_event also gets job states).
ATTR_SOURCE = "spotorch_source"
SOURCE_TRAINER = "trainer"
SOURCE_JOB = "job"


def trainer_event_id(run_id: str, attempt: int, kind: str, step: int | None) -> str:
    """Stable id of a trainer event, so a re-sent report is recognised as the same event."""
    return f"{run_id}/{attempt}/{kind}/{'' if step is None else step}"


# --- Additions (additive only; the names above are the stable contract) ---

# Checkpoint marker content: JSON with these keys (written last, so its presence means "complete").
MARKER_STEP = "step"
MARKER_FILES = "files"
MARKER_TIME = "time"

# Pub/Sub attributes of a trainer event besides ATTR_SOURCE (all values are strings).
ATTR_RUN_ID = "run_id"
ATTR_ATTEMPT = "attempt"
ATTR_KIND = "kind"

# --- Signed reports (format v1) ---
# Every attempt has a key of its own: random, set by spotorch in SPOTORCH_REPORT_KEY on the
# attempt's workers only (never in a log line, an event or an operator view). A report is signed
# with HMAC-SHA256 over the exact bytes of the message data, keyed with the key's UTF-8 bytes;
# the signature travels in the attribute ATTR_SIGNATURE as "v1=<64 lowercase hex digits>", and
# the attribute ATTR_ATTEMPT names the attempt whose key signed it (it must match the data's
# "attempt"). spotorch refuses a report that is unsigned, signed with another key, or of an
# unknown version; a later format gets a new version name and is accepted alongside.
ENV_REPORT_KEY = "SPOTORCH_REPORT_KEY"
ATTR_SIGNATURE = "spotorch_signature"
SIGNATURE_VERSION = "v1"


def _digest(key: str, data: bytes) -> str:
    return hmac.new(key.encode(), data, hashlib.sha256).hexdigest()


def sign_report(key: str, data: bytes) -> str:
    """The ATTR_SIGNATURE value of a report whose message data is `data`."""
    return f"{SIGNATURE_VERSION}={_digest(key, data)}"


def signature_problem(key: str, data: bytes, signature: str) -> str | None:
    """Why `signature` does not prove that the holder of `key` sent `data`; None when it does.

    The comparison takes the same time whatever the signature (hmac.compare_digest)."""
    version, sep, digest = signature.partition("=")
    if not sep or version != SIGNATURE_VERSION:
        return f"unknown signature format {signature[:12]!r} (expected {SIGNATURE_VERSION}=...)"
    if not hmac.compare_digest(_digest(key, data).encode(), digest.encode()):
        return "the signature does not match the data"
    return None

# Keys of a trainer event's JSON data; absent values are JSON null.
EVENT_DATA_FIELDS = ("event_id", "kind", "run_id", "attempt", "pipeline", "step", "total_steps",
                     "metrics", "checkpoint_uri", "exit_code", "time")
# Optional keys (training health; absent from older trainers):
# "nonfinite": names of metrics whose value was NaN or infinite (left out of "metrics", which
#   has no JSON spelling for them); "report_interval_s": the trainer's progress interval;
# "checkpoint_s": how long the reported checkpoint took to write; "replica_step_s": each
# training rank's own mean step time since the chief's last report (Run.agree_step_times).
EVENT_HEALTH_FIELDS = ("nonfinite", "report_interval_s", "checkpoint_s", "replica_step_s")


def checkpoint_uri(root: str, step: int) -> str:
    """URI of the checkpoint taken at this step under a run's checkpoint root (local path or gs://)."""
    return f"{root.rstrip('/')}/{checkpoint_dir_name(step)}"


# Timestamps on the wire (event times, markers, log entries): RFC 3339 in UTC.
_SUBMICRO = re.compile(r"(\.\d{6})\d+")


def rfc3339(ts: float, timespec: str = "milliseconds") -> str:
    """RFC 3339 UTC timestamp, e.g. 2026-01-31T12:00:00.123Z."""
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec=timespec).replace("+00:00", "Z")


def parse_rfc3339(text: str) -> float:
    """Seconds since the epoch of an RFC 3339 timestamp (nanoseconds cut to microseconds)."""
    value = datetime.fromisoformat(_SUBMICRO.sub(r"\1", text.strip()).replace("Z", "+00:00"))
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return value.timestamp()

# Probes (issue 19): spotorch runs the training code for this many steps on a candidate machine
# shape; after them the trainer writes PROBE_REPORT under its checkpoint root and exits 0.
ENV_PROBE_STEPS = "SPOTORCH_PROBE_STEPS"
PROBE_REPORT = "probe.json"
# Keys of the probe report (JSON); absent measurements are null.
PROBE_FIELDS = ("steps", "steps_per_s", "samples_per_s", "step_time_cv", "peak_host_rss_mb",
                "peak_accelerator_mb", "oom", "error", "time")
