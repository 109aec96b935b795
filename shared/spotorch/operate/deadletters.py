"""Dead letters made visible and replayable (`spotorch dead-letters`).

A message that kept failing with a transient error is moved by Pub/Sub to the dead-letter topic
after its delivery attempts; a hold subscription keeps it. This lists what is held, with the
reason spotorch recorded for the last failure (`delivery_failures`, keyed by message id), and
replays chosen messages to the topic they came from. Handlers are idempotent, so a replay after a
fix is safe; a replayed message is acknowledged on the hold subscription only once republished.

An operator tool (like the CLI), not part of the function bundle.
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from spotorch.core.ids import message_key
from spotorch.ports.store import DocumentStore
from spotorch.settings import COLLECTION_FAILURES, SUBSCRIPTION_DEAD_LETTER, Settings

# Attributes Pub/Sub adds to a dead-lettered message (not all emulators set them).
ATTR_SOURCE_SUBSCRIPTION = "CloudPubSubDeadLetterSourceSubscription"
ATTR_SOURCE_PROJECT = "CloudPubSubDeadLetterSourceSubscriptionProject"
ATTR_DELIVERY_COUNT = "CloudPubSubDeadLetterSourceDeliveryCount"
_PUBSUB_ADDED = "CloudPubSubDeadLetter"
# How spotorch's own attributes say where a message was meant to go, when Pub/Sub does not.
ATTR_TOPIC_HINT = "spotorch_topic"


@dataclass(frozen=True)
class DeadLetter:
    """One held message and what spotorch knows about why it failed."""

    message_id: str
    source_subscription: str | None
    delivery_count: int | None
    publish_time: str
    attributes: Mapping[str, str]
    size: int
    reason: str | None  # the last transient failure spotorch recorded for this message
    failed_at: float | None
    preview: str  # the first bytes of the data, as text


@dataclass
class _Held:
    letter: DeadLetter
    ack_id: str
    data: bytes


def _subscriber() -> Any:
    from google.cloud import pubsub_v1

    return pubsub_v1.SubscriberClient()


def _publisher() -> Any:
    from google.cloud import pubsub_v1

    return pubsub_v1.PublisherClient()


def _pull(subscriber: Any, path: str, max_messages: int,
          docs: DocumentStore | None) -> list[_Held]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        response = subscriber.pull(request={"subscription": path, "max_messages": max_messages,
                                            "return_immediately": True}, timeout=30)
    held = []
    for received in response.received_messages:
        m = received.message
        attributes = dict(m.attributes)
        key = message_key(bytes(m.data), attributes)
        failure = docs.get(COLLECTION_FAILURES, key)[0] if docs is not None else None
        count = attributes.get(ATTR_DELIVERY_COUNT)
        letter = DeadLetter(
            message_id=m.message_id, source_subscription=attributes.get(ATTR_SOURCE_SUBSCRIPTION),
            delivery_count=int(count) if count and count.isdigit() else None,
            publish_time=m.publish_time.isoformat() if m.publish_time else "",
            attributes=attributes, size=len(m.data),
            reason=(failure or {}).get("reason"), failed_at=(failure or {}).get("at"),
            preview=bytes(m.data[:200]).decode("utf-8", "replace"))
        held.append(_Held(letter, received.ack_id, bytes(m.data)))
    return held


def _release(subscriber: Any, path: str, ack_ids: Sequence[str]) -> None:
    """Give messages back to the subscription at once (they were only looked at)."""
    if ack_ids:
        subscriber.modify_ack_deadline(request={"subscription": path, "ack_ids": list(ack_ids),
                                                "ack_deadline_seconds": 0})


def list_dead_letters(project: str, subscription: str = SUBSCRIPTION_DEAD_LETTER, *,
                      max_messages: int = 100,
                      docs: DocumentStore | None = None) -> list[DeadLetter]:
    """The held messages (looked at, left in place)."""
    subscriber = _subscriber()
    path = subscriber.subscription_path(project, subscription)
    held = _pull(subscriber, path, max_messages, docs)
    _release(subscriber, path, [h.ack_id for h in held])
    return [h.letter for h in held]


def _target_topic(subscriber: Any, letter: DeadLetter) -> str | None:
    hint = letter.attributes.get(ATTR_TOPIC_HINT)
    if hint:
        return hint
    name = letter.source_subscription
    if not name:
        return None
    if not name.startswith("projects/"):  # Pub/Sub gives the name and, apart, its project
        project = letter.attributes.get(ATTR_SOURCE_PROJECT, "")
        name = subscriber.subscription_path(project, name)
    source = subscriber.get_subscription(request={"subscription": name})
    return str(source.topic)


def replay(project: str, message_ids: Sequence[str], subscription: str = SUBSCRIPTION_DEAD_LETTER,
           *, max_messages: int = 1000, topic: str | None = None) -> dict[str, str]:
    """Republish the chosen held messages to their source topic; message id -> what happened."""
    subscriber, publisher = _subscriber(), _publisher()
    path = subscriber.subscription_path(project, subscription)
    wanted = set(message_ids)
    outcome: dict[str, str] = {}
    held = _pull(subscriber, path, max_messages, None)
    keep = []
    for h in held:
        if h.letter.message_id not in wanted:
            keep.append(h.ack_id)
            continue
        target = topic or _target_topic(subscriber, h.letter)
        if target is None:
            outcome[h.letter.message_id] = "kept: no source subscription recorded; pass --topic"
            keep.append(h.ack_id)
            continue
        attributes = {k: v for k, v in h.letter.attributes.items()
                      if not k.startswith(_PUBSUB_ADDED)}
        new_id = publisher.publish(target, h.data, **attributes).result(timeout=30)
        subscriber.acknowledge(request={"subscription": path, "ack_ids": [h.ack_id]})
        outcome[h.letter.message_id] = f"replayed to {target} as {new_id}"
    _release(subscriber, path, keep)
    for missing in wanted - outcome.keys():
        outcome[missing] = "not held (already replayed, or not a dead letter)"
    return outcome


def main(argv: Sequence[str] | None = None) -> int:
    """spotorch dead-letters [--replay ID ...] [--json]"""
    parser = argparse.ArgumentParser(prog="spotorch dead-letters",
                                     description="list dead-lettered messages; replay chosen ones")
    parser.add_argument("--project", default=None, help="project (default: SPOTORCH_PROJECT)")
    parser.add_argument("--subscription", default=SUBSCRIPTION_DEAD_LETTER,
                        help=f"hold subscription (default: {SUBSCRIPTION_DEAD_LETTER})")
    parser.add_argument("--replay", nargs="+", metavar="MESSAGE_ID", default=(),
                        help="republish these messages to the topic they came from")
    parser.add_argument("--topic", default=None, help="replay to this topic instead")
    parser.add_argument("--max", type=int, default=100, help="messages to look at (default 100)")
    parser.add_argument("--json", action="store_true", help="print JSON")
    args = parser.parse_args(argv)
    settings = Settings.from_env()
    project = args.project or settings.project
    if args.replay:
        result = replay(project, args.replay, args.subscription, topic=args.topic)
        print(json.dumps(result, indent=2) if args.json else
              "\n".join(f"{k}: {v}" for k, v in result.items()))
        return 0 if all(v.startswith("replayed") for v in result.values()) else 1
    from spotorch.adapters.gcp.firestore import FirestoreDocumentStore

    docs = FirestoreDocumentStore(project=project, database=settings.firestore_database)
    letters = list_dead_letters(project, args.subscription, max_messages=args.max, docs=docs)
    if args.json:
        print(json.dumps([asdict(letter) for letter in letters], indent=2, default=str))
    elif not letters:
        print(f"no dead letters on {args.subscription}")
    for letter in [] if args.json else letters:
        print(f"{letter.message_id}  from {letter.source_subscription or '?'}  "
              f"attempts {letter.delivery_count or '?'}  {letter.size} bytes\n"
              f"    reason: {letter.reason or 'none recorded'}\n    data: {letter.preview[:100]}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
