"""Dead letters on the Pub/Sub emulator: a message that keeps failing is dead-lettered by Pub/Sub
itself, listed with the reason spotorch recorded, and replayed to the topic it came from."""

from __future__ import annotations

import time
import uuid
import warnings
from typing import Any

import pytest

from spotorch.core.ids import message_key
from spotorch.operate import deadletters
from spotorch.settings import COLLECTION_FAILURES

pytestmark = pytest.mark.emulator


def _pull(sub: Any, path: str) -> list[Any]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return list(sub.pull(request={"subscription": path, "max_messages": 10,
                                      "return_immediately": True}, timeout=10).received_messages)


def test_a_dead_letter_is_listed_with_its_reason_and_replayed(emulators: Any) -> None:
    from google.cloud import pubsub_v1
    from google.cloud.pubsub_v1.types import DeadLetterPolicy

    from spotorch.adapters.gcp.firestore import FirestoreDocumentStore

    project, tag = emulators.project, uuid.uuid4().hex[:6]
    pub, sub = pubsub_v1.PublisherClient(), pubsub_v1.SubscriberClient()
    topic, dl_topic = pub.topic_path(project, f"work-{tag}"), pub.topic_path(project, f"dl-{tag}")
    for t in (topic, dl_topic):
        pub.create_topic(name=t)
    source = sub.subscription_path(project, f"work-sub-{tag}")
    hold = sub.subscription_path(project, f"dl-hold-{tag}")
    sub.create_subscription(request={"name": hold, "topic": dl_topic})
    sub.create_subscription(request={
        "name": source, "topic": topic, "ack_deadline_seconds": 10,
        "dead_letter_policy": DeadLetterPolicy(dead_letter_topic=dl_topic,
                                               max_delivery_attempts=5)})
    message_id = pub.publish(topic, b'{"run_id": "r1"}', spotorch_source="trainer").result()
    docs = FirestoreDocumentStore(project=project)
    key = message_key(b'{"run_id": "r1"}', {"spotorch_source": "trainer"})  # as entry records it
    docs.put(COLLECTION_FAILURES, key, {"event_id": message_id,
                                               "reason": "ServiceUnavailable: firestore down",
                                               "at": time.time()}, None)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:  # fail it: every delivery is nacked, as a 503 would be
        received = _pull(sub, source)
        if received:
            sub.modify_ack_deadline(request={"subscription": source, "ack_deadline_seconds": 0,
                                             "ack_ids": [m.ack_id for m in received]})
        letters = deadletters.list_dead_letters(project, f"dl-hold-{tag}", docs=docs)
        if letters:
            break
        time.sleep(0.2)
    else:
        pytest.fail("Pub/Sub never dead-lettered the message")
    [letter] = letters
    assert letter.reason == "ServiceUnavailable: firestore down"
    assert letter.preview.startswith('{"run_id"') and letter.attributes["spotorch_source"] == "trainer"
    assert deadletters.list_dead_letters(project, f"dl-hold-{tag}")  # listing leaves it held

    assert letter.source_subscription and letter.delivery_count == 5
    outcome = deadletters.replay(project, [letter.message_id, "nope"], f"dl-hold-{tag}")
    assert outcome[letter.message_id].startswith("replayed to") and "not held" in outcome["nope"]
    time.sleep(0.5)
    again = _pull(sub, source)
    assert [bytes(m.message.data) for m in again] == [b'{"run_id": "r1"}']
    assert again[0].message.attributes["spotorch_source"] == "trainer"
    assert deadletters.list_dead_letters(project, f"dl-hold-{tag}") == []
