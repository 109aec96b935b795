"""Rich renderings of run and sweep views for the terminal (colours only when it is one)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from spotorch.core.provenance import machines_text
from spotorch.operate.times import duration

# Status -> Rich style; the UI uses the same families (spotorch.operate.ui.pages.STATUS_CLASS).
STATUS_STYLE: Mapping[str, str] = {
    "QUEUED": "blue", "PENDING": "blue", "STARTING": "blue", "RUNNING": "cyan",
    "RECOVERING": "magenta", "CANCELLING": "yellow", "CANCELLED": "yellow",
    "SUCCEEDED": "green",
}
FAILED_STYLE = "bold red"


def status_style(status: str) -> str:
    """The Rich style of a status: its own, the failed style for any FAILED one, else none."""
    return STATUS_STYLE.get(status, FAILED_STYLE if status.startswith("FAILED") else "")


def money(amount: float | None, currency: str = "USD") -> str:
    """An amount in its currency, dollars as the core writes them."""
    from spotorch.core.cost import money as dollars

    if currency == "USD" or amount is None:
        return dollars(amount)
    return f"{amount:,.2f} {currency}"


def _pct(value: float | None) -> str:
    return "" if value is None else f" ({value:.0f}%)"


class Section:
    """A section's title: a rule across the terminal on a terminal; into a pipe or a file, a short
    one (a rule as wide as PIPE_WIDTH padded every `show` to 220 columns)."""

    def __init__(self, title: str) -> None:
        self.title = title

    def __rich_console__(self, console: Any, options: Any) -> Any:
        from rich.rule import Rule
        from rich.text import Text

        if console.is_terminal:
            yield Rule(self.title, align="left")
        else:
            yield Text(f"── {self.title} ──", style="bold")


def _table(headers: Sequence[str], rows: Sequence[Sequence[Any]], *, elastic: str,
           right: frozenset[str] = frozenset(), fold: bool = False) -> Any:
    """A plain table whose columns keep their full width; only `elastic` gives way (cut with an
    ellipsis, one line per row) when the terminal is too narrow, or with `fold`, wraps onto more
    lines (for text that must be read whole, such as why a candidate is unfit)."""
    from rich.table import Table
    from rich.text import Text

    table = Table(box=None, header_style="bold", pad_edge=False)
    for i, name in enumerate(headers):
        cells = [name, *(c.plain if isinstance(c, Text) else str(c) for c in (r[i] for r in rows))]
        width = max(len(c) for c in cells)
        folds = fold and name == elastic
        table.add_column(name, justify="right" if name in right else "left", no_wrap=not folds,
                         overflow="fold" if folds else "ellipsis",
                         min_width=None if name == elastic else width,
                         max_width=60 if name == elastic and not folds else None)
    for row in rows:
        table.add_row(*row)
    return table


def runs_table(rows: Sequence[Mapping[str, Any]]) -> Any:
    """The `spotorch runs` table of run rows."""
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


def _metric(value: Any) -> str:
    return f"{value:.6g}" if isinstance(value, float) else str(value)


def show_run(view: Mapping[str, Any]) -> list[Any]:
    """`spotorch show`: the run, its attempts, checkpoints, cost and history."""
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
        ("metrics" if view.get("active", True) else "final metrics",
         ", ".join(f"{k} {_metric(v)}" for k, v in sorted(p.get("metrics", {}).items())) or None),
        ("checkpoint", f"step {ckpt['step']}  {ckpt['uri']}" if ckpt else None),
        ("model", view["model_uri"] + ("" if view["model_ready"] else "  (not written yet)")),
        ("retry of", view.get("retry_of")),
        ("rerun of", view.get("rerun_of")),
        ("cost", cost["summary"]),
        ("saved", f"{money(cost['savings'], cost['currency'])}{_pct(cost['savings_pct'])} against "
                  f"standard VMs ({money(cost['standard_equivalent'], cost['currency'])})"
         if cost.get("savings") is not None else
         f"none claimed ({_no_result(cost)}); standard VMs would have cost "
         f"{money(cost['standard_equivalent'], cost['currency'])} for the same work"),
        ("lost work", f"{cost['lost_steps']} steps redone after {cost['preemptions']} "
                      f"preemption(s), {money(cost['lost_cost'], cost['currency'])}"
         if cost.get("preemptions") else None),
        ("checkpoints", advice_text(view["checkpoint_advice"])),
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
          (a.get("end_reason") or "") + ("; during start-up, no checkpoint yet"
                                          if a.get("startup_loss") else "")]
         for a in view["attempts"]],
        elastic="END REASON", right=frozenset({"RESUMED", "REACHED", "COST"}))
    history = Columns3(("AT", "WHAT", "WHY"),
                       [(h["at"] or "", h["what"], h["reason"]) for h in view["history"]])
    hardware = _hardware_table(view.get("hardware"))
    preprocess = _preprocess_lines(view.get("preprocess"), cost["currency"])
    return [head, *provenance_lines(view.get("provenance")), *preprocess, *hardware,
            Section("attempts"), attempts,
            *error_tails(view["attempts"]),
            *[Text(a["startup_loss"], style="yellow", overflow="fold")
              for a in view["attempts"] if a.get("startup_loss")],
            Section("history"), history,
            Text(f"prices: {'; '.join(cost['basis'])}", style="dim")]


class Columns3:
    """Three columns whose last one wraps under itself, drawn without Rich's table layout (a
    run's history has hundreds of rows: a Table measured them for a fifth of a second)."""

    def __init__(self, headers: tuple[str, str, str],
                 rows: Sequence[tuple[str, str, str]]) -> None:
        self.headers, self.rows = headers, rows

    def __rich_console__(self, console: Any, options: Any) -> Any:
        import textwrap

        from rich.text import Text

        first = max((len(r[0]) for r in (self.headers, *self.rows)), default=0)
        second = min(44, max((len(r[1]) for r in (self.headers, *self.rows)), default=0))
        indent = first + second + 4
        room = max(20, options.max_width - indent)
        yield Text(f"{self.headers[0]:<{first}}  {self.headers[1]:<{second}}  "
                   f"{self.headers[2]}", style="bold")
        for at, what, why in self.rows:
            lines = textwrap.wrap(why, room) or [""]
            text = f"{at:<{first}}  {what:<{second}}  {lines[0]}"
            text += "".join(f"\n{' ' * indent}{line}" for line in lines[1:])
            yield Text(text, no_wrap=True, overflow="fold")


def _no_result(cost: Mapping[str, Any]) -> str:
    """Why the ledger claims no saving (savings only for a run that produced its result)."""
    return {"running": "still running", "no_result": "it produced no result"}.get(
        str(cost.get("result")), "no result yet")


def error_tails(attempts: Sequence[Mapping[str, Any]]) -> list[Any]:
    """Each failed attempt's last stderr lines, as its replicas wrote them."""
    from rich.text import Text

    parts: list[Any] = []
    for a in attempts:
        if a.get("error_tail"):
            parts.append(Text(f"attempt {a['attempt']}'s error (the last lines of its stderr):",
                              style="bold"))
            parts.append(Text("\n".join(f"  | {line}" for line in a["error_tail"]),
                              style="red", overflow="fold"))
    return parts


def _seconds(value: float) -> str:
    return f"{value:.1f}s" if value < 10 else duration(value)


def advice_text(advice: Mapping[str, Any]) -> str:
    """The checkpoint advice in one line: the verdict, what it rests on, what it still lacks."""
    parts = ((advice.get("interval_s"), "every {}"),
             (advice.get("checkpoint_cost_s"), "{} to write one"),
             (advice.get("mtbf_s"), "{} on Spot per preemption"),
             (advice.get("optimal_s"),
              "optimum every {} (Young/Daly: sqrt(2 x write time x time per preemption))"))
    facts = "; ".join(text.format(_seconds(value)) for value, text in parts if value is not None)
    if advice.get("missing"):
        return (f"{advice['verdict']}: needs {', '.join(advice['missing'])}"
                + (f" ({facts})" if facts else ""))
    return f"{advice['verdict']}: {facts}"


def _num(value: Any, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _preprocess_lines(step: Mapping[str, Any] | None, currency: str) -> list[Any]:
    """The run's preprocess step (issue 31): its Dataflow job, the cache, its output, or nothing."""
    if not step:
        return []

    job = "-" if step.get("cache_hit") else (
        f"{step.get('job_name')} ({step.get('job_id') or 'not created yet'}), launch "
        f"{step.get('launches')}")
    return [Section("preprocess"), _kv([
        ("phase", f"{step['phase']}" + (f"  {step['state']}" if step.get("state") else "")),
        ("cache", f"hit: reused {step['cache_key']}" if step.get("cache_hit")
         else f"miss: key {step['cache_key']}"),
        ("dataproc batch" if step.get("kind") == "spark" else "dataflow job", job),
        ("output", step.get("output_uri")),
        ("cost", money(step.get("cost"), currency)),
        ("error", f"{step.get('failure_class')}: {step.get('error')}"
         if step.get("error") else None)])]


def provenance_lines(prov: Mapping[str, Any] | None) -> list[Any]:
    """What the run trained on and with (issue 30): data, code, pipeline, seed, hardware."""
    if not prov:
        return []

    data, code = prov.get("data") or {}, prov.get("code") or {}
    pipeline = prov.get("pipeline") or {}
    objects = data.get("objects") or []
    if data.get("pinned"):
        listed = ", ".join(f"{o['name']}#{o['generation']}" for o in objects[:3])
        more = data.get("count", 0) - min(len(objects), 3)
        what = f"{data.get('count', 0)} object(s) at their generations" + \
            (f": {listed}" if listed else "") + (f" (+{more} more)" if more > 0 else "") + \
            (f"  manifest {data['manifest_uri']}" if data.get("manifest_uri") else "")
    else:
        what = f"{data.get('uri')} (not pinned: no object generations recorded)"
    if data.get("bigquery"):
        bq = data["bigquery"]
        what += f"  bigquery {', '.join(map(str, bq.get('tables') or []))} at " \
                f"{bq.get('snapshot_time')}"
        if bq.get("query_sha256"):
            what += f" (query sha256 {str(bq['query_sha256'])[:12]})"
    pools = []
    for pool in code.get("pools") or ():
        if pool.get("kind") == "python_package":
            hashes = ",".join(h or "?" for h in pool.get("package_hashes") or ())
            pools.append(f"package {hashes} on {pool.get('executor_image_uri')} "
                         f"(-m {pool.get('python_module')})")
        else:
            pools.append(str(pool.get("image_digest") or f"{pool.get('image_uri')}"))
    pinned = "pinned" if code.get("pinned") else \
        "NOT pinned: an image tag can move, a rerun may run other code"
    machines = machines_text(prov.get("hardware"))
    changed = "  (changed since its origin)" if pipeline.get("changed") else ""
    return [Section("provenance"), _kv([
        ("data", what),
        ("code", f"{str(code.get('hash', ''))[:16]}  {pinned}"),
        ("pools", "; ".join(pools) or None),
        ("pipeline", f"{pipeline.get('name')} {str(pipeline.get('hash', ''))[:16]}{changed}"),
        ("params", params_text(prov.get("params") or {}) or None),
        ("seed", str(prov.get("seed"))),
        ("hardware", machines or None),
        ("rerun of", prov.get("rerun_of")),
    ])]


def _hardware_table(choice: Mapping[str, Any] | None) -> list[Any]:
    """The hardware candidates the run chose among (issue 19), or nothing."""
    if not choice:
        return []
    from rich.text import Text

    rows = [[r["candidate"] + (" *" if r.get("chosen") else ""), r.get("shape", ""),
             _num(r.get("steps_per_s"), ".2f"), _num(r.get("expected_hours"), ".2f"),
             _num(r.get("spot_cost"), ".4f"), _num(r.get("standard_cost"), ".4f"),
             ("yes" if r.get("meets_deadline") is not False else "misses deadline")
             if r.get("fit") else "no", r.get("reason", "")]
            for r in choice.get("rows", ())]
    table = _table(("CANDIDATE", "SHAPE", "STEPS/S", "HOURS", "SPOT", "STANDARD", "FITS", "WHY"),
                   rows, elastic="WHY", right=frozenset({"STEPS/S", "HOURS", "SPOT", "STANDARD"}),
                   fold=True)
    lines = [Section("hardware"), table,
             Text(f"chosen: {choice.get('reason', '')}", style="dim")]
    if choice.get("warning"):
        lines.append(Text(f"warning: {choice['warning']}", style="yellow"))
    return lines


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
            if a.get("error_tail") and (was is None or not was.get("error_tail")):
                lines.append(f"attempt {a['attempt']} error (last lines of its stderr):")
                lines += [f"  | {line}" for line in a["error_tail"]]
    return lines


# ---------------------------------------------------------------- sweeps

def metric_text(name: str | None, value: float | None) -> str:
    """A metric value with its name when the pipeline is known ("loss 0.2000")."""
    if value is None:
        return "-"
    return f"{name} {value:.4g}" if name else f"{value:.4g}"


def params_text(params: Mapping[str, Any]) -> str:
    """A trial's parameters as name=value pairs on one line."""
    return " ".join(f"{k}={v}" for k, v in params.items())


def sweeps_table(rows: Sequence[Mapping[str, Any]]) -> Any:
    """The `spotorch sweeps` table of sweep rows."""
    from rich.text import Text

    cells = [[r["sweep_id"], r["pipeline"], Text(r["status"], style=status_style(r["status"])),
              r["created_at"], f"{r['trials_done']}/{r['trials_total']}",
              "-" if r["best_trial"] is None else str(r["best_trial"]),
              metric_text(r.get("metric"), r.get("best_metric")), r.get("model_name") or ""]
             for r in rows]
    return _table(("SWEEP", "PIPELINE", "STATUS", "CREATED", "TRIALS", "BEST", "METRIC", "MODEL"),
                  cells, elastic="MODEL", right=frozenset({"TRIALS", "BEST"}))


def show_sweep(view: Mapping[str, Any]) -> list[Any]:
    """`spotorch sweep`: the sweep, its trials (the best marked *), the model, its history."""
    from rich.table import Table
    from rich.text import Text

    best = view.get("best")
    goal = f" ({view['goal']})" if view.get("goal") else ""
    head = _kv([
        ("sweep", view["sweep_id"]), ("pipeline", view["pipeline"]),
        ("status", Text(view["status"], style=status_style(view["status"]))),
        ("reason", view.get("end_reason")), ("data", view["data_uri"]),
        ("created", view["created_at"]), ("updated", view.get("updated_at")),
        ("metric", (view.get("metric") or "unknown (pipeline not loaded)") + goal),
        ("trials", f"{view['trials_done']}/{view['trials_total']} ended, "
                   f"{view['stopped_early']} stopped early"),
        ("best", f"trial {best['trial']} ({best['trial_run_id']}): "
                 f"{metric_text(view.get('metric'), best['metric'])}, "
                 f"{params_text(best['params'])}" if best else None),
        ("model", view.get("model_name")),
        ("cost", f"{money(view['cost_estimate'])} (estimate at list prices)"),
    ])
    trials = _table(
        ("#", "RUN", "STATUS", "PARAMS", "METRIC", "STEP", "EARLY", "PREEMPTIONS", "COST"),
        [[str(t["trial"]) + (" *" if t["best"] else ""), t["trial_run_id"],
          Text(t["status"], style=status_style(t["status"])), params_text(t["params"]),
          _num(t["metric"], ".4g"), _num(t["step"], "d"),
          "stopped early" if t["stopped_early"] else "-", str(t["preemptions"]),
          money(t["cost"])] for t in view["trials"]],
        elastic="PARAMS", right=frozenset({"METRIC", "STEP", "PREEMPTIONS", "COST"}))
    history = Table(box=None, header_style="bold", pad_edge=False)
    history.add_column("AT", no_wrap=True, min_width=20)
    history.add_column("WHAT", overflow="fold")
    for h in view["history"]:
        history.add_row(h["at"], h["what"])
    from spotorch.operate.render_tradeoff import trade_off_parts

    return [head, Section("trials"), trials, *trade_off_parts(view), Section("history"), history]


# ---------------------------------------------------------------- data arrival

SNAPSHOT_STYLE: Mapping[str, str] = {"open": "blue", "complete": "yellow", "started": "green"}


def snapshots_table(rows: Sequence[Mapping[str, Any]]) -> Any:
    """`spotorch snapshots`: one line per snapshot folder, what it waits for or what it started."""
    from rich.text import Text

    cells = [[r["data_uri"], r["pipeline"], Text(r["state"], style=SNAPSHOT_STYLE.get(r["state"], "")),
              r.get("last_seen") or "-", str(r["objects"]), r["summary"]] for r in rows]
    return _table(("SNAPSHOT", "PIPELINE", "STATE", "LAST OBJECT", "OBJECTS", "WHAT"), cells,
                  elastic="WHAT", right=frozenset({"OBJECTS"}), fold=True)


def unmatched_lines(rows: Sequence[Mapping[str, Any]]) -> list[Any]:
    """Each folder of uploads that matched no pipeline: its objects and, per pipeline, why."""
    from rich.text import Text

    if not rows:
        return []
    parts: list[Any] = [Section("uploads that matched no pipeline")]
    for r in rows:
        alerted = f", alerted {r['alerted_at']}" if r.get("alerted_at") else ""
        parts.append(Text(f"{r['uri']}  ({r['state']}; last object {r.get('last_seen')}{alerted})",
                          style="bold"))
        for obj in r["objects"]:
            parts.append(Text(f"  {obj['name']}"))
            for m in obj["misses"]:
                parts.append(Text(f"    {m.get('pipeline')}: {m.get('text')}", style="dim",
                                  overflow="fold"))
        if r.get("more_objects"):
            parts.append(Text("  (and more objects)", style="dim"))
    return parts
