"""What each launch asks Vertex AI for: an attempt's job, a Spot probe's, a hardware probe's."""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from spotorch.app import hardware_probes as probes
from spotorch.app.deps import Deps
from spotorch.core import hardware, promotion, provenance, shapes
from spotorch.core.hardware import PROBE_CANDIDATE_LABEL
from spotorch.core.intents import LaunchIntent, LaunchProbeIntent
from spotorch.core.model import PROBE_CAPACITY, PROBE_HARDWARE, JobPhase, JobStatus, Probe, Run, probe_key
from spotorch.core.pipeline import Capacity, HardwareCandidate, JobTemplate, Pipeline
from spotorch.core.preprocess import training_data_uri
from spotorch.core.preprocessing import step_of
from spotorch.ports.jobs import (
    LABEL_ATTEMPT,
    LABEL_BUCKET,
    LABEL_PIPELINE,
    LABEL_PROBE,
    LABEL_RUN,
    LaunchSpec,
)
from spotorch_trainer import contract

log = logging.getLogger("spotorch.app.launch_specs")




def _probe_labels(run: Run, probe: int, kind: str) -> dict[str, str]:
    """A run's probe job: its run and bucket (the tick lists it), never an attempt number."""
    return {LABEL_RUN: run.run_id, LABEL_ATTEMPT: probe_key(probe),
            LABEL_PIPELINE: run.pipeline, LABEL_BUCKET: str(run.bucket), LABEL_PROBE: kind}


def _probe_session(run: Run, pipeline: Pipeline, region: str) -> probes.ProbeSession:
    """Where a run's hardware probes write: {checkpoint_uri}/{run_id}-probes/{candidate}/."""
    return probes.ProbeSession(f"{run.run_id}-probes", pipeline.checkpoint_uri, run.data_uri,
                               region)


def _candidate(pipeline: Pipeline, name: str | None) -> HardwareCandidate | None:
    search = pipeline.hardware
    return next((c for c in (search.candidates if search else ()) if c.name == name), None)


def hardware_probe_spec(deps: Deps, run: Run, probe: Probe) -> LaunchSpec:
    """A hardware candidate's probe: the training code on its shape for probe_steps steps."""
    pipeline = deps.pipeline(run.pipeline)
    candidate = _candidate(pipeline, probe.candidate)
    if candidate is None:
        raise ValueError(f"the pipeline no longer lists candidate {probe.candidate!r}")
    spec = probes.probe_spec(pipeline, _probe_session(run, pipeline, probe.region), candidate)
    return replace(spec, run_id=run.run_id, region=probe.region,
                   labels={**spec.labels, **_probe_labels(run, probe.number,
                                                          PROBE_HARDWARE),
                           PROBE_CANDIDATE_LABEL: candidate.name},
                   display_name=f"spotorch-{run.run_id}-probe{probe.number}-"
                                f"{candidate.name}"[:128])


def hardware_result(deps: Deps, run: Run, probe: Probe,
                     status: JobStatus) -> dict[str, Any] | None:
    """An ended hardware probe's measurement, from its trainer's report (read now)."""
    pipeline = deps.pipeline(run.pipeline)
    search = pipeline.hardware
    candidate = _candidate(pipeline, probe.candidate)
    if probe.kind != PROBE_HARDWARE or search is None or candidate is None or \
            not status.phase.terminal:
        return None
    root = probes.probe_root(_probe_session(run, pipeline, probe.region), candidate)
    try:
        raw = deps.checkpoints.read_report(f"{root}/checkpoints/{contract.PROBE_REPORT}",
                                           probes.MAX_REPORT_BYTES)
        report = json.loads(raw) if raw else None
    except (OSError, ValueError) as exc:
        log.warning("probe report of %s unreadable: %s", probe.candidate, exc,
                    extra={"run_id": run.run_id})
        report = None
    result = hardware.result_of(
        candidate.name, report if isinstance(report, Mapping) else None,
        succeeded=status.phase is JobPhase.SUCCEEDED, exit_code=status.exit_code,
        message=status.message or str(status.phase), now=deps.clock.now(),
        key=hardware.cache_key(pipeline, candidate, search.probe_steps),
        job_name=status.job_name, oom_patterns=pipeline.health.oom_patterns)
    return result.to_doc()


def probe_spec(deps: Deps, run: Run, intent: LaunchProbeIntent) -> LaunchSpec:
    """A Spot capacity probe: the run's machine shape (every pool, every replica: capacity for
    one VM says little of eight) running the probe's command, which only has to start."""
    pipeline = deps.pipeline(run.pipeline)
    shaped = with_machine(_hardware_template(pipeline, run), run.health.machine_type)
    command = pipeline.recovery.spot_probes.command
    pools = tuple(replace(pool, command=command, args=(), env=()) for pool in shaped.worker_pools)
    # Cancelled once it runs or after its wait: the timeout only bounds a probe nobody cancels.
    timeout = pipeline.recovery.spot_probes.wait_s + 2 * pipeline.recovery.decision_interval_s
    template = replace(shaped, worker_pools=pools, timeout_s=timeout)
    labels = _probe_labels(run, intent.probe, PROBE_CAPACITY)
    return LaunchSpec(run_id=run.run_id, pipeline=run.pipeline, attempt=0,
                      capacity=Capacity.SPOT, region=intent.region, template=template, env={},
                      labels=labels,
                      display_name=f"spotorch-{run.run_id}-probe{intent.probe}"[:128])


# ---------------------------------------------------------------- hardware (issue 19)

def _hardware_template(pipeline: Pipeline, run: Run) -> JobTemplate:
    """The pipeline's job template, on the candidate the run's hardware choice names."""
    return shapes.run_pipeline(pipeline, run.hardware).job


def launch_spec(deps: Deps, run: Run, intent: LaunchIntent) -> LaunchSpec:
    """The job of one attempt: the pipeline's template plus the trainer's env and identifying labels."""
    pipeline = deps.pipeline(run.pipeline)
    number = intent.attempt
    env = {
        contract.ENV_RUN_ID: run.run_id,
        contract.ENV_ATTEMPT: str(number),
        contract.ENV_PIPELINE: run.pipeline,
        contract.ENV_CHECKPOINT_URI: run.checkpoint_uri,
        contract.ENV_RESUME_FROM: intent.resume_uri or "",
        contract.ENV_RESUME_STEP: "" if intent.resume_step is None else str(intent.resume_step),
        # issue 31: a run with a preprocess step trains on the step's output
        contract.ENV_DATA_URI: training_data_uri(step_of(run), run.data_uri),
        contract.ENV_MODEL_URI: run.output_uri,
        contract.ENV_EVENTS_TOPIC: deps.events_topic,
    }
    if run.sweep_id:
        env[contract.ENV_PARAMS] = json.dumps(dict(run.params), sort_keys=True)
    prov = run.provenance or {}
    if prov.get("seed") is not None:
        env[contract.ENV_SEED] = str(prov["seed"])
    manifest = (prov.get("data") or {}).get("manifest_uri")
    # The snapshot's objects at their generations (env holds no 2000 names). Not for a run
    # that trains on its preprocess step's output (issue 31): the trainer reads that folder,
    # which the manifest does not list; the step's cache key names its input, code, options.
    if manifest and env[contract.ENV_DATA_URI] == run.data_uri:
        env[contract.ENV_INPUTS] = str(manifest)
    env.update(promotion.evaluation_env(prov.get("evaluation")))  # held-out data (issue 37)
    if intent.resume_exact:
        env[contract.ENV_RESUME_EXACT] = "1"
    attempt = run.attempt(number)
    if attempt is not None and attempt.report_key:  # the job's environment only: never logged
        env[contract.ENV_REPORT_KEY] = attempt.report_key
    labels = {LABEL_RUN: run.run_id, LABEL_ATTEMPT: str(number), LABEL_PIPELINE: run.pipeline,
              LABEL_BUCKET: str(run.bucket)}
    template = _hardware_template(pipeline, run)
    if run.rerun_of and prov.get("code"):  # a rerun runs its origin's code and machines
        template = provenance.pinned_template(template, prov["code"], prov.get("hardware"))
    template = with_machine(template, intent.machine_type)  # an out-of-memory fallback: on top
    return LaunchSpec(run_id=run.run_id, pipeline=run.pipeline, attempt=number,
                      capacity=intent.capacity, region=intent.region,
                      template=template, env=env,
                      labels=labels,
                      display_name=f"spotorch-{run.run_id}-a{number}"[:128])


def with_machine(template: JobTemplate, machine_type: str | None) -> JobTemplate:
    """The job template with the first worker pool on another machine type (OOM fallback)."""
    if not machine_type or not template.worker_pools:
        return template
    first, *rest = template.worker_pools
    return replace(template, worker_pools=(replace(first, machine_type=machine_type), *rest))


def stage_packages(deps: Deps, spec: LaunchSpec) -> None:
    """Upload the built Python packages a job runs that the staging bucket lacks (the pipeline
    was validated and its packages built where it was deployed: spotorch.spec.packages)."""
    stage_template_packages(deps, spec.template)


def stage_template_packages(deps: Deps, template: JobTemplate) -> None:
    """Upload the built packages of a job template's pools that the staging bucket lacks (the
    training's, and the preprocess step's: its Beam module comes from the chief's package)."""
    for pool in template.worker_pools:
        package = pool.python_package
        if package is not None:
            for uri, path in zip(package.package_uris, package.staged_files, strict=False):
                deps.objects.ensure_file(uri, path)
