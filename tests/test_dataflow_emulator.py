"""The local Dataflow (issue 31) through the real google-cloud-dataflow-client: spotorch's adapter
launches the example's Beam module on fake-gcs-server data, follows it to JOB_STATE_DONE or a
failure with the transform's error, cancels, refuses a second live job of one name, checks IAM,
and POSTs real-shaped statusChanged events."""

from __future__ import annotations

import json
import re
import tarfile
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from google.api_core.exceptions import GoogleAPICallError

from spotorch.adapters.gcp.dataflow import DataflowStepLauncher, GcsStepOutputs
from spotorch.core import preprocess as pp
from spotorch.core.model import FailureClass
from spotorch.entrypoints.dataflow_events import status_hint
from spotorch.local._vertex_iam import IamPolicy
from spotorch.local.dataflow_emulator import DataflowEmulator, beam_available
from spotorch.local.emulators import EmulatorSet, running
from spotorch.ports.steps import StepLaunch
from spotorch.spec.packages import build_sdist, trainer_sdist

ROOT = Path(__file__).resolve().parent.parent
PROJECT = "spotorch-df"
LAUNCHER = "gs://staging/dataflow/spotorch-launcher.json"
WORKERS = f"spotorch-dataflow@{PROJECT}.iam.gserviceaccount.com"  # fn may act as it alone

pytestmark = pytest.mark.skipif(not beam_available(), reason="no Beam environment: make beam-venv")


@pytest.fixture(scope="module")
def gcs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmulatorSet]:
    # A module's fixture has no monkeypatch: a context of its own sets the variable.
    with running(PROJECT, tmp_path_factory.mktemp("gcs"), firestore=False, pubsub=False) as s, \
            pytest.MonkeyPatch.context() as env:
        env.setenv("STORAGE_EMULATOR_HOST", f"http://{s.emulators['gcs'].address}")
        yield s


def _client() -> Any:
    from google.cloud import storage

    return storage.Client.create_anonymous_client()


@pytest.fixture(scope="module")
def staged(gcs: EmulatorSet) -> dict[str, str]:
    """Buckets, two snapshots (good and broken) and the example package in fake GCS."""
    client = _client()
    for name in ("landing", "staging", "prep"):
        client.create_bucket(name)
    header = ",".join([*(f"f{i}" for i in range(3)), "label"])
    rows = [f"{i}.0,{i * 2}.5,{-i}.25,{i % 2}" for i in range(40)]
    good = [header + "\n" + "\n".join(rows[:20]) + "\n", header + "\n" + "\n".join(rows[20:]) + "\n"]
    for i, text in enumerate(good):
        client.bucket("landing").blob(f"good/part-{i}.csv").upload_from_string(text)
        client.bucket("landing").blob(f"bad/part-{i}.csv").upload_from_string(
            text + ("oops,1,2,0\n" if i == 1 else ""))
    name, data = build_sdist(ROOT / "examples" / "trainer")
    client.bucket("staging").blob(f"packages/{name}").upload_from_string(data)
    helper, helper_data = trainer_sdist()  # staged beside every package (spec.packages)
    client.bucket("staging").blob(f"packages/{helper}").upload_from_string(helper_data)
    return {"package": f"gs://staging/packages/{name}",
            "trainer": f"gs://staging/packages/{helper}"}


class Receiver:
    """What Eventarc would deliver to the function: the statusChanged CloudEvents."""

    def __init__(self) -> None:
        self.events: list[tuple[dict[str, str], dict[str, Any]]] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.events.append(({k.lower(): v for k, v in self.headers.items()}, body))
                self.send_response(204)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/"


@pytest.fixture
def emulator(tmp_path: Path, staged: dict[str, str]) -> Iterator[tuple[DataflowEmulator, Receiver]]:
    receiver = Receiver()
    iam = IamPolicy(tokens={"fn-token": "serviceAccount:fn", "ro-token": "user:ro"},
                    grants={"serviceAccount:fn": ("dataflow.*",),
                            "user:ro": ("dataflow.jobs.get", "dataflow.jobs.list")},
                    act_as={WORKERS: ("serviceAccount:fn",)})
    emu = DataflowEmulator(PROJECT, workdir=tmp_path / "df", launcher_template=LAUNCHER,
                           events_url=receiver.url, iam=iam).start()
    try:
        yield emu, receiver
    finally:
        emu.stop()
        receiver.server.shutdown()


def launcher(emu: DataflowEmulator, token: str = "fn-token") -> DataflowStepLauncher:
    return DataflowStepLauncher(PROJECT, launcher_template=LAUNCHER, endpoint=emu.address,
                                token=token, service_account=WORKERS)


def request(staged: dict[str, str], name: str, snapshot: str) -> StepLaunch:
    return StepLaunch(job_name=name, region="us-central1", input_uri=f"gs://landing/{snapshot}/",
                      output_uri=f"gs://prep/{name}/", temp_uri=f"gs://prep/{name}/_temp/",
                      machine_type="n1-standard-2", max_workers=2,
                      python_module="spotorch_example.preprocess",
                      package_uris=(staged["package"], staged["trainer"]),
                      options=(("num_shards", "2"),))


def wait_ended(steps: DataflowStepLauncher, name: str, timeout: float = 120.0) -> pp.JobView:
    until = time.monotonic() + timeout
    while time.monotonic() < until:
        view = steps.get(name, "us-central1")
        if view is not None and view.state in pp.TERMINAL_STATES:
            return view
        time.sleep(0.5)
    raise AssertionError(f"job {name} did not end in {timeout}s")


def test_a_beam_module_runs_to_done_and_writes_its_output(
        emulator: tuple[DataflowEmulator, Receiver], staged: dict[str, str]) -> None:
    emu, receiver = emulator
    steps = launcher(emu)
    first = steps.launch(request(staged, "spotorch-r1-pre1", "good"))
    assert first.state in pp.LIVE_STATES and first.name == "spotorch-r1-pre1"
    # the same name again while it lives: the live job, not a second one
    assert steps.launch(request(staged, "spotorch-r1-pre1", "good")).job_id == first.job_id
    done = wait_ended(steps, "spotorch-r1-pre1")
    assert done.state == pp.JOB_STATE_DONE and done.vcpu_s > 0 and done.memory_gb_s > 0
    names = sorted(b.name for b in _client().list_blobs("prep", prefix="spotorch-r1-pre1/"))
    assert names == ["spotorch-r1-pre1/part-00000-of-00002.csv",
                     "spotorch-r1-pre1/part-00001-of-00002.csv"]
    text = _client().bucket("prep").blob(names[0]).download_as_text()
    assert text.splitlines()[0] == "f0,f1,f2,label"
    states = [status_hint(body).state for _, body in receiver.events]
    until = time.monotonic() + 10
    while "JOB_STATE_DONE" not in states and time.monotonic() < until:
        time.sleep(0.2)
        states = [status_hint(body).state for _, body in receiver.events]
    assert {"JOB_STATE_QUEUED", "JOB_STATE_RUNNING", "JOB_STATE_DONE"} <= set(states)
    headers, body = receiver.events[-1]
    assert headers["ce-type"] == pp.STATUS_CHANGED_TYPE
    assert headers["ce-source"] == f"//dataflow.googleapis.com/projects/{PROJECT}/locations/us-central1"
    assert body["payload"]["projectId"] == PROJECT


def test_a_failing_transform_fails_the_job_with_its_error(
        emulator: tuple[DataflowEmulator, Receiver], staged: dict[str, str]) -> None:
    emu, _ = emulator
    steps = launcher(emu)
    steps.launch(request(staged, "spotorch-r2-pre1", "bad"))
    failed = wait_ended(steps, "spotorch-r2-pre1")
    assert failed.state == pp.JOB_STATE_FAILED
    assert "could not convert string to float: 'oops'" in failed.error
    assert pp.classify(failed.state, failed.error) is FailureClass.USER_ERROR


def test_cancel_stops_the_job(emulator: tuple[DataflowEmulator, Receiver],
                              staged: dict[str, str]) -> None:
    emu, _ = emulator
    steps = launcher(emu)
    steps.launch(request(staged, "spotorch-r3-pre1", "good"))
    steps.cancel("spotorch-r3-pre1", "us-central1")
    assert wait_ended(steps, "spotorch-r3-pre1").state == pp.JOB_STATE_CANCELLED


def test_iam_refuses_a_caller_without_the_permission(
        emulator: tuple[DataflowEmulator, Receiver], staged: dict[str, str]) -> None:
    from google.auth.exceptions import RefreshError

    from spotorch.ports.steps import StepLaunchError

    emu, _ = emulator
    with pytest.raises(StepLaunchError, match=r"dataflow\.jobs\.create") as refused:
        launcher(emu, "ro-token").launch(request(staged, "spotorch-r4-pre1", "good"))
    assert refused.value.permanent
    # An unknown token is a 401, on which the REST session tries to refresh a token it cannot.
    with pytest.raises(RefreshError):
        launcher(emu, "unknown-token").get("spotorch-r4-pre1", "us-central1")
    assert launcher(emu, "ro-token").get("spotorch-r4-pre1", "us-central1") is None


def test_the_outputs_port_on_fake_gcs(staged: dict[str, str]) -> None:
    outputs = GcsStepOutputs(client=_client())
    digest = outputs.content_digest("gs://landing/good/")
    assert digest is not None and digest != outputs.content_digest("gs://landing/bad/")
    assert outputs.read_marker("gs://prep/k/_SPOTORCH_PREPROCESS.json") is None
    outputs.write_marker("gs://prep/k/_SPOTORCH_PREPROCESS.json", {"cache_key": "k"})
    assert outputs.read_marker("gs://prep/k/_SPOTORCH_PREPROCESS.json") == {"cache_key": "k"}


def test_the_package_holds_the_beam_module() -> None:
    import io

    _, data = build_sdist(ROOT / "examples" / "trainer")

    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        assert any(m.name.endswith("spotorch_example/preprocess.py") for m in tar.getmembers())


# --- no kinder than Dataflow: actAs, labels, the template's parameters -------------------------


def test_a_worker_account_the_caller_may_not_act_as_is_refused(
        emulator: tuple[DataflowEmulator, Receiver], staged: dict[str, str]) -> None:
    from spotorch.ports.steps import StepLaunchError

    emu, _ = emulator
    other = f"someone@{PROJECT}.iam.gserviceaccount.com"
    ask = replace(request(staged, "spotorch-r5-pre1", "good"), service_account=other)
    with pytest.raises(StepLaunchError, match=rf"cannot act as service account {other}") as no:
        launcher(emu).launch(ask)
    cause = no.value.__cause__
    assert no.value.permanent and isinstance(cause, GoogleAPICallError) and cause.code == 403
    # Without a worker account Dataflow uses the Compute Engine default: not granted either.
    bare = DataflowStepLauncher(PROJECT, launcher_template=LAUNCHER, endpoint=emu.address,
                                token="fn-token")
    with pytest.raises(StepLaunchError, match="cannot act as service account"):
        bare.launch(request(staged, "spotorch-r5-pre1", "good"))
    assert launcher(emu).get("spotorch-r5-pre1", "us-central1") is None  # no job was made


@pytest.mark.parametrize(("labels", "named"), [
    ({"Spotorch": "x"}, "user_labels.Spotorch"),
    ({"9lives": "x"}, "user_labels.9lives"),
    ({"k" * 64: "x"}, "user_labels." + "k" * 64),
    ({"spotorch_pipeline": "Churn.Model"}, "user_labels.spotorch_pipeline"),
    ({"spotorch_key": "v" * 64}, "user_labels.spotorch_key"),
    ({f"k{i}": "v" for i in range(65)}, "at most 64 user labels"),
])
def test_labels_google_refuses_are_invalid_argument_naming_the_label(
        emulator: tuple[DataflowEmulator, Receiver], staged: dict[str, str],
        labels: dict[str, str], named: str) -> None:
    from spotorch.ports.steps import StepLaunchError

    emu, _ = emulator
    ask = replace(request(staged, "spotorch-r6-pre1", "good"), labels=labels)
    with pytest.raises(StepLaunchError, match=re.escape(named)) as bad:
        launcher(emu).launch(ask)
    cause = bad.value.__cause__
    assert bad.value.permanent and isinstance(cause, GoogleAPICallError) and cause.code == 400
    ok = {"spotorch_pipeline": "churn-model_2", "spotorch_key": "0123abcd", "empty": ""}
    assert launcher(emu).launch(replace(ask, job_name="spotorch-r6-pre2", labels=ok)).job_id


def test_parameters_the_launchers_metadata_does_not_declare_are_refused(
        emulator: tuple[DataflowEmulator, Receiver], staged: dict[str, str]) -> None:
    from google.api_core import exceptions
    from google.cloud import dataflow_v1beta3 as df

    from spotorch.ports.steps import StepLaunchError

    emu, _ = emulator
    steps = launcher(emu)
    with pytest.raises(StepLaunchError, match=r"module: Required parameter is missing"):
        steps.launch(replace(request(staged, "spotorch-r7-pre1", "good"), python_module=None))
    # The real client with a parameter the metadata lacks (spotorch sends options as one).
    parameter = df.LaunchFlexTemplateParameter(
        job_name="spotorch-r7-pre2", container_spec_gcs_path=LAUNCHER,
        parameters={"module": "m", "input": "gs://landing/good/", "output": "gs://prep/x/",
                    "num_shards": "2"},
        environment=df.FlexTemplateRuntimeEnvironment(service_account_email=WORKERS))
    with pytest.raises(exceptions.BadRequest, match=r"The template parameters are invalid"
                                                    r"(.|\n)*num_shards: Parameter is not "
                                                    r"declared"):
        steps._client("flex").launch_flex_template(request=df.LaunchFlexTemplateRequest(
            project_id=PROJECT, location="us-central1", launch_parameter=parameter))


def test_a_live_job_is_followed_by_get_job_alone(
        emulator: tuple[DataflowEmulator, Receiver], staged: dict[str, str]) -> None:
    emu, _ = emulator
    steps = launcher(emu)
    job = steps.launch(request(staged, "spotorch-r8-pre1", "good"))
    emu.calls.clear()
    seen = steps.get("spotorch-r8-pre1", "us-central1", job.job_id)
    assert seen is not None and seen.job_id == job.job_id
    if seen.state in pp.LIVE_STATES:  # no messages, no metrics, no ListJobs while it runs
        assert emu.calls == {"get": 1}
    wait_ended(steps, "spotorch-r8-pre1")
    emu.calls.clear()
    done = steps.get("spotorch-r8-pre1", "us-central1", job.job_id)
    assert done is not None and done.state == pp.JOB_STATE_DONE and done.vcpu_s > 0
    assert emu.calls == {"get": 1, "metrics": 1}  # ended: its cost, once; no error to read
    emu.calls.clear()
    assert steps.get("spotorch-r8-pre1", "us-central1", "2000-01-01_00_00_00-9") is not None
    assert emu.calls.get("list") == 1  # an unknown id: found by its name instead


def test_the_module_reads_the_pinned_generations_not_the_live_objects(
        emulator: tuple[DataflowEmulator, Receiver], staged: dict[str, str]) -> None:
    emu, _ = emulator
    client = _client()
    versioned = client.bucket("pinned")
    versioned.versioning_enabled = True  # as the local stack makes landing buckets
    client.create_bucket(versioned)
    header = "f0,f1,label\n"
    for i in range(2):
        versioned.blob(f"snap/part-{i}.csv").upload_from_string(
            header + "".join(f"{i}.{j},{j}.5,{j % 2}\n" for j in range(10)))
    blobs = [versioned.get_blob(f"snap/part-{i}.csv") for i in range(2)]
    manifest = {"format": "spotorch.inputs", "bucket": "pinned", "data_uri": "gs://pinned/snap/",
                "objects": [{"name": b.name, "generation": b.generation} for b in blobs]}
    client.bucket("prep").blob("inputs/pin.json").upload_from_string(json.dumps(manifest))
    steps = launcher(emu)
    live = replace(request(staged, "spotorch-r9-pre1", "good"), input_uri="gs://pinned/snap/",
                   output_uri="gs://prep/r9-before/")
    steps.launch(live)
    assert wait_ended(steps, "spotorch-r9-pre1").state == pp.JOB_STATE_DONE
    versioned.blob("snap/part-1.csv").upload_from_string(header + "100.0,200.0,1\n")  # overwrite
    steps.launch(replace(live, job_name="spotorch-r9-pre2", output_uri="gs://prep/r9-pinned/",
                         inputs_uri="gs://prep/inputs/pin.json"))
    pinned = wait_ended(steps, "spotorch-r9-pre2")
    assert pinned.state == pp.JOB_STATE_DONE, pinned.error
    steps.launch(replace(live, job_name="spotorch-r9-pre3", output_uri="gs://prep/r9-after/"))
    assert wait_ended(steps, "spotorch-r9-pre3").state == pp.JOB_STATE_DONE

    def rows(prefix: str) -> list[str]:
        return sorted(line for b in client.list_blobs("prep", prefix=prefix)
                      if b.name.endswith(".csv")
                      for line in b.download_as_text().splitlines()[1:])

    assert rows("r9-pinned/") == rows("r9-before/")  # the recorded generations, read again
    assert rows("r9-after/") != rows("r9-before/")  # what the live folder holds now differs
