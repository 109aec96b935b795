"""Durations as operators read them (45s, 12m 03s, 3h 20m)."""

from __future__ import annotations


def duration(seconds: float | None) -> str:
    """A short human duration: 45s, 12m 03s, 3h 20m."""
    if seconds is None:
        return "-"
    s = round(max(seconds, 0.0))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m {s % 60:02d}s"
    return f"{s // 3600}h {s % 3600 // 60:02d}m"
