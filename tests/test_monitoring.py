"""Cloud Monitoring (deploy/monitoring.tf) against what the code logs.

The functions run a preempted-then-successful run and a failed one (functions-framework's test
client, in-memory adapters); their log lines are captured as the JSON spotorch writes to stdout,
turned into the jsonPayload Cloud Logging makes of them, and each log-based metric's filter and
extractors are evaluated against them: a metric that matches nothing, or extracts a field the
lines lack, fails. The dashboard and the alerting policy may only name metrics and labels that
exist.
"""

from __future__ import annotations

import base64
import io
import json
import logging
import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from cloudevents.conversion import to_structured
from cloudevents.http import CloudEvent

from fakes import fake_deps
from spotorch.adapters.memory.twins import InMemoryLauncher, InMemoryObjectStore
from spotorch.app.deps import Deps
from spotorch.core.model import FailureClass, JobPhase, RunStatus
from spotorch.core.pipeline import BatchMode, EscalationKind, Pipeline, RecoveryPolicy, Trigger
from spotorch.entrypoints import functions as entry
from spotorch.logs import JsonFormatter
from spotorch.operate.terraform import Tf, block, load_tf

ROOT = Path(__file__).resolve().parent.parent
MAIN = str(ROOT / "functions" / "main.py")
DEPLOY = ROOT / "deploy"
# What Cloud Run's structured logging takes out of a JSON line into the LogEntry itself; the rest
# is the entry's jsonPayload (https://cloud.google.com/run/docs/logging#special-fields).
SPECIAL_FIELDS = frozenset({"severity", "time", "timestamp", "logging.googleapis.com/labels",
                            "logging.googleapis.com/trace", "logging.googleapis.com/spanId",
                            "logging.googleapis.com/insertId", "httpRequest"})


# --- running the code and keeping what it logs ------------------------------------------------------

@pytest.fixture
def deps(monkeypatch: pytest.MonkeyPatch) -> Iterator[Deps]:
    pipeline = Pipeline(name="demo", trigger=Trigger(bucket="landing", prefix="datasets/",
                                                     batch=BatchMode.EACH_OBJECT),
                        checkpoint_uri="gs://ckpt/demo", output_uri="gs://models/demo",
                        recovery=RecoveryPolicy(escalation=EscalationKind.NEVER,
                                                max_user_errors=0))
    fake = fake_deps(pipeline)
    monkeypatch.setattr(entry, "deps", lambda: fake)
    yield fake


def _post(target: str, event: CloudEvent) -> None:
    import functions_framework

    app = functions_framework.create_app(target, MAIN, "cloudevent").test_client()
    headers, body = to_structured(event)
    assert app.post("/", headers=headers, data=body).status_code == 200


def _upload(deps: Deps, name: str) -> None:
    assert isinstance(deps.objects, InMemoryObjectStore)
    deps.objects.put("landing", name, 1, b"x,y\n")
    _post("on_object_finalized", CloudEvent(
        {"type": "google.cloud.storage.object.v1.finalized", "id": f"up-{name}",
         "source": "//storage.googleapis.com/projects/_/buckets/landing",
         "subject": f"objects/{name}"},
        {"bucket": "landing", "name": name, "generation": "1", "metageneration": "1",
         "size": "4", "contentType": "text/csv", "timeCreated": "2026-11-29T10:00:00.000Z",
         "updated": "2026-11-29T10:00:00.000Z"}))


def _tick(n: int) -> None:
    _post("on_tick", CloudEvent({"type": "google.cloud.pubsub.topic.v1.messagePublished",
                                 "id": f"tick-{n}", "source": "//pubsub.googleapis.com/x"},
                                {"message": {"data": base64.b64encode(b"{}").decode(),
                                             "messageId": f"tick-{n}",
                                             "publishTime": "2026-11-29T10:00:00Z"}}))


def _run_the_story(deps: Deps) -> None:
    """One run preempted then successful, one failed by its own code."""
    launcher = deps.launcher
    assert isinstance(launcher, InMemoryLauncher)
    _upload(deps, "datasets/a.csv")
    good = deps.runs.active()[0]
    launcher.set_status(launcher.job_of(good.run_id, 1), JobPhase.FAILED,
                        failure=FailureClass.PREEMPTED, message="The Spot VM was preempted.")
    _tick(1)  # the preemption is seen: attempt 2 at once
    launcher.set_status(launcher.job_of(good.run_id, 2), JobPhase.SUCCEEDED)
    _tick(2)
    _upload(deps, "datasets/b.csv")
    bad = next(r for r in deps.runs.active() if r.run_id != good.run_id)
    launcher.set_status(launcher.job_of(bad.run_id, 1), JobPhase.FAILED,
                        failure=FailureClass.USER_ERROR, exit_code=1,
                        message="The replica workerpool0-0 exited with a non-zero status of 1.")
    _tick(3)
    statuses = [getattr(deps.runs.load(r)[0], "status", None) for r in (good.run_id, bad.run_id)]
    assert statuses == [RunStatus.SUCCEEDED, RunStatus.FAILED]


def json_payload(line: Mapping[str, Any]) -> dict[str, Any]:
    """The jsonPayload Cloud Logging makes of one JSON line written to stdout."""
    return {k: v for k, v in line.items() if k not in SPECIAL_FIELDS}


# --- reading the metrics as deployed --------------------------------------------------------------

def log_metrics(tf: Tf) -> dict[str, dict[str, Any]]:
    """Each google_logging_metric instance: its filter and extractors, interpolations done."""
    body = tf.resource("google_logging_metric")["spotorch"]
    assert body["for_each"] == "${local.log_metrics}"
    extra = tf.locals.get("log_metric_extra_filter", {})
    out = {}
    for key, spec in tf.locals["log_metrics"].items():
        def render(text: str, key: str = key, spec: Mapping[str, Any] = spec) -> str:
            text = text.replace('${lookup(local.log_metric_extra_filter, each.key, "")}',
                                extra.get(key, ""))
            text = re.sub(r"\$\{each\.value\.(\w+)\}", lambda m: str(spec[m.group(1)]), text)
            assert "${" not in text, f"{key}: cannot read {text!r}"
            return text

        labels = {label: f"EXTRACT(jsonPayload.{label})" for label in spec["labels"]}
        assert body["label_extractors"] == \
            '${{for label in each.value.labels : label => "EXTRACT(jsonPayload.${label})"}}'
        assert body["value_extractor"] == \
            '${each.value.value == null ? null : "EXTRACT(jsonPayload.${each.value.value})"}'
        value = None if spec["value"] is None else f"EXTRACT(jsonPayload.{spec['value']})"
        out[key] = {"filter": render(body["filter"]), "labels": labels, "value": value,
                    "distribution": spec["value"] is not None}
    return out


_CLAUSE = re.compile(r'^jsonPayload\.([A-Za-z_][\w.]*)\s*=\s*"((?:[^"\\]|\\.)*)"$')


def matches(log_filter: str, payload: Mapping[str, Any]) -> bool:
    """The Logging query language, as far as these filters use it: `jsonPayload.f="v"` AND-ed."""
    for clause in log_filter.split(" AND "):
        found = _CLAUSE.match(clause.strip())
        assert found, f"the test cannot evaluate {clause!r}: extend matches() first"
        value: Any = payload
        for part in found.group(1).split("."):
            value = value.get(part) if isinstance(value, Mapping) else None
        if value is None or str(value) != found.group(2):
            return False
    return True


def extracted(extractor: str, payload: Mapping[str, Any]) -> Any:
    found = re.fullmatch(r"EXTRACT\(jsonPayload\.(\w+)\)", extractor)
    assert found, f"the test cannot evaluate {extractor!r}"
    return payload.get(found.group(1))


@pytest.fixture(scope="module")
def tf() -> Tf:
    return load_tf(DEPLOY)


def _story_lines(deps: Deps) -> list[dict[str, Any]]:
    """The story's log lines as jsonPayloads: spotorch's own formatter, INFO and up."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger("spotorch")
    level, root.level = root.level, logging.INFO
    root.addHandler(handler)
    try:
        _run_the_story(deps)
    finally:
        root.removeHandler(handler)
        root.setLevel(level)
    return [json_payload(json.loads(line)) for line in stream.getvalue().splitlines()]


def test_each_metric_counts_the_lines_it_is_meant_to(deps: Deps, tf: Tf) -> None:
    payloads = _story_lines(deps)
    metrics = log_metrics(tf)
    assert set(metrics) == {"spotorch/runs_ended", "spotorch/run_spend", "spotorch/preemptions",
                            "spotorch/relaunch_latency", "spotorch/ticks"}
    counted = {}
    for name, metric in metrics.items():
        hits = [p for p in payloads if matches(metric["filter"], p)]
        assert hits, f"{name}: its filter {metric['filter']} matches no line the code wrote"
        for label, extractor in metric["labels"].items():
            values = [extracted(extractor, p) for p in hits]
            assert all(isinstance(v, str) and v for v in values), (name, label, values)
        if metric["value"]:
            values = [extracted(metric["value"], p) for p in hits]
            assert all(isinstance(v, int | float) and not isinstance(v, bool) for v in values), \
                (name, values)
        counted[name] = hits
    statuses = sorted(p["status"] for p in counted["spotorch/runs_ended"])
    assert statuses == ["FAILED", "SUCCEEDED"]
    assert [p["region"] for p in counted["spotorch/preemptions"]] == ["us-central1"]
    (relaunch,) = counted["spotorch/relaunch_latency"]
    assert relaunch["attempt"] == 2 and relaunch["relaunch_s"] >= 0
    assert all(p["spent"] >= 0 and p["currency"] == "USD" for p in counted["spotorch/run_spend"])
    assert len(counted["spotorch/ticks"]) == 3
    # each line is what it says: one run_ended per run, whatever the redeliveries
    assert len({p["run_id"] for p in counted["spotorch/runs_ended"]}) == 2


def test_a_filter_that_matches_nothing_fails(deps: Deps, tf: Tf) -> None:
    """The check can fail: a metric reading a field the code does not write matches nothing."""
    payloads = _story_lines(deps)
    assert not any(matches('jsonPayload.spotorch_metric="run_finished"', p) for p in payloads)
    assert not any(matches('jsonPayload.spotorch_metric="run_ended" AND jsonPayload.after='
                           '"preempted"', p) for p in payloads)


def test_the_dashboard_and_the_alert_name_metrics_and_labels_that_exist(tf: Tf) -> None:
    labels = {name: set(spec["labels"]) for name, spec in tf.locals["log_metrics"].items()}
    for tile in tf.locals["dashboard_tiles"]:
        assert tile["metric"] in labels, tile
        assert {f.removeprefix("metric.label.") for f in tile["by"]} <= labels[tile["metric"]]
    assert len(tf.locals["dashboard_tiles"]) == len(labels)  # a chart per metric
    policy = tf.resource("google_monitoring_alert_policy")["spotorch"]
    filters = []
    for condition in policy["conditions"]:
        for kind in ("condition_threshold", "condition_absent"):
            found = block(condition, kind)
            if found:
                filters.append((found["filter"], block(found, "aggregations")))
    assert len(filters) == 2
    for text, aggregation in filters:
        metric = re.search(r'metric\.type="\$\{local\.metric_prefix\}([\w/]+)"', text)
        assert metric and metric.group(1) in labels, text
        used = set(re.findall(r"metric\.label\.(\w+)", text)) | {
            f.removeprefix("metric.label.") for f in aggregation.get("group_by_fields", [])}
        assert used <= labels[metric.group(1)], (text, used)
    assert tf.locals["metric_prefix"] == "logging.googleapis.com/user/"
