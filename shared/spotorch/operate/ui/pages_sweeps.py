"""The sweeps page and a sweep's page: its trials, their metric by step, the stopping decisions,
the best trial, the registered model, and a cancel button (through the api)."""

from __future__ import annotations

import urllib.parse
from collections.abc import Mapping, Sequence
from html import escape
from typing import Any

from spotorch.operate.ui.layout import (
    SWEEP_STATUS_CHOICES,
    action_form,
    badge,
    filters,
    money,
    notice,
    num,
    page,
    table,
)


def _metric(name: str | None, value: float | None) -> str:
    from spotorch.operate.render import metric_text

    return escape(metric_text(name, value))


def _params(params: Mapping[str, Any]) -> str:
    from spotorch.operate.render import params_text

    return escape(params_text(params))


def sweeps_page(rows: Sequence[Mapping[str, Any]], args: Mapping[str, str],
                next_token: str | None, *, target: str, refresh_s: int) -> str:
    """The sweeps page: the filters, one row per sweep and the next page's link."""
    lines = []
    for r in rows:
        link = f"/sweeps/{urllib.parse.quote(r['sweep_id'])}"
        lines.append(
            f'<tr class="sweep" data-sweep-id="{escape(r["sweep_id"])}" '
            f'data-status="{escape(r["status"])}"><td class="ref"><a href="{link}">'
            f'{escape(r["sweep_id"])}</a></td><td>{escape(r["pipeline"])}</td>'
            f'<td>{badge(r["status"])}</td><td class="t">{escape(r["created_at"])}</td>'
            f'<td class="num trials">{r["trials_done"]}/{r["trials_total"]}</td>'
            f'<td class="num best">{"-" if r["best_trial"] is None else r["best_trial"]}</td>'
            f'<td class="metric">{_metric(r.get("metric"), r.get("best_metric"))}</td>'
            f'<td>{escape(r.get("model_name") or "")}</td></tr>')
    listing = table("sweeps", ("sweep", "pipeline", "status", "created (UTC)", "trials ended",
                               "best", "metric", "model"), lines,
                    numeric=frozenset({"trials ended", "best"}), empty="no sweeps match.")
    more = ""
    if next_token:
        query = urllib.parse.urlencode({**args, "page_token": next_token})
        more = f'<p><a class="next" href="/sweeps?{escape(query)}">older sweeps &#8594;</a></p>'
    live = any(r["active"] for r in rows)
    body = (f'<h1>Sweeps</h1>{notice(args)}{filters(args, "/sweeps", SWEEP_STATUS_CHOICES)}'
            f"{listing}{more}")
    return page("sweeps", body, target=target, refresh_s=refresh_s if live else None,
                here="/sweeps")


def _curves(view: Mapping[str, Any]) -> str:
    """Every trial's metric by step in one chart: stopped trials dashed, the best one bold."""
    from spotorch.operate.ui.charts import Series, line_chart

    series = [Series(f"trial {t['trial']} ({_plain_params(t['params'])})",
                     [(float(s), float(v)) for s, v in t.get("curve") or ()],
                     dashed=bool(t["stopped_early"]), bold=bool(t["best"]))
              for t in view["trials"] if t.get("curve")]
    if not series:
        return ""
    metric = view.get("metric") or "metric"
    chart = line_chart(series, title=f"{metric} by step, each trial", x_label="step",
                       y_label=metric, css_class="chart sweep-curves")
    return f'<section class="curves"><h2>Trials</h2><div class="charts">{chart}</div></section>'


def tradeoff_section(view: Mapping[str, Any]) -> str:
    """The trade-off's plots (issue 38): spotorch.operate.ui.tradeoff_chart."""
    from spotorch.operate.ui.tradeoff_chart import tradeoff_section as section

    return section(view)


def _plain_params(params: Mapping[str, Any]) -> str:
    return " ".join(f"{k}={v}" for k, v in params.items())


def sweep_page(view: Mapping[str, Any], *, target: str, refresh_s: int, token: str = "",
               args: Mapping[str, str] | None = None) -> str:
    """A sweep's page: its facts, trials, metric chart, stopping decisions and the cancel button."""
    best = view.get("best")
    goal = f" ({view['goal']})" if view.get("goal") else ""
    facts = [("status", badge(view["status"])),
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
    trials = []
    for t in view["trials"]:
        decision = ("stopped early" if t["stopped_early"] else "-")
        if t.get("stop_reason"):
            decision = (f'<details class="stop"><summary>stopped early</summary>'
                        f'{escape(t["stop_reason"])}</details>')
        trials.append(
            f'<tr class="trial{" best" if t["best"] else ""}" data-trial="{t["trial"]}" '
            f'data-status="{escape(t["status"])}"><td class="t">{t["trial"]}'
            f'{" <b>best</b>" if t["best"] else ""}</td>'
            f'<td class="ref"><a href="/runs/{urllib.parse.quote(t["trial_run_id"])}">'
            f'{escape(t["trial_run_id"])}</a></td><td>{badge(t["status"])}</td>'
            f'<td class="params">{_params(t["params"])}</td>'
            f'<td class="num metric">{num(t["metric"], ".4g")}</td>'
            f'<td class="num step">{num(t["step"], "d")}</td>'
            f'<td class="early">{decision}</td>'
            f'<td class="num">{t["preemptions"]}</td><td class="num">{money(t["cost"])}</td></tr>')
    history = "".join(f'<tr class="event"><td class="t">{escape(h["at"])}</td>'
                      f'<td>{escape(h["what"])}</td></tr>' for h in view["history"])
    cancel = ""
    if view.get("active"):
        sid = urllib.parse.quote(view["sweep_id"])
        cancel = ('<div class="actions">' + action_form(
            f"/sweeps/{sid}/cancel", token, "Cancel sweep", css="danger",
            confirm="Cancel this sweep and its live trials…") + "</div>")
    body = (f'<h1>{escape(view["sweep_id"])}</h1>{notice(args or {})}<dl class="facts">'
            + "".join(f"<dt>{k}</dt><dd>{v}</dd>" for k, v in facts) + "</dl>" + cancel
            + _curves(view) + tradeoff_section(view)
            + '<section>' + table("trials", ("#", "run", "status", "parameters", "metric",
                                             "step", "early stop", "preemptions", "cost"),
                                  trials, numeric=frozenset({"metric", "step", "preemptions",
                                                             "cost"}))
            + '</section><section><h2>History</h2><table class="history"><thead><tr>'
              f'<th>at (UTC)</th><th>what</th></tr></thead><tbody>{history}</tbody></table>'
              '</section>')
    return page(view["sweep_id"], body, target=target,
                refresh_s=refresh_s if view["active"] else None, here="/sweeps")
