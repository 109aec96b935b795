"""Publishes spotorch's CloudEvents to a Pub/Sub topic, ordered per run."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from spotorch.core.events import to_pubsub


class PubSubPublisher:
    """EventPublisher on google-cloud-pubsub; the client is created on first use."""

    def __init__(self, topic_path: str, timeout_s: float = 30.0) -> None:
        self.topic_path = topic_path
        self.timeout_s = timeout_s
        self._client: Any = None

    def _publisher(self) -> Any:
        if self._client is None:
            import google.cloud.pubsub_v1 as pubsub_v1

            options = pubsub_v1.types.PublisherOptions(enable_message_ordering=True)
            # Each publish is awaited (the outbox needs to know), so batching only adds latency.
            batch = pubsub_v1.types.BatchSettings(max_messages=1, max_latency=0.0)
            self._client = pubsub_v1.PublisherClient(batch_settings=batch,
                                                     publisher_options=options)
        return self._client

    def publish(self, event: Mapping[str, Any]) -> None:
        """EventPublisher.publish: waits for Pub/Sub's ack; a failed ordering key is resumed."""
        data, attributes, ordering_key = to_pubsub(event)
        client = self._publisher()
        future = client.publish(self.topic_path, data, ordering_key=ordering_key, **attributes)
        try:
            future.result(timeout=self.timeout_s)
        except Exception:
            # An ordered key stays paused after a failure until resumed; the outbox retries later.
            client.resume_publish(self.topic_path, ordering_key)
            raise


ATTR_SHARD = "spotorch_shard"  # marks a tick message as one shard of a fanned-out tick


class PubSubShardDispatcher:
    """ShardDispatcher: one message per shard on the tick topic, which feeds on_tick again."""

    def __init__(self, topic_path: str, timeout_s: float = 30.0) -> None:
        self.topic_path = topic_path
        self.timeout_s = timeout_s
        self._client: Any = None

    def dispatch(self, shard: Mapping[str, Any]) -> None:
        """ShardDispatcher.dispatch: the shard as compact JSON on the tick topic, marked as a shard."""
        import json

        if self._client is None:
            import google.cloud.pubsub_v1 as pubsub_v1

            self._client = pubsub_v1.PublisherClient()
        data = json.dumps(shard, separators=(",", ":")).encode()
        attributes = {ATTR_SHARD: f"{shard['shard']}/{shard['shards']}"}
        self._client.publish(self.topic_path, data, **attributes).result(timeout=self.timeout_s)
