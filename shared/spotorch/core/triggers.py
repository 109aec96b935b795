"""Storage events in one shape, and the pure rules that decide which objects feed which pipelines.

Two wire forms reach spotorch for the same object change; both are decoded at the edge
(spotorch.entrypoints.storage_events) into the same ObjectEvent. Nothing here does I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from fnmatch import fnmatchcase
from typing import Any

from spotorch.core.pipeline import BatchMode, Pipeline, Trigger


class ObjectEventKind(StrEnum):
    """What happened to an object; only FINALIZE ever feeds a pipeline."""

    FINALIZE = "finalize"  # a new object or a new generation of one is complete
    DELETE = "delete"  # a generation was deleted (or replaced: GCS sends this for overwrites too)
    METADATA = "metadata"  # metadata changed; the content did not
    ARCHIVE = "archive"  # a live generation became noncurrent (versioned buckets)


@dataclass(frozen=True)
class ObjectEvent:
    """One change to one object generation, whichever way it was delivered."""

    event_id: str
    kind: str  # an ObjectEventKind, or the raw type of a kind spotorch does not know
    bucket: str
    name: str
    generation: int
    size: int | None = None
    time: float | None = None  # the object's `updated` (else `timeCreated`), seconds since epoch
    content_type: str | None = None

    @property
    def uri(self) -> str:
        """The object as a gs:// URI."""
        return f"gs://{self.bucket}/{self.name}"


# --- matching -----------------------------------------------------------------------------------


def split_gs_uri(uri: str) -> tuple[str, str]:
    """(bucket, object prefix) of gs://bucket/path; the prefix ends with '/' unless it is empty."""
    if not uri.startswith("gs://"):
        raise ValueError(f"not a gs:// URI: {uri!r}")
    bucket, _, path = uri[len("gs://"):].partition("/")
    path = path.strip("/")
    return bucket, f"{path}/" if path else ""


def own_prefixes(pipeline: Pipeline) -> tuple[tuple[str, str], ...]:
    """(bucket, prefix) of all a pipeline's runs write: checkpoints, models, Vertex output."""
    uris = (pipeline.checkpoint_uri, pipeline.output_uri, pipeline.job.base_output_uri or "")
    return tuple(split_gs_uri(uri) for uri in uris if uri.startswith("gs://"))


def in_own_outputs(pipeline: Pipeline, bucket: str, name: str) -> bool:
    """Whether an object is something the pipeline's own jobs wrote (never a trigger)."""
    return any(b == bucket and name.startswith(p) for b, p in own_prefixes(pipeline))


def ignore_rule(trigger: Trigger, name: str) -> str | None:
    """The first ignore pattern an object name matches (tried on the name and on '/' + name)."""
    slashed = f"/{name}"
    return next((pattern for pattern in trigger.ignore
                 if fnmatchcase(name, pattern) or fnmatchcase(slashed, pattern)), None)


def snapshot_key(trigger: Trigger, name: str) -> str | None:
    """The snapshot an object belongs to: its own name (each_object), else the snapshot folder.

    The folder is the prefix plus the first `snapshot_depth` path segments below it, with a
    trailing '/'; None when the object does not lie inside such a folder.
    """
    if not name.startswith(trigger.prefix) or name.endswith("/"):
        return None
    if trigger.batch is BatchMode.EACH_OBJECT:
        return name
    parts = name[len(trigger.prefix):].split("/")
    folders = parts[:trigger.snapshot_depth]
    if len(parts) <= trigger.snapshot_depth or not all(folders):
        return None
    return trigger.prefix + "".join(f"{folder}/" for folder in folders)


def is_marker(trigger: Trigger, name: str) -> bool:
    """Whether the object is the marker of its snapshot folder (batch: marker only)."""
    key = snapshot_key(trigger, name)
    return (trigger.batch is BatchMode.MARKER and key is not None
            and name == key + trigger.marker)


def selects(trigger: Trigger, name: str) -> bool:
    """Whether the glob (on the name below the prefix) and the suffixes admit an object."""
    below = name[len(trigger.prefix):]
    return ((trigger.glob is None or fnmatchcase(below, trigger.glob))
            and (not trigger.suffixes or name.endswith(tuple(trigger.suffixes))))


# Each rule: its name, why an object is skipped, and the test it must pass. Order matters only
# for the reason reported; every rule is cheap.
_Rule = tuple[str, str, Callable[[Pipeline, ObjectEvent], bool]]
_RULES: tuple[_Rule, ...] = (
    ("finalized", "not a finalized object (deletes, archives and metadata updates never trigger)",
     lambda p, e: e.kind == ObjectEventKind.FINALIZE),
    ("bucket", "another bucket", lambda p, e: e.bucket == p.trigger.bucket),
    ("prefix", "outside the trigger prefix", lambda p, e: e.name.startswith(p.trigger.prefix)),
    ("placeholder", "a folder placeholder", lambda p, e: not e.name.endswith("/")),
    ("own_output", "written by the pipeline's own jobs (checkpoint or output prefix)",
     lambda p, e: not in_own_outputs(p, e.bucket, e.name)),
    ("ignored", "matches an ignore rule", lambda p, e: ignore_rule(p.trigger, e.name) is None),
    ("folder", "not inside a snapshot folder (see snapshot_depth)",
     lambda p, e: snapshot_key(p.trigger, e.name) is not None),
    ("selection", "excluded by the trigger's glob or suffixes",
     lambda p, e: is_marker(p.trigger, e.name) or selects(p.trigger, e.name)),
)
# Rules whose miss is intended (the pipeline means to skip such objects): never an upload that
# "matched nothing" (spotorch.app.unmatched records only the others).
INTENDED_SKIPS = frozenset({"finalized", "placeholder", "own_output", "ignored"})


def _missed(pipeline: Pipeline, event: ObjectEvent) -> tuple[str, str] | None:
    return next(((name, reason) for name, reason, passes in _RULES
                 if not passes(pipeline, event)), None)


def skip_reason(pipeline: Pipeline, event: ObjectEvent) -> str | None:
    """Why an event does not feed a pipeline, or None when it does."""
    missed = _missed(pipeline, event)
    return None if missed is None else missed[1]


def expectation(trigger: Trigger) -> dict[str, Any]:
    """What a trigger expects of an object, as data: where, which names, and the marker."""
    expected: dict[str, Any] = {"bucket": trigger.bucket, "prefix": trigger.prefix,
                                "batch": str(trigger.batch),
                                "snapshot_depth": trigger.snapshot_depth}
    if trigger.suffixes:
        expected["suffixes"] = list(trigger.suffixes)
    if trigger.glob:
        expected["glob"] = trigger.glob
    if trigger.batch is BatchMode.MARKER:
        expected["marker"] = trigger.marker
        expected["manifest"] = trigger.manifest
    return expected


def expectation_text(trigger: Trigger) -> str:
    """What a trigger expects, for people: 'objects ending .csv in gs://b/p/<folder>/; marker
    _DONE'."""
    folder = "".join(f"<{'folder' if i == 0 else 'sub'}>/" for i in range(trigger.snapshot_depth))
    where = f"gs://{trigger.bucket}/{trigger.prefix}" + \
        ("" if trigger.batch is BatchMode.EACH_OBJECT else folder)
    names = " or ".join(trigger.suffixes)
    what = (f"objects ending {names}" if trigger.suffixes else "objects") + \
        (f" matching {trigger.glob}" if trigger.glob else "")
    text = f"{what} in {where}"
    if trigger.batch is BatchMode.MARKER:
        text += f"; marker {trigger.marker}" + (" (a manifest)" if trigger.manifest else "")
    return text


@dataclass(frozen=True)
class Miss:
    """The rule an object missed in one pipeline, and what that pipeline expects."""

    pipeline: str
    rule: str  # a rule name: bucket, prefix, folder, selection (or an intended skip)
    reason: str
    expected: Mapping[str, Any]
    text: str  # reason and expectation in one line

    def to_doc(self) -> dict[str, Any]:
        """The miss as stored in an unmatched-upload record."""
        return {"pipeline": self.pipeline, "rule": self.rule, "reason": self.reason,
                "expected": dict(self.expected), "text": self.text}


def miss(pipeline: Pipeline, event: ObjectEvent) -> Miss | None:
    """Why an object does not feed a pipeline, with what it expects; None when it does."""
    missed = _missed(pipeline, event)
    if missed is None:
        return None
    rule, reason = missed
    trigger = pipeline.trigger
    text = f"{reason}: expects {expectation_text(trigger)}"
    base = event.name.rsplit("/", 1)[-1]
    if rule == "selection" and trigger.batch is BatchMode.MARKER and base[:1] in ("_", "."):
        text = f"{base} is not the marker (this pipeline's marker is {trigger.marker}); " + text
    return Miss(pipeline.name, rule, reason, expectation(trigger), text)


@dataclass(frozen=True)
class Match:
    """An object event that feeds a pipeline, and the snapshot it belongs to."""

    pipeline: Pipeline
    bucket: str
    snapshot_key: str  # folder ending in '/', or the object's name for each_object
    is_marker: bool

    @property
    def data_uri(self) -> str:
        """The snapshot's folder as a gs:// URI."""
        return f"gs://{self.bucket}/{self.snapshot_key}"


def match(pipeline: Pipeline, event: ObjectEvent) -> Match | None:
    """The snapshot an event feeds in a pipeline, or None (skip_reason says why)."""
    if skip_reason(pipeline, event) is not None:
        return None
    key = snapshot_key(pipeline.trigger, event.name)
    assert key is not None  # a rule above guarantees it
    return Match(pipeline, event.bucket, key, is_marker(pipeline.trigger, event.name))
