"""Every benchmark runs: a smoke run of each at a tiny size, so a script cannot rot unnoticed.

The figures themselves are not judged here (benchmarks print figures, tests do not time); each
run must finish, print what its page quotes, and exit 0 or, where a target is missed at this
size, say so and exit 1.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TRACES = Path(os.environ.get("SPOTORCH_TRACES", ROOT / "shared" / "spotorch" / "sim" / "traces"))


def bench(name: str, *args: str, timeout: float = 300.0) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / name), *args],
                          capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    assert done.returncode in (0, 1), done.stderr[-3000:]
    return done


def last_json(text: str) -> dict[str, object]:
    """The JSON object a benchmark printed (it may print more lines after it)."""
    start = text.index("{")
    value, _ = json.JSONDecoder().raw_decode(text[start:])
    assert isinstance(value, dict)
    return value


def test_the_policy_benchmark_runs_a_small_grid(tmp_path: Path) -> None:
    """One trace, one deadline, one overhead, two zones for the region experiment."""
    root = tmp_path / "traces"
    picks = ["availability/1-node/aws-10-26-2022/us-west-2b_v100_1.json",
             "availability/1-node/aws-02-15-2023/us-east-2a_v100_1.json",
             "availability/1-node/aws-02-15-2023/us-west-2b_v100_1.json"]
    for pick in picks:
        (root / pick).parent.mkdir(parents=True, exist_ok=True)
        (root / pick).symlink_to(TRACES / pick)
    done = bench("policy_bench.py", "--workers", "1", "--markov-runs", "2", "--deadlines", "72",
                 "--overheads", "0.2", "--traces", str(root))
    out = done.stdout
    assert "| 0.2 | 72 | 111 |" in out  # the grid's cell: every window of the three traces
    assert "best online (MDP knowing the chain)" in out
    assert "| 0.2 | 72 | 43 |" in out.split("fixed order")[1]  # the region experiment ran
    assert "family | overhead h" in out


def test_the_semi_markov_experiment_runs_on_one_trace() -> None:
    trace = TRACES / "availability/1-node/aws-10-26-2022/us-west-2b_v100_1.json"
    done = bench("semi_markov_policy.py", "--max-age", "4", "--workers", "1", "--no-write",
                 str(trace))
    assert "| 72 |" in done.stdout and "| 96 |" in done.stdout


def test_the_cold_start_benchmark_imports_what_each_function_imports() -> None:
    done = bench("cold_start.py", "--repeat", "1")
    figures = last_json(done.stdout)
    for function in ("on_object_finalized", "on_table_changed", "on_job_event", "on_tick", "api",
                     "on_run_event"):
        entry = figures[function]
        assert isinstance(entry, dict) and entry["ratio"] > 0
    assert "target <= 1.3x" in done.stdout + done.stderr


@pytest.mark.emulator
@pytest.mark.slow
def test_the_event_benchmark_runs_on_the_emulators() -> None:
    done = bench("event_bench.py", "--runs", "2", "--events", "20", "--storm", "20",
                 "--threads", "2", "--job-runs", "4", "--warm-runs", "1")
    figures = last_json(done.stdout)
    storm = figures["duplicate_storm"]
    assert isinstance(storm, dict) and storm["extra_launches"] == 0
    assert "targets: >=50 events/s" in done.stdout + done.stderr


@pytest.mark.emulator
@pytest.mark.slow
def test_the_scale_benchmark_runs_through_the_function_entry_points() -> None:
    done = bench("scale_bench.py", "--runs", "5", "--json", timeout=600.0)
    figures = last_json(done.stdout)
    assert figures["all_running"] is True and figures["launches_waiting"] == 0


@pytest.mark.emulator
@pytest.mark.slow
def test_the_operator_reads_benchmark_runs_on_the_firestore_emulator() -> None:
    done = bench("cli_reads.py", "--runs", "3", "--repeat", "1")
    assert "spotorch runs " in done.stdout and "spotorch show demo-0002" in done.stdout
    assert "heaviest imports" in done.stdout


def test_the_multi_region_benchmark_runs_a_small_cell() -> None:
    done = bench("multi_region_bench.py", "--workers", "1", "--task-hours", "8",
                 "--deadlines", "10", "--stride-hours", "240")
    assert "| 10 | visible | 5 |" in done.stdout and "| 10 | production | 5 |" in done.stdout
    assert "- 10 h: below UP in both views:" in done.stdout

def test_the_search_benchmark_compares_vizier_random_and_grid() -> None:
    """Issue 38: a tiny budget and two seeds; every problem, every search, the target said."""
    done = bench("search_bench.py", "--seeds", "2", "--budget", "8", "--json", timeout=120)
    result = last_json(done.stdout)
    problems = result["problems"]
    assert isinstance(problems, dict) and set(problems) == {"surface", "branin", "tradeoff",
                                                            "trainer"}
    for name in ("surface", "branin", "trainer"):
        assert {"vizier", "random", "grid", "vizier_median_trials_to_random_best",
                "target_met"} <= set(problems[name])
    assert 0 < problems["tradeoff"]["vizier"]["share_of_true_front"] <= 1
    assert problems["trainer"]["best_found"] > 0 and problems["surface"]["optimum"] == 0.25
    assert done.returncode == (0 if all(problems[n]["target_met"]
                                        for n in ("surface", "branin", "trainer")) else 1)
