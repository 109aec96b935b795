"""Dead letters made visible and replayable (`spotorch dead-letters`).

A message that kept failing with a transient error is moved by Pub/Sub to the dead-letter topic
after its delivery attempts; a hold subscription keeps it. This lists what is held, with the
reason spotorch recorded for the last failure (`delivery_failures`, keyed by the message's
content, its CloudEvent id and the object generation it names: ids.failure_keys), and replays
chosen messages to the topic they came from. Handlers are idempotent, so a replay after a
fix is safe; a replayed message is acknowledged on the hold subscription only once republished.

An operator tool (like the CLI), not part of the function bundle.
"""

from __future__ import annotations

import json
import sys
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any, TypeVar

import click

from spotorch.commandline import CommandFailure, run
from spotorch.core.ids import failure_keys
from spotorch.operate.cli_session import session, target_options
from spotorch.ports.store import DocumentStore
from spotorch.settings import (
    COLLECTION_FAILURES,
    SUBSCRIPTION_DEAD_LETTER,
    SUBSCRIPTION_DEAD_LETTER_LOCAL,
)

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
        failure = _failure_of(docs, bytes(m.data), attributes)
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


# Why a held message may have no reason: spotorch records one for each failure it raised, so
# none means the function never answered (down, crashed, timed out) or could not write it.
NO_REASON = ("none recorded (the function did not answer: down, crashed or timed out; or "
             "its store was failing too: see the function's logs)")


def _failure_of(docs: DocumentStore | None, data: bytes,
                attributes: Mapping[str, str]) -> Mapping[str, Any] | None:
    """The last failure spotorch recorded for a held message: by its content, its CloudEvent
    id, or the object generation it names (ids.failure_keys); None when nothing was recorded."""
    if docs is None:
        return None
    for key in failure_keys(data, attributes):
        found, _ = docs.get(COLLECTION_FAILURES, key)
        if found is not None:
            return found
    return None


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


@click.command(name="dead-letters")
@click.option("--subscription", default=None, metavar="NAME",
              help=f"Hold subscription to read  [default: the local stack's "
                   f"({SUBSCRIPTION_DEAD_LETTER_LOCAL}) when it is the target, else "
                   f"{SUBSCRIPTION_DEAD_LETTER}]")
@click.option("--replay", "replay_ids", multiple=True, metavar="MESSAGE_ID",
              help="Republish this message to the topic it came from (repeat for more).")
@click.option("--topic", default=None, help="Replay to this topic instead (a full topic path).")
@click.option("--max", "max_messages", type=click.IntRange(1, 1000), default=100,
              help="Messages to look at.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@target_options()
@click.pass_context
def dead_letters(ctx: click.Context, subscription: str | None, replay_ids: tuple[str, ...],
                 topic: str | None, max_messages: int, as_json: bool) -> None:
    """List dead-lettered messages with the reason spotorch recorded; replay chosen ones."""
    from spotorch.operate.target import use_stack_environment

    target = session(ctx).target()
    use_stack_environment(target)  # the local stack's Pub/Sub and Firestore emulators
    project = target.project
    hold = subscription or target.dead_letter_subscription
    if replay_ids:
        result = _cloud(lambda: replay(project, list(replay_ids), hold, topic=topic), hold,
                        project)
        click.echo(json.dumps(result, indent=2) if as_json else
                   "\n".join(f"{k}: {v}" for k, v in result.items()))
        if not all(v.startswith("replayed") for v in result.values()):
            raise click.exceptions.Exit(1)
        return
    from spotorch.adapters.gcp.firestore import FirestoreDocumentStore

    docs = FirestoreDocumentStore(project=project, database=target.database)
    letters = _cloud(lambda: list_dead_letters(project, hold, max_messages=max_messages,
                                               docs=docs), hold, project)
    if as_json:
        click.echo(json.dumps([asdict(letter) for letter in letters], indent=2, default=str))
        return
    if not letters:
        click.echo(f"no dead letters on {hold}")
    for letter in letters:
        click.echo(f"{letter.message_id}  from {letter.source_subscription or '?'}  "
                   f"attempts {letter.delivery_count or '?'}  {letter.size} bytes\n"
                   f"    reason: {letter.reason or NO_REASON}\n"
                   f"    data: {letter.preview[:100]}")


T = TypeVar("T")


def _cloud(fn: Callable[[], T], subscription: str, project: str) -> T:
    """fn(); Pub/Sub's answers that are no bug become one line naming what to check."""
    from google.api_core import exceptions as api

    try:
        return fn()
    except api.NotFound:
        raise CommandFailure(f"no subscription {subscription} in project {project} (the "
                             "deployed hold subscription is created by deploy/; the local "
                             "stack's is found through its state file: --state)") from None
    except api.PermissionDenied as exc:
        raise CommandFailure(f"not allowed to read {subscription} in project {project}: "
                             f"{exc.message} (needs roles/pubsub.subscriber)") from None


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m spotorch.operate.deadletters`: the `spotorch dead-letters` command."""
    return run(dead_letters, argv, prog_name="spotorch dead-letters")


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
