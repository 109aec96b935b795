"""Validation knows real names (regions, machine and accelerator types) and warns about settings
that have no effect."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from spotorch.core.errors import ConfigError
from spotorch.spec import catalog
from spotorch.spec.catalog import CATALOG_ENV, load_catalog
from spotorch.spec.loader import inspect_file, load_pipeline, load_pipelines, validate_main

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples" / "pipelines"

MINIMAL = """\
name: minimal
trigger:
  bucket: landing
  prefix: data/
job:
  regions: [us-central1]
  worker_pools:
    - machine_type: n1-standard-4
      image_uri: python:3.11-slim
checkpoint_uri: gs://ckpt/minimal
output_uri: gs://models/minimal
"""
POOL = "    - machine_type: n1-standard-4\n"


def write(tmp_path: Path, text: str, name: str = "p.yaml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def problems_of(path: Path) -> dict[str, str]:
    with pytest.raises(ConfigError) as caught:
        load_pipeline(path)
    return {p.path: p.message for p in caught.value.problems}


def pool(text: str) -> str:
    return MINIMAL.replace(POOL, text)


# --- the table -----------------------------------------------------------------------------------


def test_the_table_says_where_it_comes_from_and_when() -> None:
    table = json.loads(catalog.BUILTIN.read_text())
    assert table["date"] and len(table["sources"]) >= 3 and table["notes"]
    assert load_catalog({}).date == table["date"]


def test_accelerators_are_exactly_those_vertex_ai_names() -> None:
    from google.cloud.aiplatform_v1.types import AcceleratorType

    vertex = {a.name for a in list(AcceleratorType.__members__.values())} - {"ACCELERATOR_TYPE_UNSPECIFIED"}
    assert set(load_catalog({}).accelerator_regions) == vertex


def test_every_machine_type_takes_only_known_accelerators() -> None:
    known = load_catalog({})
    for machine, fits in known.machine_types.items():
        assert fits is not None, machine
        assert set(fits) <= set(known.accelerator_regions), machine
        assert all(counts and all(n > 0 for n in counts) for counts in fits.values()), machine
    assert known.machine_types["a2-highgpu-4g"] == {"NVIDIA_TESLA_A100": (4,)}
    assert known.machine_types["ct5lp-hightpu-8t"] == {"TPU_V5_LITEPOD": (8,)}
    assert known.machine_types["n2-standard-8"] == {}
    assert "us-central1" in known.regions and "europe-west4" in known.regions


# --- problems: unknown names, accelerators that do not fit ---------------------------------------


@pytest.mark.parametrize("old, new, field, words", [
    ("regions: [us-central1]", "regions: [us-centrall1]", "job.regions[0]",
     "'us-centrall1' is not a region in spotorch's table of"),
    ("regions: [us-central1]", "regions: [us-centrall1]", "job.regions[0]",
     "did you mean 'us-central1'?"),
    ("regions: [us-central1]", "regions: [us-central1, mars-north1]", "job.regions[1]",
     "not a region"),
    (POOL, "    - machine_type: n1-standrad-4\n", "job.worker_pools[0].machine_type",
     "did you mean 'n1-standard-4'?"),
    (POOL, "    - machine_type: n1-standard-4\n      accelerator_type: NVIDIA_TESLA_A10\n"
           "      accelerator_count: 1\n", "job.worker_pools[0].accelerator_type",
     "did you mean 'NVIDIA_TESLA_A100'?"),
    (POOL, "    - machine_type: n1-standard-4\n      accelerator_type: NVIDIA_L4\n"
           "      accelerator_count: 1\n", "job.worker_pools[0].accelerator_type",
     "NVIDIA_L4 does not attach to n1-standard-4"),
    (POOL, "    - machine_type: n2-standard-8\n      accelerator_type: NVIDIA_TESLA_T4\n"
           "      accelerator_count: 1\n", "job.worker_pools[0].accelerator_type",
     "it takes no accelerators"),
    (POOL, "    - machine_type: a2-highgpu-8g\n      accelerator_type: NVIDIA_TESLA_A100\n"
           "      accelerator_count: 4\n", "job.worker_pools[0].accelerator_count",
     "a2-highgpu-8g takes 8 x NVIDIA_TESLA_A100, not 4"),
    (POOL, "    - machine_type: n1-standard-8\n      accelerator_type: NVIDIA_TESLA_T4\n"
           "      accelerator_count: 3\n", "job.worker_pools[0].accelerator_count",
     "takes 1 or 2 or 4 x NVIDIA_TESLA_T4"),
])
def test_names_the_table_does_not_know(tmp_path: Path, old: str, new: str, field: str,
                                       words: str) -> None:
    assert old in MINIMAL
    found = problems_of(write(tmp_path, MINIMAL.replace(old, new)))
    assert words in found.get(field, ""), found


@pytest.mark.parametrize("machine, accelerator, count", [
    ("n1-standard-8", "NVIDIA_TESLA_T4", 2), ("a2-highgpu-8g", "NVIDIA_TESLA_A100", 8),
    ("a3-highgpu-8g", "NVIDIA_H100_80GB", 8), ("g2-standard-48", "NVIDIA_L4", 4),
    ("n1-highmem-16", "NVIDIA_TESLA_V100", 8), ("ct5lp-hightpu-4t", "TPU_V5_LITEPOD", 4),
])
def test_real_combinations_load(tmp_path: Path, machine: str, accelerator: str,
                                count: int) -> None:
    text = pool(f"    - machine_type: {machine}\n      accelerator_type: {accelerator}\n"
                f"      accelerator_count: {count}\n")
    assert load_pipeline(write(tmp_path, text)).job.worker_pools[0].accelerator_count == count


def test_a_malformed_name_gets_one_message_not_two(tmp_path: Path) -> None:
    found = problems_of(write(tmp_path, MINIMAL.replace("[us-central1]", "[us-central1-a]")))
    assert "not a zone" in found["job.regions[0]"] and "table" not in found["job.regions[0]"]


def test_every_name_problem_is_listed_with_its_line(tmp_path: Path) -> None:
    text = MINIMAL.replace("regions: [us-central1]", "regions: [us-centrall1, europe-west4]") \
        .replace(POOL, "    - machine_type: n1-standrad-4\n      accelerator_type: NVIDIA_TESLA_T4\n"
                       "      accelerator_count: 1\n      image_uri: x\n"
                       "    - machine_type: a2-highgpu-2g\n      accelerator_type: NVIDIA_L4\n"
                       "      accelerator_count: 2\n") \
        .replace("      image_uri: python:3.11-slim\n", "      image_uri: y\n")
    path = write(tmp_path, text)
    found = problems_of(path)
    assert found["job.regions[0]"].endswith("(line 6)")
    assert "did you mean 'n1-standard-4'" in found["job.worker_pools[0].machine_type"]
    assert found["job.worker_pools[0].machine_type"].endswith("(line 8)")
    assert "does not attach to a2-highgpu-2g" in found["job.worker_pools[1].accelerator_type"]
    assert set(found) == {"job.regions[0]", "job.worker_pools[0].machine_type",
                          "job.worker_pools[1].accelerator_type"}


# --- the user's own table ------------------------------------------------------------------------


def test_a_users_table_extends_the_builtin_one(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    text = MINIMAL.replace("[us-central1]", "[us-central1, us-future1]").replace(
        POOL, "    - machine_type: x9-gpu-2g\n      accelerator_type: NVIDIA_L4\n"
              "      accelerator_count: 2\n")
    path = write(tmp_path, text)
    assert set(problems_of(path)) == {"job.regions[1]", "job.worker_pools[0].machine_type"}
    extra = tmp_path / "machines.json"
    extra.write_text(json.dumps({
        "regions": ["us-future1"],
        "machine_types": [{"names": ["x9-gpu-2g"], "accelerators": {"NVIDIA_L4": [2]}}],
        "accelerators": {"NVIDIA_L4": {"regions": ["us-future1"]}}}))
    monkeypatch.setenv(CATALOG_ENV, str(extra))
    checked = inspect_file(path)
    assert checked.problems == () and checked.pipeline is not None
    # The user's table lists where L4 is offered: us-central1 is not in it.
    assert [(w.path, "not offered in us-central1" in w.message) for w in checked.warnings] == [
        ("job.regions[0]", True)]
    assert str(extra) in load_catalog().where()


def test_an_unreadable_users_table_is_a_problem(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    broken = tmp_path / "machines.json"
    broken.write_text("{not json")
    monkeypatch.setenv(CATALOG_ENV, str(broken))
    with pytest.raises(ConfigError, match="cannot read the machine table"):
        load_catalog()
    assert validate_main([str(write(tmp_path, MINIMAL))]) == 1
    assert "cannot read the machine table" in capsys.readouterr().out


# --- warnings: settings that have no effect ------------------------------------------------------

# What is added to the minimal file -> the field warned about and words of the warning.
NO_EFFECT = {
    "escalate_after_preemptions without count": (
        "recovery: {escalation: never, escalate_after_preemptions: 5}\n",
        "recovery.escalate_after_preemptions", "no effect with escalation: never"),
    "escalate_after_preemptions under the default": (
        "recovery: {escalate_after_preemptions: 5}\n",
        "recovery.escalate_after_preemptions", "only escalation: count uses it"),
    "count with a deadline": (
        "deadline: 10h\nrecovery: {escalation: count}\n", "deadline",
        "the count policy ignores deadlines"),
    "always_standard with a Spot queue limit": (
        "recovery: {escalation: always_standard, stockout_wait: 5m}\n",
        "recovery.stockout_wait", "never queues for Spot"),
    "always_standard with a Spot cooldown": (
        "recovery: {escalation: always_standard, spot_cooldown: 1h}\n",
        "recovery.spot_cooldown", "never moves to Spot"),
}


@pytest.mark.parametrize("case", list(NO_EFFECT))
def test_settings_without_effect_warn_but_load(tmp_path: Path, case: str) -> None:
    extra, field, words = NO_EFFECT[case]
    checked = inspect_file(write(tmp_path, MINIMAL + extra))
    assert checked.problems == () and checked.pipeline is not None
    assert [w.path for w in checked.warnings] == [field]
    assert words in checked.warnings[0].message
    assert checked.warnings[0].message.endswith(")") and "(line " in checked.warnings[0].message


def test_settings_that_do_have_an_effect_do_not_warn(tmp_path: Path) -> None:
    text = MINIMAL + "deadline: 10h\nrecovery: {escalation: count, escalate_after_preemptions: 2}\n"
    assert inspect_file(write(tmp_path, text)).warnings[0].path == "deadline"  # count + deadline
    text = MINIMAL + "recovery: {escalation: count, escalate_after_preemptions: 2}\n"
    assert inspect_file(write(tmp_path, text)).warnings == ()
    for example in EXAMPLES.glob("*.yaml"):
        assert inspect_file(example).warnings == (), example


def test_validate_prints_warnings_and_still_succeeds(tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path, MINIMAL + "recovery: {escalation: never, escalate_after_preemptions: 5}\n")
    assert validate_main([str(path)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"OK {path} (pipeline minimal)"
    assert out[1].startswith(f"warning: {path}: recovery.escalate_after_preemptions: has no effect")


def test_warnings_do_not_stop_a_load_and_are_logged(tmp_path: Path,
                                                    caplog: pytest.LogCaptureFixture) -> None:
    write(tmp_path, MINIMAL + "recovery: {escalation: never, escalate_after_preemptions: 5}\n")
    with caplog.at_level("WARNING", logger="spotorch.spec.loader"):
        assert [p.name for p in load_pipelines(tmp_path)] == ["minimal"]
    assert "escalate_after_preemptions: has no effect" in caplog.text


def test_problems_and_warnings_come_together(tmp_path: Path) -> None:
    text = MINIMAL.replace("[us-central1]", "[us-centrall1]") + \
        "recovery: {escalation: never, escalate_after_preemptions: 5}\n"
    checked = inspect_file(write(tmp_path, text))
    assert checked.pipeline is None
    assert [p.path for p in checked.problems] == ["job.regions[0]"]
    assert [w.path for w in checked.warnings] == ["recovery.escalate_after_preemptions"]
