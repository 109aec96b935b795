"""The messaging ports: publishing spotorch's own CloudEvents, handing tick shards out."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol


class ShardDispatcher(Protocol):
    """Hands one shard of the reconcile tick to an invocation of its own (Pub/Sub)."""

    def dispatch(self, shard: Mapping[str, Any]) -> None:
        """Send one shard message; raises on failure."""
        ...


class EventPublisher(Protocol):
    """Publishes spotorch's own CloudEvents."""

    def publish(self, event: Mapping[str, Any]) -> None:
        """Publish one event in CloudEvents structured JSON form; raises on failure."""
        ...
