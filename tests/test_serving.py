"""Serving a promoted version with a canary (issue 37): the first promoted version serves, a
worse one changes nothing, a better one takes a canary share and then all traffic (the old one
undeployed); a canary with errors is rolled back and its promotion undone; one rollout at a time
per endpoint; a crash in the middle is repaired by the tick. In memory."""

from __future__ import annotations

from collections.abc import Mapping

import pytest

from fakes import fake_deps
from spotorch.adapters.memory.endpoints import MemoryEndpoints
from spotorch.adapters.memory.registry import MemoryModelRegistry
from spotorch.adapters.memory.twins import ManualClock
from spotorch.app import promotions, serving
from spotorch.app.deps import Deps
from spotorch.app.tick import tick
from spotorch.core.canary import ServeSpec
from spotorch.core.pipeline import Pipeline, Trigger
from spotorch.core.promotion import Evaluation, PromotionPolicy
from spotorch.core.sweep_spec import ModelRegistration
from spotorch.ports.serving import ServingError
from test_promotions import MODEL, train

ENDPOINT = "projects/proj/locations/us-central1/endpoints/churn-prod"


def make() -> tuple[Deps, MemoryModelRegistry, MemoryEndpoints]:
    p = Pipeline(name="churn", trigger=Trigger(bucket="b"), checkpoint_uri="gs://c/churn",
                 output_uri="gs://m/churn",
                 model=ModelRegistration(
                     serving_image="img", evaluation=Evaluation(data_uri="gs://b/holdout/"),
                     promote=PromotionPolicy(metric="accuracy", min_improvement=0.01),
                     serve=ServeSpec(endpoint="churn-prod", canary_percent=20, canary_minutes=1,
                                     max_error_rate=0.1, min_predictions=5)))
    deps = fake_deps(p)
    registry = MemoryModelRegistry("proj")
    endpoints = MemoryEndpoints("proj")
    endpoints.default = lambda rows: [0.0 for _ in rows]
    clock = deps.clock
    assert isinstance(clock, ManualClock)
    endpoints.clock = clock.now
    deps.models, deps.endpoints, deps.endpoint_traffic = registry, endpoints, endpoints
    return deps, registry, endpoints


def serving_version(deps: Deps) -> tuple[str | None, dict[str, int], list[str]]:
    endpoints = deps.endpoints
    assert endpoints is not None
    state = endpoints.get(ENDPOINT)
    ids = {d.id: d.model.rsplit("@", 1)[1] for d in state.deployed}
    rollout = serving.rollout_of(deps, deps.pipeline("churn"))
    assert rollout is not None
    return rollout.serving, {ids[k]: v for k, v in state.traffic.items()}, sorted(ids.values())


def traffic(endpoints: MemoryEndpoints, n: int = 30) -> int:
    failed = 0
    for _ in range(n):
        try:
            endpoints.predict(ENDPOINT, [[1.0]])
        except ServingError:
            failed += 1
    return failed


def alias_on(registry: MemoryModelRegistry) -> list[str]:
    return [v.version_id for v in registry.versions[MODEL] if "production" in v.aliases]


def advance(deps: Deps, seconds: float) -> None:
    clock = deps.clock
    assert isinstance(clock, ManualClock)
    clock.advance(seconds)
    tick(deps)


def test_first_serves_worse_is_refused_better_canaries_then_takes_all_traffic() -> None:
    deps, registry, endpoints = make()
    train(deps, "r1", 0.80)
    assert serving_version(deps) == (f"{MODEL}@1", {"1": 100}, ["1"])
    train(deps, "r2", 0.70)
    assert serving_version(deps) == (f"{MODEL}@1", {"1": 100}, ["1"])  # refused: no change
    train(deps, "r3", 0.90)
    assert serving_version(deps) == (f"{MODEL}@1", {"1": 80, "3": 20}, ["1", "3"])
    assert alias_on(registry) == ["3"]
    assert traffic(endpoints) == 0
    advance(deps, 30)  # the window has not passed
    assert serving_version(deps)[1] == {"1": 80, "3": 20}
    advance(deps, 40)
    assert serving_version(deps) == (f"{MODEL}@3", {"3": 100}, ["3"])  # v1 undeployed
    assert alias_on(registry) == ["3"]
    # node-hours priced by the one price table: v1 from its deploy to its undeploy, v3 since
    # its deploy; n1-standard-2 at Compute Engine's list price
    from spotorch.app.releases import models_view
    from spotorch.core.cost import machine_hourly

    deps.project = "proj"
    endpoint = models_view(deps, "churn")["endpoint"]
    rate, _ = machine_hourly("n1-standard-2", "us-central1", deps.prices)
    assert rate is not None and endpoint["node_hours"] > 0
    assert endpoint["cost"] == pytest.approx(endpoint["node_hours"] * rate, rel=1e-3)
    rollout = serving.rollout_of(deps, deps.pipeline("churn"))
    assert rollout is not None and [s[4] is None for s in rollout.spans] == [False, True]


def test_a_canary_with_errors_is_rolled_back_and_its_promotion_undone() -> None:
    deps, registry, endpoints = make()
    train(deps, "r1", 0.80)
    train(deps, "r2", 0.90)
    state = endpoints.get(ENDPOINT)
    canary_id = next(d.id for d in state.deployed if d.model.endswith("@2"))
    endpoints.errors[canary_id] = 1.0
    assert traffic(endpoints, 50) > 0
    advance(deps, 5)
    assert serving_version(deps) == (f"{MODEL}@1", {"1": 100}, ["1"])
    assert alias_on(registry) == ["1"]  # the promotion is undone
    record = promotions.champion_record(deps, MODEL)
    assert record is not None and record.champion is not None
    assert record.champion.version == f"{MODEL}@1"
    assert record.decisions[-1].rule == "rollback" and "error rate" in record.decisions[-1].reason
    rollout = serving.rollout_of(deps, deps.pipeline("churn"))
    assert rollout is not None and "error rate" in rollout.reason
    # a redelivered registration of the rolled-back version neither promotes nor deploys it
    run = deps.runs.load("r2")[0]
    assert run is not None and run.model_name is not None
    from spotorch.app import releases
    releases.after_registration(deps, run, run.model_name)
    assert serving_version(deps) == (f"{MODEL}@1", {"1": 100}, ["1"])
    assert alias_on(registry) == ["1"]


def test_one_rollout_at_a_time_the_next_waits_for_the_canary() -> None:
    deps, _, endpoints = make()
    train(deps, "r1", 0.80)
    train(deps, "r2", 0.85)
    train(deps, "r3", 0.90)  # promoted while r2's canary runs: it waits
    assert serving_version(deps) == (f"{MODEL}@1", {"1": 80, "2": 20}, ["1", "2"])
    rollout = serving.rollout_of(deps, deps.pipeline("churn"))
    assert rollout is not None and rollout.pending == f"{MODEL}@3"
    traffic(endpoints)
    advance(deps, 70)  # r2 passes; r3 starts as the next canary at once
    assert serving_version(deps) == (f"{MODEL}@2", {"2": 80, "3": 20}, ["2", "3"])


def test_a_crash_in_the_middle_of_a_step_is_repaired_by_the_tick() -> None:
    deps, registry, endpoints = make()
    train(deps, "r1", 0.80)
    train(deps, "r2", 0.90)
    traffic(endpoints)
    real = endpoints.undeploy
    calls = []

    def crash(endpoint: str, deployed_model_id: str, split: Mapping[str, int]) -> None:
        calls.append(deployed_model_id)
        raise RuntimeError("the function died")
    endpoints.undeploy = crash  # type: ignore[method-assign,assignment]
    clock = deps.clock
    assert isinstance(clock, ManualClock)
    clock.advance(70)
    assert serving.reconcile_rollouts(deps) == []  # logged, not raised: the others go on
    assert calls  # the traffic moved, the undeploy died before the record was written
    rollout = serving.rollout_of(deps, deps.pipeline("churn"))
    assert rollout is not None and rollout.phase == "finishing"
    endpoints.undeploy = real  # type: ignore[method-assign]
    tick(deps)
    assert serving_version(deps) == (f"{MODEL}@2", {"2": 100}, ["2"])
    assert alias_on(registry) == ["2"]


def test_operators_list_roll_back_and_promote_through_the_api(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from test_api import _client

    deps, registry, _ = make()
    deps.project = "proj"
    client = _client(monkeypatch, deps)
    train(deps, "r1", 0.80)
    train(deps, "r2", 0.70)
    train(deps, "r3", 0.90)
    view = client.get("/models?pipeline=churn").get_json()
    assert view["champion"] == f"{MODEL}@3" and view["alias"] == "production"
    assert [(v["name"][-2:], v["promoted"]) for v in view["versions"]] == \
        [("@3", True), ("@2", False), ("@1", True)]
    assert "does not beat" in view["versions"][1]["reason"]
    assert view["endpoint"]["phase"] == "canary"
    assert view["endpoint"]["traffic_split"] == {f"{MODEL}@1": 80, f"{MODEL}@3": 20}
    back = client.post("/rollback", json={"endpoint": "churn-prod", "reason": "looks odd"})
    assert back.status_code == 200, back.get_json()
    assert back.get_json()["endpoint"]["traffic_split"] == {f"{MODEL}@1": 100}
    assert back.get_json()["champion"] == f"{MODEL}@1" and alias_on(registry) == ["1"]
    again = client.post("/rollback", json={"endpoint": "churn-prod"})
    assert again.status_code == 409 and "nothing to roll back" in again.get_json()["error"]
    forced = client.post("/promote", json={"version": f"{MODEL}@2"})
    assert forced.status_code == 200, forced.get_json()
    assert forced.get_json()["champion"] == f"{MODEL}@2" and alias_on(registry) == ["2"]
    assert forced.get_json()["endpoint"]["traffic_split"] == {f"{MODEL}@1": 80, f"{MODEL}@2": 20}
    assert client.post("/promote", json={"version": f"{MODEL}@9"}).status_code == 409
    assert client.get("/models").status_code == 400  # no pipeline named


@pytest.mark.emulator
def test_the_rollout_and_champion_records_on_firestore(firestore_emulator: object) -> None:
    """The same story with the champion and rollout records in the Firestore emulator: the
    documents round-trip and the conditional writes hold."""
    from spotorch.adapters.gcp.firestore import FirestoreDocumentStore

    deps, registry, endpoints = make()
    deps.docs = FirestoreDocumentStore(project=firestore_emulator.project)  # type: ignore[attr-defined]
    train(deps, "r1", 0.80)
    train(deps, "r2", 0.90)
    assert serving_version(deps) == (f"{MODEL}@1", {"1": 80, "2": 20}, ["1", "2"])
    traffic(endpoints)
    advance(deps, 70)
    assert serving_version(deps) == (f"{MODEL}@2", {"2": 100}, ["2"])
    record = promotions.champion_record(deps, MODEL)
    assert record is not None and record.champion is not None and record.previous is not None
    assert (record.champion.version, record.previous.version) == (f"{MODEL}@2", f"{MODEL}@1")
    assert alias_on(registry) == ["2"]


def test_the_models_page_of_the_web_view() -> None:
    from spotorch.app import releases
    from spotorch.operate.ui.server import UIServer
    from test_ui import backend_of

    deps, _, _ = make()
    deps.project = "proj"
    train(deps, "r1", 0.80)
    train(deps, "r2", 0.70)
    train(deps, "r3", 0.90)

    class Api:
        def post(self, action: str, body: Mapping[str, str]) -> dict[str, object]:
            assert action == "models"
            return releases.models_view(deps, body["pipeline"])

    backend = backend_of(deps)
    backend.actions = Api()
    status, _, raw = UIServer(backend, port=0, refresh_s=3).respond("/models/churn", {})
    body = raw.decode()
    assert status == 200
    assert body.count('class="version"') == 3 and "does not beat" in body
    assert "churn@3" in body and "80%" in body and "20%" in body and "node-hours" in body


def test_rollout_writes_that_lose_a_race_take_the_step_again(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Every rollout write goes through app.updates' loop: a lost race reads the record again
    and takes the step due now (idempotent calls: one deployment each); after the last
    attempt the ConflictError propagates (the registration intent is retried)."""
    from spotorch.app.updates import WRITE_ATTEMPTS
    from spotorch.ports.store import ConflictError
    from test_promotions import contend

    deps, registry, _ = make()
    landed = contend(monkeypatch, deps, "endpoint_rollouts", conflicts=3)
    train(deps, "r1", 0.80)
    assert serving_version(deps) == (f"{MODEL}@1", {"1": 100}, ["1"])
    assert landed and alias_on(registry) == ["1"]
    train(deps, "r2", 0.90)
    assert serving_version(deps) == (f"{MODEL}@1", {"1": 80, "2": 20}, ["1", "2"])
    contend(monkeypatch, deps, "endpoint_rollouts", conflicts=WRITE_ATTEMPTS)
    with pytest.raises(ConflictError, match="rollout"):
        serving.abort_canary(deps, deps.pipeline("churn"), "by hand")
    rollout = serving.rollout_of(deps, deps.pipeline("churn"))
    assert rollout is not None and rollout.phase == "canary"  # nothing written
    contend(monkeypatch, deps, "endpoint_rollouts", conflicts=1)
    serving.abort_canary(deps, deps.pipeline("churn"), "by hand")
    assert serving_version(deps) == (f"{MODEL}@1", {"1": 100}, ["1"])
    assert alias_on(registry) == ["1"]


def test_a_deployment_is_started_once_while_its_operation_runs_and_ticks_poll_it() -> None:
    """DeployModel is not idempotent and takes minutes on Vertex: the writer that claims the
    deployment starts it once; ticks (and a redelivered registration) meanwhile poll the
    recorded operation, never deploy again."""
    deps, _registry, endpoints = make()
    train(deps, "r1", 0.80)
    endpoints.running = True
    train(deps, "r2", 0.90)
    rollout = serving.rollout_of(deps, deps.pipeline("churn"))
    assert rollout is not None and rollout.phase == "deploying" and rollout.operation
    for _ in range(3):
        advance(deps, 60)
    run = deps.runs.load("r2")[0]
    assert run is not None and run.model_name is not None
    from spotorch.app import releases
    releases.after_registration(deps, run, run.model_name)
    assert endpoints.deploys == 2  # one per version
    endpoints.running = False
    advance(deps, 1)
    assert serving_version(deps) == (f"{MODEL}@1", {"1": 80, "2": 20}, ["1", "2"])
    assert endpoints.deploys == 2


def test_a_lost_write_after_starting_a_deployment_does_not_start_another(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from test_promotions import contend

    deps, _, endpoints = make()
    train(deps, "r1", 0.80)
    original = deps.docs.put
    calls: list[str] = []

    def put(name: str, key: str, data: object, version: object, adds: object = ()) -> object:
        if name == "endpoint_rollouts" and isinstance(data, dict) and data.get("operation") \
                and not calls:
            calls.append(str(data["operation"]))  # the first write of the operation loses
            from spotorch.ports.store import ConflictError
            raise ConflictError("a racing writer")
        return original(name, key, data, version, adds)  # type: ignore[arg-type]
    contend(monkeypatch, deps, "endpoint_rollouts", conflicts=0)
    monkeypatch.setattr(deps.docs, "put", put)
    train(deps, "r2", 0.90)
    assert calls and endpoints.deploys == 2
    assert serving_version(deps) == (f"{MODEL}@1", {"1": 80, "2": 20}, ["1", "2"])


def test_a_lapsed_claim_is_taken_over_and_a_deployment_already_there_adopted() -> None:
    from dataclasses import replace

    from spotorch.core.canary import CLAIM_TTL_S

    deps, _, endpoints = make()
    train(deps, "r1", 0.80)
    endpoints.running = True
    train(deps, "r2", 0.90)
    rollout = serving.rollout_of(deps, deps.pipeline("churn"))
    assert rollout is not None
    # the claimant died after DeployModel was sent, before it wrote the operation down
    _doc, version = deps.docs.get("endpoint_rollouts", rollout.key)
    deps.docs.put("endpoint_rollouts", rollout.key,
                  {**replace(rollout, operation=None, claim="dead").to_doc(),
                   "pipeline": "churn"}, version)
    endpoints.running = False
    advance(deps, 60)  # the claim has not lapsed: nobody deploys
    assert serving.rollout_of(deps, deps.pipeline("churn")).phase == "deploying"  # type: ignore[union-attr]
    advance(deps, CLAIM_TTL_S)
    assert serving_version(deps) == (f"{MODEL}@1", {"1": 80, "2": 20}, ["1", "2"])
    assert endpoints.deploys == 2  # adopted, not deployed again


def test_a_deployment_that_fails_undoes_the_promotion_and_the_old_version_serves_on() -> None:
    deps, registry, endpoints = make()
    train(deps, "r1", 0.80)
    endpoints.failing = "the model server failed to start: no module named xgboost"
    train(deps, "r2", 0.90)
    assert serving_version(deps) == (f"{MODEL}@1", {"1": 100}, ["1"])
    rollout = serving.rollout_of(deps, deps.pipeline("churn"))
    assert rollout is not None and rollout.phase == "idle" and "xgboost" in rollout.reason
    assert alias_on(registry) == ["1"]
    record = promotions.champion_record(deps, MODEL)
    assert record is not None and record.champion is not None
    assert record.champion.version == f"{MODEL}@1"
