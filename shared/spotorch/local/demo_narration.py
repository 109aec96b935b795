"""What happened in a demo, told from the run's own record only: its attempts (where each ran,
the step it resumed from, the step it reached, how it ended, what its stderr said), its probes,
its escalation and its end. Nothing is said that the record does not show."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any


def _start(a: Mapping[str, Any]) -> str:
    step = a.get("resumed_from_step")
    if step is not None:
        return f"resumed from its checkpoint at step {step}"
    return "started from the beginning" if a["attempt"] == 1 else \
        "started from the beginning (no checkpoint to resume from)"


def attempt_sentence(a: Mapping[str, Any]) -> str:
    """One attempt: where, from which step, to which step, how it ended."""
    machine = f", {a['machine_type']}" if a.get("machine_type") else ""
    head = f"attempt {a['attempt']} on {a['capacity']} VMs in {a['region']}{machine}"
    if not a.get("started_at"):
        end = f": {a['end_reason']}" if a.get("end_reason") else ""
        return f"{head}: never ran ({str(a['state']).lower()}{end})"
    reached = a.get("progress_reached")
    parts = [_start(a)] + ([f"reached step {reached}"] if reached is not None else [])
    if a.get("ended_at"):
        parts.append(f"ended {a['state']}" + (f": {a['end_reason']}" if a.get("end_reason")
                                              else ""))
    else:
        parts.append(f"is {a['state']}")
    text = f"{head}: " + ", ".join(parts)
    return text + (f"; its stderr ended with: {a['error']}" if a.get("error") else "")


def _probe(p: Mapping[str, Any]) -> str:
    if p.get("kind") == "hardware":
        return (f"hardware probe {p['probe']} of candidate {p.get('candidate')}: "
                f"{str(p.get('state')).lower()}"
                + (f" ({p['cancel_reason']})" if p.get("cancel_reason") else ""))
    answer = ("found Spot capacity" if p.get("found") else
              "found no capacity" if p.get("found") is False else "gave no answer")
    return f"Spot probe {p['probe']} in {p['region']} {answer}"


def _trial(t: Mapping[str, Any]) -> str:
    params = " ".join(f"{k}={v}" for k, v in (t.get("params") or {}).items())
    metric = f", metric {t['metric']:.4g} at step {t.get('step')}" if isinstance(
        t.get("metric"), int | float) else ""
    early = ", stopped early by the median rule" if t.get("stopped_early") else ""
    preempted = t.get("preemptions") or 0
    resumed = (f", resumed from step {t['resumed_from_step']}"
               if t.get("resumed_from_step") is not None else "")
    times = f", preempted {preempted} time{'s' if preempted != 1 else ''}" if preempted else ""
    return f"trial {t['trial']} ({params}): {t['status']}{metric}{early}{times}{resumed}"


def _preprocess(step: Mapping[str, Any]) -> str:
    """The preprocess step in one sentence (issue 31)."""
    if step.get("cache_hit"):
        return f"preprocess: the output of key {step.get('cache_key')} was reused (no job)"
    said = (f"preprocess: Dataflow job {step.get('job_name')} (launch {step.get('launches')}) "
            f"ended {step.get('state')}")
    if step.get("phase") == "DONE":
        return said + f"; the training read {step.get('output_uri')}"
    return said + f": {step.get('failure_class')}: {str(step.get('error') or '')[-200:]}"


def narrate(report: Mapping[str, Any]) -> list[str]:
    """The demo's story as it happened, one sentence a line."""
    lines: list[str] = []
    if report.get("sweep_id"):
        lines += [_trial(t) for t in report.get("trials") or ()]
        best = report.get("best")
        if isinstance(best, Mapping):
            lines.append(f"best: trial {best.get('trial')}")
        if report.get("pareto") is not None:  # a sweep of several objectives (issue 38)
            names = ", ".join(o["name"] for o in report.get("objectives") or ())
            lines.append(f"Pareto front on {names}: trials {report['pareto']}")
            lines += [f"trial {k} misses the constraints: {'; '.join(m)}"
                      for k, m in (report.get("misses") or {}).items()]
            chosen = report.get("chosen")
            lines.append((f"chosen: trial {chosen}, " if chosen else "chosen: none, ")
                         + str(report.get("why")))
        if report.get("model_name"):
            lines.append(f"model registered as {report['model_name']}")
    attempts: Sequence[Mapping[str, Any]] = report.get("attempts") or ()
    probes: Sequence[Mapping[str, Any]] = report.get("probes") or ()
    step = report.get("preprocess")
    if isinstance(step, Mapping):
        lines.append(_preprocess(step))
    lines += [attempt_sentence(a) for a in attempts]
    lines += [_probe(p) for p in probes if p.get("probe")]
    escalated = report.get("escalated")
    if escalated:
        lines.append(f"escalated to {escalated['to']} VMs: {escalated['reason']}")
    status = report.get("status")
    if status and status != "NO_RUN":
        ended = f": {report['end_reason']}" if report.get("end_reason") else ""
        lines.append(f"the {'sweep' if report.get('sweep_id') else 'run'} ended {status}{ended}")
    elif status == "NO_RUN":
        lines.append("no run started")
    return lines
