"""The demo's stories: each one's pipeline settings and what the local stack is made to do."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from spotorch.local.demo_bigquery import SETTINGS as BIGQUERY
from spotorch.local.demo_distributed import SETTINGS as DISTRIBUTED
from spotorch.local.demo_flapping import SETTINGS as FLAPPING
from spotorch.local.demo_preprocess import ERROR_SETTINGS as PREPROCESS_ERROR
from spotorch.local.demo_preprocess import SETTINGS as PREPROCESS
from spotorch.local.demo_preprocess_spark import ERROR_SETTINGS as PREPROCESS_SPARK_ERROR
from spotorch.local.demo_preprocess_spark import SETTINGS as PREPROCESS_SPARK
from spotorch.local.demo_promote import SETTINGS as PROMOTE
from spotorch.local.demo_tradeoff import SETTINGS as TRADEOFF

REPO = Path(__file__).resolve().parents[3]  # shared/spotorch/local/demo_scenarios.py -> the repo


@dataclass(frozen=True)
class Scenario:
    """One demo story: the pipeline's settings, what the Vertex emulator does, how it should end.

    What spotorch then does is told from the run's own history (spotorch.local.demo_narration),
    never from here: the setup says only what the stack is made to do."""

    name: str
    title: str  # a few words, for `spotorch demo --help`
    setup: str  # what the stack is made to do, and nothing of what spotorch then does
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
    # A story's own edits of the pipeline document, and additions to its report (made while the
    # stack is up: report, the run, the stack); e.g. demo_distributed.py
    document: Callable[[dict[str, Any]], dict[str, Any]] | None = None
    extend: Callable[[dict[str, Any], Any, Any], None] | None = None
    dataflow: bool = False  # the stack runs the local Dataflow (a preprocess step, issue 31)
    dataproc: bool = False  # the stack runs the local Dataproc (a Spark step, issue 42)
    buckets: tuple[str, ...] = ()  # more buckets created before the upload
    # A story's own data arrival instead of the CSV upload (stack, docs, say); e.g. rows into a
    # BigQuery table (demo_bigquery.py)
    arrival: Callable[[Any, Any, Callable[[str], None]], None] | None = None


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
        title="preempted twice, escalated to standard",
        setup="Spot preempts attempt 1 after 11 s of running and attempt 2 after 8 s; every "
              "job-state message of attempt 2 is lost, so only the tick's polling can see its "
              "job; the pipeline escalates to standard VMs after 2 preemptions.",
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
        title="no Spot anywhere, then Spot is back",
        setup="Spot has no capacity in either region (us-central1, europe-west4) for the first 34 "
              "s after the Vertex emulator starts; the stockout wait is 6 s, and a run on "
              "standard VMs probes Spot (a probe waits 4 s).",
        expected_status="SUCCEEDED",
        recovery={"escalation": "deadline", "stockout_wait": "6s", "backoff_base": "1s",
                  "max_stockouts": 3, "restart_overhead": "5s", "expected_compute": "40s",
                  "decision_interval": "2s", "spot_cooldown": "10m",
                  "spot_probes": {"enabled": True, "wait": "4s", "billed_estimate": "2s"}},
        # Spot is back 34 s after the emulator starts: after both stockouts, while on standard.
        vertex_schedule={"stockouts": [{"from_s": 0, "for_s": 34}]},
        # The standard attempt trains long enough (about 32 s) for a probe to follow the
        # minimum dwell of the move (one restart overhead) and the run to go back to Spot.
        trainer_env={**_TRAINER_ENV, "EXAMPLE_TOTAL_STEPS": "400", "EXAMPLE_STEP_SLEEP": "0.08"},
        regions=("us-central1", "europe-west4"),
    ),
    "user-error": Scenario(
        name="user-error",
        title="the training code crashes every time",
        setup="The training code raises an exception at step 120 on every attempt (exit code 1); "
              "the pipeline allows 1 user error.",
        expected_status="FAILED",
        recovery={"escalation": "never", "max_user_errors": 1, "backoff_base": "1s"},
        trainer_env={**_TRAINER_ENV, "EXAMPLE_FAIL_AT_STEP": "120"},
    ),
    "hardware": Scenario(
        name="hardware",
        title="four candidate shapes probed before the run",
        setup="The pipeline lists four candidate shapes, each probed for 10 steps before the "
              "first attempt; on this machine each runs at the speed its step sleep sets (small "
              "0.5 s, cpu 1.2 s, l4 0.15 s, a100 0.1 s a step); n1-highcpu-2 is OOM-killed past "
              "400 MiB and a step needs 500 MiB; the deadline is 2 minutes for 100 steps.",
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
        title="a sweep of four trials, preempted, median-stopped",
        setup="A sweep over four learning rates (0.3, 0.1, 0.00001, 0.03), four trials at once on "
              "Spot; Spot preempts every trial's attempt 1 after 9 s; the median rule may stop "
              "trials from step 40 once 2 have reported; the best trial's model is registered.",
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
        title="a training loop that blocks",
        setup="Attempt 1's training loop blocks at step 30 while its process lives (a stuck "
              "collective); an attempt counts as hung after 4 times its report interval without a "
              "report, and at least 4 s.",
        expected_status="SUCCEEDED",
        recovery={"escalation": "never", "backoff_base": "1s", "decision_interval": "2s"},
        health={"hang_min": "4s", "hang_factor": 4, "hang_startup": "60s"},
        command=_UNHEALTHY,
        trainer_env={**_UNHEALTHY_ENV, "EXAMPLE_MODE": "hang", "EXAMPLE_BAD_ATTEMPTS": "1"},
    ),
    "diverge": Scenario(
        name="diverge",
        title="a loss that explodes",
        setup="From step 30 the loss is infinite, then NaN (a learning rate too high); the "
              "pipeline's divergence action is fail.",
        expected_status="FAILED_DIVERGED",
        recovery={"escalation": "never", "backoff_base": "1s"},
        health={"divergence_action": "fail"},
        command=_UNHEALTHY,
        trainer_env={**_UNHEALTHY_ENV, "EXAMPLE_MODE": "diverge", "EXAMPLE_BAD_ATTEMPTS": "99"},
    ),
    "oom": Scenario(
        name="oom",
        title="out of memory, then a larger machine",
        setup="The training step allocates 400 MiB at step 10; n1-standard-4 has 200 MiB on the "
              "local stack, the fallback machine n1-highmem-8 1024 MiB.",
        expected_status="SUCCEEDED",
        recovery={"escalation": "never", "backoff_base": "1s"},
        health={"fallback_machines": ["n1-highmem-8"]},
        command=_UNHEALTHY,
        trainer_env={**_UNHEALTHY_ENV, "EXAMPLE_MODE": "oom", "EXAMPLE_ALLOC_MB": "400",
                     "EXAMPLE_OOM_AT_STEP": "10", "EXAMPLE_BAD_ATTEMPTS": "99"},
        vertex_args=("--memory-limits-mb", _DEMO_MEMORY),
    ),
    "distributed": Scenario(**DISTRIBUTED),
    "preprocess": Scenario(**PREPROCESS),
    "preprocess-error": Scenario(**PREPROCESS_ERROR),
    "flapping": Scenario(**FLAPPING),
    "preprocess-spark": Scenario(**PREPROCESS_SPARK),
    "preprocess-spark-error": Scenario(**PREPROCESS_SPARK_ERROR),
    "bigquery": Scenario(**BIGQUERY),
    "tradeoff": Scenario(**TRADEOFF),
    "promote": Scenario(**PROMOTE),
    "quota": Scenario(
        name="quota",
        title="no Spot GPU quota in the first region",
        setup="The project has no Spot L4 GPU quota in us-central1 (as new projects often have "
              "none): the Vertex emulator refuses the job there with RESOURCE_EXHAUSTED naming "
              "custom_model_training_preemptible_nvidia_l4_gpus; europe-west4 has quota.",
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
    return scenario.document(dict(base)) if scenario.document else dict(base)
