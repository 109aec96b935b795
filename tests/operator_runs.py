"""Real runs for the operator tests, written by the service layer: a preempted-twice, escalated,
successful run and a few others, a run on a probed hardware choice, and sweeps, on in-memory
adapters or on any DocumentStore (Firestore)."""

from __future__ import annotations

from dataclasses import replace

from fakes import fake_deps
from spotorch.adapters.memory.registry import MemoryModelRegistry
from spotorch.adapters.memory.twins import (
    InMemoryCheckpoints,
    InMemoryJobLogs,
    InMemoryLauncher,
    InMemoryObjectStore,
    ManualClock,
)
from spotorch.app import sweeps as sweep_service
from spotorch.app.deps import Deps
from spotorch.app.hardware_probes import save_cache
from spotorch.app.job_events import job_changed, trainer_reported
from spotorch.app.run_store import DocumentRunStore
from spotorch.app.runs import submit
from spotorch.app.tick import tick
from spotorch.core.hardware import ProbeResult, cache_key, unfit_reason
from spotorch.core.model import Checkpoint, FailureClass, JobPhase, Run
from spotorch.core.observations import TrainerReported
from spotorch.core.pipeline import (
    BatchMode,
    EscalationKind,
    HardwareCandidate,
    HardwareSearch,
    JobTemplate,
    OnActiveRun,
    Pipeline,
    RecoveryPolicy,
    Trigger,
    WorkerPool,
)
from spotorch.core.sweep_spec import Goal, MedianStopping, ModelRegistration, Parameter, SweepSpec
from spotorch.core.sweeps import Sweep

T0 = 1_800_000_000.0  # 2027-01-15T08:00:00Z
TOTAL_STEPS = 300
CHECKPOINT_WRITE_S = 12.0  # what the story's trainer reports each checkpoint took to write
PIPELINE = Pipeline(
    name="ops", trigger=Trigger(bucket="landing", prefix="ops/"),
    checkpoint_uri="gs://ckpt/ops", output_uri="gs://models/ops", deadline_s=4 * 3600.0,
    recovery=RecoveryPolicy(escalation=EscalationKind.COUNT, escalate_after_preemptions=2,
                            restart_overhead_s=600.0, backoff_base_s=1.0, max_user_errors=1))


def deps_for(docs: object = None) -> Deps:
    """In-memory deps knowing PIPELINE; with `docs`, runs are stored there (e.g. Firestore)."""
    deps = fake_deps(PIPELINE)
    deps.clock = ManualClock(T0)
    if docs is not None:
        deps = replace(deps, docs=docs, runs=DocumentRunStore(docs))  # type: ignore[arg-type]
    assert isinstance(deps.objects, InMemoryObjectStore)
    for folder in SUBMITTED:  # a submit needs data there (issue 39)
        deps.objects.put("landing", f"{folder}part-0.csv", 1, b"x,y\n")
    return deps


# The folders these runs and sweeps are submitted for.
SUBMITTED = ("ops/batch-1/", "ops/batch-2/", "ops/batch-3/", "ops/batch-4/", "ranker/day-1/",
             "tune/a/", "tune/b/", "ops/batch-9/", "tune/day-9/", "ops/x/",
             "ops/batch-7/")  # batch-7: tests/test_cli_process.py submits it as a process


def _clock(deps: Deps) -> ManualClock:
    assert isinstance(deps.clock, ManualClock)
    return deps.clock


def _attempt_runs(deps: Deps, run_id: str, n: int, *, until_step: int, checkpoint: int,
                  run_s: float, end: FailureClass | None,
                  checkpoint_s: float | None = CHECKPOINT_WRITE_S) -> Run:
    """Attempt n waits 30 s for capacity, runs run_s reporting steps, then ends (None: succeeds)."""
    launcher, clock = deps.launcher, _clock(deps)
    assert isinstance(launcher, InMemoryLauncher) and isinstance(deps.checkpoints,
                                                                 InMemoryCheckpoints)
    job = launcher.job_of(run_id, n)
    job_changed(deps, run_id, n, launcher.set_status(job, JobPhase.QUEUED))
    clock.advance(30)
    job_changed(deps, run_id, n, launcher.set_status(job, JobPhase.RUNNING))
    clock.advance(run_s / 2)
    ckpt_uri = deps.checkpoints.put(f"gs://ckpt/ops/{run_id}", checkpoint)  # written, complete
    trainer_reported(deps, run_id, TrainerReported(n, "checkpoint", clock.now(), step=checkpoint,
                                                   total_steps=TOTAL_STEPS,
                                                   checkpoint_uri=ckpt_uri,
                                                   checkpoint_s=checkpoint_s))
    deps.checkpoints.latest_by_uri[f"gs://ckpt/ops/{run_id}"] = Checkpoint(checkpoint, ckpt_uri)
    clock.advance(run_s / 2)
    trainer_reported(deps, run_id, TrainerReported(n, "progress", clock.now(), step=until_step,
                                                   total_steps=TOTAL_STEPS,
                                                   metrics={"loss": 0.5 / n}))
    phase = JobPhase.SUCCEEDED if end is None else JobPhase.FAILED
    run = job_changed(deps, run_id, n, launcher.set_status(job, phase, failure=end))
    assert run is not None
    return run


def preempted_twice_then_standard(deps: Deps, request_id: str = "story") -> Run:
    """Spot, preempted at step 110 (checkpoint 100); Spot again, preempted at 220 (checkpoint 200);
    escalated to standard, succeeds at 300."""
    run = submit(deps, "ops", "gs://landing/ops/batch-1/", request_id=request_id)
    assert run is not None
    run_id = run.run_id
    _attempt_runs(deps, run_id, 1, until_step=110, checkpoint=100, run_s=1200,
                  end=FailureClass.PREEMPTED)
    _clock(deps).advance(5)
    _attempt_runs(deps, run_id, 2, until_step=220, checkpoint=200, run_s=1200,
                  end=FailureClass.PREEMPTED)
    _clock(deps).advance(5)
    return _attempt_runs(deps, run_id, 3, until_step=300, checkpoint=290, run_s=900, end=None)


def running_run(deps: Deps, request_id: str = "live") -> Run:
    """A run whose first Spot attempt is running at step 40."""
    run = submit(deps, "ops", "gs://landing/ops/batch-2/", request_id=request_id)
    assert run is not None and isinstance(deps.launcher, InMemoryLauncher)
    job = deps.launcher.job_of(run.run_id, 1)
    job_changed(deps, run.run_id, 1, deps.launcher.set_status(job, JobPhase.RUNNING))
    _clock(deps).advance(300)
    out = trainer_reported(deps, run.run_id, TrainerReported(1, "progress", deps.clock.now(),
                                                             step=40, total_steps=TOTAL_STEPS))
    assert out is not None
    return out


def queued_run(deps: Deps, request_id: str = "waiting") -> Run:
    """A run submitted while another of its pipeline is active: QUEUED behind it."""
    run = submit(deps, "ops", "gs://landing/ops/batch-4/", request_id=request_id)
    assert run is not None
    return run


def every_kind(deps: Deps) -> dict[str, Run]:
    """The story, a failed run, a running one and one queued behind it, a minute apart."""
    runs = {"story": preempted_twice_then_standard(deps)}
    _clock(deps).advance(60)
    runs["failed"] = failed_run(deps)
    _clock(deps).advance(60)
    runs["live"] = running_run(deps)
    _clock(deps).advance(60)
    runs["queued"] = queued_run(deps)
    return runs


TRACEBACK = ("loading gs://landing/ops/batch-3/part-0.csv", "Traceback (most recent call last):",
             '  File "train.py", line 41, in <module>', "    columns = read(uri)",
             "ValueError: bad column 'label' in part-0.csv")


def failed_run(deps: Deps, request_id: str = "broken") -> Run:
    """A run whose training code exits 1 twice (user-error budget 1): FAILED."""
    run = submit(deps, "ops", "gs://landing/ops/batch-3/", request_id=request_id)
    assert run is not None and isinstance(deps.launcher, InMemoryLauncher)
    for n in (1, 2):
        job = deps.launcher.job_of(run.run_id, n)
        job_changed(deps, run.run_id, n, deps.launcher.set_status(job, JobPhase.RUNNING))
        _clock(deps).advance(60)
        if isinstance(deps.job_logs, InMemoryJobLogs):  # what its worker wrote to stderr
            deps.job_logs.write(job, *TRACEBACK, at=deps.clock.now())
        out = job_changed(deps, run.run_id, n, deps.launcher.set_status(
            job, JobPhase.FAILED, failure=FailureClass.USER_ERROR, exit_code=1,
            message="ValueError: bad column"))
        _clock(deps).advance(10)
        tick(deps)
    assert out is not None
    return deps.runs.load(run.run_id)[0] or out


# ---------------------------------------------------------------- a probed hardware choice

CPU = HardwareCandidate("cpu", "n1-standard-8")
L4 = HardwareCandidate("l4", "g2-standard-8", "NVIDIA_L4", 1)
SMALL = HardwareCandidate("small", "n1-highcpu-2")
OOM_MESSAGE = ("The replica workerpool0-0 exited with a non-zero status of 137. "
               "Termination reason: OOMKilled.")
HW_PIPELINE = Pipeline(
    name="ranker", trigger=Trigger(bucket="landing", prefix="ranker/"),
    checkpoint_uri="gs://ckpt/ranker", output_uri="gs://models/ranker", deadline_s=3 * 3600.0,
    job=JobTemplate(worker_pools=(WorkerPool(image_uri="img", command=("python", "t.py")),)),
    recovery=RecoveryPolicy(escalation=EscalationKind.DEADLINE, expected_compute_s=600.0),
    hardware=HardwareSearch(candidates=(CPU, L4, SMALL), total_steps=36_000, probe_steps=20))


def hardware_run(deps: Deps, pipeline: Pipeline = HW_PIPELINE) -> Run:
    """A run started on the candidate its cached probes chose: cpu misses the 3 h deadline
    (5 h), l4 is chosen (2.5 h), small was OOM-killed in its probe (unfit). With a pipeline of a
    shorter deadline, none meets it: l4 is chosen as the fastest, with a warning."""
    deps.pipelines[pipeline.name] = pipeline  # type: ignore[index]
    now = deps.clock.now()

    def key(c: HardwareCandidate) -> str:
        return cache_key(pipeline, c, 20)

    save_cache(deps.docs, pipeline.name, {
        "cpu": ProbeResult("cpu", True, steps_per_s=2.0, peak_host_rss_mb=540.0, steps=20,
                           measured_at=now, key=key(CPU)),
        "l4": ProbeResult("l4", True, steps_per_s=4.0, peak_host_rss_mb=530.0, steps=20,
                          measured_at=now, key=key(L4)),
        "small": ProbeResult("small", False, reason=unfit_reason(137, OOM_MESSAGE),
                             measured_at=now, key=key(SMALL))}, now)
    run = submit(deps, pipeline.name, "gs://landing/ranker/day-1/", request_id="hw")
    assert run is not None and run.hardware is not None and run.hardware["chosen"] == "l4"
    return run


# ---------------------------------------------------------------- sweeps

SWEEP_SPEC = SweepSpec(parameters=(Parameter("lr", values=(0.1, 0.01, 0.001, 0.0001)),),
                       parallelism=3, metric="loss", goal=Goal.MINIMIZE,
                       early_stopping=MedianStopping(min_trials=2, min_step=10))
SWEEP_PIPELINE = Pipeline(
    name="tune", trigger=Trigger(bucket="landing", prefix="tune/",
                                 on_active_run=OnActiveRun.QUEUE),
    checkpoint_uri="gs://ckpt/tune", output_uri="gs://models/tune",
    recovery=RecoveryPolicy(escalation=EscalationKind.NEVER, backoff_base_s=1.0),
    sweep=SWEEP_SPEC, model=ModelRegistration(serving_image="img"))


def _report(deps: Deps, run_id: str, step: int, loss: float) -> None:
    _clock(deps).advance(2)
    trainer_reported(deps, run_id, TrainerReported(1, "progress", deps.clock.now(), step=step,
                                                   total_steps=100, metrics={"loss": loss}))


def _job_ends(deps: Deps, run_id: str, phase: JobPhase,
              failure: FailureClass | None = None) -> None:
    launcher = deps.launcher
    assert isinstance(launcher, InMemoryLauncher)
    job_changed(deps, run_id, 1, launcher.set_status(launcher.job_of(run_id, 1), phase,
                                                     failure=failure))


def sweeps(deps: Deps) -> dict[str, Sweep]:
    """A finished sweep (trial 3 stopped early by the median rule, trial 2 the best, its model
    registered) and, a minute later, a running one (three trials running, one pending)."""
    deps.pipelines[SWEEP_PIPELINE.name] = SWEEP_PIPELINE  # type: ignore[index]
    deps.models = MemoryModelRegistry("proj")
    done = sweep_service.submit_sweep(deps, "tune", "gs://landing/tune/a/", request_id="a")
    trial = {t.number: t.run_id for t in done.trials}
    for number, loss in ((1, 0.5), (2, 0.4), (3, 0.9)):
        _report(deps, trial[number], 10, loss)
    tick(deps)  # the median rule: trial 3 (0.9 at step 10) is worse than the others' median
    _job_ends(deps, trial[3], JobPhase.CANCELLED, FailureClass.CANCELLED)
    for number, loss in ((1, 0.3), (2, 0.2), (4, 0.25)):
        _report(deps, trial[number], 100, loss)
        _job_ends(deps, trial[number], JobPhase.SUCCEEDED)
    finished = sweep_service.load_sweep(deps, done.sweep_id)[0]
    assert finished is not None and str(finished.status) == "SUCCEEDED" and finished.best == 2
    _clock(deps).advance(60)
    running = sweep_service.submit_sweep(deps, "tune", "gs://landing/tune/b/", request_id="b")
    _report(deps, running.trials[0].run_id, 10, 0.6)
    tick(deps)  # the sweep reads its running trials' curves on the tick
    live = sweep_service.load_sweep(deps, running.sweep_id)[0]
    assert live is not None
    return {"done": finished, "running": live}


# ---------------------------------------------------------------- what arrived

NIGHTLY = Pipeline(
    name="nightly", trigger=Trigger(bucket="landing", prefix="nightly/", batch=BatchMode.MARKER,
                                    marker="_DONE", suffixes=(".csv",)),
    checkpoint_uri="gs://ckpt/nightly", output_uri="gs://models/nightly")


def arrivals(deps: Deps) -> dict[str, str]:
    """A marker pipeline's uploads: a folder completed by its marker (its run started), one
    still waiting for it whose producer wrote _SUCCESS instead of _DONE, and a file outside
    every prefix. Returns the folders by what became of them."""
    from spotorch.app.arrivals import data_arrived
    from spotorch.core.triggers import ObjectEvent, ObjectEventKind

    deps.pipelines[NIGHTLY.name] = NIGHTLY  # type: ignore[index]
    objects = deps.objects
    assert isinstance(objects, InMemoryObjectStore)
    uploads = ["nightly/2027-01-14/part-0.csv", "nightly/2027-01-14/_DONE",
               "nightly/2027-01-15/part-0.csv", "nightly/2027-01-15/part-1.csv",
               "nightly/2027-01-15/_SUCCESS", "nighly/2027-01-15/part-0.csv"]
    for i, name in enumerate(uploads, start=1):
        objects.put("landing", name, i, b"x", updated=deps.clock.now())
        data_arrived(deps, ObjectEvent(f"ev-{i}", ObjectEventKind.FINALIZE, "landing", name, i,
                                       size=1, time=deps.clock.now()))
        _clock(deps).advance(1)
    return {"started": "gs://landing/nightly/2027-01-14/",
            "waiting": "gs://landing/nightly/2027-01-15/",
            "wrong marker": "gs://landing/nightly/2027-01-15/",
            "wrong prefix": "gs://landing/nighly/2027-01-15/"}
