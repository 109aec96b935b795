"""The Spark step's launcher (issue 42), one contract for the in-memory twin and the real adapter:
DataprocStepLauncher (the real google-cloud-dataproc client over gRPC) against the local
Dataproc, which runs each batch's main file with PySpark in local mode."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from spotorch.adapters.gcp.dataproc import DataprocStepLauncher
from spotorch.adapters.memory.batches import InMemoryBatches
from spotorch.core import spark_batches as sb
from spotorch.core.model import FailureClass
from spotorch.core.preprocess import JobView
from spotorch.local.dataproc_emulator import DataprocEmulator, spark_available
from spotorch.local.emulators import EmulatorSet, running
from spotorch.ports.steps import StepLaunch, StepLauncher, StepLaunchError

PROJECT = "spotorch-contract"
REGION = "us-central1"
SLOW_MAIN = "import time\ntime.sleep(60)\n"  # lives long enough to be looked at and cancelled
SPARK_MAIN = """\
import sys
from pyspark.sql import SparkSession

spark = SparkSession.builder.getOrCreate()
total = spark.sparkContext.parallelize(range(100), 2).map(lambda x: x * 2).sum()
print("total", total)
if "fail" in " ".join(sys.argv[1:]):
    spark.createDataFrame([(1,)], ["a"]).select("no_such_column").collect()
spark.stop()
"""

pytestmark = pytest.mark.emulator


@pytest.fixture(scope="module")
def gcs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmulatorSet]:
    with running(PROJECT, tmp_path_factory.mktemp("gcs"), firestore=False, pubsub=False) as s, \
            pytest.MonkeyPatch.context() as env:
        env.setenv("STORAGE_EMULATOR_HOST", f"http://{s.emulators['gcs'].address}")
        from google.cloud import storage

        client = storage.Client.create_anonymous_client()
        bucket = client.create_bucket("spark")
        bucket.blob("slow.py").upload_from_string(SLOW_MAIN)
        bucket.blob("job.py").upload_from_string(SPARK_MAIN)
        yield s


def launch_of(name: str, **kw: Any) -> StepLaunch:
    return StepLaunch(job_name=name, region=REGION, input_uri="gs://land/none/",
                      output_uri=f"gs://out/{name}/", temp_uri="", machine_type="",
                      max_workers=1, python_module="trainer.features", kind="spark", **kw)


@pytest.fixture(params=["memory", "emulator"])
def launcher(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[StepLauncher]:
    if request.param == "memory":
        yield InMemoryBatches(PROJECT)
        return
    request.getfixturevalue("gcs")
    emu = DataprocEmulator(PROJECT, workdir=tmp_path / "dp").start()
    try:
        yield DataprocStepLauncher(PROJECT, driver_uri="gs://spark/slow.py",
                                   endpoint=emu.address)
    finally:
        emu.stop()


def eventually(check: Callable[[], Any], timeout: float = 90.0) -> Any:
    until = time.monotonic() + timeout
    while time.monotonic() < until:
        found = check()
        if found:
            return found
        time.sleep(0.3)
    raise AssertionError("not within the timeout")


def test_a_batch_is_found_by_its_id_and_a_second_create_is_the_first(
        launcher: StepLauncher) -> None:
    assert launcher.get("spotorch-c1-pre1", REGION) is None
    first = launcher.launch(launch_of("spotorch-c1-pre1"))
    assert first.name == "spotorch-c1-pre1"
    assert first.job_id == f"projects/{PROJECT}/locations/{REGION}/batches/spotorch-c1-pre1"
    again = launcher.launch(launch_of("spotorch-c1-pre1"))  # "started before"
    assert again.job_id == first.job_id and again.state in sb.BATCH_LIVE_STATES
    seen = launcher.get("spotorch-c1-pre1", REGION)
    assert seen is not None and seen.state in sb.BATCH_LIVE_STATES
    assert launcher.get("spotorch-c1-pre1", "europe-west4") is None  # regional
    launcher.cancel("spotorch-c1-pre1", REGION)


def test_a_cancelled_batch_ends_cancelled(launcher: StepLauncher) -> None:
    launcher.launch(launch_of("spotorch-c2-pre1"))
    launcher.cancel("spotorch-c2-pre1", REGION)

    def ended() -> JobView | None:
        view = launcher.get("spotorch-c2-pre1", REGION)
        return view if view is not None and view.state in sb.BATCH_TERMINAL_STATES else None

    assert eventually(ended).state == sb.BATCH_CANCELLED
    launcher.cancel("spotorch-c2-pre1", REGION)  # an ended batch: nothing, no error
    launcher.cancel("spotorch-never-launched", REGION)


def test_a_malformed_batch_id_is_refused_for_good(launcher: StepLauncher) -> None:
    with pytest.raises(StepLaunchError) as caught:
        launcher.launch(launch_of("Bad_ID"))
    assert caught.value.permanent


# --- the local Dataproc alone: real PySpark, refusals, quotas --------------------------------


@pytest.fixture
def local(gcs: EmulatorSet, tmp_path: Path) -> Iterator[DataprocEmulator]:
    emu = DataprocEmulator(PROJECT, workdir=tmp_path / "dp", operations_per_minute=8).start()
    try:
        yield emu
    finally:
        emu.stop()


def _ended(adapter: DataprocStepLauncher, name: str) -> JobView:
    def check() -> JobView | None:
        view = adapter.get(name, REGION)
        return view if view is not None and view.state in sb.BATCH_TERMINAL_STATES else None

    found: JobView = eventually(check, timeout=180)
    return found


@pytest.mark.slow
@pytest.mark.skipif(not spark_available(), reason="no Spark environment: make spark-venv")
def test_pyspark_runs_and_a_driver_exception_is_the_batchs_failure(
        local: DataprocEmulator) -> None:
    adapter = DataprocStepLauncher(PROJECT, driver_uri="gs://spark/job.py",
                                   endpoint=local.address)
    adapter.launch(launch_of("spotorch-ok-pre1"))
    ok = _ended(adapter, "spotorch-ok-pre1")
    assert ok.state == sb.BATCH_SUCCEEDED, ok.error
    # the driver and 2 executors of 4 cores, 9600m + 10%, one minute at least
    assert ok.milli_dcu_s >= 60 * 3 * sb.dcus(4, 9600 * 1.1 / 1024) * 1000 - 1
    # the module's arguments come after the main file: --fail makes it raise
    adapter.launch(replace_options(launch_of("spotorch-bad-pre1")))
    bad = _ended(adapter, "spotorch-bad-pre1")
    assert bad.state == sb.BATCH_FAILED, bad.error
    assert "UNRESOLVED_COLUMN" in bad.error or "no_such_column" in bad.error, bad.error
    assert sb.classify_batch(bad.state, bad.error) is FailureClass.USER_ERROR


def replace_options(launch: StepLaunch) -> StepLaunch:
    from dataclasses import replace

    return replace(launch, options=(("fail", "1"),), python_module="x")


def test_the_local_dataproc_refuses_what_dataproc_refuses(local: DataprocEmulator) -> None:
    adapter = DataprocStepLauncher(PROJECT, driver_uri="gs://spark/slow.py",
                                   endpoint=local.address)
    for bad in (launch_of("spotorch-p1-pre1", properties=(("spark.master", "local"),)),
                launch_of("spotorch-p2-pre1", properties=(("hadoop.x", "1"),)),
                launch_of("spotorch-p3-pre1", runtime_version="9.9")):
        with pytest.raises(StepLaunchError) as caught:
            adapter.launch(bad)
        assert caught.value.permanent
    adapter.launch(launch_of("spotorch-live-pre1"))
    running = eventually(lambda: (v := adapter.get("spotorch-live-pre1", REGION)) is not None
                         and v.state == sb.BATCH_RUNNING and v)
    # UsageSnapshot while it runs: the driver and 2 executors of Dataproc's default shape
    assert running.milli_dcu_rate == round(3000 * sb.dcus(4, 9600 * 1.1 / 1024))
    with pytest.raises(Exception, match="cannot be deleted"):
        adapter.delete("spotorch-live-pre1", REGION)
    adapter.cancel("spotorch-live-pre1", REGION)
    _ended(adapter, "spotorch-live-pre1")
    adapter.delete("spotorch-live-pre1", REGION)
    assert adapter.get("spotorch-live-pre1", REGION) is None
    # 8 batch operations a minute in this emulator (refused ones count): then RESOURCE_EXHAUSTED
    with pytest.raises(StepLaunchError) as quota:
        for n in range(6):
            adapter.launch(launch_of(f"spotorch-q{n}-pre1"))
    assert not quota.value.permanent and "Quota exceeded" in str(quota.value)


def test_an_ended_batchs_audit_entry_reaches_the_events_url_as_eventarc_sends_it(
        gcs: EmulatorSet, tmp_path: Path) -> None:
    import json

    from spotorch.entrypoints.batch_entries import batch_hint
    from spotorch.local.receivers import WebhookReceiver

    with WebhookReceiver() as receiver:
        emu = DataprocEmulator(PROJECT, workdir=tmp_path / "dp",
                               events_url=f"{receiver.url}/events").start()
        try:
            adapter = DataprocStepLauncher(PROJECT, driver_uri="gs://spark/slow.py",
                                           endpoint=emu.address)
            adapter.launch(launch_of("spotorch-c9-pre1"))
            assert not receiver.received  # a live batch: nothing yet
            adapter.cancel("spotorch-c9-pre1", REGION)
            (sent,) = eventually(lambda: receiver.ok("/events"))
        finally:
            emu.stop()
    headers = {k.lower(): v for k, v in sent.headers.items()}
    assert headers["ce-type"] == "google.cloud.audit.log.v1.written"
    assert headers["ce-servicename"] == "dataproc.googleapis.com"
    hint = batch_hint(json.loads(sent.body))
    assert hint is not None and hint.job_name == "spotorch-c9-pre1"
    assert hint.job_id == f"projects/{PROJECT}/locations/{REGION}/batches/spotorch-c9-pre1"
