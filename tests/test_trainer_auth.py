"""Issue 27: trainer reports prove their attempt (HMAC with its own key) and checkpoints their run.

Through functions-framework with real CloudEvents, on in-memory adapters: forged, mis-signed and
other-attempt messages are refused and recorded; a checkpoint must be the run's own and complete;
`completed` is a hint that only Vertex's SUCCEEDED confirms; the key never leaks.
"""

from __future__ import annotations

import json
import logging
from dataclasses import replace
from typing import Any

import pytest

from fakes import fake_deps
from spotorch.adapters.memory.twins import InMemoryCheckpoints, InMemoryLauncher, ManualClock
from spotorch.app.deps import Deps
from spotorch.app.runs import start_run
from spotorch.app.tick import tick
from spotorch.core.context import Context
from spotorch.core.decide import decide, new_run
from spotorch.core.model import Checkpoint, FailureClass, JobPhase, Run, RunStatus
from spotorch.core.observations import TrainerReported
from spotorch.core.pipeline import BatchMode, EscalationKind, Pipeline, RecoveryPolicy, Trigger
from spotorch.core.trust import SignedMessage, attempt_key, checkpoint_outside, unproven
from spotorch.entrypoints import functions as entry
from spotorch_trainer import contract
from test_functions import post, pubsub_event

TOTAL = 1500


def make_deps() -> Deps:
    pipelines = [Pipeline(name=name, trigger=Trigger(bucket="landing", prefix=f"{name}/",
                                                     batch=BatchMode.EACH_OBJECT),
                          checkpoint_uri=f"gs://ckpt/{name}", output_uri=f"gs://models/{name}",
                          recovery=RecoveryPolicy(escalation=EscalationKind.NEVER))
                 for name in ("victim", "other")]
    return fake_deps(*pipelines)


@pytest.fixture
def deps(monkeypatch: pytest.MonkeyPatch) -> Deps:
    made = make_deps()
    monkeypatch.setattr(entry, "deps", lambda: made)
    return made


def parts(deps: Deps) -> tuple[InMemoryLauncher, InMemoryCheckpoints, ManualClock]:
    assert isinstance(deps.launcher, InMemoryLauncher)
    assert isinstance(deps.checkpoints, InMemoryCheckpoints)
    assert isinstance(deps.clock, ManualClock)
    return deps.launcher, deps.checkpoints, deps.clock


def running(deps: Deps, pipeline: str, run_id: str) -> Run:
    launcher, _, clock = parts(deps)
    run = start_run(deps, pipeline, run_id=run_id, data_uri=f"gs://landing/{pipeline}/a",
                    snapshot_id=run_id, reason="t")
    assert run is not None
    launcher.set_status(launcher.job_of(run_id, 1), JobPhase.RUNNING, start_time=clock.t)
    tick(deps)
    return load(deps, run_id)


def load(deps: Deps, run_id: str) -> Run:
    run, _ = deps.runs.load(run_id)
    assert run is not None
    return run


def body(run: Run, kind: str, step: int, *, attempt: int = 1, **fields: Any) -> bytes:
    clock_t = fields.pop("at", None)
    data: dict[str, Any] = {
        "event_id": contract.trainer_event_id(run.run_id, attempt, kind, step), "kind": kind,
        "run_id": run.run_id, "attempt": attempt, "pipeline": run.pipeline, "step": step,
        "total_steps": TOTAL, "metrics": {}, "checkpoint_uri": None, "exit_code": None,
        **fields}
    if clock_t is not None:
        data["time"] = contract.rfc3339(clock_t)
    return json.dumps(data, sort_keys=True).encode()


def attrs(data: bytes, key: str | None, attempt: int = 1, **extra: str) -> dict[str, str]:
    out = {contract.ATTR_SOURCE: contract.SOURCE_TRAINER, contract.ATTR_ATTEMPT: str(attempt),
           **extra}
    if key is not None:
        out[contract.ATTR_SIGNATURE] = contract.sign_report(key, data)
    return out


def key_of(run: Run, attempt: int = 1) -> str:
    found = run.attempt(attempt)
    assert found is not None and found.report_key
    return found.report_key


def send(data: bytes, attributes: dict[str, str], message_id: str) -> int:
    return int(post("on_job_event", pubsub_event(data, attributes, message_id)).status_code)


def rejected(deps: Deps, message_id: str, data: bytes) -> str:
    """The reason a refused message was recorded with (under its event id or message id)."""
    for key in (json.loads(data).get("event_id", ""), message_id):
        record, _ = deps.docs.get("rejected_events", str(key).replace("/", "_"))
        if record is not None:
            return str(record["reason"])
    raise AssertionError(f"{message_id} was not recorded as rejected")


# --- keys ------------------------------------------------------------------------------------------


def test_every_attempt_has_its_own_random_key_in_its_job_environment_only(deps: Deps) -> None:
    launcher, _, _ = parts(deps)
    run = running(deps, "victim", "v1")
    other = running(deps, "other", "o1")
    spec = launcher.jobs[launcher.job_of("v1", 1)].spec
    assert spec.env[contract.ENV_REPORT_KEY] == key_of(run)
    assert len(key_of(run)) == 64 and key_of(run) != key_of(other)
    launcher.set_status(launcher.job_of("v1", 1), JobPhase.FAILED,
                        failure=FailureClass.PREEMPTED)
    tick(deps)
    second = load(deps, "v1")
    assert len(second.attempts) == 2 and key_of(second, 2) not in (key_of(second, 1), "")
    assert launcher.jobs[launcher.job_of("v1", 2)].spec.env[contract.ENV_REPORT_KEY] == \
        key_of(second, 2)
    # The labels and display name (listed by anyone with customJobs.list) never carry it.
    assert key_of(second, 2) not in json.dumps([spec.labels, spec.display_name])
    assert attempt_key(b"", "v1", 1) == ""  # no seed: no key (fail closed)
    assert "report_key" not in repr(second) and key_of(second, 2) not in repr(second)


def test_a_decision_without_a_seed_launches_an_attempt_that_accepts_no_report() -> None:
    p = make_deps().pipelines["victim"]
    run = new_run(run_id="r", pipeline=p, now=1.8e9, data_uri="gs://b/", snapshot_id=None)
    assert run.attempts[0].report_key == ""
    data = b'{"kind": "progress"}'
    why = unproven(run, TrainerReported(1, "progress", 1.8e9, step=1),
                   SignedMessage(data, contract.sign_report("", data), "1"))
    assert why is not None and "no report key" in why


# --- forged, mis-signed, other-attempt messages -------------------------------------------------------


def test_a_forged_checkpoint_naming_another_runs_checkpoint_changes_nothing(deps: Deps) -> None:
    """Finding: a forged `checkpoint` report naming a checkpoint of another pipeline's run became
    the run's latest_checkpoint, and attempt 2 resumed from it after the worker was killed."""
    launcher, store, clock = parts(deps)
    victim = running(deps, "victim", "v1")
    other = running(deps, "other", "o1")
    theirs = store.put(other.checkpoint_uri, 900)  # really there, complete: another run's
    ours = store.put(victim.checkpoint_uri, 100)
    clock.advance(60)
    honest = body(victim, "checkpoint", 100, checkpoint_uri=ours, at=clock.t)
    assert send(honest, attrs(honest, key_of(victim)), "honest") == 200
    assert load(deps, "v1").latest_checkpoint == Checkpoint(100, ours)
    attacks = {
        "unsigned": (body(victim, "checkpoint", 900, checkpoint_uri=theirs, at=clock.t), None),
        "other run's key": (body(victim, "checkpoint", 900, checkpoint_uri=theirs, at=clock.t),
                            key_of(other)),
        # even the victim's own key (a buggy or subverted trainer) cannot name another run's
        "own key, other run": (body(victim, "checkpoint", 900, checkpoint_uri=theirs,
                                    at=clock.t), key_of(victim)),
        "own key, dot-dot": (body(victim, "checkpoint", 900, at=clock.t,
                                  checkpoint_uri=f"{victim.checkpoint_uri}/../o1/step-0000000900"),
                             key_of(victim)),
        "own key, not written": (body(victim, "checkpoint", 900, at=clock.t,
                                      checkpoint_uri=contract.checkpoint_uri(
                                          victim.checkpoint_uri, 900)), key_of(victim)),
    }
    before = load(deps, "v1")
    for n, (name, (data, key)) in enumerate(attacks.items()):
        assert send(data, attrs(data, key), f"attack-{n}") == 200, name
        reason = rejected(deps, f"attack-{n}", data)
        assert reason, name
        assert load(deps, "v1") == before, name
    assert "unsigned" in rejected(deps, "attack-0", attacks["unsigned"][0])
    # The worker is killed: attempt 2 resumes from the run's own checkpoint.
    launcher.set_status(launcher.job_of("v1", 1), JobPhase.FAILED,
                        failure=FailureClass.PREEMPTED)
    tick(deps)
    spec = launcher.jobs[launcher.job_of("v1", 2)].spec
    assert spec.env[contract.ENV_RESUME_FROM] == ours
    assert spec.env[contract.ENV_RESUME_STEP] == "100"


def test_forged_completed_reports_change_nothing_and_a_real_one_is_a_hint(deps: Deps) -> None:
    """Finding: five forged `completed` reports set progress to 1500/1500 (1,110 steps/s) while
    the real trainer was at step 150; none was recorded as rejected."""
    launcher, _, clock = parts(deps)
    victim = running(deps, "victim", "v1")
    clock.advance(10)
    real = body(victim, "progress", 150, at=clock.t)
    assert send(real, attrs(real, key_of(victim)), "real") == 200
    for i in range(5):
        clock.advance(0.3)
        forged = body(victim, "completed", TOTAL, at=clock.t, event_id=f"forged-{i}")
        assert send(forged, attrs(forged, None), f"forged-{i}") == 200
        assert "unsigned" in rejected(deps, f"forged-{i}", forged)
    after = load(deps, "v1")
    assert after.progress.step == 150 and after.status is RunStatus.RUNNING
    # A signed `completed` is believed only as a hint: progress moves when Vertex says so.
    clock.advance(5)
    done = body(victim, "completed", TOTAL, at=clock.t, metrics={"accuracy": 0.9})
    assert send(done, attrs(done, key_of(victim)), "done") == 200
    hinted = load(deps, "v1")
    assert hinted.progress.step == 150 and hinted.status is RunStatus.RUNNING
    assert hinted.current is not None and hinted.current.live
    assert hinted.progress.metrics == {"accuracy": 0.9}
    launcher.set_status(launcher.job_of("v1", 1), JobPhase.SUCCEEDED)
    tick(deps)
    confirmed = load(deps, "v1")
    assert confirmed.status is RunStatus.SUCCEEDED and confirmed.progress.step == TOTAL


@pytest.mark.parametrize("case", ["another attempt's key", "attribute names another attempt",
                                  "no attempt attribute", "unknown version", "flipped byte",
                                  "body re-encoded"])
def test_mis_signed_and_other_attempt_messages_are_refused(deps: Deps, case: str) -> None:
    launcher, _, clock = parts(deps)
    running(deps, "victim", "v1")
    launcher.set_status(launcher.job_of("v1", 1), JobPhase.FAILED,
                        failure=FailureClass.PREEMPTED)
    tick(deps)
    run = load(deps, "v1")
    launcher.set_status(launcher.job_of("v1", 2), JobPhase.RUNNING, start_time=clock.t)
    tick(deps)
    clock.advance(30)
    data = body(run, "progress", 40, attempt=2, at=clock.t)
    good = contract.sign_report(key_of(run, 2), data)
    attributes = attrs(data, key_of(run, 2), attempt=2)
    if case == "another attempt's key":
        attributes[contract.ATTR_SIGNATURE] = contract.sign_report(key_of(run, 1), data)
    elif case == "attribute names another attempt":
        attributes[contract.ATTR_ATTEMPT] = "1"
    elif case == "no attempt attribute":
        del attributes[contract.ATTR_ATTEMPT]
    elif case == "unknown version":
        attributes[contract.ATTR_SIGNATURE] = "v2=" + good.split("=", 1)[1]
    elif case == "flipped byte":
        attributes[contract.ATTR_SIGNATURE] = good[:-1] + ("0" if good[-1] != "0" else "1")
    else:
        data = json.dumps(json.loads(data), indent=1).encode()  # same JSON, other bytes
    before = load(deps, "v1")
    assert send(data, attributes, "bad") == 200
    reason = rejected(deps, "bad", data)
    assert load(deps, "v1") == before
    if case == "another attempt's key":
        assert "signed with attempt 1's key, reports on attempt 2" in reason
    # The same report, signed as the trainer helper signs it, is applied.
    fresh = body(run, "progress", 40, attempt=2, at=clock.t)
    assert send(fresh, attrs(fresh, key_of(run, 2), attempt=2), "good") == 200
    assert load(deps, "v1").progress.step == 40


def test_a_replayed_signed_message_cannot_move_anything(deps: Deps) -> None:
    """A captured message replayed later: deduplicated by its event id while the run remembers
    it; after that, an older step of its attempt moves neither progress, nor rate, nor loss."""
    _, _, clock = parts(deps)
    run = running(deps, "victim", "v1")
    key = key_of(run)
    clock.advance(10)
    spike = body(run, "progress", 10, at=clock.t, metrics={"loss": 1e6})
    assert send(spike, attrs(spike, key), "m1") == 200
    for step in range(20, 200, 10):
        clock.advance(10)
        data = body(run, "progress", step, at=clock.t, metrics={"loss": 1.0 / step})
        assert send(data, attrs(data, key), f"m{step}") == 200
    before = load(deps, "v1")
    assert send(spike, attrs(spike, key), "again") == 200  # a seen event id: nothing written
    assert load(deps, "v1") == before
    import dataclasses

    forgot, version = deps.runs.load("v1")
    assert forgot is not None
    deps.runs.save(dataclasses.replace(forgot, seen=()), version)  # as if 200 events later
    for i in range(4):
        assert send(spike, attrs(spike, key), f"replay-{i}") == 200
    after = load(deps, "v1")
    assert after.progress == before.progress and after.health.loss == before.health.loss
    assert after.status is RunStatus.RUNNING and after.health.rate == before.health.rate


# --- checkpoints -----------------------------------------------------------------------------------


@pytest.mark.parametrize(("uri", "words"), [
    ("gs://ckpt/victim/v1/step-0000000100", None),
    ("gs://ckpt/victim/v1/step-0000000100/", None),
    ("gs://ckpt/other/o1/step-0000000100", "not under the run's checkpoint root"),
    ("gs://elsewhere/victim/v1/step-0000000100", "not under the run's checkpoint root"),
    ("gs://ckpt/victim/v1/../o1/step-0000000100", "'..'"),
    ("gs://ckpt/victim/v1//step-0000000100", "empty"),
    ("gs://ckpt/victim/v1/./step-0000000100", "'.'"),
    ("gs://ckpt/victim/v1/step-0000000200", "newer than the report's step 100"),
    ("gs://ckpt/victim/v1/step-0000000040", None),  # `completed`, `preempting`: the last one
    ("gs://ckpt/victim/v1/step-0000000100/sub", "not a checkpoint directory of the run"),
    ("gs://ckpt/victim/v1/step-100", "not a checkpoint directory of the run"),
    ("gs://ckpt/victim/v10/step-0000000100", "not under"),
    # issue 39: a local disk's checkpoint was refused for "an empty, '.' or '..' segment"
    ("file:///tmp/ckpt/victim/v1/step-0000000100", "is a file:// URI; the run's checkpoints "
                                                    "are under 'gs://ckpt/victim/v1'"),
    ("/tmp/ckpt/step-0000000100", "a path with no scheme"),
])
def test_a_checkpoint_must_be_the_runs_own_of_its_step(uri: str, words: str | None) -> None:
    p = make_deps().pipelines["victim"]
    run = new_run(run_id="v1", pipeline=p, now=1.8e9, data_uri="gs://b/", snapshot_id=None)
    assert run.checkpoint_uri == "gs://ckpt/victim/v1"
    why = checkpoint_outside(run, uri, 100)
    assert (why is None) if words is None else (why is not None and words in why), why


def test_a_run_whose_checkpoints_are_on_a_local_disk_takes_its_file_uris() -> None:
    p = replace(make_deps().pipelines["victim"], checkpoint_uri="file:///tmp/ckpt/victim")
    run = new_run(run_id="v1", pipeline=p, now=1.8e9, data_uri="gs://b/", snapshot_id=None)
    assert checkpoint_outside(run, "file:///tmp/ckpt/victim/v1/step-0000000100", 100) is None
    why = checkpoint_outside(run, "file:///tmp/ckpt/victim/v1/../x/step-0000000100", 100)
    assert why is not None and "'..'" in why


def test_completed_and_preempting_name_the_last_checkpoint_at_its_own_step(deps: Deps) -> None:
    """The helper's `preempting` and `completed` carry the attempt's step and the last
    checkpoint it wrote, which may be older: the checkpoint counts at its own step."""
    _, store, clock = parts(deps)
    run = running(deps, "victim", "v1")
    last = store.put(run.checkpoint_uri, 200)
    clock.advance(30)
    data = body(run, "preempting", 240, checkpoint_uri=last, exit_code=143, at=clock.t)
    assert send(data, attrs(data, key_of(run)), "preempting") == 200
    after = load(deps, "v1")
    assert after.latest_checkpoint == Checkpoint(200, last)
    assert [c.step for c in after.health.checkpoints] == [200]


def test_a_checkpoint_that_is_not_complete_is_refused(deps: Deps) -> None:
    _, store, clock = parts(deps)
    run = running(deps, "victim", "v1")
    half = store.put(run.checkpoint_uri, 100, complete=False)  # cut off before its marker
    clock.advance(30)
    data = body(run, "checkpoint", 100, checkpoint_uri=half, at=clock.t)
    assert send(data, attrs(data, key_of(run)), "half") == 200
    assert "no complete checkpoint of step 100" in rejected(deps, "half", data)
    assert load(deps, "v1").latest_checkpoint is None


# --- plausibility and the rate estimate ---------------------------------------------------------------


def test_an_implausible_rate_never_feeds_the_rate_estimate() -> None:
    p = make_deps().pipelines["victim"]
    t0 = 1.8e9
    run = new_run(run_id="v1", pipeline=p, now=t0, data_uri="gs://b/", snapshot_id=None)
    from spotorch.core.model import JobStatus
    from spotorch.core.observations import JobObserved

    job = "projects/p/locations/us-central1/customJobs/1"
    run = decide(run, JobObserved(1, JobStatus(job, JobPhase.RUNNING, start_time=t0)),
                 Context(p, t0))
    run = decide(run, TrainerReported(1, "progress", t0 + 10, step=100, total_steps=10**9),
                 Context(p, t0 + 10))
    run = decide(run, TrainerReported(1, "progress", t0 + 20, step=200), Context(p, t0 + 20))
    assert run.progress.rate == pytest.approx(10.0)
    # 100 steps in a millisecond passes the report check (a second's slack) but is no rate.
    burst = decide(run, TrainerReported(1, "progress", t0 + 20.001, step=300),
                   Context(p, t0 + 21))
    assert burst.progress.step == 300 and burst.progress.rate == pytest.approx(10.0)


def test_a_report_from_the_future_is_refused() -> None:
    from spotorch.core.trust import implausible

    p = make_deps().pipelines["victim"]
    run = new_run(run_id="v1", pipeline=p, now=1.8e9, data_uri="gs://b/", snapshot_id=None)
    why = implausible(run, TrainerReported(1, "progress", 1.8e9 + 3600, step=1), 1.8e9)
    assert why is not None and "future" in why


# --- the key never leaks ------------------------------------------------------------------------------


def test_the_key_is_in_no_view_event_log_or_record(deps: Deps,
                                                   caplog: pytest.LogCaptureFixture) -> None:
    import functions_framework

    from spotorch.app.runs import run_summary
    from spotorch.app.views import run_row, run_view
    from test_functions import MAIN

    caplog.set_level(logging.DEBUG)
    launcher, store, clock = parts(deps)
    run = running(deps, "victim", "v1")
    key = key_of(run)
    clock.advance(10)
    good = body(run, "checkpoint", 10, checkpoint_uri=store.put(run.checkpoint_uri, 10),
                at=clock.t)
    send(good, attrs(good, key), "good")
    bad = body(run, "progress", 20, at=clock.t)
    send(bad, attrs(bad, "0" * 64), "bad")  # recorded as rejected, with its payload
    launcher.set_status(launcher.job_of("v1", 1), JobPhase.SUCCEEDED)
    tick(deps)
    run = load(deps, "v1")
    api = functions_framework.create_app("api", MAIN, "http").test_client()
    outputs = {
        "api GET /run": api.get("/run?run_id=v1").get_data(as_text=True),
        "api GET /runs": api.get("/runs").get_data(as_text=True),
        "run_view": json.dumps(run_view(run, deps.pipelines["victim"], clock.t), default=str),
        "run_row": json.dumps(run_row(run, deps.pipelines["victim"], clock.t), default=str),
        "run_summary": json.dumps(run_summary(run), default=str),
        "events": json.dumps(deps.publisher.events, default=str),  # type: ignore[attr-defined]
        "logs": "\n".join(r.getMessage() + repr(r.__dict__) for r in caplog.records),
        "rejected": json.dumps(deps.docs.get("rejected_events", "bad")[0], default=str),
        "repr": repr(run),
    }
    for name, text in outputs.items():
        assert key not in text, name
    assert deps.docs.get("rejected_events", "bad")[0] is not None
    # Where it is: the run document (with the attempt) and the job's environment.
    doc, _ = deps.docs.get("runs", "v1")
    assert doc is not None and doc["attempts"][0]["report_key"] == key


def test_the_trainer_helper_signs_what_spotorch_verifies() -> None:
    from spotorch_trainer import TrainerEnv, event_message

    env = TrainerEnv.from_env({contract.ENV_RUN_ID: "v1", contract.ENV_ATTEMPT: "2",
                               contract.ENV_REPORT_KEY: "k" * 64})
    assert "k" * 64 not in repr(env)
    data, attributes = event_message(env, "progress", now=1.8e9, step=3)
    assert attributes[contract.ATTR_ATTEMPT] == "2"
    assert attributes[contract.ATTR_SIGNATURE].startswith("v1=")
    assert contract.signature_problem("k" * 64, data, attributes[contract.ATTR_SIGNATURE]) is None
    assert contract.signature_problem("x" * 64, data, attributes[contract.ATTR_SIGNATURE])
    unsigned = event_message(TrainerEnv(run_id="v1"), "progress", now=1.8e9, step=3)[1]
    assert contract.ATTR_SIGNATURE not in unsigned
