"""The runs page (with the period's totals), a run's page (facts, actions, ledger, hardware,
metric charts, timeline, attempts with their errors, history) and an attempt's logs page."""

from __future__ import annotations

import secrets
import urllib.parse
from collections.abc import Mapping, Sequence
from html import escape
from typing import Any

from spotorch.core.provenance import machines_text
from spotorch.operate.ui.layout import (
    action_form,
    badge,
    error_page,
    filters,
    money,
    notice,
    num,
    page,
    table,
)

__all__ = ["error_page", "logs_page", "run_page", "runs_page"]


def _totals(totals: Mapping[str, Any], period: str) -> str:
    statuses = ", ".join(f"{badge(s)} {n}" for s, n in totals["by_status"].items()) or "none"
    more = " (the first 2,000 runs)" if totals.get("cut") else ""
    return ('<section class="totals-section"><h2>Totals over the last '
            f'{escape(period)}{more}</h2><div class="totals">'
            f'<div class="spend">spent<b>{money(totals["spend"])}</b></div>'
            f'<div class="savings">saved against standard VMs<b>{money(totals["savings"])}</b>'
            '</div>'
            f'<div class="count">runs<b>{totals["runs"]}</b><span class="muted">'
            f'{totals["active"]} active, {totals["preemptions"]} preemptions</span></div>'
            f'<div class="by-status">by status<span class="statuses">{statuses}</span></div>'
            "</div></section>")


def runs_page(rows: Sequence[Mapping[str, Any]], args: Mapping[str, str],
              next_token: str | None, *, target: str, refresh_s: int,
              totals: Mapping[str, Any] | None = None, period: str = "7d") -> str:
    """The runs page: the period's totals, the filters, one row per run and the next page's link.
    A sweep's trial runs are folded into one row per sweep (linking to its page) unless
    `trials=1` asks for them."""
    lines = []
    folded: dict[str, list[Mapping[str, Any]]] = {}
    if args.get("trials") != "1":
        for r in rows:
            if r.get("sweep_id"):
                folded.setdefault(str(r["sweep_id"]), []).append(r)
    shown_sweeps: set[str] = set()
    for r in rows:
        sweep = r.get("sweep_id")
        if sweep in folded:
            if sweep not in shown_sweeps:
                shown_sweeps.add(str(sweep))
                lines.append(_sweep_row(str(sweep), folded[str(sweep)]))
            continue
        link = f"/runs/{urllib.parse.quote(r['run_id'])}"
        pct = f" ({r['savings_pct']:.0f}%)" if r.get("savings_pct") is not None else ""
        steps = f'{r["step"]}{"/" + str(r["total_steps"]) if r["total_steps"] else ""}'
        lines.append(
            f'<tr class="run" data-run-id="{escape(r["run_id"])}" data-status="{escape(r["status"])}">'
            f'<td class="ref"><a href="{link}">{escape(r["run_id"])}</a></td>'
            f'<td>{escape(r["pipeline"])}</td><td>{badge(r["status"])}</td>'
            f'<td class="t">{escape(r["created_at"])}</td>'
            f'<td class="num">{r["attempts"]}</td><td class="num">{r["preemptions"]}</td>'
            f'<td class="num">{steps}</td><td class="num cost">{money(r["cost"])}</td>'
            f'<td class="num savings">{money(r["savings"])}{pct}</td>'
            f'<td class="reason">{escape(r.get("reason") or "")}</td></tr>')
    listing = table("runs", ("run", "pipeline", "status", "created (UTC)", "attempts",
                             "preemptions", "step", "cost", "saved", "reason"), lines,
                    numeric=frozenset({"attempts", "preemptions", "step", "cost", "saved"}),
                    empty="no runs match.")
    more = ""
    if next_token:
        query = urllib.parse.urlencode({**args, "page_token": next_token})
        more = f'<p><a class="next" href="/?{escape(query)}">older runs &#8594;</a></p>'
    if folded:
        query = urllib.parse.urlencode({**args, "trials": "1"})
        trials = sum(len(v) for v in folded.values())
        more = (f'<p class="muted folded">{trials} trial runs of {len(folded)} sweep(s) folded '
                f'into their sweep\'s row: <a href="/?{escape(query)}">show them</a></p>') + more
    live = any(r["active"] for r in rows)
    summary = _totals(totals, period) if totals is not None else ""
    return page("runs", f"<h1>Runs</h1>{notice(args)}{summary}{filters(args)}{listing}{more}",
                target=target, refresh_s=refresh_s if live else None, here="/")


def _sweep_row(sweep: str, trials: Sequence[Mapping[str, Any]]) -> str:
    """One row standing for a sweep's trial runs on this page."""
    link = f"/sweeps/{urllib.parse.quote(sweep)}"
    active = sum(1 for t in trials if t["active"])
    by_status: dict[str, int] = {}
    for t in trials:
        by_status[t["status"]] = by_status.get(t["status"], 0) + 1
    statuses = ", ".join(f"{badge(s)} {n}" for s, n in sorted(by_status.items()))
    cost = sum(float(t["cost"] or 0.0) for t in trials)
    return (f'<tr class="sweep-trials" data-sweep-id="{escape(sweep)}">'
            f'<td class="ref"><a href="{link}">sweep {escape(sweep)}</a></td>'
            f'<td>{escape(trials[0]["pipeline"])}</td><td>{statuses}</td>'
            f'<td class="t">{escape(min(t["created_at"] for t in trials))}</td>'
            f'<td class="num">{len(trials)} trials</td><td class="num">'
            f'{sum(t["preemptions"] for t in trials)}</td><td class="num">{active} active</td>'
            f'<td class="num cost">{money(cost)}</td><td class="num savings"></td>'
            f'<td class="reason">trial runs: see the sweep</td></tr>')


# ---------------------------------------------------------------- a run

def _params(params: Mapping[str, Any]) -> str:
    from spotorch.operate.render import params_text

    return escape(params_text(params))


def _facts(view: Mapping[str, Any]) -> str:
    from spotorch.operate.render import advice_text

    p = view["progress"]
    steps = str(p["step"]) + (f" / {p['total_steps']}" if p["total_steps"] else "")
    if p.get("steps_per_s"):
        steps += f" ({p['steps_per_s']:.2f} steps/s)"
    metrics = ", ".join(f"{k} {v:.4g}" for k, v in (p.get("metrics") or {}).items())
    ckpt = view["latest_checkpoint"]
    rows = [("status", badge(view["status"]) + f' <span class="muted">'
             f'{escape(view["status_meaning"])}</span>'),
            ("reason", escape(view.get("reason") or "-")), ("pipeline", escape(view["pipeline"])),
            ("data", escape(view["data_uri"])), ("created", escape(view["created_at"])),
            ("deadline", escape(view.get("deadline_at") or "none")), ("steps", escape(steps)),
            ("metrics", escape(metrics or "-")),
            ("checkpoint", escape(f"step {ckpt['step']}: {ckpt['uri']}") if ckpt else "-"),
            ("checkpointing", '<span class="advice">'
             f'{escape(advice_text(view["checkpoint_advice"]))}</span>'),
            ("model", escape(view["model_uri"]) + ("" if view["model_ready"]
                                                   else ' <span class="muted">(not yet)</span>'))]
    for key, label in (("retry_of", "retry of"), ("rerun_of", "rerun of")):
        if view.get(key):
            link = f"/runs/{urllib.parse.quote(view[key])}"
            rows.append((label, f'<a href="{link}">{escape(view[key])}</a>'))
    if view.get("sweep_id"):
        link = f"/sweeps/{urllib.parse.quote(view['sweep_id'])}"
        rows.append(("sweep", f'<a href="{link}">{escape(view["sweep_id"])}</a> '
                              f'<span class="muted">{_params(view.get("params") or {})}</span>'))
    return '<dl class="facts">' + "".join(f"<dt>{k}</dt><dd>{v}</dd>" for k, v in rows) + "</dl>"


def _ledger(cost: Mapping[str, Any]) -> str:
    """The cost ledger as core.cost states it: savings only for a run that produced its result,
    what standard VMs would have cost otherwise; preemptions' redone work when there was any."""
    pct = f" ({cost['savings_pct']:.0f}%)" if cost.get("savings_pct") is not None else ""
    standard = money(cost["standard_equivalent"])
    if cost.get("savings") is not None:
        saved = (f'<div class="saved">saved against standard VMs<b>{money(cost["savings"])}'
                 f'{pct}</b><span class="muted">standard: {standard}</span></div>')
    else:
        saved = (f'<div class="standard">standard VMs would have cost<b>{standard}</b>'
                 '<span class="muted">for the same work; no saving is claimed for a run '
                 "without its result</span></div>")
    lost = (f'<div class="lost">lost to {cost["preemptions"]} preemption(s)'
            f'<b>{money(cost["lost_cost"])}</b><span class="muted">{cost["lost_steps"]} steps '
            'redone</span></div>') if cost.get("preemptions") else ""
    return (f'<div class="ledger"><div class="spent">spent<b>{money(cost["total"])}</b></div>'
            f'{saved}{lost}</div><p class="muted cost-line">{escape(cost["summary"])}</p>')


def _preprocess(step: Mapping[str, Any] | None) -> str:
    """The run's preprocess step (issue 31): phase, the cache, the Dataflow job, its output."""
    if not step:
        return ""
    cache = "hit (output reused)" if step.get("cache_hit") else "miss"
    rows = [("phase", f"{step['phase']} {step.get('state') or ''}".strip()),
            ("cache", f"{cache}, key {step['cache_key']}"),
            ("Dataflow job", "-" if step.get("cache_hit") else
             f"{step.get('job_name')} ({step.get('job_id') or 'not created yet'})"),
            ("output", step.get("output_uri") or "-"), ("cost", money(step.get("cost")))]
    if step.get("error"):
        rows.append(("error", f"{step.get('failure_class')}: {step['error']}"))
    cells = "".join(f"<tr><th>{escape(k)}</th><td>{escape(str(v))}</td></tr>" for k, v in rows)
    hit = " cache-hit" if step.get("cache_hit") else ""
    return (f'<section class="preprocess{hit}"><h2>Preprocess</h2>'
            f'<table class="facts">{cells}</table></section>')


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
            f'<td class="num">{num(r.get("steps_per_s"), ".2f")}</td>'
            f'<td class="num">{num(r.get("samples_per_s"), ".1f")}</td>'
            f'<td class="num">{num(r.get("peak_host_rss_mb"), ".0f", " MB")}</td>'
            f'<td class="num">{num(r.get("expected_hours"), ".3f")}</td>'
            f'<td class="num">{num(r.get("spot_cost"), ".4f")}</td>'
            f'<td class="num">{num(r.get("standard_cost"), ".4f")}</td>'
            f'<td class="fits">{fits}</td><td class="reason">{escape(r.get("reason", ""))}</td>'
            "</tr>")
    warning = (f'<p class="warning">{escape(choice["warning"])}</p>'
               if choice.get("warning") else "")
    return ('<section class="hardware"><h2>Hardware</h2>'
            + table("hardware", ("candidate", "shape", "steps/s", "samples/s", "peak RSS",
                                 "expected hours", "Spot cost", "standard cost", "fits", "why"),
                    rows, numeric=frozenset({"steps/s", "samples/s", "peak RSS",
                                             "expected hours", "Spot cost", "standard cost"}))
            + f'<p class="choice">chosen: {escape(choice.get("reason", ""))}</p>{warning}'
            "</section>")


def _provenance(prov: Mapping[str, Any] | None) -> str:
    """What the run trained on and with, as recorded at its creation (issue 30)."""
    if not prov:
        return ""
    data, code = prov.get("data") or {}, prov.get("code") or {}
    objects = data.get("objects") or []
    rows = "".join(f'<tr class="object"><td>{escape(str(o["name"]))}</td>'
                   f'<td class="num">{int(o["generation"])}</td></tr>' for o in objects)
    listed = (table("objects", ("object", "generation"), [rows], numeric=frozenset({"generation"}))
              if rows else "")
    if data.get("pinned") and not rows:
        listed = (f'<p class="muted">{data.get("count")} objects: listed in '
                  f'{escape(str(data.get("manifest_uri")))}</p>')
    pools = []
    for pool in code.get("pools") or ():
        if pool.get("kind") == "python_package":
            pools.append(f'packages {escape(", ".join(map(str, pool.get("package_uris") or ())))}'
                         f' on {escape(str(pool.get("executor_image_uri")))}'
                         f' (-m {escape(str(pool.get("python_module")))})')
        else:
            pools.append(escape(str(pool.get("image_uri"))))
    pinned = ('<span class="pinned">pinned</span>' if code.get("pinned") else
              '<span class="unpinned">not pinned: an image tag can move; a rerun may run other '
              "code</span>")
    machines = machines_text(prov.get("hardware"))
    facts = [("data", escape(str(data.get("uri"))) + ("" if data.get("pinned") else
                                                      ' <span class="muted">(not pinned: no '
                                                      "generations recorded)</span>")),
             ("code", f'<code class="hash">{escape(str(code.get("hash", ""))[:16])}</code> '
                      f'{pinned}<br>{"<br>".join(pools)}'),
             ("pipeline", f'<code class="hash">'
                          f'{escape(str((prov.get("pipeline") or {}).get("hash", ""))[:16])}'
                          "</code>"),
             ("seed", f'<span class="seed">{escape(str(prov.get("seed")))}</span>'),
             ("params", _params(prov.get("params") or {}) or "-"),
             ("hardware", escape(machines or "-"))]
    if isinstance(data.get("bigquery"), Mapping):
        bq = data["bigquery"]
        query = f'; query sha256 {bq["query_sha256"]}' if bq.get("query_sha256") else ""
        facts.append(("bigquery", escape(f'{", ".join(map(str, bq.get("tables") or []))} at '
                                         f'{bq.get("snapshot_time")}{query}; exports '
                                         f'{", ".join(map(str, bq.get("export_uris") or []))}')))
    dl = "".join(f"<dt>{k}</dt><dd>{v}</dd>" for k, v in facts)
    return (f'<section class="provenance"><h2>Provenance</h2>'
            f'<dl class="provenance-facts">{dl}</dl>'
            f"{listed}</section>")


def _actions(view: Mapping[str, Any], token: str) -> str:
    """Cancel, retry and rerun, through the api (the buttons a run's state allows)."""
    run = urllib.parse.quote(view["run_id"])
    parts = []
    if view.get("can_cancel"):
        parts.append(action_form(f"/runs/{run}/cancel", token, "Cancel run", css="danger",
                                 confirm="Cancel this run…"))
    if view.get("can_retry"):
        parts.append(action_form(f"/runs/{run}/retry", token, "Retry from the latest checkpoint"))
    if view.get("can_rerun"):
        # The form's own request id: posting this form twice (a resubmit) is one rerun.
        parts.append(action_form(f"/runs/{run}/rerun", token, "Rerun on the same inputs",
                                 fields={"request_id": secrets.token_hex(6)}))
    return f'<div class="actions">{"".join(parts)}</div>' if parts else ""


def _charts(view: Mapping[str, Any]) -> str:
    from spotorch.operate.ui.charts import Series, line_chart, metric_charts

    charts = metric_charts(view.get("metric_history") or [])
    curve = view.get("sweep_curve") or []
    if curve and not charts:
        charts.append(line_chart([Series("sweep metric", [(p["step"], p["value"])
                                                          for p in curve])],
                                 title="the sweep's metric", x_label="step", y_label="value",
                                 css_class="chart metric"))
    if not charts:
        return ('<section class="metrics"><h2>Metrics</h2><p class="muted">none reported yet '
                "(the trainer's progress reports carry them: spotorch_trainer "
                "report(metrics=...))</p></section>")
    return f'<section class="metrics"><h2>Metrics</h2><div class="charts">{"".join(charts)}</div></section>'


def _attempts(view: Mapping[str, Any]) -> str:
    costs = {a["attempt"]: a for a in view["cost"]["attempts"]}
    run = urllib.parse.quote(view["run_id"])
    rows = []
    for a in view["attempts"]:
        logs = (f'<a href="/runs/{run}/logs?attempt={a["attempt"]}">logs</a>'
                if a.get("job_name") else "")
        error = ""
        if a.get("error_tail"):
            error = (f'<details class="error-tail"><summary>{escape(a.get("error") or "error")}'
                     f'</summary><pre class="tail">{escape(chr(10).join(a["error_tail"]))}</pre>'
                     "</details>")
        startup = (f'<p class="startup-loss">{escape(a["startup_loss"])}</p>'
                   if a.get("startup_loss") else "")
        rows.append(
            f'<tr class="attempt" data-attempt="{a["attempt"]}"><td>{a["attempt"]}</td>'
            f'<td>{escape(a["capacity"])}<br><span class="muted">{escape(a["region"])}</span></td>'
            f'<td>{escape(a["state"])}</td><td class="id">{escape(a["job_id"] or "-")}</td>'
            f'<td class="t">{escape(a["started_at"] or "-")}<br>'
            f'{escape(a["ended_at"] or "-")}</td>'
            f'<td class="num">{"-" if a["resumed_from_step"] is None else a["resumed_from_step"]}'
            f'</td><td class="num">{"-" if a["progress_step"] is None else a["progress_step"]}'
            f'</td><td class="num">{money(costs.get(a["attempt"], {}).get("cost"))}</td>'
            f'<td class="reason">{escape(a["end_reason"] or "")}{startup}{error}</td>'
            f'<td>{logs}</td></tr>')
    return ('<section><h2>Attempts</h2>'
            + table("attempts", ("#", "capacity", "state", "job", "started / ended", "resumed",
                                 "reached", "cost", "end reason", ""), rows,
                    numeric=frozenset({"resumed", "reached", "cost"}), empty="no attempt yet")
            + "</section>")


def run_page(view: Mapping[str, Any], svg: str, *, target: str, refresh_s: int,
             token: str = "", args: Mapping[str, str] | None = None) -> str:
    """A run's page: its facts and actions, the timeline, charts, attempts and history."""
    from spotorch.operate.ui.timeline import CAPACITY_COLOUR, PREEMPT_COLOUR, PROGRESS_COLOUR

    legend = "".join(f'<span><i style="background:{c}"></i>{escape(str(k))}</span>'
                     for k, c in CAPACITY_COLOUR.items())
    legend += ('<span><i style="background:#e2e6ec"></i>waiting for capacity</span>'
               f'<span><i style="background:{PREEMPT_COLOUR}"></i>preemption</span>'
               f'<span><i style="background:{PROGRESS_COLOUR}"></i>steps</span>')
    history = "".join(f'<tr class="event"><td class="t">{escape(h["at"])}</td>'
                      f'<td>{escape(h["what"])}</td><td>{escape(h["reason"])}</td></tr>'
                      for h in view["history"])
    body = (f'<h1>{escape(view["run_id"])}</h1>{notice(args or {})}{_facts(view)}'
            f'{_actions(view, token)}{_ledger(view["cost"])}{_provenance(view.get("provenance"))}'
            f'{_preprocess(view.get("preprocess"))}'
            f'{_hardware(view.get("hardware"))}'
            f'{_charts(view)}'
            f'<section><h2>Timeline</h2><div class="legend">{legend}</div>{svg}</section>'
            f'{_attempts(view)}'
            '<section><h2>History</h2><table class="history"><thead><tr><th>at (UTC)</th>'
            f'<th>what</th><th>why</th></tr></thead><tbody>{history}</tbody></table></section>'
            f'<p class="muted">prices: {escape("; ".join(view["cost"]["basis"]))}</p>')
    return page(view["run_id"], body, target=target,
                refresh_s=refresh_s if view["active"] else None, here="/")


# ---------------------------------------------------------------- an attempt's logs

def logs_page(view: Mapping[str, Any], attempt: int, lines: Sequence[Any], *, target: str,
              problem: str | None, cut: int, refresh_s: int) -> str:
    """The attempt's own output (stderr marked, Vertex's own lines marked), newest at the end."""
    run = urllib.parse.quote(view["run_id"])
    tabs = " ".join(
        (f"<b>attempt {a['attempt']}</b>" if a["attempt"] == attempt else
         f'<a href="/runs/{run}/logs?attempt={a["attempt"]}">attempt {a["attempt"]}</a>')
        for a in view["attempts"])
    shown = "".join(
        f'<span class="{escape(line.stream)}">'
        f'{"" if line.replica == "workerpool0-0" else "[" + escape(line.replica) + "] "}'
        f'{escape(line.text)}</span>\n' for line in lines)
    note = f'<p class="muted">the last {len(lines)} lines of {cut}</p>' if cut > len(lines) else ""
    body = (f'<h1>{escape(view["run_id"])}: logs</h1><p><a href="/runs/{run}">&#8592; the run</a>'
            f" &nbsp; {tabs}</p>"
            + (f'<p class="error">{escape(problem)}</p>' if problem else
               f'{note}<pre class="log">{shown or "(no output yet)"}</pre>'))
    current = next((a for a in view["attempts"] if a["attempt"] == attempt), None)
    live = current is not None and current.get("ended_at") is None
    return page(f"{view['run_id']} logs", body, target=target,
                refresh_s=refresh_s if live else None, here="/")
