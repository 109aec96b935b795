"""Storage events in both wire forms, and the rules that match objects to pipelines."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest

from spotorch.core.errors import InvalidEvent
from spotorch.core.pipeline import BatchMode, JobTemplate, Pipeline, Trigger
from spotorch.core.triggers import (
    ObjectEvent,
    ObjectEventKind,
    match,
    skip_reason,
    snapshot_key,
)
from spotorch.entrypoints.storage_events import (
    PUBSUB_MESSAGE_TYPE,
    parse_object_event,
    parse_pubsub_notification,
    parse_storage_cloudevent,
)

BUCKET = "landing"
GEN = 1_795_971_071_517_388

# Event kind -> (Eventarc CloudEvent type, Pub/Sub notification eventType).
WIRE_KINDS = {
    "finalize": ("google.cloud.storage.object.v1.finalized", "OBJECT_FINALIZE"),
    "delete": ("google.cloud.storage.object.v1.deleted", "OBJECT_DELETE"),
    "metadata": ("google.cloud.storage.object.v1.metadataUpdated", "OBJECT_METADATA_UPDATE"),
    "archive": ("google.cloud.storage.object.v1.archived", "OBJECT_ARCHIVE"),
}


def resource(name: str, generation: int = GEN, bucket: str = BUCKET,
             size: int = 11) -> dict[str, Any]:
    """The object resource as GCS sends it (int64s as strings)."""
    return {"kind": "storage#object", "id": f"{bucket}/{name}/{generation}", "bucket": bucket,
            "name": name, "generation": str(generation), "metageneration": "1",
            "contentType": "text/csv", "size": str(size), "md5Hash": "GTfUie0sFy1NKX4T1KG+5Q==",
            "crc32c": "bIlTkQ==", "etag": "CJ+3", "timeCreated": "2026-11-29T16:51:11.517Z",
            "updated": "2026-11-29T16:51:11.517Z", "storageClass": "STANDARD"}


def eventarc(name: str, generation: int = GEN, kind: str = "finalize",
             bucket: str = BUCKET) -> tuple[str, dict[str, Any]]:
    """(CloudEvent type, data) of Eventarc's Cloud Storage event."""
    return WIRE_KINDS[kind][0], resource(name, generation, bucket)


def notification(name: str, generation: int = GEN, kind: str = "finalize",
                 bucket: str = BUCKET, payload: bool = True) -> tuple[str, dict[str, Any]]:
    """(CloudEvent type, data) of a messagePublished event carrying a GCS notification."""
    message: dict[str, Any] = {
        "attributes": {"payloadFormat": "JSON_API_V1" if payload else "NONE",
                       "eventType": WIRE_KINDS[kind][1], "bucketId": bucket, "objectId": name,
                       "objectGeneration": str(generation),
                       "eventTime": "2026-11-29T16:51:11Z"},
        "messageId": "123", "publishTime": "2026-11-29T16:51:12Z"}
    if payload:
        message["data"] = base64.b64encode(json.dumps(resource(name, generation, bucket))
                                           .encode()).decode()
    return PUBSUB_MESSAGE_TYPE, {"message": message, "subscription": "projects/p/subscriptions/s"}


def pipeline(**trigger: Any) -> Pipeline:
    """A pipeline watching gs://landing/data/ whose own output lives elsewhere."""
    settings: dict[str, Any] = {"bucket": BUCKET, "prefix": "data/", **trigger}
    return Pipeline(name="p", trigger=Trigger(**settings), job=JobTemplate(),
                    checkpoint_uri="gs://ckpt/p", output_uri="gs://models/p")


def finalize(name: str, bucket: str = BUCKET, generation: int = GEN) -> ObjectEvent:
    return ObjectEvent("e1", ObjectEventKind.FINALIZE, bucket, name, generation)


# --- the two forms -------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", list(WIRE_KINDS))
def test_both_forms_give_the_same_object_event(kind: str) -> None:
    a = parse_object_event(*_with_id(eventarc("data/b1/part-0.csv", kind=kind), "ea-1"))
    b = parse_object_event(*_with_id(notification("data/b1/part-0.csv", kind=kind), "ps-1"))
    assert a.event_id == "ea-1" and b.event_id == "ps-1"
    assert a == ObjectEvent("ea-1", kind, BUCKET, "data/b1/part-0.csv", GEN, size=11,
                            time=a.time, content_type="text/csv")
    assert a.time == pytest.approx(1795971071.517)
    assert {**vars(a), "event_id": ""} == {**vars(b), "event_id": ""}


def _with_id(typed: tuple[str, dict[str, Any]], event_id: str) -> tuple[str, str, dict[str, Any]]:
    return typed[0], event_id, typed[1]


def test_notification_without_payload_uses_the_attributes() -> None:
    event = parse_object_event(*_with_id(notification("data/x", payload=False), "7"))
    assert (event.bucket, event.name, event.generation, event.size) == (BUCKET, "data/x", GEN, None)


def test_the_notification_fake_gcs_server_publishes_parses() -> None:
    # Captured from fake-gcs-server (the local stack) publishing into the Pub/Sub emulator.
    data = (b'{"kind":"storage#object","id":"landing/datasets/demo/b1/_SUCCESS#1795971071517388",'
            b'"name":"datasets/demo/b1/_SUCCESS","bucket":"landing","generation":"1795971071517388",'
            b'"contentType":"text/plain","timeCreated":"2026-11-29T16:51:11.517378Z",'
            b'"updated":"2026-11-29T16:51:11.517381Z","storageClass":"STANDARD","size":"11"}')
    message = {"data": base64.b64encode(data).decode(), "attributes": {
        "payloadFormat": "JSON_API_V1", "eventTime": "2026-11-29T16:51:11Z",
        "eventType": "OBJECT_FINALIZE", "bucketId": "landing",
        "objectGeneration": "1795971071517388", "objectId": "datasets/demo/b1/_SUCCESS"}}
    event = parse_pubsub_notification("99", message)
    assert event.kind == ObjectEventKind.FINALIZE and event.size == 11
    assert event.uri == "gs://landing/datasets/demo/b1/_SUCCESS"


def test_data_may_arrive_as_json_bytes() -> None:
    type_, data = eventarc("data/a")
    assert parse_object_event(type_, "1", json.dumps(data).encode()).name == "data/a"


def test_unknown_storage_kinds_pass_through_and_never_trigger() -> None:
    event = parse_storage_cloudevent("google.cloud.storage.object.v1.restored", "1",
                                     resource("data/b/x.csv"))
    assert event.kind == "restored"
    assert skip_reason(pipeline(batch=BatchMode.EACH_OBJECT), event) is not None


# Malformed event -> the field its reason must name.
MALFORMED: dict[str, tuple[str, str, Any]] = {
    "missing bucket": ("finalize", "bucket", lambda d: d.pop("bucket")),
    "missing name": ("finalize", "name", lambda d: d.pop("name")),
    "missing generation": ("finalize", "generation", lambda d: d.pop("generation")),
    "generation not a number": ("finalize", "generation", lambda d: d.update(generation="x7")),
    "generation zero": ("finalize", "generation", lambda d: d.update(generation="0")),
    "negative size": ("finalize", "size", lambda d: d.update(size="-1")),
    "bad time": ("finalize", "updated", lambda d: d.update(updated="yesterday")),
}


@pytest.mark.parametrize("case", list(MALFORMED))
def test_malformed_eventarc_data_names_the_field(case: str) -> None:
    kind, field, spoil = MALFORMED[case]
    type_, data = eventarc("data/a", kind=kind)
    spoil(data)
    with pytest.raises(InvalidEvent, match=field) as caught:
        parse_object_event(type_, "id-1", data)
    assert caught.value.event_id == "id-1" and caught.value.event_type == type_


# Spoiling a notification -> the field its reason must name.
MALFORMED_NOTIFICATIONS: dict[str, tuple[str, Any]] = {
    "no attributes": ("attributes", lambda m: m.pop("attributes")),
    "no eventType": ("eventType", lambda m: m["attributes"].pop("eventType")),
    "no bucketId": ("bucketId", lambda m: m["attributes"].pop("bucketId")),
    "no objectId": ("objectId", lambda m: m["attributes"].pop("objectId")),
    "bad objectGeneration": ("objectGeneration",
                             lambda m: m["attributes"].update(objectGeneration="latest")),
    "data not base64": ("message.data", lambda m: m.update(data="%%%")),
    "data not an object": ("message.data", lambda m: m.update(
        data=base64.b64encode(b"[1]").decode())),
    "data disagrees": ("generation", lambda m: m["attributes"].update(objectGeneration="5")),
}


@pytest.mark.parametrize("case", list(MALFORMED_NOTIFICATIONS))
def test_malformed_notification_names_the_field(case: str) -> None:
    field, spoil = MALFORMED_NOTIFICATIONS[case]
    type_, data = notification("data/a")
    spoil(data["message"])
    with pytest.raises(InvalidEvent, match=field):
        parse_object_event(type_, "id-2", data)


@pytest.mark.parametrize("type_, data", [
    ("google.cloud.pubsub.topic.v1.messagePublished", {"subscription": "s"}),
    ("google.cloud.pubsub.topic.v1.messagePublished", "not json"),
    ("dev.spotorch.run.failed.v1", {"bucket": "b"}),
    ("google.cloud.storage.object.v1.finalized", [1, 2]),
])
def test_not_an_object_event(type_: str, data: Any) -> None:
    with pytest.raises(InvalidEvent):
        parse_object_event(type_, "1", data)


def test_an_event_without_id_cannot_be_deduplicated_so_it_is_invalid() -> None:
    type_, data = eventarc("data/a")
    with pytest.raises(InvalidEvent, match="id"):
        parse_object_event(type_, "", data)


# --- matching -------------------------------------------------------------------------------------


@pytest.mark.parametrize("name, reason", [
    ("data/b1/part-0.csv", None),
    ("elsewhere/b1/part-0.csv", "outside the trigger prefix"),
    ("data/b1/", "a folder placeholder"),
    ("data/b1/part-0.csv.tmp", "ignore rule"),
    ("data/b1/_temporary/0/part-0.csv", "ignore rule"),
    ("data/b1/.part-0.csv.crc", "ignore rule"),
    ("data/.staging/part-0.csv", "ignore rule"),
    ("data/part-0.csv", "not inside a snapshot folder"),
    ("data/b1/part-0.json", "glob or suffixes"),
])
def test_which_objects_feed_a_pipeline(name: str, reason: str | None) -> None:
    p = pipeline(batch=BatchMode.QUIET_PERIOD, suffixes=(".csv",))
    why = skip_reason(p, finalize(name))
    assert (why is None) if reason is None else (why is not None and reason in why)


def test_other_buckets_never_match() -> None:
    assert skip_reason(pipeline(), finalize("data/b/x", bucket="other")) == "another bucket"


@pytest.mark.parametrize("kind", ["delete", "metadata", "archive"])
def test_deletes_and_metadata_updates_never_trigger(kind: str) -> None:
    for type_, data in (eventarc("data/b1/_SUCCESS", kind=kind),
                        notification("data/b1/_SUCCESS", kind=kind)):
        event = parse_object_event(type_, "1", data)
        assert match(pipeline(batch=BatchMode.MARKER), event) is None


def test_a_pipelines_own_writes_never_trigger_it_even_inside_its_trigger_prefix() -> None:
    # The loader rejects this layout; the rule holds regardless, for every output root.
    p = Pipeline(name="p", trigger=Trigger(bucket=BUCKET, prefix="", batch=BatchMode.EACH_OBJECT),
                 job=JobTemplate(base_output_uri=f"gs://{BUCKET}/vertex"),
                 checkpoint_uri=f"gs://{BUCKET}/ckpt/p", output_uri=f"gs://{BUCKET}/models/p/")
    for name in ("ckpt/p/run-1/step-0000000010/_COMPLETE", "models/p/run-1/model.npz",
                 "vertex/logs/x.txt"):
        assert "own jobs" in (skip_reason(p, finalize(name)) or "")
    assert match(p, finalize("ckpt/p2/x")) is not None  # a sibling prefix is not its own
    assert match(p, finalize("data/x.csv")) is not None


def test_glob_applies_below_the_prefix() -> None:
    p = pipeline(batch=BatchMode.QUIET_PERIOD, glob="*/part-*.parquet")
    assert match(p, finalize("data/b1/part-7.parquet")) is not None
    assert match(p, finalize("data/b1/other.parquet")) is None


def test_extra_ignore_rules_and_a_leading_slash() -> None:
    p = pipeline(batch=BatchMode.QUIET_PERIOD, ignore=("*.tmp", "data/*/_logs/*"))
    assert match(p, finalize("data/b1/_logs/x")) is None
    assert match(p, finalize("data/b1/x")) is not None


@pytest.mark.parametrize("batch, depth, name, key", [
    (BatchMode.EACH_OBJECT, 1, "data/b1/x.csv", "data/b1/x.csv"),
    (BatchMode.MARKER, 0, "data/b1/x.csv", "data/"),
    (BatchMode.MARKER, 1, "data/b1/x.csv", "data/b1/"),
    (BatchMode.MARKER, 1, "data/b1/sub/x.csv", "data/b1/"),
    (BatchMode.MARKER, 2, "data/2025/01/x.csv", "data/2025/01/"),
    (BatchMode.MARKER, 2, "data/2025/x.csv", None),
    (BatchMode.MARKER, 1, "data//x.csv", None),
])
def test_snapshot_key_is_the_folder_at_snapshot_depth(batch: BatchMode, depth: int, name: str,
                                                      key: str | None) -> None:
    assert snapshot_key(Trigger(bucket=BUCKET, prefix="data/", batch=batch,
                                snapshot_depth=depth), name) == key


def test_marker_is_recognised_whatever_the_suffixes_and_only_at_the_folder_root() -> None:
    p = pipeline(batch=BatchMode.MARKER, suffixes=(".csv",))
    found = match(p, finalize("data/b1/_SUCCESS"))
    assert found is not None and found.is_marker and found.data_uri == "gs://landing/data/b1/"
    assert match(p, finalize("data/b1/sub/_SUCCESS")) is None  # not the marker, not a .csv
    data = match(p, finalize("data/b1/part-0.csv"))
    assert data is not None and not data.is_marker
