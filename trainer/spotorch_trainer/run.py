"""Run: the training loop's side of spotorch (resume, checkpoints, SIGTERM, events) in a few calls.

    with Run(total_steps=1000, checkpoint_every=100) as run:
        ckpt = run.restore()                      # latest complete checkpoint, or None
        state = ckpt.state if ckpt else fresh_state()
        for step in run.steps():                  # starts where the checkpoint left off
            state = train_one_step(state, step)
            if run.checkpoint_due():              # every 100 steps, and at once after SIGTERM
                run.checkpoint(state)
        write_model(state, run.env.model_uri)

On SIGTERM (Spot preemption) the loop finishes its current step, the body saves a final checkpoint,
"preempting" is reported and the process exits with contract.EXIT_PREEMPTED (143).

With several training replicas (run.cluster.distributed) a SIGTERM reaches one VM: the replicas
agree on the step to stop after by carrying run.stop_vote() in their step's all-reduce and
handing the sum to run.agree_stop(); only the chief writes checkpoints, and Run(agree_step=...)
makes every replica resume the chief's step (docs/trainer-guide.md, "Several replicas").
Carrying run.step_time_vote() in the same all-reduce and handing the sum to
run.agree_step_times() lets the chief report every replica's own step time, from which spotorch
tells a straggler (one slow VM holds the whole collective back).
"""

from __future__ import annotations

import json
import logging
import math
import pickle
import signal
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from types import FrameType, TracebackType
from typing import Any, NoReturn

from spotorch_trainer import contract
from spotorch_trainer.checkpoints import (
    STATE_FILE,
    CheckpointError,
    CheckpointRef,
    LoadedCheckpoint,
    latest_checkpoint,
    load_checkpoint,
    prune_checkpoints,
    write_checkpoint,
)
from spotorch_trainer.env import TrainerEnv
from spotorch_trainer.events import (
    LogReporter,
    Metrics,
    Reporter,
    Throttle,
    event_message,
    reporter_for,
)
from spotorch_trainer.probe import StepTimer
from spotorch_trainer.storage import Payload, Storage, join, storage_for

log = logging.getLogger("spotorch_trainer")


class Preempted(SystemExit):
    """Raised once a stop was requested (SIGTERM) and reported; exits the process with 143."""

    def __init__(self, step: int, checkpoint: CheckpointRef | None) -> None:
        super().__init__(contract.EXIT_PREEMPTED)
        self.step = step
        self.checkpoint = checkpoint


class ProbeDone(SystemExit):
    """Raised by steps() after a probe's steps, once its report is written: exits 0."""

    def __init__(self, step: int) -> None:
        super().__init__(0)
        self.step = step


# Exit code reported in a "failed" event for an exception that ends the run (first match wins).
_EXIT_CODES: tuple[tuple[type[BaseException], int], ...] = (
    (KeyboardInterrupt, 130),
    (BaseException, contract.EXIT_USER_ERROR),
)


def exit_code_of(exc: BaseException | None) -> int:
    """The process exit code an exception leads to (SystemExit carries its own)."""
    if exc is None:
        return 0
    if isinstance(exc, SystemExit):
        code = exc.code
        return code if isinstance(code, int) else (0 if code is None else contract.EXIT_USER_ERROR)
    return next(code for kind, code in _EXIT_CODES if isinstance(exc, kind))


def resume_point(env: TrainerEnv, storage: Storage | None = None) -> CheckpointRef | None:
    """Where to resume: the newer of the checkpoint spotorch named and the latest under the root.

    A worker restarted in place keeps its old SPOTORCH_RESUME_FROM while newer checkpoints exist.
    With SPOTORCH_RESUME_EXACT (after a divergence) only the named checkpoint counts: newer ones
    may hold the diverged state; none named, or unreadable, means a fresh start.
    """
    candidates: list[CheckpointRef] = []
    if env.resume_from:
        try:
            named = load_checkpoint(env.resume_from, storage=storage)
            candidates.append(CheckpointRef(named.step, named.uri))
        except (CheckpointError, OSError) as exc:
            log.warning("cannot resume from %s (%s); looking for the latest checkpoint instead",
                        env.resume_from, exc)
    if env.resume_exact:
        return candidates[0] if candidates else None
    latest = latest_checkpoint(env.checkpoint_uri, storage=storage)
    if latest is not None:
        candidates.append(latest)
    return max(candidates, default=None, key=lambda ref: ref.step)


class Run:
    """One attempt of a training run as the training code sees it."""

    def __init__(self, total_steps: int | None = None, *, checkpoint_every: int | None = None,
                 keep_last: int = 3, progress_interval_s: float = 10.0,
                 env: TrainerEnv | None = None, reporter: Reporter | None = None,
                 storage: Storage | None = None, handle_sigterm: bool = True,
                 clock: Callable[[], float] = time.time,
                 samples_per_step: int | None = None,
                 agree_step: Callable[[int], int] | None = None) -> None:
        """agree_step: with several replicas, a function that gives every replica rank 0's int
        (e.g. a torch.distributed broadcast from rank 0): they then resume the chief's step."""
        self.env = env if env is not None else TrainerEnv.from_env()
        self.cluster = self.env.cluster
        self._agree_step = agree_step
        self._sigterm_vote = False  # this replica got SIGTERM (carried in the collective)
        self._votes_carried = False  # the code calls stop_vote(): a SIGTERM only votes
        self._step_began: float | None = None  # when the current step's body began
        # Per rank: the sum of the replicas' own step times since the last progress report, and
        # over how many steps (agree_step_times); the chief reports their means.
        self._rank_times: list[float] = []
        self._rank_steps = 0
        self.total_steps = total_steps
        self.checkpoint_every = checkpoint_every
        self.keep_last = keep_last
        self._reporter = reporter if reporter is not None else reporter_for(self.env)
        if not self.env.chief:  # one voice per job: the other replicas stay quiet
            self._reporter = LogReporter()
        self._storage = storage
        self._handle_sigterm = handle_sigterm
        self._clock = clock
        self.progress_interval_s = progress_interval_s
        self._progress = Throttle(progress_interval_s)
        self._metrics: dict[str, float] = {}
        self._resumed: LoadedCheckpoint | None = None
        self._last_checkpoint: CheckpointRef | None = None
        self._previous_handler: Any = None
        self._handler_installed = False
        self._stop_requested = False
        self._stop_time: float | None = None
        self._started = False
        self._closed = False
        self._preempt_reported = False
        self._uses_due = False
        self.start_step = 0  # the step this attempt starts at (the resumed checkpoint's)
        self.step = 0  # steps completed so far
        self._current: int | None = None  # the step the loop body is running, if any
        # A probe (SPOTORCH_PROBE_STEPS): time the steps, report, stop cleanly after them.
        self._probe = StepTimer(samples_per_step) if self.env.probe_steps else None
        self._probe_reported = False
        self._reported_step: int | None = None  # step of the last progress event
        self._report_next = False  # report the next progress regardless of the rate limit

    # -- lifecycle -----------------------------------------------------------------------------

    def start(self) -> Run:
        """Find the checkpoint to resume from, catch SIGTERM, report "started"."""
        if self._started:
            return self
        self._started = True
        ref = self._agreed(resume_point(self.env, self._storage))
        if ref is not None:
            self._resumed = load_checkpoint(ref.uri, storage=self._storage)
            self._last_checkpoint = ref
            self.start_step = self.step = ref.step
            log.info("resuming from %s (step %d)", ref.uri, ref.step)
        if self._handle_sigterm:
            self._install_handler()
        self._report(contract.EVENT_STARTED, step=self.start_step,
                     checkpoint_uri=ref.uri if ref else None,
                     report_interval_s=self.progress_interval_s)
        return self

    def _agreed(self, ref: CheckpointRef | None) -> CheckpointRef | None:
        """The chief's resume point on every replica (no resume anywhere when it has none)."""
        if self._agree_step is None or not self.cluster.distributed:
            return ref
        step = self._agree_step(ref.step if ref is not None else -1)
        if step < 0:
            return None
        if ref is not None and ref.step == step:
            return ref
        return CheckpointRef(step, contract.checkpoint_uri(self.env.checkpoint_uri, step))

    def close(self, exc: BaseException | None = None) -> None:
        """Report how the attempt ended ("completed" or "failed"), restore SIGTERM's handler."""
        if self._closed:
            return
        self._closed = True
        try:
            code = exit_code_of(exc)
            if isinstance(exc, Preempted) and self._preempt_reported:
                pass
            elif code == 0:
                self._report(contract.EVENT_COMPLETED, step=self.step, wait=True,
                             checkpoint_uri=self._checkpoint_uri())
            else:
                self._report(contract.EVENT_FAILED, step=self.step, exit_code=code, wait=True)
            self._reporter.flush()
        except Exception as err:  # reporting is best effort, even at the end
            log.warning("could not flush trainer events: %s", err)
        finally:
            self._restore_handler()

    def __enter__(self) -> Run:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self._probe is not None and exc is not None and not isinstance(exc, ProbeDone):
            self._write_probe_report(exc)  # out of memory or a crash: the candidate is unfit
        if self._stop_requested and isinstance(exc, Exception):
            # Whatever broke after SIGTERM (a cut network, a killed child) is the preemption's
            # doing, not a bug: exit as preempted so spotorch resumes instead of counting an error.
            log.error("error after SIGTERM, exiting as preempted: %r", exc)
            try:
                self._report_preempting()
            finally:
                preempted = Preempted(self.step, self._last_checkpoint)
                self.close(preempted)
            raise preempted from exc
        self.close(exc)

    # -- the loop ------------------------------------------------------------------------------

    def restore(self) -> LoadedCheckpoint | None:
        """The checkpoint this attempt resumes from (its files are read on demand), or None."""
        self.start()
        return self._resumed

    def steps(self, total: int | None = None, *, start: int | None = None) -> Iterator[int]:
        """Yield step numbers from the resume point to total-1; stop cleanly after SIGTERM.

        After SIGTERM the step in progress finishes; if the body then did not checkpoint (the
        signal came after its checkpoint_due() check) it gets one more step to do so.
        """
        self.start()
        if total is not None:
            self.total_steps = total
        if self.total_steps is None:
            raise ValueError("steps() needs total_steps (here or in Run(...))")
        first = self.start_step if start is None else start
        self.step = first
        if self._stop_requested:
            self._preempt()
        extra_step_given = False
        stop_at = self.total_steps
        if self._probe is not None and self.env.probe_steps:
            stop_at = min(stop_at, first + self.env.probe_steps)
        for i in range(first, stop_at):
            self._current = i
            began = self._step_began = time.monotonic()
            try:
                yield i
            finally:
                self._current = None
            if self._probe is not None:
                self._probe.record(time.monotonic() - began)
            self.step = i + 1
            self.report_progress()
            if self._stop_requested:
                last = self._last_checkpoint
                saved = last is not None and last.step >= self.step
                if saved or not self._uses_due or extra_step_given:
                    self._preempt()
                extra_step_given = True
        if self._probe is not None:
            self._write_probe_report(None)
            log.info("probe done after %d steps", self._probe.steps)
            raise ProbeDone(self.step)

    def should_stop(self) -> bool:
        """True once SIGTERM (or request_stop) arrived: save and leave within the grace period."""
        return self._stop_requested

    def checkpoint_due(self) -> bool:
        """True when the body should checkpoint now: every checkpoint_every steps, or stopping."""
        self._uses_due = True
        if self._stop_requested:
            return True
        if not self.checkpoint_every or self._current is None:
            return False
        return (self._current + 1) % self.checkpoint_every == 0

    def checkpoint(self, state: Any = None, *, files: Mapping[str, Payload] | None = None,
                   step: int | None = None) -> CheckpointRef:
        """Write a checkpoint (state is pickled to state.pkl; files are extra bytes or local files).

        Inside `for step in run.steps()` the default step is step + 1: the body has done its step,
        and a resumed attempt starts after it. Elsewhere it is the number of completed steps.
        On a replica other than the chief nothing is written (the chief writes the same state).
        """
        self.start()
        if step is None:
            step = self._current + 1 if self._current is not None else self.step
        if not self.env.chief:  # the chief writes the same state for this step
            ref = CheckpointRef(step, contract.checkpoint_uri(self.env.checkpoint_uri, step))
            self._last_checkpoint = ref
            return ref
        payload: dict[str, Payload] = dict(files or {})
        if state is not None:
            payload[STATE_FILE] = pickle.dumps(state, protocol=pickle.HIGHEST_PROTOCOL)
        began = time.monotonic()
        ref = write_checkpoint(self.env.checkpoint_uri, step, payload, storage=self._storage,
                               clock=self._clock)
        self._last_checkpoint = ref
        took = time.monotonic() - began
        if self._stop_time is not None:
            log.warning("final checkpoint %s written %.1fs after SIGTERM (%.1fs to write)",
                        ref.uri, time.monotonic() - self._stop_time, took)
        else:
            log.info("checkpoint %s (%.2fs)", ref.uri, took)
        self._report(contract.EVENT_CHECKPOINT, step=step, checkpoint_uri=ref.uri,
                     wait=self._stop_requested, checkpoint_s=took)
        if not self._stop_requested:  # no housekeeping inside the grace period
            try:
                prune_checkpoints(self.env.checkpoint_uri, self.keep_last, storage=self._storage)
            except Exception as exc:  # old checkpoints left behind cost storage, not correctness
                log.warning("could not prune old checkpoints: %s", exc)
        return ref

    def log_metrics(self, **metrics: float) -> None:
        """Remember the latest metrics; they ride on the next progress and the completed event.

        A metric that turns NaN or infinite is reported at once (not at the next progress
        interval): spotorch's divergence rules stop paying for a run that cannot recover.
        """
        was_bad = {k for k, v in self._metrics.items() if not math.isfinite(v)}
        self._metrics.update({k: float(v) for k, v in metrics.items()})
        if any(not math.isfinite(self._metrics[k]) and k not in was_bad for k in metrics):
            self.report_progress(force=True)

    def report_progress(self, step: int | None = None, *, force: bool = False) -> None:
        """Report progress now if the rate limit allows (steps() calls this after each step)."""
        if step is not None:
            self.step = step
        if force and self.step == self._reported_step:
            # The event id names the step: a second progress event for it would be taken for
            # a redelivery. The next step's report goes out at once instead.
            self._report_next = True
            return
        if force or self._report_next or self._progress.ready():
            log.info("step %d/%s %s", self.step, self.total_steps,
                     " ".join(f"{k}={v:.4g}" for k, v in self._metrics.items()))
            self._report_next = False
            self._reported_step = self.step
            self._report(contract.EVENT_PROGRESS, step=self.step,
                         replica_step_s=self._take_rank_times())

    def request_stop(self) -> None:
        """Do what SIGTERM does: ask the loop to checkpoint and stop."""
        if not self._stop_requested:
            self._stop_time = time.monotonic()
        self._stop_requested = True

    def stop_vote(self) -> float:
        """1.0 if this replica got SIGTERM, else 0.0: add it to the step's all-reduce and pass
        the sum to agree_stop(), so that every replica stops after the same step. Once it is
        called, a SIGTERM only votes (stopping alone would leave the others in a collective)."""
        self._votes_carried = True
        return 1.0 if self._sigterm_vote or self._stop_requested else 0.0

    def agree_stop(self, votes: float) -> bool:
        """Stop after this step on every replica when any voted (votes: the all-reduced sum)."""
        if votes > 0:
            self.request_stop()
        return self._stop_requested

    def step_time_vote(self) -> list[float]:
        """This replica's time in the current step so far, at its rank's place in a list of
        world_size zeros: add it to the step's all-reduce (before the collective, so waiting for
        the others is not counted) and pass the sum to agree_step_times()."""
        times = [0.0] * max(self.cluster.world_size, 1)
        if self._step_began is not None and self.cluster.trainer:
            times[self.cluster.rank] = max(time.monotonic() - self._step_began, 0.0)
        return times

    def agree_step_times(self, times: Sequence[float]) -> None:
        """Every replica's own step time (the all-reduced step_time_vote()s): the chief's next
        progress report carries their means since the last one (replica_step_s)."""
        values = [float(t) for t in times]
        if len(self._rank_times) != len(values):
            self._rank_times, self._rank_steps = [0.0] * len(values), 0
        self._rank_times = [a + b for a, b in zip(self._rank_times, values, strict=True)]
        self._rank_steps += 1

    def _take_rank_times(self) -> list[float] | None:
        if self._rank_steps == 0 or len(self._rank_times) < 2:
            return None
        means = [t / self._rank_steps for t in self._rank_times]
        self._rank_times, self._rank_steps = [0.0] * len(means), 0
        return means

    def exit_preempted(self) -> NoReturn:
        """Report "preempting" and raise Preempted (exit 143): for loops that don't use steps()."""
        self._preempt()

    @property
    def last_checkpoint(self) -> CheckpointRef | None:
        """The newest complete checkpoint this attempt knows of (written or resumed from)."""
        return self._last_checkpoint

    # -- internals -----------------------------------------------------------------------------

    def _write_probe_report(self, error: BaseException | None) -> None:
        if self._probe is None or self._probe_reported or not self.env.chief:
            return
        self._probe_reported = True
        report = dict(self._probe.report(self._clock(), error))
        uri = join(self.env.checkpoint_uri, contract.PROBE_REPORT)
        try:
            (self._storage or storage_for(uri)).write(uri, json.dumps(report).encode())
            log.info("probe report %s: %s", uri, report)
        except Exception as exc:  # spotorch then sees a probe without a report: unfit, with why
            log.error("could not write the probe report %s: %s", uri, exc)

    def _checkpoint_uri(self) -> str | None:
        return self._last_checkpoint.uri if self._last_checkpoint else None

    def _report_preempting(self) -> None:
        if self._preempt_reported:
            return
        self._preempt_reported = True
        if self._last_checkpoint is not None:
            self.step = max(self.step, self._last_checkpoint.step)
        log.warning("preempted at step %d; resume from %s", self.step, self._checkpoint_uri())
        self._report(contract.EVENT_PREEMPTING, step=self.step,
                     checkpoint_uri=self._checkpoint_uri(), exit_code=contract.EXIT_PREEMPTED,
                     wait=True)

    def _preempt(self) -> NoReturn:
        self._report_preempting()
        raise Preempted(self.step, self._last_checkpoint)

    def _report(self, kind: str, *, step: int | None, checkpoint_uri: str | None = None,
                exit_code: int | None = None, wait: bool = False,
                report_interval_s: float | None = None,
                checkpoint_s: float | None = None,
                replica_step_s: Sequence[float] | None = None) -> None:
        try:
            data, attributes = event_message(
                self.env, kind, now=self._clock(), step=step, total_steps=self.total_steps,
                metrics=self._metrics_snapshot(), checkpoint_uri=checkpoint_uri,
                exit_code=exit_code, report_interval_s=report_interval_s,
                checkpoint_s=checkpoint_s, replica_step_s=replica_step_s)
            self._reporter.send(data, attributes, wait=wait)
        except Exception as exc:  # reporting is best effort: training must go on
            log.warning("could not report %s: %s", kind, exc)

    def _metrics_snapshot(self) -> Metrics:
        return dict(self._metrics)

    def _on_sigterm(self, signum: int, frame: FrameType | None) -> None:
        # Runs between bytecodes of the main thread: only set flags here; the loop does the work.
        if self.cluster.distributed and self._votes_carried:
            self._sigterm_vote = True  # the next all-reduce tells every replica
            self._stop_time = time.monotonic()
            log.warning("SIGTERM: voting to stop in the next step's all-reduce")
            return
        self.request_stop()

    def _install_handler(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            log.warning("Run started outside the main thread: SIGTERM is not handled")
            return
        self._previous_handler = signal.signal(signal.SIGTERM, self._on_sigterm)
        self._handler_installed = True

    def _restore_handler(self) -> None:
        if self._handler_installed:
            previous = self._previous_handler
            # None: the old handler was not set from Python; the default is the closest match.
            signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)
            self._handler_installed = False
