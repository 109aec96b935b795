"""A Spark step's batch heard from Dataproc's audit entries (issue 42): the end entry of a
batch's CreateBatch operation reaches on_job_event as Eventarc delivers it, is only a hint, and
the run moves on GetBatch's answer alone; other entries are acknowledged, malformed ones recorded.
In memory (the twin of the batch controller), through the functions framework."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from spotorch.adapters.memory.batches import InMemoryBatches
from spotorch.app.deps import Deps
from spotorch.core import preprocess as pp
from spotorch.core import spark_batches as sb
from spotorch.core.errors import InvalidEvent
from spotorch.core.model import RunStatus
from spotorch.entrypoints.batch_entries import CREATE_BATCH, batch_hint
from test_service_preprocess import post_event
from test_spark_step import load, make_deps, start, step

PROJECT = "spotorch-test"
BATCH = f"projects/{PROJECT}/locations/us-central1/batches/spotorch-r1-pre1"


def entry(resource: str = BATCH, *, method: str = CREATE_BATCH, last: bool | None = True,
          service: str = "dataproc.googleapis.com") -> dict[str, Any]:
    """An Admin Activity LogEntry as Cloud Audit Logs writes one (the fields spotorch reads)."""
    out: dict[str, Any] = {
        "protoPayload": {"@type": "type.googleapis.com/google.cloud.audit.AuditLog",
                         "serviceName": service, "methodName": method,
                         "resourceName": resource},
        "insertId": "x1", "timestamp": "2026-12-06T00:00:00.000000Z",
        "logName": f"projects/{PROJECT}/logs/cloudaudit.googleapis.com%2Factivity"}
    if last is not None:
        out["operation"] = {"id": f"{BATCH}/operations/1", "producer": service, "last": last}
    return out


def event(data: Any, event_id: str) -> Any:
    from cloudevents.http import CloudEvent

    return CloudEvent({"type": "google.cloud.audit.log.v1.written", "id": event_id,
                       "source": f"//cloudaudit.googleapis.com/projects/{PROJECT}/logs/activity"},
                      data)


def test_the_end_entry_names_the_batch_and_others_name_nothing() -> None:
    hint = batch_hint(entry())
    assert hint is not None
    assert (hint.project, hint.region, hint.job_name, hint.job_id) == \
        (PROJECT, "us-central1", "spotorch-r1-pre1", BATCH)
    assert batch_hint(entry(last=False)) is None  # the request accepted, not an end
    assert batch_hint(entry(last=None)) is None
    assert batch_hint(entry(method="google.cloud.dataproc.v1.ClusterController."
                                   "CreateCluster")) is None
    by_request = entry(resource=f"projects/{PROJECT}/locations/us-central1")
    by_request["protoPayload"]["request"] = {"parent": f"projects/{PROJECT}/locations/us-central1",
                                             "batchId": "spotorch-r1-pre1"}
    assert batch_hint(by_request) == hint


@pytest.mark.parametrize(("data", "says"), [
    (entry(service="bigquery.googleapis.com"), "serviceName"),
    (entry(resource="projects/p/locations/l/clusters/c"), "resourceName"),
    ({"protoPayload": "x"}, "protoPayload"),
    ("{not json", "not JSON"),
])
def test_malformed_entries_are_refused_naming_the_field(data: Any, says: str) -> None:
    with pytest.raises(InvalidEvent, match=says):
        batch_hint(data)


@pytest.fixture
def wired(monkeypatch: pytest.MonkeyPatch) -> tuple[Deps, InMemoryBatches]:
    from spotorch.entrypoints import functions as entry_points

    deps, batches, _ = make_deps()
    deps = replace(deps, project=PROJECT)
    monkeypatch.setattr(entry_points, "deps", lambda: deps)
    return deps, batches


def test_the_end_entry_moves_the_run_on_get_batchs_answer_only(
        wired: tuple[Deps, InMemoryBatches]) -> None:
    deps, batches = wired
    start(deps, "r1")
    batches.set_state("spotorch-r1-pre1", sb.BATCH_RUNNING)
    reads = batches.reads
    # a forged or early entry: GetBatch says RUNNING, the run keeps preprocessing
    assert post_event(event(entry(), "a1")).status_code == 200
    assert batches.reads == reads + 1  # the hint was checked with GetBatch
    assert load(deps, "r1").status is RunStatus.PREPROCESSING
    assert step(load(deps, "r1")).state == sb.BATCH_RUNNING
    batches.set_state("spotorch-r1-pre1", sb.BATCH_SUCCEEDED, milli_dcu_s=3_600_000.0)
    assert post_event(event(entry(), "a2")).status_code == 200  # no tick: the hint moved it
    run = load(deps, "r1")
    assert run.status is RunStatus.STARTING and step(run).phase is pp.StepPhase.DONE
    # a redelivery, another project's batch and a batch spotorch never made change nothing
    for data, event_id in ((entry(), "a2"), (entry(BATCH.replace(PROJECT, "other")), "a3"),
                           (entry(BATCH.replace("spotorch-r1-pre1", "someone-else")), "a4")):
        assert post_event(event(data, event_id)).status_code == 200
    assert len(load(deps, "r1").attempts) == 1


def test_a_malformed_entry_is_acknowledged_and_recorded(
        wired: tuple[Deps, InMemoryBatches]) -> None:
    deps, _ = wired
    assert post_event(event(entry(resource="projects/p/clusters/c"), "bad1")).status_code == 200
    record, _ = deps.docs.get("rejected_events", "bad1")
    assert record is not None and "resourceName" in record["reason"]
