"""Line charts as SVG, with their scales: a run's metrics by step, a sweep's trials' metric.

Pure: series of (x, y) points in, SVG text out. Every mark has a class (and the series a
data-series attribute) so tests and people with a DOM inspector find them.
"""

from __future__ import annotations

import math
import textwrap
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from html import escape
from typing import Any

WIDTH = 560
HEIGHT = 220
LEFT, RIGHT, TOP, BOTTOM = 64, 16, 26, 34
LEGEND_W = 170
LEGEND_CHARS = 24  # characters of a legend line at 11 px in LEGEND_W
PALETTE = ("#1d4ed8", "#e08a1e", "#1f9e89", "#d62839", "#7c3aed", "#0f766e", "#a16207",
           "#be185d")

Point = tuple[float, float]


@dataclass(frozen=True)
class Series:
    """One line: its name, its points, and how it is drawn."""

    name: str
    points: Sequence[Point]
    dashed: bool = False  # e.g. a trial stopped early
    bold: bool = False  # e.g. the best trial


def nice_ticks(low: float, high: float, count: int = 5) -> list[float]:
    """Round tick values covering [low, high] (1, 2 or 5 times a power of ten apart)."""
    if not (math.isfinite(low) and math.isfinite(high)):
        return [0.0]
    if high <= low:
        high = low + (abs(low) or 1.0)
    raw = (high - low) / max(count - 1, 1)
    magnitude = 10 ** math.floor(math.log10(raw))
    step = next(m * magnitude for m in (1, 2, 5, 10) if m * magnitude >= raw)
    first = math.floor(low / step) * step
    ticks = []
    value = first
    while value <= high + step * 1e-9:
        ticks.append(round(value, 12))
        value += step
    if ticks[-1] < high:
        ticks.append(round(value, 12))
    return ticks


def tick_label(value: float) -> str:
    """An axis label: short, in scientific notation for very large or small values."""
    if value == 0:
        return "0"
    if abs(value) >= 1e5 or abs(value) < 1e-3:
        return f"{value:.2g}"
    return f"{value:.4g}"


def line_chart(series: Sequence[Series], *, title: str, x_label: str, y_label: str,
               marks: Sequence[tuple[float, str]] = (), css_class: str = "chart") -> str:
    """A line chart with both axes scaled and labelled; `marks` are vertical lines at x
    (e.g. where an attempt began), each with its label."""
    points = [p for s in series for p in s.points]
    xs = [x for x, _ in points] or [0.0, 1.0]
    ys = [y for _, y in points] or [0.0, 1.0]
    x_ticks, y_ticks = nice_ticks(min(xs), max(xs)), nice_ticks(min(ys), max(ys))
    x0, x1, y0, y1 = x_ticks[0], x_ticks[-1], y_ticks[0], y_ticks[-1]
    right = LEGEND_W if len(series) > 1 else RIGHT  # the legend beside the plot, not on it

    def sx(x: float) -> float:
        return LEFT + (x - x0) / ((x1 - x0) or 1) * (WIDTH - LEFT - right)

    def sy(y: float) -> float:
        return HEIGHT - BOTTOM - (y - y0) / ((y1 - y0) or 1) * (HEIGHT - TOP - BOTTOM)

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" class="{escape(css_class)}" '
           f'viewBox="0 0 {WIDTH} {HEIGHT}" width="100%" role="img" '
           f'aria-label="{escape(title)}">',
           '<style>.t{font:600 12px sans-serif;fill:#0f172a}.k{font:11px sans-serif;'
           'fill:#475569}.g{stroke:#e2e8f0}.a{stroke:#94a3b8}.m{stroke:#94a3b8;'
           'stroke-dasharray:3 3}</style>',
           f'<text x="{LEFT}" y="16" class="t">{escape(title)}</text>']
    for tick in y_ticks:
        y = sy(tick)
        out.append(f'<line x1="{LEFT}" y1="{y:.1f}" x2="{WIDTH - right}" y2="{y:.1f}" class="g"/>'
                   f'<text x="{LEFT - 6}" y="{y + 4:.1f}" class="k ytick" text-anchor="end">'
                   f'{tick_label(tick)}</text>')
    for tick in x_ticks:
        x = sx(tick)
        out.append(f'<line x1="{x:.1f}" y1="{TOP}" x2="{x:.1f}" y2="{HEIGHT - BOTTOM}" '
                   f'class="g"/><text x="{x:.1f}" y="{HEIGHT - BOTTOM + 14}" class="k xtick" '
                   f'text-anchor="middle">{tick_label(tick)}</text>')
    out.append(f'<line x1="{LEFT}" y1="{HEIGHT - BOTTOM}" x2="{WIDTH - right}" '
               f'y2="{HEIGHT - BOTTOM}" class="a"/><line x1="{LEFT}" y1="{TOP}" x2="{LEFT}" '
               f'y2="{HEIGHT - BOTTOM}" class="a"/>')
    out.append(f'<text x="{(LEFT + WIDTH - right) / 2:.0f}" y="{HEIGHT - 4}" class="k" '
               f'text-anchor="middle">{escape(x_label)}</text>'
               f'<text x="12" y="{(TOP + HEIGHT - BOTTOM) / 2:.0f}" class="k" '
               f'text-anchor="middle" transform="rotate(-90 12 {(TOP + HEIGHT - BOTTOM) / 2:.0f})">'
               f'{escape(y_label)}</text>')
    for x, label in marks:
        near_end = sx(x) > WIDTH - right - 70  # the label to the left of its line, inside
        out.append(f'<g class="mark"><line x1="{sx(x):.1f}" y1="{TOP}" x2="{sx(x):.1f}" '
                   f'y2="{HEIGHT - BOTTOM}" class="m"/><text x="{sx(x) + (-3 if near_end else 3):.1f}" '
                   f'y="{TOP + 10}" class="k" text-anchor="{"end" if near_end else "start"}">'
                   f'{escape(label)}</text></g>')
    for i, s in enumerate(series):
        colour = PALETTE[i % len(PALETTE)]
        d = " ".join(f"{'M' if j == 0 else 'L'}{sx(x):.1f},{sy(y):.1f}"
                     for j, (x, y) in enumerate(s.points))
        dash = ' stroke-dasharray="5 4"' if s.dashed else ""
        width = 3 if s.bold else 1.6
        dots = "".join(f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="2" fill="{colour}"/>'
                       for x, y in s.points) if len(s.points) <= 40 else ""
        out.append(f'<g class="series" data-series="{escape(s.name)}"><path d="{d}" fill="none" '
                   f'stroke="{colour}" stroke-width="{width}"{dash}/>{dots}'
                   f'<title>{escape(s.name)}</title></g>')
    bottom = HEIGHT
    if len(series) > 1:
        # Whole names, wrapped to the legend's width (a cut name dropped a trial's parameter);
        # the drawing grows downwards when the legend is taller than the plot.
        y = TOP + 4
        for i, s in enumerate(series):
            lines = textwrap.wrap(s.name, LEGEND_CHARS, break_on_hyphens=False) or [""]
            text = "".join(f'<tspan x="{WIDTH - right + 24}" dy="{0 if j == 0 else 13}">'
                           f'{escape(line)}</tspan>' for j, line in enumerate(lines))
            out.append(f'<g class="legend"><rect x="{WIDTH - right + 10}" y="{y - 8}" '
                       f'width="10" height="3" fill="{PALETTE[i % len(PALETTE)]}"/>'
                       f'<text x="{WIDTH - right + 24}" y="{y - 2}" class="k">{text}'
                       f'<title>{escape(s.name)}</title></text></g>')
            y += 13 * len(lines) + 4
        bottom = max(HEIGHT, y)
    out.append("</svg>")
    if bottom != HEIGHT:
        out[0] = out[0].replace(f'viewBox="0 0 {WIDTH} {HEIGHT}"', f'viewBox="0 0 {WIDTH} {bottom}"')
    return "".join(out)


def metric_charts(history: Sequence[Mapping[str, Any]]) -> list[str]:
    """One chart per metric of a run's metric history (the view's metric_history), with a mark
    where each later attempt began."""
    names = list(dict.fromkeys(k for sample in history for k in sample["values"]))
    starts: dict[int, float] = {}
    for sample in history:
        starts.setdefault(int(sample["attempt"]), float(sample["step"]))
    marks = [(step, f"attempt {n}") for n, step in sorted(starts.items()) if n > 1]
    return [line_chart([Series(name, [(float(s["step"]), float(s["values"][name]))
                                      for s in history if name in s["values"]])],
                       title=name, x_label="step", y_label=name, marks=marks,
                       css_class="chart metric")
            for name in names]
