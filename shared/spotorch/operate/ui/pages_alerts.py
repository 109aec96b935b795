"""The web view's /alerts page (issue 41): what alerts were sent where and how each delivery
ended (the notification ledger), and the messages the functions failed to handle that Pub/Sub
may have dead-lettered, with the reason recorded for each (`spotorch dead-letters` lists what is
held and replays it: pulling from the web view would take messages off their subscription)."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from html import escape
from typing import Any

from spotorch.operate.ui.layout import page, table


def _when(value: Any) -> str:
    if isinstance(value, int | float):
        return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(float(value)))
    return str(value or "-")


def _run_link(run_id: Any) -> str:
    import urllib.parse

    if not run_id:
        return "-"
    return f'<a href="/runs/{urllib.parse.quote(str(run_id))}">{escape(str(run_id))}</a>'


def alerts_page(sent: Sequence[Mapping[str, Any]], failed: Sequence[Mapping[str, Any]], *,
                target: str, refresh_s: int | None = None, problem: str | None = None) -> str:
    """Alert deliveries, newest first, then recorded delivery failures."""
    if problem:
        body = f'<h1>Alerts and dead letters</h1><p class="error">{escape(problem)}</p>'
        return page("alerts", body, target=target, here="/alerts")
    deliveries = [
        f'<tr class="alert" data-state="{escape(str(d.get("state", "")))}">'
        f'<td class="t">{escape(_when(d.get("claimed_at")))}</td>'
        f'<td>{escape(str(d.get("channel", "")))}</td>'
        f'<td class="id">{escape(str(d.get("event_id", "")))}</td>'
        f'<td>{_run_link(d.get("run_id"))}</td>'
        f'<td>{escape(str(d.get("state", "")))}</td>'
        f'<td class="num">{escape(str(d.get("attempts", "") or ""))}</td>'
        f'<td class="reason">{escape(str(d.get("detail", "") or ""))}</td></tr>' for d in sent]
    failures = [
        f'<tr class="failure"><td class="t">{escape(_when(d.get("at")))}</td>'
        f'<td>{escape(str(d.get("event_type", "")))}</td>'
        f'<td class="id">{escape(str(d.get("event_id", "")))}</td>'
        f'<td class="reason">{escape(str(d.get("reason", "")))}</td></tr>' for d in failed]
    body = ("<h1>Alerts and dead letters</h1>"
            "<section><h2>Alerts sent</h2>"
            + table("alerts", ("claimed (UTC)", "channel", "event", "run", "state", "attempts",
                               "detail"), deliveries, numeric=frozenset({"attempts"}),
                    empty="no alert sent yet (routes: docs/pipelines.md)")
            + "</section><section><h2>Messages that failed</h2>"
            '<p class="muted">The last transient failure of each message the functions could not '
            "handle; after its delivery attempts Pub/Sub moves it to the dead-letter topic. "
            "<code>spotorch dead-letters</code> lists what is held there and "
            "<code>--replay ID</code> republishes one.</p>"
            + table("failures", ("at (UTC)", "event type", "event", "reason"), failures,
                    empty="none recorded")
            + "</section>")
    return page("alerts", body, target=target, refresh_s=refresh_s, here="/alerts")
