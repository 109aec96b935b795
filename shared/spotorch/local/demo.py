"""The end-to-end demo: upload data, watch spotorch train through preemptions, report what happened.

    spotorch demo [--scenario default|stockout|user-error] [--json] [--timeout S]

Everything runs on the local stack (emulators, functions, the Vertex AI emulator, alert receivers),
started here and stopped at the end. With --json, stdout carries exactly one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

if TYPE_CHECKING:
    from spotorch.core.model import Run
    from spotorch.local.stack import DevStack

REPO = Path(__file__).resolve().parents[3]  # shared/spotorch/local/demo.py -> the repository
LANDING, CHECKPOINTS, MODELS = "spotorch-landing", "spotorch-checkpoints", "spotorch-models"
PIPELINE = "demo"
TICK_S = 2.0  # the local reconcile tick (production: Cloud Scheduler every 5 minutes)
DATA_PREFIX = "datasets/demo/"


@dataclass(frozen=True)
class Scenario:
    """One demo story: the pipeline's settings, what the Vertex emulator does, and how it ends."""

    name: str
    story: str
    expected_status: str
    recovery: Mapping[str, Any]
    vertex_schedule: Mapping[str, Any] = field(default_factory=dict)  # docs/vertex-emulator.md
    trainer_env: Mapping[str, str] = field(default_factory=dict)
    deadline: str = "20m"
    regions: tuple[str, ...] = ("us-central1",)
    hardware: Mapping[str, Any] | None = None  # hardware candidates probed before the upload
    command: tuple[str, ...] = ()  # instead of examples/train.py (e.g. examples/unhealthy.py)
    health: Mapping[str, Any] = field(default_factory=dict)  # the pipeline's health: options
    vertex_args: tuple[str, ...] = ()  # extra options of the Vertex emulator
    sweep: Mapping[str, Any] | None = None  # the pipeline's sweep: (docs/sweeps.md)
    model: Mapping[str, Any] | None = None  # the pipeline's model: registration
    pool: Mapping[str, Any] = field(default_factory=dict)  # overrides of the first worker pool


_UNHEALTHY = ("python", "examples/unhealthy.py")
_UNHEALTHY_ENV = {"EXAMPLE_TOTAL_STEPS": "120", "EXAMPLE_STEP_SLEEP": "0.05",
                  "EXAMPLE_CHECKPOINT_EVERY": "10", "EXAMPLE_PROGRESS_INTERVAL": "0.5"}
# The oom story's machines, scaled down to what this computer has (the emulator OOM-kills a
# replica whose resident memory passes its machine's).
_DEMO_MEMORY = '{"n1-standard-4": 200, "n1-highmem-8": 1024}'


_TRAINER_ENV = {"EXAMPLE_TOTAL_STEPS": "600", "EXAMPLE_STEP_SLEEP": "0.03",
                "EXAMPLE_CHECKPOINT_EVERY": "50", "EXAMPLE_PROGRESS_INTERVAL": "1"}

SCENARIOS: Mapping[str, Scenario] = {
    "default": Scenario(
        name="default",
        story="Spot attempt 1 is preempted after writing checkpoints; attempt 2 resumes from the "
              "latest one and is preempted too, and the log sink loses every job-state message "
              "of attempt 2, so only the tick's polling sees that preemption; the run escalates "
              "to standard VMs and succeeds.",
        expected_status="SUCCEEDED",
        recovery={"escalation": "count", "escalate_after_preemptions": 2,
                  "restart_overhead": "5s", "backoff_base": "1s", "stockout_wait": "60s",
                  "decision_interval": "2s"},
        # From RUNNING: a replica first installs its package (the first attempt builds the
        # emulator's environment for it, seconds on a busy machine), then trains and checkpoints.
        vertex_schedule={"preempt": [{"attempt": 1, "after_s": 11.0},
                                     {"attempt": 2, "after_s": 8.0}],
                         # the first preemption is heard from its job-state line, the second
                         # only through polling (timings_ms: preemption_to_relaunch_each)
                         "drop_events": [{"attempt": 2}]},
        trainer_env=_TRAINER_ENV,
    ),
    "stockout": Scenario(
        name="stockout",
        story="Spot has no capacity anywhere: the Spot attempt waits in the queue past the "
              "stockout wait and is cancelled, the next region stocks out too, and the run "
              "moves to standard VMs. While on standard it probes Spot with minimal jobs; when "
              "Spot is back a probe runs, and the run returns to Spot from its checkpoint and "
              "succeeds. The probes are no attempts.",
        expected_status="SUCCEEDED",
        recovery={"escalation": "deadline", "stockout_wait": "6s", "backoff_base": "1s",
                  "max_stockouts": 3, "restart_overhead": "5s", "expected_compute": "40s",
                  "decision_interval": "2s", "spot_cooldown": "10m",
                  "spot_probes": {"enabled": True, "wait": "4s", "billed_estimate": "2s"}},
        # Spot is back 34 s after the emulator starts: after both stockouts, while on standard.
        # The standard attempt trains long enough (about 32 s) for a probe to follow the
        # minimum dwell of the move (one restart overhead) and the run to go back to Spot.
        vertex_schedule={"stockouts": [{"from_s": 0, "for_s": 34}]},
        trainer_env={**_TRAINER_ENV, "EXAMPLE_TOTAL_STEPS": "400", "EXAMPLE_STEP_SLEEP": "0.08"},
        regions=("us-central1", "europe-west4"),
    ),
    "user-error": Scenario(
        name="user-error",
        story="The training code crashes (exit code 1) at step 120 every time: spotorch retries "
              "once, then fails the run with the user-error budget exhausted, and alerts.",
        expected_status="FAILED",
        recovery={"escalation": "never", "max_user_errors": 1, "backoff_base": "1s"},
        trainer_env={**_TRAINER_ENV, "EXAMPLE_FAIL_AT_STEP": "120"},
    ),
    "hardware": Scenario(
        name="hardware",
        story="The run's first step probes four candidate shapes (10 steps of the training "
              "code each, on Spot, in parallel, launched by the functions and followed by the "
              "tick): one runs out of memory, the CPU one is too slow for the deadline, the "
              "A100 costs more; the run trains on the cheapest one expected to meet the "
              "deadline, the L4.",
        expected_status="SUCCEEDED",
        recovery={"escalation": "deadline", "restart_overhead": "5s", "backoff_base": "1s",
                  "decision_interval": "2s", "expected_compute": "40s"},
        trainer_env={**_TRAINER_ENV, "EXAMPLE_TOTAL_STEPS": "100", "EXAMPLE_WORKING_MEMORY_MB": "500",
                     "OPENBLAS_NUM_THREADS": "1"},
        # The emulator runs every shape at this machine's speed; each candidate's step sleep
        # stands in for its speed, and the emulator OOM-kills n1-highcpu-2 past 400 MiB
        # resident (an emulation; 0.5 s steps give its memory watch time to see it).
        # The CPU shape needs about 2 min for the 100 steps, and probing takes some of the
        # deadline first: it misses it, however loaded the machine.
        deadline="2m",
        hardware={"total_steps": 100, "probe_steps": 10, "probe_timeout": "90s",
                  "candidates": [
                      {"name": "small", "machine_type": "n1-highcpu-2",
                       "env": {"EXAMPLE_STEP_SLEEP": 0.5}},
                      {"name": "cpu", "machine_type": "n1-standard-4",
                       "env": {"EXAMPLE_STEP_SLEEP": 1.2}},
                      {"name": "l4", "machine_type": "g2-standard-8",
                       "accelerator_type": "NVIDIA_L4", "accelerator_count": 1,
                       "env": {"EXAMPLE_STEP_SLEEP": 0.15}},
                      {"name": "a100", "machine_type": "a2-highgpu-1g",
                       "accelerator_type": "NVIDIA_TESLA_A100", "accelerator_count": 1,
                       "env": {"EXAMPLE_STEP_SLEEP": 0.1}}]},
        vertex_args=("--memory-limits-mb", json.dumps({"n1-highcpu-2": 400})),
    ),
    "sweep": Scenario(
        name="sweep",
        story="A sweep over four learning rates, four trials at once on Spot: every trial's first "
              "attempt is preempted and resumes from its checkpoint; the median rule stops the "
              "trials that lag; the best trial's model is registered in the Model Registry "
              "(aliases latest and best) and every trial is logged to Vertex AI Experiments.",
        expected_status="SUCCEEDED",
        recovery={"escalation": "never", "backoff_base": "1s", "decision_interval": "2s"},
        # From RUNNING: four replicas share the first install of their package, then train.
        vertex_schedule={"preempt": [{"attempt": 1, "after_s": 9.0}]},
        trainer_env={**_TRAINER_ENV, "EXAMPLE_TOTAL_STEPS": "240", "OPENBLAS_NUM_THREADS": "1",
                     "OMP_NUM_THREADS": "1"},
        sweep={"parameters": [{"name": "lr", "values": [0.3, 0.1, 0.00001, 0.03]}],
               "parallelism": 4, "metric": "loss", "goal": "minimize",
               "early_stopping": {"min_trials": 2, "min_step": 40}},
        model={"serving_image": "us-docker.pkg.dev/vertex-ai/prediction/sklearn-cpu.1-3:latest"},
    ),
    "hang": Scenario(
        name="hang",
        story="Attempt 1's training loop blocks at step 30 while its process lives (a stuck "
              "collective): no more reports, so spotorch declares it hung, cancels it and "
              "relaunches from the latest checkpoint; attempt 2 trains to the end.",
        expected_status="SUCCEEDED",
        recovery={"escalation": "never", "backoff_base": "1s", "decision_interval": "2s"},
        health={"hang_min": "4s", "hang_factor": 4, "hang_startup": "60s"},
        command=_UNHEALTHY,
        trainer_env={**_UNHEALTHY_ENV, "EXAMPLE_MODE": "hang", "EXAMPLE_BAD_ATTEMPTS": "1"},
    ),
    "diverge": Scenario(
        name="diverge",
        story="From step 30 the loss explodes to infinity and NaN (a learning rate too high): "
              "the divergence rule stops the run as FAILED_DIVERGED long before its 120 steps.",
        expected_status="FAILED_DIVERGED",
        recovery={"escalation": "never", "backoff_base": "1s"},
        health={"divergence_action": "fail"},
        command=_UNHEALTHY,
        trainer_env={**_UNHEALTHY_ENV, "EXAMPLE_MODE": "diverge", "EXAMPLE_BAD_ATTEMPTS": "99"},
    ),
    "oom": Scenario(
        name="oom",
        story="The training step needs 400 MiB; on n1-standard-4 (200 MiB on the local stack) "
              "the replica is OOM-killed; spotorch never retries out of memory on the same "
              "machine, moves to the next fallback machine (n1-highmem-8) and succeeds.",
        expected_status="SUCCEEDED",
        recovery={"escalation": "never", "backoff_base": "1s"},
        health={"fallback_machines": ["n1-highmem-8"]},
        command=_UNHEALTHY,
        trainer_env={**_UNHEALTHY_ENV, "EXAMPLE_MODE": "oom", "EXAMPLE_ALLOC_MB": "400",
                     "EXAMPLE_OOM_AT_STEP": "10", "EXAMPLE_BAD_ATTEMPTS": "99"},
        vertex_args=("--memory-limits-mb", _DEMO_MEMORY),
    ),
    "quota": Scenario(
        name="quota",
        story="The project has no Spot L4 GPU quota in us-central1 (as new projects often "
              "have none): Vertex refuses the job there with RESOURCE_EXHAUSTED naming "
              "custom_model_training_preemptible_nvidia_l4_gpus. That is no rate limit: spotorch "
              "does not retry it, marks the region for Spot and launches in europe-west4, "
              "where the run trains and succeeds.",
        expected_status="SUCCEEDED",
        recovery={"escalation": "never", "backoff_base": "1s", "decision_interval": "2s"},
        trainer_env={**_TRAINER_ENV, "EXAMPLE_TOTAL_STEPS": "150"},
        regions=("us-central1", "europe-west4"),
        pool={"machine_type": "g2-standard-8", "accelerator_type": "NVIDIA_L4",
              "accelerator_count": 1},
        vertex_args=("--resource-quotas", json.dumps(
            {"us-central1": {"custom_model_training_preemptible_nvidia_l4_gpus": 0}})),
    ),
}


def pipeline_document(scenario: Scenario) -> dict[str, Any]:
    """The demo pipeline file for a scenario (examples/pipelines/demo.yaml with its recovery)."""
    base = yaml.safe_load((REPO / "examples" / "pipelines" / "demo.yaml").read_text())
    base["recovery"] = {**base.get("recovery", {}), **scenario.recovery}
    base["deadline"] = scenario.deadline
    base["job"]["regions"] = list(scenario.regions)
    pools = base["job"]["worker_pools"]
    env = dict(pools[0].get("env") or {})
    env.update(scenario.trainer_env)
    pools[0]["env"] = env
    package = pools[0].get("python_package")
    if package and package.get("source"):  # the file is written elsewhere: an absolute folder
        package["source"] = str((REPO / "examples" / "pipelines" / package["source"]).resolve())
    if scenario.hardware is not None:
        base["hardware"] = dict(scenario.hardware)
    if scenario.command:  # a command of its own: on an image, not the example package
        pools[0].pop("python_package", None)
        pools[0]["image_uri"] = "python:3.11-slim"
        pools[0]["command"] = list(scenario.command)
    pools[0].update(scenario.pool)
    if scenario.health:
        base["health"] = dict(scenario.health)
    for key, value in (("sweep", scenario.sweep), ("model", scenario.model)):
        if value is not None:
            base[key] = json.loads(json.dumps(value))  # plain lists for YAML
    return dict(base)


def _say(quiet: bool, text: str) -> None:
    if not quiet:
        print(text, file=sys.stderr, flush=True)


def _iso(ts: float | None) -> str | None:
    from spotorch_trainer.contract import rfc3339

    return None if ts is None else rfc3339(ts)


def _find_run(docs: Any) -> Any:
    from spotorch.core.model import Run

    found = [Run.from_dict(d) for d in docs.query("runs", "pipeline", PIPELINE)]
    return min(found, key=lambda r: r.created_at) if found else None


def _follow(docs: Any, timeout_s: float, say: Callable[[str], None]) -> Any:
    """Watch the run the upload triggers until it ends; narrate its history as it grows."""
    deadline = time.monotonic() + timeout_s
    shown = 0
    run = None
    while time.monotonic() < deadline:
        run = _find_run(docs)
        if run is not None:
            for entry in run.history[shown:]:
                say(f"  [{entry.at - run.created_at:6.1f}s] {entry.what}"
                    + (f": {entry.reason}" if entry.reason else ""))
            shown = len(run.history)
            if not run.active:
                return run
        time.sleep(0.5)
    return run


def _follow_sweep(docs: Any, timeout_s: float, say: Callable[[str], None],
                  uploaded_at: float) -> dict[str, Any]:
    """Watch the sweep the upload starts until it ends; report its trials, best and model."""
    from spotorch.app.sweeps import sweep_summary
    from spotorch.core.model import Run
    from spotorch.core.sweeps import Sweep
    from spotorch.settings import COLLECTION_SWEEPS

    deadline = time.monotonic() + timeout_s
    sw = None
    shown = 0
    while time.monotonic() < deadline:
        found = [Sweep.from_dict(d) for d in docs.query(COLLECTION_SWEEPS, "pipeline", PIPELINE)]
        sw = min(found, key=lambda s: s.created_at) if found else None
        if sw is not None:
            for at, what in sw.history[shown:]:
                say(f"  [{at - uploaded_at:6.1f}s] sweep: {what}")
            shown = len(sw.history)
            if not sw.active:
                break
        time.sleep(1.0)
    if sw is None:
        return {"run_id": None, "status": "NO_RUN", "attempts": [], "timings_ms": {},
                "preemptions": 0, "escalated": None, "model_uri": None, "metrics": None}
    summary = sweep_summary(sw)
    trials = []
    for trial in summary["trials"]:
        run_doc, _ = docs.get("runs", trial["trial_run_id"])
        run = Run.from_dict(run_doc) if run_doc else None
        trials.append({**trial, "preemptions": run.counters.preemptions if run else None,
                       "attempts": len(run.attempts) if run else 0,
                       "resumed_from_step": run.attempts[-1].resumed_from_step
                       if run and run.attempts else None})
    return {"run_id": None, "sweep_id": sw.sweep_id, "status": summary["status"],
            "end_reason": summary["end_reason"], "best": summary["best"],
            "model_name": summary["model_name"], "trials": trials, "attempts": [],
            "timings_ms": {"total": round((time.time() - uploaded_at) * 1000)},
            "preemptions": sum(t["preemptions"] or 0 for t in trials), "escalated": None,
            "model_uri": None, "metrics": None, "history": summary["history"]}


def _read_json(uri: str) -> Any:
    from spotorch_trainer.storage import GcsStorage

    try:
        # A client of its own: the process-wide one would outlive this stack's fake GCS.
        return json.loads(GcsStorage().read(uri))
    except Exception:
        return None


@dataclass
class DemoStack:
    """A demo story on its local stack, still up, its run followed to the end (see demo_stack)."""

    scenario: Scenario
    stack: DevStack
    run: Run | None  # the run the upload started, as it ended (None: no run started, or a sweep)
    collected: dict[str, Any]  # the run's report fields and published events (no alerts yet)
    work_dir: Path
    pipeline_file: Path
    lose_job_events: bool
    alerts_so_far: Callable[[], list[dict[str, Any]]]  # what the alert receivers got until now
    final: dict[str, Any] | None = None  # the report, once demo_stack has exited

    def report(self) -> dict[str, Any]:
        """The report run_demo returns: once demo_stack has exited, the final one; while the
        stack is up, one with the alerts delivered so far (the stack's own, until something
        else acts on the stack)."""
        if self.final is not None:
            return self.final
        return self._finish(self.alerts_so_far())

    def _finish(self, alerts: list[dict[str, Any]]) -> dict[str, Any]:
        report = {**self.collected, "alerts": alerts}
        report.update(_costs(self.run, self.pipeline_file))
        report["events"] = [e["type"] for e in report["published"]]
        report["scenario"] = self.scenario.name
        report["job_events_lost"] = self.lose_job_events
        report["tick_s"] = TICK_S
        report["expected_status"] = self.scenario.expected_status
        report["work_dir"] = str(self.work_dir)
        return report


@contextmanager
def demo_stack(scenario: Scenario, *, timeout_s: float, quiet: bool,
               lose_job_events: bool = False) -> Iterator[DemoStack]:
    """Start the receivers and the stack, upload a data snapshot and follow the run to its end;
    yield while the stack is still up (our os.environ pointing at it); on exit stop the stack
    and finish the report (its alerts, costs and events: DemoStack.final).

    lose_job_events: the Vertex emulator drops every job-state message, so only the reconcile
    tick's polling learns what the jobs do (what happens when a log sink loses messages).
    """
    from spotorch.adapters.gcp.firestore import FirestoreDocumentStore
    from spotorch.local.receivers import SmtpReceiver, WebhookReceiver
    from spotorch.local.stack import DevStack

    say: Callable[[str], None] = lambda text: _say(quiet, text)  # noqa: E731
    work = Path(tempfile.mkdtemp(prefix=f"spotorch-demo-{scenario.name}-"))
    pipelines = work / "pipelines"
    pipelines.mkdir()
    (pipelines / "demo.yaml").write_text(yaml.safe_dump(pipeline_document(scenario)))
    schedule = work / "vertex-schedule.json"
    schedule.write_text(json.dumps(dict(scenario.vertex_schedule)))
    say(f"spotorch demo ({scenario.name}): {scenario.story}")
    with WebhookReceiver() as webhook, SmtpReceiver() as smtp:
        alerts_env = {"SPOTORCH_CHAT_WEBHOOK_URL": f"{webhook.url}/chat",
                      "SPOTORCH_SLACK_WEBHOOK_URL": f"{webhook.url}/slack",
                      "SPOTORCH_SMTP_HOST": smtp.host, "SPOTORCH_SMTP_PORT": str(smtp.port),
                      "SPOTORCH_SMTP_FROM": "spotorch@localhost",
                      "SPOTORCH_EMAIL_TO": "ml-team@localhost"}
        say("starting the local stack (Firestore, Pub/Sub, GCS, Vertex AI emulators, functions)")
        with DevStack(pipelines_dir=pipelines, run_dir=work / "stack", extra_env=alerts_env,
                      vertex_schedule=schedule, vertex_grace_s=3.0, tick_seconds=TICK_S,
                      vertex_args=[*scenario.vertex_args,
                                   *(["--drop-events", "1.0"] if lose_job_events else [])]
                      ) as stack:
            saved = dict(os.environ)
            os.environ.update(stack.env)  # our own clients talk to this stack
            try:
                stack.create_buckets([LANDING, CHECKPOINTS, MODELS])
                docs = FirestoreDocumentStore(project=stack.project)
                collected = _upload_and_follow(stack, docs, timeout_s, say, pipelines / "demo.yaml",
                                               sweep=scenario.sweep is not None)
                time.sleep(2.0)  # let the notifier deliver the last alerts
                collected["published"] = _published(stack)
                run = collected.pop("run", None)  # not JSON: the report carries its fields
                demo = DemoStack(scenario=scenario, stack=stack, run=run, collected=collected,
                                 work_dir=work, pipeline_file=pipelines / "demo.yaml",
                                 lose_job_events=lose_job_events,
                                 alerts_so_far=lambda: _alerts(webhook, smtp))
                yield demo
            finally:
                os.environ.clear()
                os.environ.update(saved)
        demo.final = demo._finish(_alerts(webhook, smtp))


def run_demo(scenario: Scenario, *, timeout_s: float, quiet: bool,
             lose_job_events: bool = False) -> dict[str, Any]:
    """Start the stack, upload a data snapshot, follow the run, collect the report, stop the stack.

    lose_job_events: the Vertex emulator drops every job-state message, so only the reconcile
    tick's polling learns what the jobs do (what happens when a log sink loses messages).
    """
    with demo_stack(scenario, timeout_s=timeout_s, quiet=quiet,
                    lose_job_events=lose_job_events) as demo:
        pass
    return demo.report()


def _upload_and_follow(stack: Any, docs: Any, timeout_s: float, say: Callable[[str], None],
                       pipeline_file: Path | None = None, *,
                       sweep: bool = False) -> dict[str, Any]:
    sys.path.insert(0, str(REPO / "examples"))
    from make_data import make_dataset, to_csv

    x, y = make_dataset(rows=3000, features=16, classes=3, seed=0)
    snapshot = f"{DATA_PREFIX}snapshot-{int(time.time())}/"
    uploaded_at = time.time()
    for i, rows in enumerate(range(0, len(y), 1000)):
        stack.upload(LANDING, f"{snapshot}part-{i:05d}.csv", to_csv(x[rows:rows + 1000],
                                                                   y[rows:rows + 1000]))
    stack.upload(LANDING, f"{snapshot}_SUCCESS", b"")
    say(f"uploaded 3 CSV shards and _SUCCESS to gs://{LANDING}/{snapshot}")
    if sweep:
        return _follow_sweep(docs, timeout_s, say, uploaded_at)
    run = _follow(docs, timeout_s, say)
    if run is None:
        return {"run_id": None, "status": "NO_RUN", "attempts": [], "timings_ms": {},
                "preemptions": 0, "escalated": None, "model_uri": None, "metrics": None}
    return _report(run, uploaded_at, lambda name: _job_code(stack, name))


def _job_code(stack: Any, job_name: str | None) -> dict[str, Any] | None:
    """What Vertex ran for a job, as GetCustomJob answers: the package URIs, the executor image
    and the module of a python_package_spec, or the image and command of a container_spec."""
    if not job_name:
        return None  # never created (e.g. refused for quota)
    from google.cloud.aiplatform_v1 import JobServiceClient
    from google.cloud.aiplatform_v1.services.job_service.transports.grpc import (
        JobServiceGrpcTransport,
    )

    from spotorch import settings as S
    from spotorch.adapters.gcp.vertex_calls import emulator_channel

    client = JobServiceClient(transport=JobServiceGrpcTransport(channel=emulator_channel(
        stack.env[S.ENV_VERTEX_ENDPOINT], stack.env.get(S.ENV_VERTEX_TOKEN))))
    pool = client.get_custom_job(name=job_name).job_spec.worker_pool_specs[0]
    package = pool.python_package_spec
    if package.python_module:
        return {"package_uris": list(package.package_uris),
                "executor_image_uri": package.executor_image_uri,
                "python_module": package.python_module}
    return {"image_uri": pool.container_spec.image_uri,
            "command": list(pool.container_spec.command)}


def _report(run: Any, uploaded_at: float,
            code_of: Callable[[str | None], dict[str, Any] | None] = lambda name: None
            ) -> dict[str, Any]:
    from spotorch.app.runs import run_summary

    summary = run_summary(run)
    for a in summary["attempts"]:
        for key in ("created_at", "started_at", "ended_at"):
            a[key] = _iso(a[key])
        a["code"] = code_of(a.get("job_name"))
    first = run.attempts[0] if run.attempts else None
    timings: dict[str, float | list[int] | None] = {
        "upload_to_launch": None if first is None else round((first.created_at - uploaded_at) * 1000),
        "total": round(((run.updated_at or time.time()) - uploaded_at) * 1000),
    }
    relaunch = [(b.created_at - a.ended_at) * 1000 for a, b in zip(run.attempts, run.attempts[1:],
                                                                 strict=False)
                if a.failure is not None and str(a.failure) == "preempted" and a.ended_at]
    timings["preemption_to_relaunch"] = round(max(relaunch)) if relaunch else None
    timings["preemption_to_relaunch_each"] = [round(t) for t in relaunch]
    metrics = _read_json(f"{run.output_uri}/metrics.json") if run.status == "SUCCEEDED" else None
    return {
        "run": run,  # taken out again once the cost is added (it is not JSON)
        "run_id": run.run_id, "status": str(run.status), "end_reason": run.end_reason,
        "attempts": summary["attempts"], "timings_ms": timings,
        "preemptions": run.counters.preemptions, "escalated": summary["escalated"],
        "model_uri": f"{run.output_uri}/model.npz" if metrics is not None else None,
        "metrics": metrics, "history": summary["history"],
        "hardware": dict(run.hardware) if run.hardware else None,
        "probes": summary["probes"], "counters": {"probes": run.counters.probes,
                                                   "stockouts": run.counters.stockouts},
    }


def _costs(run: Any, pipeline_file: Path) -> dict[str, Any]:
    """The run's cost ledger: what it cost, and what it saved against standard VMs."""
    from spotorch.core.cost import ledger, ledger_dict
    from spotorch.spec.loader import load_pipeline

    if run is None:
        return {"cost": None, "savings": None}
    book = ledger(run, load_pipeline(pipeline_file), run.updated_at or time.time())
    return {"cost": ledger_dict(book),
            "savings": {"amount": None if book.savings is None else round(book.savings, 4),
                        "pct": book.savings_pct}}


def _published(stack: Any) -> list[dict[str, Any]]:
    from spotorch.core.events import from_pubsub

    events = [from_pubsub(m) for m in stack.pull_published(max_messages=500)]
    unique = {e["id"]: e for e in events}  # at-least-once: dedupe by the stable id
    return sorted(unique.values(), key=lambda e: (e["data"]["run_id"],
                                                  int(str(e["id"]).rsplit(":", 1)[1])))


def _alerts(webhook: Any, smtp: Any) -> list[dict[str, Any]]:
    alerts = []
    for req in webhook.received:
        channel = "chat" if "/chat" in req.path else "slack"
        alerts.append({"channel": channel, "event_type": _event_type_of(req.body)})
    for msg in smtp.messages:
        alerts.append({"channel": "email", "event_type": msg.get("X-Spotorch-Event-Type", "")})
    return alerts


def _event_type_of(body: bytes) -> str:
    try:
        text = body.decode()
    except UnicodeDecodeError:
        return ""
    for token in text.replace('"', " ").split():
        if token.startswith("dev.spotorch."):
            return token.strip(",.:;")
    return ""


def _human(report: Mapping[str, Any]) -> str:
    lines = [f"run {report['run_id']}: {report['status']}"
             + (f" ({report['end_reason']})" if report.get("end_reason") else "")]
    for a in report["attempts"]:
        resumed = f", resumed from step {a['resumed_from_step']}" if a["resumed_from_step"] \
            is not None else ", fresh start"
        lines.append(f"  attempt {a['attempt']} on {a['capacity']}: {a['state']}"
                     f" ({a['end_reason']}){resumed}, reached step {a['progress_reached'] or '-'}")
    if report.get("escalated"):
        lines.append(f"  escalated to {report['escalated']['to']}: {report['escalated']['reason']}")
    if report.get("metrics"):
        scores = {k: round(v, 4) for k, v in report["metrics"].items()
                  if isinstance(v, float) and k.startswith("test_")}
        lines.append(f"  model {report['model_uri']}: {json.dumps(scores)}")
    lines.append(f"  {len(report['published'])} events published, "
                 f"{len(report['alerts'])} alerts delivered")
    lines.append(f"  timings (ms): {json.dumps(report['timings_ms'])}")
    if report.get("cost"):
        lines.append(f"  cost: {report['cost']['summary']}")
    verdict = "as expected" if report["status"] == report["expected_status"] else \
        f"UNEXPECTED (expected {report['expected_status']})"
    lines.append(f"demo ended {verdict}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="spotorch demo", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scenario", choices=sorted(SCENARIOS), default="default")
    parser.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    parser.add_argument("--timeout", type=float, default=240.0, help="seconds to wait for the run")
    parser.add_argument("--lose-job-events", action="store_true",
                        help="drop every job-state message: only the tick's polling sees the jobs")
    args = parser.parse_args(argv)
    scenario = SCENARIOS[args.scenario]
    report = run_demo(scenario, timeout_s=args.timeout, quiet=False,
                      lose_job_events=args.lose_job_events)
    if args.json:
        print(json.dumps(report, default=str))
    else:
        print(_human(report))
    return 0 if report["status"] == scenario.expected_status else 1


if __name__ == "__main__":
    sys.exit(main())
