"""spotorch's one exception hierarchy; errors carry data and collect every problem."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


class SpotorchError(Exception):
    """Base of every error spotorch raises on purpose."""


class ServiceCallFailed(Exception):
    """A call to a Google service failed; `permanent` says whether retrying can help, `code` is
    the service's status name (NOT_FOUND, ...). The base of each port's call error; not a
    SpotorchError: the entry points tell these from bad input by their own types."""

    def __init__(self, message: str, *, permanent: bool, code: str = "") -> None:
        super().__init__(message)
        self.permanent = permanent
        self.code = code


class InvalidEvent(SpotorchError):
    """An event that cannot be handled: acknowledge it, record it, never retry it."""

    def __init__(self, reason: str, *, event_id: str = "", event_type: str = "") -> None:
        super().__init__(reason)
        self.reason = reason
        self.event_id = event_id
        self.event_type = event_type


@dataclass(frozen=True)
class Problem:
    """One thing wrong in a configuration file: where and what."""

    file: str
    path: str  # JSON-pointer-like field path, e.g. "recovery.max_preemptions"
    message: str

    def __str__(self) -> str:
        return f"{self.file}: {self.path or '<root>'}: {self.message}"


class ConfigError(SpotorchError):
    """Invalid configuration; lists every problem found, not just the first."""

    def __init__(self, problems: Sequence[Problem]) -> None:
        self.problems = tuple(problems)
        super().__init__("invalid configuration:\n" + "\n".join(f"  {p}" for p in self.problems))
