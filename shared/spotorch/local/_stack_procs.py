"""Child processes of the local stack: spawn with a log file, wait until ready, stop groups."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

Probe = Callable[[], bool]

# What a process that lost the race for its port prints before it exits.
_PORT_TAKEN = ("address already in use", "errno 98", "address in use")


class ProcError(RuntimeError):
    """A child process could not be started or did not become ready."""


@dataclass
class Child:
    """One child process: its own session (pgid == pid), so the whole group can be stopped."""

    name: str
    argv: tuple[str, ...]
    log_path: Path
    process: subprocess.Popen[bytes]
    port: int | None = None

    @property
    def pid(self) -> int:
        return self.process.pid

    def alive(self) -> bool:
        return self.process.poll() is None

    def port_was_taken(self) -> bool:
        """True when the process died because another process took its port first."""
        with contextlib.suppress(OSError):
            tail = self.log_path.read_bytes()[-4000:].decode("utf-8", "replace").lower()
            return any(marker in tail for marker in _PORT_TAKEN)
        return False

    def record(self) -> dict[str, object]:
        """What `spotorch dev down` needs to find and stop this process later."""
        return {"pid": self.pid, "pgid": self.pid, "start_time": proc_start_time(self.pid),
                "port": self.port, "log": str(self.log_path), "argv": list(self.argv)}


def spawn(name: str, argv: Sequence[str], log_path: Path, env: Mapping[str, str],
          cwd: Path | None = None, port: int | None = None) -> Child:
    """Start argv in a new session with stdout and stderr written to log_path (truncated)."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("wb") as log:
        try:
            process = subprocess.Popen(
                list(argv), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env=dict(env), cwd=cwd, start_new_session=True,
            )
        except OSError as exc:
            raise ProcError(f"{name}: cannot run {argv[0]}: {exc}") from exc
    return Child(name, tuple(argv), log_path, process, port)


def http_probe(url: str) -> Probe:
    """Ready once anything answers HTTP on url (an error status is an answer too)."""
    def probe() -> bool:
        try:
            with urllib.request.urlopen(url, timeout=1):
                return True
        except urllib.error.HTTPError:
            return True
        except (urllib.error.URLError, OSError):
            return False
    return probe


def tcp_probe(host: str, port: int) -> Probe:
    """Ready once the port accepts connections."""
    def probe() -> bool:
        try:
            with socket.create_connection((host, port), timeout=1):
                return True
        except OSError:
            return False
    return probe


def log_probe(path: Path, text: str) -> Probe:
    """Ready once the log file contains text."""
    needle = text.encode()

    def probe() -> bool:
        try:
            return needle in path.read_bytes()
        except OSError:
            return False
    return probe


def any_probe(*probes: Probe) -> Probe:
    """Ready when any of probes is."""
    return lambda: any(p() for p in probes)


def wait_ready(children: Mapping[str, tuple[Child, Probe]], timeout: float) -> list[str]:
    """Wait until every child's probe passes; return the names of those that died first."""
    pending = dict(children)
    dead: list[str] = []
    deadline = time.monotonic() + timeout
    while pending:
        for name, (child, probe) in list(pending.items()):
            if probe():
                del pending[name]
            elif not child.alive():
                dead.append(name)
                del pending[name]
        if not pending:
            break
        if time.monotonic() > deadline:
            names = ", ".join(f"{n} (log {c.log_path})" for n, (c, _) in pending.items())
            raise ProcError(f"not ready within {timeout:.0f}s: {names}")
        time.sleep(0.05)
    return dead


def log_tail(path: Path, lines: int = 15) -> str:
    """The last lines of a log file, for error messages."""
    try:
        return "\n".join(path.read_text("utf-8", "replace").splitlines()[-lines:])
    except OSError:
        return ""


# ------------------------------------------------------------------ stopping

def proc_start_time(pid: int) -> str | None:
    """The kernel's start time of pid (field 22 of /proc/PID/stat): tells a reused pid apart."""
    stat = _stat(pid)
    return stat[19] if stat and len(stat) > 19 else None


def _stat(pid: int) -> list[str] | None:
    """Fields of /proc/PID/stat after the command name, or None when there is no such process."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return raw[raw.rfind(")") + 2:].split()  # the command name may contain spaces and ')'


def _has_proc() -> bool:
    return Path("/proc/self/stat").exists()


def group_members(pgid: int) -> list[int]:
    """Live (non-zombie) processes of process group pgid."""
    if not _has_proc():
        try:
            os.killpg(pgid, 0)
        except (ProcessLookupError, PermissionError):
            return []
        return [pgid]
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        stat = _stat(int(entry.name))
        # stat[0] is the state, stat[2] the process group.
        if stat and len(stat) > 2 and stat[2] == str(pgid) and stat[0] not in ("Z", "X"):
            members.append(int(entry.name))
    return members


def is_same_process(pid: int, start_time: str | None) -> bool:
    """True when pid is alive and (if known) still the process that was recorded."""
    if not _has_proc():
        try:
            os.kill(pid, 0)
        except (ProcessLookupError, PermissionError):
            return False
        return True
    stat = _stat(pid)
    if stat is None or stat[0] in ("Z", "X"):
        return False
    return start_time is None or proc_start_time(pid) == start_time


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def stop_groups(pgids: Iterable[int], timeout: float,
                owned: Iterable[subprocess.Popen[bytes]] = ()) -> list[int]:
    """SIGTERM each process group, wait up to timeout, then SIGKILL what is left.

    owned: Popen objects of ours among them, reaped here so that no zombie stays behind.
    Returns the groups that had to be killed.
    """
    groups = [g for g in dict.fromkeys(pgids) if g > 1 and g != os.getpgrp()]
    procs = list(owned)
    for pgid in groups:
        _signal_group(pgid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for proc in procs:
            proc.poll()
        if not any(group_members(g) for g in groups):
            break
        time.sleep(0.05)
    killed = [g for g in groups if group_members(g)]
    for pgid in killed:
        _signal_group(pgid, signal.SIGKILL)
    for proc in procs:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=5)
    end = time.monotonic() + 5
    while any(group_members(g) for g in killed) and time.monotonic() < end:
        time.sleep(0.05)
    return killed
