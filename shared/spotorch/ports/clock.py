"""The clock port: the time, from the system in production and by hand in tests."""

from __future__ import annotations

from typing import Protocol


class Clock(Protocol):
    """Where the time comes from."""
    def now(self) -> float:
        """Seconds since the epoch."""
        ...
