"""The snapshots page (every upload accounted for) and the pipelines page (what each one
watches, runs on, and where its alerts go)."""

from __future__ import annotations

import urllib.parse
from collections.abc import Mapping, Sequence
from html import escape
from typing import Any

from spotorch.core.pipeline import Pipeline
from spotorch.operate.ui.layout import badge, page, table


def _started(row: Mapping[str, Any]) -> str:
    if not row.get("started"):
        return ""
    where = "sweeps" if row.get("started_kind") == "sweep" else "runs"
    link = f"/{where}/{urllib.parse.quote(row['started'])}"
    status = f" {badge(row['run_status'])}" if row.get("run_status") else ""
    return f'<a href="{link}">{escape(row["started"])}</a>{status}'


def snapshots_page(snapshots: Sequence[Mapping[str, Any]], unmatched: Sequence[Mapping[str, Any]],
                   *, target: str, refresh_s: int) -> str:
    """The snapshots page: every snapshot and the uploads that matched no pipeline."""
    rows = [f'<tr class="snapshot" data-state="{escape(r["state"])}" '
            f'data-uri="{escape(r["data_uri"])}"><td class="id">{escape(r["data_uri"])}</td>'
            f'<td>{escape(r["pipeline"])}</td><td>{badge(r["state"])}</td>'
            f'<td class="t">{escape(r.get("last_seen") or "-")}</td>'
            f'<td class="num">{r["objects"]}</td><td class="reason">{escape(r["summary"])}</td>'
            f'<td class="id">{_started(r)}</td></tr>' for r in snapshots]
    strays = []
    for r in unmatched:
        objects = "".join(
            f'<li><code>{escape(str(o["name"]))}</code><ul class="misses">'
            + "".join(f'<li><b>{escape(str(m.get("pipeline")))}</b>: {escape(str(m.get("text")))}'
                      "</li>" for m in o["misses"]) + "</ul></li>" for o in r["objects"])
        more = '<li class="muted">and more objects</li>' if r.get("more_objects") else ""
        alerted = f'alerted {escape(r["alerted_at"])}' if r.get("alerted_at") else "not alerted yet"
        strays.append(
            f'<tr class="unmatched" data-uri="{escape(r["uri"])}"><td class="id">'
            f'{escape(r["uri"])}</td><td>{badge(r["state"])}</td>'
            f'<td class="t">{escape(r.get("last_seen") or "-")}<br>'
            f'<span class="muted">{alerted}</span></td>'
            f'<td><ul class="objects">{objects}{more}</ul></td></tr>')
    body = ("<h1>Snapshots</h1><p class=\"muted\">Every object that arrived in a watched bucket: "
            "in a snapshot (open and what it waits for, complete, the run it started), or "
            "matched by no pipeline, with the rule each pipeline's trigger missed.</p>"
            + table("snapshots", ("folder", "pipeline", "state", "last object (UTC)", "objects",
                                  "what", "run"), rows, numeric=frozenset({"objects"}),
                    empty="no snapshot yet.")
            + "<section><h2>Uploads that matched no pipeline</h2>"
            + table("unmatched", ("folder", "state", "last object (UTC)", "objects and why"),
                    strays, empty="none.")
            + "</section>")
    waiting = any(r["state"] == "open" for r in snapshots)
    return page("snapshots", body, target=target, refresh_s=refresh_s if waiting else None,
                here="/snapshots")


def pipeline_row(p: Pipeline) -> dict[str, Any]:
    """A pipeline as the pipelines page (and /api/pipelines) shows it."""
    from spotorch.core.provenance import hardware_of, machines_text
    from spotorch.core.triggers import expectation, expectation_text

    return {
        "name": p.name, "description": p.description,
        "trigger": expectation(p.trigger), "expects": expectation_text(p.trigger),
        "on_active_run": str(p.trigger.on_active_run),
        "regions": list(p.job.regions),
        "machine": machines_text(hardware_of(p.job, None)) or None,
        "deadline_s": p.deadline_s, "escalation": str(p.recovery.escalation),
        "max_cost": p.max_cost, "sweep": p.sweep is not None, "hardware": p.hardware is not None,
        "model": p.model is not None, "checkpoint_uri": p.checkpoint_uri,
        "output_uri": p.output_uri,
        "routes": [{"channel": r.channel, "events": list(r.events)} for r in p.routes],
    }


def pipelines_page(rows: Sequence[Mapping[str, Any]], *, target: str, source: str) -> str:
    """The pipelines page: what each one watches, runs on, and where its alerts go."""
    from spotorch.operate.times import duration

    lines = []
    for r in rows:
        extras = ", ".join(name for name in ("sweep", "hardware", "model") if r[name]) or "-"
        routes = "<br>".join(f'{escape(x["channel"])}: {escape(", ".join(x["events"]))}'
                             for x in r["routes"]) or '<span class="muted">none</span>'
        link = f"/?pipeline={urllib.parse.quote(r['name'])}"
        lines.append(
            f'<tr class="pipeline" data-pipeline="{escape(r["name"])}"><td>'
            f'<a href="{link}">{escape(r["name"])}</a><br><span class="muted">'
            f'{escape(r.get("description") or "")}</span></td>'
            f'<td class="reason">{escape(r["expects"])}<br><span class="muted">'
            f'{escape(r["trigger"]["batch"])}; on an active run: '
            f'{escape(r["on_active_run"])}</span></td>'
            f'<td>{escape(r.get("machine") or "-")}<br><span class="muted">'
            f'{escape(", ".join(r["regions"]))}</span></td>'
            f'<td>{escape(duration(r["deadline_s"])) if r.get("deadline_s") else "none"}<br>'
            f'<span class="muted">escalation {escape(r["escalation"])}</span></td>'
            f'<td>{escape(extras)}</td><td>{routes}</td></tr>')
    body = (f'<h1>Pipelines</h1><p class="muted">loaded from {escape(source)}</p>'
            + table("pipelines", ("pipeline", "watches", "runs on", "deadline", "also",
                                  "alerts"), lines,
                    empty="no pipelines loaded (--pipelines, SPOTORCH_PIPELINES, or the local "
                          "stack's)."))
    return page("pipelines", body, target=target, here="/pipelines")
