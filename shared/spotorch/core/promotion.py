"""The promotion gate: does a newly registered model version take the production alias?

Pure: no I/O. A pipeline's `model.promote` names the metric, its goal, the margin a challenger
must beat the champion by, a latency budget and the alias to move; `model.evaluation` names the
held-out data every version is evaluated on. The champion is the version holding the alias, as
the per-model champion record (ChampionRecord) says; the app's use case (spotorch.app.promotions)
reads it, asks `gate`, and writes the record back in one conditional write, so two runs ending
together promote at most the better one and a redelivered registration decides nothing twice.

The rules, in order (each refusal says which one refused):
  1. the version reported the evaluation metric (`eval_<metric>`, spotorch_trainer.evaluation)
     and was evaluated on named held-out data;
  2. its p95 prediction latency is known and within max_latency_p95_ms, when a budget is set;
  3. no champion yet: promoted;
  4. its training data is newer than the champion's (a rerun of an old snapshot, or a run on
     the same data, cannot take the alias back);
  5. champion and challenger were evaluated on the same data; otherwise they cannot be compared
     (re-evaluating the champion on the challenger's data is not done: the refusal says so);
  6. it beats the champion's value by more than min_improvement (absolute, in the metric's
     units; 0: any strict improvement).
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Annotated, Any

from spotorch.core.fields import Field, FileSection, Matches, OneOf
from spotorch_trainer.evaluation import ENV_EVAL_DATA_URI, ENV_EVAL_SPLIT

# Metrics the trainer reports about the final model on the held-out data carry this prefix
# (spotorch_trainer.evaluation.report_evaluation): `eval_accuracy`, `eval_latency_p95_ms`.
EVAL_PREFIX = "eval_"
LATENCY_METRIC = "latency_p95_ms"  # reported as eval_latency_p95_ms (or latency_p95_ms)
DECISIONS_KEPT = 50  # the newest decisions a champion record remembers (redeliveries find them)
# Aliases spotorch gives itself: the gate's alias must be another (Vertex's `default` moves alone).
RESERVED_ALIASES = ("default", "latest", "best")

_ALIAS = r"^[a-z][a-zA-Z0-9-]{0,126}[a-z0-9]$"  # Vertex AI's version alias form
_COLUMN = r"^[A-Za-z_][A-Za-z0-9_.-]{0,127}$"


@dataclass(frozen=True)
class HashSplit(FileSection):
    """A deterministic held-out split: a row is held out when a stable hash of its key falls in
    the first `percent` of 100 buckets (the same row always lands on the same side)."""

    FILE_REQUIRES = ("key",)

    key: Annotated[str, Matches(_COLUMN, "must be a column name"), Field(
        description="The column whose value is hashed (sha256 of its text) to place a row.")] = ""
    percent: Annotated[int, Field(ge=1, le=50, description="Percent of rows held out.")] = 10
    salt: Annotated[str, Field(description="Mixed into the hash: another salt, another "
                                           "split.")] = "spotorch"


@dataclass(frozen=True)
class Evaluation(FileSection):
    """The held-out data every version of the model is evaluated on: a fixed folder (the same
    data for every version, so versions compare) or a split of each run's own data by key (a
    split of another snapshot is other data: versions trained on different snapshots then
    cannot be compared on it)."""

    data_uri: Annotated[str | None, Matches(
        r"^gs://[a-z0-9][a-z0-9._-]{1,220}[a-z0-9]/(.*/)?$",
        "must be a gs://bucket/folder/ URI ending with '/'"), Field(
        description="A fixed folder of held-out data, never written by training runs "
                    "(SPOTORCH_EVAL_DATA_URI).")] = None
    split: Annotated[HashSplit | None, Field(
        description="Or: hold out rows of the run's own data by a stable hash of a key "
                    "(SPOTORCH_EVAL_SPLIT).")] = None


@dataclass(frozen=True)
class PromotionPolicy(FileSection):
    """When a new version takes the alias from the version holding it (model.promote)."""

    FILE_REQUIRES = ("metric",)

    metric: Annotated[str, Matches(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$", "must be a metric name"),
                      Field(description="A metric the trainer reports on the held-out data "
                                        "(as eval_<metric>).")] = ""
    goal: Annotated[str, OneOf(("maximize", "minimize"))] = "maximize"
    min_improvement: Annotated[float, Field(
        ge=0, description="How much better than the champion (in the metric's units) a version "
                          "must be; 0: any strict improvement.")] = 0.0
    max_latency_p95_ms: Annotated[float | None, Field(
        ge=0, description="A version whose measured p95 prediction latency is above this (or "
                          "unmeasured) is not promoted.")] = None
    alias: Annotated[str, Matches(_ALIAS, "must be a Vertex AI version alias (lowercase letter "
                                          "first, letters, digits and '-')"),
                     Field(description="The alias the champion holds.")] = "production"


# --- what the gate compares -----------------------------------------------------------------------


@dataclass(frozen=True)
class Candidate:
    """A registered version as the gate sees it."""

    version: str  # projects/P/locations/L/models/M@V
    run_id: str
    metrics: Mapping[str, float] = field(default_factory=dict)  # evaluation metrics, unprefixed
    evaluation: str | None = None  # the identity of the data it was evaluated on
    data_time: float | None = None  # when its training data was taken (None: unknown)
    latency_p95_ms: float | None = None

    def to_doc(self) -> dict[str, Any]:
        """The candidate as the champion record stores it."""
        return {"version": self.version, "run_id": self.run_id, "metrics": dict(self.metrics),
                "evaluation": self.evaluation, "data_time": self.data_time,
                "latency_p95_ms": self.latency_p95_ms}

    @staticmethod
    def from_doc(doc: Mapping[str, Any]) -> Candidate:
        """The inverse of to_doc."""
        return Candidate(version=str(doc["version"]), run_id=str(doc.get("run_id") or ""),
                         metrics={str(k): float(v) for k, v in (doc.get("metrics") or {}).items()},
                         evaluation=doc.get("evaluation"), data_time=doc.get("data_time"),
                         latency_p95_ms=doc.get("latency_p95_ms"))


@dataclass(frozen=True)
class Verdict:
    """The gate's answer: promote or not, and why in words people read."""

    promote: bool
    reason: str
    rule: str  # which rule decided: metric, latency, first, data, evaluation, margin, improved


def gate(policy: PromotionPolicy, challenger: Candidate, champion: Candidate | None) -> Verdict:
    """Whether `challenger` takes the alias from `champion` under `policy` (module docstring)."""
    name = policy.metric
    value = challenger.metrics.get(name)
    if challenger.evaluation is None:
        return Verdict(False, "not evaluated on held-out data (model.evaluation names none, or "
                              "the run reported no evaluation)", "metric")
    if value is None or not math.isfinite(value):
        return Verdict(False, f"the run reported no finite {EVAL_PREFIX}{name} on the held-out "
                              "data", "metric")
    budget = policy.max_latency_p95_ms
    if budget is not None:
        latency = challenger.latency_p95_ms
        if latency is None:
            return Verdict(False, f"no p95 prediction latency measured; the budget is "
                                  f"{budget:g} ms", "latency")
        if latency > budget:
            return Verdict(False, f"p95 prediction latency {latency:g} ms is over the budget of "
                                  f"{budget:g} ms", "latency")
    if champion is None:
        return Verdict(True, f"first evaluated version: {name} {value:g}", "first")
    if champion.version == challenger.version:
        return Verdict(True, "already the champion", "improved")
    if challenger.data_time is None or (champion.data_time is not None
                                        and challenger.data_time <= champion.data_time):
        return Verdict(False, f"trained on data no newer than the champion's "
                              f"({_when(challenger.data_time)} vs {_when(champion.data_time)}): "
                              "a rerun or an older snapshot cannot take the alias back", "data")
    if champion.evaluation != challenger.evaluation:
        return Verdict(False, f"cannot compare: the champion {champion.version} was evaluated on "
                              f"{champion.evaluation or 'unknown data'}, this version on "
                              f"{challenger.evaluation} (the champion is not re-evaluated)",
                       "evaluation")
    held = champion.metrics.get(name)
    if held is None or not math.isfinite(held):
        return Verdict(False, f"cannot compare: the champion {champion.version} has no {name}",
                       "evaluation")
    gain = value - held if policy.goal == "maximize" else held - value
    if gain <= 0 or gain < policy.min_improvement:
        margin = f" by {policy.min_improvement:g}" if policy.min_improvement else ""
        return Verdict(False, f"{name} {value:g} does not beat the champion's {held:g}{margin} "
                              f"({policy.goal})", "margin")
    return Verdict(True, f"{name} {value:g} beats the champion's {held:g} by {gain:g}",
                   "improved")


def _when(t: float | None) -> str:
    return "unknown" if t is None else f"{t:.0f}"


# --- the per-model champion record --------------------------------------------------------------


@dataclass(frozen=True)
class Decision:
    """What the gate said of one version (the record keeps the newest DECISIONS_KEPT)."""

    version: str
    run_id: str
    promoted: bool
    reason: str
    rule: str
    at: float
    replaced: str | None = None  # the champion it took the alias from
    metric: float | None = None

    def to_doc(self) -> dict[str, Any]:
        """The decision as stored."""
        return {"version": self.version, "run_id": self.run_id, "promoted": self.promoted,
                "reason": self.reason, "rule": self.rule, "at": self.at,
                "replaced": self.replaced, "metric": self.metric}

    @staticmethod
    def from_doc(doc: Mapping[str, Any]) -> Decision:
        """The inverse of to_doc."""
        return Decision(version=str(doc["version"]), run_id=str(doc.get("run_id") or ""),
                        promoted=bool(doc["promoted"]), reason=str(doc.get("reason") or ""),
                        rule=str(doc.get("rule") or ""), at=float(doc.get("at") or 0.0),
                        replaced=doc.get("replaced"), metric=doc.get("metric"))


@dataclass(frozen=True)
class ChampionRecord:
    """One model's champion (the version holding the alias) and the gate's recent decisions."""

    model: str  # projects/P/locations/L/models/M
    alias: str
    champion: Candidate | None = None
    decisions: tuple[Decision, ...] = ()
    previous: Candidate | None = None  # the champion before, for a rollback to hand it back

    def decision(self, version: str) -> Decision | None:
        """What was decided of this version, if it is remembered."""
        return next((d for d in self.decisions if d.version == version), None)

    def to_doc(self) -> dict[str, Any]:
        """The record as one document."""
        return {"model": self.model, "alias": self.alias,
                "champion": self.champion.to_doc() if self.champion else None,
                "decisions": [d.to_doc() for d in self.decisions],
                "previous": self.previous.to_doc() if self.previous else None}

    @staticmethod
    def from_doc(doc: Mapping[str, Any]) -> ChampionRecord:
        """The inverse of to_doc."""
        champion, previous = doc.get("champion"), doc.get("previous")
        return ChampionRecord(model=str(doc["model"]), alias=str(doc.get("alias") or ""),
                              champion=Candidate.from_doc(champion) if champion else None,
                              decisions=tuple(Decision.from_doc(d)
                                              for d in doc.get("decisions") or ()),
                              previous=Candidate.from_doc(previous) if previous else None)


def consider(record: ChampionRecord, policy: PromotionPolicy, challenger: Candidate,
             now: float) -> tuple[ChampionRecord, Decision]:
    """The record after the gate judged `challenger`, and the decision. A version already
    decided keeps its decision (a redelivery changes nothing)."""
    known = record.decision(challenger.version)
    if known is not None:
        return record, known
    verdict = gate(policy, challenger, record.champion)
    decision = Decision(version=challenger.version, run_id=challenger.run_id,
                        promoted=verdict.promote, reason=verdict.reason, rule=verdict.rule,
                        at=now, metric=challenger.metrics.get(policy.metric),
                        replaced=record.champion.version if verdict.promote and record.champion
                        else None)
    decisions = (*record.decisions, decision)[-DECISIONS_KEPT:]
    if verdict.promote:
        return replace(record, champion=challenger, decisions=decisions,
                       previous=record.champion), decision
    return replace(record, decisions=decisions), decision


def demoted(record: ChampionRecord, version: str, reason: str, now: float) -> ChampionRecord:
    """A rollback undid the promotion of `version`: the previous champion holds the alias again
    (the rollback is remembered as a decision of its own). Unchanged if `version` is not the
    champion (a repeated rollback)."""
    if record.champion is None or record.champion.version != version:
        return record
    back = Decision(version=version, run_id=record.champion.run_id, promoted=False,
                    reason=f"rolled back: {reason}", rule="rollback", at=now,
                    replaced=None, metric=None)
    return replace(record, champion=record.previous, previous=None,
                   decisions=(*record.decisions, back)[-DECISIONS_KEPT:])


# --- evaluation identity --------------------------------------------------------------------------


def evaluation_identity(evaluation: Evaluation | None, data: Mapping[str, Any] | None) -> \
        str | None:
    """What names the held-out data of a run: the fixed folder (the same for every run), or the
    split's rule and the run's own data (its pinned objects' digest, else its URI). None: no
    evaluation data is named."""
    if evaluation is None:
        return None
    if evaluation.data_uri:
        return f"folder {evaluation.data_uri}"
    if evaluation.split is not None:
        s = evaluation.split
        of = (data or {}).get("objects_hash") or (data or {}).get("uri") or "?"
        rule = hashlib.sha256(json.dumps([s.key, s.percent, s.salt]).encode()).hexdigest()[:8]
        return f"split {s.key}/{s.percent}%/{rule} of {of}"
    return None


def evaluation_record(evaluation: Evaluation | None, data: Mapping[str, Any] | None) -> \
        dict[str, Any] | None:
    """The evaluation inputs as the run's provenance records them (None: none named): the
    folder or the split's rule, and the identity the gate compares. A rerun keeps its origin's."""
    identity = evaluation_identity(evaluation, data)
    if evaluation is None or identity is None:
        return None
    split = evaluation.split
    return {"data_uri": evaluation.data_uri,
            "split": {"key": split.key, "percent": split.percent, "salt": split.salt}
            if split is not None else None,
            "identity": identity}


def evaluation_env(record: Mapping[str, Any] | None) -> dict[str, str]:
    """What the trainer is told of its held-out data (spotorch_trainer.evaluation.held_out)."""
    if not record:
        return {}
    if record.get("data_uri"):
        return {ENV_EVAL_DATA_URI: str(record["data_uri"])}
    if record.get("split"):
        return {ENV_EVAL_SPLIT: json.dumps(dict(record["split"]), sort_keys=True)}
    return {}


def data_time(data: Mapping[str, Any] | None, created_at: float, rerun: bool) -> float | None:
    """When a run's training data was taken: the newest pinned object's generation (Cloud
    Storage generations are microseconds since the epoch), a BigQuery snapshot's time, else the
    run's creation (not for a rerun: its data is its origin's, of unknown age)."""
    data = data or {}
    gens = [int(o["generation"]) for o in data.get("objects") or () if o.get("generation")]
    if gens:
        return max(gens) / 1e6
    bq = data.get("bigquery") or {}
    for key in ("snapshot_time", "as_of", "snapshot_at"):
        value = bq.get(key) if isinstance(bq, Mapping) else None
        if isinstance(value, int | float):
            return float(value)
    return None if rerun else created_at


def evaluation_metrics(reported: Mapping[str, float]) -> dict[str, float]:
    """The evaluation metrics among a run's final reported metrics, without their prefix."""
    return {k[len(EVAL_PREFIX):]: float(v) for k, v in reported.items()
            if k.startswith(EVAL_PREFIX)}


def latency_of(reported: Mapping[str, float]) -> float | None:
    """The p95 prediction latency the trainer measured, in ms (None: not measured)."""
    for key in (EVAL_PREFIX + LATENCY_METRIC, LATENCY_METRIC):
        if key in reported:
            return float(reported[key])
    return None
