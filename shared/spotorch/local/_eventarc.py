"""Eventarc's delivery for the local emulators: a binary-mode CloudEvent POSTed to a function's
URL, again on failure, as Eventarc retries; and the attributes it sends with a Cloud Audit Logs
entry. The local BigQuery front, the local Dataflow and the local Dataproc deliver through it."""

from __future__ import annotations

import json
import logging
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from typing import Any

from spotorch.entrypoints.audit_entries import AUDIT_LOG_TYPE

log = logging.getLogger("spotorch.local.eventarc")

DELIVERY_ATTEMPTS = 5  # then the event is lost, as Eventarc's retries run out: the tick repairs


def audit_headers(entry: Mapping[str, Any]) -> dict[str, str]:
    """The binary-mode CloudEvent attributes Eventarc sends with a Cloud Audit Logs entry: type,
    source (the entry's log: activity or data_access), subject, and the serviceName,
    methodName, resourceName extensions."""
    payload = entry["protoPayload"]
    project = entry["resource"]["labels"]["project_id"]
    log_kind = str(entry["logName"]).rsplit("%2F", 1)[-1]
    return {
        "ce-specversion": "1.0",
        "ce-type": AUDIT_LOG_TYPE,
        "ce-source": f"//cloudaudit.googleapis.com/projects/{project}/logs/{log_kind}",
        "ce-id": f"projects/{project}/logs/cloudaudit.googleapis.com%2F{log_kind}"
                 f"{entry['insertId']}{entry['timestamp']}",
        "ce-time": entry["timestamp"],
        "ce-subject": f"{payload['serviceName']}/{payload['resourceName']}",
        "ce-servicename": payload["serviceName"],
        "ce-methodname": payload["methodName"],
        "ce-resourcename": payload["resourceName"],
        "ce-dataschema": "https://googleapis.github.io/google-cloudevents/jsonschema/google/events/"
                         "cloud/audit/v1/LogEntryData.json",
        "Content-Type": "application/json; charset=utf-8",
    }


def post(url: str | Callable[[], str], body: bytes, headers: Mapping[str, str], *,
         pause_s: float = 1.0, timeout_s: float = 600.0) -> bool:
    """POST one event as Eventarc does, again on failure (backoff from pause_s, in the caller's
    thread); False when every attempt failed. url: the function's, or how to find it now (a
    function restarted elsewhere)."""
    for attempt in range(DELIVERY_ATTEMPTS):
        request = urllib.request.Request(url() if callable(url) else url, data=body,
                                         method="POST", headers=dict(headers))
        try:
            with urllib.request.urlopen(request, timeout=timeout_s) as response:
                if 200 <= response.status < 300:
                    return True
        except (urllib.error.URLError, OSError) as exc:
            log.info("event delivery %d failed: %s", attempt + 1, exc)
        time.sleep(min(pause_s * 2 ** attempt, 10.0))
    return False


def deliver_audit_entry(url: str | Callable[[], str], entry: Mapping[str, Any],
                        pause_s: float = 1.0) -> bool:
    """POST one Cloud Audit Logs entry as Eventarc delivers it (post)."""
    return post(url, json.dumps(entry).encode(), audit_headers(entry), pause_s=pause_s)
