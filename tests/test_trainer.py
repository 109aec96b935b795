"""The trainer helper: env, atomic checkpoints, keep-last-K, SIGTERM, events (memory, emulated)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from spotorch_trainer import (
    CheckpointError,
    CheckpointRef,
    ListReporter,
    LocalStorage,
    Preempted,
    PubSubReporter,
    Run,
    TrainerEnv,
    contract,
    event_message,
    latest_checkpoint,
    list_checkpoints,
    load_checkpoint,
    prune_checkpoints,
    write_checkpoint,
)
from spotorch_trainer.checkpoints import prune_plan
from spotorch_trainer.env import EnvError
from spotorch_trainer.events import LogReporter, reporter_for
from spotorch_trainer.storage import GcsStorage, Payload

ROOT = Path(__file__).resolve().parent.parent
RFC3339 = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")


# -- env ------------------------------------------------------------------------------------------

def test_env_reads_every_contract_variable() -> None:
    env = TrainerEnv.from_env({
        contract.ENV_RUN_ID: "r-1", contract.ENV_ATTEMPT: "3", contract.ENV_PIPELINE: "pipe",
        contract.ENV_CHECKPOINT_URI: "gs://b/ckpt/r-1",
        contract.ENV_RESUME_FROM: "gs://b/ckpt/r-1/step-0000000200",
        contract.ENV_RESUME_STEP: "200", contract.ENV_DATA_URI: "gs://b/data/2024-01-01/",
        contract.ENV_MODEL_URI: "gs://b/models/r-1",
        contract.ENV_EVENTS_TOPIC: "projects/p/topics/t",
        "AIP_MODEL_DIR": "gs://b/aip/model/",
    })
    assert env == TrainerEnv(run_id="r-1", attempt=3, pipeline="pipe",
                             checkpoint_uri="gs://b/ckpt/r-1",
                             resume_from="gs://b/ckpt/r-1/step-0000000200", resume_step=200,
                             data_uri="gs://b/data/2024-01-01/", model_uri="gs://b/models/r-1",
                             events_topic="projects/p/topics/t", managed=True)


def test_env_without_spotorch_is_a_local_run() -> None:
    env = TrainerEnv.from_env({"PATH": "/bin"})
    assert not env.managed
    assert env.events_topic is None and env.resume_from is None and env.data_uri is None
    assert not env.checkpoint_uri.startswith("gs://") and not env.model_uri.startswith("gs://")
    assert isinstance(reporter_for(env), LogReporter)


def test_env_falls_back_to_vertex_dirs_and_treats_empty_as_unset() -> None:
    env = TrainerEnv.from_env({"AIP_MODEL_DIR": "gs://b/out/model/",
                               "AIP_CHECKPOINT_DIR": "gs://b/out/checkpoints/",
                               contract.ENV_MODEL_URI: "", contract.ENV_RESUME_FROM: "",
                               contract.ENV_RESUME_STEP: "", contract.ENV_EVENTS_TOPIC: ""})
    assert env.model_uri == "gs://b/out/model/"
    assert env.checkpoint_uri == "gs://b/out/checkpoints/"
    assert env.resume_from is None and env.resume_step is None and env.events_topic is None


def test_env_knows_the_chief_from_vertex_cluster_spec() -> None:
    def spec(kind: str, index: int) -> dict[str, str]:
        return {"CLUSTER_SPEC": json.dumps({"cluster": {}, "task": {"type": kind, "index": index}})}

    assert TrainerEnv.from_env({}).chief
    assert TrainerEnv.from_env(spec("workerpool0", 0)).chief
    assert not TrainerEnv.from_env(spec("workerpool0", 1)).chief
    assert not TrainerEnv.from_env(spec("workerpool1", 0)).chief
    assert TrainerEnv.from_env({"CLUSTER_SPEC": "not json"}).chief


def test_only_the_chief_writes_checkpoints_and_reports(tmp_path: Path) -> None:
    reporter = ListReporter()
    with Run(total_steps=4, checkpoint_every=2, env=local_env(tmp_path, chief=False),
             reporter=reporter) as run:
        for _ in run.steps():
            if run.checkpoint_due():
                run.checkpoint({"x": 1})
    assert latest_checkpoint(str(tmp_path / "ckpt")) is None
    assert reporter.messages == []


def test_env_takes_the_resume_step_from_the_uri_and_rejects_garbage() -> None:
    env = TrainerEnv.from_env({contract.ENV_RESUME_FROM: "/c/step-0000000042/"})
    assert env.resume_step == 42
    with pytest.raises(EnvError, match="SPOTORCH_ATTEMPT"):
        TrainerEnv.from_env({contract.ENV_ATTEMPT: "two"})


# -- checkpoints ----------------------------------------------------------------------------------

def test_checkpoint_is_files_then_marker(tmp_path: Path) -> None:
    root = str(tmp_path / "ckpt")
    ref = write_checkpoint(root, 120, {"w.bin": b"\x00\x01", "opt/m.bin": b"m"}, clock=lambda: 0.0)
    step, uri = ref  # unpacks as (step, uri)
    assert (step, uri) == (120, f"{root}/step-0000000120")
    marker = json.loads(Path(uri, contract.COMPLETION_MARKER).read_text())
    assert marker == {"step": 120, "files": ["opt/m.bin", "w.bin"],
                      "time": "1970-01-01T00:00:00.000Z"}
    assert latest_checkpoint(root) == ref
    loaded = load_checkpoint(uri)
    assert loaded.read("opt/m.bin") == b"m" and loaded.files == ("opt/m.bin", "w.bin")
    assert sorted(p.name for p in loaded.download(tmp_path / "dl").rglob("*")) == ["m.bin", "opt",
                                                                                   "w.bin"]
    assert not list(Path(uri).glob(".*.tmp"))  # no temporary files left behind


def test_half_written_checkpoint_is_never_picked(tmp_path: Path) -> None:
    root = str(tmp_path)
    good = write_checkpoint(root, 100, {"a": b"old"})
    cut = Path(root, contract.checkpoint_dir_name(200))  # files written, killed before the marker
    cut.mkdir()
    (cut / "a").write_bytes(b"new")
    (tmp_path / "not-a-checkpoint").mkdir()
    assert latest_checkpoint(root) == good
    assert list_checkpoints(root) == [good]
    with pytest.raises(CheckpointError, match="not a complete checkpoint"):
        load_checkpoint(str(cut))
    assert latest_checkpoint(str(tmp_path / "nothing-here")) is None


class FailingStorage(LocalStorage):
    """Local storage that dies on the n-th write (a preemption in the middle of a checkpoint)."""

    def __init__(self, fail_on_write: int) -> None:
        self.writes = 0
        self.fail_on_write = fail_on_write

    def write(self, uri: str, data: Payload) -> None:
        self.writes += 1
        if self.writes == self.fail_on_write:
            raise OSError("killed mid-write")
        super().write(uri, data)


def test_crash_while_writing_leaves_the_previous_checkpoint_latest(tmp_path: Path) -> None:
    root = str(tmp_path)
    good = write_checkpoint(root, 10, {"a": b"1", "b": b"1"})
    with pytest.raises(OSError):
        write_checkpoint(root, 20, {"a": b"2", "b": b"2"}, storage=FailingStorage(2))
    assert latest_checkpoint(root) == good
    # Rewriting a complete step withdraws its marker first: a crash mid-rewrite leaves none.
    with pytest.raises(OSError):
        write_checkpoint(root, 10, {"a": b"3", "b": b"3"}, storage=FailingStorage(2))
    assert latest_checkpoint(root) is None


def test_bad_file_names_are_refused(tmp_path: Path) -> None:
    for name in ("", "/abs", "../up", "a//b", contract.COMPLETION_MARKER):
        with pytest.raises(CheckpointError):
            write_checkpoint(str(tmp_path), 1, {name: b""})


@pytest.mark.parametrize(("complete", "present", "keep", "doomed"), [
    ([1, 2, 3, 4, 5], [1, 2, 3, 4, 5], 2, [1, 2, 3]),
    ([1, 2], [1, 2], 5, []),
    ([3], [1, 2, 3, 4], 0, [1, 2]),  # keep is at least 1; stale partials go; a newer partial stays
    ([], [1, 2], 3, []),  # nothing complete: delete nothing
])
def test_prune_plan(complete: list[int], present: list[int], keep: int, doomed: list[int]) -> None:
    assert prune_plan(complete, present, keep) == doomed


def test_keep_last_k_on_disk(tmp_path: Path) -> None:
    root = str(tmp_path)
    for step in (10, 20, 30, 40):
        write_checkpoint(root, step, {"x": str(step).encode()})
    Path(root, contract.checkpoint_dir_name(5)).mkdir()  # an old partial
    Path(root, contract.checkpoint_dir_name(50)).mkdir()  # a newer partial, maybe being written
    assert prune_checkpoints(root, keep=2) == [5, 10, 20]
    assert [r.step for r in list_checkpoints(root)] == [30, 40]
    assert sorted(p.name for p in tmp_path.iterdir()) == [contract.checkpoint_dir_name(s)
                                                          for s in (30, 40, 50)]


# -- Run ------------------------------------------------------------------------------------------

def local_env(tmp_path: Path, **overrides: Any) -> TrainerEnv:
    fields: dict[str, Any] = {"run_id": "run-1", "attempt": 2, "pipeline": "p",
                              "checkpoint_uri": str(tmp_path / "ckpt"),
                              "model_uri": str(tmp_path / "model"), "managed": True}
    return TrainerEnv(**{**fields, **overrides})


def train(run: Run, state: dict[str, int], *, signal_at: int | None = None,
          signal_late: bool = False) -> None:
    """A toy loop in the documented shape; optionally SIGTERMs itself at one step."""
    for step in run.steps():
        state["sum"] += step
        if step == signal_at and not signal_late:
            os.kill(os.getpid(), signal.SIGTERM)
        run.log_metrics(loss=1.0 / (step + 1))
        if run.checkpoint_due():
            run.checkpoint(state)
        if step == signal_at and signal_late:  # after the body's check: needs one more step
            os.kill(os.getpid(), signal.SIGTERM)


def test_run_checkpoints_resumes_and_reports(tmp_path: Path) -> None:
    reporter = ListReporter()
    with Run(total_steps=10, checkpoint_every=4, env=local_env(tmp_path), reporter=reporter,
             progress_interval_s=3600, clock=lambda: 1_700_000_000.0) as run:
        assert run.restore() is None
        state = {"sum": 0}
        train(run, state)
    assert [r.step for r in list_checkpoints(str(tmp_path / "ckpt"))] == [4, 8]
    assert reporter.kinds == ["started", "progress", "checkpoint", "checkpoint", "completed"]
    data, attrs = reporter.messages[-1]
    assert tuple(sorted(data)) == tuple(sorted(contract.EVENT_DATA_FIELDS))
    assert data == {"event_id": "run-1/2/completed/10", "kind": "completed", "run_id": "run-1",
                    "attempt": 2, "pipeline": "p", "step": 10, "total_steps": 10,
                    "metrics": {"loss": 0.1}, "checkpoint_uri": f"{tmp_path}/ckpt/step-0000000008",
                    "exit_code": None, "time": "2023-11-14T22:13:20.000Z"}
    assert attrs == {contract.ATTR_SOURCE: contract.SOURCE_TRAINER, "run_id": "run-1",
                     "attempt": "2", "kind": "completed"}
    checkpoint_event = reporter.messages[2][0]
    assert (checkpoint_event["step"], checkpoint_event["checkpoint_uri"]) == (
        4, f"{tmp_path}/ckpt/step-0000000004")

    # A second attempt resumes after step 8 and only runs steps 8 and 9.
    reporter2 = ListReporter()
    with Run(total_steps=10, checkpoint_every=4, env=local_env(tmp_path, attempt=3),
             reporter=reporter2) as run2:
        restored = run2.restore()
        assert restored is not None and restored.step == 8
        state2 = restored.state
        assert state2 == {"sum": sum(range(8))}
        assert list(run2.steps()) == [8, 9]
    assert reporter2.messages[0][0]["step"] == 8
    assert reporter2.messages[0][0]["checkpoint_uri"] == f"{tmp_path}/ckpt/step-0000000008"


def test_sigterm_writes_a_final_checkpoint_and_exits_143(tmp_path: Path) -> None:
    reporter = ListReporter()
    before = signal.getsignal(signal.SIGTERM)
    state = {"sum": 0}
    with pytest.raises(SystemExit) as exited, Run(total_steps=100, checkpoint_every=4,
                                                   env=local_env(tmp_path), reporter=reporter,
                                                   progress_interval_s=3600) as run:
        train(run, state, signal_at=5)
    assert exited.value.code == contract.EXIT_PREEMPTED
    assert isinstance(exited.value, Preempted) and exited.value.step == 6
    assert latest_checkpoint(str(tmp_path / "ckpt")) == CheckpointRef(
        6, f"{tmp_path}/ckpt/step-0000000006")
    assert load_checkpoint(f"{tmp_path}/ckpt/step-0000000006").state == {"sum": sum(range(6))}
    assert reporter.kinds[-3:] == ["checkpoint", "checkpoint", "preempting"]
    preempting = reporter.messages[-1][0]
    assert preempting["step"] == 6 and preempting["exit_code"] == contract.EXIT_PREEMPTED
    assert preempting["checkpoint_uri"] == f"{tmp_path}/ckpt/step-0000000006"
    assert signal.getsignal(signal.SIGTERM) == before  # the previous handler is back


def test_sigterm_after_the_bodys_check_gets_one_more_step_to_save(tmp_path: Path) -> None:
    state = {"sum": 0}
    with pytest.raises(SystemExit) as exited, Run(total_steps=100, checkpoint_every=50,
                                                   env=local_env(tmp_path),
                                                   reporter=ListReporter()) as run:
        train(run, state, signal_at=5, signal_late=True)
    assert exited.value.code == contract.EXIT_PREEMPTED
    assert latest_checkpoint(str(tmp_path / "ckpt")) == CheckpointRef(
        7, f"{tmp_path}/ckpt/step-0000000007")


def test_sigterm_before_the_loop_stops_at_once(tmp_path: Path) -> None:
    reporter = ListReporter()
    with pytest.raises(SystemExit) as exited, Run(total_steps=100, env=local_env(tmp_path),
                                                   reporter=reporter) as run:
        os.kill(os.getpid(), signal.SIGTERM)  # e.g. while the data is still loading
        for _ in run.steps():
            pytest.fail("no step should run after SIGTERM")
    assert exited.value.code == contract.EXIT_PREEMPTED
    assert reporter.kinds == ["started", "preempting"]


def test_an_error_after_sigterm_still_exits_as_preempted(tmp_path: Path) -> None:
    reporter = ListReporter()
    with pytest.raises(SystemExit) as exited, Run(total_steps=9, env=local_env(tmp_path),
                                                   reporter=reporter,
                                                   storage=FailingStorage(1)) as run:
        for step in run.steps():
            if step == 2:
                os.kill(os.getpid(), signal.SIGTERM)
            if run.checkpoint_due():
                run.checkpoint({"step": step})  # the network is gone: the write fails
    assert exited.value.code == contract.EXIT_PREEMPTED
    assert isinstance(exited.value.__cause__, OSError)
    assert reporter.kinds == ["started", "progress", "preempting"]
    assert reporter.messages[-1][0]["checkpoint_uri"] is None  # nothing to resume from


def test_errors_are_reported_as_failed_and_propagate(tmp_path: Path) -> None:
    reporter = ListReporter()
    with pytest.raises(ZeroDivisionError), Run(total_steps=5, env=local_env(tmp_path),
                                               reporter=reporter) as run:
        for step in run.steps():
            if step == 3:
                _ = 1 / 0
    assert reporter.kinds[-1] == "failed"
    assert (reporter.messages[-1][0]["exit_code"], reporter.messages[-1][0]["step"]) == (1, 3)

    reporter = ListReporter()
    with pytest.raises(SystemExit), Run(env=local_env(tmp_path), reporter=reporter):
        sys.exit(7)
    assert reporter.messages[-1][0]["exit_code"] == 7


def test_resume_takes_the_newer_of_resume_from_and_the_latest(tmp_path: Path) -> None:
    root = str(tmp_path / "ckpt")
    old = write_checkpoint(root, 10, {})
    write_checkpoint(root, 30, {})
    write_checkpoint(str(tmp_path / "elsewhere"), 50, {})
    # A worker restarted in place still has the old SPOTORCH_RESUME_FROM: the newer one wins.
    run = Run(env=local_env(tmp_path, resume_from=old.uri, resume_step=10), reporter=ListReporter(),
              handle_sigterm=False)
    assert run.start().start_step == 30
    run = Run(env=local_env(tmp_path, resume_from=f"{tmp_path}/elsewhere/step-0000000050"),
              reporter=ListReporter(), handle_sigterm=False)
    assert run.start().start_step == 50
    run = Run(env=local_env(tmp_path, resume_from=f"{root}/step-0000000099"),
              reporter=ListReporter(), handle_sigterm=False)  # named one missing: the latest
    assert run.start().start_step == 30


def test_progress_is_rate_limited(tmp_path: Path) -> None:
    reporter = ListReporter()
    with Run(total_steps=500, env=local_env(tmp_path), reporter=reporter,
             progress_interval_s=3600) as run:
        for _ in run.steps():
            pass
    assert reporter.kinds.count("progress") == 1
    with Run(total_steps=3, env=local_env(tmp_path, run_id="r2"), reporter=reporter,
             progress_interval_s=0) as run:
        for _ in run.steps():
            pass
    assert [d["step"] for d, _ in reporter.messages if d["kind"] == "progress"][-3:] == [1, 2, 3]


class ExplodingReporter:
    def send(self, data: bytes, attributes: Mapping[str, str], *, wait: bool) -> None:
        raise RuntimeError("pubsub is down")

    def flush(self) -> None:
        raise RuntimeError("still down")


class ExplodingPublisher:
    def publish(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("no route to host")


def test_reporting_failures_never_stop_training(tmp_path: Path) -> None:
    with Run(total_steps=3, checkpoint_every=1, env=local_env(tmp_path),
             reporter=ExplodingReporter()) as run:
        for _ in run.steps():
            run.checkpoint({"ok": True})
    assert latest_checkpoint(str(tmp_path / "ckpt")) is not None
    PubSubReporter("projects/p/topics/t", client=ExplodingPublisher()).send(b"{}", {}, wait=True)


def test_event_message_is_plain_json() -> None:
    env = TrainerEnv(run_id="r", attempt=1, pipeline="p")
    data, attrs = event_message(env, "progress", now=0.0, step=5, total_steps=9,
                                metrics={"loss": float("nan"), "acc": 0.5})
    payload = json.loads(data)
    assert payload["metrics"] == {"loss": None, "acc": 0.5}  # NaN has no JSON spelling
    assert payload["event_id"] == contract.trainer_event_id("r", 1, "progress", 5)
    assert RFC3339.match(payload["time"]) and attrs["kind"] == "progress"
    with pytest.raises(ValueError):
        event_message(env, "exploded", now=0.0)


def test_helper_needs_only_the_standard_library(tmp_path: Path) -> None:
    """python -S (no site-packages: no google, no numpy): import and a whole local run work."""
    code = """
import sys
sys.path.insert(0, sys.argv[1])
import spotorch_trainer
env = spotorch_trainer.TrainerEnv(checkpoint_uri=sys.argv[2] + "/ckpt", events_topic=None)
with spotorch_trainer.Run(total_steps=4, checkpoint_every=2, env=env) as run:
    for step in run.steps():
        if run.checkpoint_due():
            run.checkpoint({"step": step})
print(spotorch_trainer.latest_checkpoint(sys.argv[2] + "/ckpt").step)
"""
    out = subprocess.run([sys.executable, "-S", "-c", code, str(ROOT / "trainer"), str(tmp_path)],
                         capture_output=True, text=True, timeout=60, env=_clean_env())
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "4"


def test_importing_the_helper_imports_no_cloud_client() -> None:
    code = ("import sys; sys.path.insert(0, sys.argv[1]); import spotorch_trainer; "
            "print(sorted(m for m in sys.modules"
            " if m.startswith(('google.cloud.', 'google.api_core', 'grpc'))))")
    out = subprocess.run([sys.executable, "-c", code, str(ROOT / "trainer")], capture_output=True,
                         text=True, timeout=60, env=_clean_env())
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def _clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("SPOTORCH_")}


def test_unreachable_pubsub_costs_at_most_the_timeout(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    from spotorch.local.emulators import free_port

    monkeypatch.setenv("PUBSUB_EMULATOR_HOST", f"127.0.0.1:{free_port()}")  # nobody listens
    reporter = PubSubReporter("projects/p/topics/t", timeout_s=0.5)
    began = time.monotonic()
    with Run(total_steps=2, env=local_env(tmp_path), reporter=reporter) as run:
        for _ in run.steps():
            pass
    assert time.monotonic() - began < 3.0  # two waited-for events, 0.5 s each at most


# -- against the emulators ------------------------------------------------------------------------

@pytest.fixture
def topic_and_subscription(emulators: Any) -> Iterator[tuple[str, str]]:
    from google.cloud import pubsub_v1

    publisher, subscriber = pubsub_v1.PublisherClient(), pubsub_v1.SubscriberClient()
    name = f"trainer-{uuid.uuid4().hex[:8]}"
    topic = publisher.topic_path(emulators.project, name)
    subscription = subscriber.subscription_path(emulators.project, name)
    publisher.create_topic(name=topic)
    subscriber.create_subscription(name=subscription, topic=topic)
    yield topic, subscription
    subscriber.delete_subscription(subscription=subscription)
    publisher.delete_topic(topic=topic)


def pull(subscription: str, count: int, timeout: float = 15.0) -> list[Any]:
    from google.cloud import pubsub_v1

    subscriber = pubsub_v1.SubscriberClient()
    got: list[Any] = []
    deadline = time.monotonic() + timeout
    while len(got) < count and time.monotonic() < deadline:
        response = subscriber.pull(subscription=subscription, max_messages=50, timeout=5)
        if response.received_messages:
            subscriber.acknowledge(subscription=subscription,
                                   ack_ids=[m.ack_id for m in response.received_messages])
            got.extend(m.message for m in response.received_messages)
    return got


@pytest.mark.emulator
def test_events_reach_the_pubsub_emulator(tmp_path: Path,
                                          topic_and_subscription: tuple[str, str]) -> None:
    topic, subscription = topic_and_subscription
    env = local_env(tmp_path, events_topic=topic)
    state = {"sum": 0}
    with pytest.raises(SystemExit), Run(total_steps=20, checkpoint_every=3, env=env,
                                        progress_interval_s=3600) as run:
        train(run, state, signal_at=4)
    messages = pull(subscription, 5)
    by_kind = {m.attributes["kind"]: (json.loads(m.data), dict(m.attributes)) for m in messages}
    assert sorted(by_kind) == ["checkpoint", "preempting", "progress", "started"]
    data, attrs = by_kind["preempting"]
    assert attrs == {contract.ATTR_SOURCE: contract.SOURCE_TRAINER, "run_id": "run-1",
                     "attempt": "2", "kind": "preempting"}
    assert data["event_id"] == "run-1/2/preempting/5"
    assert data["checkpoint_uri"] == f"{tmp_path}/ckpt/step-0000000005"
    assert data["exit_code"] == contract.EXIT_PREEMPTED and RFC3339.match(data["time"])


@pytest.mark.emulator
def test_gcs_checkpoints_against_fake_gcs(emulators: Any) -> None:
    from google.cloud import storage

    client = storage.Client()
    bucket = client.create_bucket(f"ckpt-{uuid.uuid4().hex[:8]}")
    root = f"gs://{bucket.name}/runs/r-1"
    gcs = GcsStorage(client)
    for step in (100, 200, 300):
        write_checkpoint(root, step, {"weights.bin": bytes([step % 256]) * 10,
                                      "opt/state.bin": b"s"}, storage=gcs)
    bucket.blob("runs/r-1/step-0000000400/weights.bin").upload_from_string(b"half")  # no marker
    assert latest_checkpoint(root) == CheckpointRef(300, f"{root}/step-0000000300")
    assert prune_checkpoints(root, keep=2) == [100]
    assert [r.step for r in list_checkpoints(root)] == [200, 300]
    names = sorted(b.name for b in client.list_blobs(bucket.name))
    assert "runs/r-1/step-0000000100/weights.bin" not in names
    assert "runs/r-1/step-0000000400/weights.bin" in names  # a newer partial is left alone
    loaded = load_checkpoint(f"{root}/step-0000000300")
    assert loaded.files == ("opt/state.bin", "weights.bin")
    assert loaded.read("weights.bin") == bytes([300 % 256]) * 10
    marker = json.loads(bucket.blob("runs/r-1/step-0000000300/_COMPLETE").download_as_bytes())
    assert marker["step"] == 300 and marker["files"] == ["opt/state.bin", "weights.bin"]


@pytest.mark.emulator
def test_snapshot_objects_read_their_recorded_generation_after_an_overwrite(
        emulators: Any) -> None:
    """Issue 30: the inputs manifest pins each object's generation; on a versioned bucket (as
    production's landing buckets must be) an overwrite does not change what is read, and on an
    unversioned one the old generation is gone: an error, never the new bytes."""
    from google.cloud import storage

    from spotorch_trainer import read_at, snapshot_objects

    client = storage.Client()
    for versioned in (True, False):
        bucket = client.bucket(f"data-{uuid.uuid4().hex[:8]}")
        bucket.versioning_enabled = versioned
        bucket = client.create_bucket(bucket)
        blob = bucket.blob("d/part-0.csv")
        blob.upload_from_string(b"old")
        first = bucket.get_blob("d/part-0.csv").generation
        manifest = {"format": "spotorch.inputs", "bucket": bucket.name,
                    "objects": [{"name": "d/part-0.csv", "generation": first}]}
        bucket.blob("inputs.json").upload_from_string(json.dumps(manifest))
        bucket.blob("d/part-0.csv").upload_from_string(b"new")
        (obj,) = snapshot_objects(f"gs://{bucket.name}/inputs.json")
        assert (obj.name, obj.generation) == ("d/part-0.csv", first)
        assert obj.uri == f"gs://{bucket.name}/d/part-0.csv"
        if versioned:
            assert obj.read() == b"old" and read_at(obj.uri, None) == b"new"
        else:
            with pytest.raises(FileNotFoundError, match=f"#{first}"):
                obj.read()
    assert snapshot_objects("") == []


def test_a_manifest_spotorch_did_not_write_is_refused(tmp_path: Path) -> None:
    from spotorch_trainer import StorageError, snapshot_objects

    bad = tmp_path / "inputs.json"
    bad.write_text('{"objects": [{"name": "x"}]}')
    with pytest.raises(StorageError, match="not one spotorch writes"):
        snapshot_objects(str(bad))


def test_the_seed_and_inputs_come_from_the_env() -> None:
    env = TrainerEnv.from_env({contract.ENV_SEED: "42", contract.ENV_INPUTS: "gs://c/i.json"})
    assert env.seed == 42 and env.inputs_uri == "gs://c/i.json"
    assert TrainerEnv.from_env({}).seed is None
    with pytest.raises(EnvError, match="SPOTORCH_SEED"):
        TrainerEnv.from_env({contract.ENV_SEED: "x"})
