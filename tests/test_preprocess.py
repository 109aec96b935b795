"""The preprocess step (issue 31): its file format, cache key, job names, failure classes, the
statusChanged hint, its state machine, its place in the run's statuses and its cost."""

from __future__ import annotations

import re
import textwrap
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from spotorch.core import preprocess as pp
from spotorch.core.cost import ledger, preprocess_cost, step_cost
from spotorch.core.errors import ConfigError
from spotorch.core.model import TRANSITIONS, FailureClass, Run, RunStatus
from spotorch.core.pipeline import (
    JobTemplate,
    Pipeline,
    Preprocess,
    PythonPackage,
    Trigger,
    WorkerPool,
)
from spotorch.core.price_list import LIST_PRICES
from spotorch.core.prices import DATAFLOW_VCPU, PriceTable, Rate
from spotorch.entrypoints.dataflow_events import status_hint
from spotorch.spec.loader import load_pipeline

BASE = """\
name: prep
trigger:
  bucket: landing
  prefix: data/
job:
  staging_uri: gs://staging/prep
  worker_pools:
    - machine_type: n1-standard-4
      python_package:
        package_uri: gs://staging/prep/pkg.tar.gz
        executor_image_uri: us-docker.pkg.dev/vertex-ai/training/sklearn-cpu.1-0:latest
        python_module: trainer.task
checkpoint_uri: gs://ckpt/prep
output_uri: gs://models/prep
"""


def load(tmp_path: Path, extra: str) -> Pipeline:
    path = tmp_path / "p.yaml"
    path.write_text(BASE + textwrap.dedent(extra))
    return load_pipeline(path)


def problems(tmp_path: Path, extra: str, base: str = BASE) -> dict[str, str]:
    path = tmp_path / "p.yaml"
    path.write_text(base + textwrap.dedent(extra))
    with pytest.raises(ConfigError) as caught:
        load_pipeline(path)
    return {p.path: p.message for p in caught.value.problems}


# --- the file format -----------------------------------------------------------------------------


def test_a_preprocess_section_loads_with_its_defaults(tmp_path: Path) -> None:
    pipeline = load(tmp_path, """\
        preprocess:
          python_module: trainer.preprocess
          output_uri: gs://prep-out/prep
          options: {num_shards: 2, delimiter: ","}
          max_workers: 4
        """)
    step = pipeline.preprocess
    assert step is not None and step.python_module == "trainer.preprocess"
    assert dict(step.options) == {"num_shards": "2", "delimiter": ","}
    assert (step.max_workers, step.machine_type, step.region) == (4, "n1-standard-1",
                                                                 "us-central1")
    assert (step.max_user_errors, step.max_infra_errors, step.max_quota_errors) == (0, 3, 1)


def test_every_problem_of_a_preprocess_section_is_listed(tmp_path: Path) -> None:
    found = problems(tmp_path, """\
        preprocess:
          python_module: trainer.preprocess
          template_uri: gs://templates/t.json
          output_uri: not-a-uri
          max_workers: 0
          options: {runner: DirectRunner}
          timeout: 0s
        """)
    assert "not both" in found["preprocess"]
    assert "gs://" in found["preprocess.output_uri"]
    assert "preprocess.max_workers" in found
    assert "set by spotorch" in found["preprocess.options.runner"]
    assert "longer than zero" in found["preprocess.timeout"]


def test_a_preprocess_step_needs_code_and_an_output(tmp_path: Path) -> None:
    found = problems(tmp_path, """\
        preprocess:
          machine_type: n1-standard-2
        """)
    assert "needs python_module or template_uri" in found["preprocess"]
    assert "preprocess.output_uri" in found


def test_a_preprocess_step_after_a_bigquery_trigger_is_refused(tmp_path: Path) -> None:
    base = BASE.replace("  bucket: landing\n  prefix: data/\n",
                        "  bigquery:\n    tables: [p.d.t]\n    export_uri: gs://exports/p\n")
    found = problems(tmp_path, """
        preprocess:
          python_module: trainer.preprocess
          output_uri: gs://prep-out/p
        """, base=base)
    assert "trigger.bigquery" in found["preprocess"]


def test_a_beam_module_needs_the_chief_pools_code_package(tmp_path: Path) -> None:
    image_only = BASE.replace("""      python_package:
        package_uri: gs://staging/prep/pkg.tar.gz
        executor_image_uri: us-docker.pkg.dev/vertex-ai/training/sklearn-cpu.1-0:latest
        python_module: trainer.task
""", "      image_uri: python:3.11-slim\n")
    found = problems(tmp_path, """\
        preprocess:
          python_module: trainer.preprocess
          output_uri: gs://prep-out/prep
        """, base=image_only)
    assert "python_package" in found["preprocess.python_module"]


# --- cache key, job names ------------------------------------------------------------------------


def pipeline_with(step: Preprocess,
                  package_uris: tuple[str, ...] = ("gs://s/packages/0123456789abcdef/p.tgz",)
                  ) -> Pipeline:
    package = PythonPackage(package_uri="gs://s/p.tgz", executor_image_uri="img",
                            python_module="trainer.task", package_uris=package_uris)
    return Pipeline(name="prep", trigger=Trigger(bucket="landing"),
                    job=JobTemplate(worker_pools=(WorkerPool(python_package=package),)),
                    checkpoint_uri="gs://c/p", output_uri="gs://m/p", preprocess=step)


STEP = Preprocess(python_module="trainer.preprocess", output_uri="gs://prep-out/p",
                  options=(("num_shards", "2"),))


def test_the_cache_key_follows_input_code_and_options_only() -> None:
    base = pp.new_step(pipeline_with(STEP), "content:aaa")
    assert base.output_uri == f"gs://prep-out/p/{base.cache_key}/"
    assert pp.new_step(pipeline_with(replace(STEP, max_workers=50)), "content:aaa").cache_key \
        == base.cache_key  # scaling does not change the output
    others = {pp.new_step(pipeline_with(STEP), "content:bbb").cache_key,
              pp.new_step(pipeline_with(STEP, ("gs://s/packages/fedcba9876543210/p.tgz",)),
                          "content:aaa").cache_key,
              pp.new_step(pipeline_with(replace(STEP, options=(("num_shards", "3"),))),
                          "content:aaa").cache_key}
    assert base.cache_key not in others and len(others) == 3
    two = (("a", "1"), ("b", "2"))
    assert pp.cache_key("i", "c", two) == pp.cache_key("i", "c", two[::-1])


def test_an_unbuilt_package_is_not_cacheable() -> None:
    assert not pp.cacheable(pipeline_with(STEP, package_uris=()))
    assert pp.cacheable(pipeline_with(STEP))
    # A package URI given by hand names no content: it can be overwritten in place.
    assert not pp.cacheable(pipeline_with(STEP, package_uris=("gs://s/mine/p.tgz",)))
    assert pp.cacheable(pipeline_with(Preprocess(template_uri="gs://t/t.json",
                                                 output_uri="gs://o/p"), package_uris=()))


def test_input_identity_prefers_content_then_snapshot_then_uri() -> None:
    assert pp.input_identity("s1", "gs://b/d/", "abc") == "content:abc"
    assert pp.input_identity("s1", "gs://b/d/", None) == "snapshot:s1"
    assert pp.input_identity(None, "gs://b/d/", None) == "uri:gs://b/d/"


def test_long_run_ids_keep_distinct_job_names() -> None:
    trial = "a" * 40 + "-20261202t030000z-abcdef012345-t1"  # a sweep trial of a long pipeline
    one, twelve = pp.job_name(trial, 1), pp.job_name(trial + "2", 1)
    assert one != twelve and len(one) <= len("spotorch-") + 60 + len("-pre1")
    assert re.fullmatch(r"[a-z]([-a-z0-9]*[a-z0-9])?", one)


def test_job_names_are_deterministic_and_valid_for_dataflow() -> None:
    name = pp.job_name("Demo_2026-12-02T03:00:00Z.ABC", 2)
    assert name == pp.job_name("Demo_2026-12-02T03:00:00Z.ABC", 2)
    assert name.endswith("-pre2") and pp.job_name("x", 3) != pp.job_name("x", 2)
    import re
    assert re.fullmatch(r"[a-z]([-a-z0-9]{0,1022}[a-z0-9])?", name)


# --- failure classes, the event ------------------------------------------------------------------


@pytest.mark.parametrize(("state", "error", "expected"), [
    ("JOB_STATE_CANCELLED", "", FailureClass.CANCELLED),
    ("JOB_STATE_FAILED", "Error message from worker: Traceback (most recent call last):\n"
                         "  ...\nValueError: bad row 'x'", FailureClass.USER_ERROR),
    ("JOB_STATE_FAILED", "Startup of the worker pool in zone us-central1-a failed to bring up "
                         "any of the desired 4 workers. QUOTA_EXCEEDED: Quota 'CPUS' exceeded.",
     FailureClass.QUOTA),
    ("JOB_STATE_FAILED", "Workflow failed. Causes: internal error", FailureClass.INFRA),
    ("JOB_STATE_FAILED", "", FailureClass.INFRA),
])
def test_failed_jobs_are_classified(state: str, error: str, expected: FailureClass) -> None:
    assert pp.classify(state, error) is expected


def test_the_status_changed_hint_reads_the_real_shape() -> None:
    hint = status_hint({"payload": {
        "id": "2026-12-02_03_00_00-123", "projectId": "proj", "name": "spotorch-x-pre1",
        "location": "us-central1", "currentState": "JOB_STATE_DONE", "type": "JOB_TYPE_BATCH"}})
    assert (hint.job_id, hint.region, hint.state, hint.job_name) == (
        "2026-12-02_03_00_00-123", "us-central1", "JOB_STATE_DONE", "spotorch-x-pre1")
    with pytest.raises(ValueError, match="payload"):
        status_hint({"currentState": "JOB_STATE_DONE"})
    with pytest.raises(ValueError, match="lacks id"):
        status_hint({"payload": {"projectId": "p", "location": "l",
                                    "currentState": "JOB_STATE_DONE"}})
    with pytest.raises(ValueError, match="not a Dataflow JobState"):
        status_hint({"payload": {"id": "j", "projectId": "p", "location": "l",
                                    "currentState": "DONE"}})


# --- the state machine ---------------------------------------------------------------------------


def launched(spec: Preprocess = STEP) -> pp.PreprocessStep:
    step = pp.new_step(pipeline_with(spec), "content:aaa")
    decision = pp.on_cache(step, complete=False, run_id="prep-r1", now=100.0)
    assert decision.action is pp.StepAction.LAUNCH
    assert decision.step.job_name == "spotorch-prep-r1-pre1" and decision.step.launches == 1
    return decision.step


def job(step: pp.PreprocessStep, state: str, error: str = "", vcpu_s: float = 0.0) -> pp.JobView:
    assert step.job_name is not None
    return pp.JobView(job_id=f"id-{step.launches}", name=step.job_name, state=state, error=error,
                      vcpu_s=vcpu_s)


def test_a_complete_cached_output_is_reused_without_a_job() -> None:
    step = pp.new_step(pipeline_with(STEP), "content:aaa")
    decision = pp.on_cache(step, complete=True, run_id="prep-r1", now=5.0)
    assert decision.action is pp.StepAction.TRAIN
    assert decision.step.cache_hit and decision.step.phase is pp.StepPhase.DONE
    assert decision.step.launches == 0 and decision.step.job_name is None
    assert pp.training_data_uri(decision.step, "gs://raw/") == step.output_uri
    # a second lookup (a duplicated event) changes nothing
    assert pp.on_cache(decision.step, complete=False, run_id="prep-r1", now=6.0).action \
        is pp.StepAction.NONE


def test_running_then_done_trains_on_the_output_and_counts_resources() -> None:
    step = launched()
    running = pp.on_job(step, STEP, job(step, "JOB_STATE_RUNNING", vcpu_s=10), 110.0, "prep-r1")
    assert running.action is pp.StepAction.NONE and running.step.phase is pp.StepPhase.RUNNING
    assert running.step.started_at == 110.0 and running.step.job_id == "id-1"
    assert pp.training_data_uri(running.step, "gs://raw/") == "gs://raw/"
    done = pp.on_job(running.step, STEP, job(step, pp.JOB_STATE_DONE, vcpu_s=3600), 200.0,
                     "prep-r1")
    assert done.action is pp.StepAction.TRAIN and done.step.phase is pp.StepPhase.DONE
    assert done.step.vcpu_s == 3600 and done.step.state == pp.JOB_STATE_DONE
    # late and duplicated answers leave a finished step alone: a training relaunch never repeats it
    for late in ("JOB_STATE_RUNNING", pp.JOB_STATE_FAILED, pp.JOB_STATE_DONE):
        again = pp.on_job(done.step, STEP, job(step, late), 300.0, "prep-r1")
        assert again.action is pp.StepAction.NONE and again.step == done.step


def test_a_job_not_yet_known_waits_then_times_out() -> None:
    step = launched(replace(STEP, timeout_s=60))
    assert pp.on_job(step, STEP, None, 120.0, "prep-r1").action is pp.StepAction.NONE
    late = pp.on_job(step, replace(STEP, timeout_s=60), None, 500.0, "prep-r1")
    assert late.action is pp.StepAction.FAIL and late.run_status is RunStatus.FAILED_TIMEOUT


def test_an_answer_about_another_jobs_name_is_ignored() -> None:
    step = launched()
    other = pp.JobView(job_id="x", name="spotorch-someone-else-pre1", state=pp.JOB_STATE_DONE)
    assert pp.on_job(step, STEP, other, 120.0, "prep-r1").step == step


def test_a_failing_transform_ends_the_run_as_a_user_error_with_its_text() -> None:
    step = launched()
    error = "Error message from worker: Traceback ...\nValueError: cannot parse 'abc' as float"
    failed = pp.on_job(step, STEP, job(step, pp.JOB_STATE_FAILED, error), 150.0, "prep-r1")
    assert failed.action is pp.StepAction.FAIL and failed.run_status is RunStatus.FAILED
    assert failed.step.failure is FailureClass.USER_ERROR
    assert "cannot parse 'abc' as float" in failed.reason and failed.step.error == error.strip()


def test_infrastructure_failures_relaunch_within_their_budget_under_a_new_name() -> None:
    spec = replace(STEP, max_infra_errors=1)
    step = launched(spec)
    first = pp.on_job(step, spec, job(step, pp.JOB_STATE_FAILED, "internal error"), 150.0,
                      "prep-r1")
    assert first.action is pp.StepAction.LAUNCH
    assert first.step.job_name == "spotorch-prep-r1-pre2" and first.step.failures == {"infra": 1}
    # the first job's late answer does not touch the second launch
    assert pp.on_job(first.step, spec, job(step, pp.JOB_STATE_FAILED, "internal error"), 151.0,
                     "prep-r1").step == first.step
    second = pp.on_job(first.step, spec, job(first.step, pp.JOB_STATE_FAILED, "internal error"),
                       160.0, "prep-r1")
    assert second.action is pp.StepAction.FAIL and second.run_status is RunStatus.FAILED_INFRA


def test_a_quota_failure_has_its_own_budget() -> None:
    step = launched()
    quota = "QUOTA_EXCEEDED: Quota 'CPUS' exceeded. Limit: 24.0 in region us-central1."
    first = pp.on_job(step, STEP, job(step, pp.JOB_STATE_FAILED, quota), 150.0, "prep-r1")
    assert first.action is pp.StepAction.LAUNCH  # max_quota_errors 1
    second = pp.on_job(first.step, STEP, job(first.step, pp.JOB_STATE_FAILED, quota), 160.0,
                       "prep-r1")
    assert second.run_status is RunStatus.FAILED_QUOTA


def test_a_run_cancel_cancels_the_job_and_ends_the_step_cancelled() -> None:
    step = launched()
    cancel = pp.on_run_cancelled(step, 120.0)
    assert cancel.action is pp.StepAction.CANCEL
    ended = pp.on_job(cancel.step, STEP, job(step, pp.JOB_STATE_CANCELLED), 130.0, "prep-r1")
    assert ended.step.phase is pp.StepPhase.CANCELLED and ended.run_status is RunStatus.CANCELLED
    assert pp.on_run_cancelled(ended.step, 140.0).action is pp.StepAction.NONE


def test_a_job_past_its_timeout_is_cancelled_and_counted_a_timeout() -> None:
    spec = replace(STEP, timeout_s=60)
    step = launched(spec)
    running = pp.on_job(step, spec, job(step, "JOB_STATE_RUNNING"), 110.0, "prep-r1")
    over = pp.on_job(running.step, spec, job(step, "JOB_STATE_RUNNING"), 200.0, "prep-r1")
    assert over.action is pp.StepAction.CANCEL
    ended = pp.on_job(over.step, spec, job(step, pp.JOB_STATE_CANCELLED), 210.0, "prep-r1")
    assert ended.run_status is RunStatus.FAILED_TIMEOUT


# --- the run: status, document, cost -------------------------------------------------------------


def test_preprocessing_sits_between_pending_and_training() -> None:
    assert RunStatus.PREPROCESSING in TRANSITIONS[RunStatus.PENDING]
    assert {RunStatus.STARTING, RunStatus.PROBING, RunStatus.CANCELLED, RunStatus.FAILED} \
        <= TRANSITIONS[RunStatus.PREPROCESSING]
    assert RunStatus.SUCCEEDED not in TRANSITIONS[RunStatus.PREPROCESSING]
    assert not RunStatus.PREPROCESSING.terminal


def test_the_step_round_trips_through_the_run_document() -> None:
    step = pp.on_job(launched(), STEP, job(launched(), pp.JOB_STATE_FAILED, "internal error"),
                     150.0, "prep-r1").step
    run = Run(run_id="prep-r1", pipeline="prep", status=RunStatus.PREPROCESSING, created_at=1.0,
              data_uri="gs://raw/", checkpoint_uri="gs://c/", output_uri="gs://m/",
              preprocess=step.to_doc())
    again = Run.from_dict(run.to_dict())
    assert again == run
    assert again.preprocess is not None and pp.PreprocessStep.from_doc(again.preprocess) == step


def test_the_ledger_counts_the_steps_dataflow_resources_and_not_a_cache_hit() -> None:
    vcpu_hour = LIST_PRICES.dataflow[DATAFLOW_VCPU]["us-central1"].standard
    step = replace(launched(), vcpu_s=7200.0, region="us-central1")
    assert preprocess_cost(step.to_doc()) == pytest.approx(2 * vcpu_hour)
    assert preprocess_cost(replace(step, cache_hit=True).to_doc()) == 0.0
    run = Run(run_id="prep-r1", pipeline="prep", status=RunStatus.PREPROCESSING, created_at=1.0,
              data_uri="gs://raw/", checkpoint_uri="gs://c/", output_uri="gs://m/",
              preprocess=step.to_doc())
    book = ledger(run, None, now=10.0)
    assert book.total == pytest.approx(2 * vcpu_hour)
    assert "preprocess step cost" in book.sentence()
    assert any("dataflow/pricing" in b for b in book.basis)


def test_the_step_is_priced_from_the_ledgers_table_in_its_region() -> None:
    """One cost: the step's Dataflow prices are the price table's (SPOTORCH_PRICES may replace
    them), by region, with the table's one rule for a region it does not list."""
    step = replace(launched(), vcpu_s=3600.0, memory_gb_s=0.0, pd_gb_s=0.0, region="europe-west4")
    mine = PriceTable(dataflow={DATAFLOW_VCPU: {
        "europe-west4": Rate(0.07, 0.07, "negotiated", "2026-12-01"),
        "us-central1": Rate(0.05, 0.05, "negotiated", "2026-12-01")}})
    assert step_cost(step.to_doc(), mine).cost == pytest.approx(0.07)
    shipped = step_cost(step.to_doc())  # us-central1's price stands in, and the basis says so
    assert shipped.cost == pytest.approx(LIST_PRICES.dataflow[DATAFLOW_VCPU]["us-central1"].standard)
    assert any("none listed for europe-west4" in b for b in shipped.basis)
    unknown = step_cost(step.to_doc(), PriceTable())  # a table without Dataflow prices
    assert unknown.cost == 0.0 and unknown.unknown == (f"Dataflow {DATAFLOW_VCPU}",)
    run = Run(run_id="prep-r2", pipeline="prep", status=RunStatus.PREPROCESSING, created_at=1.0,
              data_uri="gs://raw/", checkpoint_uri="gs://c/", output_uri="gs://m/",
              preprocess=step.to_doc())
    assert ledger(run, None, now=10.0, table=PriceTable()).unpriced == (f"Dataflow {DATAFLOW_VCPU}",)


def test_the_alerts_say_what_the_step_did() -> None:
    from spotorch.core.alerts import render_alert
    from spotorch.core.events import build_event

    def headline(kind: str, **data: object) -> str:
        event = build_event(run_id="prep-r1", pipeline="prep", sequence=3, kind=kind, data=data,
                            time=1.0)
        return render_alert(event).headline

    assert "spotorch-prep-r1-pre1" in headline(
        "run.preprocess_started", job_name="spotorch-prep-r1-pre1", launch=1,
        output_uri="gs://o/k/", previous_error=None)
    assert "reused from the cache" in headline("run.preprocess_ended", cache_hit=True,
                                               phase="DONE", output_uri="gs://o/k/")
    failed = headline("run.preprocess_ended", cache_hit=False, phase="FAILED",
                      failure_class="user_error", error="ValueError: bad row")
    assert "user_error" in failed and "ValueError: bad row" in failed


def test_deploy_packaging_collects_the_preprocess_buckets(tmp_path: Path) -> None:
    import importlib.util
    import sys

    spec = importlib.util.spec_from_file_location("spotorch_deploy_package",
                                                  Path(__file__).resolve().parent.parent
                                                  / "deploy" / "package.py")
    assert spec is not None and spec.loader is not None
    package = sys.modules.get(spec.name) or importlib.util.module_from_spec(spec)
    if spec.name not in sys.modules:
        sys.modules[spec.name] = package
        spec.loader.exec_module(package)
    path = tmp_path / "p.yaml"
    path.write_text(BASE.replace("job:\n", "job:\n  service_account: own@p.iam.gserviceaccount.com\n")
                    + "preprocess:\n  python_module: trainer.preprocess\n"
                      "  output_uri: gs://prep-out/prep\n")
    tfvars = package.pipeline_needs([path]).tfvars()
    assert tfvars["pipeline_preprocess_buckets"] == ["prep-out"]
    assert "prep-out" not in tfvars["pipeline_model_buckets"]  # not a model bucket
    assert "own@p.iam.gserviceaccount.com prep-out" in tfvars["pipeline_account_data_buckets"]


# --- any duplication or reordering of the job's answers: one outcome -----------------------------

_TRAJECTORY = ("JOB_STATE_QUEUED", "JOB_STATE_PENDING", "JOB_STATE_RUNNING", pp.JOB_STATE_DONE)


@given(st.lists(st.sampled_from(_TRAJECTORY), min_size=1, max_size=12))
def test_duplicated_and_reordered_answers_end_done_once(states: list[str]) -> None:
    step = launched()
    trains = 0
    for i, state in enumerate(states):
        decision = pp.on_job(step, STEP, job(step, state), 110.0 + i, "prep-r1")
        step = decision.step
        trains += decision.action is pp.StepAction.TRAIN
        assert decision.action is not pp.StepAction.LAUNCH  # never a second job
    assert trains == (1 if pp.JOB_STATE_DONE in states else 0)
    assert (step.phase is pp.StepPhase.DONE) == (pp.JOB_STATE_DONE in states)
    assert step.launches == 1


def test_a_local_stack_without_dataflow_leaves_a_preprocess_pipeline_out_saying_why(
        tmp_path: Path) -> None:
    from spotorch.local._stack_pipelines import check_pipelines

    (tmp_path / "p.yaml").write_text(BASE + "preprocess:\n  template_uri: gs://tmpl/t.json\n"
                                            "  output_uri: gs://prep-out/prep\n")
    without = check_pipelines(tmp_path, dataflow=False)
    assert not without.loaded
    assert "spotorch dev up --dataflow" in " ".join(next(iter(without.rejected.values())))
    assert [p.name for p in check_pipelines(tmp_path).loaded] == ["prep"]


def test_dev_up_makes_the_buckets_a_preprocess_step_names(tmp_path: Path) -> None:
    """Issue 39: `dev up` did not create preprocess.output_uri's bucket, so every launch of the
    step failed on a 404 (now also refused for good, but the stack must not cause it)."""
    from spotorch.local._stack_pipelines import check_pipelines

    (tmp_path / "p.yaml").write_text(BASE + "preprocess:\n  template_uri: gs://tmpl/t.json\n"
                                            "  output_uri: gs://prep-out/prep\n")
    buckets = check_pipelines(tmp_path).buckets
    assert "prep-out" in buckets and "tmpl" in buckets
