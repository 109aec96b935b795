"""The outbox's one meaning of claiming, deferring and releasing an intent, for every document
that keeps one (a run, a sweep).

An intent is written into its document's outbox in the same conditional write as the decision
that made it, claimed (`claimed_until`) by the invocation that made it. Then:

- claim: the tick takes over intents whose claim has run out (their executor crashed or gave
  up), for LEASE_S, in the conditional write that read them: of two racing takers one writes.
- done: carried out; its result is decided and the intent leaves the outbox.
- defer: not carried out this time (a failed call, a precondition not met yet): it stays in the
  outbox and its claim is released, so the next tick takes it at once rather than when the
  claim would have run out.
- release: give up a claim (what a deferral does).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import replace
from typing import Protocol, TypeVar

LEASE_S = 120.0  # how long a claim keeps others off an intent


class Claimable(Protocol):
    """An outbox intent: an id and the time its executor's claim runs out."""

    @property
    def id(self) -> str: ...  # noqa: D102

    @property
    def claimed_until(self) -> float: ...  # noqa: D102


IntentT = TypeVar("IntentT", bound=Claimable)


def claimable(outbox: Iterable[IntentT], now: float) -> tuple[IntentT, ...]:
    """Intents whose claim has run out: the tick may carry them out."""
    return tuple(i for i in outbox if i.claimed_until <= now)


def claim(outbox: Iterable[IntentT], ids: Iterable[str], now: float,
          lease_s: float = LEASE_S) -> tuple[IntentT, ...]:
    """The outbox with these intents claimed until now + lease_s."""
    taken = set(ids)
    return tuple(replace(i, claimed_until=now + lease_s) if i.id in taken else i  # type: ignore[type-var]
                 for i in outbox)


def release(outbox: Iterable[IntentT], intent_id: str, now: float,
            change: Callable[[IntentT], IntentT] | None = None) -> tuple[IntentT, ...]:
    """The outbox with one intent's claim given up (claimable from now on); `change` may note
    on the intent why it waits."""
    def released(intent: IntentT) -> IntentT:
        free = replace(intent, claimed_until=min(intent.claimed_until, now))  # type: ignore[type-var]
        return change(free) if change is not None else free
    return tuple(released(i) if i.id == intent_id else i for i in outbox)
