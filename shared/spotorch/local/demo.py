"""The end-to-end demo: upload data, watch spotorch train through preemptions, report what happened.

`spotorch demo --scenario NAME` (the scenarios: spotorch.local.demo_scenarios). Everything runs on
a local stack of its own (emulators, functions, the Vertex AI emulator, alert receivers), started
here and stopped at the end. What happened is told from the run's record
(spotorch.local.demo_narration). With --json, stdout carries exactly one JSON object.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
import yaml

from spotorch.commandline import run as run_command
from spotorch.local.demo_narration import narrate
from spotorch.local.demo_scenarios import REPO, SCENARIOS, Scenario, pipeline_document

if TYPE_CHECKING:
    from spotorch.core.model import Run
    from spotorch.local.stack import DevStack

__all__ = ["SCENARIOS", "DemoStack", "Scenario", "demo", "demo_stack", "main",
           "pipeline_document", "run_demo"]
LANDING, CHECKPOINTS, MODELS = "spotorch-landing", "spotorch-checkpoints", "spotorch-models"
PIPELINE = "demo"
TICK_S = 2.0  # the local reconcile tick (production: Cloud Scheduler every 5 minutes)
DATA_PREFIX = "datasets/demo/"


def _say(quiet: bool, text: str) -> None:
    if not quiet:
        print(text, file=sys.stderr, flush=True)


def _iso(ts: float | None) -> str | None:
    from spotorch_trainer.contract import rfc3339

    return None if ts is None else rfc3339(ts)


def _find_run(docs: Any) -> Any:
    from spotorch.core.model import Run

    found = [Run.from_dict(d) for d in docs.query("runs", "pipeline", PIPELINE)]
    return min(found, key=lambda r: r.created_at) if found else None


def _follow(docs: Any, timeout_s: float, say: Callable[[str], None]) -> Any:
    """Watch the run the upload triggers until it ends; narrate its history as it grows."""
    deadline = time.monotonic() + timeout_s
    shown = 0
    run = None
    while time.monotonic() < deadline:
        run = _find_run(docs)
        if run is not None:
            for entry in run.history[shown:]:
                say(f"  [{entry.at - run.created_at:6.1f}s] {entry.what}"
                    + (f": {entry.reason}" if entry.reason else ""))
            shown = len(run.history)
            if not run.active:
                return run
        time.sleep(0.5)
    return run


def _follow_sweep(docs: Any, timeout_s: float, say: Callable[[str], None],
                  uploaded_at: float) -> dict[str, Any]:
    """Watch the sweep the upload starts until it ends; report its trials, best and model."""
    from spotorch.app.sweeps import sweep_summary
    from spotorch.core.model import Run
    from spotorch.core.sweeps import Sweep
    from spotorch.settings import COLLECTION_SWEEPS

    deadline = time.monotonic() + timeout_s
    sw = None
    shown = 0
    while time.monotonic() < deadline:
        found = [Sweep.from_dict(d) for d in docs.query(COLLECTION_SWEEPS, "pipeline", PIPELINE)]
        sw = min(found, key=lambda s: s.created_at) if found else None
        if sw is not None:
            for at, what in sw.history[shown:]:
                say(f"  [{at - uploaded_at:6.1f}s] sweep: {what}")
            shown = len(sw.history)
            if not sw.active:
                break
        time.sleep(1.0)
    if sw is None:
        return {"run_id": None, "status": "NO_RUN", "attempts": [], "timings_ms": {},
                "preemptions": 0, "escalated": None, "model_uri": None, "metrics": None}
    summary = sweep_summary(sw)
    trials = []
    for trial in summary["trials"]:
        run_doc, _ = docs.get("runs", trial["trial_run_id"])
        run = Run.from_dict(run_doc) if run_doc else None
        trials.append({**trial, "preemptions": run.counters.preemptions if run else None,
                       "attempts": len(run.attempts) if run else 0,
                       "resumed_from_step": run.attempts[-1].resumed_from_step
                       if run and run.attempts else None})
    return {"run_id": None, "sweep_id": sw.sweep_id, "status": summary["status"],
            "end_reason": summary["end_reason"], "best": summary["best"],
            "model_name": summary["model_name"], "trials": trials, "attempts": [],
            "timings_ms": {"total": round((time.time() - uploaded_at) * 1000)},
            "preemptions": sum(t["preemptions"] or 0 for t in trials), "escalated": None,
            "model_uri": None, "metrics": None, "history": summary["history"]}


def _read_json(uri: str) -> Any:
    from spotorch_trainer.storage import GcsStorage

    try:
        # A client of its own: the process-wide one would outlive this stack's fake GCS.
        return json.loads(GcsStorage().read(uri))
    except Exception:
        return None


@dataclass
class DemoStack:
    """A demo story on its local stack, still up, its run followed to the end (see demo_stack)."""

    scenario: Scenario
    stack: DevStack
    run: Run | None  # the run the upload started, as it ended (None: no run started, or a sweep)
    collected: dict[str, Any]  # the run's report fields and published events (no alerts yet)
    work_dir: Path
    pipeline_file: Path
    lose_job_events: bool
    alerts_so_far: Callable[[], list[dict[str, Any]]]  # what the alert receivers got until now
    final: dict[str, Any] | None = None  # the report, once demo_stack has exited

    def report(self) -> dict[str, Any]:
        """The report run_demo returns: once demo_stack has exited, the final one; while the
        stack is up, one with the alerts delivered so far (the stack's own, until something
        else acts on the stack)."""
        if self.final is not None:
            return self.final
        return self._finish(self.alerts_so_far())

    def _finish(self, alerts: list[dict[str, Any]]) -> dict[str, Any]:
        report = {**self.collected, "alerts": alerts}
        report.update(_costs(self.run, self.pipeline_file))
        report["events"] = [e["type"] for e in report["published"]]
        report["scenario"] = self.scenario.name
        report["job_events_lost"] = self.lose_job_events
        report["tick_s"] = TICK_S
        report["expected_status"] = self.scenario.expected_status
        report["work_dir"] = str(self.work_dir)
        report["narration"] = narrate(report)
        return report


@contextmanager
def demo_stack(scenario: Scenario, *, timeout_s: float, quiet: bool,
               lose_job_events: bool = False) -> Iterator[DemoStack]:
    """Start the receivers and the stack, upload a data snapshot and follow the run to its end;
    yield while the stack is still up (our os.environ pointing at it); on exit stop the stack
    and finish the report (its alerts, costs and events: DemoStack.final).

    lose_job_events: the Vertex emulator drops every job-state message, so only the reconcile
    tick's polling learns what the jobs do (what happens when a log sink loses messages).
    """
    from spotorch.adapters.gcp.firestore import FirestoreDocumentStore
    from spotorch.local.receivers import SmtpReceiver, WebhookReceiver
    from spotorch.local.stack import DevStack

    say: Callable[[str], None] = lambda text: _say(quiet, text)  # noqa: E731
    work = Path(tempfile.mkdtemp(prefix=f"spotorch-demo-{scenario.name}-"))
    pipelines = work / "pipelines"
    pipelines.mkdir()
    (pipelines / "demo.yaml").write_text(yaml.safe_dump(pipeline_document(scenario)))
    schedule = work / "vertex-schedule.json"
    schedule.write_text(json.dumps(dict(scenario.vertex_schedule)))
    say(f"spotorch demo ({scenario.name}): {scenario.setup}")
    with WebhookReceiver() as webhook, SmtpReceiver() as smtp:
        alerts_env = {"SPOTORCH_CHAT_WEBHOOK_URL": f"{webhook.url}/chat",
                      "SPOTORCH_SLACK_WEBHOOK_URL": f"{webhook.url}/slack",
                      "SPOTORCH_SMTP_HOST": smtp.host, "SPOTORCH_SMTP_PORT": str(smtp.port),
                      "SPOTORCH_SMTP_FROM": "spotorch@localhost",
                      "SPOTORCH_EMAIL_TO": "ml-team@localhost"}
        say("starting the local stack (Firestore, Pub/Sub, GCS, Vertex AI emulators, functions)")
        with DevStack(pipelines_dir=pipelines, run_dir=work / "stack", extra_env=alerts_env,
                      vertex_schedule=schedule, vertex_grace_s=3.0, tick_seconds=TICK_S,
                      dataflow=scenario.dataflow, dataproc=scenario.dataproc,
                      vertex_args=[*scenario.vertex_args,
                                   *(["--drop-events", "1.0"] if lose_job_events else [])]
                      ) as stack:
            saved = dict(os.environ)
            os.environ.update(stack.env)  # our own clients talk to this stack
            try:
                stack.create_buckets([LANDING, CHECKPOINTS, MODELS, *scenario.buckets])
                docs = FirestoreDocumentStore(project=stack.project)
                collected = _upload_and_follow(stack, docs, timeout_s, say, pipelines / "demo.yaml",
                                               sweep=scenario.sweep is not None,
                                               arrival=scenario.arrival)
                time.sleep(2.0)  # let the notifier deliver the last alerts
                collected["published"] = _published(stack)
                run = collected.pop("run", None)  # not JSON: the report carries its fields
                if scenario.extend is not None:
                    scenario.extend(collected, run, stack)
                demo = DemoStack(scenario=scenario, stack=stack, run=run, collected=collected,
                                 work_dir=work, pipeline_file=pipelines / "demo.yaml",
                                 lose_job_events=lose_job_events,
                                 alerts_so_far=lambda: _alerts(webhook, smtp))
                yield demo
            finally:
                os.environ.clear()
                os.environ.update(saved)
        demo.final = demo._finish(_alerts(webhook, smtp))


def run_demo(scenario: Scenario, *, timeout_s: float, quiet: bool,
             lose_job_events: bool = False) -> dict[str, Any]:
    """Start the stack, upload a data snapshot, follow the run, collect the report, stop the stack.

    lose_job_events: the Vertex emulator drops every job-state message, so only the reconcile
    tick's polling learns what the jobs do (what happens when a log sink loses messages).
    """
    with demo_stack(scenario, timeout_s=timeout_s, quiet=quiet,
                    lose_job_events=lose_job_events) as demo:
        pass
    return demo.report()


def _upload_and_follow(stack: Any, docs: Any, timeout_s: float, say: Callable[[str], None],
                       pipeline_file: Path | None = None, *, sweep: bool = False,
                       arrival: Callable[[Any, Any, Callable[[str], None]], None] | None = None
                       ) -> dict[str, Any]:
    uploaded_at = time.time()
    if arrival is not None:  # the story's own data (e.g. rows into a BigQuery table)
        arrival(stack, docs, say)
    else:
        _upload_csv(stack, say)
    if sweep:
        return _follow_sweep(docs, timeout_s, say, uploaded_at)
    run = _follow(docs, timeout_s, say)
    if run is None:
        return {"run_id": None, "status": "NO_RUN", "attempts": [], "timings_ms": {},
                "preemptions": 0, "escalated": None, "model_uri": None, "metrics": None}
    return _report(run, uploaded_at, lambda name: _job_code(stack, name))


def _upload_csv(stack: Any, say: Callable[[str], None]) -> None:
    """The default arrival: 3 CSV shards and the marker, one snapshot folder of the landing."""
    sys.path.insert(0, str(REPO / "examples"))
    from make_data import make_dataset, to_csv

    x, y = make_dataset(rows=3000, features=16, classes=3, seed=0)
    snapshot = f"{DATA_PREFIX}snapshot-{int(time.time())}/"
    for i, rows in enumerate(range(0, len(y), 1000)):
        stack.upload(LANDING, f"{snapshot}part-{i:05d}.csv", to_csv(x[rows:rows + 1000],
                                                                   y[rows:rows + 1000]))
    stack.upload(LANDING, f"{snapshot}_SUCCESS", b"")
    say(f"uploaded 3 CSV shards and _SUCCESS to gs://{LANDING}/{snapshot}")


def _job_code(stack: Any, job_name: str | None) -> dict[str, Any] | None:
    """What Vertex ran for a job, as GetCustomJob answers: the package URIs, the executor image
    and the module of a python_package_spec, or the image and command of a container_spec."""
    if not job_name:
        return None  # never created (e.g. refused for quota)
    from google.cloud.aiplatform_v1 import JobServiceClient
    from google.cloud.aiplatform_v1.services.job_service.transports.grpc import (
        JobServiceGrpcTransport,
    )

    from spotorch import settings as S
    from spotorch.adapters.gcp.vertex_calls import emulator_channel

    client = JobServiceClient(transport=JobServiceGrpcTransport(channel=emulator_channel(
        stack.env[S.ENV_VERTEX_ENDPOINT], stack.env.get(S.ENV_VERTEX_TOKEN))))
    pool = client.get_custom_job(name=job_name).job_spec.worker_pool_specs[0]
    package = pool.python_package_spec
    if package.python_module:
        return {"package_uris": list(package.package_uris),
                "executor_image_uri": package.executor_image_uri,
                "python_module": package.python_module}
    return {"image_uri": pool.container_spec.image_uri,
            "command": list(pool.container_spec.command)}


def _report(run: Any, uploaded_at: float,
            code_of: Callable[[str | None], dict[str, Any] | None] = lambda name: None
            ) -> dict[str, Any]:
    from spotorch.app.runs import run_summary

    summary = run_summary(run)
    for a in summary["attempts"]:
        for key in ("created_at", "started_at", "ended_at"):
            a[key] = _iso(a[key])
        a["code"] = code_of(a.get("job_name"))
    first = run.attempts[0] if run.attempts else None
    timings: dict[str, float | list[int] | None] = {
        "upload_to_launch": None if first is None else round((first.created_at - uploaded_at) * 1000),
        "total": round(((run.updated_at or time.time()) - uploaded_at) * 1000),
    }
    relaunch = [(b.created_at - a.ended_at) * 1000 for a, b in zip(run.attempts, run.attempts[1:],
                                                                 strict=False)
                if a.failure is not None and str(a.failure) == "preempted" and a.ended_at]
    timings["preemption_to_relaunch"] = round(max(relaunch)) if relaunch else None
    timings["preemption_to_relaunch_each"] = [round(t) for t in relaunch]
    metrics = _read_json(f"{run.output_uri}/metrics.json") if run.status == "SUCCEEDED" else None
    return {
        "run": run,  # taken out again once the cost is added (it is not JSON)
        "run_id": run.run_id, "status": str(run.status), "end_reason": run.end_reason,
        "attempts": summary["attempts"], "timings_ms": timings,
        "preemptions": run.counters.preemptions, "escalated": summary["escalated"],
        "model_uri": f"{run.output_uri}/model.npz" if metrics is not None else None,
        "metrics": metrics, "history": summary["history"],
        "hardware": dict(run.hardware) if run.hardware else None,
        # issue 30: what the run trained on and with, as recorded when it was created
        "provenance": dict(run.provenance) if run.provenance else None,
        "rerun_of": run.rerun_of,
        "probes": summary["probes"], "counters": {"probes": run.counters.probes,
                                                   "stockouts": run.counters.stockouts},
    }


def _costs(run: Any, pipeline_file: Path) -> dict[str, Any]:
    """The run's cost ledger: what it cost, and what it saved against standard VMs."""
    from spotorch.core.cost import ledger, ledger_dict
    from spotorch.spec.loader import load_pipeline

    if run is None:
        return {"cost": None, "savings": None}
    book = ledger(run, load_pipeline(pipeline_file), run.updated_at or time.time())
    return {"cost": ledger_dict(book),
            "savings": {"amount": None if book.savings is None else round(book.savings, 4),
                        "pct": book.savings_pct}}


def _published(stack: Any) -> list[dict[str, Any]]:
    from spotorch.core.events import from_pubsub

    events = [from_pubsub(m) for m in stack.pull_published(max_messages=500)]
    unique = {e["id"]: e for e in events}  # at-least-once: dedupe by the stable id
    return sorted(unique.values(), key=lambda e: (e["data"]["run_id"],
                                                  int(str(e["id"]).rsplit(":", 1)[1])))


def _alerts(webhook: Any, smtp: Any) -> list[dict[str, Any]]:
    alerts = []
    for req in webhook.received:
        channel = "chat" if "/chat" in req.path else "slack"
        alerts.append({"channel": channel, "event_type": _event_type_of(req.body)})
    for msg in smtp.messages:
        alerts.append({"channel": "email", "event_type": msg.get("X-Spotorch-Event-Type", "")})
    return alerts


def _event_type_of(body: bytes) -> str:
    try:
        text = body.decode()
    except UnicodeDecodeError:
        return ""
    for token in text.replace('"', " ").split():
        if token.startswith("dev.spotorch."):
            return token.strip(",.:;")
    return ""


def _human(report: Mapping[str, Any]) -> str:
    name = report.get("sweep_id") or report.get("run_id")
    lines = [f"{'sweep' if report.get('sweep_id') else 'run'} {name}: what happened"]
    lines += [f"  {line}" for line in report.get("narration") or narrate(report)]
    if report.get("metrics"):
        scores = {k: round(v, 4) for k, v in report["metrics"].items()
                  if isinstance(v, float) and k.startswith("test_")}
        lines.append(f"  model {report['model_uri']}: {json.dumps(scores)}")
    lines.append(f"  {len(report['published'])} events published, "
                 f"{len(report['alerts'])} alerts delivered")
    lines.append(f"  timings (ms): {json.dumps(report['timings_ms'])}")
    if report.get("cost"):
        lines.append(f"  cost: {report['cost']['summary']}")
    verdict = "as expected" if report["status"] == report["expected_status"] else \
        f"UNEXPECTED (expected {report['expected_status']})"
    lines.append(f"demo ended {verdict}")
    return "\n".join(lines)


def _demo_help() -> str:
    listing = "\n".join(f"  {name:<11} {s.title} (ends {s.expected_status})"
                         for name, s in SCENARIOS.items())
    return ("Run a story end to end on a local stack of its own: upload a data snapshot, follow "
            "the run to its end, and tell what happened from the run's own record (attempts, "
            "checkpoints, errors, escalation, cost, alerts). Exits 0 when the run ended as the "
            "scenario expects.\n\n\b\nScenarios:\n" + listing)


@click.command(name="demo", help=_demo_help())
@click.option("--scenario", type=click.Choice(list(SCENARIOS)), default="default",
              help="Which story (listed above).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object on stdout.")
@click.option("--timeout", type=click.FloatRange(1), default=240.0,
              help="Seconds to wait for the run.")
@click.option("--lose-job-events", is_flag=True,
              help="Drop every job-state message: only the tick's polling sees the jobs.")
def demo(scenario: str, as_json: bool, timeout: float, lose_job_events: bool) -> None:
    """`spotorch demo`: one scenario on its own local stack (the help is _demo_help)."""
    chosen = SCENARIOS[scenario]
    report = run_demo(chosen, timeout_s=timeout, quiet=False, lose_job_events=lose_job_events)
    if as_json:
        click.echo(json.dumps(report, default=str))
    else:
        click.echo(_human(report))
    if report["status"] != chosen.expected_status:
        raise click.exceptions.Exit(1)


def main(argv: list[str] | None = None) -> int:
    """`python -m spotorch.local.demo`: the `spotorch demo` command."""
    return run_command(demo, argv, prog_name="spotorch demo")


if __name__ == "__main__":
    sys.exit(main())
