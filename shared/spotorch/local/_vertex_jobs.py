"""The Vertex emulator's job store: one record per custom job, optionally kept in a JSON file."""

from __future__ import annotations

import functools
import json
import logging
import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from spotorch.adapters.gcp.vertex import JobState
from spotorch.local._vertex_workers import Replica

log = logging.getLogger("spotorch.local.vertex_emulator")

TERMINAL = frozenset({JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED})
DEFAULT_TIMEOUT_S = 7 * 24 * 3600.0

# google.rpc.Code numbers of the errors the emulator puts on jobs.
CODE_CANCELLED = 1
CODE_INVALID_ARGUMENT = 3  # what Vertex reports for a replica that exits non-zero
CODE_DEADLINE_EXCEEDED = 4
CODE_RESOURCE_EXHAUSTED = 8  # our choice for Spot preemption (Vertex: "a STOCKOUT error")
CODE_INTERNAL = 13  # the emulator stopped while the job ran: its workers are gone


class Invalid(Exception):
    """A request the real service would refuse; carries the gRPC status name."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


def utc(ts: float) -> datetime:
    return datetime.fromtimestamp(ts, UTC)


@dataclass
class Stop:
    """A job being stopped: its workers got SIGTERM; at kill_at the rest get SIGKILL."""

    end_state: JobState
    error_code: int
    error_message: str
    kill_at: float
    # One replica's VM preempted (workerpoolP-I): only it got SIGTERM; the others get theirs
    # once it is gone (the job fails: Vertex shuts the rest down).
    only: str | None = None


@dataclass
class JobRecord:
    """The emulator's record of one custom job; `proto` is what Get returns."""

    proto: Any  # aiplatform_v1.CustomJob
    job_id: str
    project: str
    region: str
    spot: bool
    timeout_s: float
    log_dir: Path
    since: float  # monotonic time of the last state change
    started: float | None = None  # monotonic time it started running
    replicas: list[Replica] = field(default_factory=list)
    stop: Stop | None = None
    states: list[JobState] = field(default_factory=list)  # every state it went through
    replica_rules_done: set[int] = field(default_factory=set)  # single-replica rules applied
    restarting: dict[str, float] = field(default_factory=dict)  # replica -> SIGKILL time

    @property
    def state(self) -> JobState:
        return JobState(int(self.proto.state))

    @functools.cached_property
    def name(self) -> str:
        return str(self.proto.name)

    @functools.cached_property
    def display_name(self) -> str:
        return str(self.proto.display_name)

    def state_name(self) -> str:
        return f"JOB_STATE_{self.state.name}"

    @functools.cached_property
    def labels(self) -> dict[str, str]:
        """The job's labels as a dict. Labels, name and display name never change after creation
        (the emulator has no UpdateCustomJob), and a listing's filter reads them for every job:
        the proto's fields are many times slower to read."""
        return dict(self.proto.labels)

    def to_json(self) -> dict[str, Any]:
        from google.cloud import aiplatform_v1 as v1

        return {"job": json.loads(v1.CustomJob.to_json(self.proto)), "job_id": self.job_id,
                "project": self.project, "region": self.region, "spot": self.spot,
                "timeout_s": self.timeout_s, "log_dir": str(self.log_dir),
                "states": [s.name for s in self.states]}

    @classmethod
    def from_json(cls, data: dict[str, Any], now: float) -> JobRecord:
        from google.cloud import aiplatform_v1 as v1

        return cls(proto=v1.CustomJob.from_json(json.dumps(data["job"])), job_id=data["job_id"],
                   project=data["project"], region=data["region"], spot=bool(data["spot"]),
                   timeout_s=float(data["timeout_s"]), log_dir=Path(data["log_dir"]), since=now,
                   states=[JobState[s] for s in data.get("states", [])])


class JobStore:
    """Every job by name, under one lock; with a path, saved after every change."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = path
        self.lock = threading.RLock()
        self._jobs: dict[str, JobRecord] = {}

    def add(self, record: JobRecord) -> None:
        with self.lock:
            self._jobs[record.proto.name] = record

    def get(self, name: str) -> JobRecord | None:
        with self.lock:
            return self._jobs.get(name)

    def __getitem__(self, name: str) -> JobRecord:
        with self.lock:
            return self._jobs[name]

    def records(self) -> list[JobRecord]:
        """Oldest first (the order of creation)."""
        with self.lock:
            return list(self._jobs.values())

    def __iter__(self) -> Iterator[JobRecord]:
        return iter(self.records())

    def save(self) -> None:
        """Write every job to the file (atomically), if there is one."""
        if self.path is None:
            return
        with self.lock:
            data = [r.to_json() for r in self._jobs.values()]
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
        os.replace(tmp, self.path)

    def load(self, now: float) -> list[JobRecord]:
        """The jobs the file holds, added to the store (none when there is no file)."""
        if self.path is None or not self.path.exists():
            return []
        try:
            raw = json.loads(self.path.read_text())
            loaded = [JobRecord.from_json(item, now) for item in raw]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            log.error("cannot read the saved jobs in %s (%s): starting without them",
                      self.path, exc)
            return []
        for record in loaded:
            self.add(record)
        return loaded
