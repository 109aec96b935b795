"""One registration module for runs and sweeps (spotorch.app.registration, issue 36): both
upload through it, and `aliases_to_move` alone decides which aliases a new version takes (where
a promotion gate plugs in)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from fakes import fake_deps
from spotorch.adapters.memory.registry import MemoryModelRegistry
from spotorch.app import registration
from spotorch.core.decide import new_run
from spotorch.core.intents import RegisterModelIntent
from spotorch.core.pipeline import JobTemplate, Pipeline, Trigger, WorkerPool
from spotorch.core.sweep_spec import ModelRegistration, Parameter, SweepSpec
from spotorch.core.sweeps import RegisterModel, new_sweep
from spotorch.ports.registry import ALIAS_BEST, ALIAS_LATEST

MODEL = ModelRegistration(serving_image="us-docker.pkg.dev/x/y:1", aliases=("latest", "prod"),
                          experiments=False)


def pipeline(**extra: object) -> Pipeline:
    return Pipeline(name="p", trigger=Trigger(bucket="b"), model=MODEL,
                    job=JobTemplate(worker_pools=(WorkerPool(command=("true",)),),
                                    regions=("europe-west4",)), **extra)  # type: ignore[arg-type]


def test_a_run_takes_the_pipelines_aliases_and_a_sweeps_winner_also_best() -> None:
    p = pipeline()
    assert registration.aliases_to_move(p) == (ALIAS_LATEST, "prod")
    assert registration.aliases_to_move(p, sweep_winner=True) == (ALIAS_LATEST, "prod", ALIAS_BEST)
    assert registration.aliases_to_move(replace(p, model=None)) == ()
    assert registration.model_region(p) == "europe-west4"


def test_both_registrations_move_only_the_aliases_aliases_to_move_decides(
        monkeypatch: pytest.MonkeyPatch) -> None:
    p = pipeline(sweep=SweepSpec(metric="loss", parameters=(Parameter(name="lr",
                                                                      values=(0.1,)),)))
    deps = replace(fake_deps(p), models=MemoryModelRegistry())
    asked: list[bool] = []

    def gate(pipeline: Pipeline, *, sweep_winner: bool = False) -> tuple[str, ...]:
        asked.append(sweep_winner)
        return ("candidate",)
    monkeypatch.setattr(registration, "aliases_to_move", gate)
    run = new_run(run_id="r1", pipeline=p, now=1.0, data_uri="gs://b/d/", snapshot_id="s")
    registration.register_run_model(deps, run, RegisterModelIntent("i1", "gs://m/r1", {}))
    assert p.sweep is not None
    sw = new_sweep(sweep_id="sw", pipeline=p, spec=p.sweep, now=1.0, data_uri="gs://b/d/",
                   snapshot_id="s", register=True, experiments=False)
    name, verdict = registration.register_sweep_model(deps, sw, RegisterModel("i2", 1, "sw-t1",
                                                                              "gs://m/sw-t1"))
    assert verdict is None  # no model.promote: no gate
    assert asked == [False, True]
    assert isinstance(deps.models, MemoryModelRegistry)
    versions = next(iter(deps.models.versions.values()))
    assert [v.aliases for v in versions] == [("default",), ("candidate",)]  # moved from r1
    assert versions[1].name == name and versions[1].labels["spotorch_sweep"] == "sw"


def test_a_sweeps_best_worse_than_the_champion_says_so_in_the_sweeps_history(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """issue 37: `best` keeps its meaning (the sweep's winner) and the sweep says when it is
    not the champion: the gate's reason is in the registration's note."""
    from spotorch.app import releases
    from spotorch.core.promotion import Decision, PromotionPolicy
    from spotorch.core.sweeps import SweepContext, SweepIntentDone, SweepStatus, decide_sweep

    p = pipeline(sweep=SweepSpec(metric="loss", parameters=(Parameter(name="lr",
                                                                      values=(0.1,)),)))
    p = replace(p, model=replace(MODEL, promote=PromotionPolicy(metric="accuracy")))
    deps = replace(fake_deps(p), models=MemoryModelRegistry())
    refused = Decision(version="v", run_id="sw-t1", promoted=False, rule="margin", at=1.0,
                       reason="accuracy 0.70 does not beat the champion's 0.87 by 0.01")
    monkeypatch.setattr(releases, "after_registration", lambda deps, run, version: refused)
    assert p.sweep is not None
    sw = new_sweep(sweep_id="sw", pipeline=p, spec=p.sweep, now=1.0, data_uri="gs://b/d/",
                   snapshot_id="s", register=True, experiments=False)
    name, verdict = registration.register_sweep_model(deps, sw, RegisterModel("i2", 1, "sw-t1",
                                                                              "gs://m/sw-t1"))
    assert verdict is not None and verdict.startswith("`best` of this sweep but not promoted")
    assert "does not beat the champion" in verdict
    intent = RegisterModel("i2", 1, "sw-t1", "gs://m/sw-t1")
    registering = replace(sw, status=SweepStatus.REGISTERING, outbox=(intent,))
    ctx = SweepContext(pipeline=p, spec=p.sweep, now=2.0, register=True)
    done = decide_sweep(registering, SweepIntentDone("i2", model_name=name, verdict=verdict), ctx)
    assert name is not None and any("not promoted to production" in what and name in what
               for _, what in done.history)
