"""The one conditional-update loop, for every document kind (a run, a sweep, a snapshot watch,
an unmatched upload's record): read the document and its version, decide, write it on that
version; on a conflict pause (jittered, doubling) and do it all again on what is there now.

At-least-once delivery makes every change a retry: the decision is a pure function of what was
read, so deciding again on the fresh document is always right. After the last conflict the
ConflictError propagates: the caller's event is redelivered, or the next tick tries again.
The meaning of an outbox's claims (claim, defer, release) is spotorch.core.outbox's.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from spotorch.ports.store import ConflictError

WRITE_ATTEMPTS = 8  # conditional writes per change before giving up
BACKOFF_S = 0.02  # the first pause after a conflict; it doubles, with full jitter

Doc = TypeVar("Doc")
New = TypeVar("New")


@dataclass(frozen=True)
class Written(Generic[New]):
    """What the loop wrote, and the document's version after the write."""

    doc: New
    version: Any


def pause(attempt: int, backoff_s: float = BACKOFF_S) -> None:
    """The jittered pause after the attempt-th conflict (0 for the first)."""
    time.sleep(random.uniform(0.0, backoff_s * 2 ** attempt))


def conditional_update(read: Callable[[], tuple[Doc | None, Any]],
                       decide: Callable[[Doc | None], New | None],
                       write: Callable[[New, Any], Any], *, what: str,
                       attempts: int = WRITE_ATTEMPTS,
                       backoff_s: float = BACKOFF_S) -> Written[New] | None:
    """read -> decide -> write(new, version read); None when decide changes nothing (None).

    `read` gives (the document or None, its version: None for one that does not exist, which
    `write` creates only if it still does not); `write` raises ConflictError when the version
    is no longer current and returns the new version. ConflictError("{what}: ...") after
    `attempts` conflicts in a row.
    """
    for attempt in range(attempts):
        current, version = read()
        new = decide(current)
        if new is None:
            return None
        try:
            return Written(new, write(new, version))
        except ConflictError:
            if attempt + 1 < attempts:
                pause(attempt, backoff_s)
    raise ConflictError(f"{what}: too much contention, giving up for redelivery")
