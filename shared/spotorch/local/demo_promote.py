"""The demo's promotion story (issue 37): three snapshots, the gate, and a canary on an endpoint.

The pipeline names a fixed held-out folder (model.evaluation.data_uri), promotes on held-out
accuracy by at least 0.01 (model.promote) and serves on an endpoint with a 20% canary watched for
15 s (model.serve). Three snapshots land one after the other, all drawn from one distribution:
the first (300 rows) is promoted and deployed with all traffic; the second (300 rows, 80% of
the labels scrambled) is worse and registered without the alias while the first keeps serving;
the third (6,000 rows) is better: it is deployed beside the first with 20% of the traffic, takes
all of it once its window passes within bounds, and the first is undeployed.

While the endpoint serves, a client here (the real aiplatform_v1 PredictionService client)
predicts held-out rows ten times a second; the canary is judged on what Cloud Monitoring counts
of that traffic (the Vertex emulator's ListTimeSeries, sampled every 2 s here, Vertex's 60 s).
The report adds `versions` (each with `promoted`, or the refusal's rule and reason, and its
aliases: `spotorch models` through the api), `aliases`, every `traffic_split` seen (by
version, those with a share), `latency_p95_ms` of the client's predict calls, and the
endpoint's rollout history.

Registered in demo_scenarios.SCENARIOS by name; the settings are plain values so that this
module needs nothing of the demo's at import.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[3]
PIPELINE = "demo"
LANDING, HOLDOUT = "spotorch-landing", "spotorch-holdout"
ENDPOINT_ID, REGION = "demo-prod", "us-central1"
FEATURES, CLASSES = 16, 3
HELD_OUT_ROWS = 1500
# (name, first row, rows, share of labels scrambled) of each snapshot, in arrival order
SNAPSHOTS = (("first", 1500, 300, 0.0), ("noisy", 1800, 300, 0.8), ("larger", 3000, 6000, 0.0))
PREDICT_EVERY_S = 0.1
STEP_TIMEOUT_S = 240.0  # one snapshot's run, its registration and rollout
_TRAINER_ENV = {"EXAMPLE_TOTAL_STEPS": "300", "EXAMPLE_STEP_SLEEP": "0.03",
                "EXAMPLE_CHECKPOINT_EVERY": "50", "EXAMPLE_PROGRESS_INTERVAL": "1",
                "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}
# What the story saw, from arrive() to extend() (both run in this process, one demo at a time).
_SEEN: dict[str, Any] = {}


def _rows() -> tuple[Any, Any]:
    sys.path.insert(0, str(REPO / "examples"))
    from make_data import make_dataset

    x, y = make_dataset(rows=9000, features=FEATURES, classes=CLASSES, seed=0)
    return x, y


def _rollout(docs: Any) -> dict[str, Any] | None:
    from spotorch.settings import COLLECTION_ROLLOUTS

    doc, _ = docs.get(COLLECTION_ROLLOUTS, f"{REGION}~{ENDPOINT_ID}")
    return doc or None


def _runs(docs: Any) -> list[Any]:
    from spotorch.core.model import Run

    return sorted((Run.from_dict(d) for d in docs.query("runs", "pipeline", PIPELINE)),
                  key=lambda r: r.created_at)


def _wait(what: str, ready: Callable[[], bool], timeout_s: float = STEP_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if ready():
            return
        time.sleep(0.5)
    raise TimeoutError(f"the promote story waited {timeout_s:g}s for {what}")


class _Traffic:
    """The endpoint's clients: held-out rows predicted ten times a second, and the traffic
    split watched (GetEndpoint) as it changes."""

    def __init__(self, endpoint: str, rows: list[list[float]]) -> None:
        from spotorch.adapters.gcp.endpoints import VertexEndpoints
        from spotorch.adapters.gcp.vertex_calls import RetryPolicy
        from spotorch.settings import Settings

        settings = Settings.from_env()  # the stack's emulator, as the operator
        self.client = VertexEndpoints(settings.project, endpoint=settings.vertex_endpoint,
                                      token=settings.vertex_token,
                                      retry=RetryPolicy(attempts=1))
        self.endpoint, self.rows = endpoint, rows
        self.latencies: list[float] = []
        self.errors: list[str] = []
        self.by_version: dict[str, int] = {}
        self.splits: list[dict[str, int]] = []
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._predict, name="demo-predict", daemon=True),
                         threading.Thread(target=self._watch, name="demo-split", daemon=True)]

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=10)
        self._look()  # the split as the story ends

    def _look(self) -> None:
        """Record the split when it changed: each version's share, those with none left out
        (between moving all traffic and undeploying, the old version shows 0%)."""
        try:
            state = self.client.get(self.endpoint)
        except Exception:
            return
        split = {d.model: state.traffic[d.id] for d in state.deployed
                 if state.traffic.get(d.id)}
        if split and (not self.splits or self.splits[-1] != split):
            self.splits.append(split)

    def _predict(self) -> None:
        n = 0
        while not self._stop.wait(PREDICT_EVERY_S):
            n += 1
            try:
                answer = self.client.predict(self.endpoint, [self.rows[n % len(self.rows)]])
            except Exception as exc:  # counted: the report says how many failed and why
                self.errors.append(str(exc)[:200])
                continue
            self.latencies.append(answer.latency_ms)
            self.by_version[answer.deployed_model_id] = \
                self.by_version.get(answer.deployed_model_id, 0) + 1

    def _watch(self) -> None:
        while not self._stop.wait(0.5):
            self._look()


def _upload(stack: Any, name: str, x: Any, y: Any, say: Callable[[str], None]) -> None:
    from make_data import to_csv

    folder = f"datasets/demo/{name}-{int(time.time())}/"
    stack.upload(LANDING, f"{folder}part-00000.csv", to_csv(x, y))
    stack.upload(LANDING, f"{folder}_SUCCESS", b"")
    say(f"uploaded snapshot '{name}' ({len(y)} rows) to gs://{LANDING}/{folder}")


def arrive(stack: Any, docs: Any, say: Callable[[str], None]) -> None:
    """The held-out folder, then each snapshot once the last one's run ended and its version
    was judged (and, when promoted, rolled out); the endpoint's clients from the first
    deployment on; the canary's end waited for."""
    import numpy as np

    sys.path.insert(0, str(REPO / "examples"))
    from make_data import to_csv

    _SEEN.clear()
    x, y = _rows()
    stack.upload(HOLDOUT, "demo/part-00000.csv", to_csv(x[:HELD_OUT_ROWS], y[:HELD_OUT_ROWS]))
    say(f"uploaded {HELD_OUT_ROWS} held-out rows to gs://{HOLDOUT}/demo/ (model.evaluation)")
    rows = [[float(v) for v in row] for row in x[:200]]
    traffic: _Traffic | None = None
    scramble = np.random.default_rng(1)
    try:
        for number, (name, first, count, noise) in enumerate(SNAPSHOTS, start=1):
            labels = y[first:first + count].copy()
            flip = scramble.random(count) < noise
            labels[flip] = scramble.integers(0, CLASSES, int(flip.sum()))
            _upload(stack, name, x[first:first + count], labels, say)
            _wait(f"run {number} to end", functools.partial(_ended, docs, number))
            _wait(f"the endpoint to settle after run {number}", lambda: _settled(docs))
            rollout = _rollout(docs)
            if traffic is None and rollout and rollout.get("serving"):
                traffic = _Traffic(str(rollout["endpoint"]), rows)
                traffic.start()
                say(f"an application predicts on {rollout['endpoint']} "
                    f"every {PREDICT_EVERY_S:g} s")
    except TimeoutError as exc:
        _SEEN["error"] = str(exc)
        say(str(exc))
    finally:
        if traffic is not None:
            traffic.stop()
            _SEEN["traffic"] = traffic


def _ended(docs: Any, number: int) -> bool:
    """The number-th run of the pipeline has ended."""
    runs = _runs(docs)
    return len(runs) >= number and not runs[number - 1].active


def _settled(docs: Any) -> bool:
    """The last run's version judged, and its rollout (if any) idle: nothing pending."""
    from spotorch.core.model import RunStatus

    runs = _runs(docs)
    if not runs or runs[-1].status is not RunStatus.SUCCEEDED:
        return True  # a failed run registers nothing: the story goes on (and says so)
    rollout = _rollout(docs)
    return (rollout is not None and rollout.get("phase") == "idle" and not rollout.get("pending")) \
        or _rejected(docs, runs[-1].run_id)


def _rejected(docs: Any, run_id: str) -> bool:
    from spotorch.settings import COLLECTION_CHAMPIONS

    for record in docs.query(COLLECTION_CHAMPIONS, "alias", "production"):
        for decision in record.get("decisions") or ():
            if decision.get("run_id") == run_id and not decision.get("promoted"):
                return True
    return False


def _percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, max(0, -(-int(q * len(ordered)) // 1) - 1))], 3)


def extend(report: dict[str, Any], run: Any, stack: Any) -> None:
    """versions, aliases, traffic splits seen, the client's latency, the rollout's history."""
    from spotorch.adapters.gcp.firestore import FirestoreDocumentStore

    docs = FirestoreDocumentStore(project=stack.project)
    cli = subprocess.run([sys.executable, "-m", "spotorch.operate.cli", "models", PIPELINE,
                          "--json"], env={**os.environ, **stack.env, "COLUMNS": "200"},
                         capture_output=True, text=True, timeout=120, cwd=REPO)
    view: dict[str, Any] = json.loads(cli.stdout) if cli.returncode == 0 else \
        {"error": cli.stderr.strip()[-500:]}
    runs = _runs(docs)
    by_run = {v.get("run_id"): v for v in view.get("versions") or ()}
    report["runs"] = [{"run_id": r.run_id, "status": str(r.status),
                       "version": (by_run.get(r.run_id) or {}).get("name"),
                       "eval_metric": (by_run.get(r.run_id) or {}).get("metric")} for r in runs]
    report["versions"] = [{"name": v["name"], "run_id": v["run_id"], "metric": v["metric"],
                           "promoted": v["promoted"], "rule": v["rule"],
                           "reason": None if v["promoted"] else v["reason"],
                           "aliases": v["aliases"]}
                          for v in sorted(view.get("versions") or (), key=lambda v: v["at"])]
    report["aliases"] = {v["name"]: v["aliases"] for v in report["versions"]}
    report["champion"] = view.get("champion")
    endpoint = view.get("endpoint") or {}
    report["endpoint"] = {k: endpoint.get(k) for k in ("endpoint", "phase", "serving", "canary",
                                                       "traffic_split", "node_hours", "cost")}
    report["rollout_history"] = [h["what"] for h in endpoint.get("history") or ()]
    traffic: _Traffic | None = _SEEN.get("traffic")
    report["traffic_splits"] = traffic.splits if traffic else []
    report["predictions"] = {
        "count": len(traffic.latencies) if traffic else 0,
        "failed": len(traffic.errors) if traffic else 0,
        "first_error": traffic.errors[0] if traffic and traffic.errors else None}
    report["latency_p95_ms"] = _percentile(traffic.latencies, 0.95) if traffic else None
    report["latency_p50_ms"] = _percentile(traffic.latencies, 0.50) if traffic else None
    if "error" in _SEEN or "error" in view:
        report["story_error"] = _SEEN.get("error") or view.get("error")


SETTINGS: dict[str, Any] = {
    "name": "promote",
    "title": "promoted, refused, then a canary takes all traffic",
    "setup": "Three snapshots land one after another (300 rows; 300 rows with 80% of the labels "
             "scrambled; 6,000 rows), each once the last one's run ended; the pipeline "
             "evaluates on a fixed held-out folder, promotes on held-out accuracy by at least "
             "0.01 and serves on endpoint demo-prod with a 20% canary watched for 15 s; an "
             "application predicts on the endpoint ten times a second once it serves; the "
             "emulator's Cloud Monitoring samples every 2 s (Vertex: 60 s).",
    "expected_status": "SUCCEEDED",
    "recovery": {"escalation": "never", "backoff_base": "1s", "decision_interval": "2s"},
    "vertex_args": ("--seed", "0", "--metrics-period-s", "2"),
    "trainer_env": _TRAINER_ENV,
    "buckets": (HOLDOUT,),
    "deadline": "30m",
    "model": {"serving_image": "us-docker.pkg.dev/vertex-ai/prediction/sklearn-cpu.1-3:latest",
              "evaluation": {"data_uri": f"gs://{HOLDOUT}/demo/"},
              "promote": {"metric": "accuracy", "goal": "maximize", "min_improvement": 0.01,
                          "alias": "production"},
              "serve": {"endpoint": ENDPOINT_ID, "machine_type": "n1-standard-2",
                        "min_replicas": 1, "max_replicas": 1, "canary_percent": 20,
                        "canary_minutes": 0.25, "max_error_rate": 0.05,
                        "min_predictions": 20}},
    "arrival": arrive,
    "extend": extend,
}
