"""Resource quotas: a refusal that waiting never lifts moves the run elsewhere, or ends it.

Vertex refuses CreateCustomJob with RESOURCE_EXHAUSTED both for a request rate (gone within a
minute: retried) and for a resource quota such as
`aiplatform.googleapis.com/custom_model_training_nvidia_l4_gpus` in one region (never lifted by
waiting: only an operator's quota request raises it). The message tells them apart
(`recovery.quota_patterns`). A quota is per project, region and metric, and Spot jobs count
against the `..._preemptible_...` metrics, so on a refusal the run marks that region for that
capacity (the one region rule) and goes on: to another region, else to standard VMs (when the
pipeline escalates), else to the next hardware candidate, else it ends FAILED_QUOTA naming the
metric, the regions and where to ask for more. Each (shape, capacity, region) is refused at most
once: never the same refusal forever.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any
from urllib.parse import quote

from spotorch.core.context import Context
from spotorch.core.escalation import policy_capacity
from spotorch.core.launching import launch, on_launch_failed
from spotorch.core.model import Attempt, AttemptState, FailureClass, Run, RunStatus
from spotorch.core.moves import fail, note, publish, with_attempt
from spotorch.core.observations import LaunchFailed, Observation
from spotorch.core.pipeline import Capacity, EscalationKind
from spotorch.core.regions import AVOID_QUOTA, mark

_METRIC = re.compile(r"\b(?:aiplatform|compute)\.googleapis\.com/[A-Za-z0-9_]+")
# How long a refused (region, capacity) stays marked: far beyond any run, shorter than forever
# so the run document forgets it (a quota is raised by a person, not by time).
QUOTA_AVOID_S = 7 * 24 * 3600.0
QUOTA_CONSOLE = "https://console.cloud.google.com/iam-admin/quotas"
REFUSED_KEY = "quota_refused"  # in run.hardware: candidates refused by quota everywhere


def is_quota_refusal(message: str, patterns: Sequence[str]) -> bool:
    """Whether a RESOURCE_EXHAUSTED (or a failed job's) message is a resource quota's."""
    return any(re.search(p, message or "") for p in patterns)


def retry_is_futile(code: str, message: str,
                    patterns_of: Sequence[Sequence[str]]) -> bool:
    """Whether a call refused with (code, message) is refused the same way when retried at
    once: a resource quota's RESOURCE_EXHAUSTED by any of the given pattern lists (each
    pipeline's `recovery.quota_patterns`). The launcher's in-call retries ask this."""
    return code == "RESOURCE_EXHAUSTED" and any(is_quota_refusal(message, p) for p in patterns_of)


def quota_metrics(message: str) -> tuple[str, ...]:
    """The quota metrics a refusal names, in order, once each (none in the older wording)."""
    return tuple(dict.fromkeys(_METRIC.findall(message or "")))


def request_url(metric: str, region: str) -> str:
    """Where the project's owner asks for more of a metric in a region (Cloud console)."""
    return f"{QUOTA_CONSOLE}?metric={quote(metric, safe='')}&location={quote(region)}"


def _quota_blocked(run: Run, capacity: Capacity, now: float) -> set[str]:
    return {m.region for m in run.avoid_regions
            if m.why == AVOID_QUOTA and m.capacity is capacity and m.until > now}


def _next_shape(run: Run, ctx: Context, refused: str | None) -> str | None:
    """The best fit hardware candidate not refused by quota yet (hardware probing only)."""
    hardware: Mapping[str, Any] = run.hardware or {}
    done = {*hardware.get(REFUSED_KEY, ()), *([refused] if refused else [])}
    rows = [r for r in hardware.get("rows", ()) if isinstance(r, Mapping) and r.get("fit")
            and r.get("candidate") not in done]
    rows.sort(key=lambda r: (not r.get("meets_deadline", True),
                             float(r.get("spot_cost") or r.get("standard_cost") or 0.0)))
    return str(rows[0]["candidate"]) if rows else None


def on_quota(run: Run, ctx: Context, attempt: Attempt, message: str) -> Run:
    """An attempt refused (or failed) for a resource quota: another region, capacity or shape,
    else FAILED_QUOTA."""
    region, capacity, now = attempt.region, attempt.capacity, ctx.now
    metrics = quota_metrics(message)
    named = ", ".join(metrics) or "a resource quota"
    run = replace(run, avoid_regions=mark(run.avoid_regions, region, capacity,
                                          now + QUOTA_AVOID_S, AVOID_QUOTA, now))
    run = note(run, ctx, f"quota exceeded in {region} on {capacity}", named)
    if [r for r in ctx.regions if r not in _quota_blocked(run, capacity, now)]:
        return launch(run, ctx, capacity, f"{named} exceeded in {region}: another region")
    standard_free = [r for r in ctx.regions if r not in _quota_blocked(run, Capacity.STANDARD, now)]
    if capacity is not Capacity.STANDARD and standard_free \
            and ctx.recovery.escalation is not EscalationKind.NEVER:
        return launch(run, ctx, Capacity.STANDARD,
                      f"{named} exceeded for {capacity} VMs in every region: standard VMs")
    chosen = (run.hardware or {}).get("chosen")
    shape = _next_shape(run, ctx, str(chosen) if chosen else None)
    if shape is not None:
        hardware = dict(run.hardware or {})
        hardware[REFUSED_KEY] = [*hardware.get(REFUSED_KEY, ()), chosen]
        hardware["chosen"] = shape
        hardware["reason"] = f"{named} exceeded on {chosen} in every region: {shape}"
        # The marks were for the old shape's metrics; the new shape is refused on its own.
        run = replace(run, hardware=hardware, avoid_regions=tuple(
            m for m in run.avoid_regions if m.why != AVOID_QUOTA))
        run = publish(run, ctx, "run.machine_changed", **{"from": str(chosen)}, to=shape,
                      reason=hardware["reason"], attempt=attempt.number)
        return launch(run, ctx, policy_capacity(run, ctx, current=None, spot_available=True),
                      str(hardware["reason"]))
    regions = sorted(_quota_blocked(run, capacity, now))
    where = ", ".join(regions)
    first = metrics[0] if metrics else ""
    ask = f"; request more at {request_url(first, region)}" if first else ""
    return fail(run, ctx, RunStatus.FAILED_QUOTA,
                f"quota exceeded: {named} in {where} (Vertex AI: {message.strip()[:300]}){ask}",
                FailureClass.QUOTA,
                quota={"metrics": list(metrics), "region": region, "regions": regions,
                       "capacity": str(capacity),
                       "request_url": request_url(first, region) if first else QUOTA_CONSOLE})


def on_launch_refused(run: Run, obs: Observation, ctx: Context) -> Run:
    """LaunchFailed: a resource quota's refusal ends the attempt and moves on (on_quota);
    anything else as launching decides (rate limits and transient errors are retried)."""
    assert isinstance(obs, LaunchFailed)
    attempt = run.attempt(obs.attempt)
    if obs.code != "RESOURCE_EXHAUSTED" or attempt is None or not attempt.live \
            or not is_quota_refusal(obs.message, ctx.recovery.quota_patterns):
        return on_launch_failed(run, obs, ctx)
    run = replace(run, outbox=tuple(i for i in run.outbox if i.id != obs.intent_id))
    attempt = replace(attempt, state=AttemptState.FAILED, ended_at=ctx.now,
                      failure=FailureClass.QUOTA, end_reason=f"quota: {obs.message}")
    return on_quota(with_attempt(run, attempt), ctx, attempt, obs.message)
