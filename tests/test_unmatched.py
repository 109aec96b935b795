"""Uploads that match no pipeline (spotorch.app.unmatched) and a failed attempt's stderr tail
(spotorch.app.job_events), on the in-memory adapters."""

from __future__ import annotations

from dataclasses import replace

from fakes import fake_deps
from operator_runs import NIGHTLY, TRACEBACK, deps_for, every_kind
from spotorch.adapters.memory.twins import InMemoryJobLogs, InMemoryLauncher, ManualClock
from spotorch.app import unmatched
from spotorch.app.arrivals import data_arrived
from spotorch.app.deps import Deps
from spotorch.app.job_events import job_changed
from spotorch.app.runs import submit
from spotorch.core.alerts import render_alert
from spotorch.core.events import kind_of
from spotorch.core.model import FailureClass, JobPhase
from spotorch.core.triggers import ObjectEvent, ObjectEventKind
from spotorch.settings import COLLECTION_UNMATCHED
from spotorch.spec.event_schemas import validate_event

T0 = 1_800_000_000.0


def world() -> Deps:
    deps = fake_deps(NIGHTLY)
    deps.clock = ManualClock(T0)
    return deps


def upload(deps: Deps, name: str, generation: int = 1, *, exists: bool = True,
           kind: str = ObjectEventKind.FINALIZE, bucket: str = "landing") -> None:
    if exists:
        deps.objects.put(bucket, name, generation, b"x")  # type: ignore[attr-defined]
    data_arrived(deps, ObjectEvent(f"ev-{name}-{generation}", kind, bucket, name, generation,
                                   time=deps.clock.now()))


def records(deps: Deps) -> list[dict[str, object]]:
    return [dict(d) for d in deps.docs.query(COLLECTION_UNMATCHED, "format", 1)]


def test_an_unmatched_upload_is_recorded_per_folder_with_each_pipelines_rule() -> None:
    deps = world()
    upload(deps, "nightly/2027-01-15/_SUCCESS")  # the producer's marker, not the pipeline's
    upload(deps, "nighly/2027-01-15/part-0.csv")  # a typo in the prefix
    by_folder = {d["folder"]: d for d in records(deps)}
    assert set(by_folder) == {"nightly/2027-01-15/", "nighly/2027-01-15/"}
    [miss] = by_folder["nightly/2027-01-15/"]["objects"][0]["misses"]  # type: ignore[index]
    assert miss["rule"] == "selection" and miss["expected"]["marker"] == "_DONE"
    assert "this pipeline's marker is _DONE" in miss["text"]
    [typo] = by_folder["nighly/2027-01-15/"]["objects"][0]["misses"]  # type: ignore[index]
    assert typo["rule"] == "prefix" and typo["expected"]["prefix"] == "nightly/"


def test_what_a_pipeline_means_to_skip_or_never_exists_is_not_recorded() -> None:
    deps = world()
    upload(deps, "nightly/2027-01-15/part-0.tmp")  # the built-in ignore rules
    upload(deps, "nightly/2027-01-15/_SUCCESS", kind=ObjectEventKind.DELETE)
    upload(deps, "model/nightly/x.bin", bucket="models")  # a bucket no pipeline watches
    upload(deps, "nightly/2027-01-16/_SUCCESS", exists=False)  # a forged or stale event
    assert records(deps) == []


def test_a_noisy_folder_keeps_a_bounded_sample_and_writes_seldom() -> None:
    deps = world()
    for i in range(40):
        upload(deps, f"other/day/f{i}.json")
    [doc] = records(deps)
    assert len(doc["objects"]) == unmatched.MAX_SAMPLE and doc["overflow"] is True  # type: ignore[arg-type]
    puts = deps.docs.round_trips  # type: ignore[attr-defined]
    for i in range(40, 80):
        upload(deps, f"other/day/f{i}.json")  # within COALESCE_S: reads only
    assert deps.docs.round_trips - puts == 40  # type: ignore[attr-defined]


def test_one_alert_once_the_upload_is_quiet_and_it_validates() -> None:
    deps = world()
    upload(deps, "nightly/2027-01-15/_SUCCESS")
    pipelines = tuple(deps.pipelines.values())

    def alert() -> int:
        return unmatched.alert_quiet_uploads(deps.docs, deps.publisher, pipelines,
                                             deps.clock.now(), quiet_s=600)

    assert alert() == 0  # not quiet yet
    deps.clock.advance(601)  # type: ignore[attr-defined]
    deps.publisher.fail_next = 1  # type: ignore[attr-defined]
    assert alert() == 0  # Pub/Sub refused: the next tick tries again
    assert alert() == 1 and alert() == 0
    [event] = [e for e in deps.publisher.events  # type: ignore[attr-defined]
               if kind_of(e["type"]) == "upload.unmatched"]
    assert validate_event(event) == [] and event["data"]["pipeline"] == "nightly"
    assert event["data"]["objects"] == ["nightly/2027-01-15/_SUCCESS"]
    headline = render_alert(event).headline
    assert headline.startswith("Upload to gs://landing/nightly/2027-01-15/ matched no pipeline")
    assert "_DONE" in headline


def test_no_alert_when_the_pipelines_were_fixed_meanwhile() -> None:
    deps = world()
    upload(deps, "nightly/2027-01-15/_SUCCESS")
    fixed = replace(NIGHTLY, trigger=replace(NIGHTLY.trigger, marker="_SUCCESS"))
    deps.clock.advance(601)  # type: ignore[attr-defined]
    assert unmatched.alert_quiet_uploads(deps.docs, deps.publisher, (fixed,), deps.clock.now(),
                                         quiet_s=600) == 0
    [doc] = records(deps)
    assert doc["resolved"] is True and doc["alerted"] is True


def test_an_upload_inside_a_watched_prefix_waits_for_its_marker() -> None:
    from spotorch.app.queries import DocumentArrivalReader
    from spotorch.app.views import snapshot_view

    deps = world()
    upload(deps, "nightly/2027-01-15/part-0.csv")
    assert records(deps) == []  # it matches: a snapshot, not an unmatched upload
    [doc] = DocumentArrivalReader(deps.docs).snapshots(10)
    view = snapshot_view(doc, NIGHTLY)
    assert view["state"] == "open" and "waiting for its marker _DONE" in view["summary"]


# ---------------------------------------------------------------- a failed attempt's stderr

def test_a_user_error_keeps_the_stderr_tail_and_the_alerts_name_its_last_line() -> None:
    deps = deps_for()
    runs = every_kind(deps)
    failed = runs["failed"]
    assert [a.error_tail for a in failed.attempts] == [TRACEBACK, TRACEBACK]
    ended = [e for e in deps.publisher.events  # type: ignore[attr-defined]
             if kind_of(e["type"]) in ("attempt.ended", "run.failed")
             and e["data"]["run_id"] == failed.run_id]
    assert ended and all(e["data"]["error"] == TRACEBACK[-1] for e in ended)
    assert all(validate_event(e) == [] for e in ended)
    assert TRACEBACK[-1] in render_alert(ended[-1]).headline


def test_a_preemption_reads_no_logs_and_a_failed_read_holds_nothing_up() -> None:
    deps = deps_for()
    logs = deps.job_logs
    assert isinstance(logs, InMemoryJobLogs) and isinstance(deps.launcher, InMemoryLauncher)
    run = submit(deps, "ops", "gs://landing/ops/x/", request_id="p")
    assert run is not None
    job = deps.launcher.job_of(run.run_id, 1)
    job_changed(deps, run.run_id, 1, deps.launcher.set_status(job, JobPhase.RUNNING))
    job_changed(deps, run.run_id, 1, deps.launcher.set_status(
        job, JobPhase.FAILED, failure=FailureClass.PREEMPTED))
    assert logs.reads == 0  # Vertex's doing, not the code's: no Cloud Logging read spent
    job2 = deps.launcher.job_of(run.run_id, 2)
    job_changed(deps, run.run_id, 2, deps.launcher.set_status(job2, JobPhase.RUNNING))
    logs.fail_next = 1
    after = job_changed(deps, run.run_id, 2, deps.launcher.set_status(
        job2, JobPhase.FAILED, failure=FailureClass.USER_ERROR, exit_code=1))
    assert logs.reads == 1 and after.attempts[1].failure is FailureClass.USER_ERROR
    assert after.attempts[1].error_tail == ()  # not read: the run went on without it
