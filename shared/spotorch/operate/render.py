"""Rich renderings of run views for the terminal (colours only when it is one)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from spotorch.operate.times import duration

# Status -> Rich style; the UI uses the same families (spotorch.ui.pages.STATUS_CLASS).
STATUS_STYLE: Mapping[str, str] = {
    "QUEUED": "blue", "PENDING": "blue", "STARTING": "blue", "RUNNING": "cyan",
    "RECOVERING": "magenta", "CANCELLING": "yellow", "CANCELLED": "yellow",
    "SUCCEEDED": "green",
}
FAILED_STYLE = "bold red"


def status_style(status: str) -> str:
    return STATUS_STYLE.get(status, FAILED_STYLE if status.startswith("FAILED") else "")


def money(amount: float | None, currency: str = "USD") -> str:
    from spotorch.ledger import money as dollars

    if currency == "USD" or amount is None:
        return dollars(amount)
    return f"{amount:,.2f} {currency}"


def _pct(value: float | None) -> str:
    return "" if value is None else f" ({value:.0f}%)"


def _table(headers: Sequence[str], rows: Sequence[Sequence[Any]], *, elastic: str,
           right: frozenset[str] = frozenset()) -> Any:
    """A plain table whose columns keep their full width; only `elastic` gives way (cut with an
    ellipsis, one line per row) when the terminal is too narrow."""
    from rich.table import Table
    from rich.text import Text

    table = Table(box=None, header_style="bold", pad_edge=False)
    for i, name in enumerate(headers):
        cells = [name, *(c.plain if isinstance(c, Text) else str(c) for c in (r[i] for r in rows))]
        width = max(len(c) for c in cells)
        table.add_column(name, justify="right" if name in right else "left", no_wrap=True,
                         overflow="ellipsis", min_width=None if name == elastic else width,
                         max_width=60 if name == elastic else None)
    for row in rows:
        table.add_row(*row)
    return table


def runs_table(rows: Sequence[Mapping[str, Any]]) -> Any:
    from rich.text import Text

    cells = []
    for r in rows:
        step = f"{r['step']}/{r['total_steps']}" if r.get("total_steps") else str(r.get("step", 0))
        cells.append([r["run_id"], r["pipeline"], Text(r["status"], style=status_style(r["status"])),
                      r["created_at"], str(r["attempts"]), step, money(r["cost"], r["currency"]),
                      money(r["savings"], r["currency"]) + _pct(r.get("savings_pct")),
                      r.get("reason") or ""])
    return _table(("RUN", "PIPELINE", "STATUS", "CREATED", "ATTEMPTS", "STEP", "COST", "SAVED",
                   "REASON"), cells, elastic="REASON",
                  right=frozenset({"ATTEMPTS", "STEP", "COST", "SAVED"}))


def _kv(rows: Sequence[tuple[str, Any]]) -> Any:
    from rich.table import Table

    table = Table.grid(padding=(0, 2))
    table.add_column(style="bold", no_wrap=True)
    table.add_column(overflow="fold")
    for key, value in rows:
        table.add_row(key, value if not isinstance(value, str | None) else (value or "-"))
    return table


def _attempt_duration(a: Mapping[str, Any]) -> str:
    from spotorch_trainer.contract import parse_rfc3339

    if not a.get("started_at"):
        return "-"
    if not a.get("ended_at"):
        return "running"
    return duration(parse_rfc3339(a["ended_at"]) - parse_rfc3339(a["started_at"]))


def show_run(view: Mapping[str, Any]) -> list[Any]:
    """`spotorch show`: the run, its attempts, checkpoints, cost and history."""
    from rich.rule import Rule
    from rich.table import Table
    from rich.text import Text

    p, cost = view["progress"], view["cost"]
    steps = f"{p['step']}" + (f" / {p['total_steps']} ({p['fraction'] * 100:.0f}%)"
                              if p.get("total_steps") else "")
    if p.get("steps_per_s"):
        steps += f", {p['steps_per_s']:.2f} steps/s"
    ckpt = view.get("latest_checkpoint")
    head = _kv([
        ("run", view["run_id"]), ("pipeline", view["pipeline"]),
        ("status", Text(view["status"], style=status_style(view["status"]))
         + Text(f"  {view['status_meaning']}", style="dim")),
        ("reason", view.get("reason")), ("data", view["data_uri"]),
        ("snapshot", view.get("snapshot_id")), ("created", view["created_at"]),
        ("updated", view.get("updated_at")), ("deadline", view.get("deadline_at")),
        ("progress", steps),
        ("checkpoint", f"step {ckpt['step']}  {ckpt['uri']}" if ckpt else None),
        ("model", view["model_uri"] + ("" if view["model_ready"] else "  (not written yet)")),
        ("retry of", view.get("retry_of")),
        ("cost", money(cost["total"], cost["currency"])),
        ("saved", f"{money(cost['savings'], cost['currency'])}{_pct(cost['savings_pct'])} against "
                  f"standard VMs ({money(cost['standard_equivalent'], cost['currency'])})"),
        ("lost work", f"{cost['lost_steps']} steps redone after {cost['preemptions']} "
                      f"preemption(s), {money(cost['lost_cost'], cost['currency'])}"),
    ])
    costs = {a["attempt"]: a for a in cost["attempts"]}
    attempts = _table(
        ("#", "CAPACITY", "REGION", "STATE", "JOB", "STARTED", "ENDED", "RAN", "RESUMED",
         "REACHED", "COST", "END REASON"),
        [[str(a["attempt"]),
          Text(a["capacity"], style="green" if a["capacity"] == "spot" else "yellow"),
          a["region"], a["state"], a["job_id"] or "-", a.get("started_at") or "-",
          a.get("ended_at") or "-", _attempt_duration(a),
          "-" if a["resumed_from_step"] is None else str(a["resumed_from_step"]),
          "-" if a["progress_step"] is None else str(a["progress_step"]),
          money(costs.get(a["attempt"], {}).get("cost"), cost["currency"]),
          a.get("end_reason") or ""] for a in view["attempts"]],
        elastic="END REASON", right=frozenset({"RESUMED", "REACHED", "COST"}))
    history = Table(box=None, header_style="bold", pad_edge=False)
    history.add_column("AT", no_wrap=True, min_width=20)
    history.add_column("WHAT", min_width=16)
    history.add_column("WHY", overflow="fold")
    for h in view["history"]:
        history.add_row(h["at"], h["what"], h["reason"])
    return [head, Rule("attempts", align="left"), attempts, Rule("history", align="left"),
            history, Text(f"prices: {'; '.join(cost['basis'])}", style="dim")]


def change_lines(before: Mapping[str, Any] | None, after: Mapping[str, Any]) -> list[str]:
    """What changed between two views of a run, as lines for `spotorch watch`."""
    lines: list[str] = []
    if before is None or before["status"] != after["status"]:
        lines.append(f"status {after['status']}" + (f": {after['reason']}" if after.get("reason")
                                                      else ""))
    old = {a["attempt"]: a for a in (before or {}).get("attempts", [])}
    for a in after["attempts"]:
        was = old.get(a["attempt"])
        if was is None or was["state"] != a["state"]:
            resumed = f", resumed from step {a['resumed_from_step']}" \
                if a["resumed_from_step"] is not None and was is None else ""
            end = f": {a['end_reason']}" if a.get("end_reason") else ""
            lines.append(f"attempt {a['attempt']} ({a['capacity']}, {a['region']}) "
                         f"{a['state']}{resumed}{end}")
    return lines
