"""A sweep's trade-off as SVG scatter plots: quality against cost and against latency.

Each succeeded trial is a point (class `point`, data-trial); the trials on the Pareto front are
filled (`front`), those missing a constraint hollow and grey (`misses`), the chosen one ringed
(`chosen`) and labelled; a constraint on either axis is a dashed line (`limit`). Pure: the
sweep's view in, HTML out.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from html import escape
from typing import Any

from spotorch.operate.ui.charts import BOTTOM, HEIGHT, LEFT, TOP, WIDTH, nice_ticks, tick_label

RIGHT = 24
FRONT, OTHER, MISSES, CHOSEN = "#1d4ed8", "#64748b", "#cbd5e1", "#d62839"
LATENCY = "latency_p95_ms"
COST = "cost"


def _values(trial: Mapping[str, Any], quality: str) -> dict[str, float]:
    values = {k: float(v) for k, v in (trial.get("metrics") or {}).items()
              if isinstance(v, int | float)}
    values[COST] = float(trial["cost"])
    if isinstance(trial.get("metric"), int | float):
        values[quality] = float(trial["metric"])
    return values


def scatter(points: Sequence[tuple[int, float, float, str]], *, title: str, x_label: str,
            y_label: str, x_limits: Mapping[str, float], y_limits: Mapping[str, float],
            css_class: str) -> str:
    """One scatter plot: (trial, x, y, kind) points, kind a space-separated class list."""
    xs = [x for _, x, _, _ in points] + list(x_limits.values())
    ys = [y for _, _, y, _ in points] + list(y_limits.values())
    x_ticks = nice_ticks(min(xs, default=0.0), max(xs, default=1.0))
    y_ticks = nice_ticks(min(ys, default=0.0), max(ys, default=1.0))
    x0, x1, y0, y1 = x_ticks[0], x_ticks[-1], y_ticks[0], y_ticks[-1]

    def sx(x: float) -> float:
        return LEFT + (x - x0) / ((x1 - x0) or 1) * (WIDTH - LEFT - RIGHT)

    def sy(y: float) -> float:
        return HEIGHT - BOTTOM - (y - y0) / ((y1 - y0) or 1) * (HEIGHT - TOP - BOTTOM)

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" class="{escape(css_class)}" '
           f'viewBox="0 0 {WIDTH} {HEIGHT}" width="100%" role="img" aria-label="{escape(title)}">',
           '<style>.t{font:600 12px sans-serif;fill:#0f172a}.k{font:11px sans-serif;'
           'fill:#475569}.g{stroke:#e2e8f0}.a{stroke:#94a3b8}.limit{stroke:#d62839;'
           'stroke-dasharray:5 4}</style>',
           f'<text x="{LEFT}" y="16" class="t">{escape(title)}</text>']
    for tick in y_ticks:
        out.append(f'<line x1="{LEFT}" y1="{sy(tick):.1f}" x2="{WIDTH - RIGHT}" '
                   f'y2="{sy(tick):.1f}" class="g"/><text x="{LEFT - 6}" y="{sy(tick) + 4:.1f}" '
                   f'class="k ytick" text-anchor="end">{tick_label(tick)}</text>')
    for tick in x_ticks:
        out.append(f'<line x1="{sx(tick):.1f}" y1="{TOP}" x2="{sx(tick):.1f}" '
                   f'y2="{HEIGHT - BOTTOM}" class="g"/><text x="{sx(tick):.1f}" '
                   f'y="{HEIGHT - BOTTOM + 14}" class="k xtick" text-anchor="middle">'
                   f'{tick_label(tick)}</text>')
    out.append(f'<line x1="{LEFT}" y1="{HEIGHT - BOTTOM}" x2="{WIDTH - RIGHT}" '
               f'y2="{HEIGHT - BOTTOM}" class="a"/><line x1="{LEFT}" y1="{TOP}" x2="{LEFT}" '
               f'y2="{HEIGHT - BOTTOM}" class="a"/>'
               f'<text x="{(LEFT + WIDTH - RIGHT) / 2:.0f}" y="{HEIGHT - 4}" class="k" '
               f'text-anchor="middle">{escape(x_label)}</text>'
               f'<text x="12" y="{(TOP + HEIGHT - BOTTOM) / 2:.0f}" class="k" text-anchor="middle" '
               f'transform="rotate(-90 12 {(TOP + HEIGHT - BOTTOM) / 2:.0f})">{escape(y_label)}</text>')
    for side, value in x_limits.items():
        out.append(f'<g class="limit-x" data-limit="{side} {value:g}"><line x1="{sx(value):.1f}" '
                   f'y1="{TOP}" x2="{sx(value):.1f}" y2="{HEIGHT - BOTTOM}" class="limit"/>'
                   f'<text x="{sx(value) + 3:.1f}" y="{TOP + 10}" class="k">{side} {value:g}'
                   f'</text></g>')
    for side, value in y_limits.items():
        out.append(f'<g class="limit-y" data-limit="{side} {value:g}"><line x1="{LEFT}" '
                   f'y1="{sy(value):.1f}" x2="{WIDTH - RIGHT}" y2="{sy(value):.1f}" '
                   f'class="limit"/><text x="{WIDTH - RIGHT - 3}" y="{sy(value) - 3:.1f}" '
                   f'class="k" text-anchor="end">{side} {value:g}</text></g>')
    for trial, x, y, kind in sorted(points, key=lambda p: "chosen" in p[3]):  # the choice on top
        classes = set(kind.split())
        fill = MISSES if "misses" in classes else FRONT if "front" in classes else OTHER
        hollow = "misses" in classes
        ring = (f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="9" fill="none" stroke="{CHOSEN}" '
                f'stroke-width="2"/><text x="{sx(x) + 11:.1f}" y="{sy(y) - 8:.1f}" class="k">'
                f'chosen</text>' if "chosen" in classes else "")
        out.append(f'<g class="point {escape(kind)}" data-trial="{trial}">'
                   f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="5" '
                   f'fill="{"white" if hollow else fill}" stroke="{fill}" stroke-width="2"/>'
                   f'{ring}<text x="{sx(x) + 7:.1f}" y="{sy(y) + 14:.1f}" class="k">{trial}</text>'
                   f'<title>trial {trial}: {escape(x_label)} {x:.4g}, {escape(y_label)} {y:.4g}'
                   f'</title></g>')
    out.append("</svg>")
    return "".join(out)


def tradeoff_section(view: Mapping[str, Any]) -> str:
    """The sweep page's trade-off: quality against cost and against latency (when the trials
    report it), the front and the choice marked, the constraints drawn, and why."""
    made = view.get("trade_off")
    if not made or (len(made["objectives"]) < 2 and not made["constraints"]):
        return ""
    quality = made["objectives"][0]["name"]
    front, chosen = set(made["pareto"]), made["chosen"]
    misses = {int(k) for k in made.get("misses") or {}}
    trials = [(t["trial"], _values(t, quality)) for t in view["trials"]
              if t["status"] == "SUCCEEDED"]

    def kind(number: int) -> str:
        return " ".join(k for k, on in (("front", number in front), ("misses", number in misses),
                                        ("chosen", number == chosen)) if on) or "other"

    def bounds(name: str) -> dict[str, float]:
        bound = made["constraints"].get(name) or {}
        return {k: float(v) for k, v in bound.items() if isinstance(v, int | float)}

    charts = []
    for axis, label in ((COST, "cost (USD)"), (LATENCY, "p95 latency (ms per request)")):
        pts = [(n, v[axis], v[quality], kind(n)) for n, v in trials
               if axis in v and quality in v and all(map(math.isfinite, (v[axis], v[quality])))]
        if not pts:
            continue
        charts.append(scatter(pts, title=f"{quality} against {label}", x_label=label,
                              y_label=quality, x_limits=bounds(axis), y_limits=bounds(quality),
                              css_class=f"chart tradeoff tradeoff-{axis.replace('_', '-')}"))
    why = (f'<p class="choice"><b>{"chosen: trial " + str(chosen) if chosen is not None else "chosen: none"}'
           f'</b>: {escape(str(made["why"]))}</p>'
           f'<p class="front">Pareto front on {escape(", ".join(o["name"] for o in made["objectives"]))}'
           f': trials {escape(", ".join(str(k) for k in made["pareto"]) or "none")} '
           f'(search {escape(made["search"])}); filled: on the front, hollow: misses a '
           f'constraint, ringed: chosen</p>')
    return (f'<section class="tradeoff"><h2>Trade-off</h2>{why}'
            f'<div class="charts">{"".join(charts)}</div></section>')
