"""Resource quotas: a quota refusal is capacity that waiting never brings. The domain table
(next region, standard VMs, next hardware candidate, FAILED_QUOTA), the adapter telling a quota
from a request rate, the service on in-memory twins, and the emulator's quotas through the real
client."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from google.api_core import exceptions as api

from fakes import fake_deps
from spotorch.adapters.gcp.vertex import VertexJobLauncher, reported
from spotorch.adapters.gcp.vertex_calls import RetryPolicy
from spotorch.adapters.memory.twins import InMemoryLauncher
from spotorch.app.runs import start_run
from spotorch.core.alerts import render_alert
from spotorch.core.context import Context
from spotorch.core.decide import decide, new_run
from spotorch.core.intents import LaunchIntent, PublishIntent
from spotorch.core.model import AttemptState, FailureClass, JobPhase, JobStatus, Run, RunStatus
from spotorch.core.observations import LaunchFailed
from spotorch.core.pipeline import (
    Capacity,
    EscalationKind,
    JobTemplate,
    Pipeline,
    RecoveryPolicy,
    Trigger,
    WorkerPool,
)
from spotorch.core.quotas import is_quota_refusal, quota_metrics, retry_is_futile
from spotorch.core.regions import AVOID_QUOTA
from spotorch.local._vertex_quota import QuotaLimits
from spotorch.local._vertex_resources import ResourceQuotas, accelerator_metric, vcpus
from spotorch.local.vertex_emulator import VertexEmulator
from spotorch.ports.jobs import LABEL_ATTEMPT, LABEL_RUN, LaunchError, LaunchSpec
from spotorch.spec.event_schemas import validate_event

T0 = 1_800_000_000.0
L4 = "aiplatform.googleapis.com/custom_model_training_preemptible_nvidia_l4_gpus"
REFUSAL = ("launch r1 attempt 1: RESOURCE_EXHAUSTED: 429 The following quota metrics exceed "
           f"quota limits: {L4}")
RATE = ("launch r1 attempt 1: RESOURCE_EXHAUSTED: 429 Quota exceeded for quota metric 'Job or "
        "LRO submission requests' and limit 'Job or LRO submission requests per minute per "
        "region' of service 'aiplatform.googleapis.com' for consumer 'project:p' in region "
        "us-central1 (60 per 60s).")


def pipeline(regions: tuple[str, ...] = ("us-central1", "europe-west4"), **recovery: Any
             ) -> Pipeline:
    pool = WorkerPool(machine_type="g2-standard-8", accelerator_type="NVIDIA_L4",
                      accelerator_count=1, image_uri="i", command=("python", "t.py"))
    return Pipeline(name="p", trigger=Trigger(bucket="b"), checkpoint_uri="gs://c/p",
                    output_uri="gs://m/p", job=JobTemplate(worker_pools=(pool,), regions=regions),
                    recovery=RecoveryPolicy(**recovery))


def refused(run: Run, p: Pipeline, message: str = REFUSAL, now: float = T0 + 1) -> Run:
    intent = next(i for i in run.outbox if isinstance(i, LaunchIntent))
    return decide(run, LaunchFailed(intent.id, intent.attempt, message, permanent=True,
                                    code="RESOURCE_EXHAUSTED"), Context(p, now))


def launches(run: Run) -> list[LaunchIntent]:
    return [i for i in run.outbox if isinstance(i, LaunchIntent)]


def failed_event(run: Run) -> dict[str, Any]:
    return next(dict(i.event) for i in run.outbox if isinstance(i, PublishIntent)
                and str(i.event["type"]).endswith("run.failed.v1"))


# --- the domain table ---------------------------------------------------------------------------

def test_the_default_patterns_tell_a_resource_quota_from_a_request_rate() -> None:
    patterns = RecoveryPolicy().quota_patterns
    assert is_quota_refusal(REFUSAL, patterns)
    assert is_quota_refusal("exceeds the allowed maximum of 0 A100, 0 K80", patterns)
    assert not is_quota_refusal(RATE, patterns)
    assert quota_metrics(REFUSAL) == (L4,)


def test_a_quota_refusal_moves_the_attempt_to_the_next_region_on_the_same_capacity() -> None:
    p = pipeline()
    run = new_run(run_id="r1", pipeline=p, now=T0, data_uri="gs://b/d/", snapshot_id="s")
    assert run.attempts[0].region == "us-central1" and run.attempts[0].capacity is Capacity.SPOT
    run = refused(run, p)
    first, second = run.attempts
    assert first.state is AttemptState.FAILED and first.failure is FailureClass.QUOTA
    assert second.region == "europe-west4" and second.capacity is Capacity.SPOT
    assert [i.attempt for i in launches(run)] == [2]  # the refused launch left the outbox
    assert [(m.region, m.why) for m in run.avoid_regions] == [("us-central1", AVOID_QUOTA)]
    assert run.status is RunStatus.STARTING


def test_refused_in_every_region_on_spot_moves_to_standard_then_fails_quota_naming_it() -> None:
    p = pipeline()
    run = new_run(run_id="r1", pipeline=p, now=T0, data_uri="gs://b/d/", snapshot_id="s")
    run = refused(refused(run, p), p)
    assert run.current is not None and run.current.capacity is Capacity.STANDARD
    standard = REFUSAL.replace("preemptible_", "")
    run = refused(refused(run, p, standard), p, standard)
    assert run.status is RunStatus.FAILED_QUOTA and not launches(run)
    assert len(run.attempts) == 4  # each (region, capacity) refused once, never again
    assert "custom_model_training_nvidia_l4_gpus" in (run.end_reason or "")
    data = failed_event(run)["data"]
    assert data["failure_class"] == "quota" and data["status"] == "FAILED_QUOTA"
    assert data["quota"]["metrics"] == [standard.rsplit(" ", 1)[1]]
    assert data["quota"]["regions"] == ["europe-west4", "us-central1"]
    assert data["quota"]["request_url"].startswith("https://console.cloud.google.com/iam-admin/")
    validate_event(failed_event(run))  # the published event, against its JSON Schema
    alert = render_alert(failed_event(run))
    assert "request" in alert.headline and "custom_model_training_nvidia_l4_gpus" in alert.headline


def test_without_escalation_spot_quota_everywhere_fails_at_once() -> None:
    p = pipeline(regions=("us-central1",), escalation=EscalationKind.NEVER)
    run = new_run(run_id="r1", pipeline=p, now=T0, data_uri="gs://b/d/", snapshot_id="s")
    run = refused(run, p)
    assert run.status is RunStatus.FAILED_QUOTA and len(run.attempts) == 1
    assert L4 in (run.end_reason or "") and "us-central1" in (run.end_reason or "")


def test_a_rate_limit_is_retried_and_never_ends_the_attempt() -> None:
    p = pipeline()
    run = new_run(run_id="r1", pipeline=p, now=T0, data_uri="gs://b/d/", snapshot_id="s")
    intent = launches(run)[0]
    run = decide(run, LaunchFailed(intent.id, 1, RATE, permanent=False,
                                   code="RESOURCE_EXHAUSTED"), Context(p, T0 + 1))
    assert len(run.attempts) == 1 and run.attempts[0].live and launches(run)


def test_a_job_that_fails_with_the_quota_text_is_classified_quota_and_moves_on() -> None:
    p = pipeline()
    run = new_run(run_id="r1", pipeline=p, now=T0, data_uri="gs://b/d/", snapshot_id="s")
    from spotorch.core.observations import JobObserved, LaunchDone

    intent = launches(run)[0]
    run = decide(run, LaunchDone(intent.id, 1, "job-1"), Context(p, T0))
    # what Vertex says, unclassified: the core reads it with the pipeline's quota patterns
    status = reported(5, 8, REFUSAL.split("429 ", 1)[1], started=False, job_name="job-1")
    run = decide(run, JobObserved(1, status), Context(p, T0 + 5))
    assert run.current is not None and run.current.region == "europe-west4"


def test_a_refused_hardware_candidate_gives_way_to_the_next_fit_one() -> None:
    p = pipeline(regions=("us-central1",), escalation=EscalationKind.NEVER)
    run = new_run(run_id="r1", pipeline=p, now=T0, data_uri="gs://b/d/", snapshot_id="s")
    rows = [{"candidate": "l4", "fit": True, "spot_cost": 1.0, "meets_deadline": True},
            {"candidate": "t4", "fit": True, "spot_cost": 2.0, "meets_deadline": True},
            {"candidate": "tiny", "fit": False, "spot_cost": 0.1}]
    run = replace(run, hardware={"chosen": "l4", "rows": rows, "reason": "cheapest"})
    run = refused(run, p)
    assert run.status is RunStatus.STARTING and run.hardware is not None
    assert run.hardware["chosen"] == "t4" and run.hardware["quota_refused"] == ["l4"]
    assert not [m for m in run.avoid_regions if m.why == AVOID_QUOTA]
    run = refused(run, p, REFUSAL.replace("nvidia_l4", "nvidia_t4"))
    assert run.status is RunStatus.FAILED_QUOTA


# --- the adapter ------------------------------------------------------------------------------

class _Refusing:
    def __init__(self, message: str) -> None:
        self.message, self.creates = message, 0

    def list_custom_jobs(self, request: Any, timeout: float) -> list[Any]:
        return []

    def create_custom_job(self, **kwargs: Any) -> Any:
        self.creates += 1
        raise api.ResourceExhausted(self.message)


def _spec() -> LaunchSpec:
    template = JobTemplate(worker_pools=(WorkerPool(command=("true",)),))
    return LaunchSpec(run_id="r1", pipeline="p", attempt=1, capacity=Capacity.SPOT,
                      region="us-central1", template=template, env={},
                      labels={LABEL_RUN: "r1", LABEL_ATTEMPT: "1"}, display_name="r1")


@pytest.mark.parametrize(("message", "creates", "permanent"), [
    (f"The following quota metrics exceed quota limits: {L4}", 1, True),
    (RATE.split("429 ", 1)[1], 3, False),
])
def test_the_launcher_never_retries_a_resource_quota_but_retries_a_rate(
        message: str, creates: int, permanent: bool) -> None:
    client = _Refusing(message)
    # the core's rule (wiring passes it with every pipeline's quota patterns)
    launcher = VertexJobLauncher("p", client_factory=lambda region: client,
                                 retry=RetryPolicy(attempts=3, sleep=lambda s: None),
                                 futile=lambda code, said: retry_is_futile(
                                     code, said, [RecoveryPolicy().quota_patterns]))
    with pytest.raises(LaunchError) as failed:
        launcher.launch(_spec())
    assert client.creates == creates and failed.value.permanent is permanent
    assert failed.value.code == "RESOURCE_EXHAUSTED"


# --- the service on in-memory twins --------------------------------------------------------------

class _QuotaLauncher(InMemoryLauncher):
    """Refuses every launch in us-central1 as Vertex does with 0 L4 quota there."""

    def launch(self, spec: LaunchSpec) -> str:
        if spec.region == "us-central1":
            raise LaunchError(REFUSAL, permanent=True, code="RESOURCE_EXHAUSTED")
        return super().launch(spec)


def test_the_service_launches_in_the_next_region_once_and_never_retries_the_refusal() -> None:
    deps = fake_deps(pipeline())
    deps = replace(deps, launcher=_QuotaLauncher())
    run = start_run(deps, "p", run_id="r1", data_uri="gs://b/d/", snapshot_id="s", reason="t")
    assert run is not None
    assert [(a.region, a.state) for a in run.attempts] == [
        ("us-central1", AttemptState.FAILED), ("europe-west4", AttemptState.QUEUED)]
    assert isinstance(deps.launcher, InMemoryLauncher) and deps.launcher.created == 1


# --- the emulator's resource quotas ------------------------------------------------------------

def test_machine_types_and_accelerators_count_against_their_metrics() -> None:
    assert (vcpus("n1-standard-4"), vcpus("g2-standard-8"), vcpus("a2-highgpu-2g")) == (4, 8, 24)
    assert accelerator_metric("NVIDIA_TESLA_T4", True) == \
        "custom_model_training_preemptible_nvidia_t4_gpus"
    assert accelerator_metric("NVIDIA_H100_80GB", False) == "custom_model_training_nvidia_h100_gpus"


def test_the_emulator_refuses_create_over_a_resource_quota_with_vertex_message() -> None:
    quotas = {"us-central1": {"custom_model_training_preemptible_nvidia_l4_gpus": 0},
              "*": {"custom_model_training_preemptible_cpus": 8}}
    with VertexEmulator("p", job_events_topic=None, quotas=QuotaLimits.unlimited(),
                        resource_quotas=quotas, queued_s=60) as emulator:
        launcher = VertexJobLauncher("p", endpoint=emulator.address,
                                     retry=RetryPolicy(attempts=1))
        gpu = WorkerPool(machine_type="g2-standard-8", accelerator_type="NVIDIA_L4",
                         accelerator_count=1, command=("true",))
        spec = replace(_spec(), template=JobTemplate(worker_pools=(gpu,)))
        with pytest.raises(LaunchError) as failed:
            launcher.launch(spec)
        assert failed.value.permanent
        assert f"The following quota metrics exceed quota limits: {L4}" in str(failed.value)
        # Another region has L4s; its 8 CPUs hold one g2-standard-8, not two.
        launcher.launch(replace(spec, region="europe-west4"))
        with pytest.raises(LaunchError, match="custom_model_training_preemptible_cpus"):
            launcher.launch(replace(spec, region="europe-west4", run_id="r2",
                                    labels={LABEL_RUN: "r2", LABEL_ATTEMPT: "1"}))
        # Raised as an operator would: the same job goes.
        emulator.resource_quotas = ResourceQuotas.parse({})
        assert launcher.launch(spec).startswith("projects/p/locations/us-central1/")


def test_no_spot_probe_is_launched_while_spot_quota_refuses_every_region() -> None:
    from spotorch.core.observations import JobObserved, LaunchDone, Tick
    from spotorch.core.pipeline import SpotProbes

    p = replace(pipeline(escalation=EscalationKind.DEADLINE, expected_compute_s=36000.0,
                         spot_probes=SpotProbes(enabled=True, wait_s=600.0)),
                deadline_s=30 * 3600.0)  # as tests/test_spot_probes.py: a probe would pay
    run = new_run(run_id="r1", pipeline=p, now=T0, data_uri="gs://b/d/", snapshot_id="s")
    run = refused(refused(run, p), p)  # Spot refused in both regions: standard
    current = run.current
    assert current is not None and current.capacity is Capacity.STANDARD
    intent = launches(run)[0]
    run = decide(run, LaunchDone(intent.id, current.number, "job-s"), Context(p, T0 + 2))
    run = decide(run, JobObserved(current.number, JobStatus("job-s", JobPhase.RUNNING)),
                 Context(p, T0 + 3))
    for minute in range(1, 30):
        run = decide(run, Tick(), Context(p, T0 + 60 * minute))
    assert run.probes == () and run.counters.probes == 0
