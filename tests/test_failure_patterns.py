"""A pipeline's own failure patterns decide in production wiring (issue 36).

The Vertex adapter reports what Vertex said of a job (state, error code and message, exit code,
whether it ran); spotorch.core.recovery classifies it with the run's pipeline's
`recovery.preemption_patterns`, `infra_patterns`, `timeout_patterns` and `health.oom_patterns`.
Here each pipeline's patterns turn the Vertex emulator's own messages (a Spot preemption, a
scheduling timeout, a non-zero exit) into a class the defaults would not give, through
`wiring.production_deps` (Firestore emulator, the real aiplatform_v1 client on the Vertex
emulator) and the reconcile tick.
"""

from __future__ import annotations

import contextlib
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from spotorch.core.model import FailureClass
from spotorch.core.pipeline import RecoveryPolicy
from spotorch.core.recovery import classify
from spotorch.entrypoints import wiring
from spotorch.settings import TOPIC_EVENTS, TOPIC_TRAINER_EVENTS, Settings

pytestmark = pytest.mark.emulator

SLEEP = f"[{sys.executable}, -c, 'import time; time.sleep(60)']"
EXIT_3 = f"[{sys.executable}, -c, 'import time, sys; time.sleep(0.3); sys.exit(3)']"

# name -> (command, timeout, recovery and health YAML, the class the pipeline's patterns give,
#          the class the default patterns would give the same message)
CASES: dict[str, tuple[str, str, str, FailureClass, FailureClass]] = {
    # a Spot preemption (code 8, "STOCKOUT: ... preempted by Compute Engine") read as a timeout
    "as-timeout": (SLEEP, "1h", "recovery: {timeout_patterns: ['(?i)stockout']}",
                   FailureClass.TIMEOUT, FailureClass.PREEMPTED),
    # the same preemption read as an infrastructure error; no preemption pattern matches it
    "as-infra": (SLEEP, "1h", "recovery: {preemption_patterns: ['(?i)never said'], "
                 "infra_patterns: ['(?i)compute engine']}",
                 FailureClass.INFRA, FailureClass.PREEMPTED),
    # a scheduling timeout (code 4) read as a preemption (the job had run)
    "as-preempted": (SLEEP, "2s", "recovery: {timeout_patterns: ['(?i)never said'], "
                     "preemption_patterns: ['(?i)scheduling timeout']}",
                     FailureClass.PREEMPTED, FailureClass.TIMEOUT),
    # a non-zero exit read as out of memory
    "as-oom": (EXIT_3, "1h", "health: {oom_patterns: ['(?i)non-zero status of 3[.]']}",
               FailureClass.OUT_OF_MEMORY, FailureClass.USER_ERROR),
}


def _yaml(name: str, command: str, timeout: str, policy: str) -> str:
    return f"""version: 1
name: {name}
trigger: {{bucket: landing, prefix: {name}/}}
job:
  regions: [us-central1]
  timeout: {timeout}
  worker_pools:
    - machine_type: n1-standard-4
      image_uri: local
      command: {command}
checkpoint_uri: gs://checkpoints/{name}
output_uri: gs://models/{name}
{policy}
"""


def test_each_pipelines_own_patterns_classify_its_failures_in_production_wiring(
        firestore_emulator: Any, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    from google.cloud import pubsub_v1

    from spotorch.app.runs import start_run
    from spotorch.app.tick import reconcile
    from spotorch.local._vertex_quota import QuotaLimits
    from spotorch.local._vertex_schedule import PreemptRule, SpotSchedule
    from spotorch.local.vertex_emulator import VertexEmulator
    from spotorch.spec.compiled import write_compiled
    from spotorch.spec.loader import load_pipelines

    project = firestore_emulator.project
    folder = tmp_path / "pipelines"
    folder.mkdir()
    for name, (command, timeout, policy, _, _) in CASES.items():
        (folder / f"{name}.yaml").write_text(_yaml(name, command, timeout, policy))
    write_compiled(load_pipelines(folder), folder)  # what deploy ships: pipelines.json
    publisher = pubsub_v1.PublisherClient()
    for topic in (TOPIC_EVENTS, TOPIC_TRAINER_EVENTS):
        with contextlib.suppress(Exception):  # created by an earlier test of the session
            publisher.create_topic(name=publisher.topic_path(project, topic))
    schedule = SpotSchedule(rules=(PreemptRule(after_s=1.0, pipeline="as-timeout"),
                                   PreemptRule(after_s=1.0, pipeline="as-infra")))
    vertex = VertexEmulator(project, workdir=tmp_path / "vertex", grace_s=0.3, queued_s=0.05,
                            pending_s=0.05, tick_s=0.05, job_events_topic=None,
                            schedule=schedule, quotas=QuotaLimits.unlimited())
    address = vertex.start()
    request.addfinalizer(vertex.stop)
    deps = wiring.production_deps(Settings(project=project, pipelines=str(folder),
                                           vertex_endpoint=address))
    assert {n: deps.pipelines[n].recovery != RecoveryPolicy() or n == "as-oom"
            for n in CASES} == dict.fromkeys(CASES, True)
    runs = {}
    for name in CASES:
        run_id = f"{name}-{uuid.uuid4().hex[:6]}"
        started = start_run(deps, name, run_id=run_id, data_uri=f"gs://landing/{name}/a",
                            snapshot_id=f"{name}/a", reason="test")
        assert started is not None and started.attempts, name
        runs[name] = run_id

    def first_attempts() -> dict[str, Any]:
        found = {}
        for name, run_id in runs.items():
            run, _ = deps.runs.load(run_id)
            assert run is not None
            found[name] = run.attempts[0]
        return found

    deadline = time.monotonic() + 60
    while any(a.failure is None for a in first_attempts().values()):
        assert time.monotonic() < deadline, {n: a.state for n, a in first_attempts().items()}
        reconcile(deps)  # the tick: Vertex's own answer ends each attempt
        time.sleep(0.3)
    ended = first_attempts()
    assert {n: a.failure for n, a in ended.items()} == {n: c[3] for n, c in CASES.items()}
    # ...and the defaults would have read each of those messages otherwise
    for name, attempt in ended.items():
        said = deps.launcher.get(str(attempt.job_name))
        assert said.failure is None  # the adapter classifies nothing
        assert classify(said) is CASES[name][4], (name, said.message)
