"""Structured JSON log lines in the shape Cloud Logging reads from stdout (severity, message, fields)."""

from __future__ import annotations

import json
import os
import re
import sys
import time
from typing import Any, TextIO

_LEVELS = {"DEBUG": 10, "INFO": 20, "NOTICE": 25, "WARNING": 30, "ERROR": 40, "CRITICAL": 50}

# Anything that looks like a credential is masked before a line is written.
_SECRET = re.compile(r"(https://(hooks\.slack\.com|chat\.googleapis\.com)/\S+|"
                     r"(password|token|secret|key)=[^&\s]+)", re.IGNORECASE)


def redact(text: str) -> str:
    """Mask webhook URLs and credential parameters."""
    return _SECRET.sub("[REDACTED]", text)


class StructuredLogger:
    """Writes one JSON object per line; Cloud Logging turns each into a structured entry."""

    def __init__(self, name: str, stream: TextIO | None = None) -> None:
        self.name = name
        self.stream = stream
        self.threshold = _LEVELS.get(os.environ.get("SPOTORCH_LOG_LEVEL", "INFO").upper(), 20)

    def log(self, severity: str, message: str, **fields: Any) -> None:
        if _LEVELS[severity] < self.threshold:
            return
        entry: dict[str, Any] = {"severity": severity, "message": redact(message),
                                 "logger": self.name, "time": time.time()}
        run_id = fields.pop("run_id", None)
        if run_id:
            entry["run_id"] = run_id
            entry["logging.googleapis.com/labels"] = {"run_id": str(run_id)}
        entry.update({k: v for k, v in fields.items() if v is not None})
        line = json.dumps(entry, default=str)
        print(line, file=self.stream or sys.stdout, flush=True)

    def debug(self, message: str, **fields: Any) -> None:
        self.log("DEBUG", message, **fields)

    def info(self, message: str, **fields: Any) -> None:
        self.log("INFO", message, **fields)

    def warning(self, message: str, **fields: Any) -> None:
        self.log("WARNING", message, **fields)

    def error(self, message: str, **fields: Any) -> None:
        self.log("ERROR", message, **fields)


def logger(name: str) -> StructuredLogger:
    return StructuredLogger(name)
