"""End to end on the local stack: the demo's scenarios, with real checkpoints, events and alerts.

The default story's one run (preempted twice, escalated, succeeded) serves both its report's tests
and every operator command against it (the CLI by the stack's state file, the run's page in
headless Chromium): TestDefaultStory shares one stack, stopped as soon as its tests end, before
the other scenarios start theirs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from spotorch.core.events import kind_of
from spotorch.core.model import Run
from spotorch.local.demo import SCENARIOS, DemoStack, demo_stack, run_demo
from spotorch.spec.event_schemas import validate_event

pytestmark = [pytest.mark.emulator, pytest.mark.slow]
ROOT = Path(__file__).resolve().parent.parent

_REPORTS: dict[str, dict[str, Any]] = {}


def report(name: str) -> dict[str, Any]:
    if name not in _REPORTS:
        _REPORTS[name] = run_demo(SCENARIOS[name], timeout_s=180.0, quiet=True)
    return _REPORTS[name]


def kinds(r: dict[str, Any]) -> list[str]:
    return [kind_of(t) for t in r["events"]]


@dataclass(frozen=True)
class DefaultStory:
    """The default story's stack, still up, and its report as `spotorch demo` makes it, taken
    before any command below acted on the stack (a submitted run's events and alerts are not in it)."""

    demo: DemoStack
    report: dict[str, Any]


@pytest.fixture(scope="class")
def default_story() -> Iterator[DefaultStory]:
    with demo_stack(SCENARIOS["default"], timeout_s=180.0, quiet=True) as demo:
        yield DefaultStory(demo, demo.report())


@pytest.fixture(scope="class")
def stack_run(default_story: DefaultStory, tmp_path_factory: pytest.TempPathFactory
              ) -> tuple[dict[str, str], Path, Run]:
    """The default story's finished run on its stack; a state file like `dev up`'s."""
    stack, run = default_story.demo.stack, default_story.demo.run
    assert run is not None and run.status == "SUCCEEDED", run
    work = tmp_path_factory.mktemp("spotorch-cli-stack")
    state = work / "stack.json"
    state.write_text(json.dumps({**stack.describe(), "status": "ready",
                                 "supervisor": {"pid": os.getpid()}}))
    # os.environ points at the stack while demo_stack is open; the CLI must find it by the state
    # file alone.
    env = {k: v for k, v in os.environ.items()
           if k not in ("SPOTORCH_API_URL", "FIRESTORE_EMULATOR_HOST", "SPOTORCH_PROJECT",
                        "SPOTORCH_PIPELINES")}
    return {**env, "COLUMNS": "200", "XDG_CONFIG_HOME": str(work)}, state, run


def spotorch(env: dict[str, str], state: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """The CLI finding the local stack by its state file alone (no env exports)."""
    return subprocess.run([sys.executable, "-m", "spotorch.operate.cli", "--state", str(state), *args],
                          env=env, capture_output=True, text=True, timeout=120, cwd=ROOT)


class TestDefaultStory:
    """The default story's report, then every operator command against its run on its stack."""

    def test_default_scenario_resumes_from_checkpoints_escalates_and_succeeds(
            self, default_story: DefaultStory) -> None:
        r = default_story.report
        assert r["status"] == "SUCCEEDED", r.get("history")
        capacities = [a["capacity"] for a in r["attempts"]]
        assert capacities == ["spot", "spot", "standard"]
        first, second, third = r["attempts"]
        assert first["resumed_from_step"] is None and first["end_reason"].startswith("preempted")
        assert second["resumed_from_step"] is not None and second["resumed_from_step"] > 0
        assert third["resumed_from_step"] >= second["resumed_from_step"]
        assert all(a["job_name"].startswith("projects/") and "/customJobs/" in a["job_name"]
                   for a in r["attempts"])
        assert r["preemptions"] == 2 and r["escalated"]["to"] == "standard"
        assert r["metrics"]["test_accuracy"] > 0.6 and r["model_uri"].endswith("model.npz")
        assert r["timings_ms"]["upload_to_launch"] < 10_000
        # Attempt 1's preemption came with its job-state line; attempt 2's lines were all lost
        # (the schedule's drop_events), so only the tick's polling saw it: within one period.
        heard, polled = r["timings_ms"]["preemption_to_relaunch_each"]
        assert heard < 5_000 and polled <= r["tick_s"] * 1000 + 1500
        assert kinds(r)[0] == "run.created" and kinds(r)[-1] == "run.succeeded"
        assert kinds(r).count("attempt.preempted") == 2 and "run.escalated" in kinds(r)

    def test_the_report_names_the_runs_provenance(self, default_story: DefaultStory) -> None:
        """Issue 30: every object of the snapshot at its generation, and the code's hash."""
        prov = default_story.report["provenance"]
        data = prov["data"]
        assert data["pinned"] and data["bucket"] == "spotorch-landing"
        names = sorted(o["name"].rsplit("/", 1)[-1] for o in data["objects"])
        assert names == ["_SUCCESS", "part-00000.csv", "part-00001.csv", "part-00002.csv"]
        assert all(isinstance(o["generation"], int) and o["generation"] > 0
                   for o in data["objects"])
        assert len(prov["code"]["hash"]) == 64 and prov["code"]["pinned"] is False  # a tag
        (pool,) = prov["code"]["pools"]
        assert pool["package_hashes"] and all(pool["package_hashes"])
        assert pool["package_uris"] == default_story.report["attempts"][0]["code"]["package_uris"]
        assert isinstance(prov["seed"], int) and len(prov["pipeline"]["hash"]) == 64
        assert prov["hardware"]["pools"][0]["machine_type"] == "n1-standard-4"
        created = next(e for e in default_story.report["published"]
                       if kind_of(e["type"]) == "run.created")
        assert created["data"]["provenance"]["data"]["objects_hash"] == data["objects_hash"]

    def test_the_default_story_runs_its_code_as_a_python_package_on_a_prebuilt_container(
            self, default_story: DefaultStory) -> None:
        codes = [a["code"] for a in default_story.report["attempts"]]
        assert codes[0] == codes[1] == codes[2]  # every attempt ran the same built package
        code = codes[0]
        assert code["python_module"] == "spotorch_example.train"
        assert code["executor_image_uri"] == \
            "us-docker.pkg.dev/vertex-ai/training/sklearn-cpu.1-0:latest"
        trainer, example = code["package_uris"]  # content-addressed, spotorch_trainer first
        assert trainer.startswith("gs://spotorch-staging/demo/packages/")
        assert trainer.endswith("/spotorch_trainer-0.1.0.tar.gz")
        assert example.endswith("/spotorch_example-0.1.0.tar.gz")
        log = next((default_story.demo.work_dir / "stack" / "vertex").glob("*/workerpool0-0.log"))
        assert "running python -m spotorch_example.train" in log.read_text()

    def test_every_published_event_validates_against_its_schema(
            self, default_story: DefaultStory) -> None:
        r = default_story.report
        assert r["published"]
        for event in r["published"]:
            assert validate_event(event) == [], event

    def test_alerts_reach_chat_and_email(self, default_story: DefaultStory) -> None:
        r = default_story.report
        channels = {a["channel"] for a in r["alerts"]}
        assert {"chat", "email"} <= channels
        assert {"channel": "email", "event_type": "dev.spotorch.run.succeeded.v1"} in r["alerts"]

    def test_reads_on_the_local_stack(self, stack_run: tuple[dict[str, str], Path, Run]) -> None:
        env, state, run = stack_run
        listed = json.loads(spotorch(env, state, "runs", "--json").stdout)
        row = next(r for r in listed["runs"] if r["run_id"] == run.run_id)
        assert row["status"] == "SUCCEEDED" and row["attempts"] == 3 and row["cost"] > 0
        view = json.loads(spotorch(env, state, "show", run.run_id, "--json").stdout)
        assert [a["capacity"] for a in view["attempts"]] == ["spot", "spot", "standard"]
        assert view["model_uri"].startswith("gs://spotorch-models/") and view["model_ready"]
        # Priced from the stack's own pipeline file (its restart overhead is 5 s), never unpriced.
        # The demo's attempts last seconds: three start-ups, two at the Spot price, against the
        # standard equivalent's one, so the run comes out within a few percent of standard, on
        # either side (a CI run measured 1% above). A run priced wrongly (Spot billed at the
        # standard price, or no pipeline to price it by) is far from it.
        cost = view["cost"]
        assert cost["preemptions"] == 2 and cost["total"] > 0, cost
        assert cost["total"] <= 1.1 * cost["standard_equivalent"], cost
        assert "pipeline unknown" not in " ".join(cost["basis"])
        text = spotorch(env, state, "show", run.run_id)
        assert text.returncode == 0 and "standard VMs" in text.stdout
        watched = spotorch(env, state, "watch", run.run_id)
        assert watched.returncode == 0 and cost["summary"] in watched.stdout, watched.stdout

    def test_logs_are_the_workers_own_output(self, stack_run: tuple[dict[str, str], Path, Run]) -> None:
        env, state, run = stack_run
        first = spotorch(env, state, "logs", run.run_id, "--attempt", "1")
        assert first.returncode == 0, first.stderr
        assert f"run {run.run_id} attempt 1:" in first.stdout
        last = spotorch(env, state, "logs", run.run_id)
        assert "done: test accuracy" in last.stdout and "resuming from" in last.stdout

    def test_the_run_page_of_a_local_stack_run_in_chromium(
            self, stack_run: tuple[dict[str, str], Path, Run]) -> None:
        from playwright.sync_api import sync_playwright

        from spotorch.operate.backend import backend_for
        from spotorch.operate.target import resolve
        from spotorch.operate.ui.server import UIServer
        from test_ui import CHROMIUM_FLAGS, _ensure_chromium, _shot

        env, state, run = stack_run
        target = resolve(stack_state=state, environ=env)
        assert target.local
        server = UIServer(backend_for(target), port=0, refresh_s=600).start()
        try:
            with sync_playwright() as p:
                browser = p.chromium.launch(executable_path=_ensure_chromium(), headless=True,
                                            args=CHROMIUM_FLAGS)
                page = browser.new_page(viewport={"width": 1280, "height": 900})
                page.goto(f"{server.url}runs/{run.run_id}")
                lanes = page.locator("svg.timeline g.lane")
                assert [lanes.nth(i).get_attribute("data-capacity") for i in range(lanes.count())] \
                    == ["spot", "spot", "standard"]
                assert page.locator("svg.timeline g.preemption").count() == 2
                assert page.locator("svg.timeline g.checkpoint").count() >= 2
                assert "saved against standard VMs" in page.locator(".ledger").inner_text()
                _shot(page, "stack-run")
                page.goto(server.url)
                assert page.locator(f'tr.run[data-run-id="{run.run_id}"]').count() == 1
                _shot(page, "stack-runs")
                browser.close()
        finally:
            server.close()

    def test_forged_reports_and_an_unconfirmed_cancel_line_change_nothing_and_are_recorded(
            self, default_story: DefaultStory,
            stack_run: tuple[dict[str, str], Path, Run]) -> None:
        """Issue 27's "done when", on the local stack: a forged checkpoint report naming another
        run's checkpoint, a forged `completed` and a real-shaped cancel line for a job Vertex
        runs change nothing and are recorded; the trainer's own signed reports are applied."""
        from spotorch.adapters.gcp.firestore import FirestoreDocumentStore
        from spotorch.app.run_store import DocumentRunStore
        from spotorch.settings import TOPIC_JOB_EVENTS, TOPIC_TRAINER_EVENTS
        from spotorch_trainer import contract

        env, state, story = stack_run
        stack = default_story.demo.stack
        docs = FirestoreDocumentStore(project=stack.project)
        runs = DocumentRunStore(docs)
        submitted = spotorch(env, state, "submit", "demo", story.data_uri, "--request-id",
                             "forged", "--json")
        assert submitted.returncode == 0, submitted.stderr
        run_id = json.loads(submitted.stdout)["run_id"]
        deadline = time.monotonic() + 60
        while True:  # running, and its trainer's signed reports believed
            live, _ = runs.load(run_id)
            assert live is not None and time.monotonic() < deadline, live
            if live.current and live.current.state == "RUNNING" and live.progress.step > 0:
                break
            time.sleep(0.2)
        assert story.latest_checkpoint is not None
        job_id = (live.current.job_name or "").rsplit("/", 1)[1]
        stamp = contract.rfc3339(time.time())

        def trainer(kind: str, step: int, **extra: Any) -> bytes:
            return json.dumps({"event_id": f"{run_id}/1/{kind}/forged-{step}", "kind": kind,
                               "run_id": run_id, "attempt": 1, "pipeline": "demo",
                               "step": step, "total_steps": 600, "time": stamp,
                               **extra}).encode()

        trainer_attrs = {"spotorch_source": "trainer", "attempt": "1"}
        forged = {
            "checkpoint": stack.publish(TOPIC_TRAINER_EVENTS, trainer(
                "checkpoint", story.latest_checkpoint.step,
                checkpoint_uri=story.latest_checkpoint.uri), **trainer_attrs),
            "completed": stack.publish(TOPIC_TRAINER_EVENTS, trainer("completed", 600),
                                       **trainer_attrs),
            "cancel line": stack.publish(TOPIC_JOB_EVENTS, json.dumps({
                "logName": f"projects/{stack.project}/logs/ml.googleapis.com%2F{job_id}",
                "resource": {"type": "ml_job", "labels": {"job_id": job_id,
                                                          "project_id": stack.project,
                                                          "task_name": "service"}},
                "textPayload": "Job is being cancelled.", "timestamp": stamp,
                "severity": "INFO", "insertId": "forged-1"}).encode(),
                **{"logging.googleapis.com/timestamp": stamp}),
        }
        reasons: dict[str, str] = {}
        deadline = time.monotonic() + 30
        while len(reasons) < len(forged) and time.monotonic() < deadline:
            for what, message_id in forged.items():
                record, _ = docs.get("rejected_events", message_id)
                if record is not None:
                    reasons[what] = str(record["reason"])
            time.sleep(0.2)
        assert set(reasons) == set(forged), reasons
        assert "unsigned" in reasons["checkpoint"] and "unsigned" in reasons["completed"]
        assert "the line says CANCELLING" in reasons["cancel line"], reasons
        after, _ = runs.load(run_id)
        assert after is not None
        assert after.latest_checkpoint is None or \
            after.latest_checkpoint.uri.startswith(after.checkpoint_uri + "/")
        assert after.progress.step < 600 and after.status != "CANCELLING"
        assert after.attempts[0].state != "CANCELLING" or after.attempts[0].cancel_reason
        cancelled = spotorch(env, state, "cancel", run_id, "--json")  # done with it
        assert cancelled.returncode == 0, cancelled.stderr
        for attempt in runs.load(run_id)[0].attempts:  # type: ignore[union-attr]
            assert attempt.resumed_from_uri is None or \
                attempt.resumed_from_uri.startswith(after.checkpoint_uri + "/")

    def test_actions_through_the_stacks_api_function(
            self, stack_run: tuple[dict[str, str], Path, Run]) -> None:
        env, state, story_run = stack_run
        # Last of the class: a run submitted by hand on the story's data (gs://spotorch-landing/
        # datasets/demo/snapshot-.../), cancelled at once.
        submitted = spotorch(env, state, "submit", "demo", story_run.data_uri,
                             "--request-id", "by-hand", "--json")
        assert submitted.returncode == 0, submitted.stderr
        run_id = json.loads(submitted.stdout)["run_id"]
        cancelled = spotorch(env, state, "cancel", run_id, "--json")
        assert cancelled.returncode == 0, cancelled.stderr
        assert json.loads(cancelled.stdout)["status"] in ("CANCELLING", "CANCELLED")
        deadline = time.monotonic() + 60
        while True:
            view = json.loads(spotorch(env, state, "show", run_id, "--json").stdout)
            if view["status"] == "CANCELLED":
                break
            assert time.monotonic() < deadline, view["status"]
            time.sleep(1)
        history = [h["what"] for h in view["history"]]
        assert history[0] == "created" and "status CANCELLED" in history


def test_stockout_scenario_moves_to_standard_then_probes_its_way_back_to_spot() -> None:
    r = report("stockout")
    assert r["status"] == "SUCCEEDED", r.get("history")
    capacities = [a["capacity"] for a in r["attempts"]]
    assert capacities[:3] == ["spot", "spot", "standard"] and capacities[-1] == "spot"
    assert [a["region"] for a in r["attempts"][:2]] == ["us-central1", "europe-west4"]
    assert r["attempts"][0]["failure_class"] == "stockout"
    # On standard, Spot probes found capacity again; the run went back to Spot, resuming.
    standard, back = r["attempts"][2], r["attempts"][3]
    assert standard["end_reason"] == "cancelled (switch)" and back["resumed_from_step"]
    probes = r["probes"]
    assert probes and probes[-1]["found"] is True and r["counters"]["probes"] == len(probes)
    assert all(p["state"] == "CANCELLED" for p in probes)  # none left behind
    # A probe never counts as an attempt: no attempt has a probe's job, no budget moved.
    assert not {p["job_name"] for p in probes} & {a["job_name"] for a in r["attempts"]}
    assert r["counters"]["stockouts"] == 2 and len(r["attempts"]) == 4
    assert "spot_probed" in " ".join(kinds(r)) and "probe" in back_reason(r)
    assert r["cost"]["probes"] == len(probes)


def back_reason(r: dict[str, Any]) -> str:
    return str(r["escalated"]["reason"]) if r["escalated"] else ""


# The only stack run of a failed attempt's error: the worker's stderr through the emulator's
# ListLogEntries (with deploy's logging grant) into the run, its alert and the report.
def test_user_error_scenario_fails_with_its_budget_and_says_why() -> None:
    r = report("user-error")
    assert r["status"] == "FAILED"
    assert "user_errors budget exhausted" in r["end_reason"]
    assert [a["exit_code"] for a in r["attempts"]] == [1, 1]
    errors = [a.get("error") or "" for a in r["attempts"]]
    assert errors == ["DeliberateFailure: failing at step 120 as asked (--fail-at-step)"] * 2
    assert kinds(r)[-2:] == ["run.budget_exceeded", "run.failed"]


@pytest.mark.extended  # the default scenario loses attempt 2's job events: the same path
def test_lost_job_events_are_repaired_by_the_tick_within_one_period() -> None:
    r = run_demo(SCENARIOS["default"], timeout_s=180.0, quiet=True, lose_job_events=True)
    assert r["status"] == "SUCCEEDED", r.get("history")
    assert [a["capacity"] for a in r["attempts"]] == ["spot", "spot", "standard"]
    # Only polling saw the preemptions: the relaunch came at the next tick (plus handling time).
    assert r["timings_ms"]["preemption_to_relaunch"] <= r["tick_s"] * 1000 + 1500


def test_hardware_scenario_trains_on_the_cheapest_candidate_that_meets_the_deadline() -> None:
    r = report("hardware")
    assert r["status"] == "SUCCEEDED", r.get("history")
    table = r["hardware"]
    rows = {row["candidate"]: row for row in table["rows"]}
    assert len(rows) >= 3
    assert not rows["small"]["fit"] and rows["small"]["reason"].startswith("out of memory")
    # by the table's own figures: the cheapest fit candidate expected to meet the deadline
    meeting = [row for row in rows.values() if row["fit"] and row["meets_deadline"]]
    cheapest = min(meeting, key=lambda row: row["spot_cost"])
    assert table["chosen"] == cheapest["candidate"] == "l4"
    assert rows["cpu"]["meets_deadline"] is False  # too slow for the deadline
    assert rows["a100"]["spot_cost"] > rows["l4"]["spot_cost"]
    assert kinds(r)[:2] == ["run.created", "run.hardware_chosen"]
    # the run probed them itself (the functions launched, the tick followed): probes, no attempts
    assert len(r["probes"]) == 4 and r["counters"]["probes"] == 4
    assert all(p["state"] in ("SUCCEEDED", "FAILED", "CANCELLED") for p in r["probes"])
    assert not {p["job_name"] for p in r["probes"]} & {a["job_name"] for a in r["attempts"]}
    assert any(h["what"] == "status PROBING" for h in r["history"])
    # the run was billed on the chosen shape (an L4 and its host), not the pipeline's CPU pool
    assert r["cost"]["attempts"][0]["per_hour"] > 0.2
    # one cost: every figure the run's events and the demo state is the ledger's
    (done,) = [e for e in r["published"] if kind_of(e["type"]) == "run.succeeded"]
    assert done["data"]["cost_estimate"] == done["data"]["cost"]["total"] == r["cost"]["total"]
    assert done["data"]["cost"]["attempts"] == r["cost"]["attempts"]
    assert not done["data"]["cost"]["unpriced"] and done["data"]["cost"]["savings"] is not None


@pytest.mark.extended  # tests/test_health_examples.py and the service tests cover it
def test_hang_scenario_relaunches_a_hung_attempt_and_succeeds() -> None:
    r = report("hang")
    assert r["status"] == "SUCCEEDED", r.get("history")
    assert [a["failure_class"] for a in r["attempts"]] == ["hung", None]
    assert r["attempts"][1]["resumed_from_step"] is not None  # from its latest checkpoint


@pytest.mark.extended  # tests/test_health_examples.py and the service tests cover it
def test_diverge_scenario_stops_the_run_before_its_planned_steps() -> None:
    r = report("diverge")
    assert r["status"] == "FAILED_DIVERGED", r.get("history")
    assert "nonfinite_loss" in (r["end_reason"] or "") or "loss_spike" in (r["end_reason"] or "")
    assert len(r["attempts"]) == 1 and r["attempts"][0]["progress_reached"] < 120


@pytest.mark.extended  # tests/test_health_examples.py and the service tests cover it
def test_oom_scenario_moves_to_the_next_machine_and_succeeds() -> None:
    r = report("oom")
    assert r["status"] == "SUCCEEDED", r.get("history")
    first, second = r["attempts"]
    assert first["failure_class"] == "out_of_memory" and "OOMKilled" in first["end_reason"]
    assert second["machine_type"] == "n1-highmem-8"


def test_sweep_scenario_stops_one_trial_resumes_preempted_ones_and_registers_the_best() -> None:
    r = report("sweep")
    assert r["status"] == "SUCCEEDED", r.get("history")
    trials = r["trials"]
    assert len(trials) >= 4
    assert any(t["stopped_early"] for t in trials)
    assert any(t["preemptions"] and t["resumed_from_step"] is not None for t in trials)
    best = next(t for t in trials if t["trial"] == r["best"])
    assert best["status"] == "SUCCEEDED" and best["metric"] is not None
    assert r["model_name"].startswith("projects/") and "/models/" in r["model_name"]
    assert all(t["experiment_run"] for t in trials)


def test_tradeoff_scenario_searches_with_vizier_and_chooses_within_the_constraints() -> None:
    """Issue 38: every suggestion a trial run; one preempted, resumed on the same Vizier trial;
    the front and a chosen trial that meets the constraints."""
    r = report("tradeoff")
    assert r["status"] == "SUCCEEDED", r.get("history")
    assert r["search"] == "vizier" and r["study"].startswith("projects/")
    assert r["constraints"] == {"latency_p95_ms": {"max": 20.0}, "model_size_bytes": {"max": 20000}}
    trials = r["trials"]
    assert len(trials) == 4
    for t in trials:
        assert t["test_accuracy"] > 0 and t["latency_p95_ms"] > 0 and t["cost"] > 0
        assert t["vizier"]["state"] == "COMPLETED" and not t["vizier"]["infeasible"]
        assert set(t["vizier"]["final"]) == {"test_accuracy", "latency_p95_ms", "cost"}
    preempted, = (t for t in trials if t["preemptions"])
    first, second = preempted["attempts"]
    assert first["failure_class"] == "preempted" and second["resumed_from_step"] is not None
    assert preempted["vizier"]["measured_steps"][-1] > second["resumed_from_step"]  # after it
    chosen = trials[r["chosen"] - 1]
    assert chosen["latency_p95_ms"] <= 20.0 and chosen["model_size_bytes"] <= 20000
    assert r["chosen"] in r["pareto_feasible"] and r["pareto"]
    assert r["model_name"].startswith("projects/")


def test_promote_scenario_refuses_the_worse_version_and_canaries_the_better_one() -> None:
    """Issue 37: three snapshots judged on one held-out folder; the first promoted and served,
    the worse one refused with its reason while the first serves on, the better one a canary
    (judged on the endpoint's Cloud Monitoring traffic) then all traffic, the first undeployed;
    predictions measured by a real client."""
    r = report("promote")
    assert r["status"] == "SUCCEEDED" and not r.get("story_error"), r.get("story_error")
    first, worse, better = r["versions"]
    assert [v["promoted"] for v in r["versions"]] == [True, False, True]
    assert worse["rule"] == "margin" and "does not beat the champion" in worse["reason"]
    assert better["metric"] > first["metric"] + 0.01 > worse["metric"]
    assert "production" in r["aliases"][better["name"]] and r["champion"] == better["name"]
    assert all("production" not in r["aliases"][v["name"]] for v in (first, worse))
    assert r["traffic_splits"] == [{first["name"]: 100},
                                   {first["name"]: 80, better["name"]: 20},
                                   {better["name"]: 100}]
    assert r["endpoint"]["phase"] == "idle" and r["endpoint"]["serving"] == better["name"]
    assert any("passed" in h and "predictions" in h for h in r["rollout_history"])
    assert r["predictions"]["count"] > 50 and r["predictions"]["failed"] == 0
    assert r["latency_p95_ms"] is not None and r["latency_p95_ms"] > 0
    assert kinds(r).count("model.promoted") == 2 and kinds(r).count("model.rejected") == 1


def test_quota_scenario_moves_to_another_region_and_never_retries_the_refusal() -> None:
    r = report("quota")
    assert r["status"] == "SUCCEEDED", r.get("end_reason")
    refused, trained = r["attempts"]  # one refusal, never tried again
    assert (refused["region"], refused["failure_class"]) == ("us-central1", "quota")
    assert "custom_model_training_preemptible_nvidia_l4_gpus" in refused["end_reason"]
    assert (trained["region"], trained["state"]) == ("europe-west4", "SUCCEEDED")
