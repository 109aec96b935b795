"""The preprocess step's ports (issue 31), one contract for the in-memory twins and the real
adapters: DataflowStepLauncher against the local Dataflow (the real google-cloud-dataflow-client)
and GcsStepOutputs against fake-gcs-server."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from spotorch.adapters.gcp.dataflow import DataflowStepLauncher, GcsStepOutputs
from spotorch.adapters.memory.steps import InMemoryStepOutputs, InMemorySteps
from spotorch.core import preprocess as pp
from spotorch.local.dataflow_emulator import DataflowEmulator, beam_available
from spotorch.local.emulators import EmulatorSet, running
from spotorch.ports.steps import StepLaunch, StepLauncher, StepOutputs

PROJECT = "spotorch-contract"
LAUNCHER = "gs://templates/launcher.json"
REGION = "us-central1"


@pytest.fixture(scope="module")
def gcs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmulatorSet]:
    # A module's fixture has no monkeypatch: a context of its own sets the variable.
    with running(PROJECT, tmp_path_factory.mktemp("gcs"), firestore=False, pubsub=False) as s, \
            pytest.MonkeyPatch.context() as env:
        env.setenv("STORAGE_EMULATOR_HOST", f"http://{s.emulators['gcs'].address}")
        from google.cloud import storage

        client = storage.Client.create_anonymous_client()
        for name in ("land", "out"):
            client.create_bucket(name)
        yield s


# --- StepLauncher ------------------------------------------------------------------------------


@pytest.fixture(params=["memory", "emulator"])
def launcher(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[StepLauncher]:
    if request.param == "memory":
        yield InMemorySteps()
        return
    if not beam_available():
        pytest.skip("no Beam environment: make beam-venv")
    request.getfixturevalue("gcs")
    emu = DataflowEmulator(PROJECT, workdir=tmp_path / "df", launcher_template=LAUNCHER).start()
    try:
        yield DataflowStepLauncher(PROJECT, launcher_template=LAUNCHER, endpoint=emu.address)
    finally:
        emu.stop()


def launch_of(name: str) -> StepLaunch:
    # A snapshot that does not exist: the job stays live long enough to be looked at, then
    # fails; the contract is about names, states and cancels, not the pipeline's output.
    return StepLaunch(job_name=name, region=REGION, input_uri="gs://land/none/",
                      output_uri=f"gs://out/{name}/", temp_uri=f"gs://out/{name}/_temp/",
                      machine_type="n1-standard-1", max_workers=1,
                      python_module="no_such_module", options=(("num_shards", "1"),))


def eventually(check: Callable[[], Any], timeout: float = 60.0) -> Any:
    until = time.monotonic() + timeout
    while time.monotonic() < until:
        found = check()
        if found:
            return found
        time.sleep(0.3)
    raise AssertionError("not within the timeout")


def test_a_launch_is_found_by_its_name_and_not_repeated(launcher: StepLauncher) -> None:
    assert launcher.get("spotorch-c1-pre1", REGION) is None
    first = launcher.launch(launch_of("spotorch-c1-pre1"))
    assert first.name == "spotorch-c1-pre1" and first.job_id
    again = launcher.launch(launch_of("spotorch-c1-pre1"))
    if first.state in pp.LIVE_STATES and again.state in pp.LIVE_STATES:
        assert again.job_id == first.job_id  # never two live jobs of one name
    seen = launcher.get("spotorch-c1-pre1", REGION)
    assert seen is not None and seen.name == "spotorch-c1-pre1"
    assert launcher.get("spotorch-c1-pre1", "europe-west4") is None  # regional


def test_a_cancelled_job_ends_cancelled(launcher: StepLauncher) -> None:
    launcher.launch(launch_of("spotorch-c2-pre1"))
    launcher.cancel("spotorch-c2-pre1", REGION)

    def ended() -> pp.JobView | None:
        view = launcher.get("spotorch-c2-pre1", REGION)
        return view if view is not None and view.state in pp.TERMINAL_STATES else None

    assert eventually(ended).state in (pp.JOB_STATE_CANCELLED, pp.JOB_STATE_FAILED)
    launcher.cancel("spotorch-c2-pre1", REGION)  # an ended job: nothing, no error
    launcher.cancel("spotorch-never-launched", REGION)


# --- StepOutputs -------------------------------------------------------------------------------

Putter = Callable[[str, dict[str, bytes]], None]


@pytest.fixture(params=["memory", "gcs"])
def outputs(request: pytest.FixtureRequest) -> tuple[StepOutputs, Putter]:
    if request.param == "memory":
        memory = InMemoryStepOutputs()

        def put_memory(folder: str, files: dict[str, bytes]) -> None:
            import base64

            import google_crc32c  # the checksum GCS reports (base64 of the big-endian CRC32C)

            memory.folders[folder] = {
                n: (len(b), base64.b64encode(google_crc32c.value(b).to_bytes(4, "big")).decode())
                for n, b in files.items()}

        return memory, put_memory
    request.getfixturevalue("gcs")
    from google.cloud import storage

    client = storage.Client.create_anonymous_client()

    def put_gcs(folder: str, files: dict[str, bytes]) -> None:
        bucket, _, prefix = folder.removeprefix("gs://").partition("/")
        for name, data in files.items():
            client.bucket(bucket).blob(prefix + name).upload_from_string(data)

    return GcsStepOutputs(client=client), put_gcs


def test_the_same_files_in_two_folders_have_one_digest(
        outputs: tuple[StepOutputs, Putter]) -> None:
    store, put = outputs
    files = {"a.csv": b"f0,label\n1,0\n", "b.csv": b"f0,label\n2,1\n"}
    put("gs://land/s1/", files)
    put("gs://land/s2/", files)
    put("gs://land/s3/", {**files, "b.csv": b"f0,label\n3,1\n"})
    one = store.content_digest("gs://land/s1/")
    assert one is not None and one == store.content_digest("gs://land/s2/")
    assert store.content_digest("gs://land/s3/") not in (None, one)
    assert store.content_digest("gs://land/empty/") is None


def test_a_marker_is_read_back(outputs: tuple[StepOutputs, Putter]) -> None:
    store, _ = outputs
    uri = "gs://out/key1/" + pp.MARKER_NAME
    assert store.read_marker(uri) is None
    store.write_marker(uri, {"cache_key": "key1", "job_name": "spotorch-r-pre1"})
    assert store.read_marker(uri) == {"cache_key": "key1", "job_name": "spotorch-r-pre1"}


def test_a_job_is_read_by_its_id_and_an_unknown_id_falls_back_to_its_name(
        launcher: StepLauncher) -> None:
    first = launcher.launch(launch_of("spotorch-c3-pre1"))
    by_id = launcher.get("spotorch-c3-pre1", REGION, first.job_id)
    assert by_id is not None and by_id.job_id == first.job_id
    stale = launcher.get("spotorch-c3-pre1", REGION, "2000-01-01_00_00_00-404")
    assert stale is not None and stale.job_id == first.job_id
    other = launcher.launch(launch_of("spotorch-c3-pre9"))  # an id of another name: by name
    mixed = launcher.get("spotorch-c3-pre9", REGION, first.job_id)
    assert mixed is not None and mixed.job_id == other.job_id


Versions = Callable[[str, dict[str, bytes]], list[tuple[str, int]]]


@pytest.fixture(params=["memory", "gcs"])
def versioned(request: pytest.FixtureRequest) -> tuple[StepOutputs, Versions]:
    """The outputs port, and a writer of objects returning their (name, generation)."""
    import base64

    import google_crc32c

    if request.param == "memory":
        memory = InMemoryStepOutputs()
        counter = iter(range(1, 10_000))

        def put_memory(folder: str, files: dict[str, bytes]) -> list[tuple[str, int]]:
            prefix = folder.removeprefix("gs://").partition("/")[2]
            out = []
            for name, data in files.items():
                generation = next(counter)
                crc = base64.b64encode(google_crc32c.value(data).to_bytes(4, "big")).decode()
                memory.versions[(prefix + name, generation)] = (len(data), crc)
                memory.folders.setdefault(folder, {})[name] = (len(data), crc)
                out.append((prefix + name, generation))
            return out

        return memory, put_memory
    request.getfixturevalue("gcs")
    from google.cloud import storage

    client = storage.Client.create_anonymous_client()
    if client.lookup_bucket("vland") is None:
        bucket = client.bucket("vland")
        bucket.versioning_enabled = True
        client.create_bucket(bucket)

    def put_gcs(folder: str, files: dict[str, bytes]) -> list[tuple[str, int]]:
        bucket, _, prefix = folder.removeprefix("gs://").partition("/")
        out = []
        for name, data in files.items():
            blob = client.bucket(bucket).blob(prefix + name)
            blob.upload_from_string(data)
            out.append((prefix + name, int(blob.generation)))
        return out

    return GcsStepOutputs(client=client), put_gcs


def test_pinned_generations_keep_their_digest_after_an_overwrite(
        versioned: tuple[StepOutputs, Versions]) -> None:
    store, put = versioned
    files = {"a.csv": b"f0,label\n1,0\n", "b.csv": b"f0,label\n2,1\n"}
    pinned = put("gs://vland/p1/", files)
    before = store.content_digest("gs://vland/p1/", pinned)
    assert before is not None and before == store.content_digest("gs://vland/p1/")
    put("gs://vland/p1/", {"b.csv": b"f0,label\n3,1\n"})  # b.csv overwritten
    assert store.content_digest("gs://vland/p1/", pinned) == before
    assert store.content_digest("gs://vland/p1/") != before  # the live folder changed
    copy = put("gs://vland/p2/", files)  # the same files elsewhere: the same digest
    assert store.content_digest("gs://vland/p2/", copy) == before
    gone = [(pinned[0][0], pinned[0][1] + 10_000_000)]  # a generation that never was
    assert store.content_digest("gs://vland/p1/", gone) is None
