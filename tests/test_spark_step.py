"""A Spark preprocess step on Dataproc Serverless (issue 42): the file format, the batch's id,
states and failure classes, its price, the adapter's CreateBatch request, and a run through
the service layer with the in-memory twin (PREPROCESSING -> the batch -> training)."""

from __future__ import annotations

import textwrap
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fakes import fake_deps
from spotorch.adapters.gcp.dataproc import DataprocStepLauncher, view_of
from spotorch.adapters.memory.batches import InMemoryBatches
from spotorch.adapters.memory.steps import InMemoryStepOutputs, InMemorySteps
from spotorch.adapters.memory.twins import ManualClock
from spotorch.app.deps import Deps
from spotorch.app.runs import cancel_run, start_run
from spotorch.app.tick import tick
from spotorch.core import preprocess as pp
from spotorch.core import spark_batches as sb
from spotorch.core.cost import ledger, step_cost
from spotorch.core.errors import ConfigError
from spotorch.core.model import FailureClass, Run, RunStatus
from spotorch.core.pipeline import (
    EscalationKind,
    JobTemplate,
    OnActiveRun,
    Pipeline,
    Preprocess,
    PreprocessKind,
    PythonPackage,
    RecoveryPolicy,
    Trigger,
    WorkerPool,
)
from spotorch.core.preprocessing import step_of
from spotorch.core.price_list import LIST_PRICES
from spotorch.ports.steps import StepLaunch, StepLaunchError
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


def problems(tmp_path: Path, extra: str) -> dict[str, str]:
    path = tmp_path / "p.yaml"
    path.write_text(BASE + textwrap.dedent(extra))
    with pytest.raises(ConfigError) as caught:
        load_pipeline(path)
    return {p.path: p.message for p in caught.value.problems}


# --- the file format -----------------------------------------------------------------------------


def test_a_spark_step_loads_with_its_properties_and_runtime(tmp_path: Path) -> None:
    path = tmp_path / "p.yaml"
    path.write_text(BASE + textwrap.dedent("""\
        preprocess:
          kind: spark
          python_module: trainer.features
          output_uri: gs://prep/features
          runtime_version: "2.2"
          properties: {spark.executor.instances: 2, spark.sql.shuffle.partitions: "8"}
        """))
    step = load_pipeline(path).preprocess
    assert step is not None and step.kind is PreprocessKind.SPARK
    assert step.runtime_version == "2.2"
    assert dict(step.properties) == {"spark.executor.instances": "2",
                                     "spark.sql.shuffle.partitions": "8"}


def test_spark_settings_are_checked(tmp_path: Path) -> None:
    found = problems(tmp_path, """\
        preprocess:
          kind: spark
          template_uri: gs://t/template.json
          python_module: trainer.features
          output_uri: gs://prep/features
          properties: {spark.master: "local[*]", executor.cores: 4}
        """)
    assert "preprocess.template_uri" in found
    assert "preprocess.properties.spark.master" in found
    assert any("executor.cores" in p for p in found)  # not a spark.* name
    beam = problems(tmp_path, """\
        preprocess:
          python_module: trainer.prep
          output_uri: gs://prep/features
          runtime_version: "2.2"
        """)
    assert beam["preprocess.runtime_version"].startswith("applies to kind: spark only")


# --- the batch's id, states and failure classes --------------------------------------------------


@given(st.text(min_size=1, max_size=200), st.integers(min_value=1, max_value=999))
def test_batch_ids_are_valid_for_dataproc(run_id: str, launch: int) -> None:
    assert sb.valid_batch_id(sb.batch_id(run_id, launch))


def test_long_run_ids_keep_distinct_batch_ids() -> None:
    a, b = "prep-" + "x" * 80 + "-1", "prep-" + "x" * 80 + "-2"
    assert sb.batch_id(a, 1) != sb.batch_id(b, 1)
    assert sb.batch_id("prep-20261206-1", 2) == "spotorch-prep-20261206-1-pre2"
    assert not sb.valid_batch_id("abc") and not sb.valid_batch_id("Spotorch-x")


@pytest.mark.parametrize(("state", "error", "expected"), [
    (sb.BATCH_CANCELLED, "", FailureClass.CANCELLED),
    (sb.BATCH_FAILED, "Job failed with message [Traceback (most recent call last):\n"
                      "pyspark.errors.exceptions.captured.AnalysisException: [UNRESOLVED_COLUMN]"
                      "]", FailureClass.USER_ERROR),
    (sb.BATCH_FAILED, "Insufficient 'CPUS' quota. Requested 12.0, available 8.0.",
     FailureClass.QUOTA),
    (sb.BATCH_FAILED, "The zone 'us-central1-b' does not have enough resources available",
     FailureClass.INFRA),
    (sb.BATCH_FAILED, "Internal server error", FailureClass.INFRA),
    (sb.BATCH_FAILED, "", FailureClass.INFRA),
])
def test_failed_batches_are_classified(state: str, error: str, expected: FailureClass) -> None:
    assert sb.classify_batch(state, error) is expected


def test_dcus_follow_dataprocs_rule() -> None:
    # 4 vCPUs, 16 GB: 4 x 0.6 + 16 x 0.1 = 4.0 DCU; over 8 GB a vCPU the extra GB count 0.2
    assert sb.dcus(4, 16) == pytest.approx(4.0)
    assert sb.dcus(1, 10) == pytest.approx(0.6 + 0.8 + 0.4)
    # billed per second with a one-minute minimum
    assert sb.milli_dcu_seconds([(4, 16)], 30) == 240_000
    assert sb.milli_dcu_seconds([(4, 16), (4, 16)], 120) == 960_000


# --- the price ---------------------------------------------------------------------------------


def test_a_batch_is_priced_in_dcu_hours_and_shuffle_storage() -> None:
    doc = pp.PreprocessStep(cache_key="k", output_uri="gs://o/k/", kind="spark",
                            region="us-central1", milli_dcu_s=3_600_000.0 * 10,
                            shuffle_gb_s=3600.0 * 730).to_doc()
    cost = step_cost(doc, LIST_PRICES)
    # 10 DCU-hours at $0.06, 730 GB-hours of shuffle storage at $0.04 a GB-month
    assert cost.cost == pytest.approx(0.6 + 0.04)
    assert any("Dataproc" in b for b in cost.basis) and not cost.unknown
    assert step_cost({**doc, "cache_hit": True}, LIST_PRICES).cost == 0.0
    beam = {**doc, "kind": "beam"}  # a Dataflow record is not priced in DCUs
    assert step_cost(beam, LIST_PRICES).cost == 0.0


# --- the adapter's request -----------------------------------------------------------------------


def _launch(**kw: object) -> StepLaunch:
    base = StepLaunch(job_name="spotorch-r1-pre1", region="europe-west4", input_uri="gs://l/d/",
                      output_uri="gs://o/k/", temp_uri="gs://o/k/_temp/", machine_type="",
                      max_workers=1, python_module="trainer.features",
                      package_uris=("gs://s/packages/ab12/pkg-1.0.tar.gz",),
                      options=(("shards", "2"),), service_account="sp@p.iam.gserviceaccount.com",
                      inputs_uri="gs://o/k/_SPOTORCH_INPUTS.json", network="my-vpc",
                      labels={"spotorch_key": "k"}, kind="spark",
                      properties=(("spark.executor.instances", "2"),), runtime_version="2.2")
    return replace(base, **kw)  # type: ignore[arg-type]


def test_the_batch_runs_the_driver_with_the_module_and_package() -> None:
    launcher = DataprocStepLauncher("p", driver_uri="gs://s/spark/driver-ab.py",
                                    service_account="default@p.iam.gserviceaccount.com")
    batch = launcher._batch(_launch())
    py = batch.pyspark_batch
    assert py.main_python_file_uri == "gs://s/spark/driver-ab.py"
    assert list(py.file_uris) == ["gs://s/packages/ab12/pkg-1.0.tar.gz"]
    args = list(py.args)
    assert args[args.index("--module") + 1] == "trainer.features"
    assert args[args.index("--inputs") + 1] == "gs://o/k/_SPOTORCH_INPUTS.json"
    assert args[args.index("--options") + 1] == '{"shards": "2"}'
    assert dict(batch.runtime_config.properties) == {"spark.executor.instances": "2"}
    assert batch.runtime_config.version == "2.2"
    execution = batch.environment_config.execution_config
    assert execution.service_account == "sp@p.iam.gserviceaccount.com"
    assert execution.network_uri == "my-vpc" and not execution.subnetwork_uri
    assert dict(batch.labels) == {"spotorch_key": "k"}
    # the deployment's account when the step names none; the subnetwork wins over the network
    other = launcher._batch(_launch(service_account=None, subnetwork="regions/r/subnetworks/s"))
    assert other.environment_config.execution_config.service_account.startswith("default@")
    assert other.environment_config.execution_config.subnetwork_uri == "regions/r/subnetworks/s"


def test_a_launch_without_the_driver_or_with_a_bad_id_is_refused_for_good() -> None:
    with pytest.raises(StepLaunchError) as caught:
        DataprocStepLauncher("p").launch(_launch())
    assert caught.value.permanent and "SPOTORCH_SPARK_DRIVER" in str(caught.value)
    with pytest.raises(StepLaunchError) as bad:
        DataprocStepLauncher("p", driver_uri="gs://d.py").launch(_launch(job_name="Bad_Id"))
    assert bad.value.permanent


def test_an_ended_batchs_view_carries_its_error_and_usage() -> None:
    from google.cloud import dataproc_v1

    batch = dataproc_v1.Batch(
        name="projects/p/locations/r/batches/spotorch-r1-pre1",
        state=dataproc_v1.Batch.State.FAILED, state_message="Job failed with message [boom]",
        runtime_info=dataproc_v1.RuntimeInfo(approximate_usage=dataproc_v1.UsageMetrics(
            milli_dcu_seconds=240000, shuffle_storage_gb_seconds=12)))
    view = view_of(batch, "spotorch-r1-pre1")
    assert view.state == sb.BATCH_FAILED and "boom" in view.error
    assert view.milli_dcu_s == 240000 and view.shuffle_gb_s == 12
    assert view.job_id == "projects/p/locations/r/batches/spotorch-r1-pre1"


# --- a run through the service layer (the in-memory twin) ---------------------------------------

PACKAGE = PythonPackage(package_uri="gs://s/p.tgz", executor_image_uri="img",
                        python_module="trainer.task",
                        package_uris=("gs://s/packages/0123456789abcdef/p.tgz",))
STEP = Preprocess(kind=PreprocessKind.SPARK, python_module="trainer.features",
                  output_uri="gs://prep/p", properties=(("spark.executor.instances", "2"),))
CONTENT = {"a.csv": (10, "crcA"), "b.csv": (20, "crcB")}


def make_deps(step: Preprocess = STEP) -> tuple[Deps, InMemoryBatches, InMemoryStepOutputs]:
    pipeline = Pipeline(name="p", trigger=Trigger(bucket="b", on_active_run=OnActiveRun.PARALLEL),
                        job=JobTemplate(worker_pools=(WorkerPool(python_package=PACKAGE),)),
                        checkpoint_uri="gs://c/p", output_uri="gs://m/p",
                        recovery=RecoveryPolicy(escalation=EscalationKind.NEVER),
                        preprocess=step)
    batches, outputs = InMemoryBatches(), InMemoryStepOutputs()
    outputs.folders["gs://b/d1/"] = dict(CONTENT)
    outputs.folders["gs://b/d2/"] = dict(CONTENT)
    deps = replace(fake_deps(pipeline), steps=InMemorySteps(), spark_steps=batches,
                   step_outputs=outputs)
    return deps, batches, outputs


def start(deps: Deps, run_id: str, data_uri: str = "gs://b/d1/") -> Run:
    run = start_run(deps, "p", run_id=run_id, data_uri=data_uri, snapshot_id=run_id, reason="t")
    assert run is not None
    return run


def load(deps: Deps, run_id: str) -> Run:
    run, _ = deps.runs.load(run_id)
    assert run is not None
    return run


def step(run: Run) -> pp.PreprocessStep:
    found = step_of(run)
    assert found is not None
    return found


def test_a_spark_step_runs_a_batch_then_trains_and_the_next_snapshot_reuses_it() -> None:
    deps, batches, outputs = make_deps()
    run = start(deps, "r1")
    assert run.status is RunStatus.PREPROCESSING and batches.created == 1
    assert isinstance(deps.steps, InMemorySteps) and deps.steps.created == 0  # not Dataflow
    (request,) = [b.request for b in batches.batches.values()]
    assert request.job_name == "spotorch-r1-pre1" and request.kind == "spark"
    assert request.properties == (("spark.executor.instances", "2"),)
    batches.set_state("spotorch-r1-pre1", sb.BATCH_RUNNING)
    tick(deps)
    assert step(load(deps, "r1")).state == sb.BATCH_RUNNING
    batches.set_state("spotorch-r1-pre1", sb.BATCH_SUCCEEDED, milli_dcu_s=3_600_000.0)
    tick(deps)  # no event exists for a batch: the tick's GetBatch moves the run
    run = load(deps, "r1")
    assert run.status is RunStatus.STARTING and step(run).phase is pp.StepPhase.DONE
    assert step(run).job_id == "projects/p/locations/us-central1/batches/spotorch-r1-pre1"
    assert pp.marker_uri(step(run)) in outputs.markers
    assert ledger(run, deps.pipeline("p"), deps.clock.now(), LIST_PRICES).preprocess_cost \
        == pytest.approx(0.06)  # one DCU-hour
    second = start(deps, "r2", data_uri="gs://b/d2/")
    assert batches.created == 1 and step(second).cache_hit
    assert second.status is RunStatus.STARTING


def test_properties_are_part_of_the_key() -> None:
    deps, _, _ = make_deps()
    other = replace(STEP, properties=(("spark.executor.instances", "4"),))
    deps2, _, _ = make_deps(other)
    assert step(start(deps, "r1")).cache_key != step(start(deps2, "r1")).cache_key


def test_a_spark_exception_fails_the_run_with_its_text() -> None:
    deps, batches, _ = make_deps()
    start(deps, "r1")
    batches.set_state("spotorch-r1-pre1", sb.BATCH_FAILED,
                      error="Job failed with message [Traceback (most recent call last):\n"
                            "ValueError: could not convert string to float: 'oops']")
    tick(deps)
    run = load(deps, "r1")
    assert run.status is RunStatus.FAILED and run.end_reason is not None
    assert "could not convert string to float" in run.end_reason
    assert step(run).failure is FailureClass.USER_ERROR and batches.created == 1


def test_a_quota_refusal_relaunches_under_the_next_id_then_fails_quota() -> None:
    deps, batches, _ = make_deps()
    start(deps, "r1")
    quota = "Insufficient 'CPUS' quota. Requested 12.0, available 8.0."
    batches.set_state("spotorch-r1-pre1", sb.BATCH_FAILED, error=quota)
    tick(deps)
    assert step(load(deps, "r1")).job_name == "spotorch-r1-pre2" and batches.created == 2
    batches.set_state("spotorch-r1-pre2", sb.BATCH_FAILED, error=quota)
    tick(deps)
    run = load(deps, "r1")
    assert run.status is RunStatus.FAILED_QUOTA and batches.created == 2


def test_a_repeated_create_is_the_batch_started_before() -> None:
    batches = InMemoryBatches()
    first = batches.launch(_launch(region="us-central1"))
    batches.set_state(first.name, sb.BATCH_SUCCEEDED)
    again = batches.launch(_launch(region="us-central1"))  # an ended batch keeps its id
    assert again.state == sb.BATCH_SUCCEEDED and batches.created == 1
    with pytest.raises(StepLaunchError):
        batches.launch(_launch(job_name="abc"))


def test_a_cancelled_run_cancels_its_batch() -> None:
    deps, batches, _ = make_deps()
    start(deps, "r1")
    batches.set_state("spotorch-r1-pre1", sb.BATCH_RUNNING)
    tick(deps)
    cancel_run(deps, "r1", reason="user")
    assert "spotorch-r1-pre1" in batches.cancelled
    tick(deps)
    assert load(deps, "r1").status is RunStatus.CANCELLED


def test_a_refused_create_ends_the_run_failed_launch() -> None:
    deps, batches, _ = make_deps()
    batches.fail_launch = StepLaunchError("PERMISSION_DENIED: actAs", permanent=True)
    run = start(deps, "r1")
    assert run.status is RunStatus.FAILED_LAUNCH
    assert run.end_reason is not None and "Dataproc refused" in run.end_reason


# --- exact reruns through the step: the recorded module, options, properties and runtime -------


def test_a_rerun_runs_the_recorded_spark_properties_and_reuses_or_rebuilds_by_the_key() -> None:
    from spotorch.app.runs import rerun_run

    deps, batches, outputs = make_deps()
    outputs.versions.update({("d1/a.csv", 1): (10, "crcA"), ("d1/b.csv", 2): (20, "crcB")})
    run = start_run(deps, "p", run_id="r1", data_uri="gs://b/d1/", snapshot_id="r1",
                    reason="t", objects=(("d1/a.csv", 1), ("d1/b.csv", 2)))
    assert run is not None
    (first,) = [b.request for b in batches.batches.values()]
    assert first.inputs_uri is not None  # the pinned generations' manifest
    batches.set_state("spotorch-r1-pre1", sb.BATCH_SUCCEEDED)
    tick(deps)
    origin = load(deps, "r1")
    assert origin.provenance is not None
    assert origin.provenance["preprocess"]["kind"] == "spark"
    assert origin.provenance["preprocess"]["properties"] == {"spark.executor.instances": "2"}
    # Today's pipeline asks for other properties: the rerun keeps the recorded ones.
    pipeline = deps.pipeline("p")
    assert pipeline.preprocess is not None
    changed = replace(pipeline, preprocess=replace(
        pipeline.preprocess, properties=(("spark.executor.instances", "8"),)))
    deps = replace(deps, pipelines={"p": changed})
    again = rerun_run(deps, "r1", "x")
    assert step(again).cache_hit and step(again).cache_key == step(origin).cache_key
    outputs.markers.pop(pp.marker_uri(step(origin)))  # the cache is gone: the step runs again
    third = rerun_run(deps, "r1", "y")
    assert not step(third).cache_hit and step(third).cache_key == step(origin).cache_key
    request = batches.batches[("us-central1", step(third).job_name or "")].request
    assert request.properties == (("spark.executor.instances", "2"),)
    assert request.inputs_uri is not None


def test_a_local_stack_without_dataproc_leaves_a_spark_pipeline_out_saying_why(
        tmp_path: Path) -> None:
    from spotorch.local._stack_pipelines import check_pipelines

    (tmp_path / "p.yaml").write_text(BASE + "preprocess:\n  kind: spark\n"
                                            "  python_module: trainer.features\n"
                                            "  output_uri: gs://prep-out/prep\n")
    without = check_pipelines(tmp_path, dataflow=True, dataproc=False)
    assert not without.loaded
    assert "spotorch dev up --dataproc" in " ".join(next(iter(without.rejected.values())))
    # a Spark step needs no Dataflow
    assert [p.name for p in check_pipelines(tmp_path, dataflow=False).loaded] == ["prep"]


def test_a_running_batchs_cost_shows_from_its_usage_snapshot_then_its_metrics_replace_it() -> None:
    deps, batches, _ = make_deps()
    start(deps, "r1")
    assert isinstance(deps.clock, ManualClock)
    batches.set_state("spotorch-r1-pre1", sb.BATCH_RUNNING, milli_dcu_rate=10_000.0)  # 10 DCU
    tick(deps)
    deps.clock.advance(360.0)
    tick(deps)  # 360 s at 10 DCU: one DCU-hour so far
    running = step(load(deps, "r1"))
    assert running.milli_dcu_s == pytest.approx(3_600_000.0)
    assert step_cost(running.to_doc(), LIST_PRICES).cost == pytest.approx(0.06)
    batches.set_state("spotorch-r1-pre1", sb.BATCH_SUCCEEDED, milli_dcu_s=4_000_000.0)
    deps.clock.advance(30.0)
    tick(deps)
    assert step(load(deps, "r1")).milli_dcu_s == 4_000_000.0  # what Dataproc bills


def test_a_dataflow_status_event_naming_a_batch_changes_nothing() -> None:
    from spotorch.app.job_events import status_changed

    deps, batches, _ = make_deps()
    start(deps, "r1")
    batches.set_state("spotorch-r1-pre1", sb.BATCH_RUNNING)
    tick(deps)
    before = step(load(deps, "r1"))
    hint = pp.StatusHint(deps.project or "p", "us-central1", "x", pp.JOB_STATE_DONE,
                         "spotorch-r1-pre1")
    status_changed(deps, hint, "e1")
    assert isinstance(deps.steps, InMemorySteps) and deps.steps.reads == []  # no GetJob
    assert step(load(deps, "r1")) == before
