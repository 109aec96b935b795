"""The state file of a background stack (.spotorch/stack.json), and requests to its supervisor.

The supervisor writes the state once the stack is ready; `dev down` reads it to stop what it
records (checking each process's start time, so a reused pid is never hit). Operations on a
running stack (restart a piece, reload pipelines) are request files in RUN_DIR/requests/ that
the supervisor carries out and answers with a .done file.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import time
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from spotorch.local._stack_procs import is_same_process, stop_groups

REQUESTS = "requests"


def write_json(path: Path, data: Mapping[str, Any]) -> None:
    """Write data atomically, readable by this user only: a stack's state holds the local
    operator's emulator token (never exported by `dev up`, read from here)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + f".{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(json.dumps(data, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, path)


def read_state(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def supervisor_alive(state: Mapping[str, Any]) -> bool:
    sup = state.get("supervisor") or {}
    pid = sup.get("pid")
    return isinstance(pid, int) and is_same_process(pid, sup.get("start_time"))


def stop_recorded(state: Mapping[str, Any], quiet: bool = False) -> list[str]:
    """Stop the supervisor of a recorded stack, then any recorded process still alive."""
    stopped: list[str] = []
    sup = state.get("supervisor") or {}
    if supervisor_alive(state):
        pid = int(sup["pid"])
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 2 * float(state.get("stop_timeout_s", 10)) + 10
        while is_same_process(pid, sup.get("start_time")) and time.monotonic() < deadline:
            time.sleep(0.1)
        if is_same_process(pid, sup.get("start_time")):
            stop_groups([pid], 1)
        stopped.append(f"supervisor {pid}")
    leftovers = {name: rec for name, rec in (state.get("processes") or {}).items()
                 if isinstance(rec.get("pid"), int)
                 and is_same_process(rec["pid"], rec.get("start_time"))}
    if leftovers:
        killed = stop_groups([rec["pgid"] for rec in leftovers.values()],
                             float(state.get("stop_timeout_s", 10)))
        stopped += [f"{name} {rec['pid']}" + (" (killed)" if rec["pgid"] in killed else "")
                    for name, rec in leftovers.items()]
    if not quiet:
        for line in stopped:
            sys.stderr.write(f"stopped {line}\n")
    return stopped


def ask_supervisor(state: Mapping[str, Any], request: Mapping[str, Any],
                   timeout: float) -> dict[str, Any]:
    """Leave a request for the running supervisor and wait for its answer."""
    directory = Path(str(state["run_dir"])) / REQUESTS
    directory.mkdir(parents=True, exist_ok=True)
    name = uuid.uuid4().hex
    write_json(directory / f"{name}.json", request)
    done = directory / f"{name}.done"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        answer = read_state(done)
        if answer is not None:
            done.unlink(missing_ok=True)
            return answer
        if not supervisor_alive(state):
            return {"ok": False, "error": "the supervisor is gone"}
        time.sleep(0.1)
    return {"ok": False, "error": f"no answer within {timeout:.0f}s"}


def pending_requests(run_dir: Path) -> list[tuple[Path, dict[str, Any]]]:
    """Requests waiting for the supervisor, oldest first (each removed as it is taken)."""
    directory = run_dir / REQUESTS
    if not directory.is_dir():
        return []
    found = []
    for path in sorted(directory.glob("*.json"), key=lambda p: p.stat().st_mtime):
        request = read_state(path)
        path.unlink(missing_ok=True)
        if request is not None:
            found.append((path.with_suffix(".done"), request))
    return found
