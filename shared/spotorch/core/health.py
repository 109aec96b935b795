"""Training health: the pipeline's `health:` options and the pure rules that read a run's signals.

Nothing here does I/O or imports the rest of spotorch but the file-format annotations
(spotorch.spec.fileformat: HealthPolicy is part of the pipeline format's one definition; pipeline.py
imports it, the domain imports the rules): every rule is a pure function of numbers.
spotorch.core.training_health wires them into `decide`.
"""

from __future__ import annotations

import functools
import itertools
import math
import re
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Annotated

from spotorch.core.fields import Duration, Field, FileSection


class DivergenceAction(StrEnum):
    """What a divergence rule does when it fires."""

    FAIL = "fail"  # stop the run: FAILED_DIVERGED
    RELAUNCH = "relaunch"  # relaunch from the last checkpoint before the divergence (own budget)


class MetricMode(StrEnum):
    """Which way a metric gets better."""

    MIN = "min"
    MAX = "max"


# What out of memory looks like in a job's error. Exit 137 (SIGKILL) alone is not enough: the
# grace-period kill after a preemption's SIGTERM is 137 too; the kernel's OOM killer and
# Kubernetes-style reports say so, and so do CUDA, XLA/TPU and Python's own errors.
OOM_PATTERNS: tuple[str, ...] = (
    r"(?i)\bout of memory\b",  # kernel "Out of memory: Killed process", CUDA, XLA
    r"(?i)\boom[-_ ]?kill",  # oom-kill, oom_kill, OOMKilled
    r"(?i)\bOOMKilled\b",
    r"(?i)memory cgroup out of memory",
    r"(?i)\bMemoryError\b",  # Python
    r"(?i)cannot allocate memory",  # ENOMEM
    r"(?i)cuda(?:Error)?MemoryAllocation|CUDA_ERROR_OUT_OF_MEMORY|OutOfMemoryError",
    r"(?i)RESOURCE_EXHAUSTED:?\s*(?:XLA:?\s*)?Out of memory",  # XLA
    r"(?i)ran out of memory in memory space (?:hbm|vmem)",  # TPU
    r"(?i)\bOOM when allocating tensor\b",  # TensorFlow
    r"(?i)\bOOM\b",  # a probe's or a framework's bare "OOM"
    r"(?i)resource_?exhausted:.*(?:memory|hbm|allocat)",  # an allocator's RESOURCE_EXHAUSTED
)


@functools.lru_cache(maxsize=256)
def compiled(patterns: tuple[str, ...]) -> tuple[re.Pattern[str], ...]:
    """A pattern list compiled once per process (a pipeline's lists are validated at load)."""
    return tuple(re.compile(p) for p in patterns)


def is_out_of_memory(message: str, patterns: Sequence[str] = OOM_PATTERNS) -> bool:
    """Whether an error message says out of memory (the one list: a pipeline's oom_patterns)."""
    return any(p.search(message or "") for p in compiled(tuple(patterns)))


@dataclass(frozen=True)
class HealthPolicy(FileSection):
    """A pipeline's training-health options (YAML `health:`); every rule can be switched off."""

    # --- hung jobs (only for runs whose code reports through spotorch_trainer) ---
    # No trainer report for this long while RUNNING: cancel, relaunch from the latest checkpoint.
    # None: derived, max(hang_factor x the trainer's report interval, hang_factor x the longest
    # gap between two reports seen in this run, hang_min_s); a trainer that does not say its
    # report interval (older spotorch_trainer) is then not watched.
    hang_after_s: Annotated[float | None, Duration(), Field(validation_alias="hang_after")] = None
    hang_factor: float = 10.0  # multiple of the report interval / longest gap (derived default)
    # the derived hang_after is never shorter than this
    hang_min_s: Annotated[float, Duration(), Field(validation_alias="hang_min")] = 120.0
    # Until an attempt reports its first step (data loading, compilation, restore), silence is
    # allowed for at least this long.
    hang_startup_s: Annotated[float, Duration(), Field(validation_alias="hang_startup")] = 1800.0
    max_hangs: int = 2  # budget of the failure class `hung`; beyond it the run ends FAILED_HUNG
    # --- step-rate collapse ---
    # Warn when the step rate falls below this fraction of the run's own median; None: off.
    step_rate_fraction: float | None = 0.5
    step_rate_window: int = 20  # rate samples the median is taken over
    step_rate_min_samples: int = 5  # no verdict before this many samples
    step_rate_for: int = 3  # samples in a row below the threshold before the rule fires
    step_rate_relaunch: bool = False  # besides the warning, cancel and relaunch (class `hung`)
    # --- stragglers (several training replicas whose chief reports each one's step time) ---
    # Warn when one replica's own step time stays above this multiple of the others' median (a
    # slow VM holds every step of a synchronous collective back); None: off.
    straggler_factor: float | None = 1.5
    straggler_for: int = 3  # reports in a row naming the same replica before the rule fires
    # a difference smaller than this (seconds per step) is timer noise, never a straggler
    straggler_min_s: Annotated[float, Duration(), Field(validation_alias="straggler_min")] = 0.005
    straggler_relaunch: bool = False  # besides the warning, relaunch on new VMs (class `hung`)
    # --- divergence (over the metric named loss_metric) ---
    loss_metric: str = "loss"
    divergence_action: DivergenceAction = DivergenceAction.FAIL
    max_divergences: int = 1  # relaunches after a divergence; beyond it: FAILED_DIVERGED
    nonfinite_loss: bool = True  # a NaN or infinite loss is a divergence
    loss_spike_factor: float | None = 10.0  # loss above k x its best (best > 0)...; None: off
    loss_spike_for: int = 3  # ...for this many reports in a row
    loss_plateau_steps: int | None = None  # no new best for this many steps; None: off
    loss_plateau_min_delta: float = 0.0  # an improvement smaller than this is not a new best
    # --- stale checkpoints ---
    # RUNNING with no newer checkpoint for this long: warning; None: off.
    checkpoint_stale_after_s: Annotated[float | None, Duration(), Field(
        validation_alias="checkpoint_stale_after")] = 3600.0
    # --- out of memory ---
    # Machine types to move to after an out-of-memory failure, smallest first. The next attempt
    # takes the first one larger than the current machine (the next in the list); none left, or
    # none listed: the run fails FAILED_OUT_OF_MEMORY.
    fallback_machines: tuple[str, ...] = ()
    # A failed job's error matching one of these is out of memory (spotorch.core.recovery
    # classifies a failed job, spotorch.core.hardware a failed probe, both with these).
    oom_patterns: tuple[str, ...] = field(default_factory=lambda: OOM_PATTERNS)
    # --- checkpoint retention (spotorch deletes from the checkpoint root) ---
    keep_last: int | None = None  # keep the newest K complete checkpoints; None: spotorch deletes none
    keep_best_metric: str | None = None  # also keep the best checkpoint by this metric
    keep_best_mode: MetricMode = MetricMode.MIN
    prune_on_end: bool = True  # when the run ends, prune down to keep_last_on_end (+ best)
    keep_last_on_end: int = 1

    def problems(self) -> list[tuple[str, str]]:
        """(field, what is wrong) for values no rule can work with; empty when all are usable."""
        checks: Sequence[tuple[str, bool, str]] = (
            ("hang_after", self.hang_after_s is None or self.hang_after_s > 0, "must be > 0"),
            ("hang_factor", self.hang_factor >= 1, "must be >= 1"),
            ("hang_startup", self.hang_startup_s >= 0, "must be >= 0"),
            ("max_hangs", self.max_hangs >= 0, "must be >= 0"),
            ("step_rate_fraction", self.step_rate_fraction is None
             or 0 < self.step_rate_fraction < 1, "must be in (0, 1)"),
            ("step_rate_window", self.step_rate_window >= self.step_rate_min_samples >= 1,
             "must be >= step_rate_min_samples >= 1"),
            ("step_rate_for", self.step_rate_for >= 1, "must be >= 1"),
            ("straggler_factor", self.straggler_factor is None or self.straggler_factor > 1,
             "must be > 1"),
            ("straggler_for", self.straggler_for >= 1, "must be >= 1"),
            ("straggler_min", self.straggler_min_s >= 0, "must be >= 0"),
            ("max_divergences", self.max_divergences >= 0, "must be >= 0"),
            ("loss_spike_factor", self.loss_spike_factor is None or self.loss_spike_factor > 1,
             "must be > 1"),
            ("loss_spike_for", self.loss_spike_for >= 1, "must be >= 1"),
            ("loss_plateau_steps", self.loss_plateau_steps is None or self.loss_plateau_steps > 0,
             "must be > 0"),
            ("checkpoint_stale_after", self.checkpoint_stale_after_s is None
             or self.checkpoint_stale_after_s > 0, "must be > 0"),
            ("fallback_machines", len(set(self.fallback_machines)) == len(self.fallback_machines),
             "must not repeat a machine type"),
            ("keep_last", self.keep_last is None or self.keep_last >= 1, "must be >= 1"),
            ("keep_last_on_end", self.keep_last_on_end >= 1, "must be >= 1"),
        )
        return [(name, why) for name, ok, why in checks if not ok]


# ---------------------------------------------------------------- what a rule found

class Rule(StrEnum):
    """The health rules; the value is what history, events and alerts call it."""

    HUNG = "hung"
    STEP_RATE_COLLAPSE = "step_rate_collapse"
    NONFINITE_LOSS = "nonfinite_loss"
    LOSS_SPIKE = "loss_spike"
    LOSS_PLATEAU = "loss_plateau"
    STALE_CHECKPOINT = "stale_checkpoint"
    STRAGGLER = "straggler"


@dataclass(frozen=True)
class Finding:
    """A rule fired: which, at which step, with which values, in words."""

    rule: Rule
    step: int | None
    message: str
    values: Mapping[str, float | None] = field(default_factory=dict)
    # The last step known healthy: a relaunch resumes from a checkpoint at or before it.
    good_until_step: int | None = None


# ---------------------------------------------------------------- hung jobs

def hang_after_s(policy: HealthPolicy, report_interval_s: float | None,
                 longest_gap_s: float, *, starting: bool = False) -> float | None:
    """How long a RUNNING attempt may stay silent (None: not watched).

    The pipeline's value, or derived from the trainer's report interval and the longest gap
    seen; while the attempt has not reported its first step, at least hang_startup_s.
    """
    limit = policy.hang_after_s
    if limit is None:
        if not report_interval_s or report_interval_s <= 0:
            return None  # nothing to derive it from
        limit = max(policy.hang_factor * report_interval_s,
                    policy.hang_factor * max(longest_gap_s, 0.0), policy.hang_min_s)
    return max(limit, policy.hang_startup_s) if starting else limit


def hung(policy: HealthPolicy, *, silent_s: float, report_interval_s: float | None,
         longest_gap_s: float, step: int | None, starting: bool = False) -> Finding | None:
    """The hang rule: silent for longer than hang_after."""
    limit = hang_after_s(policy, report_interval_s, longest_gap_s, starting=starting)
    if limit is None or silent_s <= limit:
        return None
    return Finding(Rule.HUNG, step, f"no trainer report for {silent_s:.0f}s (hang_after "
                   f"{limit:.0f}s)", {"silent_s": round(silent_s, 3), "hang_after_s": limit},
                   good_until_step=step)


# ---------------------------------------------------------------- step-rate collapse

@dataclass(frozen=True)
class RateState:
    """Recent step-rate samples of a run and how many in a row were slow."""

    samples: tuple[float, ...] = ()
    slow: int = 0
    warned: bool = False  # the current collapse was reported; cleared when the rate recovers


def rate_sample(policy: HealthPolicy, state: RateState, rate: float,
                step: int | None) -> tuple[RateState, Finding | None]:
    """Add one step-rate sample; a Finding the first time it stays below the threshold.

    The median is over the samples before this one (a collapse must not drag its own baseline
    down); slow samples are kept out of the baseline too.
    """
    fraction = policy.step_rate_fraction
    if not math.isfinite(rate) or rate < 0:
        return state, None
    history = state.samples
    enough = len(history) >= policy.step_rate_min_samples
    median = statistics.median(history) if history else 0.0
    slow = fraction is not None and enough and median > 0 and rate < fraction * median
    if not slow:
        samples = (*history, rate)[-policy.step_rate_window:]
        return RateState(samples, 0, False), None
    state = replace(state, slow=state.slow + 1)
    if state.slow < policy.step_rate_for or state.warned:
        return state, None
    assert fraction is not None
    finding = Finding(Rule.STEP_RATE_COLLAPSE, step,
                      f"step rate {rate:.3g}/s below {fraction:g} x the run's median "
                      f"{median:.3g}/s for {state.slow} reports",
                      {"rate": rate, "median": median, "fraction": fraction},
                      good_until_step=step)
    return replace(state, warned=True), finding


# ---------------------------------------------------------------- stragglers

@dataclass(frozen=True)
class StragglerState:
    """The replica (by rank) that was slowest in the last reports, how many in a row, and
    whether the rule has told of it; cleared when no replica stands out."""

    rank: int | None = None
    streak: int = 0
    warned: bool = False


def straggler_sample(policy: HealthPolicy, state: StragglerState, step_s: Sequence[float],
                     step: int | None) -> tuple[StragglerState, Finding | None]:
    """Add one report's per-rank step times; a Finding the first time one replica stays above
    straggler_factor x the others' median for straggler_for reports in a row."""
    factor = policy.straggler_factor
    if factor is None or len(step_s) < 2 or not all(math.isfinite(t) and t >= 0 for t in step_s):
        return state, None
    rank = max(range(len(step_s)), key=lambda r: step_s[r])
    slowest = step_s[rank]
    median = statistics.median(t for r, t in enumerate(step_s) if r != rank)
    if not (slowest > factor * median and slowest - median >= policy.straggler_min_s):
        return StragglerState(), None
    same = state.rank == rank
    state = StragglerState(rank, state.streak + 1 if same else 1, state.warned and same)
    if state.streak < policy.straggler_for or state.warned:
        return state, None
    ratio = slowest / median if median > 0 else math.inf
    finding = Finding(Rule.STRAGGLER, step,
                      f"replica rank {rank} took {slowest:.3g}s per step, {ratio:.3g} x the "
                      f"others' median {median:.3g}s, for {state.streak} reports",
                      {"rank": float(rank), "step_s": slowest, "median_s": median,
                       "factor": factor}, good_until_step=step)
    return replace(state, warned=True), finding


# ---------------------------------------------------------------- divergence

@dataclass(frozen=True)
class LossState:
    """The loss as the divergence rules track it."""

    best: float | None = None
    best_step: int | None = None
    last_good_step: int | None = None  # step of the last report no rule objected to
    spikes: int = 0  # reports in a row above k x best
    spike_from: int | None = None  # last good step before the current run of spikes


def loss_sample(policy: HealthPolicy, state: LossState, step: int,
                loss: float) -> tuple[LossState, Finding | None]:
    """Add one loss value (NaN and infinities included); a Finding when a divergence rule fires."""
    if not math.isfinite(loss):
        if not policy.nonfinite_loss:
            return state, None
        return state, Finding(Rule.NONFINITE_LOSS, step, f"{policy.loss_metric} is {loss} at "
                              f"step {step}", {"loss": None, "best": state.best},
                              good_until_step=state.last_good_step)
    improved = state.best is None or loss < state.best - policy.loss_plateau_min_delta
    if improved:
        return LossState(best=loss, best_step=step, last_good_step=step), None
    assert state.best is not None
    k = policy.loss_spike_factor
    if k is not None and state.best > 0 and loss > k * state.best:
        spike_from = state.spike_from if state.spikes else state.last_good_step
        state = replace(state, spikes=state.spikes + 1, spike_from=spike_from)
        if state.spikes >= policy.loss_spike_for:
            return state, Finding(
                Rule.LOSS_SPIKE, step,
                f"{policy.loss_metric} {loss:.4g} above {k:g} x its best {state.best:.4g} for "
                f"{state.spikes} reports (step {step})",
                {"loss": loss, "best": state.best, "factor": k}, good_until_step=spike_from)
        return state, None
    state = replace(state, spikes=0, spike_from=None, last_good_step=step)
    plateau = policy.loss_plateau_steps
    if plateau is not None and state.best_step is not None and step - state.best_step >= plateau:
        return state, Finding(
            Rule.LOSS_PLATEAU, step,
            f"{policy.loss_metric} has not improved on {state.best:.4g} (step {state.best_step}) "
            f"for {step - state.best_step} steps", {"loss": loss, "best": state.best,
                                                     "steps": float(step - state.best_step)},
            good_until_step=state.best_step)
    return state, None


def resume_point(checkpoints: Iterable[tuple[int, str]],
                 good_until_step: int | None) -> tuple[int, str] | None:
    """The newest checkpoint written at or before the last healthy step (None: start fresh)."""
    if good_until_step is None:
        return None
    safe = [c for c in checkpoints if c[0] <= good_until_step]
    return max(safe, default=None)


# ---------------------------------------------------------------- stale checkpoints

def stale_checkpoint(policy: HealthPolicy, *, since_s: float,
                     step: int | None) -> Finding | None:
    """RUNNING with no newer checkpoint for longer than checkpoint_stale_after."""
    limit = policy.checkpoint_stale_after_s
    if limit is None or since_s <= limit:
        return None
    return Finding(Rule.STALE_CHECKPOINT, step,
                   f"no new checkpoint for {since_s:.0f}s (checkpoint_stale_after {limit:.0f}s): "
                   f"a preemption now loses that much work",
                   {"since_s": round(since_s, 3), "stale_after_s": limit}, good_until_step=step)


def young_daly_interval_s(checkpoint_cost_s: float, mtbf_s: float) -> float:
    """The checkpoint interval that minimises expected lost work: sqrt(2 x cost x MTBF).

    Young (1974), first order; Daly (2006) shows it is the right first-order term as long as the
    checkpoint cost is small against the mean time between failures (here: preemptions).
    """
    if checkpoint_cost_s < 0 or mtbf_s <= 0:
        raise ValueError("checkpoint cost must be >= 0 and MTBF > 0")
    return math.sqrt(2.0 * checkpoint_cost_s * mtbf_s)


@dataclass(frozen=True)
class CheckpointAdvice:
    """The run's checkpoint interval against the Young/Daly optimum (what `spotorch show` prints)."""

    interval_s: float | None  # median time between this run's checkpoints
    checkpoint_cost_s: float | None  # median time to write one (the trainer measures it)
    mtbf_s: float | None  # Spot running time per preemption, over this run's attempts
    optimal_s: float | None  # sqrt(2 x cost x MTBF); None until cost and MTBF are known

    @property
    def verdict(self) -> str:
        """What to do about the checkpoint interval, in words for `spotorch show`."""
        if self.interval_s is None or self.optimal_s is None:
            return "not enough history"
        ratio = self.interval_s / self.optimal_s if self.optimal_s > 0 else math.inf
        if ratio > 2:
            return "checkpoint more often"
        if ratio < 0.5:
            return "checkpoint less often"
        return "close to optimal"


def checkpoint_advice(checkpoint_times: Sequence[float], checkpoint_costs: Sequence[float],
                      spot_run_s: float, preemptions: int) -> CheckpointAdvice:
    """Interval, cost, MTBF and the optimum from a run's own history (pure; `show` prints it)."""
    times = sorted(checkpoint_times)
    gaps = [b - a for a, b in itertools.pairwise(times) if b > a]
    interval = statistics.median(gaps) if gaps else None
    cost = statistics.median(checkpoint_costs) if checkpoint_costs else None
    mtbf = spot_run_s / preemptions if preemptions > 0 and spot_run_s > 0 else None
    optimal = young_daly_interval_s(cost, mtbf) if cost is not None and mtbf is not None else None
    return CheckpointAdvice(interval, cost, mtbf, optimal)


# ---------------------------------------------------------------- out of memory

def next_machine(policy: HealthPolicy, current: str) -> str | None:
    """The machine type after an out-of-memory failure on `current` (None: nothing larger listed).

    The list is ordered smallest first: a current machine in the list moves to the next entry;
    the pipeline's own machine (not in the list) moves to the first entry.
    """
    machines = policy.fallback_machines
    if current in machines:
        index = machines.index(current) + 1
        return machines[index] if index < len(machines) else None
    return machines[0] if machines else None


# ---------------------------------------------------------------- checkpoint retention

@dataclass(frozen=True)
class KnownCheckpoint:
    """A complete checkpoint the run was told of, with the metric it was written at."""

    step: int
    uri: str
    at: float
    metric: float | None = None  # value of keep_best_metric when it was written
    seconds: float | None = None  # how long the trainer took to write it


def best_step(checkpoints: Iterable[KnownCheckpoint], mode: MetricMode) -> int | None:
    """The step of the best checkpoint by its metric (ties: the newer one)."""
    scored = [c for c in checkpoints if c.metric is not None and math.isfinite(c.metric)]
    if not scored:
        return None
    sign = 1.0 if mode is MetricMode.MIN else -1.0
    return min(scored, key=lambda c: (sign * (c.metric or 0.0), -c.step)).step


def retention_doomed(listed: Iterable[tuple[int, bool]], keep_newest: int,
                     keep: Iterable[int]) -> tuple[int, ...]:
    """Of a listing of (step, complete): the steps a retention pass deletes.

    Kept: the newest keep_newest complete checkpoints (at least one) and every step in keep (the
    best by metric, resume points). Deleted: the other complete ones older than the newest kept
    one. Incomplete directories are never touched (one may be a write in progress).
    """
    complete = sorted({step for step, done in listed if done})
    kept = set(complete[-max(keep_newest, 1):]) | set(keep)
    return doomed_steps(listed, frozenset(kept)) if complete else ()


def diverged_steps(listed: Iterable[tuple[int, bool]], above: int) -> tuple[int, ...]:
    """Of a listing of (step, complete): the complete checkpoints written after step `above`."""
    return tuple(sorted(step for step, done in listed if done and step > above))


def doomed_steps(listed: Iterable[tuple[int, bool]], keep: frozenset[int]) -> tuple[int, ...]:
    """Of a listing of (step, complete), the checkpoints to delete under a keep set.

    Only complete ones, only older than the newest kept one (a newer complete checkpoint exists
    for each): an incomplete directory may be a write in progress, and anything newer than what
    the decision knew of is left for the next decision.
    """
    if not keep:
        return ()
    newest_kept = max(keep)
    return tuple(sorted(step for step, complete in listed
                        if complete and step < newest_kept and step not in keep))
