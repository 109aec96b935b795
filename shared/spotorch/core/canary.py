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

A deployment is the one step that is not idempotent (two DeployModel calls deploy the version
twice: an operation in flight is invisible in the endpoint) and takes many minutes on Vertex,
longer than a function may run. So it is claimed first: the writer that moves the record to
`deploying` holds the claim and alone starts the operation; its name is then recorded and
whoever advances the rollout next (the tick) polls it. A claim whose holder died before
recording the operation lapses after CLAIM_TTL_S; the next claimant first adopts a deployment of
the version already on the endpoint.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Annotated, Any

from spotorch.core.fields import Field, FileSection, Matches

HISTORY_KEPT = 30
CLAIM_TTL_S = 600.0  # a deploy claim older than this, with no operation recorded, lapses


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
    operation: str | None = None  # the canary's DeployModel operation, once started
    claim: str | None = None  # who may start the deployment (module docstring)
    claimed_at: float | None = None
    history: tuple[tuple[float, str], ...] = ()
    # Each deployment's machine, replicas and time on the endpoint: its node-hours, priced by
    # the price table (spotorch.core.cost.machine_hourly). (version, machine, replicas, from, to)
    spans: tuple[tuple[str, str, int, float, float | None], ...] = ()

    def to_doc(self) -> dict[str, Any]:
        """As stored."""
        return {"key": self.key, "endpoint": self.endpoint, "serving": self.serving,
                "serving_id": self.serving_id, "canary": self.canary, "canary_id": self.canary_id,
                "started_at": self.started_at, "pending": self.pending, "phase": self.phase,
                "reason": self.reason, "operation": self.operation, "claim": self.claim,
                "claimed_at": self.claimed_at,
                "active": self.phase != "idle" or bool(self.pending),
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
                       operation=doc.get("operation"), claim=doc.get("claim"),
                       claimed_at=doc.get("claimed_at"),
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
    """What to do next. kind: none (idle, or another writer's deployment is starting), start
    (take the pending version up, claiming its deployment), claim (a lapsed claim), deploy
    (start the operation: this writer holds the claim), await_deploy (poll the operation),
    judge, finish, roll_back."""

    kind: str
    version: str | None = None
    traffic: dict[str, int] | None = None


def _canary_split(r: Rollout, spec: ServeSpec) -> dict[str, int]:
    """The split a deployment asks for: all traffic for the first version, else the canary's
    share ("0": the model being deployed)."""
    return {"0": 100} if r.serving_id is None else \
        {r.serving_id: 100 - spec.canary_percent, "0": spec.canary_percent}


def step(r: Rollout, spec: ServeSpec, claim: str = "", now: float = 0.0) -> Step:
    """The next thing to do for this rollout (module docstring); `claim`: the caller's own
    claim token, `now` to see a lapsed claim."""
    if r.phase == "idle":
        if r.pending is None:
            return Step("none")
        return Step("start", r.pending)
    if r.phase == "deploying":
        assert r.canary is not None
        if r.operation:
            return Step("await_deploy", r.canary)
        if r.claim == claim and claim:
            return Step("deploy", r.canary, _canary_split(r, spec))
        if r.claimed_at is None or now - r.claimed_at >= CLAIM_TTL_S:
            return Step("claim", r.canary)
        return Step("none")  # another writer is starting the deployment
    if r.phase == "canary":
        return Step("judge", r.canary)
    if r.phase == "finishing":
        assert r.canary_id is not None
        return Step("finish", r.canary, {r.canary_id: 100})
    if r.phase == "rolling_back":
        assert r.serving_id is not None
        return Step("roll_back", r.canary, {r.serving_id: 100})
    raise ValueError(f"unknown rollout phase {r.phase!r}")


def started(r: Rollout, now: float, claim: str) -> Rollout:
    """Take the pending version up: it is being deployed, by the holder of `claim`."""
    assert r.pending is not None
    return noted(replace(r, phase="deploying", canary=r.pending, pending=None, claim=claim,
                         claimed_at=now, operation=None), now, f"deploying {r.pending}")


def claimed(r: Rollout, now: float, claim: str) -> Rollout:
    """A lapsed claim taken over: its holder died before it recorded an operation."""
    return noted(replace(r, claim=claim, claimed_at=now), now,
                 f"the deployment of {r.canary} claimed again (the last claim lapsed)")


def deploy_started(r: Rollout, operation: str, now: float) -> Rollout:
    """The canary's DeployModel operation runs: polled from now on."""
    return noted(replace(r, operation=operation), now, f"{r.canary}: DeployModel {operation}")


def deploy_failed(r: Rollout, why: str, now: float) -> Rollout:
    """The canary could not be deployed: the endpoint stays as it was (Vertex moves the
    split only when a deployment succeeds); the app undoes the promotion."""
    return noted(replace(r, phase="idle", canary=None, canary_id=None, started_at=None,
                         operation=None, claim=None, claimed_at=None,
                         reason=f"deployment failed: {why}"), now,
                 f"{r.canary} not deployed: {why}")


def deployed(r: Rollout, deployed_id: str, spec: ServeSpec, now: float) -> Rollout:
    """The canary is deployed: watched from now, or serving at once when it is the first."""
    assert r.canary is not None
    r = replace(r, operation=None, claim=None, claimed_at=None,
                spans=(*r.spans, (r.canary, spec.machine_type, spec.min_replicas, now, None)))
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
