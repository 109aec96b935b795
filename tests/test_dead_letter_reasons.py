"""Issue 39: `spotorch dead-letters` showed "reason: none recorded" for a storage event that had
failed with a transient error: the failure was kept under the CloudEvent's id, while the
dead-lettered notification is found by its content. Now it is kept under the object generation
too, which both name."""

from __future__ import annotations

import json
from typing import Any

import pytest

from spotorch.app.deps import Deps
from spotorch.core.ids import failure_keys, message_key, object_key
from spotorch.operate.deadletters import NO_REASON, _failure_of
from test_functions import deps, post, pubsub_event, storage_event  # noqa: F401  (a fixture)


def notification(bucket: str, name: str, generation: int) -> tuple[bytes, dict[str, str]]:
    """The GCS Pub/Sub notification of that object, as dead-lettered (Pub/Sub's attributes)."""
    data = json.dumps({"bucket": bucket, "name": name, "generation": str(generation),
                       "size": "10"}).encode()
    return data, {"bucketId": bucket, "objectId": name, "objectGeneration": str(generation),
                  "eventType": "OBJECT_FINALIZE", "payloadFormat": "JSON_API_V1",
                  "CloudPubSubDeadLetterSourceSubscription": "projects/p/subscriptions/s",
                  "CloudPubSubDeadLetterSourceDeliveryCount": "5"}


def test_a_failed_storage_event_is_found_from_its_dead_lettered_notification(
        deps: Deps, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    from spotorch.app import arrivals

    def down(*_args: Any) -> None:
        raise ConnectionError("firestore: 503 the service is currently unavailable")

    monkeypatch.setattr(arrivals, "data_arrived", down)
    resp = post("on_object_finalized", storage_event("datasets/a.csv", generation=7))
    assert resp.status_code >= 500  # transient: redelivered, then dead-lettered
    data, attributes = notification("landing", "datasets/a.csv", 7)
    failure = _failure_of(deps.docs, data, attributes)
    assert failure is not None and "503 the service is currently unavailable" in failure["reason"]
    other = _failure_of(deps.docs, *notification("landing", "datasets/b.csv", 7))
    assert other is None  # another object's letter has no reason of this one's


def test_a_failed_pubsub_message_is_found_by_its_content(
        deps: Deps, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    from spotorch.app import tick

    def down(*_args: Any) -> None:
        raise TimeoutError("deadline exceeded talking to Vertex AI")

    monkeypatch.setattr(tick, "reconcile", down)
    body, attributes = b"{}", {"origin": "scheduler"}
    assert post("on_tick", pubsub_event(body, attributes, "m9")).status_code >= 500
    dead = {**attributes, "CloudPubSubDeadLetterSourceDeliveryCount": "5"}
    failure = _failure_of(deps.docs, body, dead)
    assert failure is not None and "deadline exceeded" in failure["reason"]


def test_failure_keys_and_the_words_for_none() -> None:
    data, attributes = notification("b", "x/y.csv", 3)
    keys = failure_keys(data, attributes)
    assert keys[0] == message_key(data, attributes) and object_key("b", "x/y.csv", "3") in keys
    assert object_key("b", "", "3") is None and object_key("b", "n", True) is None
    assert failure_keys(b"{" * 5000, {"ce-id": "e1"})[1] == "e1"  # not JSON: no object key
    assert "did not answer" in NO_REASON
