"""The preprocess step's side effects (issue 31): cache lookups, Dataflow launches, cancels and
completion markers, the tick's poll of live jobs, and statusChanged events checked by GetJob."""

from __future__ import annotations

import logging
from typing import Any

from spotorch.app.deps import Deps
from spotorch.app.launch_specs import stage_template_packages
from spotorch.core import preprocess as pp
from spotorch.core import provenance
from spotorch.core.ids import label_value
from spotorch.core.intents import (
    PREPROCESS_CANCEL,
    PREPROCESS_LAUNCH,
    PREPROCESS_LOOKUP,
    PREPROCESS_MARK,
    PreprocessIntent,
)
from spotorch.core.model import Run
from spotorch.core.observations import (
    IntentDone,
    Observation,
    PreprocessCacheChecked,
    PreprocessObserved,
)
from spotorch.core.preprocessing import step_of
from spotorch.core.spark_batches import BATCH_FAILED
from spotorch.ports.steps import StepLaunch, StepLauncher, StepLaunchError, StepOutputs
from spotorch.ports.store import ConflictError
from spotorch.settings import COLLECTION_JOBS

log = logging.getLogger("spotorch.service")

RECORD_PREFIX = "dataflow-"  # job records of Dataflow jobs: dataflow-<job name> -> the run


class StepsNotConfigured(RuntimeError):
    """A pipeline has a preprocess step but this deployment wired no Dataflow adapters."""


class InputsGone(RuntimeError):
    """A pinned run's inputs manifest is gone: its recorded objects cannot be named."""


def step_launcher(deps: Deps, kind: str = "beam") -> StepLauncher:
    """The deployment's launcher for a step of this kind: Dataflow (beam) or Dataproc Serverless
    batches (spark); StepsNotConfigured when it has none."""
    if kind == "spark":  # issue 42: Dataproc Serverless batches
        if deps.spark_steps is None:
            raise StepsNotConfigured("no Dataproc batch launcher configured (Deps.spark_steps)")
        return deps.spark_steps
    if deps.steps is None:
        raise StepsNotConfigured("no Dataflow launcher configured (Deps.steps)")
    return deps.steps


def service_of(kind: str) -> str:
    """The Google service that runs a kind of step."""
    return "Dataproc" if kind == "spark" else "Dataflow"


def _outputs(deps: Deps) -> StepOutputs:
    if deps.step_outputs is None:
        raise StepsNotConfigured("no preprocess output store configured (Deps.step_outputs)")
    return deps.step_outputs


def perform(deps: Deps, run: Run, intent: PreprocessIntent) -> Observation | None:
    """Carry out one preprocess intent; its answer is the observation the run decides on next.
    Exceptions propagate: the caller defers the intent and the tick retries it."""
    step = step_of(run)
    if step is None:
        return IntentDone(intent.id)
    pipeline = pp.step_pipeline(deps.pipeline(run.pipeline), run)
    if intent.action == PREPROCESS_LOOKUP:
        # A job that reads the run's pinned generations is keyed by them; one that reads the
        # live folder (a template of the user's) by what the folder holds now.
        try:
            pinned = _pinned(deps, run) if pp.reads_pinned(pipeline) else None
        except InputsGone:
            pinned = ()  # no content key (never the live folder's): keyed by the snapshot
        digest = _outputs(deps).content_digest(run.data_uri, pinned)
        input_id = pp.input_identity(run.snapshot_id, run.data_uri, digest)
        keyed = pp.new_step(pipeline, input_id)
        marker = _outputs(deps).read_marker(pp.marker_uri(keyed)) \
            if pp.cacheable(pipeline) else None
        return PreprocessCacheChecked(intent.id, input_id, marker is not None)
    if intent.action == PREPROCESS_LAUNCH:
        if step.job_name != intent.job_name or not step.live:
            return IntentDone(intent.id)  # the step moved on: this launch is no longer wanted
        if pipeline.preprocess is not None and pipeline.preprocess.python_module:
            stage_template_packages(deps, pipeline.job)  # the launcher installs the package
        try:
            inputs = _stage_inputs(deps, run, step) if pp.reads_pinned(pipeline) else None
            job = step_launcher(deps, step.kind).launch(launch_request(deps, run, step, inputs))
        except InputsGone as exc:  # for good: the run's recorded inputs cannot be named
            job = pp.JobView(job_id="", name=intent.job_name, state=_failed(step),
                             error=str(exc), refused=True)
        except StepLaunchError as exc:
            if not exc.permanent:
                raise
            # Refused for good (bad spec, permissions, no launcher template): the run ends
            # FAILED_LAUNCH with Dataflow's words, through the same path as a failed job.
            job = pp.JobView(job_id="", name=intent.job_name, state=_failed(step),
                             error=f"{service_of(step.kind)} refused the job: {exc}",
                             refused=True)
        _record(deps, run, intent.job_name)
        return PreprocessObserved(job, intent.id)
    if intent.action == PREPROCESS_CANCEL:
        if intent.job_name:
            step_launcher(deps, step.kind).cancel(intent.job_name, step.region)
        return IntentDone(intent.id)
    if intent.action == PREPROCESS_MARK:
        if step.phase is pp.StepPhase.DONE and not step.cache_hit:
            _outputs(deps).write_marker(pp.marker_uri(step), pp.marker_doc(step, run.run_id))
        return IntentDone(intent.id)
    log.warning("run %s: unknown preprocess action %r dropped", run.run_id, intent.action)
    return IntentDone(intent.id)


def _failed(step: pp.PreprocessStep) -> str:
    return BATCH_FAILED if step.kind == "spark" else pp.JOB_STATE_FAILED


def _pinned(deps: Deps, run: Run) -> tuple[tuple[str, int], ...] | None:
    """The run's recorded (name, generation) pairs: from its document, or its manifest when the
    document holds too many to list; None for a run that pinned nothing."""
    listed = pp.pinned_objects(run)
    manifest = pp.manifest_of(run)
    if listed is not None or manifest is None:
        return listed
    doc = _outputs(deps).read_manifest(manifest)
    if doc is None:
        raise InputsGone(f"run {run.run_id}: its inputs manifest {manifest} is gone, so its "
                         "recorded objects cannot be preprocessed exactly")
    return tuple((str(o["name"]), int(o["generation"])) for o in doc.get("objects") or ())


def _stage_inputs(deps: Deps, run: Run, step: pp.PreprocessStep) -> str | None:
    """The run's inputs manifest, copied beside the step's output for the job to read (the
    same content on every launch of the key: rewriting it is harmless); None if unpinned."""
    pinned = _pinned(deps, run)
    if pinned is None:
        return None
    if pinned and _outputs(deps).content_digest(run.data_uri, pinned) is None:
        # A recorded generation is gone (a bucket without object versioning): the job would
        # fail reading it, under the user-error budget, launch after launch. Refused for good.
        raise InputsGone(f"run {run.run_id}: a recorded generation under {run.data_uri} is gone "
                         "(is object versioning on?), so its inputs cannot be preprocessed "
                         "exactly")
    data = (run.provenance or {}).get("data") or {}
    uri = pp.inputs_uri(step)
    _outputs(deps).write_marker(uri, provenance.manifest(data, pinned))
    return uri


def launch_request(deps: Deps, run: Run, step: pp.PreprocessStep,
                   inputs_uri: str | None = None) -> StepLaunch:
    """The Dataflow job of the step's current launch: the run's data in (its pinned objects by
    their manifest, when given), the keyed folder out."""
    pipeline = pp.step_pipeline(deps.pipeline(run.pipeline), run)
    spec = pipeline.preprocess
    assert spec is not None and step.job_name is not None
    package = pipeline.job.worker_pools[0].python_package
    return StepLaunch(
        job_name=step.job_name, region=spec.region, input_uri=run.data_uri,
        output_uri=step.output_uri, temp_uri=f"{step.output_uri}_temp/",
        machine_type=spec.machine_type, max_workers=spec.max_workers,
        python_module=spec.python_module,
        package_uris=package.package_uris if package is not None else (),
        template_uri=spec.template_uri, options=spec.options,
        service_account=spec.service_account, inputs_uri=inputs_uri,
        network=spec.network, subnetwork=spec.subnetwork,
        labels={"spotorch_pipeline": label_value(run.pipeline), "spotorch_key": step.cache_key},
        kind=step.kind, properties=spec.properties, runtime_version=spec.runtime_version)


def _record(deps: Deps, run: Run, job_name: str) -> None:
    """Remember which run a Dataflow job belongs to: its statusChanged events name the job only."""
    doc: dict[str, Any] = {"job_name": job_name, "run_id": run.run_id, "pipeline": run.pipeline,
                           "kind": "dataflow", "recorded_at": deps.clock.now()}
    try:
        deps.docs.put(COLLECTION_JOBS, RECORD_PREFIX + job_name, doc, None)
    except ConflictError:
        pass  # recorded by an earlier try: the same facts
    except Exception as exc:  # the tick's poll still follows the job
        log.warning("could not record Dataflow job %s of %s: %s", job_name, run.run_id, exc,
                    extra={"run_id": run.run_id})


def owner_of(deps: Deps, job_name: str) -> str | None:
    """The run a Dataflow job of that name belongs to, None when spotorch never launched it."""
    doc, _ = deps.docs.get(COLLECTION_JOBS, RECORD_PREFIX + job_name)
    return str(doc["run_id"]) if doc and doc.get("run_id") else None


def poll(deps: Deps, run: Run) -> list[Observation]:
    """The tick's backstop: the live step's job as GetJob answers now (lost events repaired)."""
    step = step_of(run)
    launcher = deps.spark_steps if step is not None and step.kind == "spark" else deps.steps
    if step is None or not step.live or not step.job_name or launcher is None:
        return []
    try:
        return [PreprocessObserved(launcher.get(step.job_name, step.region, step.job_id))]
    except Exception as exc:  # the next tick asks again
        log.warning("polling %s job %s failed: %s", service_of(step.kind), step.job_name, exc,
                    extra={"run_id": run.run_id})
        return []
