"""Pipeline files: schema and semantic problems (all of them, with file, path and line), loading."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from spotorch.core.errors import ConfigError, Problem
from spotorch.core.fields import format_duration, parse_duration
from spotorch.core.pipeline import BatchMode, EscalationKind, OnActiveRun
from spotorch.spec.loader import (
    cached_pipelines,
    check_file,
    clear_pipeline_cache,
    load_pipeline,
    load_pipelines,
    validate_main,
)
from spotorch.spec.schema import SCHEMA_ENV, schema_path

ROOT = Path(__file__).resolve().parent.parent
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
    """Field path -> message of every problem in a file (a file with none fails the test)."""
    with pytest.raises(ConfigError) as caught:
        load_pipeline(path)
    assert all(p.file == str(path) for p in caught.value.problems)
    return {p.path: p.message for p in caught.value.problems}


def with_lines(extra: str, base: str = MINIMAL) -> str:
    return base + textwrap.dedent(extra)


# --- the examples ---------------------------------------------------------------------------------


def test_the_examples_load() -> None:
    pipelines = {p.name: p for p in load_pipelines(EXAMPLES)}
    assert set(pipelines) == {"demo", "nightly-finetune"}
    demo = pipelines["demo"]
    assert (demo.trigger.bucket, demo.trigger.prefix) == ("spotorch-landing", "datasets/demo/")
    assert (demo.trigger.batch, demo.trigger.marker) == (BatchMode.MARKER, "_SUCCESS")
    package = demo.job.worker_pools[0].python_package  # the example code, no image
    assert package is not None and package.python_module == "spotorch_example.train"
    assert (package.source, demo.job.staging_uri) == ("../trainer", "gs://spotorch-staging/demo")
    assert (demo.checkpoint_uri, demo.output_uri) == ("gs://spotorch-checkpoints/demo",
                                                      "gs://spotorch-models/demo")
    assert demo.deadline_s and demo.recovery.escalation is EscalationKind.DEADLINE
    gpu = pipelines["nightly-finetune"]
    assert gpu.job.worker_pools[0].accelerator_count == 8
    assert gpu.job.regions[0] == "us-central1" and len(gpu.job.regions) > 1
    assert gpu.trigger.manifest and gpu.trigger.on_active_run is OnActiveRun.SUPERSEDE
    assert gpu.source.endswith("a100-spot.yaml")


def test_the_schema_file_is_valid_draft_2020_12() -> None:
    from jsonschema import Draft202012Validator

    schema = json.loads((ROOT / "schemas" / "pipeline.schema.json").read_text())
    Draft202012Validator.check_schema(schema)
    assert schema["$schema"].endswith("2020-12/schema")


def test_the_minimal_file_gets_the_dataclass_defaults(tmp_path: Path) -> None:
    p = load_pipeline(write(tmp_path, MINIMAL))
    assert p.trigger.batch is BatchMode.EACH_OBJECT
    assert p.trigger.ignore == ("*.tmp", "*/_temporary/*", "*/.*")
    assert p.job.regions == ("us-central1",) and p.deadline_s is None and p.routes == ()


def test_fields_are_converted(tmp_path: Path) -> None:
    p = load_pipeline(write(tmp_path, with_lines("""\
        deadline: 1h30m
        recovery: {expected_compute: 3600, backoff_base: 2s, retryable_exit_codes: [75]}
        """).replace("image_uri: python:3.11-slim", "image_uri: python:3.11-slim\n"
                     "      env: {EPOCHS: 3, LR: 0.5, NAME: x}")
        .replace("prefix: data/", "prefix: data/\n  ignore: ['*/_logs/*']")))
    assert p.deadline_s == 5400.0 and p.recovery.expected_compute_s == 3600.0
    assert p.recovery.backoff_base_s == 2.0 and p.recovery.retryable_exit_codes == (75,)
    assert p.job.worker_pools[0].env == (("EPOCHS", "3"), ("LR", "0.5"), ("NAME", "x"))
    assert p.trigger.ignore[-1] == "*/_logs/*" and "*.tmp" in p.trigger.ignore


@pytest.mark.parametrize("text, seconds", [
    (90, 90.0), (2.5, 2.5), ("90s", 90.0), ("30m", 1800.0), ("2h", 7200.0), ("1d", 86400.0),
    ("1h30m", 5400.0), ("1.5h", 5400.0), ("0s", 0.0),
])
def test_durations(text: object, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "90", "5 minutes", "1H", "-5s", -1, True, None, "h"])
def test_not_durations(text: object) -> None:
    with pytest.raises(ValueError):
        parse_duration(text)


def test_format_duration() -> None:
    assert [format_duration(s) for s in (5400, 90, 86400, 2.5)] == ["1h30m", "1m30s", "1d", "2.5s"]


# --- every problem, with file, path and line -----------------------------------------------------


BROKEN = """\
name: Bad_Name
trigger:
  bucket: gs://landing
  prefix: /data
  batch: marker
  marker: .done
  bukcet: x
job:
  regions: [us-central1-a]
  worker_pools:
    - machine_type: a2-highgpu-8g
      accelerator_count: 8
      env: {DEBUG: true}
checkpoint_uri: gs://ckpt/x
deadline: 5 minutes
recovery:
  max_preemptions: -1
  escalation: sometimes
routes:
  - channel: pager
    events: [run.failed]
"""


def test_every_problem_in_a_file_is_reported_with_its_path_and_line(tmp_path: Path) -> None:
    path = write(tmp_path, BROKEN)
    found = problems_of(path)
    expected = {
        "name": "lowercase letters",
        "trigger.bucket": "bucket name",
        "trigger.prefix": "no leading '/'",
        "trigger.marker": "ignore rule",
        "trigger.bukcet": "did you mean 'bucket'",
        "job.regions[0]": "not a zone",
        "job.worker_pools[0]": "needs image_uri or python_package",
        "job.worker_pools[0].accelerator_type": "required when accelerator_count",
        "job.worker_pools[0].env.DEBUG": "quote it",
        "output_uri": "is required",
        "deadline": "must be a duration",
        "recovery.max_preemptions": "at least 0",
        "recovery.escalation": "never, count, deadline, always_standard",
        "routes[0].channel": "chat, slack, email",
    }
    for field, words in expected.items():
        assert words in found.get(field, ""), (field, found.get(field))
    assert set(found) == set(expected)
    assert found["trigger.bukcet"].endswith("(line 7)")
    assert found["deadline"].endswith("(line 15)")
    assert found["output_uri"].endswith("(line 1)")  # missing: the line of its parent


def test_problems_come_in_file_order_and_print_as_file_path_message(tmp_path: Path) -> None:
    path = write(tmp_path, BROKEN)
    _, problems = check_file(path)
    lines = [int(p.message.rsplit("(line ", 1)[1].rstrip(")")) for p in problems]
    assert lines == sorted(lines)
    assert str(problems[0]).startswith(f"{path}: name: ")


# Semantic rule -> (YAML added to the minimal file, field path, words of the message).
SEMANTIC = {
    "deadline shorter than compute": (
        "deadline: 1h\nrecovery: {expected_compute: 2h}\n", "deadline", "cannot be met"),
    "deadline leaves no room to start": (
        "deadline: 1h\nrecovery: {expected_compute: 55m, restart_overhead: 10m}\n",
        "deadline", "plus one start"),
    "zero quiet period": (None, "trigger.quiet_period", "longer than zero"),
    "backoff base over cap": (
        "recovery: {backoff_base: 10m, backoff_cap: 1m}\n", "recovery.backoff_base",
        "longer than backoff_cap"),
    "bad regex": ("recovery: {infra_patterns: ['(oops']}\n", "recovery.infra_patterns[0]",
                  "regular expression"),
    "checkpoint inside the trigger": (
        "", "checkpoint_uri", "lies inside the trigger"),
    "trigger inside the output": (
        "", "output_uri", "own output"),
    "unknown route event": ("routes: [{channel: chat, events: [run.exploded]}]\n",
                            "routes[0].events[0]", "selects no spotorch event"),
    "addresses on a chat route": ("routes: [{channel: chat, events: ['*'], target: a@b.com}]\n",
                                  "routes[0].target", "email routes"),
    "reserved label": ("", "job.labels.spotorch-run", "reserved"),
    "reserved label key": ("", "job.labels.spotorch_run", "reserved"),
    "reserved env": ("", "job.worker_pools[0].env.SPOTORCH_RUN_ID", "reserved"),
    "two chiefs": ("", "job.worker_pools[0].replica_count", "must be 1"),
}

# Rule -> (old, new) replacements of the minimal file for rules that edit existing lines.
EDITS = {
    "zero quiet period": ("prefix: data/", "prefix: data/\n  batch: quiet_period\n"
                          "  quiet_period: 0s"),
    "checkpoint inside the trigger": ("checkpoint_uri: gs://ckpt/minimal",
                                      "checkpoint_uri: gs://landing/data/ckpt"),
    "trigger inside the output": ("output_uri: gs://models/minimal", "output_uri: gs://landing/"),
    "reserved label": ("job:\n", "job:\n  labels: {spotorch-run: x}\n"),
    "reserved label key": ("job:\n", "job:\n  labels: {spotorch_run: x}\n"),
    "reserved env": ("image_uri: python:3.11-slim",
                     "image_uri: python:3.11-slim\n      env: {SPOTORCH_RUN_ID: x}"),
    "two chiefs": ("image_uri: python:3.11-slim", "image_uri: python:3.11-slim\n"
                   "      replica_count: 2"),
}


@pytest.mark.parametrize("rule", list(SEMANTIC))
def test_semantic_rules(tmp_path: Path, rule: str) -> None:
    extra, field, words = SEMANTIC[rule]
    text = MINIMAL + (extra or "")
    if rule in EDITS:
        old, new = EDITS[rule]
        assert old in text
        text = text.replace(old, new)
    found = problems_of(write(tmp_path, text))
    assert words in found.get(field, ""), found


@pytest.mark.parametrize("trigger, field, words", [
    ("batch: each_object\n  snapshot_depth: 2", "trigger.snapshot_depth", "no effect"),
    ("batch: quiet_period\n  snapshot_depth: 0", "trigger.snapshot_depth", "at least 1"),
    ("batch: min_objects\n  quiet_period: 5m", "trigger.quiet_period", "only applies"),
    ("batch: quiet_period\n  manifest: true", "trigger.manifest", "only applies"),
    ("batch: marker\n  ignore: ['*']", "trigger.ignore[0]", "ignores every object"),
    ("batch: marker\n  marker: .ready", "trigger.marker", "never complete"),
])
def test_batch_option_rules(tmp_path: Path, trigger: str, field: str, words: str) -> None:
    text = MINIMAL.replace("prefix: data/", f"prefix: data/\n  {trigger}")
    assert words in problems_of(write(tmp_path, text)).get(field, "")


# Where a secret hides -> the field path reported. The value must never be echoed.
SECRETS = {
    "chat webhook as target": (
        "routes: [{channel: chat, events: ['*'], target: "
        "'https://chat.googleapis.com/v1/spaces/AAA/messages?key=SEKRIT1&token=SEKRIT2'}]\n",
        "routes[0].target"),
    "webhook field": ("routes: [{channel: slack, events: ['*'], "
                      "webhook_url: 'https://hooks.slack.com/services/T0/B0/SEKRIT'}]\n",
                      "routes[0].webhook_url"),
    "password field": ("description: x\npassword: SEKRIT\n", "password"),
    "api key in the job env": (None, "job.worker_pools[0].env.WANDB_API_KEY"),
    "token in args": (None, "job.worker_pools[0].args[1]"),
    "credentials in a URL": ("description: 'see https://bob:SEKRIT@example.com/x'\n",
                             "description"),
}
SECRET_EDITS = {
    "api key in the job env": ("image_uri: python:3.11-slim",
                               "image_uri: python:3.11-slim\n      env: {WANDB_API_KEY: SEKRIT}"),
    "token in args": ("image_uri: python:3.11-slim", "image_uri: python:3.11-slim\n"
                      "      args: [--slack, xoxb-0123456789-SEKRIT]"),
}


@pytest.mark.parametrize("case", list(SECRETS))
def test_secrets_are_rejected_without_being_echoed(tmp_path: Path, case: str) -> None:
    extra, field = SECRETS[case]
    text = MINIMAL + (extra or "")
    if case in SECRET_EDITS:
        text = text.replace(*SECRET_EDITS[case])
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as caught:
        load_pipeline(path)
    found = {p.path: p.message for p in caught.value.problems}
    assert "secrets never go in pipeline files" in found.get(field, ""), found
    assert "SEKRIT" not in str(caught.value)


@pytest.mark.parametrize("target", ["CHAT_WEBHOOK_URL", "sm://projects/p/secrets/chat",
                                    "sm://projects/p/secrets/chat/versions/3"])
def test_route_targets_name_where_the_secret_lives(tmp_path: Path, target: str) -> None:
    route = f"{{channel: chat, events: [run.failed, 'run.*'], target: '{target}'}}"
    text = MINIMAL + f"routes: [{route}]\n"
    assert load_pipeline(write(tmp_path, text)).routes[0].target == target


def test_email_routes_may_list_addresses(tmp_path: Path) -> None:
    text = MINIMAL + "routes: [{channel: email, events: ['*'], target: 'a@x.com, b@y.org'}]\n"
    assert load_pipeline(write(tmp_path, text)).routes[0].channel == "email"


@pytest.mark.parametrize("text, words", [
    ("", "empty"),
    ("name: [unclosed\n", "not valid YAML"),
    ("- a\n- b\n", "must be a mapping"),
    ("a: 1\n---\nb: 2\n", "not valid YAML"),
    (MINIMAL + "name: again\n", "given twice (lines 1 and 11)"),
    ("a: &x [*x]\n", "recursive alias"),
])
def test_files_that_are_not_pipeline_documents(tmp_path: Path, text: str, words: str) -> None:
    _, problems = check_file(write(tmp_path, text))
    assert any(words in p.message for p in problems), problems


def test_alias_bombs_are_refused(tmp_path: Path) -> None:
    bomb = "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{c}: &{c} [*{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}]\n"
        for p, c in zip("abcde", "bcdef", strict=True))
    _, problems = check_file(write(tmp_path, bomb))
    assert any("YAML nodes" in p.message for p in problems)


# --- many files ----------------------------------------------------------------------------------


def test_duplicate_names_across_files_and_problems_from_every_file(tmp_path: Path) -> None:
    (tmp_path / "team").mkdir()
    write(tmp_path, MINIMAL, "a.yaml")
    write(tmp_path, MINIMAL, "team/b.yml")
    write(tmp_path, MINIMAL.replace("name: minimal", "name: BAD"), "c.yaml")
    write(tmp_path, "ignored: true\n", ".hidden.yaml")
    with pytest.raises(ConfigError) as caught:
        load_pipelines(tmp_path)
    by_file = {(Path(p.file).name, p.path) for p in caught.value.problems}
    assert ("a.yaml", "name") in by_file and ("b.yml", "name") in by_file
    assert ("c.yaml", "name") in by_file
    assert not any(".hidden" in p.file for p in caught.value.problems)
    assert "also defined in" in str(caught.value)


@pytest.mark.parametrize("make", ["empty dir", "missing"])
def test_a_deployment_needs_pipelines(tmp_path: Path, make: str) -> None:
    target = tmp_path / "pipelines"
    if make == "empty dir":
        target.mkdir()
    with pytest.raises(ConfigError, match=r"no pipeline files|no such file"):
        load_pipelines(target)


def test_pipelines_are_loaded_once_per_process(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    path = write(tmp_path, MINIMAL)
    monkeypatch.setenv("SPOTORCH_PIPELINES", str(tmp_path))
    clear_pipeline_cache()
    try:
        first = cached_pipelines()
        path.write_text(MINIMAL.replace("name: minimal", "name: changed"))
        assert cached_pipelines() is first and cached_pipelines(tmp_path) is first
        clear_pipeline_cache()
        assert cached_pipelines()[0].name == "changed"
    finally:
        clear_pipeline_cache()


def test_the_schema_can_live_elsewhere(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    moved = tmp_path / "schema.json"
    moved.write_text((ROOT / "schemas" / "pipeline.schema.json").read_text())
    monkeypatch.setenv(SCHEMA_ENV, str(moved))
    assert schema_path() == moved
    monkeypatch.setenv(SCHEMA_ENV, str(tmp_path / "nowhere.json"))
    assert schema_path() != tmp_path / "nowhere.json"  # falls back to schemas/


# --- spotorch validate ---------------------------------------------------------------------------


def test_validate_prints_ok_per_good_file(capsys: pytest.CaptureFixture[str]) -> None:
    assert validate_main([str(EXAMPLES)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert sorted(out) == [f"OK {EXAMPLES / 'a100-spot.yaml'} (pipeline nightly-finetune)",
                           f"OK {EXAMPLES / 'demo.yaml'} (pipeline demo)"]


def test_validate_prints_every_problem_and_fails(tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    bad = write(tmp_path, BROKEN, "bad.yaml")
    good = write(tmp_path, MINIMAL, "good.yaml")
    assert validate_main([str(bad), str(good), str(tmp_path / "missing.yaml")]) == 1
    captured = capsys.readouterr()
    _, problems = check_file(bad)
    lines = captured.out.splitlines()
    assert f"OK {good} (pipeline minimal)" in lines
    assert all(str(p) in lines for p in problems) and len(problems) >= 10
    assert any("missing.yaml: <root>: no such file" in line for line in lines)
    assert "problems in 2 files" in captured.err


def test_validate_defaults_to_spotorch_pipelines(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    write(tmp_path, MINIMAL)
    monkeypatch.setenv("SPOTORCH_PIPELINES", str(tmp_path))
    assert validate_main([]) == 0
    assert "OK" in capsys.readouterr().out


def test_problem_str_is_file_path_message() -> None:
    assert str(Problem("f.yaml", "trigger.bucket", "bad")) == "f.yaml: trigger.bucket: bad"


def test_health_options_are_read_from_the_file_and_checked(tmp_path: Path) -> None:
    good = tmp_path / "good.yaml"
    good.write_text(MINIMAL + "health: {hang_after: 10m, keep_last: 3, fallback_machines: "
                              "[n1-highmem-8]}\n")
    pipeline = load_pipeline(good)
    assert pipeline.health.hang_after_s == 600.0 and pipeline.health.keep_last == 3
    assert pipeline.health.fallback_machines == ("n1-highmem-8",)
    bad = tmp_path / "bad.yaml"
    bad.write_text(MINIMAL + "health: {hang_factor: 0.5, oom_patterns: ['(oops']}\n")
    with pytest.raises(ConfigError) as err:
        load_pipeline(bad)
    text = str(err.value)
    assert "health.hang_factor" in text and "health.oom_patterns[0]" in text
    unknown = tmp_path / "unknown.yaml"
    unknown.write_text(MINIMAL + "health: {hang_aftr: 10m}\n")
    with pytest.raises(ConfigError, match=r"health\.hang_aftr"):
        load_pipeline(unknown)


def test_sweep_and_model_options_are_read_from_the_file(tmp_path: Path) -> None:
    path = tmp_path / "sweep.yaml"
    path.write_text(MINIMAL + """\
sweep:
  search: random
  seed: 7
  trials: 4
  metric: loss
  parameters:
    - {name: lr, low: 1.0e-4, high: 1.0e-1, scale: log}
    - {name: layers, values: [1, 2, 3]}
  early_stopping: {min_trials: 2, min_step: 20}
model:
  serving_image: us-docker.pkg.dev/vertex-ai/prediction/sklearn-cpu.1-3:latest
  labels: {team: ml}
""")
    pipeline = load_pipeline(path)
    assert pipeline.sweep is not None and pipeline.sweep.trials == 4
    assert pipeline.sweep.parameters[0].scale == "log"
    assert pipeline.sweep.early_stopping is not None and pipeline.sweep.early_stopping.min_step == 20
    assert pipeline.model is not None and pipeline.model.labels == (("team", "ml"),)
    bad = tmp_path / "bad.yaml"
    bad.write_text(MINIMAL + "sweep: {parameters: [{name: lr}], goal: sideways}\n"
                             "model: {labels: {Team: x}}\n")
    with pytest.raises(ConfigError) as err:
        load_pipeline(bad)
    assert "sweep.goal" in str(err.value) and "model.labels" in str(err.value)
