"""The promotion gate as a use case (spotorch.app.promotions): runs registered through the real
registration path take the production alias only when they pass; concurrent promotions and
redeliveries promote at most once, in memory and on the Firestore emulator."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest

from fakes import fake_deps
from spotorch.adapters.memory.registry import MemoryModelRegistry
from spotorch.adapters.memory.twins import InMemoryLauncher, InMemoryPublisher, ManualClock
from spotorch.app import promotions
from spotorch.app.deps import Deps
from spotorch.app.job_events import job_changed, trainer_reported
from spotorch.app.runs import start_run
from spotorch.core.events import kind_of
from spotorch.core.model import JobPhase, Progress, Run, RunStatus
from spotorch.core.observations import TrainerReported
from spotorch.core.pipeline import Pipeline, Trigger
from spotorch.core.promotion import Evaluation, PromotionPolicy
from spotorch.core.sweep_spec import ModelRegistration
from spotorch.local.emulators import EmulatorSet
from spotorch.ports.registry import ModelUpload, RegistryError
from spotorch.spec.event_schemas import validate_event

MODEL = "projects/proj/locations/us-central1/models/churn"


def pipeline(**promote: object) -> Pipeline:
    return Pipeline(name="churn", trigger=Trigger(bucket="b"), checkpoint_uri="gs://c/churn",
                    output_uri="gs://m/churn",
                    model=ModelRegistration(
                        serving_image="img", evaluation=Evaluation(data_uri="gs://b/holdout/"),
                        promote=PromotionPolicy(metric="accuracy", min_improvement=0.01,
                                                **promote)))  # type: ignore[arg-type]


def make(**promote: object) -> tuple[Deps, MemoryModelRegistry]:
    deps = fake_deps(pipeline(**promote))
    registry = MemoryModelRegistry("proj")
    deps.models = registry
    return deps, registry


def train(deps: Deps, run_id: str, accuracy: float) -> Run:
    """A run from start to registration, its trainer reporting accuracy on the held-out data."""
    clock = deps.clock
    assert isinstance(clock, ManualClock)
    clock.advance(3600)  # each run on newer data
    start_run(deps, "churn", run_id=run_id, data_uri=f"gs://b/d/{run_id}/", snapshot_id=run_id,
              reason="t")
    trainer_reported(deps, run_id, TrainerReported(1, "progress", clock.now(), step=10,
                                                   metrics={"loss": 0.1,
                                                            "eval_accuracy": accuracy}))
    launcher = deps.launcher
    assert isinstance(launcher, InMemoryLauncher)
    job_changed(deps, run_id, 1, launcher.set_status(launcher.job_of(run_id, 1),
                                                     JobPhase.SUCCEEDED), event_id=f"ok-{run_id}")
    run = deps.runs.load(run_id)[0]
    assert run is not None and run.status is RunStatus.SUCCEEDED and run.model_name
    return run


def model_events(deps: Deps) -> list[dict[str, object]]:
    publisher = deps.publisher
    assert isinstance(publisher, InMemoryPublisher)
    return [e for e in publisher.events if kind_of(str(e["type"])).startswith("model.")]


def holder(registry: MemoryModelRegistry, alias: str = "production") -> list[str]:
    return [v.version_id for v in registry.versions[MODEL] if alias in v.aliases]


def test_three_runs_first_promoted_worse_refused_better_promoted() -> None:
    deps, registry = make()
    train(deps, "r1", 0.874)
    assert holder(registry) == ["1"]
    train(deps, "r2", 0.706)
    assert holder(registry) == ["1"]  # the worse one is registered without the alias
    assert holder(registry, "latest") == ["2"]  # latest keeps its meaning
    train(deps, "r3", 0.91)
    assert holder(registry) == ["3"]
    events = model_events(deps)
    assert [kind_of(str(e["type"])) for e in events] == \
        ["model.promoted", "model.rejected", "model.promoted"]
    assert all(validate_event(e) == [] for e in events)
    rejected = events[1]["data"]
    assert isinstance(rejected, dict)
    assert "0.706 does not beat the champion's 0.874" in rejected["reason"]
    assert rejected["champion"] == f"{MODEL}@1" and rejected["rule"] == "margin"
    promoted = events[2]["data"]
    assert isinstance(promoted, dict) and promoted["replaced"] == f"{MODEL}@1"
    record = promotions.champion_record(deps, MODEL)
    assert record is not None and record.champion is not None
    assert record.champion.version == f"{MODEL}@3"
    assert [d.promoted for d in record.decisions] == [True, False, True]
    # the held-out data is on every version (labels) and the same for all three
    evals = {registry.version(f"{MODEL}@{v}").labels["spotorch_eval"] for v in (1, 2, 3)}
    assert len(evals) == 1


def test_a_run_over_the_latency_budget_is_refused_and_says_so() -> None:
    deps, registry = make(max_latency_p95_ms=5.0)
    train(deps, "r1", 0.9)  # reports no latency
    assert holder(registry) == []
    (event,) = model_events(deps)
    assert kind_of(str(event["type"])) == "model.rejected"
    assert "no p95 prediction latency" in str(event["data"]["reason"])  # type: ignore[index]


def test_a_failed_alias_move_is_retried_and_decides_nothing_twice() -> None:
    deps, registry = make()
    run = train(deps, "r1", 0.874)
    assert run.model_name is not None
    registry.fail_next = RegistryError("unavailable", permanent=False, code="UNAVAILABLE")
    deps.docs.put("model_champions", promotions.record_key(MODEL), {
        "model": MODEL, "alias": "production", "champion": None, "decisions": []},
        deps.docs.get("model_champions", promotions.record_key(MODEL))[1])  # forget it
    with pytest.raises(RegistryError):
        promotions.after_registration(deps, run, run.model_name)  # decided, alias not moved
    decision = promotions.after_registration(deps, run, run.model_name)  # the retry
    assert decision is not None and decision.promoted and holder(registry) == ["1"]
    record = promotions.champion_record(deps, MODEL)
    assert record is not None and len(record.decisions) == 1
    ids = {e["id"] for e in model_events(deps)}
    assert ids == {"r1:900000"}  # every publish of the decision has the same id


def candidate_run(deps: Deps, registry: MemoryModelRegistry, run_id: str, accuracy: float,
                  created_at: float) -> tuple[Run, str]:
    name = registry.upload(ModelUpload(pipeline="churn", run_id=run_id, region="us-central1",
                                       display_name="churn", artifact_uri=f"gs://m/{run_id}",
                                       serving_image="img", labels={"spotorch_run": run_id}))
    run = Run(run_id=run_id, pipeline="churn", status=RunStatus.SUCCEEDED, created_at=created_at,
              data_uri=f"gs://b/d/{run_id}/", checkpoint_uri="gs://c/x", output_uri="gs://m/x",
              progress=Progress(metrics={"eval_accuracy": accuracy}), model_name=name)
    return run, name


def race(calls: list[Callable[[], object]]) -> list[BaseException]:
    barrier = threading.Barrier(len(calls))
    errors: list[BaseException] = []

    def go(call: Callable[[], object]) -> None:
        barrier.wait()
        try:
            call()
        except BaseException as exc:  # reported by the test
            errors.append(exc)
    threads = [threading.Thread(target=go, args=(c,)) for c in calls]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return errors


def concurrent_promotions(deps: Deps, registry: MemoryModelRegistry, copies: int) -> None:
    """Two runs ending together, each delivered `copies` times at once: at most the better one
    ends holding the alias, each version is decided once, every event of a version is the same."""
    worse, worse_name = candidate_run(deps, registry, "ra", 0.80, created_at=1000.0)
    better, better_name = candidate_run(deps, registry, "rb", 0.90, created_at=2000.0)
    calls: list[Callable[[], object]] = []
    for _ in range(copies):
        calls.append(lambda: promotions.after_registration(deps, worse, worse_name))
        calls.append(lambda: promotions.after_registration(deps, better, better_name))
    assert race(calls) == []
    record = promotions.champion_record(deps, MODEL)
    assert record is not None and record.champion is not None
    assert record.champion.version == better_name
    assert sorted(d.version for d in record.decisions) == sorted([worse_name, better_name])
    assert holder(registry) == [better_name.rsplit("@", 1)[1]]
    kinds: dict[str, set[str]] = {}
    for event in model_events(deps):
        kinds.setdefault(str(event["id"]), set()).add(str(event["type"]))
    assert set(kinds) == {"ra:900000", "rb:900000"} and all(len(k) == 1 for k in kinds.values())
    # the better one always ends promoted; the worse one promoted only if it came first
    assert kinds["rb:900000"] == {"dev.spotorch.model.promoted.v1"}
    promoted = [d for d in record.decisions if d.promoted]
    assert promoted[-1].version == better_name


def test_concurrent_promotions_and_redeliveries_in_memory() -> None:
    for _ in range(5):  # several interleavings
        deps, registry = make()
        concurrent_promotions(deps, registry, copies=3)


@pytest.mark.emulator
def test_concurrent_promotions_and_redeliveries_on_firestore(
        firestore_emulator: EmulatorSet) -> None:
    from spotorch.adapters.gcp.firestore import FirestoreDocumentStore

    deps, registry = make()
    deps.docs = FirestoreDocumentStore(project=firestore_emulator.project)
    concurrent_promotions(deps, registry, copies=2)


def contend(monkeypatch: pytest.MonkeyPatch, deps: Deps, collection: str,
            conflicts: int) -> list[str]:
    """The next `conflicts` writes of the collection lose a race (ConflictError, nothing
    written); the keys of the writes that landed are returned as they happen. No pauses."""
    from spotorch.app import updates
    from spotorch.ports.store import ConflictError

    monkeypatch.setattr(updates, "pause", lambda attempt, backoff_s=0.0: None)
    real, left, landed = deps.docs.put, [conflicts], []

    def put(name: str, key: str, data: object, version: object, adds: object = ()) -> object:
        if name == collection and left[0] > 0:
            left[0] -= 1
            raise ConflictError("a racing writer")
        if name == collection:
            landed.append(key)
        return real(name, key, data, version, adds)  # type: ignore[arg-type]
    monkeypatch.setattr(deps.docs, "put", put)
    return landed


def test_champion_writes_go_through_the_one_loop_and_publish_once_after_the_write(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from spotorch.app.updates import WRITE_ATTEMPTS
    from spotorch.ports.store import ConflictError

    deps, registry = make()
    run, name = candidate_run(deps, registry, "ra", 0.80, created_at=1000.0)
    landed = contend(monkeypatch, deps, "model_champions", conflicts=WRITE_ATTEMPTS)
    with pytest.raises(ConflictError, match="champion record of"):
        promotions.after_registration(deps, run, name)  # every attempt lost: nothing decided
    assert landed == [] and model_events(deps) == [] and holder(registry) == []
    assert promotions.champion_record(deps, MODEL) is None
    landed = contend(monkeypatch, deps, "model_champions", conflicts=2)
    decision = promotions.after_registration(deps, run, name)  # the redelivery, after 2 losses
    assert decision is not None and decision.promoted and len(landed) == 1
    assert promotions.after_registration(deps, run, name) == decision  # decided: no write
    assert len(landed) == 1 and holder(registry) == ["1"]
    assert {str(e["id"]) for e in model_events(deps)} == {"ra:900000"}


def test_an_operators_promotion_writes_and_publishes_once(
        monkeypatch: pytest.MonkeyPatch) -> None:
    deps, registry = make()
    first, first_name = candidate_run(deps, registry, "ra", 0.90, created_at=1000.0)
    second, second_name = candidate_run(deps, registry, "rb", 0.50, created_at=2000.0)
    promotions.after_registration(deps, first, first_name)
    landed = contend(monkeypatch, deps, "model_champions", conflicts=1)
    p = deps.pipeline("churn")
    record = promotions.force(deps, p, second, second_name, "hotfix")
    again = promotions.force(deps, p, second, second_name, "hotfix")  # repeated: no change
    assert len(landed) == 1 and record == again
    assert record.champion is not None and record.champion.version == second_name
    assert record.previous is not None and record.previous.version == first_name
    assert record.decisions[-1].rule == "operator" and holder(registry) == ["2"]
    promoted = [e for e in model_events(deps) if e["id"] == "rb:900000"]
    assert len(promoted) == 1 and kind_of(str(promoted[0]["type"])) == "model.promoted"
