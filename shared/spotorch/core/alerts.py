"""What an alert says, and how Chat, Slack and email show it (pure functions, no I/O)."""

from __future__ import annotations

import html
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from email.message import EmailMessage
from email.utils import format_datetime, formatdate
from enum import StrEnum
from typing import Any
from urllib.parse import quote

from spotorch.core.events import kind_of

CHAT_REPLY_OPTION = "REPLY_MESSAGE_FALLBACK_TO_NEW_THREAD"
SLACK_MAX_FIELDS = 10  # Slack rejects a section block with more fields


class Severity(StrEnum):
    """How an alert is flagged to the reader."""

    INFO = "info"
    SUCCESS = "success"
    WARNING = "warning"
    ERROR = "error"


_MARK = {Severity.INFO: "🔷", Severity.SUCCESS: "✅", Severity.WARNING: "⚠️",
         Severity.ERROR: "🛑"}


@dataclass(frozen=True)
class Alert:
    """One event as people read it, before it is shaped for a channel."""

    event_id: str
    type: str  # the full CloudEvents type, e.g. dev.spotorch.run.failed.v1
    kind: str
    run_id: str
    pipeline: str
    time: str
    severity: Severity
    headline: str
    facts: tuple[tuple[str, str], ...]
    held: Mapping[str, int] = field(default_factory=dict)  # alerts held back since the last one
    first: bool = True  # the first alert of this run on this channel: it opens the thread

    @property
    def held_count(self) -> int:
        """How many alerts of this run were held back since the last one sent."""
        return sum(self.held.values())

    @property
    def held_note(self) -> str:
        """One line about alerts the rate limit held back, or ""."""
        if not self.held:
            return ""
        kinds = ", ".join(f"{n} x {kind}" for kind, n in sorted(self.held.items()))
        return f"{self.held_count} earlier alert(s) held back by the rate limit: {kinds}"


def _get(data: Mapping[str, Any], key: str, default: str = "?") -> str:
    value = data.get(key)
    return default if value is None or value == "" else str(value)


def _duration(seconds: float) -> str:
    s = abs(float(seconds))
    return f"{s / 3600:.1f} h" if s >= 3600 else f"{s / 60:.0f} min" if s >= 60 else f"{s:.0f} s"


def _deadline(d: Mapping[str, Any]) -> str:
    left, work = d.get("time_left_s"), d.get("remaining_work_s")
    when = ("" if not isinstance(left, int | float) else
            f": passed {_duration(left)} ago" if left < 0 else f": {_duration(left)} left")
    need = f", {_duration(work)} of work to do" if isinstance(work, int | float) else ""
    return f"Deadline {_get(d, 'deadline')} at risk{when}{need}; action: {_get(d, 'action')}"


def _attempt_end(d: Mapping[str, Any]) -> str:
    cls = f" ({d['failure_class']})" if d.get("failure_class") else ""
    code = f", exit code {d['exit_code']}" if d.get("exit_code") is not None else ""
    return (f"Attempt {_get(d, 'attempt')} ended {_get(d, 'state')}: "
            f"{_get(d, 'end_reason')}{cls}{code}{_error(d)}")


def _error(d: Mapping[str, Any]) -> str:
    """The line of the job's stderr that says what went wrong, when it was read."""
    return f" — {d['error']}" if d.get("error") else ""


def _preempted(d: Mapping[str, Any]) -> str:
    step = d.get("progress_step")
    at = "" if step is None else f" at step {step}"
    return (f"Attempt {_get(d, 'attempt')} preempted{at} "
            f"({_get(d, 'preemptions')} preemption(s) so far)")


def _because(d: Mapping[str, Any]) -> str:
    return f": {d['reason']}" if d.get("reason") else ""


def _failed(d: Mapping[str, Any]) -> str:
    """run.failed; one refused for a resource quota says which quota to request, and where."""
    quota = d.get("quota")
    if not isinstance(quota, Mapping):
        return f"Run failed{_because(d)}{_error(d)}"
    metrics = quota.get("metrics") or ["a resource quota"]
    regions = quota.get("regions") or [quota.get("region", "?")]
    return (f"Run failed: quota {', '.join(map(str, metrics))} exceeded in "
            f"{', '.join(map(str, regions))} ({_get(quota, 'capacity')} VMs); request an "
            f"increase at {_get(quota, 'request_url')}")


def _resumed(d: Mapping[str, Any]) -> str:
    step = d.get("resumed_from_step")
    return f", resuming from step {step}" if step is not None else ""


def _preprocess_end(d: Mapping[str, Any]) -> str:
    if d.get("cache_hit"):
        return f"Preprocess output reused from the cache: {_get(d, 'output_uri')}"
    if d.get("phase") == "DONE":
        return (f"Preprocess done: Dataflow job {_get(d, 'job_name')} ended "
                f"{_get(d, 'state')}; training on {_get(d, 'output_uri')}")
    return (f"Preprocess {str(d.get('phase', '?')).lower()} ({_get(d, 'failure_class')}): "
            f"{_get(d, 'error')}")


def _sweep_end(d: Mapping[str, Any]) -> str:
    best = d.get("best") if isinstance(d.get("best"), Mapping) else None
    head = f"Sweep {str(_get(d, 'status')).lower()} after {_get(d, 'trials')} trial(s)"
    if best:
        head += (f"; best trial {best.get('trial')} ({_get(d, 'metric')} {best.get('metric')}, "
                 f"params {best.get('params')})")
    if d.get("model_name"):
        head += f"; model registered as {d['model_name']}"
    return head


# kind -> (severity, headline). Headlines tolerate missing fields: an alert must always render.
_HEADLINES: Mapping[str, tuple[Severity, Callable[[Mapping[str, Any]], str]]] = {
    "run.created": (Severity.INFO, lambda d: (
        f"Run started for {_get(d, 'data_uri')}{_because(d)}")),
    "attempt.launched": (Severity.INFO, lambda d: (
        f"Attempt {_get(d, 'attempt')} launched on {_get(d, 'capacity')} VMs in "
        f"{_get(d, 'region')}{_resumed(d)}")),
    "attempt.preempted": (Severity.WARNING, _preempted),
    "attempt.ended": (Severity.INFO, _attempt_end),
    "run.escalated": (Severity.WARNING, lambda d: (
        f"Escalated from {_get(d, 'from')} to {_get(d, 'to')} VMs{_because(d)}")),
    "run.succeeded": (Severity.SUCCESS, lambda d: (
        f"Run succeeded after {_get(d, 'attempts')} attempt(s), "
        f"{_get(d, 'preemptions')} preemption(s)"
        + (f"; model registered as {d['model_name']}" if d.get("model_name") else ""))),
    # Sweeps (spotorch.core.sweeps): the run id of these alerts is the sweep's id.
    "sweep.succeeded": (Severity.SUCCESS, _sweep_end),
    "sweep.failed": (Severity.ERROR, _sweep_end),
    "sweep.cancelled": (Severity.WARNING, _sweep_end),
    "sweep.trial_stopped": (Severity.INFO, lambda d: (
        f"Trial {_get(d, 'trial')} stopped early{_because(d)}")),
    "run.failed": (Severity.ERROR, _failed),
    "run.cancelled": (Severity.WARNING, lambda d: f"Run cancelled{_because(d)}"),
    "run.budget_exceeded": (Severity.ERROR, lambda d: (
        f"Budget exceeded: {_get(d, 'budget')} used {_get(d, 'used')} of {_get(d, 'limit')}")),
    "run.deadline_at_risk": (Severity.WARNING, _deadline),
    "attempt.hung": (Severity.WARNING, lambda d: (
        f"Attempt {_get(d, 'attempt')} hung: no report for {_get(d, 'silent_s')}s at step "
        f"{_get(d, 'step')}; cancelled and relaunched")),
    "run.step_rate_degraded": (Severity.WARNING, lambda d: (
        f"Step rate fell to {_get(d, 'rate')}/s (median {_get(d, 'median')}/s){_because(d)}")),
    "run.straggler": (Severity.WARNING, lambda d: (
        f"Replica {_get(d, 'replica')} is a straggler: {_get(d, 'step_s')}s per step against "
        f"the others' {_get(d, 'median_s')}s ({_get(d, 'action')})")),
    "run.diverged": (Severity.ERROR, lambda d: (
        f"Training diverged at step {_get(d, 'step')} ({_get(d, 'rule')}): {_get(d, 'action')}")),
    "run.checkpoint_stale": (Severity.WARNING, lambda d: (
        f"No new checkpoint for {_get(d, 'since_s')}s at step {_get(d, 'step')}: a preemption "
        "now loses that work")),
    "run.machine_changed": (Severity.WARNING, lambda d: (
        f"Machine changed from {_get(d, 'from')} to {_get(d, 'to')}{_because(d)}")),
    "run.spot_probed": (Severity.INFO, lambda d: (
        f"Spot probe {_get(d, 'probe')} in {_get(d, 'region')}: "
        + ("capacity found" if d.get("found") else "no capacity")
        + ("; moving back to Spot VMs" if d.get("switching") else ""))),
    "run.preprocess_started": (Severity.INFO, lambda d: (
        f"Preprocess: Dataflow job {_get(d, 'job_name')} launched (launch {_get(d, 'launch')}) "
        f"writing {_get(d, 'output_uri')}"
        + (f"; relaunched after: {d['previous_error']}" if d.get("previous_error") else ""))),
    "run.preprocess_ended": (Severity.INFO, _preprocess_end),
    "snapshot.failed": (Severity.ERROR, lambda d: (
        f"BigQuery snapshot {_get(d, 'snapshot_id')} of {', '.join(d.get('tables') or ())} "
        + (f"given up: {_get(d, 'phase')} job {_get(d, 'job_id')} failed "
           f"({_get(d, 'reason')}: {_get(d, 'message')}) after {_get(d, 'attempts')} attempts"
           if d.get("job_id") else f"given up ({_get(d, 'reason')}): {_get(d, 'message')}"))),
    "upload.unmatched": (Severity.WARNING, lambda d: (
        f"Upload to {_get(d, 'uri')} matched no pipeline: {_get(d, 'reason')}")),
    "model.promoted": (Severity.SUCCESS, lambda d: (
        f"Model {_get(d, 'model_name')} promoted to {_get(d, 'alias')}: {_get(d, 'reason')}")),
    "model.rejected": (Severity.WARNING, lambda d: (
        f"Model {_get(d, 'model_name')} registered without {_get(d, 'alias')}: "
        f"{_get(d, 'reason')}")),
    "run.checkpoints_deleted": (Severity.INFO, lambda d: (
        f"Deleted old checkpoints (steps {_get(d, 'steps')}), "
        f"{_get(d, 'bytes_reclaimed')} bytes reclaimed")),
}


_NOT_FACTS = frozenset({"run_id", "pipeline"})  # in the alert's own header
# The same figure as the cost ledger's line: said once, by the ledger (its own rounding).
_SAID_BY_COST = frozenset({"cost_estimate"})


def _fact(value: Any) -> str:
    if isinstance(value, Mapping) and isinstance(value.get("summary"), str):
        return str(value["summary"])  # the cost ledger: its one line ("saved $412 (64%) ...")
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return "\n".join(value)  # lines, such as a failed job's stderr tail
    if isinstance(value, float):
        return f"{value:.2f}" if value != int(value) else str(int(value))
    return str(value)


def render_alert(event: Mapping[str, Any], *, held: Mapping[str, int] | None = None,
                 first: bool = True) -> Alert:
    """The alert for one spotorch event; tolerant of missing or extra data fields."""
    raw = event.get("data")
    data: Mapping[str, Any] = raw if isinstance(raw, Mapping) else {}
    try:
        kind = kind_of(str(event.get("type", "")))
    except ValueError:
        kind = str(event.get("type", "event"))
    severity, headline = _HEADLINES.get(kind, (Severity.INFO, lambda d: f"Event {kind}"))
    facts = tuple((key, _fact(value)) for key, value in data.items()
                  if key not in _NOT_FACTS and value not in (None, "", [])
                  and not (key in _SAID_BY_COST and "cost" in data))
    return Alert(
        event_id=str(event.get("id", "")), type=str(event.get("type", "")), kind=kind,
        run_id=_get(data, "run_id"),
        pipeline=_get(data, "pipeline"), time=str(event.get("time", "")), severity=severity,
        headline=headline(data), facts=facts, held=dict(held or {}), first=first,
    )


def _footer(alert: Alert, esc: Callable[[str], str]) -> str:
    """Which event this is; the type stands alone (space-separated) so tools can pick it out."""
    return f"{esc(alert.type)} · event {esc(alert.event_id)} · {esc(alert.time)}"


def _plain_lines(alert: Alert) -> list[str]:
    lines = [f"{_MARK[alert.severity]} {alert.headline}"]
    if alert.held_note:
        lines.append(f"({alert.held_note})")
    return lines


# --- Google Chat -------------------------------------------------------------------------------


def chat_thread_params(alert: Alert) -> dict[str, str]:
    """Query parameters that put every alert of a run in one Chat thread (keyed by the run id)."""
    return {"threadKey": alert.run_id, "messageReplyOption": CHAT_REPLY_OPTION}


def chat_payload(alert: Alert) -> dict[str, Any]:
    """Google Chat message: text fallback (what notifications show), a cardsV2 card, the thread."""
    esc = html.escape
    text = "\n".join([f"*{alert.pipeline}* run `{alert.run_id}`", *_plain_lines(alert)])
    widgets: list[dict[str, Any]] = [
        {"decoratedText": {"topLabel": key, "text": esc(value).replace("\n", "<br>"),
                           "wrapText": True}}
        for key, value in alert.facts
    ]
    if alert.held_note:
        widgets.append({"textParagraph": {"text": f"<i>{esc(alert.held_note)}</i>"}})
    widgets.append({"textParagraph": {"text": _footer(alert, esc)}})
    card = {
        "header": {"title": esc(alert.headline),
                   "subtitle": esc(f"{alert.pipeline} · run {alert.run_id} · {alert.kind}")},
        "sections": [{"widgets": widgets}],
    }
    return {
        "text": text,
        "cardsV2": [{"cardId": f"spotorch-{alert.event_id}", "card": card}],
        # The thread key in the body is the current form; the query parameter is the legacy one.
        "thread": {"threadKey": alert.run_id},
    }


# --- Slack -------------------------------------------------------------------------------------


def _slack_escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def slack_payload(alert: Alert) -> dict[str, Any]:
    """Slack incoming-webhook message: blocks, and a text that groups alerts by run."""
    esc = _slack_escape
    prefix = f"[{alert.pipeline}/{alert.run_id}]"
    fields = [{"type": "mrkdwn", "text": f"*{esc(key)}*\n{esc(value)}"}
              for key, value in alert.facts[:SLACK_MAX_FIELDS]]
    blocks: list[dict[str, Any]] = [
        {"type": "section", "text": {"type": "mrkdwn",
                                     "text": f"{_MARK[alert.severity]} *{esc(alert.headline)}*"}},
    ]
    if fields:
        blocks.append({"type": "section", "fields": fields})
    context = [f"{esc(alert.pipeline)} · run `{esc(alert.run_id)}`", _footer(alert, esc)]
    if alert.held_note:
        context.insert(0, f"_{esc(alert.held_note)}_")
    blocks.append({"type": "context",
                   "elements": [{"type": "mrkdwn", "text": line} for line in context]})
    return {"text": f"{prefix} {' '.join(_plain_lines(alert))}", "blocks": blocks}


# --- Email -------------------------------------------------------------------------------------


def _domain(sender: str) -> str:
    address = sender.rsplit("<", 1)[-1].rstrip(">").strip()
    return address.rsplit("@", 1)[1] if "@" in address else "spotorch.invalid"


def thread_message_id(alert: Alert, sender: str) -> str:
    """Message-ID of a run's thread root: the same for every alert of the run, so clients group."""
    return f"<spotorch.run.{quote(alert.run_id, safe='')}@{_domain(sender)}>"


def _email_date(rfc3339_time: str) -> str:
    try:
        return format_datetime(datetime.fromisoformat(rfc3339_time))
    except ValueError:
        return formatdate(usegmt=True)


def email_subject(alert: Alert) -> str:
    """One subject for every alert of a run: Gmail threads only messages whose subjects match."""
    return f"[spotorch] {alert.pipeline}: run {alert.run_id}"


def email_message(alert: Alert, *, sender: str, recipients: tuple[str, ...]) -> EmailMessage:
    """multipart/alternative (plain text + HTML), threaded per run with Message-ID/References."""
    msg = EmailMessage()
    root = thread_message_id(alert, sender)
    msg["Subject"] = email_subject(alert)
    msg["From"] = sender
    msg["To"] = ", ".join(recipients)
    if alert.first:
        msg["Message-ID"] = root
    else:
        msg["Message-ID"] = f"<spotorch.{quote(alert.event_id, safe='')}@{_domain(sender)}>"
        msg["In-Reply-To"] = root
        msg["References"] = root
    msg["Date"] = _email_date(alert.time)
    msg["Auto-Submitted"] = "auto-generated"  # RFC 3834: no vacation auto-replies
    msg["X-Spotorch-Run"] = alert.run_id
    msg["X-Spotorch-Pipeline"] = alert.pipeline
    msg["X-Spotorch-Event-Type"] = alert.type
    msg["X-Spotorch-Event-Id"] = alert.event_id
    width = max((len(key) for key, _ in alert.facts), default=0)
    plain = [*_plain_lines(alert), "",
             *(f"{key.ljust(width)}  {value}" for key, value in alert.facts), "",
             f"pipeline {alert.pipeline} · run {alert.run_id}", _footer(alert, str)]
    msg.set_content("\n".join(plain) + "\n")
    esc = html.escape
    rows = "".join(f"<tr><th align=\"left\">{esc(k)}</th><td>{esc(v)}</td></tr>"
                   for k, v in alert.facts)
    held = f"<p><i>{esc(alert.held_note)}</i></p>" if alert.held_note else ""
    msg.add_alternative(
        f"<html><body><h3>{_MARK[alert.severity]} {esc(alert.headline)}</h3>{held}"
        f"<table cellpadding=\"4\">{rows}</table>"
        f"<p style=\"color:#80868b\">pipeline {esc(alert.pipeline)} · run {esc(alert.run_id)}"
        f"<br>{_footer(alert, esc)}</p></body></html>",
        subtype="html",
    )
    return msg
