"""Structured logs: one JSON object per line, the fields Cloud Logging reads, no secrets."""

from __future__ import annotations

import io
import json
import logging
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from spotorch.logs import JsonFormatter, extra

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def captured() -> Iterator[tuple[logging.Logger, io.StringIO]]:
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(JsonFormatter())
    logger = logging.getLogger("spotorch.test-logs")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    try:
        yield logger, out
    finally:
        logger.removeHandler(handler)


def test_a_log_line_is_json_with_severity_message_and_run_labels(
        captured: tuple[logging.Logger, io.StringIO]) -> None:
    logger, out = captured
    logger.warning("job %s failed", "j1", extra={"run_id": "r1", "event_id": "e1", "skipped": None})
    entry = json.loads(out.getvalue())
    assert entry["severity"] == "WARNING" and entry["message"] == "job j1 failed"
    assert entry["run_id"] == "r1" and entry["event_id"] == "e1"
    assert entry["logging.googleapis.com/labels"] == {"run_id": "r1"}
    assert "skipped" not in entry


def test_webhook_urls_and_passwords_are_redacted(
        captured: tuple[logging.Logger, io.StringIO]) -> None:
    logger, out = captured
    logger.error("post to https://chat.googleapis.com/v1/spaces/X/messages?key=abc&token=def "
                 "failed; password=hunter2", extra={"detail": "token=s3cret"})
    line = out.getvalue()
    assert "abc" not in line and "hunter2" not in line and "s3cret" not in line
    assert "[REDACTED]" in line


def test_a_line_quoting_hostile_input_stays_under_cloud_loggings_entry_limit(
        captured: tuple[logging.Logger, io.StringIO]) -> None:
    logger, out = captured
    logger.warning("rejected event: gs://landing/%s", "x" * (1 << 20), extra={"object_name": "y" * 300_000})
    line = out.getvalue()
    assert len(line.encode()) < 256 * 1024  # Cloud Logging refuses larger entries
    entry = json.loads(line)
    assert entry["message"].startswith("rejected event: gs://landing/xxx")
    assert entry["message"].endswith("more characters]") and entry["object_name"].endswith("characters]")


def test_debug_lines_are_dropped_below_the_threshold(
        captured: tuple[logging.Logger, io.StringIO]) -> None:
    logger, out = captured
    logger.debug("noise")
    assert out.getvalue() == ""


def test_fields_named_like_record_attributes_do_not_break_logging(
        captured: tuple[logging.Logger, io.StringIO]) -> None:
    logger, out = captured
    logger.info("alert", extra=extra(name="chat", message="m", channel="c"))
    entry = json.loads(out.getvalue())
    assert entry["name_"] == "chat" and entry["channel"] == "c" and entry["message"] == "alert"


def test_setup_is_once_per_process_and_lines_go_to_stdout() -> None:
    code = ("import logging; from spotorch.logs import setup_logging; "
            "setup_logging(); setup_logging(); "
            "logging.getLogger('spotorch.x').info('hello', extra={'run_id': 'r'})")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={"PYTHONPATH": f"{ROOT / 'shared'}:{ROOT / 'trainer'}"}).stdout
    lines = out.splitlines()
    assert len(lines) == 1 and json.loads(lines[0])["message"] == "hello"
