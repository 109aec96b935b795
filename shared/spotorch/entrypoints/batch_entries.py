"""Dataproc audit entries decoded at the edge: which batch an entry names, as a
spotorch.core.preprocess.StatusHint (a reason to call GetBatch, nothing more; issue 42).

Dataproc has no Eventarc event for a batch's state. What it does write is Cloud Audit Logs:
Admin Activity entries (always on) for serviceName dataproc.googleapis.com, methodName
google.cloud.dataproc.v1.BatchController.CreateBatch, CancelBatch and DeleteBatch. CreateBatch
returns a long-running operation that is done when the batch ends; Cloud Audit Logs writes an
operation's last entry (`operation.last: true`) when it completes, for the services that log
long-running operations: whether Dataproc does for batches is not verified, so these entries are
hints where they exist and the tick's GetBatch is what every batch is followed by. A
CreateBatch entry that is not the operation's last (the request being accepted) says nothing of
an end and is skipped, as are Dataproc's other methods (clusters, workflows). The batch is the
entry's resourceName (projects/P/locations/L/batches/B), else the request's parent and batchId.
Bad input raises InvalidEvent naming the field. Nothing here does I/O.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from spotorch.core.errors import InvalidEvent
from spotorch.core.preprocess import StatusHint

DATAPROC_SERVICE = "dataproc.googleapis.com"
CREATE_BATCH = "google.cloud.dataproc.v1.BatchController.CreateBatch"
BATCH_METHODS = (CREATE_BATCH, "google.cloud.dataproc.v1.BatchController.CancelBatch",
                 "google.cloud.dataproc.v1.BatchController.DeleteBatch")
_BATCH = re.compile(r"^projects/([^/]+)/locations/([^/]+)/batches/([a-z0-9][a-z0-9-]{2,62})$")
_PARENT = re.compile(r"^projects/([^/]+)/locations/([^/]+)$")


def service_of(data: Any) -> str:
    """The protoPayload.serviceName of an audit entry ("" when it has none)."""
    payload = data.get("protoPayload") if isinstance(data, Mapping) else None
    name = payload.get("serviceName") if isinstance(payload, Mapping) else None
    return name if isinstance(name, str) else ""


def batch_hint(data: Any) -> StatusHint | None:
    """The batch a Dataproc audit entry says may have ended; None for an entry that says
    nothing of a batch's end (module docstring); InvalidEvent for a malformed one."""
    if isinstance(data, bytes | str):
        try:
            data = json.loads(data)
        except ValueError:
            raise InvalidEvent("data: not JSON") from None
    if not isinstance(data, Mapping):
        raise InvalidEvent("data: missing (expected a LogEntry object)")
    payload = data.get("protoPayload")
    if not isinstance(payload, Mapping):
        raise InvalidEvent("data.protoPayload: missing (expected an AuditLog)")
    if payload.get("serviceName") != DATAPROC_SERVICE:
        raise InvalidEvent(f"data.protoPayload.serviceName: not {DATAPROC_SERVICE}: "
                           f"{str(payload.get('serviceName'))[:80]!r}")
    method = payload.get("methodName")
    if method not in BATCH_METHODS:
        return None  # clusters, workflow templates, sessions: not a batch
    if method == CREATE_BATCH:
        operation = data.get("operation")
        if not isinstance(operation, Mapping) or operation.get("last") is not True:
            return None  # the request accepted: the batch has not ended
    found = _batch_of(payload)
    if found is None:
        raise InvalidEvent(f"data.protoPayload.resourceName: not a batch: "
                           f"{str(payload.get('resourceName'))[:120]!r}")
    project, region, batch_id = found
    return StatusHint(project, region, f"projects/{project}/locations/{region}/batches/"
                      f"{batch_id}", "", batch_id)


def _batch_of(payload: Mapping[str, Any]) -> tuple[str, str, str] | None:
    name = payload.get("resourceName")
    found = _BATCH.match(name) if isinstance(name, str) else None
    if found is not None:
        return found.group(1), found.group(2), found.group(3)
    request = payload.get("request")
    if isinstance(request, Mapping):
        parent = _PARENT.match(str(request.get("parent") or ""))
        batch_id = request.get("batchId")
        if parent is not None and isinstance(batch_id, str) and \
                _BATCH.match(f"{parent.group(0)}/batches/{batch_id}"):
            return parent.group(1), parent.group(2), batch_id
    return None
