"""Intents: the side effects a decision records in the run's outbox, carried out after the write."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any, ClassVar

from spotorch.core.pipeline import Capacity


@dataclass(frozen=True)
class LaunchIntent:
    """Create the job of an attempt (or adopt the one a lost creation left behind)."""

    id: str
    attempt: int
    capacity: Capacity
    region: str
    resume_step: int | None = None
    resume_uri: str | None = None
    claimed_until: float = 0.0  # an executor owns it until then; afterwards the tick may take it
    machine_type: str | None = None  # overrides the first worker pool's (out-of-memory fallback)
    resume_exact: bool = False  # resume from resume_uri only, never a newer one (after divergence)
    # Why its claim was given up ("": it was not): the quota (QUOTA_REFUSED: the tick's retry
    # pass tries it again as the budget refills), or a Vertex that could not answer.
    deferred: str = ""
    kind: ClassVar[str] = "launch"


@dataclass(frozen=True)
class CancelIntent:
    """Ask Vertex AI to stop the job of an attempt."""

    id: str
    attempt: int  # 0 for a probe's job
    job_name: str
    reason: str
    claimed_until: float = 0.0
    probe: int = 0  # the probe whose job this is; 0: an attempt's
    kind: ClassVar[str] = "cancel"


@dataclass(frozen=True)
class LaunchProbeIntent:
    """Create the job of a Spot capacity probe (or adopt the one a lost creation left)."""

    id: str
    probe: int
    region: str
    claimed_until: float = 0.0
    kind: ClassVar[str] = "launch_probe"


@dataclass(frozen=True)
class PublishIntent:
    """Publish one of spotorch's own CloudEvents (structured JSON form)."""

    id: str
    event: Mapping[str, Any]
    claimed_until: float = 0.0
    kind: ClassVar[str] = "publish"


@dataclass(frozen=True)
class DeleteCheckpointsIntent:
    """Delete complete checkpoints under a run's root: retention, or the diverged ones.

    Retention (above is None): of the complete checkpoints listed, keep the newest keep_newest
    and the steps in keep; delete the others that are older than the newest kept one. Rollback
    (above set): delete every complete checkpoint after step `above` (written while diverging).
    Incomplete checkpoints are never deleted.
    """

    id: str
    root: str
    keep_newest: int = 1
    keep: tuple[int, ...] = ()
    above: int | None = None
    ending: bool = False  # decided when the run ended
    claimed_until: float = 0.0
    kind: ClassVar[str] = "delete_checkpoints"


@dataclass(frozen=True)
class RegisterModelIntent:
    """Register a succeeded run's model in Vertex AI Model Registry; run.succeeded waits for it."""

    id: str
    artifact_uri: str
    succeeded: Mapping[str, Any]  # the run.succeeded data, published with the model's name
    claimed_until: float = 0.0
    kind: ClassVar[str] = "register_model"


PREPROCESS_LOOKUP = "lookup"  # identify the input, look up the cache
PREPROCESS_LAUNCH = "launch"  # create the Dataflow job named job_name (or find the one it made)
PREPROCESS_CANCEL = "cancel"  # cancel the Dataflow job named job_name
PREPROCESS_MARK = "mark"  # write the output's completion marker (GetJob said JOB_STATE_DONE)


@dataclass(frozen=True)
class PreprocessIntent:
    """A side effect of the preprocess step (issue 31): one of the PREPROCESS_* actions."""

    id: str
    action: str
    job_name: str = ""
    claimed_until: float = 0.0
    kind: ClassVar[str] = "preprocess"


# A side effect decided in a transaction and carried out after it commits (the outbox).
Intent = (LaunchIntent | CancelIntent | PublishIntent | DeleteCheckpointsIntent
          | RegisterModelIntent | LaunchProbeIntent | PreprocessIntent)
_INTENT_TYPES: Mapping[str, type[Intent]] = {
    t.kind: t for t in (LaunchIntent, CancelIntent, PublishIntent, DeleteCheckpointsIntent,
                        RegisterModelIntent, LaunchProbeIntent, PreprocessIntent)}


def intent_to_dict(intent: Intent) -> dict[str, Any]:
    """An intent as stored in the run document: its fields plus its kind."""
    doc = asdict(intent)
    doc["kind"] = intent.kind
    if isinstance(intent, LaunchIntent):
        doc["capacity"] = str(intent.capacity)
    return doc


def intent_from_dict(doc: Mapping[str, Any]) -> Intent:
    """The intent a stored outbox entry holds (the inverse of intent_to_dict)."""
    data = {k: v for k, v in doc.items() if k != "kind"}
    kind = _INTENT_TYPES[str(doc["kind"])]
    if kind is LaunchIntent:
        data["capacity"] = Capacity(data["capacity"])
    if kind is DeleteCheckpointsIntent:
        data["keep"] = tuple(int(s) for s in data.get("keep", ()))
    return kind(**data)
