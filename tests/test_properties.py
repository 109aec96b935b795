"""Property tests: duplicated, reordered and late events lead a run to one consistent outcome."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from spotorch.core.context import Context
from spotorch.core.decide import decide, new_run
from spotorch.core.intents import LaunchIntent
from spotorch.core.model import Checkpoint, FailureClass, JobPhase, JobStatus, Run, RunStatus
from spotorch.core.observations import JobObserved, LaunchDone, Observation, TrainerReported
from spotorch.core.pipeline import EscalationKind, Pipeline, RecoveryPolicy, Trigger

T0 = 1_800_000_000.0
P = Pipeline(name="p", trigger=Trigger(bucket="b"), checkpoint_uri="gs://c", output_uri="gs://m",
             recovery=RecoveryPolicy(escalation=EscalationKind.NEVER, max_no_progress_attempts=99))


def as_launch(intent: object) -> LaunchIntent:
    """The launch intent a test expects (narrowed for the type checker)."""
    assert isinstance(intent, LaunchIntent)
    return intent


def launch_all(run: Run, now: float) -> Run:
    """Carry out pending launches (job names are deterministic: job-<attempt>)."""
    for intent in [as_launch(i) for i in run.outbox if i.kind == "launch"]:
        run = decide(run, LaunchDone(intent.id, intent.attempt, f"job-{intent.attempt}"),
                     Context(P, now))
    return run


def story_events(ending: JobPhase) -> list[tuple[int, Observation]]:
    """The events of attempt 1, tagged with the attempt they belong to."""
    ended = JobStatus("job-1", ending,
                      failure=FailureClass.PREEMPTED if ending is JobPhase.FAILED else None)
    return [
        (1, JobObserved(1, JobStatus("job-1", JobPhase.QUEUED))),
        (1, JobObserved(1, JobStatus("job-1", JobPhase.PENDING))),
        (1, JobObserved(1, JobStatus("job-1", JobPhase.RUNNING))),
        (1, TrainerReported(1, "progress", T0 + 5, step=10, total_steps=100)),
        (1, TrainerReported(1, "checkpoint", T0 + 6, step=20, total_steps=100,
                            checkpoint_uri="gs://c/r/step-20")),
        (1, JobObserved(1, ended, Checkpoint(20, "gs://c/r/step-20"))),
    ]


def outcome(run: Run) -> tuple[object, ...]:
    """What must not depend on delivery order: status, attempts and how each ended, counters."""
    return (run.status, run.counters,
            tuple((a.number, a.capacity, a.state, a.failure, a.resumed_from_step)
                  for a in run.attempts),
            run.latest_checkpoint)


def play(order: list[tuple[int, Observation]]) -> Run:
    run = launch_all(new_run(run_id="r", pipeline=P, now=T0, data_uri="d", snapshot_id=None), T0)
    for i, (_, obs) in enumerate(order):
        run = launch_all(decide(run, obs, Context(P, T0 + 10 + i)), T0 + 10 + i)
    return run


@settings(max_examples=200, deadline=None)
@given(st.data(), st.sampled_from([JobPhase.SUCCEEDED, JobPhase.FAILED]))
def test_any_order_and_duplication_of_a_story_gives_the_same_outcome(
        data: st.DataObject, ending: JobPhase) -> None:
    events = story_events(ending)
    expected = outcome(play(events))
    dupes = data.draw(st.lists(st.sampled_from(events), max_size=8))
    shuffled = data.draw(st.permutations(events + dupes))
    assert outcome(play(list(shuffled))) == expected


@settings(max_examples=100, deadline=None)
@given(st.data())
def test_a_terminal_event_is_final_whatever_arrives_after_it(data: st.DataObject) -> None:
    events = story_events(JobPhase.SUCCEEDED)
    late = data.draw(st.lists(st.sampled_from(events), max_size=10))
    run = play(events + late)
    assert run.status is RunStatus.SUCCEEDED and len(run.attempts) == 1


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=5), max_size=20))
def test_repeated_preemption_reports_count_once(repeats: list[int]) -> None:
    preempted = JobObserved(1, JobStatus("job-1", JobPhase.FAILED,
                                         failure=FailureClass.PREEMPTED))
    run = play([(1, preempted)] * (1 + len(repeats)))
    assert run.counters.preemptions == 1 and len(run.attempts) == 2
    launches = [i for i in run.outbox if i.kind == "launch"]
    assert launches == []  # every decided launch was carried out exactly once
