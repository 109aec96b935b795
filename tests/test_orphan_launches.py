"""Issue 39: after a function is killed mid-launch, the tick adopted the job it had created only
once the 120 s claim ran out. The job's existence is what it can safely know: a claim 30 s old
whose job exists is adopted at once; one whose job does not exist still waits for the claim."""

from __future__ import annotations

from spotorch.app.deps import job_id_of
from spotorch.app.launch_specs import launch_spec
from spotorch.app.orphan_launches import ADOPT_AFTER_S
from spotorch.app.tick import tick
from spotorch.core.decide import new_run
from spotorch.core.intents import LaunchIntent
from spotorch.settings import COLLECTION_JOBS
from test_service import fakes, make_deps


def test_a_job_created_by_a_killed_launch_is_adopted_before_the_claim_ends() -> None:
    deps = make_deps()
    launcher, _, clock = fakes(deps)
    run = new_run(run_id="r1", pipeline=deps.pipelines["p"], now=clock.now(), data_uri="d",
                  snapshot_id=None)
    deps.runs.save(run, None)
    intent = run.outbox[-1]
    assert isinstance(intent, LaunchIntent)
    launcher.launch(launch_spec(deps, run, intent))  # created, then the function was killed
    clock.advance(ADOPT_AFTER_S - 5)
    tick(deps)
    assert deps.runs.load("r1")[0].attempts[0].job_name is None  # type: ignore[union-attr]
    clock.advance(10)  # 35 s: the claim holds for 85 s more
    tick(deps)
    after, _ = deps.runs.load("r1")
    job = launcher.job_of("r1", 1)
    assert after is not None and after.attempts[0].job_name == job
    assert not any(isinstance(i, LaunchIntent) for i in after.outbox)
    assert launcher.created == 1  # adopted, never created twice
    record, _ = deps.docs.get(COLLECTION_JOBS, job_id_of(job))  # job events find their run
    assert record is not None and record["run_id"] == "r1"


def test_a_launch_killed_before_its_create_still_waits_for_the_claim() -> None:
    deps = make_deps()
    launcher, _, clock = fakes(deps)
    run = new_run(run_id="r1", pipeline=deps.pipelines["p"], now=clock.now(), data_uri="d",
                  snapshot_id=None)
    deps.runs.save(run, None)
    clock.advance(ADOPT_AFTER_S + 30)
    tick(deps)  # no job: its executor may still be creating it
    assert launcher.created == 0
