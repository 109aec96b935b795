"""`spotorch sweep`: the trade-off of a sweep, the Pareto front and why the chosen trial was chosen."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def _value(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, int | float) else "-"


def trade_off_parts(view: Mapping[str, Any]) -> list[Any]:
    """Rich renderables: each trial on the objectives (front and choice marked), the constraints
    each misses, and the choice's reason; nothing for a sweep of one objective without
    constraints (its best trial says it all)."""
    from rich.rule import Rule
    from rich.table import Table
    from rich.text import Text

    made = view.get("trade_off")
    if not made or (len(made["objectives"]) < 2 and not made["constraints"]):
        return []
    names = [o["name"] for o in made["objectives"]]
    limits = {k: v for k, v in made["constraints"].items() if k not in names}
    table = Table(box=None, header_style="bold", pad_edge=False)
    table.add_column("#", no_wrap=True)
    for name in [*names, *limits]:
        goal = next((o["goal"] for o in made["objectives"] if o["name"] == name), "")
        bound = made["constraints"].get(name, {})
        said = [("↑" if goal == "maximize" else "↓") if goal else ""] + [
            f"{k} {v:g}" for k, v in bound.items()]
        table.add_column(f"{name} ({', '.join(s for s in said if s)})", justify="right")
    table.add_column("FRONT")
    table.add_column("CONSTRAINTS", overflow="fold")
    misses = made.get("misses") or {}
    for trial in view["trials"]:
        number = trial["trial"]
        if trial["status"] != "SUCCEEDED":
            continue
        values = {**(trial.get("metrics") or {}), "cost": trial["cost"]}
        if trial.get("metric") is not None and names:
            values[names[0]] = trial["metric"]
        mark = " ←" if number == made["chosen"] else ""
        table.add_row(f"{number}{mark}", *[_value(values.get(n)) for n in [*names, *limits]],
                      "yes" if number in made["pareto"] else "-",
                      Text("; ".join(misses.get(str(number), ())) or "met",
                           style="red" if str(number) in misses else "green"))
    chosen = made["chosen"]
    why = Text(("chosen: trial " + str(chosen) + ": " if chosen is not None else "chosen: none: ")
               + str(made["why"]), style="bold")
    front = Text(f"Pareto front on {', '.join(names)}: trials "
                 f"{', '.join(str(k) for k in made['pareto']) or 'none'}"
                 f" (search {made['search']})")
    return [Rule("trade-off", align="left"), table, front, why]
