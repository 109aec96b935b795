"""Issue 39 on the local stack: a preprocess step whose output bucket does not exist ends its run
within a minute with the 404 named (in its end reason, history and alert), instead of retrying
every tick until the step's timeout blames something else."""

from __future__ import annotations

import time
from typing import Any

import pytest

from spotorch.local import demo as demo_module
from spotorch.local.demo import demo_stack
from spotorch.local.demo_preprocess import ERROR_SETTINGS, PREPROCESS_BUCKET, document
from spotorch.local.demo_scenarios import Scenario

pytestmark = [pytest.mark.emulator, pytest.mark.slow]


def _bucket_gone_then_data(stack: Any, docs: Any, say: Any) -> None:
    """The preprocess bucket deleted after `dev up` made it, then the usual snapshot lands."""
    stack._gcs.client().bucket(PREPROCESS_BUCKET).delete(force=True)
    stack._gcs.buckets.discard(PREPROCESS_BUCKET)
    demo_module._upload_csv(stack, say)


def test_a_preprocess_step_into_a_missing_bucket_ends_its_run_with_the_404() -> None:
    story = Scenario(**{**ERROR_SETTINGS, "name": "preprocess-missing-bucket",
                        "title": "the preprocess output bucket does not exist",
                        "setup": "The preprocess step's output bucket is deleted before data "
                                 "lands.",
                        "document": document, "extend": None, "buckets": (),
                        "arrival": _bucket_gone_then_data})
    started = time.monotonic()
    with demo_stack(story, timeout_s=120.0, quiet=True) as demo:
        run = demo.run
        alerts = demo.alerts_so_far()
        published = demo.collected["published"]
    assert run is not None and str(run.status) == "FAILED_LAUNCH", (run and run.history)
    took = (run.updated_at or 0.0) - run.created_at
    assert took < 60.0, took
    assert "404" in (run.end_reason or "") and PREPROCESS_BUCKET in (run.end_reason or ""), \
        run.end_reason
    assert any("404" in (h.reason or "") for h in run.history), run.history
    # The alert is made from run.failed, whose reason names the 404.
    assert any(".run.failed." in a["event_type"] for a in alerts), alerts
    failed = [e for e in published if ".run.failed." in str(e["type"])]
    assert failed and "404" in failed[-1]["data"]["reason"], failed
    assert time.monotonic() - started < 180.0
