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
_PORT_TAKEN = ("address already in use", "errno 98", "address in use",
               "connection in use")  # the last: gunicorn, after retrying for a while


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


Accept = Callable[[int, bytes], bool]


def _any_answer(status: int, body: bytes) -> bool:
    return True


def http_probe(url: str, accept: Accept = _any_answer) -> Probe:
    """Ready once url answers HTTP in a way accept(status, body) recognises (default: any)."""
    def probe() -> bool:
        try:
            with urllib.request.urlopen(url, timeout=1) as response:
                return accept(response.status, response.read(4096))
        except urllib.error.HTTPError as exc:
            return accept(exc.code, b"")
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


def all_probes(*probes: Probe) -> Probe:
    """Ready when every one of probes is (checked in order, the cheap ones first)."""
    return lambda: all(p() for p in probes)


def listening_inodes(port: int) -> set[str]:
    """Socket inodes listening on TCP port (IPv4 or IPv6), from /proc/net."""
    found: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            # local_address is HEXIP:HEXPORT; state 0A is LISTEN; the inode is field 9.
            if len(fields) > 9 and fields[3] == "0A" \
                    and int(fields[1].rsplit(":", 1)[1], 16) == port:
                found.add(fields[9])
    return found


def socket_inodes(pids: Iterable[int]) -> set[str]:
    """Inodes of the sockets these processes hold open."""
    found: set[str] = set()
    for pid in pids:
        fd_dir = Path(f"/proc/{pid}/fd")
        with contextlib.suppress(OSError):
            for fd in fd_dir.iterdir():
                with contextlib.suppress(OSError):
                    target = os.readlink(fd)
                    if target.startswith("socket:["):
                        found.add(target[8:-1])
    return found


def owns_port(pgid: int, port: int) -> bool:
    """True when a process of group pgid is the one listening on port (always True without
    /proc, where it cannot be told)."""
    if not _has_proc():
        return True
    listening = listening_inodes(port)
    return bool(listening) and bool(listening & socket_inodes(group_members(pgid)))


def owned_probe(child: Child, port: int, probe: Probe) -> Probe:
    """Ready only while child is alive, probe reaches the service, and it is the child (or a
    process of its group) that listens on port: a free port handed out by free_port() can be
    taken by another process before the child binds it, and that one may answer the probe."""
    return lambda: child.alive() and probe() and owns_port(child.pid, port)


def wait_ready(children: Mapping[str, tuple[Child, Probe]], timeout: float) -> list[str]:
    """Wait until every child's probe passes; return the names of those that died first."""
    pending = dict(children)
    dead: list[str] = []
    deadline = time.monotonic() + timeout
    while pending:
        for name, (child, probe) in list(pending.items()):
            if not child.alive():
                dead.append(name)
                del pending[name]
            elif probe():
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
