"""A replica's first process: it dies with the Vertex emulator and takes the replica along.

A real worker is gone with its VM: when the job ends, or when Vertex takes the VM back. Locally,
the emulator signals each replica's process group when the job ends; if the emulator itself
dies (kill -9, a crash), nobody would, and the worker trained on (checked: it wrote
checkpoints while the run recovered). So each replica starts as this shim, the leader of its
own process group (a session of its own):

1. it asks Linux for a signal when its parent thread dies (prctl(PR_SET_PDEATHSIG) through
   ctypes), and checks that the parent did not die before it asked;
2. it runs the replica's command as its child, in its group;
3. on that signal it SIGKILLs the whole group (itself last), as a VM that goes away would;
4. when the command ends, it ends the same way (its exit status, or the same signal), so the
   emulator reads the replica's own status.

A SIGTERM to the group (a preemption, a cancel) reaches the command directly; the shim itself
waits for the command. Standard library only: run as `python -I _vertex_shim.py PARENT_PID --
ARGV...` with the replica's environment, which the command inherits.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import signal
import subprocess
import sys
from types import FrameType

PR_SET_PDEATHSIG = 1  # linux/prctl.h
PARENT_DIED = signal.SIGUSR1  # what the kernel sends the shim when its parent thread dies


def _kill_group(signum: int = 0, frame: FrameType | None = None) -> None:
    os.killpg(os.getpgrp(), signal.SIGKILL)


def _ask_for_parent_death_signal() -> bool:
    """True when Linux will signal the shim if its parent dies (False: not Linux, or no libc)."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        return bool(libc.prctl(PR_SET_PDEATHSIG, int(PARENT_DIED), 0, 0, 0) == 0)
    except (OSError, AttributeError):
        return False


def main(argv: list[str]) -> int:
    """Run the command after `--`; end as it ended."""
    parent = int(argv[0])
    command = argv[argv.index("--") + 1:]
    signal.signal(PARENT_DIED, _kill_group)
    if not _ask_for_parent_death_signal():
        sys.stderr.write("spotorch vertex shim: no parent-death signal on this system\n")
    if os.getppid() != parent:  # the emulator died before the signal was asked for
        _kill_group()
    # A Python handler, not SIG_IGN: the command must get the default handling back at exec.
    signal.signal(signal.SIGTERM, lambda signum, frame: None)
    signal.signal(signal.SIGINT, lambda signum, frame: None)
    try:
        child = subprocess.Popen(command)
    except OSError as exc:
        sys.stderr.write(f"cannot start {command[:1]}: {exc}\n")
        return 127
    while True:
        with contextlib.suppress(InterruptedError):
            code = child.wait()
            break
    if code < 0:  # killed by a signal: die of the same one, so the emulator reads 128 + N
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
