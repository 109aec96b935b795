"""Issue 39: a failed side effect is on the run's record at its first failure, with the service's
error; a refusal for good (404, 403, 400) ends the run with its cause after a short bounded
retry; a transient failure keeps the tick's retry, visibly."""

from __future__ import annotations

from typing import Any

import pytest

from fakes import fake_deps
from spotorch.app import intent_failures
from spotorch.app.intent_failures import answer, permanent_status
from spotorch.app.runs import start_run
from spotorch.core import preprocess as pp
from spotorch.core.context import Context
from spotorch.core.decide import decide, new_run
from spotorch.core.intents import (
    PREPROCESS_LAUNCH,
    LaunchIntent,
    PreprocessIntent,
    PublishIntent,
)
from spotorch.core.model import RunStatus
from spotorch.core.observations import (
    IntentDeferred,
    LaunchFailed,
    PreprocessObserved,
)
from spotorch.core.pipeline import Capacity, Pipeline, Trigger

T0 = 1_800_000_000.0


class Refused(Exception):
    """Like google.api_core's NotFound / PermissionDenied / InvalidArgument: an HTTP code."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


@pytest.fixture(autouse=True)
def quick(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(intent_failures, "PERMANENT_PAUSES_S", (0.0, 0.0))


def test_only_404_403_and_400_are_refusals_for_good() -> None:
    assert [permanent_status(Refused("x", c)) for c in (404, 403, 400)] == [404, 403, 400]
    assert permanent_status(Refused("x", 503)) is None and permanent_status(ValueError()) is None
    assert permanent_status(Refused("x", True)) is None


def test_a_refusal_is_tried_again_twice_and_a_transient_failure_not_at_once() -> None:
    gone = Refused("404 POST https://storage.googleapis.com/upload/b/gone/o", 404)
    assert [intent_failures.retry_after(gone, n) for n in (1, 2, 3)] == [0.0, 0.0, None]
    assert intent_failures.retry_after(Refused("503 backend", 503), 1) is None  # the tick's
    assert intent_failures.retry_after(ValueError("bad"), 1) is None


def test_answers_name_the_service_error() -> None:
    gone = Refused("404 POST https://storage.googleapis.com/upload/b/spotorch-preprocess/o", 404)
    launch = answer(LaunchIntent("i1", 1, Capacity.SPOT, "us-central1"), gone)
    assert isinstance(launch, LaunchFailed) and launch.permanent and "404" in launch.message
    step = answer(PreprocessIntent("i2", PREPROCESS_LAUNCH, "job-1"), gone)
    assert isinstance(step, PreprocessObserved) and step.job is not None
    assert step.job.refused and step.job.state == pp.JOB_STATE_FAILED
    assert "spotorch-preprocess" in step.job.error and "HTTP 404" in step.job.error
    publish = answer(PublishIntent("i3", {}), gone)  # a run's progress does not wait on it
    assert isinstance(publish, IntentDeferred) and "404" in publish.reason
    transient = answer(LaunchIntent("i4", 1, Capacity.SPOT, "us-central1"), Refused("x", 503))
    assert isinstance(transient, IntentDeferred)


def pipeline() -> Pipeline:
    return Pipeline(name="p", trigger=Trigger(bucket="b"), checkpoint_uri="gs://c/p",
                    output_uri="gs://m/p")


def test_a_deferred_intent_is_on_the_history_once_per_error() -> None:
    p = pipeline()
    run = new_run(run_id="r1", pipeline=p, now=T0, data_uri="gs://b/d/", snapshot_id="s")
    publish = next(i for i in run.outbox if isinstance(i, PublishIntent))
    failed = IntentDeferred(publish.id, "NotFound: 404 topic spotorch-events not found")
    for n in range(3):
        run = decide(run, failed, Context(p, T0 + n))
    lines = [h for h in run.history if h.what == "publish failed, will retry"]
    assert len(lines) == 1 and "404 topic" in lines[0].reason
    run = decide(run, IntentDeferred(publish.id, "ServiceUnavailable: 503"), Context(p, T0 + 5))
    assert len([h for h in run.history if h.what == "publish failed, will retry"]) == 2


def test_a_launch_refused_for_good_ends_the_run_with_its_cause() -> None:
    p = pipeline()
    deps = fake_deps(p)
    calls: list[int] = []

    def refuse(_spec: Any) -> str:
        calls.append(1)
        raise Refused("403 Permission 'aiplatform.customJobs.create' denied", 403)

    deps.launcher.launch = refuse  # type: ignore[method-assign,assignment]
    run = start_run(deps, "p", run_id="r1", data_uri="gs://b/d/", snapshot_id="s",
                    reason="test")
    assert run is not None
    stored, _ = deps.runs.load("r1")
    assert stored is not None and stored.status is RunStatus.FAILED_LAUNCH
    assert "403" in (stored.end_reason or "") and len(calls) == 3
