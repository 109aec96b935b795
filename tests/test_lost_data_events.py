"""A snapshot whose object events were all lost still starts its run, exactly once, within one
reconcile period: the tick lists the landing prefix (issue 13, finding 3), on the local stack."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from spotorch.adapters.gcp.firestore import FirestoreDocumentStore
from spotorch.core.model import Run
from spotorch.local import demo
from spotorch.local.stack import DevStack
from spotorch.settings import TOPIC_GCS_NOTIFICATIONS

pytestmark = [pytest.mark.emulator, pytest.mark.slow]
ROOT = Path(__file__).resolve().parent.parent
TICK_S = 2.0


def test_a_snapshot_whose_events_were_lost_starts_one_run_at_the_next_tick(
        tmp_path: Path) -> None:
    from google.cloud import pubsub_v1

    (tmp_path / "pipelines").mkdir()
    # The demo pipeline in another folder: its package source as an absolute path.
    (tmp_path / "pipelines" / "demo.yaml").write_text(
        (ROOT / "examples" / "pipelines" / "demo.yaml").read_text().replace(
            "source: ../trainer", f"source: {ROOT / 'examples' / 'trainer'}"))
    with DevStack(pipelines_dir=tmp_path / "pipelines", run_dir=tmp_path / "stack",
                  tick_seconds=TICK_S) as stack:
        saved = dict(os.environ)
        os.environ.update(stack.env)
        try:
            stack.create_buckets([demo.LANDING, demo.CHECKPOINTS, demo.MODELS])
            # Every object event of the landing bucket is lost from here on: no subscription
            # feeds on_object_finalized any more (a worse loss than 503s and dead letters).
            subscriber = pubsub_v1.SubscriberClient()
            subscription = stack.subscription_path(
                stack.subscription_name(TOPIC_GCS_NOTIFICATIONS, "on_object_finalized"))
            subscriber.delete_subscription(request={"subscription": subscription})
            time.sleep(2 * TICK_S)  # the tick's first listing starts watching the prefix
            snapshot = f"{demo.DATA_PREFIX}lost-events/"
            stack.upload(demo.LANDING, f"{snapshot}part-0.csv", b"a,b,label\n1,2,0\n")
            stack.upload(demo.LANDING, f"{snapshot}_SUCCESS", b"")
            uploaded = time.monotonic()
            docs = FirestoreDocumentStore(project=stack.project)
            runs: list[Run] = []
            while time.monotonic() - uploaded < 60:
                runs = [Run.from_dict(d) for d in docs.query("runs", "pipeline", demo.PIPELINE)]
                if runs:
                    break
                time.sleep(0.5)
            found_after = time.monotonic() - uploaded
            assert len(runs) == 1, "the tick did not start the snapshot's run"
            assert runs[0].data_uri == f"gs://{demo.LANDING}/{snapshot}"
            # The tick's period on the stack is TICK_S; allow the stack's own slowness on 2 cores.
            assert found_after < 10 * TICK_S, found_after
            time.sleep(4 * TICK_S)  # more ticks list the same objects again
            again = [Run.from_dict(d) for d in docs.query("runs", "pipeline", demo.PIPELINE)]
            assert [r.run_id for r in again] == [runs[0].run_id]
        finally:
            os.environ.clear()
            os.environ.update(saved)
