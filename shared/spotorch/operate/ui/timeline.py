"""A run's timeline as SVG: one lane per attempt, steps against the deadline, cost accumulating.

Pure: a Run, its ledger and the time in, SVG text out. Classes and data- attributes name every
mark so tests (and people with a DOM inspector) can find them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from html import escape

from spotorch.core.cost import Ledger, money
from spotorch.core.model import Attempt, AttemptState, FailureClass, Run
from spotorch.core.pipeline import Capacity
from spotorch.operate.times import duration

WIDTH = 1000
LEFT = 120  # lane labels
RIGHT = 24
LANE_H = 28
PANEL_H = 110
GAP = 26

CAPACITY_COLOUR: Mapping[Capacity, str] = {
    Capacity.SPOT: "#1f9e89", Capacity.STANDARD: "#e08a1e", Capacity.FLEX_START: "#6f5bd6",
}
WAIT_COLOUR = "#c9ced6"
PREEMPT_COLOUR = "#d62839"
OK_COLOUR = "#2b9348"
PROGRESS_COLOUR = "#1d4ed8"
COST_COLOUR = "#7c3aed"
DEADLINE_COLOUR = "#d62839"
# A deadline further out than this many times the run's span is named, not drawn to scale.
DEADLINE_SPAN_LIMIT = 3.0


@dataclass(frozen=True)
class Scale:
    """Maps times to x."""

    t0: float
    t1: float

    def x(self, t: float) -> float:
        """The x of a time, clamped to the scale's span."""
        span = max(self.t1 - self.t0, 1e-9)
        return LEFT + (min(max(t, self.t0), self.t1) - self.t0) / span * (WIDTH - LEFT - RIGHT)


def _end_of(run: Run, now: float) -> float:
    marks = [run.created_at, run.updated_at, *(h.at for h in run.history)]
    for a in run.attempts:
        marks += [t for t in (a.created_at, a.started_at, a.ended_at) if t]
    return now if run.active else max(marks)


def _attempt_end(a: Attempt, run_end: float) -> float:
    return a.ended_at if a.ended_at is not None else run_end


def _lane(a: Attempt, y: float, scale: Scale, run_end: float, replicas: int = 1) -> list[str]:
    waited_from = a.queued_since or a.created_at or scale.t0
    running_from = a.started_at
    end = _attempt_end(a, run_end)
    colour = CAPACITY_COLOUR[a.capacity]
    times = f" \u00d7{replicas}" if replicas > 1 else ""  # "x2": every replica of every pool
    out = [f'<g class="lane" data-attempt="{a.number}" data-capacity="{a.capacity}" '
           f'data-state="{a.state}" data-replicas="{replicas}">',
           f'<text x="8" y="{y + 18:.1f}" class="label">#{a.number} {escape(str(a.capacity))}'
           f'{times}</text>']
    wait_end = running_from if running_from is not None else end
    if wait_end > waited_from:
        x0, x1 = scale.x(waited_from), scale.x(wait_end)
        out.append(f'<rect class="wait" x="{x0:.1f}" y="{y + 6:.1f}" width="{max(x1 - x0, 1):.1f}" '
                   f'height="{LANE_H - 12}" fill="url(#hatch)" stroke="{WAIT_COLOUR}">'
                   f'<title>attempt {a.number} waited {duration(wait_end - waited_from)} for '
                   f'capacity</title></rect>')
    if running_from is not None:
        x0, x1 = scale.x(running_from), scale.x(end)
        out.append(f'<rect class="run" x="{x0:.1f}" y="{y + 2:.1f}" width="{max(x1 - x0, 1.5):.1f}" '
                   f'height="{LANE_H - 4}" rx="3" fill="{colour}">'
                   f'<title>attempt {a.number} on {a.capacity} in {escape(a.region)}: ran '
                   f'{duration(end - running_from)}</title></rect>')
    if a.ended_at is not None:
        xe = scale.x(a.ended_at)
        if a.failure is FailureClass.PREEMPTED:
            out.append(f'<g class="preemption"><line x1="{xe:.1f}" y1="{y - 2:.1f}" x2="{xe:.1f}" '
                       f'y2="{y + LANE_H + 2:.1f}" stroke="{PREEMPT_COLOUR}" stroke-width="3"/>'
                       f'<text x="{xe + 4:.1f}" y="{y + 12:.1f}" class="mark" '
                       f'fill="{PREEMPT_COLOUR}">preempted</text></g>')
        if a.state is AttemptState.SUCCEEDED:
            out.append(_end_label("succeeded", "succeeded", OK_COLOUR, xe, y))
        elif a.failure is not None and a.failure is not FailureClass.PREEMPTED:
            out.append(_end_label("ended", str(a.failure), PREEMPT_COLOUR, xe, y))
    out.append("</g>")
    return out


def _end_label(cls: str, text: str, colour: str, x: float, y: float) -> str:
    """How an attempt ended, right of its end; near the right edge, inside its bar in white."""
    if x > WIDTH - RIGHT - 90:
        return (f'<text class="{cls} mark" x="{x - 4:.1f}" y="{y + 18:.1f}" text-anchor="end" '
                f'fill="#fff">{escape(text)}</text>')
    return f'<text class="{cls} mark" x="{x + 4:.1f}" y="{y + 18:.1f}" fill="{colour}">{escape(text)}</text>'


def _progress_points(run: Run, run_end: float) -> list[tuple[float, int]]:
    """(time, step) corners: each attempt starts at the step it resumed from, ends where it got."""
    points: list[tuple[float, int]] = []
    for a in run.attempts:
        if a.started_at is None:
            continue
        start = a.resumed_from_step or 0
        points.append((a.started_at, start))
        reached = a.progress_step if a.progress_step is not None else start
        if a is run.current and run.progress.at is not None and a.live:
            points.append((run.progress.at, max(run.progress.step, start)))
        points.append((_attempt_end(a, run_end), max(reached, start)))
    return points


def _progress_panel(run: Run, scale: Scale, top: float, run_end: float) -> list[str]:
    points = _progress_points(run, run_end)
    total = run.progress.total_steps or max([s for _, s in points] + [1])
    def y(step: float) -> float:
        return top + PANEL_H - step / max(total, 1) * (PANEL_H - 10)
    out = [f'<text x="8" y="{top + 14:.1f}" class="label">steps</text>',
           f'<line x1="{LEFT}" y1="{y(0):.1f}" x2="{WIDTH - RIGHT}" y2="{y(0):.1f}" class="axis"/>',
           f'<line class="total" x1="{LEFT}" y1="{y(total):.1f}" x2="{WIDTH - RIGHT}" '
           f'y2="{y(total):.1f}" stroke-dasharray="4 3" stroke="#94a3b8"/>',
           f'<text x="{LEFT - 6}" y="{y(total) + 4:.1f}" class="tick" text-anchor="end">{total}</text>',
           f'<text x="{LEFT - 6}" y="{y(0) + 4:.1f}" class="tick" text-anchor="end">0</text>']
    if points:
        d = " ".join(f"{'M' if i == 0 else 'L'}{scale.x(t):.1f},{y(s):.1f}"
                     for i, (t, s) in enumerate(points))
        out.append(f'<path class="progress" d="{d}" fill="none" stroke="{PROGRESS_COLOUR}" '
                   f'stroke-width="2"/>')
    for a in run.attempts:  # the checkpoints the attempts resumed from
        if a.resumed_from_step is None or (a.number == 1 and run.retry_of is None):
            continue
        previous = run.attempt(a.number - 1)
        at = previous.ended_at if previous and previous.ended_at else a.created_at
        cx, cy = scale.x(at), y(a.resumed_from_step)
        out.append(f'<g class="checkpoint" data-step="{a.resumed_from_step}">'
                   f'<line x1="{cx:.1f}" y1="{cy - 7:.1f}" x2="{cx:.1f}" y2="{cy + 7:.1f}" '
                   f'stroke="#0f172a" stroke-width="2"/><title>checkpoint step '
                   f'{a.resumed_from_step}, resumed by attempt {a.number}</title></g>')
    if run.latest_checkpoint is not None:
        cy = y(run.latest_checkpoint.step)
        out.append(f'<g class="checkpoint latest" data-step="{run.latest_checkpoint.step}">'
                   f'<line x1="{WIDTH - RIGHT - 8}" y1="{cy:.1f}" x2="{WIDTH - RIGHT}" '
                   f'y2="{cy:.1f}" stroke="#0f172a" stroke-width="2"/><title>latest checkpoint '
                   f'step {run.latest_checkpoint.step}</title></g>')
    return out


def _cost_points(book: Ledger, run: Run, run_end: float) -> list[tuple[float, float]]:
    """Cumulative cost at each start and end of billing (billing is linear while a job runs)."""
    spans = []
    for a, line in zip(run.attempts, book.attempts, strict=True):
        if a.started_at is not None and line.billed_s > 0:
            spans.append((a.started_at, a.started_at + line.billed_s, line.cost))
    points = [(run.created_at, 0.0)]
    total = 0.0
    for start, end, cost in sorted(spans):
        points += [(start, total), (end, total + cost)]
        total += cost
    points.append((run_end, total))
    return points


def _cost_panel(book: Ledger, run: Run, scale: Scale, top: float, run_end: float) -> list[str]:
    points = _cost_points(book, run, run_end)
    peak = max(book.total, 1e-9)
    def y(cost: float) -> float:
        return top + PANEL_H - cost / peak * (PANEL_H - 10)
    d = " ".join(f"{'M' if i == 0 else 'L'}{scale.x(t):.1f},{y(c):.1f}"
                 for i, (t, c) in enumerate(points))
    # A scale: the spend at a quarter, half, three quarters and all of the run's total.
    scale_marks = [f'<g class="cost-tick"><line x1="{LEFT}" y1="{y(peak * f):.1f}" '
                   f'x2="{WIDTH - RIGHT}" y2="{y(peak * f):.1f}" class="grid"/>'
                   f'<text x="{LEFT - 6}" y="{y(peak * f) + 4:.1f}" class="tick" '
                   f'text-anchor="end">{money(peak * f if book.total else 0.0)}</text></g>'
                   for f in (0.25, 0.5, 0.75, 1.0)]
    return [f'<text x="8" y="{top + 14:.1f}" class="label">cost</text>', *scale_marks,
            f'<line x1="{LEFT}" y1="{y(0):.1f}" x2="{WIDTH - RIGHT}" y2="{y(0):.1f}" class="axis"/>',
            f'<text x="{LEFT - 6}" y="{y(0) + 4:.1f}" class="tick" text-anchor="end">'
            f'{money(0.0)}</text>',
            f'<path class="cost" d="{d}" fill="none" stroke="{COST_COLOUR}" stroke-width="2"/>']


def _time_axis(scale: Scale, y: float) -> list[str]:
    from spotorch_trainer.contract import rfc3339

    out = []
    for i in range(6):
        t = scale.t0 + (scale.t1 - scale.t0) * i / 5
        x = scale.x(t)
        out.append(f'<line x1="{x:.1f}" y1="0" x2="{x:.1f}" y2="{y:.1f}" class="grid"/>'
                   f'<text x="{x:.1f}" y="{y + 14:.1f}" class="tick" text-anchor="middle">'
                   f'{rfc3339(t, "seconds")[11:19]}</text>')
    return out


def timeline_svg(run: Run, book: Ledger, now: float) -> str:
    """The whole timeline of a run, as one <svg> element."""
    run_end = _end_of(run, now)
    t1 = max(run_end, run.created_at + 1)
    deadline = run.deadline_at
    drawn_deadline = deadline is not None and \
        deadline - run.created_at <= DEADLINE_SPAN_LIMIT * (t1 - run.created_at)
    if drawn_deadline and deadline is not None:
        t1 = max(t1, deadline)
    scale = Scale(run.created_at, t1 + (t1 - run.created_at) * 0.02)
    lanes: Sequence[Attempt] = run.attempts
    lanes_h = max(len(lanes), 1) * (LANE_H + 6)
    progress_top = lanes_h + GAP
    cost_top = progress_top + PANEL_H + GAP
    axis_y = cost_top + PANEL_H + 6
    height = axis_y + 22
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" class="timeline" viewBox="0 0 {WIDTH} {height}" '
           f'width="100%" role="img" aria-label="timeline of run {escape(run.run_id)}">',
           '<defs><pattern id="hatch" width="6" height="6" patternUnits="userSpaceOnUse" '
           'patternTransform="rotate(45)"><rect width="6" height="6" fill="#eef1f5"/>'
           f'<line x1="0" y1="0" x2="0" y2="6" stroke="{WAIT_COLOUR}" stroke-width="3"/>'
           '</pattern></defs>',
           '<style>.label{font:600 12px sans-serif;fill:#0f172a}.tick{font:11px sans-serif;'
           'fill:#475569}.mark{font:600 11px sans-serif}.axis{stroke:#94a3b8}'
           '.grid{stroke:#e2e8f0}</style>']
    out += _time_axis(scale, axis_y)
    if not lanes:
        out.append(f'<text x="{LEFT}" y="20" class="label">no attempt yet</text>')
    replicas = {line.attempt: sum(c.replicas for c in line.pools) or 1 for line in book.attempts}
    for i, a in enumerate(lanes):
        out += _lane(a, i * (LANE_H + 6), scale, run_end, replicas.get(a.number, 1))
    out += _progress_panel(run, scale, progress_top, run_end)
    out += _cost_panel(book, run, scale, cost_top, run_end)
    if deadline is not None:
        if drawn_deadline:
            x = scale.x(deadline)
            out.append(f'<g class="deadline"><line x1="{x:.1f}" y1="0" x2="{x:.1f}" '
                       f'y2="{axis_y:.1f}" stroke="{DEADLINE_COLOUR}" stroke-dasharray="6 4" '
                       f'stroke-width="2"/><text x="{x - 4:.1f}" y="{progress_top - 6:.1f}" '
                       f'class="mark" text-anchor="end" fill="{DEADLINE_COLOUR}">deadline</text></g>')
        else:
            out.append(f'<g class="deadline offscale"><text x="{WIDTH - RIGHT}" '
                       f'y="{progress_top - 6:.1f}" class="mark" text-anchor="end" '
                       f'fill="{DEADLINE_COLOUR}">deadline in {duration(deadline - run_end)} '
                       '&#8594;</text></g>')
    if run.active:
        x = scale.x(now)
        out.append(f'<line class="now" x1="{x:.1f}" y1="0" x2="{x:.1f}" y2="{axis_y:.1f}" '
                   'stroke="#0f172a" stroke-width="1" stroke-dasharray="2 2"/>')
    out.append("</svg>")
    return "\n".join(out)
