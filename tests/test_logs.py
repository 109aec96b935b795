"""Structured logs: one JSON object per line, the fields Cloud Logging reads, no secrets."""

from __future__ import annotations

import io
import json

from spotorch.logs import StructuredLogger


def test_a_log_line_is_json_with_severity_message_and_run_labels() -> None:
    out = io.StringIO()
    StructuredLogger("t", out).warning("job failed", run_id="r1", event_id="e1", skipped=None)
    entry = json.loads(out.getvalue())
    assert entry["severity"] == "WARNING" and entry["message"] == "job failed"
    assert entry["run_id"] == "r1" and entry["event_id"] == "e1"
    assert entry["logging.googleapis.com/labels"] == {"run_id": "r1"}
    assert "skipped" not in entry


def test_webhook_urls_and_passwords_are_redacted() -> None:
    out = io.StringIO()
    StructuredLogger("t", out).error(
        "post to https://chat.googleapis.com/v1/spaces/X/messages?key=abc&token=def failed; "
        "password=hunter2")
    line = out.getvalue()
    assert "abc" not in line and "hunter2" not in line and "[REDACTED]" in line


def test_debug_lines_are_dropped_below_the_threshold() -> None:
    out = io.StringIO()
    StructuredLogger("t", out).debug("noise")
    assert out.getvalue() == ""
