"""The pipeline format has one definition (spotorch.core.pipeline); the schema file is generated from it."""

from __future__ import annotations

import dataclasses
import json
import textwrap
from pathlib import Path
from typing import Any

import pytest

from spotorch.core.errors import ConfigError
from spotorch.core.fields import file_fields
from spotorch.core.pipeline import (
    BatchMode,
    Capacity,
    EscalationKind,
    JobTemplate,
    OnActiveRun,
    Pipeline,
    RecoveryPolicy,
    Route,
    Trigger,
    WorkerPool,
)
from spotorch.spec import schema as pipeline_schema
from spotorch.spec.loader import check_file, load_pipeline
from spotorch.spec.schema import REGENERATE, SCHEMA_ENV, pipeline_schema_text, schema_main

ROOT = Path(__file__).resolve().parent.parent
SCHEMA = ROOT / "schemas" / "pipeline.schema.json"
EXAMPLES = ROOT / "examples" / "pipelines"

MINIMAL = """\
name: minimal
trigger:
  bucket: landing
  prefix: data/
job:
  worker_pools:
    - machine_type: n1-standard-4
      image_uri: python:3.11-slim
checkpoint_uri: gs://ckpt/minimal
output_uri: gs://models/minimal
"""


def write(tmp_path: Path, text: str, name: str = "p.yaml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def problems_of(path: Path) -> dict[str, str]:
    with pytest.raises(ConfigError) as caught:
        load_pipeline(path)
    return {p.path: p.message for p in caught.value.problems}


# --- the schema is generated ------------------------------------------------------------------


def test_the_committed_schema_is_the_generated_one() -> None:
    assert SCHEMA.read_text() == pipeline_schema_text(), (
        f"{SCHEMA} is not what spotorch/core/pipeline.py generates; run: {REGENERATE}")


def test_schema_check_fails_on_drift_and_names_the_command(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    stale = tmp_path / "pipeline.schema.json"
    stale.write_text(SCHEMA.read_text().replace('"maxItems": 4', '"maxItems": 5'))
    assert schema_main(["--check", "--out", str(stale)]) == 1
    assert REGENERATE in capsys.readouterr().err
    assert schema_main(["--out", str(stale)]) == 0
    assert stale.read_text() == pipeline_schema_text()
    assert schema_main(["--check", "--out", str(stale)]) == 0


def test_every_file_field_is_in_the_schema_under_its_file_name() -> None:
    schema = json.loads(pipeline_schema_text())
    sections: dict[type, Any] = {Pipeline: schema, **{cls: schema["$defs"][cls.__name__] for cls in (
        Trigger, JobTemplate, WorkerPool, RecoveryPolicy, Route)}}
    for cls, node in sections.items():
        names = [f.name.removesuffix("_s") if f.name.endswith("_s") else f.name
                 for f in file_fields(cls)]
        assert list(node["properties"]) == names, cls
        assert node["additionalProperties"] is False
    assert "source" not in schema["properties"]  # code only: where the pipeline was loaded from
    assert schema["properties"]["deadline"]["errorMessage"].startswith("must be a duration")
    assert schema["$defs"]["Trigger"]["properties"]["on_active_run"]["enum"] == [
        "queue", "supersede", "skip"]
    assert schema["$defs"]["RecoveryPolicy"]["properties"]["backoff_cap"]["default"] == "5m"


def test_the_examples_satisfy_the_generated_schema_too() -> None:
    """What an editor checks (the schema) agrees with what the loader accepts."""
    import yaml
    from jsonschema import Draft202012Validator

    validator = Draft202012Validator(json.loads(pipeline_schema_text()))
    for path in EXAMPLES.glob("*.yaml"):
        assert not list(validator.iter_errors(yaml.safe_load(path.read_text()))), path
    bad = yaml.safe_load(MINIMAL.replace("bucket: landing", "bucket: gs://landing"))
    assert [list(e.absolute_path) for e in validator.iter_errors(bad)] == [["trigger", "bucket"]]


# --- the public surface stays what the rest of the code uses ---------------------------------------


def test_the_types_are_plain_frozen_hashable_dataclasses() -> None:
    pipeline = Pipeline(name="p", trigger=Trigger(bucket="-"))  # code is not validated
    assert hash(pipeline) == hash(Pipeline(name="p", trigger=Trigger(bucket="-")))
    with pytest.raises(dataclasses.FrozenInstanceError):
        pipeline.name = "q"  # type: ignore[misc]
    moved = dataclasses.replace(pipeline, job=dataclasses.replace(pipeline.job, regions=("x",)))
    assert moved.job.regions == ("x",) and pipeline.job.regions == ("us-central1",)
    assert pipeline.run_checkpoint_uri("r1") == "/r1"
    assert RecoveryPolicy().expected_compute_s is None and RecoveryPolicy().backoff_cap_s == 300.0


def test_attribute_names_are_unchanged() -> None:
    names = {cls: [f.name for f in dataclasses.fields(cls)] for cls in (
        Pipeline, Trigger, JobTemplate, WorkerPool, RecoveryPolicy, Route)}
    assert names[Pipeline][:12] == ["name", "trigger", "job", "checkpoint_uri", "output_uri",
                                    "recovery", "deadline_s", "max_cost", "prices", "routes",
                                    "health", "source"]
    assert names[Trigger] == ["bucket", "prefix", "glob", "suffixes", "ignore", "batch", "marker",
                              "manifest", "quiet_period_s", "min_objects", "snapshot_depth",
                              "on_active_run", "bigquery"]
    assert names[JobTemplate] == ["worker_pools", "regions", "service_account", "network",
                                  "labels", "timeout_s", "flex_max_wait_s", "base_output_uri",
                                  "staging_uri"]
    assert "escalate_after_preemptions" in names[RecoveryPolicy]
    assert {"spot_cooldown_s", "decision_interval_s", "restart_overhead_s"} <= set(
        names[RecoveryPolicy])
    assert names[Route] == ["channel", "events", "target"]


def test_a_file_becomes_the_dataclasses(tmp_path: Path) -> None:
    text = (MINIMAL + textwrap.dedent("""\
        prices: {standard: 2.5, spot: 1}
        recovery: {escalation: count, escalate_after_preemptions: 2}
        routes: [{channel: chat, events: [run.failed]}]
        """)).replace("prefix: data/", "prefix: data/\n  batch: marker\n  on_active_run: skip")
    pipeline = load_pipeline(write(tmp_path, text))
    assert type(pipeline) is Pipeline and type(pipeline.job.worker_pools[0]) is WorkerPool
    assert pipeline.trigger.batch is BatchMode.MARKER
    assert pipeline.trigger.on_active_run is OnActiveRun.SKIP
    assert pipeline.recovery.escalation is EscalationKind.COUNT
    assert pipeline.prices == (("spot", 1.0), ("standard", 2.5))
    assert pipeline.routes == (Route(channel="chat", events=("run.failed",)),)
    assert pipeline.deadline_s is None and pipeline.job.regions == ("us-central1",)
    assert hash(pipeline) and Capacity(pipeline.prices[0][0]) is Capacity.SPOT


# --- types mean what they mean in JSON Schema -------------------------------------------------------


@pytest.mark.parametrize("edit, field, words", [
    ("replica_count: true", "job.worker_pools[0].replica_count", "an integer, not true/false"),
    ("replica_count: '1'", "job.worker_pools[0].replica_count", "an integer, not a string"),
    ("boot_disk_size_gb: 150.5", "job.worker_pools[0].boot_disk_size_gb", "an integer"),
    ("image_uri: 3", "job.worker_pools[0].image_uri", "a string, not an integer; quote it"),
    ("command: python", "job.worker_pools[0].command", "must be a list"),
    ("deadline_s: 5", "job.worker_pools[0].deadline_s", "unknown field"),
])
def test_strict_types_in_a_pool(tmp_path: Path, edit: str, field: str, words: str) -> None:
    text = MINIMAL.replace("image_uri: python:3.11-slim", f"image_uri: python:3.11-slim\n      {edit}")
    if edit.startswith("image_uri"):
        text = MINIMAL.replace("image_uri: python:3.11-slim", edit)
    assert words in problems_of(write(tmp_path, text)).get(field, "")


@pytest.mark.parametrize("extra, field, words", [
    ("deadline_s: 5\n", "deadline_s", "did you mean 'deadline'"),
    ("source: elsewhere.yaml\n", "source", "unknown field"),
    ("description: 2025-01-31\n", "description", "not a date; quote it"),
    ("version: 2\n", "version", "must be 1"),
    ("prices: {spott: 1}\n", "prices.spott", "key"),
    ("max_cost: -1\n", "max_cost", "at least 0"),
    ("routes: [{channel: chat, events: [a, a]}]\n", "routes[0].events", "same item twice"),
    ("routes: [{channel: chat, events: []}]\n", "routes[0].events", "at least 1 item"),
    ("trigger2: {}\n", "trigger2", "did you mean 'trigger'"),
])
def test_root_level_format_problems(tmp_path: Path, extra: str, field: str, words: str) -> None:
    found = problems_of(write(tmp_path, MINIMAL + extra))
    assert words in found.get(field, ""), found


def test_a_marker_dated_by_yaml_is_reported_where_it_is(tmp_path: Path) -> None:
    text = MINIMAL.replace("prefix: data/", "prefix: data/\n  batch: marker\n  marker: 2025-01-31")
    assert "not a date; quote it" in problems_of(write(tmp_path, text))["trigger.marker"]
    quoted = text.replace("marker: 2025-01-31", "marker: '2025-01-31'")
    assert load_pipeline(write(tmp_path, quoted)).trigger.marker == "2025-01-31"


def test_parallel_is_for_code_not_files(tmp_path: Path) -> None:
    text = MINIMAL.replace("prefix: data/", "prefix: data/\n  on_active_run: parallel")
    assert "queue, supersede, skip" in problems_of(write(tmp_path, text))["trigger.on_active_run"]


def test_the_loader_does_not_read_the_schema_file(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(SCHEMA_ENV, str(tmp_path / "nowhere.json"))
    monkeypatch.setattr(pipeline_schema, "schema_candidates", lambda environ=None: [tmp_path / "no.json"])
    pipeline, problems = check_file(write(tmp_path, MINIMAL))
    assert pipeline is not None and problems == ()
