"""IAM in the local stack: deploy/'s grants, read from its Terraform, decide what the Vertex
emulator lets each caller do; a grant removed from a copy of deploy/ makes the real aiplatform_v1
client's call fail with Vertex's PERMISSION_DENIED."""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from spotorch.adapters.gcp.job_logs import CloudLoggingJobLogs
from spotorch.adapters.gcp.registry import VertexModelRegistry
from spotorch.adapters.gcp.vertex import VertexJobLauncher
from spotorch.adapters.gcp.vertex_calls import RetryPolicy
from spotorch.core.pipeline import Capacity, JobTemplate, WorkerPool
from spotorch.local._deploy_iam import functions_member, read_grants
from spotorch.local._stack_iam import StackIdentities
from spotorch.local._vertex_quota import QuotaLimits
from spotorch.local.vertex_emulator import IamPolicy, VertexEmulator
from spotorch.ports.job_logs import LogReadError
from spotorch.ports.jobs import LABEL_ATTEMPT, LABEL_RUN, LaunchError, LaunchSpec
from spotorch.ports.registry import RegistryError

ROOT = Path(__file__).resolve().parent.parent
PROJECT = "spotorch-test"
REGION = "us-central1"
FUNCTIONS = f"serviceAccount:spotorch-functions@{PROJECT}.iam.gserviceaccount.com"
NO_RETRY = RetryPolicy(attempts=1)


def spec(run: str = "iam-run") -> LaunchSpec:
    template = JobTemplate(worker_pools=(WorkerPool(command=("python", "-c", "pass")),))
    return LaunchSpec(run_id=run, pipeline="demo", attempt=1, capacity=Capacity.SPOT,
                      region=REGION, template=template, env={},
                      labels={LABEL_RUN: run, LABEL_ATTEMPT: "1"}, display_name=run)


def deploy_copy(tmp: Path, *, without: str | None = None) -> Path:
    """deploy/ copied, with one permission taken out of the functions' custom Vertex role."""
    target = tmp / "deploy"
    shutil.copytree(ROOT / "deploy", target)
    if without is not None:
        iam = target / "iam.tf"
        text = iam.read_text()
        assert f'"{without}",' in text
        iam.write_text(text.replace(f'"{without}",', ""))
    return target


StartEmulator = Callable[[Path], tuple[str, StackIdentities]]


@pytest.fixture
def emulator_for(tmp_path: Path) -> Iterator[StartEmulator]:
    started: list[VertexEmulator] = []

    def start(deploy: Path) -> tuple[str, StackIdentities]:
        identities = StackIdentities()
        policy = identities.write_policy(tmp_path / "iam.json", deploy, PROJECT)
        emulator = VertexEmulator(PROJECT, job_events_topic=None, queued_s=0.05, pending_s=0.05,
                                  quotas=QuotaLimits.unlimited(), iam=IamPolicy.load(policy))
        started.append(emulator)
        return emulator.start(), identities

    yield start
    for emulator in started:
        emulator.stop()


def test_deploy_grants_the_functions_account_the_custom_jobs_permissions() -> None:
    grants = read_grants(ROOT / "deploy", PROJECT)
    assert functions_member(ROOT / "deploy", PROJECT) == FUNCTIONS
    assert {"aiplatform.customJobs.create", "aiplatform.customJobs.get",
            "aiplatform.customJobs.list", "aiplatform.customJobs.cancel"} <= set(grants.of(FUNCTIONS))
    # The training account launches nothing: no Vertex permission at project level.
    assert not [p for p in grants.of(f"serviceAccount:spotorch-training@{PROJECT}"
                                     ".iam.gserviceaccount.com") if p.startswith("aiplatform")]


def test_deploy_lets_the_functions_act_as_the_dataflow_account_and_not_any(tmp_path: Path) -> None:
    from spotorch.local._deploy_iam import account_email

    dataflow = account_email(ROOT / "deploy", PROJECT, "dataflow")
    assert dataflow == f"spotorch-dataflow@{PROJECT}.iam.gserviceaccount.com"
    grants = read_grants(ROOT / "deploy", PROJECT)
    assert FUNCTIONS in grants.act_as[dataflow]
    policy = IamPolicy.load(StackIdentities().write_policy(tmp_path / "iam.json", ROOT / "deploy",
                                                           PROJECT))
    assert policy.may_act_as(FUNCTIONS, dataflow)
    assert not policy.may_act_as(FUNCTIONS, f"someone@{PROJECT}.iam.gserviceaccount.com")
    assert policy.may_act_as("user:developer@localhost", "anyone@example.iam.gserviceaccount.com")


def test_the_predefined_vertex_role_is_read_when_the_custom_one_is_off() -> None:
    grants = read_grants(ROOT / "deploy", PROJECT, {"use_custom_vertex_role": False})
    assert {"aiplatform.customJobs.create", "aiplatform.models.upload"} <= set(grants.of(FUNCTIONS))


def test_a_grant_removed_from_deploy_makes_create_fail_with_vertex_permission_denied(
        tmp_path: Path, emulator_for: StartEmulator) -> None:
    address, ids = emulator_for(deploy_copy(tmp_path, without="aiplatform.customJobs.create"))
    launcher = VertexJobLauncher(PROJECT, endpoint=address, token=ids.functions_token,
                                 retry=NO_RETRY)
    with pytest.raises(LaunchError) as refused:
        launcher.launch(spec())
    assert refused.value.code == "PERMISSION_DENIED" and refused.value.permanent
    assert ("Permission 'aiplatform.customJobs.create' denied on resource "
            f"'//aiplatform.googleapis.com/projects/{PROJECT}/locations/{REGION}' "
            "(or it may not exist).") in str(refused.value)
    assert launcher.find("iam-run", 1) is None  # list is still granted: it found no job


def test_with_deploys_grants_the_functions_launch_and_the_operator_may_do_anything(
        tmp_path: Path, emulator_for: StartEmulator) -> None:
    address, ids = emulator_for(ROOT / "deploy")
    launcher = VertexJobLauncher(PROJECT, endpoint=address, token=ids.functions_token,
                                 retry=NO_RETRY)
    name = launcher.launch(spec())
    assert launcher.get(name).job_name == name
    launcher.cancel(name)
    operator = VertexJobLauncher(PROJECT, endpoint=address, token=ids.operator_token,
                                 retry=NO_RETRY)
    assert operator.get(name).job_name == name


def test_a_call_without_credentials_or_with_unknown_ones_is_unauthenticated(
        tmp_path: Path, emulator_for: StartEmulator) -> None:
    address, _ = emulator_for(ROOT / "deploy")
    for token in (None, "not-a-token"):
        launcher = VertexJobLauncher(PROJECT, endpoint=address, token=token, retry=NO_RETRY)
        with pytest.raises(LaunchError) as refused:
            launcher.launch(spec(f"iam-{token or 'none'}"))
        assert refused.value.code == "UNAUTHENTICATED"
        assert "authentication credential" in str(refused.value)


def test_reading_a_jobs_error_lines_needs_deploys_log_view_grant(
        tmp_path: Path, emulator_for: StartEmulator) -> None:
    job = f"projects/{PROJECT}/locations/{REGION}/customJobs/1"
    address, ids = emulator_for(ROOT / "deploy")
    granted = CloudLoggingJobLogs(PROJECT, endpoint=address, token=ids.functions_token)
    assert granted.error_tail(job, since=None, limit=5) == ()  # allowed: no lines yet
    without = tmp_path / "without"
    without.mkdir()
    copy = deploy_copy(without)
    logs = copy / "logs.tf"
    grant = ('  role     = "roles/logging.viewAccessor"\n  member   = local.functions_member\n')
    assert grant in logs.read_text()
    logs.write_text(logs.read_text().replace(grant, grant.replace("logging.viewAccessor",
                                                                  "logging.logWriter")))
    address, ids = emulator_for(copy)
    for token in (ids.functions_token, None):
        refused = CloudLoggingJobLogs(PROJECT, endpoint=address, token=token)
        with pytest.raises(LogReadError, match=r"PermissionDenied|Unauthenticated") as caught:
            refused.error_tail(job, since=None, limit=5)
        assert ("logging.views.access" in str(caught.value)) == (token is not None)


def test_model_registry_calls_need_their_own_permissions(tmp_path: Path) -> None:
    policy = IamPolicy({"jobs-only": FUNCTIONS, "registry": "serviceAccount:r@p"},
                       {FUNCTIONS: ("aiplatform.customJobs.*",),
                        "serviceAccount:r@p": ("aiplatform.models.*",)})
    with VertexEmulator(PROJECT, job_events_topic=None, quotas=QuotaLimits.unlimited(),
                        iam=policy) as emulator:
        from spotorch.ports.registry import ModelUpload

        upload = ModelUpload(pipeline="demo", run_id="r1", region=REGION, display_name="demo",
                             artifact_uri="gs://b/m", serving_image="us-docker.pkg.dev/x/y:1")
        denied = VertexModelRegistry(PROJECT, endpoint=emulator.address, token="jobs-only",
                                     retry=NO_RETRY)
        with pytest.raises(RegistryError) as refused:
            denied.upload(upload)
        assert "Permission 'aiplatform.models." in str(refused.value)
        allowed = VertexModelRegistry(PROJECT, endpoint=emulator.address, token="registry",
                                      retry=NO_RETRY, upload_timeout_s=10)
        assert allowed.upload(upload).startswith(f"projects/{PROJECT}/locations/")


def test_reading_a_canarys_traffic_needs_deploys_monitoring_viewer_grant(
        tmp_path: Path, emulator_for: StartEmulator) -> None:
    from spotorch.adapters.gcp.endpoint_traffic import MonitoringEndpointTraffic
    from spotorch.ports.serving import ServingError

    endpoint = f"projects/{PROJECT}/locations/{REGION}/endpoints/churn"
    address, ids = emulator_for(ROOT / "deploy")
    granted = MonitoringEndpointTraffic(PROJECT, endpoint=address, token=ids.functions_token)
    assert granted.window(endpoint, "1", 0.0).count == 0  # allowed: no traffic yet
    without = tmp_path / "without"
    without.mkdir()
    copy = deploy_copy(without)
    iam = copy / "iam.tf"
    grant = '  role    = "roles/monitoring.viewer"\n'
    assert grant in iam.read_text()
    iam.write_text(iam.read_text().replace(grant, '  role    = "roles/logging.logWriter"\n'))
    address, ids = emulator_for(copy)
    refused = MonitoringEndpointTraffic(PROJECT, endpoint=address, token=ids.functions_token)
    with pytest.raises(ServingError, match=r"monitoring\.timeSeries\.list") as caught:
        refused.window(endpoint, "1", 0.0)
    assert caught.value.permanent and caught.value.code == "PERMISSION_DENIED"
