"""Server-rendered HTML of the web view: the runs page, a run's page, the sweeps page and a
sweep's page. No JavaScript at all; a live run's or sweep's page refreshes itself with
<meta http-equiv="refresh">."""

from __future__ import annotations

import urllib.parse
from collections.abc import Mapping, Sequence
from html import escape
from typing import Any

from spotorch.core.model import RunStatus
from spotorch.core.sweeps import SweepStatus
from spotorch.ports.reads import STATUS_GROUPS, SWEEP_STATUS_GROUPS

# Status -> CSS class; the same families as the CLI's colours (spotorch.operate.render).
STATUS_CLASS: Mapping[str, str] = {
    "QUEUED": "waiting", "PENDING": "waiting", "STARTING": "waiting", "RUNNING": "running",
    "RECOVERING": "recovering", "CANCELLING": "cancelled", "CANCELLED": "cancelled",
    "SUCCEEDED": "succeeded",
    # sweeps and trials
    "REGISTERING": "running", "STOPPING": "cancelled", "STOPPED": "cancelled",
}

CSS = """
body{font:14px/1.45 system-ui,sans-serif;margin:0;color:#0f172a;background:#f8fafc}
header{background:#0f172a;color:#fff;padding:10px 24px;display:flex;gap:24px;align-items:center}
header a{color:#fff;text-decoration:none;font-weight:700}header nav a{font-weight:400;margin-right:16px}
header .target{color:#94a3b8;font-size:12px}
main{padding:16px 24px;max-width:1200px}
table{border-collapse:collapse;width:100%;background:#fff}
th,td{text-align:left;padding:6px 10px;border-bottom:1px solid #e2e8f0;vertical-align:top}
th{font-size:12px;text-transform:uppercase;color:#475569}
td.num,th.num{text-align:right;font-variant-numeric:tabular-nums}
.status{display:inline-block;padding:1px 8px;border-radius:10px;font-size:12px;font-weight:600}
.status.running{background:#cffafe;color:#155e75}.status.waiting{background:#dbeafe;color:#1e40af}
.status.recovering{background:#f5d0fe;color:#86198f}.status.cancelled{background:#fef3c7;color:#92400e}
.status.succeeded{background:#dcfce7;color:#166534}.status.failed{background:#fee2e2;color:#991b1b}
form.filters{display:flex;gap:12px;align-items:end;margin-bottom:12px;flex-wrap:wrap}
form.filters label{display:flex;flex-direction:column;font-size:12px;color:#475569}
.facts{display:grid;grid-template-columns:max-content 1fr;gap:4px 16px;background:#fff;
 padding:12px 16px;border:1px solid #e2e8f0}
.facts dt{font-weight:600;color:#475569}.facts dd{margin:0;word-break:break-all}
.ledger{display:flex;gap:16px;margin:16px 0}
.ledger div{background:#fff;border:1px solid #e2e8f0;padding:10px 16px;min-width:150px}
.ledger b{display:block;font-size:20px}.ledger .saved b{color:#166534}.ledger .lost b{color:#991b1b}
.legend span{display:inline-block;margin-right:16px;font-size:12px}
.legend i{display:inline-block;width:12px;height:12px;margin-right:4px;vertical-align:-2px}
td.t{white-space:nowrap}td.reason{min-width:200px}section{margin:20px 0}.muted{color:#64748b;font-size:12px}
.error{background:#fee2e2;color:#991b1b;padding:12px 16px;border:1px solid #fecaca}
tr.chosen td{background:#dcfce7;font-weight:600}tr.unfit td{color:#64748b}
tr.best td{background:#dcfce7}.warning{background:#fef3c7;color:#92400e;padding:8px 12px}
"""


def status_class(status: str) -> str:
    return STATUS_CLASS.get(status, "failed" if status.startswith("FAILED") else "waiting")


def _badge(status: str) -> str:
    return f'<span class="status {status_class(status)}">{escape(status)}</span>'


def money(amount: float | None) -> str:
    from spotorch.core.cost import money as dollars

    return dollars(amount)


def page(title: str, body: str, *, target: str, refresh_s: int | None = None) -> str:
    refresh = f'<meta http-equiv="refresh" content="{refresh_s}">' if refresh_s else ""
    return (f'<!doctype html><html lang="en"><head><meta charset="utf-8">'
            f'<meta name="viewport" content="width=device-width,initial-scale=1">{refresh}'
            f"<title>{escape(title)} · spotorch</title><style>{CSS}</style></head><body>"
            '<header><a href="/">spotorch</a><nav><a href="/">runs</a>'
            '<a href="/sweeps">sweeps</a></nav>'
            f'<span class="target">{escape(target)}</span></header>'
            f"<main>{body}</main></body></html>")


RUN_STATUS_CHOICES = (*STATUS_GROUPS, *(s.value for s in RunStatus))
SWEEP_STATUS_CHOICES = (*SWEEP_STATUS_GROUPS, *(s.value for s in SweepStatus))


def _filters(args: Mapping[str, str], action: str = "/",
             statuses: Sequence[str] = RUN_STATUS_CHOICES) -> str:
    chosen = args.get("status", "")
    options = ['<option value="">any</option>'] + [
        f'<option value="{escape(v)}"{" selected" if v == chosen else ""}>{escape(v)}</option>'
        for v in statuses]
    return (f'<form class="filters" method="get" action="{escape(action)}">'
            f'<label>status<select name="status">{"".join(options)}</select></label>'
            f'<label>pipeline<input name="pipeline" value="{escape(args.get("pipeline", ""))}">'
            '</label>'
            f'<label>since<input name="since" placeholder="6h, 2d or ISO time" '
            f'value="{escape(args.get("since", ""))}"></label>'
            '<button type="submit">filter</button></form>')


def runs_page(rows: Sequence[Mapping[str, Any]], args: Mapping[str, str],
              next_token: str | None, *, target: str, refresh_s: int) -> str:
    lines = []
    for r in rows:
        link = f"/runs/{urllib.parse.quote(r['run_id'])}"
        lines.append(
            f'<tr class="run" data-run-id="{escape(r["run_id"])}" data-status="{escape(r["status"])}">'
            f'<td><a href="{link}">{escape(r["run_id"])}</a></td><td>{escape(r["pipeline"])}</td>'
            f'<td>{_badge(r["status"])}</td><td class="t">{escape(r["created_at"])}</td>'
            f'<td class="num">{r["attempts"]}</td><td class="num">{r["preemptions"]}</td>'
            f'<td class="num">{r["step"]}{"/" + str(r["total_steps"]) if r["total_steps"] else ""}'
            f'</td><td class="num cost">{money(r["cost"])}</td>'
            f'<td class="num savings">{money(r["savings"])}'
            f'{" (" + format(r["savings_pct"], ".0f") + "%)" if r["savings_pct"] is not None else ""}'
            f'</td><td>{escape(r.get("reason") or "")}</td></tr>')
    table = ('<table class="runs"><thead><tr><th>run</th><th>pipeline</th><th>status</th>'
             '<th>created (UTC)</th><th class="num">attempts</th><th class="num">preemptions</th>'
             '<th class="num">step</th><th class="num">cost</th><th class="num">saved</th>'
             f'<th>reason</th></tr></thead><tbody>{"".join(lines)}</tbody></table>'
             if rows else '<p class="empty">no runs match.</p>')
    more = ""
    if next_token:
        query = urllib.parse.urlencode({**args, "page_token": next_token})
        more = f'<p><a class="next" href="/?{escape(query)}">older runs &#8594;</a></p>'
    live = any(r["active"] for r in rows)
    return page("runs", f"<h1>Runs</h1>{_filters(args)}{table}{more}", target=target,
                refresh_s=refresh_s if live else None)


def _facts(view: Mapping[str, Any]) -> str:
    from spotorch.operate.render import advice_text

    p = view["progress"]
    steps = str(p["step"]) + (f" / {p['total_steps']}" if p["total_steps"] else "")
    ckpt = view["latest_checkpoint"]
    rows = [("status", _badge(view["status"]) + f' <span class="muted">'
             f'{escape(view["status_meaning"])}</span>'),
            ("reason", escape(view.get("reason") or "-")), ("pipeline", escape(view["pipeline"])),
            ("data", escape(view["data_uri"])), ("created", escape(view["created_at"])),
            ("deadline", escape(view.get("deadline_at") or "none")), ("steps", escape(steps)),
            ("checkpoint", escape(f"step {ckpt['step']}: {ckpt['uri']}") if ckpt else "-"),
            ("checkpointing", '<span class="advice">'
             f'{escape(advice_text(view["checkpoint_advice"]))}</span>'),
            ("model", escape(view["model_uri"]) + ("" if view["model_ready"]
                                                   else ' <span class="muted">(not yet)</span>'))]
    if view.get("sweep_id"):
        link = f"/sweeps/{urllib.parse.quote(view['sweep_id'])}"
        rows.append(("sweep", f'<a href="{link}">{escape(view["sweep_id"])}</a> '
                              f'<span class="muted">{_params(view.get("params") or {})}</span>'))
    return '<dl class="facts">' + "".join(f"<dt>{k}</dt><dd>{v}</dd>" for k, v in rows) + "</dl>"


def _ledger(cost: Mapping[str, Any]) -> str:
    pct = f" ({cost['savings_pct']:.0f}%)" if cost["savings_pct"] is not None else ""
    return ('<div class="ledger">'
            f'<div class="spent">spent<b>{money(cost["total"])}</b></div>'
            f'<div class="saved">saved against standard VMs<b>{money(cost["savings"])}{pct}</b>'
            f'<span class="muted">standard: {money(cost["standard_equivalent"])}</span></div>'
            f'<div class="lost">lost to {cost["preemptions"]} preemption(s)'
            f'<b>{money(cost["lost_cost"])}</b><span class="muted">{cost["lost_steps"]} steps '
            'redone</span></div></div>')


def _num(value: float | None, spec: str, unit: str = "") -> str:
    return "-" if value is None else format(value, spec) + unit


def _hardware(choice: Mapping[str, Any] | None) -> str:
    """The hardware candidates the run chose among (issue 19): measured, expected, why."""
    if not choice:
        return ""
    rows = []
    for r in choice.get("rows", ()):
        fits = ("yes" if r.get("meets_deadline") is not False else "misses deadline") \
            if r.get("fit") else "no"
        kind = "chosen" if r.get("chosen") else ("fit" if r.get("fit") else "unfit")
        rows.append(
            f'<tr class="candidate {kind}" data-candidate="{escape(r["candidate"])}">'
            f'<td>{escape(r["candidate"])}</td><td>{escape(r.get("shape", ""))}</td>'
            f'<td class="num">{_num(r.get("steps_per_s"), ".2f")}</td>'
            f'<td class="num">{_num(r.get("samples_per_s"), ".1f")}</td>'
            f'<td class="num">{_num(r.get("peak_host_rss_mb"), ".0f", " MB")}</td>'
            f'<td class="num">{_num(r.get("expected_hours"), ".3f")}</td>'
            f'<td class="num">{_num(r.get("spot_cost"), ".4f")}</td>'
            f'<td class="num">{_num(r.get("standard_cost"), ".4f")}</td>'
            f'<td class="fits">{fits}</td><td class="reason">{escape(r.get("reason", ""))}</td>'
            "</tr>")
    warning = (f'<p class="warning">{escape(choice["warning"])}</p>'
               if choice.get("warning") else "")
    return ('<section class="hardware"><h2>Hardware</h2><table class="hardware"><thead><tr>'
            '<th>candidate</th><th>shape</th><th class="num">steps/s</th>'
            '<th class="num">samples/s</th><th class="num">peak RSS</th>'
            '<th class="num">expected hours</th><th class="num">Spot cost</th>'
            '<th class="num">standard cost</th><th>fits</th><th>why</th></tr></thead>'
            f'<tbody>{"".join(rows)}</tbody></table>'
            f'<p class="choice">chosen: {escape(choice.get("reason", ""))}</p>{warning}</section>')


def run_page(view: Mapping[str, Any], svg: str, *, target: str, refresh_s: int) -> str:
    from spotorch.operate.ui.timeline import CAPACITY_COLOUR, PREEMPT_COLOUR, PROGRESS_COLOUR

    legend = "".join(f'<span><i style="background:{c}"></i>{escape(str(k))}</span>'
                     for k, c in CAPACITY_COLOUR.items())
    legend += ('<span><i style="background:#e2e6ec"></i>waiting for capacity</span>'
               f'<span><i style="background:{PREEMPT_COLOUR}"></i>preemption</span>'
               f'<span><i style="background:{PROGRESS_COLOUR}"></i>steps</span>')
    costs = {a["attempt"]: a for a in view["cost"]["attempts"]}
    attempts = "".join(
        f'<tr class="attempt"><td>{a["attempt"]}</td><td>{escape(a["capacity"])}</td>'
        f'<td class="t">{escape(a["region"])}</td><td>{escape(a["state"])}</td>'
        f'<td>{escape(a["job_id"] or "-")}</td><td class="t">{escape(a["started_at"] or "-")}</td>'
        f'<td class="t">{escape(a["ended_at"] or "-")}</td>'
        f'<td class="num">{"-" if a["resumed_from_step"] is None else a["resumed_from_step"]}</td>'
        f'<td class="num">{"-" if a["progress_step"] is None else a["progress_step"]}</td>'
        f'<td class="num">{money(costs.get(a["attempt"], {}).get("cost"))}</td>'
        f'<td class="reason">{escape(a["end_reason"] or "")}</td></tr>' for a in view["attempts"])
    history = "".join(f'<tr class="event"><td class="t">{escape(h["at"])}</td><td>{escape(h["what"])}</td>'
                      f'<td>{escape(h["reason"])}</td></tr>' for h in view["history"])
    body = (f'<h1>{escape(view["run_id"])}</h1>{_facts(view)}{_ledger(view["cost"])}'
            f'{_hardware(view.get("hardware"))}'
            f'<section><h2>Timeline</h2><div class="legend">{legend}</div>{svg}</section>'
            '<section><h2>Attempts</h2><table class="attempts"><thead><tr><th>#</th>'
            '<th>capacity</th><th>region</th><th>state</th><th>job</th><th>started</th>'
            '<th>ended</th><th class="num">resumed</th><th class="num">reached</th>'
            f'<th class="num">cost</th><th>end reason</th></tr></thead><tbody>{attempts}'
            '</tbody></table></section>'
            '<section><h2>History</h2><table class="history"><thead><tr><th>at (UTC)</th>'
            f'<th>what</th><th>why</th></tr></thead><tbody>{history}</tbody></table></section>'
            f'<p class="muted">prices: {escape("; ".join(view["cost"]["basis"]))}</p>')
    return page(view["run_id"], body, target=target,
                refresh_s=refresh_s if view["active"] else None)


# ---------------------------------------------------------------- sweeps

def _metric(name: str | None, value: float | None) -> str:
    from spotorch.operate.render import metric_text

    return escape(metric_text(name, value))


def _params(params: Mapping[str, Any]) -> str:
    from spotorch.operate.render import params_text

    return escape(params_text(params))


def sweeps_page(rows: Sequence[Mapping[str, Any]], args: Mapping[str, str],
                next_token: str | None, *, target: str, refresh_s: int) -> str:
    lines = []
    for r in rows:
        link = f"/sweeps/{urllib.parse.quote(r['sweep_id'])}"
        lines.append(
            f'<tr class="sweep" data-sweep-id="{escape(r["sweep_id"])}" '
            f'data-status="{escape(r["status"])}"><td><a href="{link}">{escape(r["sweep_id"])}</a>'
            f'</td><td>{escape(r["pipeline"])}</td><td>{_badge(r["status"])}</td>'
            f'<td class="t">{escape(r["created_at"])}</td>'
            f'<td class="num trials">{r["trials_done"]}/{r["trials_total"]}</td>'
            f'<td class="num best">{"-" if r["best_trial"] is None else r["best_trial"]}</td>'
            f'<td class="metric">{_metric(r.get("metric"), r.get("best_metric"))}</td>'
            f'<td>{escape(r.get("model_name") or "")}</td></tr>')
    table = ('<table class="sweeps"><thead><tr><th>sweep</th><th>pipeline</th><th>status</th>'
             '<th>created (UTC)</th><th class="num">trials ended</th><th class="num">best</th>'
             f'<th>metric</th><th>model</th></tr></thead><tbody>{"".join(lines)}</tbody></table>'
             if rows else '<p class="empty">no sweeps match.</p>')
    more = ""
    if next_token:
        query = urllib.parse.urlencode({**args, "page_token": next_token})
        more = f'<p><a class="next" href="/sweeps?{escape(query)}">older sweeps &#8594;</a></p>'
    live = any(r["active"] for r in rows)
    body = (f'<h1>Sweeps</h1>{_filters(args, "/sweeps", SWEEP_STATUS_CHOICES)}{table}{more}')
    return page("sweeps", body, target=target, refresh_s=refresh_s if live else None)


def sweep_page(view: Mapping[str, Any], *, target: str, refresh_s: int) -> str:
    best = view.get("best")
    goal = f" ({view['goal']})" if view.get("goal") else ""
    facts = [("status", _badge(view["status"])),
             ("reason", escape(view.get("end_reason") or "-")),
             ("pipeline", escape(view["pipeline"])), ("data", escape(view["data_uri"])),
             ("created", escape(view["created_at"])),
             ("metric", escape((view.get("metric") or "unknown (pipeline not loaded)") + goal)),
             ("trials", f'{view["trials_done"]}/{view["trials_total"]} ended, '
                        f'{view["stopped_early"]} stopped early'),
             ("best", f'trial {best["trial"]}: {_metric(view.get("metric"), best["metric"])}, '
                      f'{_params(best["params"])}' if best else "-"),
             ("model", escape(view.get("model_name") or "-")),
             ("cost", f'{money(view["cost_estimate"])} <span class="muted">(estimate at list '
                      'prices)</span>')]
    trials = "".join(
        f'<tr class="trial{" best" if t["best"] else ""}" data-trial="{t["trial"]}" '
        f'data-status="{escape(t["status"])}"><td>{t["trial"]}'
        f'{" <b>best</b>" if t["best"] else ""}</td>'
        f'<td><a href="/runs/{urllib.parse.quote(t["trial_run_id"])}">'
        f'{escape(t["trial_run_id"])}</a></td><td>{_badge(t["status"])}</td>'
        f'<td class="params">{_params(t["params"])}</td>'
        f'<td class="num metric">{_num(t["metric"], ".4g")}</td>'
        f'<td class="num step">{_num(t["step"], "d")}</td>'
        f'<td class="early">{"stopped early" if t["stopped_early"] else "-"}</td>'
        f'<td class="num">{t["preemptions"]}</td><td class="num">{money(t["cost"])}</td></tr>'
        for t in view["trials"])
    history = "".join(f'<tr class="event"><td class="t">{escape(h["at"])}</td>'
                      f'<td>{escape(h["what"])}</td></tr>' for h in view["history"])
    body = (f'<h1>{escape(view["sweep_id"])}</h1><dl class="facts">'
            + "".join(f"<dt>{k}</dt><dd>{v}</dd>" for k, v in facts) + "</dl>"
            '<section><h2>Trials</h2><table class="trials"><thead><tr><th>#</th><th>run</th>'
            '<th>status</th><th>parameters</th><th class="num">metric</th>'
            '<th class="num">step</th><th>early stop</th><th class="num">preemptions</th>'
            f'<th class="num">cost</th></tr></thead><tbody>{trials}</tbody></table></section>'
            '<section><h2>History</h2><table class="history"><thead><tr><th>at (UTC)</th>'
            f'<th>what</th></tr></thead><tbody>{history}</tbody></table></section>')
    return page(view["sweep_id"], body, target=target,
                refresh_s=refresh_s if view["active"] else None)


def error_page(message: str, *, target: str) -> str:
    return page("error", f'<p class="error">{escape(message)}</p>', target=target)
