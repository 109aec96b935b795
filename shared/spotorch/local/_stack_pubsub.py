"""The local stack's Pub/Sub admin: topics, push subscriptions as Eventarc makes them, pulls."""

from __future__ import annotations

import contextlib
import json
import threading
import time
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from spotorch import settings as S
from spotorch.local._stack_config import (
    CLOUDEVENT,
    DEAD_LETTER_SUBSCRIPTION,
    OBSERVER_SUBSCRIPTION,
    TOPICS,
    StackConfig,
)

KINDS = ("publisher", "subscriber")


@dataclass(frozen=True)
class PulledMessage:
    """A message pulled from an observer subscription."""

    message_id: str
    data: bytes
    attributes: Mapping[str, str]
    publish_time: str
    ordering_key: str = ""

    def json(self) -> Any:
        """The data parsed as JSON."""
        return json.loads(self.data)


def subscription_name(topic: str, function: str) -> str:
    return f"{topic}--{function.replace('_', '-')}--push"


def pushed_routes(config: StackConfig) -> list[tuple[str, str]]:
    """(topic, function) of every subscription that feeds a function started here."""
    return [(topic, function) for topic, functions in config.routes.items()
            for function in functions if config.functions.get(function) == CLOUDEVENT]


class PubSubAdmin:
    """GAPIC clients on a channel to the stack's emulator (never os.environ's) and what they do."""

    def __init__(self, config: StackConfig, address: Callable[[], str]) -> None:
        self.config = config
        self._address = address
        self._clients: dict[str, Any] = {}
        self._lock = threading.Lock()
        self.subscriptions: dict[str, dict[str, str]] = {}

    def client(self, kind: str) -> Any:
        """The publisher or the subscriber client (built once)."""
        with self._lock:
            if kind not in self._clients:
                import grpc
                from google.pubsub_v1 import PublisherClient, SubscriberClient
                from google.pubsub_v1.services.publisher.transports import PublisherGrpcTransport
                from google.pubsub_v1.services.subscriber.transports import (
                    SubscriberGrpcTransport,
                )

                channel = grpc.insecure_channel(self._address())
                self._clients[kind] = (
                    PublisherClient(transport=PublisherGrpcTransport(channel=channel))
                    if kind == "publisher"
                    else SubscriberClient(transport=SubscriberGrpcTransport(channel=channel)))
            return self._clients[kind]

    def build_clients(self) -> None:
        for kind in KINDS:
            self.client(kind)

    def close(self) -> None:
        """Close the clients (a restarted emulator gets new ones)."""
        with self._lock:
            clients, self._clients = list(self._clients.values()), {}
        for client in clients:
            with contextlib.suppress(Exception):
                closer = getattr(getattr(client, "transport", None), "close", None) \
                    or getattr(client, "close", None)
                if closer:
                    closer()

    def topic_path(self, topic: str) -> str:
        return topic if topic.startswith("projects/") else \
            f"projects/{self.config.project}/topics/{topic}"

    def subscription_path(self, name: str) -> str:
        return f"projects/{self.config.project}/subscriptions/{name}"

    def create_topics(self) -> None:
        from google.api_core.exceptions import AlreadyExists
        from google.api_core.retry import Retry

        for topic in TOPICS:
            with contextlib.suppress(AlreadyExists):
                # Bounded: the default retry waits 600 s for an emulator that is not there.
                self.client("publisher").create_topic(name=self.topic_path(topic),
                                                      retry=Retry(timeout=30), timeout=10)

    def create_subscriptions(self, push_endpoint: Callable[[str, str], str]) -> None:
        """The functions' subscriptions, with dead letters (the push adapter delivers them, with
        the retry policy: see spotorch.local._push_adapter); the observers'."""
        from google.api_core.exceptions import AlreadyExists
        from google.pubsub_v1.types import DeadLetterPolicy

        cfg = self.config
        sub = self.client("subscriber")
        for topic, function in pushed_routes(cfg):
            name = subscription_name(topic, function)
            with contextlib.suppress(AlreadyExists):
                sub.create_subscription(request={
                    "name": self.subscription_path(name),
                    "topic": self.topic_path(topic),
                    "ack_deadline_seconds": cfg.ack_deadline_s,
                    "enable_message_ordering": topic in cfg.ordered_topics,
                    "dead_letter_policy": DeadLetterPolicy(
                        dead_letter_topic=self.topic_path(S.TOPIC_DEAD_LETTER),
                        max_delivery_attempts=cfg.max_delivery_attempts),
                })
            self.subscriptions[name] = {"topic": topic, "function": function,
                                        "push_endpoint": push_endpoint(topic, function)}
        for name, topic in ((OBSERVER_SUBSCRIPTION, S.TOPIC_EVENTS),
                            (DEAD_LETTER_SUBSCRIPTION, S.TOPIC_DEAD_LETTER)):
            with contextlib.suppress(AlreadyExists):
                sub.create_subscription(request={"name": self.subscription_path(name),
                                                 "topic": self.topic_path(topic),
                                                 "ack_deadline_seconds": 60})
            self.subscriptions[name] = {"topic": topic, "function": "", "push_endpoint": ""}

    def publish(self, topic: str, data: bytes | str | Mapping[str, Any] = b"",
                ordering_key: str = "", **attributes: str) -> str:
        """Publish one message (a mapping is sent as JSON); returns its message id."""
        from google.pubsub_v1 import PubsubMessage

        if isinstance(data, Mapping):
            data = json.dumps(data)
        if isinstance(data, str):
            data = data.encode()
        response = self.client("publisher").publish(
            topic=self.topic_path(topic),
            messages=[PubsubMessage(data=data, attributes=attributes, ordering_key=ordering_key)])
        return str(response.message_ids[0])

    def pull(self, subscription: str, max_messages: int, timeout_s: float) -> list[PulledMessage]:
        """Pull and acknowledge up to max_messages, waiting up to timeout_s for the first."""
        sub = self.client("subscriber")
        path = self.subscription_path(subscription)
        out: list[PulledMessage] = []
        deadline = time.monotonic() + timeout_s
        while len(out) < max_messages:
            with warnings.catch_warnings():
                # Deprecated in Pub/Sub, but the emulator otherwise holds an empty pull for ~2 s.
                warnings.simplefilter("ignore", DeprecationWarning)
                response = sub.pull(request={"subscription": path, "return_immediately": True,
                                             "max_messages": max_messages - len(out)},
                                    timeout=10)
            received = list(response.received_messages)
            if received:
                sub.acknowledge(subscription=path, ack_ids=[m.ack_id for m in received])
                out += [PulledMessage(
                    message_id=m.message.message_id, data=bytes(m.message.data),
                    attributes=dict(m.message.attributes),
                    publish_time=m.message.publish_time.isoformat()
                    if m.message.publish_time else "",
                    ordering_key=m.message.ordering_key) for m in received]
                continue  # there may be more right away
            if out or time.monotonic() >= deadline:
                break
            time.sleep(0.1)
        return out
