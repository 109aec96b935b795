"""spotorch's one logging path: stdlib `logging`, one JSON formatter in the shape Cloud Logging reads
from stdout (severity, message, run and event ids as fields), set up once per process.

Modules log with `logging.getLogger("spotorch.<module>")` and pass fields as `extra={...}`; a
`run_id` field also becomes a log label so every line of a run is one filter away.
"""

from __future__ import annotations

import json
import logging
import os
import re
import sys
import threading
from typing import Any, TextIO

LEVEL_ENV = "SPOTORCH_LOG_LEVEL"
ROOT = "spotorch"

# Lines Cloud Monitoring counts (deploy/monitoring.tf's log-based metrics select on this field):
# `extra={METRIC_FIELD: METRIC_RUN_ENDED, ...}`, written at INFO.
METRIC_FIELD = "spotorch_metric"
METRIC_RUN_ENDED = "run_ended"  # status, pipeline, spent (the ledger's total), currency
METRIC_ATTEMPT_PREEMPTED = "attempt_preempted"  # pipeline, region, capacity
METRIC_ATTEMPT_RELAUNCHED = "attempt_relaunched"  # pipeline, after (the failure), relaunch_s
METRIC_TICK = "tick"  # one per reconcile tick: the reconciler is alive

# Anything that looks like a credential is masked before a line is written.
_SECRET = re.compile(r"(https://(hooks\.slack\.com|chat\.googleapis\.com)/\S+|"
                     r"(password|token|secret|key)=[^&\s]+)", re.IGNORECASE)

# Cloud Logging's severities for stdlib's level names.
_SEVERITY = {"DEBUG": "DEBUG", "INFO": "INFO", "WARNING": "WARNING", "ERROR": "ERROR",
             "CRITICAL": "CRITICAL"}
# Attributes every LogRecord has; anything else on a record came in through `extra`.
_STANDARD = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message",
                                                                                "asctime"}


# Cloud Logging refuses an entry over 256 KiB; a message quoting hostile input (a 1 MiB object
# name) must still be written, shortened and saying so.
MAX_MESSAGE_CHARS = 16_000


def redact(text: str) -> str:
    """Mask webhook URLs and credential parameters."""
    return _SECRET.sub("[REDACTED]", text)


def shorten(text: str, limit: int = MAX_MESSAGE_CHARS) -> str:
    """At most limit characters, with how much was cut."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... [{len(text) - limit} more characters]"


class JsonFormatter(logging.Formatter):
    """One JSON object per record; Cloud Logging turns each line into a structured entry."""

    def format(self, record: logging.LogRecord) -> str:
        """One JSON line: severity, message, logger, time and the record's extra fields, secrets redacted."""
        entry: dict[str, Any] = {"severity": _SEVERITY.get(record.levelname, record.levelname),
                                 "message": redact(shorten(record.getMessage())),
                                 "logger": record.name,
                                 "time": record.created}
        for key, value in vars(record).items():
            if key not in _STANDARD and value is not None:
                entry[key] = redact(shorten(value)) if isinstance(value, str) else value
        run_id = entry.get("run_id")
        if run_id:
            entry["logging.googleapis.com/labels"] = {"run_id": str(run_id)}
        if record.exc_info:
            entry["stack_trace"] = redact(self.formatException(record.exc_info))
        return json.dumps(entry, default=str)


class _StdoutHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes to whatever sys.stdout is at the time of the record (a test's capture included)."""

    def __init__(self) -> None:
        super().__init__()

    @property
    def stream(self) -> TextIO:
        return sys.stdout

    @stream.setter
    def stream(self, value: TextIO) -> None:
        pass  # always sys.stdout


_setup_lock = threading.Lock()
_handler: logging.Handler | None = None


def setup_logging(stream: TextIO | None = None, level: str | None = None) -> logging.Handler:
    """Send spotorch's records to stdout as JSON lines; the first call wins (one per process)."""
    global _handler
    with _setup_lock:
        if _handler is None:
            _handler = logging.StreamHandler(stream) if stream else _StdoutHandler()
            _handler.setFormatter(JsonFormatter())
            root = logging.getLogger(ROOT)
            root.addHandler(_handler)
            root.setLevel((level or os.environ.get(LEVEL_ENV, "INFO")).upper())
            root.propagate = False  # functions-framework's own handlers must not print it twice
        return _handler


def extra(**fields: Any) -> dict[str, Any]:
    """Fields for `extra=`, renamed where a name is one a LogRecord already has (e.g. `name`)."""
    return {f"{key}_" if key in _STANDARD else key: value for key, value in fields.items()}


# --- secret values: never in a log line, a record or an alert's error text ---------------------

_sensitive: set[str] = set()
_sensitive_lock = threading.Lock()
_URL = re.compile(r"(?i)\b(https?://[^/\s?#'\"<>]+)[^\s'\"<>]*")
_MIN_SECRET_LEN = 4  # shorter values would blank out ordinary words in logs


def mark_sensitive(value: str) -> None:
    """Remember a secret value so redact_secrets() removes it from anything logged or recorded."""
    if len(value) >= _MIN_SECRET_LEN:
        with _sensitive_lock:
            _sensitive.add(value)


def redact_secrets(text: str) -> str:
    """Text without known secret values and without the path or query of any http(s) URL."""
    with _sensitive_lock:
        secrets = sorted(_sensitive, key=len, reverse=True)
    for secret in secrets:
        text = text.replace(secret, "***")
    return _URL.sub(r"\1/***", text)
