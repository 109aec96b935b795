"""What every page of the web view shares: the stylesheet, the frame, badges, filters, forms.

Server-rendered HTML, no JavaScript: buttons are forms posted to the UI server, which hands
them to the api function (the same authorization as the CLI's actions); a live page refreshes
itself with <meta http-equiv="refresh">; long text folds with <details>.
"""

from __future__ import annotations

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
    # snapshots
    "open": "waiting", "complete": "recovering", "started": "succeeded", "unmatched": "failed",
    "resolved": "cancelled",
}

NAV = (("/", "runs"), ("/snapshots", "snapshots"), ("/pipelines", "pipelines"),
       ("/sweeps", "sweeps"), ("/alerts", "alerts"))

CSS = """
*{box-sizing:border-box}
body{font:14px/1.45 system-ui,sans-serif;margin:0;color:#0f172a;background:#f8fafc}
header{background:#0f172a;color:#fff;padding:10px 24px;display:flex;gap:24px;align-items:center}
header a{color:#fff;text-decoration:none;font-weight:700}header nav a{font-weight:400;margin-right:16px}
header nav a.here{text-decoration:underline}
header .target{color:#94a3b8;font-size:12px;margin-left:auto}
main{padding:16px 24px;max-width:1400px}
h1{font-size:22px;margin:8px 0 12px;overflow-wrap:anywhere}h2{font-size:17px;margin:0 0 8px}
table{border-collapse:collapse;width:100%;background:#fff}
th,td{text-align:left;padding:6px 8px;border-bottom:1px solid #e2e8f0;vertical-align:top;
 overflow-wrap:anywhere}
th{font-size:12px;text-transform:uppercase;color:#475569;overflow-wrap:normal}
td.num,th.num{text-align:right;font-variant-numeric:tabular-nums;overflow-wrap:normal;
 white-space:nowrap}
td.t{white-space:nowrap;font-variant-numeric:tabular-nums}
td.id{font:12px ui-monospace,monospace;overflow-wrap:anywhere}
td.ref{font:12px ui-monospace,monospace;white-space:nowrap}
td.reason{min-width:160px}
.status{display:inline-block;padding:1px 8px;border-radius:10px;font-size:12px;font-weight:600;
 white-space:nowrap}
.status.running{background:#cffafe;color:#155e75}.status.waiting{background:#dbeafe;color:#1e40af}
.status.recovering{background:#f5d0fe;color:#86198f}.status.cancelled{background:#fef3c7;color:#92400e}
.status.succeeded{background:#dcfce7;color:#166534}.status.failed{background:#fee2e2;color:#991b1b}
form.filters{display:flex;gap:12px;align-items:end;margin-bottom:12px;flex-wrap:wrap}
form.filters label{display:flex;flex-direction:column;font-size:12px;color:#475569}
.facts,.provenance-facts{display:grid;grid-template-columns:max-content 1fr;gap:4px 16px;
 background:#fff;padding:12px 16px;border:1px solid #e2e8f0}
.facts dt,.provenance-facts dt{font-weight:600;color:#475569}
.facts dd,.provenance-facts dd{margin:0;overflow-wrap:anywhere}
.ledger,.totals{display:flex;gap:16px;margin:16px 0;flex-wrap:wrap}
.ledger div,.totals div{background:#fff;border:1px solid #e2e8f0;padding:10px 16px;min-width:150px}
.totals .statuses{display:block;margin-top:6px}
.ledger b,.totals b{display:block;font-size:20px}.ledger .saved b{color:#166534}
.legend span{display:inline-block;margin-right:16px;font-size:12px}
.legend i{display:inline-block;width:12px;height:12px;margin-right:4px;vertical-align:-2px}
section{margin:20px 0}.muted{color:#64748b;font-size:12px}
.error{background:#fee2e2;color:#991b1b;padding:12px 16px;border:1px solid #fecaca}
.notice{background:#dcfce7;color:#166534;padding:10px 16px;border:1px solid #bbf7d0;margin:8px 0}
tr.chosen td{background:#dcfce7;font-weight:600}tr.unfit td{color:#64748b}
tr.best td{background:#dcfce7}.warning{background:#fef3c7;color:#92400e;padding:8px 12px}
.unpinned{color:#92400e}.pinned{color:#166534}code.hash{font-size:12px}
pre.tail,pre.log{background:#0f172a;color:#e2e8f0;padding:10px 12px;font:12px/1.4 ui-monospace,
 monospace;white-space:pre-wrap;overflow-wrap:anywhere;margin:6px 0}
pre.log .stderr{color:#fca5a5}pre.log .service{color:#93c5fd}
details summary{cursor:pointer;color:#991b1b}
.actions{display:flex;gap:12px;align-items:start;margin:12px 0;flex-wrap:wrap}
.actions form{display:flex;gap:8px;align-items:center}
.actions details{background:#fff;border:1px solid #e2e8f0;padding:6px 10px}
button.danger{background:#991b1b;color:#fff;border:0;padding:5px 12px;border-radius:4px}
button.act{background:#1d4ed8;color:#fff;border:0;padding:5px 12px;border-radius:4px}
.charts{display:grid;grid-template-columns:repeat(auto-fill,minmax(420px,1fr));gap:12px}
.charts svg{background:#fff;border:1px solid #e2e8f0}
ul.misses{margin:2px 0 0 0;padding-left:18px;color:#475569}
"""


def status_class(status: str) -> str:
    """The CSS class of a status badge: its own, failed for any FAILED one, else waiting."""
    return STATUS_CLASS.get(status, "failed" if status.startswith("FAILED") else "waiting")


def badge(status: str) -> str:
    """A status as a coloured badge."""
    return f'<span class="status {status_class(status)}">{escape(status)}</span>'


def money(amount: float | None) -> str:
    """An amount in dollars, as the core writes it."""
    from spotorch.core.cost import money as dollars

    return dollars(amount)


def num(value: float | None, spec: str, unit: str = "") -> str:
    """A number formatted by the spec with its unit, or a dash for none."""
    return "-" if value is None else format(value, spec) + unit


def page(title: str, body: str, *, target: str, refresh_s: int | None = None,
         here: str = "") -> str:
    """A whole page: the frame, the navigation with this page marked, and the body."""
    refresh = f'<meta http-equiv="refresh" content="{refresh_s}">' if refresh_s else ""
    nav = "".join(f'<a href="{href}"{" class=here" if href == here else ""}>{name}</a>'
                  for href, name in NAV)
    return (f'<!doctype html><html lang="en"><head><meta charset="utf-8">'
            f'<meta name="viewport" content="width=device-width,initial-scale=1">{refresh}'
            f"<title>{escape(title)} · spotorch</title><style>{CSS}</style></head><body>"
            f'<header><a href="/">spotorch</a><nav>{nav}</nav>'
            f'<span class="target">{escape(target)}</span></header>'
            f"<main>{body}</main></body></html>")


RUN_STATUS_CHOICES = (*STATUS_GROUPS, *(s.value for s in RunStatus))
SWEEP_STATUS_CHOICES = (*SWEEP_STATUS_GROUPS, *(s.value for s in SweepStatus))


def filters(args: Mapping[str, str], action: str = "/",
            statuses: Sequence[str] = RUN_STATUS_CHOICES) -> str:
    """The filter form of a listing, with the chosen values filled in."""
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


def action_form(path: str, token: str, label: str, *, fields: Mapping[str, str] | None = None,
                css: str = "act", confirm: str | None = None) -> str:
    """A button that posts to the UI server (which calls the api). With `confirm`, the button is
    inside a <details> that says what it does: two deliberate clicks, no JavaScript."""
    hidden = "".join(f'<input type="hidden" name="{escape(k)}" value="{escape(v)}">'
                     for k, v in {"token": token, **(fields or {})}.items())
    reason = ('<input name="reason" placeholder="reason (recorded)" size="28">'
              if confirm is not None else "")
    form = (f'<form method="post" action="{escape(path)}">{hidden}{reason}'
            f'<button type="submit" class="{css}">{escape(label)}</button></form>')
    if confirm is None:
        return form
    return f'<details class="confirm"><summary>{escape(confirm)}</summary>{form}</details>'


def notice(args: Mapping[str, str]) -> str:
    """The result of the last action (the UI redirects with ?done=...)."""
    done = args.get("done")
    return f'<p class="notice">{escape(done)}</p>' if done else ""


def error_page(message: str, *, target: str) -> str:
    """A page showing an error message."""
    return page("error", f'<p class="error">{escape(message)}</p>', target=target)


def table(css: str, headers: Sequence[str], rows: Sequence[str], *,
          numeric: frozenset[str] = frozenset(), empty: str = "nothing yet") -> str:
    """An HTML table of pre-rendered rows, or a note that there is nothing yet."""
    if not rows:
        return f'<p class="empty">{escape(empty)}</p>'
    head = "".join(f'<th{" class=num" if h in numeric else ""}>{escape(h)}</th>' for h in headers)
    return (f'<table class="{css}"><thead><tr>{head}</tr></thead>'
            f'<tbody>{"".join(rows)}</tbody></table>')


def dump(value: Any) -> str:
    """Any value as escaped text."""
    return escape(str(value))
