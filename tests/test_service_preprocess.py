"""A run with a preprocess step through the service layer (in-memory twins, issue 31):
PREPROCESSING -> the Dataflow job -> training on its output; the cache by content; failures,
cancels, duplicated and lost events."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from fakes import fake_deps
from spotorch.adapters.memory.steps import InMemoryStepOutputs, InMemorySteps
from spotorch.adapters.memory.twins import InMemoryLauncher, InMemoryPublisher, ManualClock
from spotorch.app.deps import Deps
from spotorch.app.runs import cancel_run, start_run
from spotorch.app.tick import tick
from spotorch.app.unit_of_work import apply
from spotorch.core import preprocess as pp
from spotorch.core.events import kind_of
from spotorch.core.model import FailureClass, JobPhase, Run, RunStatus
from spotorch.core.observations import PreprocessObserved
from spotorch.core.pipeline import (
    EscalationKind,
    JobTemplate,
    OnActiveRun,
    Pipeline,
    Preprocess,
    PythonPackage,
    RecoveryPolicy,
    Trigger,
    WorkerPool,
)
from spotorch.core.preprocessing import step_of
from spotorch_trainer import contract

PACKAGE = PythonPackage(package_uri="gs://s/p.tgz", executor_image_uri="img",
                        python_module="trainer.task",
                        package_uris=("gs://s/packages/0123456789abcdef/p.tgz",))
STEP = Preprocess(python_module="trainer.preprocess", output_uri="gs://prep/p",
                  options=(("num_shards", "2"),))
CONTENT = {"a.csv": (10, "crcA"), "b.csv": (20, "crcB")}


def make_deps(step: Preprocess = STEP) -> tuple[Deps, InMemorySteps, InMemoryStepOutputs]:
    pipeline = Pipeline(name="p", trigger=Trigger(bucket="b", on_active_run=OnActiveRun.PARALLEL),
                        job=JobTemplate(worker_pools=(WorkerPool(python_package=PACKAGE),)),
                        checkpoint_uri="gs://c/p", output_uri="gs://m/p",
                        recovery=RecoveryPolicy(escalation=EscalationKind.NEVER),
                        preprocess=step)
    steps, outputs = InMemorySteps(), InMemoryStepOutputs()
    outputs.folders["gs://b/d1/"] = dict(CONTENT)
    outputs.folders["gs://b/d2/"] = dict(CONTENT)  # a second snapshot, the same files
    deps = replace(fake_deps(pipeline), steps=steps, step_outputs=outputs)
    return deps, steps, outputs


def start(deps: Deps, run_id: str, data_uri: str = "gs://b/d1/") -> Run:
    run = start_run(deps, "p", run_id=run_id, data_uri=data_uri, snapshot_id=run_id, reason="t")
    assert run is not None
    return run


def load(deps: Deps, run_id: str) -> Run:
    run, _ = deps.runs.load(run_id)
    assert run is not None
    return run


def kinds(deps: Deps) -> list[str]:
    assert isinstance(deps.publisher, InMemoryPublisher)
    return [kind_of(t) for t in deps.publisher.types()]


def step(run: Run) -> pp.PreprocessStep:
    found = step_of(run)
    assert found is not None
    return found


def test_the_run_preprocesses_then_trains_on_the_output() -> None:
    deps, steps, outputs = make_deps()
    run = start(deps, "r1")
    assert run.status is RunStatus.PREPROCESSING and run.attempts == ()
    assert steps.created == 1 and steps.jobs[0].request.job_name == "spotorch-r1-pre1"
    request = steps.jobs[0].request
    assert request.input_uri == "gs://b/d1/" and request.output_uri == step(run).output_uri
    assert request.package_uris == PACKAGE.package_uris
    assert request.python_module == "trainer.preprocess"
    assert "run.preprocess_started" in kinds(deps)
    steps.set_state("spotorch-r1-pre1", "JOB_STATE_RUNNING")
    tick(deps)
    assert load(deps, "r1").status is RunStatus.PREPROCESSING
    steps.set_state("spotorch-r1-pre1", pp.JOB_STATE_DONE, vcpu_s=3600.0)
    tick(deps)  # the backstop: no event came
    run = load(deps, "r1")
    assert run.status is RunStatus.STARTING and step(run).phase is pp.StepPhase.DONE
    assert not step(run).cache_hit and step(run).vcpu_s == 3600.0
    assert pp.marker_uri(step(run)) in outputs.markers  # written after GetJob said DONE
    launcher = deps.launcher
    assert isinstance(launcher, InMemoryLauncher)
    job = launcher.jobs[launcher.job_of("r1", 1)]
    assert job.spec.env[contract.ENV_DATA_URI] == step(run).output_uri
    assert "run.preprocess_ended" in kinds(deps)


def test_a_second_snapshot_with_the_same_content_reuses_the_output() -> None:
    deps, steps, _ = make_deps()
    start(deps, "r1")
    steps.set_state("spotorch-r1-pre1", pp.JOB_STATE_DONE)
    tick(deps)
    run = start(deps, "r2", data_uri="gs://b/d2/")
    assert steps.created == 1  # no second Dataflow job
    assert run.status is RunStatus.STARTING and step(run).cache_hit
    assert step(run).output_uri == step(load(deps, "r1")).output_uri


def test_different_content_is_preprocessed_again() -> None:
    deps, steps, outputs = make_deps()
    outputs.folders["gs://b/d2/"] = {**CONTENT, "c.csv": (5, "crcC")}
    start(deps, "r1")
    steps.set_state("spotorch-r1-pre1", pp.JOB_STATE_DONE)
    tick(deps)
    run = start(deps, "r2", data_uri="gs://b/d2/")
    assert steps.created == 2 and not step(run).cache_hit


def test_a_failing_transform_fails_the_run_with_its_error_text() -> None:
    deps, steps, _ = make_deps()
    start(deps, "r1")
    steps.set_state("spotorch-r1-pre1", pp.JOB_STATE_FAILED,
                    error="Error message from worker: Traceback (most recent call last):\n"
                          "ValueError: could not convert string to float: 'oops'")
    tick(deps)
    run = load(deps, "r1")
    assert run.status is RunStatus.FAILED and run.attempts == ()
    assert run.end_reason is not None and "could not convert string to float" in run.end_reason
    assert "user_error" in run.end_reason and steps.created == 1


def test_duplicated_and_late_answers_launch_nothing_more() -> None:
    deps, steps, _ = make_deps()
    start(deps, "r1")
    done = steps.set_state("spotorch-r1-pre1", pp.JOB_STATE_DONE)
    for _ in range(3):
        apply(deps, "r1", [PreprocessObserved(done)])
    late = replace(done, state="JOB_STATE_RUNNING")
    apply(deps, "r1", [PreprocessObserved(late)])
    run = load(deps, "r1")
    assert run.status is RunStatus.STARTING and len(run.attempts) == 1 and steps.created == 1
    assert kinds(deps).count("run.preprocess_ended") == 1


def test_a_training_relaunch_never_repeats_the_finished_step() -> None:
    deps, steps, _ = make_deps()
    start(deps, "r1")
    steps.set_state("spotorch-r1-pre1", pp.JOB_STATE_DONE)
    tick(deps)
    launcher, clock = deps.launcher, deps.clock
    assert isinstance(launcher, InMemoryLauncher) and isinstance(clock, ManualClock)
    first = launcher.job_of("r1", 1)
    launcher.set_status(first, JobPhase.RUNNING)
    tick(deps)
    launcher.set_status(first, JobPhase.FAILED, failure=FailureClass.PREEMPTED)
    tick(deps)
    clock.advance(600)
    tick(deps)
    run = load(deps, "r1")
    assert len(run.attempts) == 2 and steps.created == 1
    second = launcher.jobs[launcher.job_of("r1", 2)]
    assert second.spec.env[contract.ENV_DATA_URI] == step(run).output_uri


def test_cancelling_the_run_cancels_its_dataflow_job() -> None:
    deps, steps, _ = make_deps()
    start(deps, "r1")
    cancel_run(deps, "r1", "operator")
    assert steps.cancelled == ["spotorch-r1-pre1"]
    run = load(deps, "r1")
    assert run.status is RunStatus.CANCELLING
    tick(deps)  # the twin ended the job CANCELLED at once: GetJob says so
    run = load(deps, "r1")
    assert run.status is RunStatus.CANCELLED and step(run).phase is pp.StepPhase.CANCELLED


def test_an_infrastructure_failure_relaunches_under_the_next_name() -> None:
    deps, steps, _ = make_deps()
    start(deps, "r1")
    steps.set_state("spotorch-r1-pre1", pp.JOB_STATE_FAILED, error="Workflow failed: internal error")
    tick(deps)
    run = load(deps, "r1")
    assert run.status is RunStatus.PREPROCESSING and steps.created == 2
    assert step(run).job_name == "spotorch-r1-pre2"


# --- the statusChanged event through the function (functions-framework's test client) --------

MAIN = str(Path(__file__).resolve().parent.parent / "functions" / "main.py")


def status_event(job: pp.JobView, event_id: str, state: str | None = None,
                 project: str = "") -> Any:
    from cloudevents.http import CloudEvent

    return CloudEvent({"type": pp.STATUS_CHANGED_TYPE, "id": event_id,
                       "source": "//dataflow.googleapis.com/projects/p/locations/us-central1",
                       "subject": f"jobs/{job.job_id}"},
                      {"payload": {"id": job.job_id, "projectId": project or "spotorch-test",
                                   "name": job.name, "location": "us-central1",
                                   "currentState": state or job.state,
                                   "type": "JOB_TYPE_BATCH"}})


def post_event(event: Any) -> Any:
    import functions_framework
    from cloudevents.conversion import to_binary

    headers, body = to_binary(event)
    app = functions_framework.create_app("on_job_event", MAIN, "cloudevent").test_client()
    return app.post("/", headers=headers, data=body)


@pytest.fixture
def wired(monkeypatch: pytest.MonkeyPatch) -> tuple[Deps, InMemorySteps]:
    from spotorch.entrypoints import functions as entry

    deps, steps, _ = make_deps()
    deps = replace(deps, project="spotorch-test")
    monkeypatch.setattr(entry, "deps", lambda: deps)
    return deps, steps


def test_a_status_changed_event_is_checked_against_get_job(
        wired: tuple[Deps, InMemorySteps]) -> None:
    deps, steps = wired
    start(deps, "r1")
    running = steps.set_state("spotorch-r1-pre1", "JOB_STATE_RUNNING")
    # the event claims DONE; GetJob says RUNNING: the run keeps preprocessing
    assert post_event(status_event(running, "e1", state=pp.JOB_STATE_DONE)).status_code == 200
    assert load(deps, "r1").status is RunStatus.PREPROCESSING
    assert step(load(deps, "r1")).phase is pp.StepPhase.RUNNING
    done = steps.set_state("spotorch-r1-pre1", pp.JOB_STATE_DONE)
    assert post_event(status_event(done, "e2")).status_code == 200
    assert load(deps, "r1").status is RunStatus.STARTING
    # a redelivery and a job spotorch never launched change nothing
    assert post_event(status_event(done, "e2")).status_code == 200
    stranger = pp.JobView(job_id="x", name="someone-elses-job", state=pp.JOB_STATE_DONE)
    assert post_event(status_event(stranger, "e3")).status_code == 200
    assert len(load(deps, "r1").attempts) == 1


def test_a_malformed_status_changed_event_is_acknowledged_and_recorded(
        wired: tuple[Deps, InMemorySteps]) -> None:
    from cloudevents.http import CloudEvent

    deps, _ = wired
    bad = CloudEvent({"type": pp.STATUS_CHANGED_TYPE, "id": "bad1",
                      "source": "//dataflow.googleapis.com/projects/p/locations/l"},
                     {"payload": {"id": "j", "currentState": "DONE"}})
    assert post_event(bad).status_code == 200
    record, _ = deps.docs.get("rejected_events", "bad1")
    assert record is not None and "lacks" in record["reason"]


# --- what operators see: `spotorch show` and the web view's run page ----------------------------


def test_show_and_the_run_page_tell_the_step(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from spotorch.app.queries import DocumentRunReader, DocumentSweepReader
    from spotorch.app.views import run_view
    from spotorch.operate.backend import Backend
    from spotorch.operate.cli import cli
    from spotorch.operate.logsource import LocalWorkerLogs
    from spotorch.operate.ui.pages import run_page

    deps, steps, _ = make_deps()
    start(deps, "r1")
    steps.set_state("spotorch-r1-pre1", pp.JOB_STATE_DONE, vcpu_s=7200.0)
    tick(deps)
    start(deps, "r2", data_uri="gs://b/d2/")
    backend = Backend(reader=DocumentRunReader(deps.docs), sweeps=DocumentSweepReader(deps.docs),
                      actions=None,  # type: ignore[arg-type]  # show needs no actions
                      logs=LocalWorkerLogs(tmp_path / "vertex"), pipelines=deps.pipelines,
                      clock=deps.clock.now)
    first = CliRunner().invoke(cli, ["show", "r1"], obj=backend, prog_name="spotorch")
    assert first.exit_code == 0, first.output
    flat = " ".join(first.output.split())
    assert "preprocess" in flat and "DONE JOB_STATE_DONE" in flat
    assert "spotorch-r1-pre1" in flat and step(load(deps, "r1")).output_uri in flat
    assert "miss: key" in flat and "the preprocess step cost" in flat
    second = CliRunner().invoke(cli, ["show", "r2", "--json"], obj=backend, prog_name="spotorch")
    view = json.loads(second.output)
    assert view["preprocess"]["cache_hit"] is True and view["preprocess"]["job_name"] is None
    assert view["preprocess"]["cost"] == 0.0
    page = run_page(run_view(load(deps, "r2"), deps.pipeline("p"), deps.clock.now()), "",
                    target="local", refresh_s=0)
    assert '<section class="preprocess cache-hit">' in page and "hit (output reused)" in page


def test_a_launch_refused_for_good_ends_the_run_failed_launch() -> None:
    from spotorch.ports.steps import StepLaunchError

    deps, steps, _ = make_deps()
    steps.fail_launch = StepLaunchError("Permission 'dataflow.jobs.create' denied", permanent=True)
    run = start(deps, "r1")
    assert run.status is RunStatus.FAILED_LAUNCH and steps.created == 0
    assert run.end_reason is not None and "dataflow.jobs.create" in run.end_reason


def test_a_transient_launch_failure_is_retried_by_the_tick() -> None:
    from spotorch.ports.steps import StepLaunchError

    deps, steps, _ = make_deps()
    steps.fail_launch = StepLaunchError("503 Service Unavailable")
    run = start(deps, "r1")
    assert run.status is RunStatus.PREPROCESSING and steps.created == 0
    steps.fail_launch = None
    clock = deps.clock
    assert isinstance(clock, ManualClock)
    clock.advance(600)  # the launch intent's claim has lapsed: the tick takes it over
    tick(deps)
    assert steps.created == 1 and step(load(deps, "r1")).job_name == "spotorch-r1-pre1"


def test_every_status_has_a_meaning_for_people() -> None:
    """`spotorch show`, the API and the web view state each status's meaning (a status
    without one made run_view fail with KeyError: PROBING, FAILED_QUOTA, ...)."""
    from spotorch.app.views import STATUS_MEANING

    assert set(STATUS_MEANING) == set(RunStatus)


# --- exact reruns through the step (issue 30): the recorded generations and code -------------

PINNED = (("d1/a.csv", 1), ("d1/b.csv", 2))


def pinned_deps() -> tuple[Deps, InMemorySteps, InMemoryStepOutputs]:
    deps, steps, outputs = make_deps()
    outputs.versions.update({("d1/a.csv", 1): (10, "crcA"), ("d1/b.csv", 2): (20, "crcB")})
    return deps, steps, outputs


def start_pinned(deps: Deps, run_id: str) -> Run:
    run = start_run(deps, "p", run_id=run_id, data_uri="gs://b/d1/", snapshot_id=run_id,
                    reason="t", objects=PINNED)
    assert run is not None
    return run


def test_a_pinned_run_is_keyed_by_its_generations_and_its_job_gets_the_manifest() -> None:
    deps, steps, outputs = pinned_deps()
    run = start_pinned(deps, "r1")
    request = steps.jobs[0].request
    assert request.inputs_uri is not None and request.inputs_uri == pp.inputs_uri(step(run))
    staged = outputs.markers[request.inputs_uri]
    assert staged["objects"] == [{"name": "d1/a.csv", "generation": 1},
                                 {"name": "d1/b.csv", "generation": 2}]
    # The live folder changes (b.csv overwritten): the key stays the recorded generations'.
    outputs.folders["gs://b/d1/"] = {**CONTENT, "b.csv": (21, "crcB2")}
    outputs.versions[("d1/b.csv", 3)] = (21, "crcB2")
    expected = pp.new_step(deps.pipeline("p"), pp.input_identity(
        "r1", "gs://b/d1/", outputs.content_digest("gs://b/d1/", PINNED))).cache_key
    assert step(run).cache_key == expected
    assert expected != pp.new_step(deps.pipeline("p"), pp.input_identity(
        "r1", "gs://b/d1/", outputs.content_digest("gs://b/d1/"))).cache_key


def test_a_rerun_after_an_overwrite_reuses_the_cached_output() -> None:
    from spotorch.app.runs import rerun_run

    deps, steps, outputs = pinned_deps()
    start_pinned(deps, "r1")
    steps.set_state("spotorch-r1-pre1", pp.JOB_STATE_DONE)
    tick(deps)
    origin = load(deps, "r1")
    outputs.folders["gs://b/d1/"] = {**CONTENT, "b.csv": (21, "crcB2")}  # b.csv overwritten
    outputs.versions[("d1/b.csv", 3)] = (21, "crcB2")
    again = rerun_run(deps, "r1", "x")
    assert steps.created == 1 and step(again).cache_hit
    assert step(again).cache_key == step(origin).cache_key


def test_a_rerun_whose_cache_is_gone_runs_the_step_on_the_recorded_inputs_and_code() -> None:
    from spotorch.app.runs import rerun_run

    deps, steps, outputs = pinned_deps()
    start_pinned(deps, "r1")
    steps.set_state("spotorch-r1-pre1", pp.JOB_STATE_DONE)
    tick(deps)
    origin = load(deps, "r1")
    outputs.markers.pop(pp.marker_uri(step(origin)))  # the cached output was deleted
    # Today's build of the package differs: the rerun still runs the recorded one.
    today = PythonPackage(package_uri="gs://s/p.tgz", executor_image_uri="img",
                          python_module="trainer.task",
                          package_uris=("gs://s/packages/fedcba9876543210/p.tgz",))
    pipeline = deps.pipeline("p")
    newer = replace(pipeline, job=replace(pipeline.job, worker_pools=(
        WorkerPool(python_package=today),)))
    deps = replace(deps, pipelines={"p": newer})
    again = rerun_run(deps, "r1", "y")
    assert steps.created == 2 and not step(again).cache_hit
    assert step(again).cache_key == step(origin).cache_key
    request = steps.jobs[-1].request
    assert request.package_uris == PACKAGE.package_uris and request.inputs_uri is not None
    assert outputs.markers[request.inputs_uri]["objects"] == [
        {"name": "d1/a.csv", "generation": 1}, {"name": "d1/b.csv", "generation": 2}]


def test_a_rerun_runs_the_recorded_module_and_options_not_todays() -> None:
    from spotorch.app.runs import rerun_run

    deps, steps, outputs = pinned_deps()
    start_pinned(deps, "r1")
    steps.set_state("spotorch-r1-pre1", pp.JOB_STATE_DONE)
    tick(deps)
    origin = load(deps, "r1")
    assert origin.provenance is not None
    assert origin.provenance["preprocess"] == {"python_module": "trainer.preprocess",
                                               "template_uri": None,
                                               "options": dict(STEP.options)}
    outputs.markers.pop(pp.marker_uri(step(origin)))  # the step must run again
    pipeline = deps.pipeline("p")
    assert pipeline.preprocess is not None
    renamed = replace(pipeline, preprocess=replace(pipeline.preprocess,
                                                   python_module="trainer.prep_v2",
                                                   options=(("sample", "0.5"),)))
    deps = replace(deps, pipelines={"p": renamed})
    again = rerun_run(deps, "r1", "z")
    request = steps.jobs[-1].request
    assert request.python_module == "trainer.preprocess"
    assert dict(request.options) == dict(STEP.options)
    assert step(again).cache_key == step(origin).cache_key


def test_a_pinned_generation_that_is_gone_is_not_keyed_by_the_live_folder() -> None:
    _, _, outputs = pinned_deps()
    outputs.versions.pop(("d1/b.csv", 2))  # a bucket without versioning lost it
    assert outputs.content_digest("gs://b/d1/", PINNED) is None


def test_a_run_whose_pinned_generation_is_gone_is_refused_at_launch_not_failed_job_by_job(
        ) -> None:
    deps, steps, outputs = pinned_deps()
    outputs.versions.pop(("d1/b.csv", 2))
    run = start_pinned(deps, "r1")
    assert steps.created == 0 and run.status is RunStatus.FAILED_LAUNCH
    assert "recorded generation" in (step(run).error or "")


def test_the_poll_follows_the_job_by_its_id_once_known() -> None:
    deps, steps, _ = make_deps()
    start(deps, "r1")
    steps.set_state("spotorch-r1-pre1", "JOB_STATE_RUNNING")
    steps.reads.clear()
    tick(deps)  # the launch answered the id: GetJob by it
    tick(deps)
    assert steps.reads == ["by_id", "by_id"]


def _many(n: int = 1200) -> tuple[tuple[str, int], ...]:
    return tuple((f"d1/{'x' * 90}-{i:05d}.csv", i + 1) for i in range(n))


def test_a_long_object_list_is_read_from_the_manifest() -> None:
    deps, steps, outputs = make_deps()
    many = _many()
    for name, generation in many:
        outputs.versions[(name, generation)] = (1, "crc")
    from spotorch.core import provenance

    data = provenance.data_of(deps.pipeline("p"), "gs://b/d1/", "b", many)
    assert data["objects"] is None  # too many for the run document: the manifest lists them
    outputs.markers[data["manifest_uri"]] = provenance.manifest(data, many)
    run = start_run(deps, "p", run_id="r1", data_uri="gs://b/d1/", snapshot_id="r1",
                    reason="t", objects=many)
    assert run is not None and steps.created == 1
    request = steps.jobs[0].request
    assert request.inputs_uri is not None
    assert len(outputs.markers[request.inputs_uri]["objects"]) == len(many)
    assert step(run).cache_key == pp.new_step(deps.pipeline("p"), pp.input_identity(
        "r1", "gs://b/d1/", outputs.content_digest("gs://b/d1/", many))).cache_key


def test_a_lost_manifest_fails_the_launch_for_good_instead_of_reading_the_live_folder() -> None:
    deps, steps, _ = make_deps()
    run = start_run(deps, "p", run_id="r1", data_uri="gs://b/d1/", snapshot_id="r1",
                    reason="t", objects=_many())
    assert run is not None
    run = load(deps, "r1")
    assert steps.created == 0 and run.status is RunStatus.FAILED_LAUNCH
    assert run.end_reason is not None and "inputs manifest" in run.end_reason
    assert step(run).cache_key == pp.new_step(deps.pipeline("p"), pp.input_identity(
        "r1", "gs://b/d1/", None)).cache_key  # keyed by its snapshot: never a false hit
