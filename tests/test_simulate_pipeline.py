"""`spotorch simulate --pipeline FILE` (issue 41): the task, deadline, overhead and nodes from a
pipeline file instead of copied by hand, and costs in the price table's money for its shape."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from spotorch.core.cost import hourly_rate
from spotorch.core.pipeline import Capacity
from spotorch.sim.simulate import main
from spotorch.spec.loader import load_pipeline

ROOT = Path(__file__).resolve().parents[1]
RANKER = ROOT / "examples" / "hardware" / "tabular-ranker.yaml"


def _pipeline(tmp: Path, **recovery: object) -> Path:
    doc = yaml.safe_load(RANKER.read_text())
    doc.pop("hardware")
    doc["recovery"] = {**doc.get("recovery", {}), **recovery}
    path = tmp / "ranker.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def _json(capsys: pytest.CaptureFixture[str]) -> dict[str, object]:
    out: dict[str, object] = json.loads(capsys.readouterr().out)
    return out


def test_the_pipeline_gives_the_task_and_the_prices(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _pipeline(tmp_path, expected_compute="4h")  # deadline 8h, restart_overhead 10m
    assert main(["--pipeline", str(path), "--json", "--policies", "standard"]) == 0
    out = _json(capsys)
    pipeline = load_pipeline(path)
    standard = hourly_rate(pipeline, Capacity.STANDARD, "us-central1").per_hour
    spot = hourly_rate(pipeline, Capacity.SPOT, "us-central1").per_hour
    assert standard is not None and spot is not None
    assert (out["task_hours"], out["deadline_hours"], out["nodes"]) == (4.0, 8.0, 1)
    assert out["restart_overhead_hours"] == pytest.approx(1 / 6)
    assert out["currency"] == "USD" and out["pipeline"] == "tabular-ranker"
    assert str(out["costs_in"]).startswith("USD: the price table's 1x n1-standard-8")
    assert out["spot_per_node_hour"] == pytest.approx(spot, abs=1e-6)
    # standard VMs all the way: the task plus one launch overhead at the table's standard price
    policies = out["policies"]
    assert isinstance(policies, dict)
    assert policies["standard"]["mean_cost"] == pytest.approx(standard * (4 + 1 / 6))
    # an option on the command line wins over the file
    assert main(["--pipeline", str(path), "--json", "--policies", "standard",
                 "--task-hours", "2"]) == 0
    again = _json(capsys)
    assert again["task_hours"] == 2.0
    assert again["policies"]["standard"]["mean_cost"] == pytest.approx(  # type: ignore[index]
        standard * (2 + 1 / 6))


def test_what_the_file_lacks_is_named(tmp_path: Path,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--pipeline", str(_pipeline(tmp_path)), "--json"]) == 2
    assert "recovery.expected_compute is not set; give --task-hours" in capsys.readouterr().err
    assert main(["--pipeline", str(tmp_path / "none.yaml"), "--json"]) == 2
    assert "--pipeline" in capsys.readouterr().err


def test_without_a_pipeline_costs_are_in_spot_units(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--task-hours", "4", "--deadline-hours", "8", "--policies", "standard"]) == 0
    assert "costs in Spot node-hours (Spot = 1" in capsys.readouterr().out
