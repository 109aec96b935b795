"""Hardware candidates (issue 19): the format and its checks, the jobs built per kind, the choice."""

from __future__ import annotations

import textwrap
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from google.cloud import aiplatform_v1 as v1

from spotorch.adapters.gcp.vertex import build_custom_job
from spotorch.core.hardware import (
    Outlook,
    ProbeResult,
    apply,
    cache_key,
    candidate_price,
    choose,
    fresh,
    plan_probes,
    result_of,
    table_lines,
)
from spotorch.core.pipeline import Capacity, HardwareCandidate, HardwareSearch, Pipeline, Trigger
from spotorch.ports.jobs import LaunchSpec
from spotorch.spec.loader import inspect_file

HEAD = """\
    version: 1
    name: hw
    trigger: {bucket: landing}
    checkpoint_uri: gs://ckpt/hw
    output_uri: gs://models/hw
    job:
      worker_pools:
        - machine_type: n1-standard-4
          image_uri: img
          command: [python, train.py]
    """


def _file(tmp_path: Path, hardware: str) -> Any:
    path = tmp_path / "hw.yaml"
    path.write_text(textwrap.dedent(HEAD) + textwrap.dedent(hardware), encoding="utf-8")
    return inspect_file(path)


def _problems(check: Any) -> dict[str, str]:
    return {p.path: p.message for p in check.problems}


def test_candidates_of_every_kind_are_read(tmp_path: Path) -> None:
    check = _file(tmp_path, """\
        hardware:
          total_steps: 10000
          probe_steps: 20
          probe_timeout: 10m
          probe_budget: 5
          cache_ttl: 1d
          candidates:
            - {name: cpu, machine_type: n1-standard-8}
            - {name: l4, machine_type: g2-standard-8, accelerator_type: NVIDIA_L4,
               accelerator_count: 1}
            - {name: a100x2, machine_type: a2-highgpu-1g, accelerator_type: NVIDIA_TESLA_A100,
               accelerator_count: 1, replica_count: 2}
            - {name: v5e, machine_type: ct5lp-hightpu-4t, accelerator_type: TPU_V5_LITEPOD,
               accelerator_count: 4, tpu_topology: 2x2}
        """)
    assert check.problems == ()
    search = check.pipeline.hardware
    assert (search.total_steps, search.probe_steps, search.probe_timeout_s) == (10000, 20, 600.0)
    assert search.cache_ttl_s == 86400.0 and search.probe_budget == 5
    assert [c.name for c in search.candidates] == ["cpu", "l4", "a100x2", "v5e"]
    assert search.candidates[3].tpu_topology == "2x2"
    assert search.candidates[2].replica_count == 2


def test_candidates_are_checked_against_the_machine_table(tmp_path: Path) -> None:
    check = _file(tmp_path, """\
        hardware:
          total_steps: 100
          candidates:
            - {name: wrong, machine_type: n1-standard-8, accelerator_type: NVIDIA_L4,
               accelerator_count: 1}
            - {name: count, machine_type: g2-standard-8, accelerator_type: NVIDIA_L4,
               accelerator_count: 3}
            - {name: typo, machine_type: ct5lp-hightpu-4x}
            - {name: typo, machine_type: n1-standard-4, tpu_topology: 2x2,
               env: {SPOTORCH_RUN_ID: x}}
            - {name: half, machine_type: g2-standard-8, accelerator_type: NVIDIA_L4}
        """)
    problems = _problems(check)
    assert "does not attach to n1-standard-8" in problems["hardware.candidates[0].accelerator_type"]
    assert "takes 1 x NVIDIA_L4, not 3" in problems["hardware.candidates[1].accelerator_count"]
    assert "did you mean 'ct5lp-hightpu-4t'" in problems["hardware.candidates[2].machine_type"]
    assert "already the name" in problems["hardware.candidates[3].name"]
    assert "only to a TPU" in problems["hardware.candidates[3].tpu_topology"]
    assert "reserved" in problems["hardware.candidates[3].env.SPOTORCH_RUN_ID"]
    assert "at least 1" in problems["hardware.candidates[4].accelerator_count"]
    assert check.pipeline is None


def test_total_steps_and_candidates_are_required(tmp_path: Path) -> None:
    problems = _problems(_file(tmp_path, "hardware: {probe_steps: 5}\n"))
    assert "hardware.candidates" in problems and "hardware.total_steps" in problems


# --- the CustomJob per kind, against the real aiplatform_v1 types ---------------------------

BASE = Pipeline(name="hw", trigger=Trigger(bucket="landing"), checkpoint_uri="gs://c/hw",
                output_uri="gs://m/hw")
CPU = HardwareCandidate("cpu", "n1-standard-8")
L4 = HardwareCandidate("l4", "g2-standard-8", "NVIDIA_L4", 1)
A100X3 = HardwareCandidate("a100x3", "a2-highgpu-1g", "NVIDIA_TESLA_A100", 1, replica_count=3,
                           env=(("NCCL_DEBUG", "WARN"),))
V5E = HardwareCandidate("v5e", "ct5lp-hightpu-4t", "TPU_V5_LITEPOD", 4, tpu_topology="2x2")


def _job(candidate: HardwareCandidate) -> Any:
    template = apply(replace(BASE.job, worker_pools=(replace(
        BASE.job.worker_pools[0], image_uri="img", command=("python", "train.py"),
        env=(("A", "1"),)),)), candidate)
    spec = LaunchSpec(run_id="r", pipeline="hw", attempt=1, capacity=Capacity.SPOT,
                      region="us-central1", template=template, env={"SPOTORCH_RUN_ID": "r"},
                      labels={}, display_name="probe")
    return build_custom_job(spec)


def test_a_cpu_candidate_builds_one_pool_without_accelerators() -> None:
    (pool,) = _job(CPU).job_spec.worker_pool_specs
    assert pool.machine_spec.machine_type == "n1-standard-8"
    assert not pool.machine_spec.accelerator_type and not pool.machine_spec.tpu_topology
    assert pool.replica_count == 1


def test_a_gpu_candidate_sets_accelerator_type_and_count() -> None:
    (pool,) = _job(L4).job_spec.worker_pool_specs
    assert pool.machine_spec.accelerator_type == v1.AcceleratorType.NVIDIA_L4
    assert pool.machine_spec.accelerator_count == 1


def test_a_tpu_candidate_sets_the_topology() -> None:
    job = _job(V5E)
    (pool,) = job.job_spec.worker_pool_specs
    assert pool.machine_spec.machine_type == "ct5lp-hightpu-4t"
    assert pool.machine_spec.accelerator_type == v1.AcceleratorType.TPU_V5_LITEPOD
    assert pool.machine_spec.accelerator_count == 4
    assert pool.machine_spec.tpu_topology == "2x2"
    # the request survives the wire as Vertex would receive it
    again = v1.CustomJob.deserialize(v1.CustomJob.serialize(job))
    assert again.job_spec.worker_pool_specs[0].machine_spec.tpu_topology == "2x2"


def test_a_multi_replica_candidate_is_a_chief_and_a_worker_pool_of_the_same_shape() -> None:
    chief, workers = _job(A100X3).job_spec.worker_pool_specs
    assert (chief.replica_count, workers.replica_count) == (1, 2)
    for pool in (chief, workers):
        assert pool.machine_spec.machine_type == "a2-highgpu-1g"
        assert pool.machine_spec.accelerator_type == v1.AcceleratorType.NVIDIA_TESLA_A100
        assert list(pool.container_spec.command) == ["python", "train.py"]
        env = {e.name: e.value for e in pool.container_spec.env}
        assert env == {"A": "1", "NCCL_DEBUG": "WARN", "SPOTORCH_RUN_ID": "r"}


# --- the choice, on tables -------------------------------------------------------------------


def _pipeline(*candidates: HardwareCandidate, total_steps: int = 36_000,
              restart_overhead_s: float = 600.0, **search: Any) -> Pipeline:
    return replace(BASE, hardware=HardwareSearch(candidates=candidates, total_steps=total_steps,
                                                 **search),
                   recovery=replace(BASE.recovery, restart_overhead_s=restart_overhead_s))


def _fit(name: str, steps_per_s: float, cv: float = 0.0) -> ProbeResult:
    return ProbeResult(name, True, steps_per_s=steps_per_s, samples_per_s=steps_per_s * 32,
                       step_time_cv=cv)


def test_the_cheapest_candidate_that_meets_the_deadline_wins() -> None:
    pipeline = _pipeline(CPU, L4)
    # 36,000 steps: CPU at 2/s is 5 h (+10 min), L4 at 4/s is 2.5 h (+10 min)
    choice = choose(pipeline, {"cpu": _fit("cpu", 2.0), "l4": _fit("l4", 4.0)},
                    deadline_s=8 * 3600)
    cpu, l4 = choice.rows
    assert cpu.expected_hours == pytest.approx(5 + 1 / 6)
    price = candidate_price(pipeline, CPU, Capacity.SPOT)
    assert price is not None and cpu.spot_cost == pytest.approx(5 * price)
    # the ledger's table: n1-standard-8 at N1's unit rates (8 vCPUs, 30 GiB) on Spot
    assert cpu.spot_cost == pytest.approx(5 * (8 * 0.011149 + 30 * 0.001494))
    # the L4 plus its g2-standard-8 host, priced as G2 (never as another machine)
    assert l4.spot_cost == pytest.approx(2.5 * (8 * 0.021856 + 32 * 0.002560 + 0.2231))
    assert cpu.standard_cost == pytest.approx(5 * 0.379998)  # [C]'s n1-standard-8
    assert (cpu.spot_cost or 0) < (l4.spot_cost or 0)
    assert choice.chosen == "cpu" and cpu.chosen and not l4.chosen
    assert choice.expected_compute_s == pytest.approx(5 * 3600)
    assert "costs more" in l4.reason and choice.warning == ""


def test_a_cheaper_candidate_that_misses_the_deadline_loses() -> None:
    choice = choose(_pipeline(CPU, L4), {"cpu": _fit("cpu", 2.0), "l4": _fit("l4", 4.0)},
                    deadline_s=3 * 3600)
    assert choice.chosen == "l4"
    assert choice.row("cpu").meets_deadline is False  # type: ignore[union-attr]
    assert "misses the deadline" in choice.row("cpu").reason  # type: ignore[union-attr]
    assert "l4" in choice.reason and "meet the deadline" in choice.reason


def test_restart_overheads_from_spot_history_can_tip_the_balance() -> None:
    results = {"cpu": _fit("cpu", 2.0), "l4": _fit("l4", 4.0)}
    calm = choose(_pipeline(CPU, L4), results, deadline_s=5.5 * 3600)
    assert calm.chosen == "cpu"
    # one preemption an hour on the CPU shape: five more relaunches of 10 min: 6 h, past 5.5 h
    stormy = choose(_pipeline(CPU, L4), results, deadline_s=5.5 * 3600,
                    outlook=Outlook({"cpu": 1.0}))
    assert stormy.chosen == "l4"
    assert stormy.row("cpu").expected_hours == pytest.approx(5 + 6 / 6)  # type: ignore[union-attr]


def test_none_meets_the_deadline_the_fastest_fit_one_and_a_warning() -> None:
    slow_l4 = HardwareCandidate("l4", "g2-standard-8", "NVIDIA_L4", 1)
    choice = choose(_pipeline(CPU, slow_l4),
                    {"cpu": _fit("cpu", 2.0), "l4": _fit("l4", 4.0)}, deadline_s=3600)
    assert choice.chosen == "l4" and "fastest" in choice.reason
    assert "no candidate is expected to meet the deadline" in choice.warning


def test_all_unfit_chooses_nothing_and_says_why() -> None:
    results = {"cpu": result_of("cpu", None, succeeded=False, exit_code=137, message=""),
               "l4": result_of("l4", {"oom": True, "error": "CUDA out of memory"},
                               succeeded=False, exit_code=1)}
    choice = choose(_pipeline(CPU, L4), results, deadline_s=3600)
    assert choice.chosen is None and choice.expected_compute_s is None
    assert [r.fit for r in choice.rows] == [False, False]
    assert all(r.reason.startswith("out of memory") for r in choice.rows)
    assert "failed its probe" in choice.warning


def test_a_noisy_rate_is_taken_at_its_slow_side() -> None:
    other = HardwareCandidate("cpu2", "n1-standard-8")
    # same mean rate; the noisy one (cv 0.5) is projected 1.5 x slower and misses 6 h
    choice = choose(_pipeline(CPU, other),
                    {"cpu": _fit("cpu", 2.0, cv=0.5), "cpu2": _fit("cpu2", 2.0, cv=0.02)},
                    deadline_s=6 * 3600)
    assert choice.row("cpu").expected_hours == pytest.approx(7.5 + 1 / 6)  # type: ignore[union-attr]
    assert choice.chosen == "cpu2"


def test_a_tpu_that_wins_on_price_per_step_is_chosen() -> None:
    # v5e 4 chips at 0.24493 on Spot (host included) = 0.97972/h at 200 steps/s: 0.05 h;
    # L4 with its G2 host 0.479868/h at 10/s: 1 h
    choice = choose(_pipeline(L4, V5E), {"l4": _fit("l4", 10.0), "v5e": _fit("v5e", 200.0)},
                    deadline_s=4 * 3600)
    assert choice.chosen == "v5e"
    assert choice.row("v5e").spot_cost == pytest.approx(0.05 * 4 * 0.24493)  # type: ignore[union-attr]
    assert choice.row("l4").spot_cost == pytest.approx(0.479868)  # type: ignore[union-attr]


def test_ties_go_to_the_faster() -> None:
    twin = HardwareCandidate("cpu-b", "n1-standard-8")
    # same price per hour, same steps: equal cost only if equal rate; use prices override
    pipeline = replace(_pipeline(CPU, twin), prices=((str(Capacity.SPOT), 0.0),
                                                     (str(Capacity.STANDARD), 0.0)))
    choice = choose(pipeline, {"cpu": _fit("cpu", 2.0), "cpu-b": _fit("cpu-b", 3.0)},
                    deadline_s=None)
    assert choice.chosen == "cpu-b"


def test_a_failed_probe_is_unfit_with_its_reason_and_a_missing_report_too() -> None:
    failed = result_of("l4", None, succeeded=False, exit_code=1,
                       message="The replica workerpool0-0 exited with a non-zero status of 1.")
    assert not failed.fit and failed.reason.startswith("failed (The replica")
    silent = result_of("l4", None, succeeded=True)
    assert not silent.fit and "no probe report" in silent.reason
    ok = result_of("l4", {"steps_per_s": 12.5, "samples_per_s": 400.0, "step_time_cv": 0.1,
                          "peak_host_rss_mb": 812.0, "steps": 49}, succeeded=True)
    assert ok.fit and ok.steps_per_s == 12.5 and ok.peak_host_rss_mb == 812.0 and ok.steps == 49


def test_the_table_shows_every_candidate_and_the_reason() -> None:
    choice = choose(_pipeline(CPU, L4, V5E),
                    {"cpu": _fit("cpu", 2.0), "l4": _fit("l4", 20.0),
                     "v5e": result_of("v5e", None, succeeded=False, exit_code=137)},
                    deadline_s=3 * 3600)
    text = "\n".join(table_lines(choice))
    assert "l4 *" in text and "misses deadline" in text and "out of memory" in text
    assert text.splitlines()[-1].startswith("chosen: l4")


# --- planning probes: the cache and the budget ------------------------------------------------


def test_fresh_cached_results_are_reused_and_stale_or_changed_ones_are_not() -> None:
    pipeline = _pipeline(CPU, L4, cache_ttl_s=3600.0)
    key_cpu = cache_key(pipeline, CPU, 50)
    cache = {"cpu": replace(_fit("cpu", 2.0), key=key_cpu, measured_at=1000.0),
             "l4": replace(_fit("l4", 20.0), key=cache_key(pipeline, L4, 50), measured_at=0.0)}
    plan = plan_probes(pipeline, cache, now=4000.0)
    assert [r.candidate for r in plan.cached] == ["cpu"]
    assert [c.name for c in plan.probe] == ["l4"]  # 4000 s old: stale
    # new code (another image): the key changes, nothing is reused
    changed = replace(pipeline, job=replace(pipeline.job, worker_pools=(replace(
        pipeline.job.worker_pools[0], image_uri="img:2"),)))
    assert cache_key(changed, CPU, 50) != key_cpu
    assert not fresh(cache["cpu"], cache_key(changed, CPU, 50), 1000.0, 3600.0)
    assert len(plan_probes(changed, cache, now=1500.0).probe) == 2


def test_the_probe_budget_leaves_out_the_dearest_candidates() -> None:
    # worst cases for 1 h probes on Spot: cpu 0.134012, l4 0.479868, v5e 0.97972
    pipeline = _pipeline(V5E, CPU, L4, probe_timeout_s=3600.0, probe_budget=0.7)
    plan = plan_probes(pipeline, {}, now=0.0)
    assert [c.name for c in plan.probe] == ["cpu", "l4"]
    assert [r.candidate for r in plan.skipped] == ["v5e"]
    assert "probe budget" in plan.skipped[0].reason
    assert plan.budget_used == pytest.approx(0.134012 + 0.479868)


# --- spotorch advise ------------------------------------------------------------------------


def test_advise_prints_the_table_from_earlier_probes_without_launching(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import json

    from spotorch.operate.cli import main
    from spotorch.spec.loader import load_pipeline

    example = Path(__file__).resolve().parents[1] / "examples" / "hardware" / "tabular-ranker.yaml"
    pipeline = load_pipeline(example)
    search = pipeline.hardware
    assert search is not None
    import time as _time

    now = _time.time()
    rates = {"cpu": 4.0, "l4": 12.0}
    results = {c.name: ProbeResult(c.name, True, steps_per_s=rates[c.name], measured_at=now,
                                   key=cache_key(pipeline, c, search.probe_steps)).to_doc()
               for c in search.candidates if c.name in rates}
    results["v5e"] = ProbeResult("v5e", False, reason="out of memory (HBM)", measured_at=now,
                                 key=cache_key(pipeline, search.candidates[2], 50)).to_doc()
    path = tmp_path / "results.json"
    path.write_text(json.dumps({"results": results}))
    assert main(["advise", str(example), "--results", str(path), "--json"]) == 0
    table = json.loads(capsys.readouterr().out)["hardware"]
    # 200,000 steps: cpu at 4/s is 13.9 h (misses 8 h); l4 at 12/s is 4.6 h
    assert table["chosen"] == "l4"
    fits = {r["candidate"]: (r["fit"], r["meets_deadline"]) for r in table["rows"]}
    assert fits == {"cpu": (True, False), "l4": (True, True), "v5e": (False, None)}
    assert main(["advise", str(example), "--results", str(path)]) == 0
    text = capsys.readouterr().out
    assert "l4 *" in text and "out of memory (HBM)" in text and "chosen: l4" in text
