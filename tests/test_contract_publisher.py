"""One contract suite for the EventPublisher port (spotorch's own CloudEvents); one subclass per
adapter: the in-memory twin, and Pub/Sub on Google's emulator read back by a subscription."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping
from typing import Any

import pytest

from spotorch.adapters.gcp.pubsub import PubSubPublisher
from spotorch.adapters.memory.twins import InMemoryPublisher
from spotorch.core.events import build_event, from_pubsub
from spotorch.local.emulators import EmulatorSet
from spotorch.ports.messages import EventPublisher

Received = Callable[[int], list[dict[str, Any]]]  # how many to wait for -> the events received


def events(run_id: str, n: int) -> list[Mapping[str, Any]]:
    return [build_event(run_id=run_id, pipeline="p", sequence=k, kind="run.escalated",
                        data={"from": "spot", "to": "standard", "reason": f"r{k}"},
                        time=1_800_000_000.0 + k) for k in range(1, n + 1)]


class EventPublisherContract:
    """What every EventPublisher must do; subclasses provide `publisher`, `received`, `broken`."""

    @pytest.fixture
    def publisher(self) -> EventPublisher:
        raise NotImplementedError

    @pytest.fixture
    def received(self, publisher: EventPublisher) -> Received:
        raise NotImplementedError

    @pytest.fixture
    def broken(self) -> EventPublisher:
        """A publisher that cannot deliver (its topic is gone, or it is down)."""
        raise NotImplementedError

    def test_an_event_arrives_as_it_was_published(self, publisher: EventPublisher,
                                                  received: Received) -> None:
        (event,) = events("r1", 1)
        publisher.publish(event)
        assert received(1) == [dict(event)]

    def test_a_run_s_events_arrive_in_order(self, publisher: EventPublisher,
                                            received: Received) -> None:
        sent = events("r2", 5)
        for event in sent:
            publisher.publish(event)
        got = received(5)
        assert [e["id"] for e in got] == [e["id"] for e in sent]

    def test_a_publish_that_cannot_be_delivered_raises(self, broken: EventPublisher) -> None:
        (event,) = events("r3", 1)
        with pytest.raises(Exception):  # noqa: B017 - the adapter's own error: the outbox retries
            broken.publish(event)


class TestInMemoryPublisher(EventPublisherContract):
    @pytest.fixture
    def publisher(self) -> InMemoryPublisher:
        return InMemoryPublisher()

    @pytest.fixture
    def received(self, publisher: EventPublisher) -> Received:
        assert isinstance(publisher, InMemoryPublisher)
        return lambda n: publisher.events[:n]

    @pytest.fixture
    def broken(self) -> InMemoryPublisher:
        return InMemoryPublisher(fail_next=1)


@pytest.mark.emulator
class TestPubSubPublisher(EventPublisherContract):
    """google-cloud-pubsub against Google's Pub/Sub emulator, with message ordering."""

    @pytest.fixture
    def topic(self, emulators: EmulatorSet) -> str:
        from google.cloud import pubsub_v1

        path = f"projects/{emulators.project}/topics/events-{uuid.uuid4().hex[:8]}"
        pubsub_v1.PublisherClient().create_topic(name=path)
        return path

    @pytest.fixture
    def subscription(self, topic: str) -> str:
        from google.cloud import pubsub_v1

        path = topic.replace("/topics/", "/subscriptions/") + "-sub"
        pubsub_v1.SubscriberClient().create_subscription(
            request={"name": path, "topic": topic, "enable_message_ordering": True})
        return path

    @pytest.fixture
    def publisher(self, topic: str, subscription: str) -> PubSubPublisher:
        return PubSubPublisher(topic, timeout_s=10.0)

    @pytest.fixture
    def received(self, publisher: EventPublisher, subscription: str) -> Received:
        from google.cloud import pubsub_v1

        subscriber = pubsub_v1.SubscriberClient()

        def received(n: int) -> list[dict[str, Any]]:
            got: list[dict[str, Any]] = []
            for _ in range(20):
                response = subscriber.pull(request={"subscription": subscription,
                                                    "max_messages": n}, timeout=10.0)
                for message in response.received_messages:
                    got.append(from_pubsub(message.message.data))
                if response.received_messages:
                    subscriber.acknowledge(request={
                        "subscription": subscription,
                        "ack_ids": [m.ack_id for m in response.received_messages]})
                if len(got) >= n:
                    break
            return got
        return received

    @pytest.fixture
    def broken(self, emulators: EmulatorSet) -> PubSubPublisher:
        return PubSubPublisher(f"projects/{emulators.project}/topics/never-created",
                               timeout_s=10.0)
