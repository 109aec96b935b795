"""Times operators type: an ISO 8601 instant or a span back from now (30m, 6h, 2d, 1w)."""

from __future__ import annotations

import re
from collections.abc import Mapping

from spotorch.ports.reads import BadQuery
from spotorch_trainer.contract import parse_rfc3339

_UNITS: Mapping[str, float] = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_SPAN = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*$", re.IGNORECASE)


def parse_since(text: str, now: float) -> float:
    """Epoch seconds of `text`: '6h' is six hours before now, '2026-11-30' or an ISO time is that."""
    span = _SPAN.match(text)
    if span:
        return now - float(span.group(1)) * _UNITS[span.group(2).lower()]
    try:
        return parse_rfc3339(text)
    except ValueError:
        raise BadQuery(f"--since {text!r}: give an ISO 8601 time (2026-11-30T08:00:00Z) or a "
                       "span back from now (30m, 6h, 2d, 1w)") from None


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
