"""Probes in decisions: Spot capacity probes of runs on standard VMs, and hardware candidates' probes."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from spotorch.core import hardware as hw
from spotorch.core import provenance
from spotorch.core.context import Context
from spotorch.core.cost import hourly_rate
from spotorch.core.escalation import policy_view
from spotorch.core.intents import CancelIntent, LaunchProbeIntent
from spotorch.core.launching import announce_hardware, first_launch
from spotorch.core.model import (
    CANCEL_PROBE_ANSWERED,
    CANCEL_PROBE_MOVED_ON,
    CANCEL_PROBE_NO_CAPACITY,
    CANCEL_SWITCH,
    PHASE_TO_STATE,
    PROBE_HARDWARE,
    Attempt,
    AttemptState,
    Probe,
    Run,
    RunStatus,
)
from spotorch.core.moves import (
    LAUNCH_LEASE_S,
    add_intent,
    cancel_attempt,
    drop_intent,
    fmt_s,
    move_to,
    next_intent_id,
    note,
    publish,
    with_probe,
)
from spotorch.core.observations import (
    Observation,
    ProbeLaunched,
    ProbeLaunchFailed,
    ProbeMissing,
    ProbeObserved,
)
from spotorch.core.pipeline import Capacity, EscalationKind
from spotorch.core.policy import ProbeTerms, choose_capacity, may_switch, probe_worth, slack_of
from spotorch.core.regions import AVOID_QUOTA, choose_region
from spotorch.core.shapes import run_pipeline

# ---------------------------------------------------------------- Spot probes
#
# Production cannot see Spot capacity while a run is on standard VMs. With
# recovery.spot_probes enabled (escalation: deadline), each tick on standard asks
# policy.probe_worth whether a probe pays for itself now; if so a minimal Spot job of the run's
# shape is launched in the best region. Its RUNNING is the answer yes: the probe is cancelled at
# once and the deadline policy is asked again with Spot seen; a switch goes through the usual
# cancel-and-relaunch, in the probe's region. Queued past its wait, the answer is no. Probes
# never count as attempts and never touch a budget; the cost ledger bills them.

def probing(ctx: Context) -> bool:
    """Whether this pipeline probes for Spot capacity while on standard VMs."""
    return ctx.recovery.spot_probes.enabled and ctx.recovery.escalation is EscalationKind.DEADLINE


def probe_terms(run: Run, ctx: Context, region: str) -> ProbeTerms:
    """What a probe of this run's shape costs, and what finding Spot back saves per second."""
    shaped = run_pipeline(ctx.pipeline, run.hardware)
    spot_rate = hourly_rate(shaped, Capacity.SPOT, region, ctx.prices).per_hour
    standard_rate = hourly_rate(shaped, Capacity.STANDARD, region, ctx.prices).per_hour
    probes = ctx.recovery.spot_probes
    if spot_rate is None or standard_rate is None:  # unknown price: no probe can be shown to pay
        return ProbeTerms(hit_cost=math.inf, saving_per_s=0.0, wait_s=probes.wait_s)
    spot, standard = spot_rate / 3600.0, standard_rate / 3600.0
    return ProbeTerms(hit_cost=probes.billed_s * spot, saving_per_s=max(standard - spot, 0.0),
                      wait_s=probes.wait_s)


def probe_judged(run: Run, ctx: Context) -> bool:
    """Whether probe_worth can weigh a probe: it needs the slack (a deadline and the work).
    Without it the run falls back to the cooldown's assumption that Spot is back."""
    view = policy_view(run, ctx, current=Capacity.STANDARD, spot_available=False, assumed=False)
    return slack_of(view) is not None


def tick_probe(run: Run, ctx: Context, current: Attempt) -> Run:
    """On standard: give up a probe past its wait; launch one when the policy says it pays."""
    probe = run.live_probe
    if probe is not None:
        waited = ctx.now - (probe.queued_since or probe.created_at)
        if probe.job_name is not None and probe.cancel_reason is None and probe.found is None \
                and probe.state is not AttemptState.RUNNING \
                and waited > ctx.recovery.spot_probes.wait_s:
            run = note(run, ctx, f"probe {probe.number}: no Spot capacity in {probe.region}",
                        f"queued {waited:.0f}s")
            probe = replace(probe, found=False)
            run = publish(with_probe(run, probe), ctx, "run.spot_probed", probe=probe.number,
                           region=probe.region, found=False, switching=False,
                           reason=f"no capacity within {waited:.0f}s")
            return _cancel_probe(run, ctx, probe, CANCEL_PROBE_NO_CAPACITY)
        return run
    if current.state is not AttemptState.RUNNING or current.cancel_reason is not None:
        return run
    region = choose_region(ctx.regions, run.avoid_regions, Capacity.SPOT, ctx.now)
    if any(m.region == region and m.capacity is Capacity.SPOT and m.why == AVOID_QUOTA
           and m.until > ctx.now for m in run.avoid_regions):
        return run  # Spot's quota refused it in every region: a probe would be refused too
    view = policy_view(run, ctx, current=Capacity.STANDARD, spot_available=False, assumed=False)
    if not may_switch(view, Capacity.SPOT):
        return run  # a yes could not be acted on yet (the minimum dwell): no probe to pay for
    if not probe_worth(view, probe_terms(run, ctx, region),
                       lambda seen: choose_capacity(seen, ctx.recovery)):
        return run
    number = run.counters.probes + 1
    run = replace(run, counters=replace(run.counters, probes=number))
    run = with_probe(run, Probe(number, region, created_at=ctx.now))
    run = note(run, ctx, f"probe {number}: looking for Spot capacity in {region}",
                "finding Spot back would pay for the probe")
    run, intent_id = next_intent_id(run)
    return add_intent(run, LaunchProbeIntent(intent_id, number, region,
                                       claimed_until=ctx.now + LAUNCH_LEASE_S))


def _cancel_probe(run: Run, ctx: Context, probe: Probe, why: str) -> Run:
    if probe.cancel_reason is not None:
        return run
    probe = replace(probe, cancel_reason=why)
    run = with_probe(run, probe)
    if probe.job_name is None:
        return run  # not created yet: ProbeLaunched cancels it when it appears
    return _stop_probe_job(run, ctx, probe)


def _stop_probe_job(run: Run, ctx: Context, probe: Probe) -> Run:
    assert probe.job_name is not None
    run, intent_id = next_intent_id(run)
    return add_intent(run, CancelIntent(intent_id, 0, probe.job_name, f"probe: {probe.cancel_reason}",
                                  claimed_until=ctx.now + LAUNCH_LEASE_S, probe=probe.number))


def probes_follow(run: Run, ctx: Context) -> Run:
    """A capacity probe lives only while its run runs on standard, a hardware probe only while
    its run is PROBING: otherwise it is cancelled."""
    current = run.current
    on_standard = (run.status in (RunStatus.STARTING, RunStatus.RUNNING) and current is not None
                   and current.live and current.capacity is Capacity.STANDARD
                   and current.cancel_reason is None)
    for probe in run.probes:
        if not probe.live or probe.cancel_reason is not None:
            continue
        wanted = run.status is RunStatus.PROBING if probe.kind == PROBE_HARDWARE else on_standard
        if not wanted:
            run = _cancel_probe(run, ctx, probe, CANCEL_PROBE_MOVED_ON)
    return run


def on_probe_launched(run: Run, obs: Observation, ctx: Context) -> Run:
    """A probe's job exists: recorded, or stopped at once if the run moved on."""
    assert isinstance(obs, ProbeLaunched)
    run = drop_intent(run, obs.intent_id)
    probe = run.probe(obs.probe)
    if probe is None or probe.job_name == obs.job_name:
        return run
    probe = replace(probe, job_name=obs.job_name, queued_since=probe.queued_since or ctx.now,
                    state=AttemptState.QUEUED if probe.state is AttemptState.LAUNCHING
                    else probe.state)
    run = with_probe(run, probe)
    if probe.cancel_reason is not None:  # created after the run moved on: stop it now
        return _stop_probe_job(run, ctx, probe)
    return note(run, ctx, f"probe {probe.number} job created", obs.job_name)


def on_probe_launch_failed(run: Run, obs: Observation, ctx: Context) -> Run:
    """A probe could not be launched: transient, retried; permanent, counted as a failed probe."""
    assert isinstance(obs, ProbeLaunchFailed)
    probe = run.probe(obs.probe)
    if not obs.permanent or probe is None:
        return run  # transient: the intent stays; the tick retries it when its claim expires
    run = drop_intent(run, obs.intent_id)
    probe = replace(probe, state=AttemptState.FAILED, ended_at=ctx.now, end_reason=obs.message)
    run = note(with_probe(run, probe), ctx, f"probe {probe.number} not launched", obs.message)
    return _hardware_measured(run, ctx, probe, None, f"could not launch: {obs.message}",
                              infra=True)


def on_probe_missing(run: Run, obs: Observation, ctx: Context) -> Run:
    """Vertex AI no longer knows a probe's job: the probe failed without an answer."""
    assert isinstance(obs, ProbeMissing)
    probe = run.probe(obs.probe)
    if probe is None or probe.job_name != obs.job_name or not probe.live:
        return run
    probe = replace(probe, state=AttemptState.FAILED, ended_at=ctx.now,
                    end_reason="Vertex AI no longer knows the probe's job")
    return _hardware_measured(with_probe(run, probe), ctx, probe, None,
                              "probe job lost: Vertex AI no longer knows it", infra=True)


def on_probe(run: Run, obs: Observation, ctx: Context) -> Run:
    """A probe's job changed phase: its state, and the answer it gives once running or ended."""
    assert isinstance(obs, ProbeObserved)
    probe = run.probe(obs.probe)
    if probe is None or (probe.job_name is not None and obs.status.job_name != probe.job_name):
        return run
    state = PHASE_TO_STATE[obs.status.phase]
    if probe.state.ended or state.rank <= probe.state.rank:
        return run  # late or repeated news
    status = obs.status
    ran = state is AttemptState.RUNNING or (state.ended and status.start_time is not None)
    probe = replace(probe, state=state, job_name=probe.job_name or status.job_name)
    if state in (AttemptState.QUEUED, AttemptState.PENDING):
        probe = replace(probe, queued_since=probe.queued_since or ctx.now)
    if ran and probe.started_at is None:
        probe = replace(probe, started_at=status.start_time or ctx.now)
    if state.ended:
        probe = replace(probe, ended_at=status.end_time or ctx.now,
                        end_reason=status.message or str(state))
    run = with_probe(run, probe)
    if probe.kind == PROBE_HARDWARE:
        if not state.ended:
            return run
        return _hardware_measured(run, ctx, probe, obs.result,
                                  f"ended {state} without a measurement"
                                  + (f": {status.message}" if status.message else ""))
    if not ran or probe.found is not None:
        return run
    probe = replace(probe, found=True)
    run = with_probe(run, probe)
    if probe.live:
        run = _cancel_probe(run, ctx, probe, CANCEL_PROBE_ANSWERED)
    return _spot_found(run, ctx, probe)


def _spot_found(run: Run, ctx: Context, probe: Probe) -> Run:
    """A probe ran: Spot has capacity in its region. Ask the policy again, with Spot seen."""
    run = replace(run, spot_unavailable_until=None)  # capacity confirmed: the guess is void
    current = run.current
    on_standard = (run.status in (RunStatus.STARTING, RunStatus.RUNNING) and current is not None
                   and current.live and current.capacity is Capacity.STANDARD
                   and current.cancel_reason is None)
    wanted = Capacity.STANDARD
    if on_standard:
        view = policy_view(run, ctx, current=Capacity.STANDARD, spot_available=True,
                           assumed=False)
        wanted = choose_capacity(view, ctx.recovery)
        if not may_switch(view, wanted):
            wanted = Capacity.STANDARD  # within the minimum dwell of the last move
    switching = on_standard and wanted is Capacity.SPOT
    time_left = fmt_s((run.deadline_at or ctx.now) - ctx.now)
    why = (f"probe {probe.number} found Spot capacity in {probe.region}: switch standard -> spot "
           f"(time left {time_left})" if switching else
           f"probe {probe.number} found Spot capacity in {probe.region}; staying on standard")
    run = note(run, ctx, "Spot capacity found", why)
    run = publish(run, ctx, "run.spot_probed", probe=probe.number, region=probe.region,
                   found=True, switching=switching, reason=why)
    if not switching or current is None:
        return run
    run = replace(run, next_capacity=Capacity.SPOT, next_reason=why, next_region=probe.region)
    return cancel_attempt(run, ctx, current, CANCEL_SWITCH)


# ---------------------------------------------------------------- hardware probes (issue 19)
#
# A pipeline with hardware candidates and no fresh cached result for each probes them first
# (status PROBING): one Spot job per candidate, all at once, within the probe budget, each running
# the training code for probe_steps steps (spotorch_trainer writes a report and exits). Each
# ended probe's measurement comes in with its ProbeObserved (the service reads the report);
# one past probe_timeout is cancelled and unfit. With every candidate measured, cached or left
# out, spotorch.core.hardware.choose picks the shape and the first attempt launches on it.

def probe_hardware(run: Run, ctx: Context, cache: Mapping[str, hw.ProbeResult]) -> Run:
    """Probe the candidates the plan wants measured (the rest cached or skipped), all in one region."""
    plan = hw.plan_probes(ctx.pipeline, cache, ctx.now, ctx.prices)
    results = {r.candidate: r.to_doc() for r in (*plan.cached, *plan.skipped)}
    run = replace(run, hardware_results=results)
    if not plan.probe:
        return _hardware_decided(run, ctx)
    names = ", ".join(c.name for c in plan.probe)
    run = move_to(run, RunStatus.PROBING, ctx, f"probing {len(plan.probe)} hardware candidate(s): "
                                          f"{names}")
    region = choose_region(ctx.regions, run.avoid_regions, Capacity.SPOT, ctx.now)
    for candidate in plan.probe:
        number = run.counters.probes + 1
        run = replace(run, counters=replace(run.counters, probes=number))
        run = with_probe(run, Probe(number, region, created_at=ctx.now, kind=PROBE_HARDWARE,
                                     candidate=candidate.name))
        run, intent_id = next_intent_id(run)
        run = add_intent(run, LaunchProbeIntent(intent_id, number, region,
                                          claimed_until=ctx.now + LAUNCH_LEASE_S))
    return run


def tick_hardware(run: Run, ctx: Context) -> Run:
    """Cancel hardware probes past their time limit: unfit, timed out."""
    search = ctx.pipeline.hardware
    if search is None:
        return _hardware_decided(run, ctx)
    for probe in run.probes:
        if probe.kind != PROBE_HARDWARE or not probe.live or probe.cancel_reason is not None:
            continue
        # The job's own scheduling timeout is probe_timeout; a tick of grace for its end to show.
        if ctx.now - probe.created_at > search.probe_timeout_s + ctx.recovery.decision_interval_s:
            run = _cancel_probe(run, ctx, probe, "timed out")
            run = _hardware_measured(run, ctx, run.probe(probe.number) or probe, None,
                                     f"timed out: not done within {search.probe_timeout_s:.0f}s",
                                     infra=probe.started_at is None)  # never got a machine
            if run.status is not RunStatus.PROBING:
                return run
    return run


def _hardware_measured(run: Run, ctx: Context, probe: Probe, result: Mapping[str, Any] | None,
                       unfit: str, *, infra: bool = False) -> Run:
    """A hardware probe's answer (or the reason it has none); the choice once all are in.
    infra: the probe gave no answer through no fault of the candidate (kept in the run, never
    in the probe cache)."""
    if probe.kind != PROBE_HARDWARE or probe.candidate is None or \
            probe.candidate in run.hardware_results or run.status is not RunStatus.PROBING:
        return run
    doc = dict(result) if result is not None else hw.ProbeResult(
        probe.candidate, False, reason=unfit, measured_at=ctx.now,
        job_name=probe.job_name or "", infra=infra).to_doc()
    run = replace(run, hardware_results={**run.hardware_results, probe.candidate: doc})
    fit = "fit" if doc.get("fit") else f"unfit: {doc.get('reason', '')}"
    run = note(run, ctx, f"probe {probe.number} ({probe.candidate}) measured", fit)
    search = ctx.pipeline.hardware
    if search is None or any(c.name not in run.hardware_results for c in search.candidates):
        return run
    return _hardware_decided(run, ctx)


def _hardware_decided(run: Run, ctx: Context) -> Run:
    """Every candidate has a result: choose, and launch the first attempt on the choice."""
    results = {name: hw.ProbeResult.from_doc(doc) for name, doc in run.hardware_results.items()}
    left = None if run.deadline_at is None else max(run.deadline_at - ctx.now, 0.0)
    choice = hw.choose(ctx.pipeline, results, left, ctx.outlook or hw.NO_HISTORY, ctx.prices)
    if choice.chosen is None:
        run = note(run, ctx, "no hardware chosen", f"{choice.reason}: {choice.warning}; "
                    "running on the pipeline's own worker pools")
        return first_launch(run, ctx, "no hardware candidate is fit")
    doc = choice.to_doc()
    if ctx.outlook is not None:  # what the expected hours assumed of Spot, per candidate
        doc["outlook"] = {"preemptions_per_hour": dict(ctx.outlook.preemptions_per_hour)}
    run = announce_hardware(replace(run, hardware=doc,
                                    provenance=provenance.with_hardware(
                                        run.provenance, ctx.pipeline, doc)), ctx, doc)
    return first_launch(run, ctx, f"hardware chosen: {choice.chosen}")
