"""Serving a promoted version with a canary (issue 37): the per-endpoint rollout, pure.

`model.serve` names an endpoint. A version the promotion gate promoted is deployed beside the
serving one with `canary_percent` of the traffic; when `canary_minutes` pass with its error rate
and p95 latency (measured from the endpoint's own traffic) within bounds it takes all traffic and
the old version is undeployed; otherwise the traffic goes back, the canary is undeployed and the
promotion is undone. One rollout at a time per endpoint: a version promoted meanwhile waits
(`pending`, the newest wins) and starts when the endpoint is idle.

`step` says what to do next from the rollout record alone (and the canary's traffic when it
runs); the app performs it with idempotent calls and records the outcome in one conditional
write, so a crash between the two repeats the call harmlessly (the tick repairs).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Annotated, Any

from spotorch.core.fields import Field, FileSection, Matches

HISTORY_KEPT = 30


@dataclass(frozen=True)
class ServeSpec(FileSection):
    """Serve the promoted version on a Vertex AI endpoint, a new one first as a canary."""

    FILE_REQUIRES = ("endpoint",)

    endpoint: Annotated[str, Matches(r"^[a-z]([a-z0-9-]{0,61}[a-z0-9])?$",
                                     "must be an endpoint id: lowercase letters, digits and '-'"),
                        Field(description="The endpoint's id (created when absent).")] = ""
    machine_type: Annotated[str, Matches(
        r"^[a-z][a-z0-9]*(-[a-z0-9]+)+$", "must be a machine type like n1-standard-2")] = \
        "n1-standard-2"
    min_replicas: Annotated[int, Field(ge=1)] = 1
    max_replicas: Annotated[int, Field(ge=1)] = 1
    canary_percent: Annotated[int, Field(ge=1, le=99, description="The new version's share "
                                                                  "while it is watched.")] = 10
    canary_minutes: Annotated[float, Field(ge=0.1, description="How long the canary is watched "
                                                             "before it takes all traffic.")] = 30.0
    max_error_rate: Annotated[float, Field(ge=0, le=1, description="More failed predictions "
                                                                   "than this share rolls the "
                                                                   "canary back.")] = 0.01
    max_latency_p95_ms: Annotated[float | None, Field(ge=0, description="A canary p95 above "
                                                                        "this rolls it back.")] \
        = None
    min_predictions: Annotated[int, Field(ge=0, description="Canary predictions needed before "
                                                            "it may take all traffic.")] = 20


@dataclass(frozen=True)
class Window:
    """The canary's predictions since it started, as the endpoint's metrics count them."""

    count: int = 0
    errors: int = 0
    p95_ms: float | None = None


@dataclass(frozen=True)
class Rollout:
    """One endpoint's serving state (the rollout record)."""

    key: str  # the endpoint's id in the store: {region}~{endpoint id}
    endpoint: str = ""  # projects/P/locations/L/endpoints/E once created
    serving: str | None = None  # the version with all traffic
    serving_id: str | None = None  # its deployed model id
    canary: str | None = None
    canary_id: str | None = None
    started_at: float | None = None
    pending: str | None = None  # promoted while a rollout ran: deployed next
    phase: str = "idle"  # idle | deploying | canary | finishing | rolling_back
    reason: str = ""  # why the last rollback happened
    history: tuple[tuple[float, str], ...] = ()
    # Each deployment's machine, replicas and time on the endpoint: its node-hours, priced by
    # the price table (spotorch.core.cost.machine_hourly). (version, machine, replicas, from, to)
    spans: tuple[tuple[str, str, int, float, float | None], ...] = ()

    def to_doc(self) -> dict[str, Any]:
        """As stored."""
        return {"key": self.key, "endpoint": self.endpoint, "serving": self.serving,
                "serving_id": self.serving_id, "canary": self.canary, "canary_id": self.canary_id,
                "started_at": self.started_at, "pending": self.pending, "phase": self.phase,
                "reason": self.reason, "active": self.phase != "idle" or bool(self.pending),
                "history": [{"at": at, "what": what} for at, what in self.history],
                "spans": [{"version": v, "machine_type": m, "replicas": n, "from": a, "to": b}
                          for v, m, n, a, b in self.spans]}

    @staticmethod
    def from_doc(doc: dict[str, Any]) -> Rollout:
        """The inverse of to_doc."""
        return Rollout(key=str(doc["key"]), endpoint=str(doc.get("endpoint") or ""),
                       serving=doc.get("serving"), serving_id=doc.get("serving_id"),
                       canary=doc.get("canary"), canary_id=doc.get("canary_id"),
                       started_at=doc.get("started_at"), pending=doc.get("pending"),
                       phase=str(doc.get("phase") or "idle"), reason=str(doc.get("reason") or ""),
                       history=tuple((float(h["at"]), str(h["what"]))
                                     for h in doc.get("history") or ()),
                       spans=tuple((str(x["version"]), str(x["machine_type"]), int(x["replicas"]),
                                    float(x["from"]), None if x.get("to") is None
                                    else float(x["to"])) for x in doc.get("spans") or ()))


def noted(r: Rollout, now: float, what: str) -> Rollout:
    """The rollout with a line of history."""
    return replace(r, history=(*r.history, (now, what))[-HISTORY_KEPT:])


def promoted(r: Rollout, version: str, now: float) -> Rollout:
    """A version was promoted: it is next (once; a redelivery changes nothing)."""
    if version in (r.serving, r.canary, r.pending):
        return r
    return noted(replace(r, pending=version), now, f"{version} promoted: queued to deploy")


@dataclass(frozen=True)
class Step:
    """What to do next. kind: none, deploy, judge, finish, roll_back."""

    kind: str
    version: str | None = None
    traffic: dict[str, int] | None = None


def step(r: Rollout, spec: ServeSpec) -> Step:
    """The next thing to do for this rollout (module docstring)."""
    if r.phase == "idle":
        if r.pending is None:
            return Step("none")
        traffic = {"0": 100} if r.serving_id is None else \
            {r.serving_id: 100 - spec.canary_percent, "0": spec.canary_percent}
        return Step("deploy", r.pending, traffic)
    if r.phase == "deploying":
        assert r.canary is not None
        traffic = {"0": 100} if r.serving_id is None else \
            {r.serving_id: 100 - spec.canary_percent, "0": spec.canary_percent}
        return Step("deploy", r.canary, traffic)
    if r.phase == "canary":
        return Step("judge", r.canary)
    if r.phase == "finishing":
        assert r.canary_id is not None
        return Step("finish", r.canary, {r.canary_id: 100})
    if r.phase == "rolling_back":
        assert r.serving_id is not None
        return Step("roll_back", r.canary, {r.serving_id: 100})
    raise ValueError(f"unknown rollout phase {r.phase!r}")


def started(r: Rollout, now: float) -> Rollout:
    """Take the pending version up: it is being deployed."""
    assert r.pending is not None
    return noted(replace(r, phase="deploying", canary=r.pending, pending=None), now,
                 f"deploying {r.pending}")


def deployed(r: Rollout, deployed_id: str, spec: ServeSpec, now: float) -> Rollout:
    """The canary is deployed: watched from now, or serving at once when it is the first."""
    assert r.canary is not None
    r = replace(r, spans=(*r.spans, (r.canary, spec.machine_type, spec.min_replicas, now, None)))
    if r.serving_id is None:
        return noted(replace(r, phase="idle", serving=r.canary, serving_id=deployed_id,
                             canary=None, canary_id=None, started_at=None), now,
                     f"{r.canary} serves all traffic (the endpoint's first version)")
    return noted(replace(r, phase="canary", canary_id=deployed_id, started_at=now), now,
                 f"{r.canary} takes {spec.canary_percent}% as a canary for "
                 f"{spec.canary_minutes:g} min")


def judge(r: Rollout, spec: ServeSpec, window: Window, now: float) -> Rollout:
    """The canary's verdict so far: roll back when out of bounds, finish when its window passed
    within them (with enough predictions seen), else keep watching."""
    assert r.started_at is not None
    rate = window.errors / window.count if window.count else 0.0
    why = ""
    if window.count and rate > spec.max_error_rate:
        why = (f"error rate {rate:.3f} ({window.errors}/{window.count}) over "
               f"{spec.max_error_rate:g}")
    elif spec.max_latency_p95_ms is not None and window.p95_ms is not None and \
            window.p95_ms > spec.max_latency_p95_ms:
        why = f"p95 latency {window.p95_ms:.1f} ms over {spec.max_latency_p95_ms:g} ms"
    if why:
        return noted(replace(r, phase="rolling_back", reason=why), now,
                     f"canary {r.canary} rolled back: {why}")
    if now - r.started_at >= spec.canary_minutes * 60.0 and window.count >= spec.min_predictions:
        return noted(replace(r, phase="finishing"), now,
                     f"canary {r.canary} passed: {window.count} predictions, error rate "
                     f"{rate:.3f}, p95 {window.p95_ms if window.p95_ms is not None else '?'} ms")
    return r


def _closed(r: Rollout, version: str | None, now: float) -> Rollout:
    return replace(r, spans=tuple((v, m, n, a, now if v == version and b is None else b)
                                  for v, m, n, a, b in r.spans))


def node_hours(r: Rollout, now: float) -> dict[tuple[str, str], float]:
    """Node-hours by (version, machine type) so far: replicas (the minimum: autoscaling above
    it is not seen) times time deployed."""
    out: dict[tuple[str, str], float] = {}
    for version, machine, replicas, start, end in r.spans:
        key = (version, machine)
        out[key] = out.get(key, 0.0) + replicas * max(0.0, (end or now) - start) / 3600.0
    return out


def finished(r: Rollout, now: float) -> Rollout:
    """The canary took all traffic and the old version was undeployed."""
    r = _closed(r, r.serving, now)
    return noted(replace(r, phase="idle", serving=r.canary, serving_id=r.canary_id, canary=None,
                         canary_id=None, started_at=None), now,
                 f"{r.canary} serves all traffic; {r.serving} undeployed")


def rolled_back(r: Rollout, now: float) -> Rollout:
    """The traffic went back and the canary was undeployed."""
    r = _closed(r, r.canary, now)
    return noted(replace(r, phase="idle", canary=None, canary_id=None, started_at=None), now,
                 f"{r.serving} serves all traffic again; {r.canary} undeployed")
