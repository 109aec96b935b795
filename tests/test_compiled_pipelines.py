"""Pipelines validated at deploy (or activation) time and read cold by the functions: the
attribute form round-trips every pipeline the demo and the examples use, the functions' reader
imports neither pydantic nor YAML, and YAML edited after validation is never read stale."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import zipfile
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from spotorch.core.pipeline_form import from_form, to_form
from spotorch.local.demo import SCENARIOS, pipeline_document
from spotorch.spec.compiled import (
    COMPILED_FILE,
    clear_cache,
    function_pipelines,
    read_compiled,
    write_compiled,
)
from spotorch.spec.loader import load_pipeline, load_pipelines

ROOT = Path(__file__).resolve().parent.parent


def _scenario_files(tmp: Path) -> list[Path]:
    files = []
    for name, scenario in SCENARIOS.items():
        path = tmp / f"{name}.yaml"
        doc = pipeline_document(scenario)
        doc["name"] = f"demo-{name}"
        path.write_text(yaml.safe_dump(doc))
        files.append(path)
    return files


def _demo_yaml() -> str:
    """The demo pipeline for another folder: its package source as an absolute path."""
    return (ROOT / "examples/pipelines/demo.yaml").read_text().replace(
        "source: ../trainer", f"source: {ROOT / 'examples' / 'trainer'}")


def test_every_demo_and_example_pipeline_round_trips_through_its_attribute_form(
        tmp_path: Path) -> None:
    files = [*_scenario_files(tmp_path), *sorted((ROOT / "examples/pipelines").glob("*.yaml"))]
    for file in files:
        pipeline = load_pipeline(file)
        assert from_form(json.loads(json.dumps(to_form(pipeline)))) == pipeline, file


def test_a_key_the_dataclasses_do_not_have_is_refused_by_its_path() -> None:
    form = to_form(load_pipeline(ROOT / "examples/pipelines/demo.yaml"))
    form["job"]["worker_pools"][0]["gpus"] = 1
    with pytest.raises(ValueError, match=r"pipeline\.job\.worker_pools\[0\].*gpus"):
        from_form(form)


def test_the_functions_read_compiled_pipelines_without_pydantic_or_yaml(tmp_path: Path) -> None:
    _scenario_files(tmp_path)
    write_compiled(load_pipelines(tmp_path), tmp_path)
    code = ("import sys\n"
            "from spotorch.spec.compiled import function_pipelines\n"
            f"names = sorted(p.name for p in function_pipelines({str(tmp_path)!r}))\n"
            "heavy = sorted(m for m in ('pydantic', 'yaml') if m in sys.modules)\n"
            "print(len(names), heavy)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == f"{len(SCENARIOS)} []"


def test_yaml_edited_after_validation_is_read_from_the_yaml_not_the_stale_file(
        tmp_path: Path) -> None:
    demo = tmp_path / "demo.yaml"
    demo.write_text(_demo_yaml())
    write_compiled(load_pipelines(tmp_path), tmp_path)
    assert read_compiled(tmp_path) is not None
    demo.write_text(demo.read_text().replace("deadline: 30m", "deadline: 45m"))
    assert read_compiled(tmp_path) is None
    clear_cache()
    assert function_pipelines(tmp_path)[0].deadline_s == 45 * 60
    clear_cache()


def test_the_bundle_carries_the_validated_pipelines_the_functions_read(tmp_path: Path) -> None:
    spec = importlib.util.spec_from_file_location("spotorch_deploy_package",
                                                  ROOT / "deploy/package.py")
    assert spec is not None and spec.loader is not None
    package = sys.modules.get(spec.name) or importlib.util.module_from_spec(spec)
    if spec.name not in sys.modules:
        sys.modules[spec.name] = package  # dataclasses look their module up
        spec.loader.exec_module(package)
    pipelines = tmp_path / "pipelines"
    pipelines.mkdir()
    (pipelines / "demo.yaml").write_text(_demo_yaml())
    bundle = package.build(ROOT, pipelines, tmp_path / "bundle.zip")
    assert f"pipelines/{COMPILED_FILE}" in bundle.names
    unpacked = tmp_path / "unpacked"
    with zipfile.ZipFile(bundle.path) as zf:
        zf.extractall(unpacked)
    read = read_compiled(unpacked / "pipelines")
    assert read is not None and [p.source for p in read] == ["demo.yaml"]  # no local path
    built = read[0].job.worker_pools[0].python_package
    assert built is not None and len(built.staged_files) == 2  # built, in the bundle
    assert all(Path(f).is_file() and Path(f).is_relative_to(unpacked / "pipelines")
               for f in built.staged_files)
    assert [replace(p, source="", job=replace(p.job, worker_pools=())) for p in read] == \
        [replace(p, source="", job=replace(p.job, worker_pools=()))
         for p in load_pipelines(pipelines)]
