"""Dataflow statusChanged events decoded at the edge: what the event claims about a job, as a
spotorch.core.preprocess.StatusHint (a reason to call GetJob, nothing more). Nothing here does
I/O."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from spotorch.core.preprocess import LIVE_STATES, TERMINAL_STATES, StatusHint


def status_hint(data: Mapping[str, Any]) -> StatusHint:
    """The hint in the data of a google.cloud.dataflow.job.v1beta3.statusChanged CloudEvent
    (google-cloudevents JobEventData: {"payload": Job}); ValueError naming what is missing."""
    payload = data.get("payload") if isinstance(data, Mapping) else None
    if not isinstance(payload, Mapping):
        raise ValueError("statusChanged data has no payload object (expected "
                         "google.events.cloud.dataflow.v1beta3.JobEventData)")
    missing = [k for k in ("id", "projectId", "location", "currentState")
               if not isinstance(payload.get(k), str) or not payload.get(k)]
    if missing:
        raise ValueError(f"statusChanged payload lacks {', '.join(missing)}")
    state = str(payload["currentState"])
    if state not in TERMINAL_STATES | LIVE_STATES:
        raise ValueError(f"statusChanged payload.currentState {state!r} is not a Dataflow "
                         "JobState")
    return StatusHint(str(payload["projectId"]), str(payload["location"]), str(payload["id"]),
                      state, str(payload.get("name") or ""))
