"""Example workloads that really misbehave, for spotorch's training-health rules (issue 16).

    python examples/unhealthy.py --mode hang    [--hang-at-step 30] [--bad-attempts 1]
    python examples/unhealthy.py --mode diverge [--diverge-at-step 30] [--bad-attempts 99]
    python examples/unhealthy.py --mode oom     [--alloc-mb 512] [--memory-limit-mb 256]

A toy training loop through spotorch_trainer (standard library only): the loss falls as
1 / (1 + step / 20); checkpoints every --checkpoint-every steps; progress every
--progress-interval seconds. Then, on the attempts numbered <= --bad-attempts
(SPOTORCH_ATTEMPT; 1 outside spotorch):

- hang: at --hang-at-step the main thread blocks for good while the process lives (a stuck
  collective, a dead data loader). No more reports; SIGTERM is caught by the helper but the
  loop never gets to look at the flag, so only the grace-period SIGKILL ends it.
- diverge: from --diverge-at-step the loss grows x --blowup per step until it overflows to
  inf and then NaN (a learning rate that is too high). The loop carries on, as a real one does.
- oom: at --oom-at-step it allocates --alloc-mb MiB and touches every page. Under a memory limit
  smaller than that (the Vertex emulator's per-machine limit, or --memory-limit-mb, which sets
  RLIMIT_AS on itself) the allocation fails with MemoryError: exit 1, "MemoryError" on stderr.

Later attempts train normally, so a run that recovers (relaunch after a hang, a larger machine
after OOM) succeeds. Every option also reads an EXAMPLE_* variable. The model (model.json) goes
to SPOTORCH_MODEL_URI / --model-dir.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path

_TRAINER = Path(__file__).resolve().parent.parent / "trainer"
if (_TRAINER / "spotorch_trainer" / "__init__.py").is_file() and str(_TRAINER) not in sys.path:
    sys.path.insert(0, str(_TRAINER))  # a source checkout: use the helper next to this file

from spotorch_trainer import Run, join, write_bytes  # noqa: E402

log = logging.getLogger("unhealthy")

MODES = ("hang", "diverge", "oom", "healthy")

# Option -> (type, default, help); the EXAMPLE_* variable is the upper-cased name.
_OPTIONS: Mapping[str, tuple[type, object, str]] = {
    "mode": (str, "healthy", f"how to misbehave: {', '.join(MODES)}"),
    "total_steps": (int, 200, "steps in all"),
    "step_sleep": (float, 0.02, "seconds per step"),
    "checkpoint_every": (int, 20, "checkpoint every N steps"),
    "progress_interval": (float, 0.5, "seconds between progress reports"),
    "bad_attempts": (int, 1, "misbehave on attempts numbered up to this"),
    "hang_at_step": (int, 30, "hang: block for good at this step"),
    "diverge_at_step": (int, 30, "diverge: the loss starts to explode at this step"),
    "blowup": (float, 1e40, "diverge: factor the loss grows by per step"),
    "oom_at_step": (int, 10, "oom: allocate at this step"),
    "alloc_mb": (int, 512, "oom: MiB to allocate"),
    "memory_limit_mb": (int, 0, "oom: RLIMIT_AS for this process (0: leave as is)"),
    "model_dir": (str, "", "where model.json goes (default $SPOTORCH_MODEL_URI)"),
    "verbose": (int, 0, "1: log every trainer event on stderr (no events topic: tests read them)"),
}


def parse(argv: list[str] | None = None,
          environ: Mapping[str, str] | None = None) -> argparse.Namespace:
    env = os.environ if environ is None else environ
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    for name, (kind, default, text) in _OPTIONS.items():
        raw = env.get(f"EXAMPLE_{name.upper()}", "")
        parser.add_argument(f"--{name.replace('_', '-')}", type=kind,
                            default=kind(raw) if raw else default, help=text)
    args = parser.parse_args(argv)
    if args.mode not in MODES:
        parser.error(f"--mode must be one of {', '.join(MODES)}")
    return args


def healthy_loss(step: int) -> float:
    return 1.0 / (1.0 + step / 20.0)


def diverged_loss(step: int, start: int, blowup: float) -> float:
    """Grows x blowup per step from `start`: overflows to inf, then inf - inf makes NaN."""
    value = healthy_loss(start)
    for _ in range(step - start):
        value *= blowup
    return value - value if math.isinf(value) and step - start > 12 else value


def limit_memory(megabytes: int) -> None:
    import resource

    limit = megabytes * 1024 * 1024
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def allocate(megabytes: int) -> bytearray:
    """Allocate and touch every page (an untouched allocation may never be backed)."""
    block = bytearray(megabytes * 1024 * 1024)
    for i in range(0, len(block), 4096):
        block[i] = 1
    return block


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    if args.verbose:
        logging.getLogger("spotorch_trainer").setLevel(logging.DEBUG)
    if args.memory_limit_mb:
        limit_memory(args.memory_limit_mb)
    held: list[bytearray] = []
    with Run(total_steps=args.total_steps, checkpoint_every=args.checkpoint_every,
             progress_interval_s=args.progress_interval) as run:
        bad = args.mode != "healthy" and run.env.attempt <= args.bad_attempts
        ckpt = run.restore()
        log.info("attempt %d, mode %s%s, from step %d", run.env.attempt, args.mode,
                 "" if bad else " (behaving)", ckpt.step if ckpt else 0)
        loss = healthy_loss(0)
        for step in run.steps():
            time.sleep(args.step_sleep)
            if bad and args.mode == "hang" and step >= args.hang_at_step:
                log.warning("hanging at step %d (the process stays alive)", step)
                threading.Event().wait()  # never set: a stuck collective
            if bad and args.mode == "oom" and step == args.oom_at_step:
                log.warning("allocating %d MiB at step %d", args.alloc_mb, step)
                held.append(allocate(args.alloc_mb))
            if bad and args.mode == "diverge" and step >= args.diverge_at_step:
                loss = diverged_loss(step, args.diverge_at_step, args.blowup)
            else:
                loss = healthy_loss(step)
            run.log_metrics(loss=loss)
            if run.checkpoint_due():
                run.checkpoint({"step": step, "loss": loss})
        model = {"steps": args.total_steps, "final_loss": loss, "attempt": run.env.attempt}
        write_bytes(join(args.model_dir or run.env.model_uri, "model.json"),
                    json.dumps(model).encode())
    return 0


if __name__ == "__main__":
    sys.exit(main())
