"""What a message must be to be believed: signed by its attempt, plausible, about its own run."""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass

from spotorch.core.model import Run
from spotorch.core.observations import TrainerReported
from spotorch_trainer import contract

# ---------------------------------------------------------------- signed reports
#
# Every attempt gets its own random key (derived from the shell's random seed of the decision
# that launched it), stored with the attempt and handed to its job in the environment only. A
# trainer report proves it comes from the attempt's job by its HMAC over the message data
# (spotorch_trainer.contract: the format, versioned). Anything else that can publish to the
# trainer-events topic (every job of every pipeline: one training identity) cannot sign for an
# attempt whose environment it cannot read.


def attempt_key(seed: bytes, run_id: str, number: int) -> str:
    """The key of attempt `number` of a run, from the launching decision's random seed;
    "" without a seed (the attempt then accepts no report)."""
    if not seed:
        return ""
    return hmac.new(seed, f"{run_id}/{number}".encode(), hashlib.sha256).hexdigest()


@dataclass(frozen=True)
class SignedMessage:
    """What proves where a trainer report came from: its exact data and two attributes."""

    data: bytes
    signature: str  # ATTR_SIGNATURE; "" when absent
    attempt: str  # ATTR_ATTEMPT; "" when absent


def unproven(run: Run, report: TrainerReported, message: SignedMessage) -> str | None:
    """Why a signed message does not prove it comes from the attempt it reports on; None when
    it does (the signature matches that attempt's key)."""
    number = report.attempt
    if message.attempt != str(number):
        return (f"the message's attempt attribute {message.attempt[:20]!r} is not the attempt "
                f"{number} it reports on")
    attempt = run.attempt(number)
    if attempt is None:
        return f"run {run.run_id} has no attempt {number}"
    if not message.signature:
        return f"unsigned report for attempt {number} (spotorch_trainer signs with " \
               f"{contract.ENV_REPORT_KEY})"
    if not attempt.report_key:
        return f"attempt {number} has no report key (launched before signed reports)"
    problem = contract.signature_problem(attempt.report_key, message.data, message.signature)
    if problem is None:
        return None
    other = next((a.number for a in run.attempts if a.number != number and a.report_key
                  and contract.signature_problem(a.report_key, message.data,
                                                 message.signature) is None), None)
    if other is not None:
        return f"signed with attempt {other}'s key, reports on attempt {number}"
    return f"{problem} (attempt {number}'s key)"


# ---------------------------------------------------------------- checkpoints

def checkpoint_outside(run: Run, uri: str, step: int) -> str | None:
    """Why a checkpoint a report of `step` names is not one of the run's own; None when it is.

    It must be exactly {the run's checkpoint root}/step-{N:010d} (trailing '/' aside) for an N
    at most the reported step (`completed` and `preempting` name the last checkpoint): no other
    bucket, no other run's prefix, no '.' or '..' or empty path segment. Whether it exists
    complete at N is the shell's to check (CheckpointStore.complete_step)."""
    root = run.checkpoint_uri.rstrip("/")
    given = uri.rstrip("/")
    scheme, sep, path = given.partition("://")
    root_scheme = root.partition("://")[0] if "://" in root else ""
    if (scheme if sep else "") != root_scheme:  # e.g. file:// (a local disk) for a gs:// root
        where = f"a {scheme}:// URI" if sep else "a path with no scheme"
        return (f"checkpoint URI {uri[:200]!r} is {where}; the run's checkpoints are under "
                f"{root!r} (a checkpoint must be written there, where the next attempt can "
                "read it)")
    segments = (path if sep else given).removeprefix("/").split("/")  # file:///x: one '/'
    if any(s in ("", ".", "..") for s in segments) or "\\" in given:
        return f"checkpoint URI {uri[:200]!r} has an empty, '.' or '..' segment"
    if not given.startswith(root + "/"):
        return f"checkpoint {uri[:200]!r} is not under the run's checkpoint root {root!r}"
    named = contract.parse_checkpoint_step(given)
    if named is None or given != contract.checkpoint_uri(root, named):
        return (f"checkpoint {uri[:200]!r} is not a checkpoint directory of the run "
                f"({contract.checkpoint_uri(root, step)} for step {step})")
    if named > step:
        return f"checkpoint of step {named} is newer than the report's step {step}"
    return None


# ---------------------------------------------------------------- plausibility

# No optimizer step is this fast: a report implying more steps per second is not true.
MAX_STEPS_PER_S = 100_000.0
MAX_STEP = 2 ** 53  # beyond this a step is no longer an exact number anywhere on its way
MAX_CLOCK_AHEAD_S = 300.0  # a report dated further in the future than this is not true


def implausible(run: Run, report: TrainerReported, now: float | None = None) -> str | None:
    """Why a trainer report cannot be true of this run, or None when it may be.

    Progress only moves within what the run can have done: never past total_steps, never
    faster than MAX_STEPS_PER_S since the last thing known (a report, a checkpoint, the resume
    step of the attempt), never from the future. A rejected report changes nothing, so one bad
    report cannot set the run's progress (or its measured rate) for good.
    """
    if now is not None and report.at > now + MAX_CLOCK_AHEAD_S:
        return f"the report is dated {report.at - now:.0f}s in the future"
    step = report.step
    if step is None:
        return None
    if step < 0 or step > MAX_STEP:
        return f"step {step} is out of range [0, {MAX_STEP}]"
    total = report.total_steps or run.progress.total_steps
    if total is not None and step > total:
        return f"step {step} is past total_steps {total}"
    attempt = run.attempt(report.attempt)
    known = max(run.progress.step,
                run.latest_checkpoint.step if run.latest_checkpoint else 0,
                (attempt.resumed_from_step or 0) if attempt else 0)
    since = run.progress.at if run.progress.at is not None and run.progress.step >= known \
        else (attempt.created_at if attempt else run.created_at)
    at = min(report.at, now) if now is not None else report.at
    if step - known > MAX_STEPS_PER_S * max(at - since, 1.0):
        return (f"step {step} jumps {step - known} steps from {known} in {max(at - since, 0):.0f}s"
                f" (more than {MAX_STEPS_PER_S:.0f} steps per second)")
    return None


def rate_sample(steps: int, seconds: float) -> float | None:
    """A step-rate sample from two reports, or None when it is not plausible (the rate
    estimate, which the escalation policy's work estimate divides by, never takes it)."""
    if steps <= 0 or seconds <= 0.0:
        return None
    rate = steps / seconds
    return rate if rate <= MAX_STEPS_PER_S else None
