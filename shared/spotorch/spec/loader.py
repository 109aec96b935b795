"""Pipeline files: YAML read into spotorch.core.pipeline's dataclasses by pydantic, plus semantic checks.

Every problem in every file is reported at once (file, field path, what is wrong, line), never
just the first; warnings name settings that have no effect. Pipelines load once per process (cold
start) through cached_pipelines(). `python -m spotorch.spec.loader schema` writes
schemas/pipeline.schema.json, generated from the same dataclasses.
"""

from __future__ import annotations

import argparse
import difflib
import functools
import json
import logging
import os
import re
import sys
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import date, datetime
from pathlib import Path
from typing import Any

import yaml
from pydantic import TypeAdapter, ValidationError

from spotorch.core.errors import ConfigError, Problem
from spotorch.core.events import EVENT_KINDS, TYPE_PREFIX
from spotorch.core.fields import format_duration, parse_duration
from spotorch.core.pipeline import (
    BUILTIN_IGNORE,
    BatchMode,
    EscalationKind,
    Pipeline,
    RecoveryPolicy,
    Trigger,
)
from spotorch.core.triggers import ignore_rule, split_gs_uri
from spotorch.settings import Settings
from spotorch.spec.catalog import Catalog, accelerator_region_warnings, check_names, load_catalog
from spotorch.spec.fileformat import PipelineJsonSchema

SCHEMA_FILE = "pipeline.schema.json"
SCHEMA_ENV = "SPOTORCH_PIPELINE_SCHEMA"  # the schema file, when it is not shipped next to spotorch
PIPELINE_SUFFIXES = (".yaml", ".yml")
DEFAULT_IGNORE: tuple[str, ...] = BUILTIN_IGNORE  # always on; files add to them
RESERVED_ENV_PREFIXES = ("SPOTORCH_", "AIP_")  # set by spotorch and by Vertex AI on every worker
# spotorch_run, spotorch_attempt, ... (and the hyphenated keys of earlier releases)
RESERVED_LABEL_PREFIXES = ("spotorch_", "spotorch-")
MAX_NODES = 20_000  # YAML aliases can expand a small file into a huge one; pipelines are small
MAX_DEPTH = 32  # and a recursive alias into an endless one
SCHEMA_HEADER = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "$id": "https://spotorch.dev/schemas/pipeline.schema.json",
    "title": "spotorch pipeline",
    "description": "One pipeline: which objects start runs, the Vertex AI job each run launches, "
                   "how it recovers and whom it tells. See docs/pipelines.md. Durations are "
                   "seconds (a number) or strings like '90s', '30m', '2h', '1h30m', '1d'. "
                   "Generated from spotorch/core/pipeline.py by `python -m spotorch.spec.loader schema`.",
}
__all__ = ["format_duration", "parse_duration"]  # re-exported: they were defined here


# --- YAML with field paths, lines and duplicate keys ---------------------------------------------


def _join(path: str, key: object) -> str:
    return f"{path}[{key}]" if isinstance(key, int) else (f"{path}.{key}" if path else str(key))


@dataclass
class _Parsed:
    doc: Any
    lines: dict[str, int]  # field path -> 1-based line
    problems: list[tuple[str, str]]


class _TooLarge(Exception):
    """The document expands beyond MAX_NODES or MAX_DEPTH; the message says which."""


def _parse_yaml(text: str) -> _Parsed:
    """Parse one YAML document, recording the line of every field and every duplicated key."""
    parsed = _Parsed(None, {}, [])
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            parsed.problems.append(("", "the file is empty"))
            return parsed
        budget = [MAX_NODES]
        parsed.doc = _construct(loader, node, "", parsed, budget)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f" (line {mark.line + 1})" if mark else ""
        parsed.problems.append(("", f"not valid YAML: {exc.problem or exc.context}{where}"))
    except yaml.YAMLError as exc:
        parsed.problems.append(("", f"not valid YAML: {exc}"))
    except _TooLarge as exc:
        parsed.problems.append(("", str(exc)))
    finally:
        loader.dispose()
    return parsed


def _construct(loader: yaml.SafeLoader, node: yaml.Node, path: str, parsed: _Parsed,
               budget: list[int]) -> Any:
    budget[0] -= 1
    if budget[0] < 0:
        raise _TooLarge(f"more than {MAX_NODES} YAML nodes (alias expansion?)")
    if path.count(".") + path.count("[") > MAX_DEPTH:
        raise _TooLarge(f"nested more than {MAX_DEPTH} levels deep (a recursive alias?)")
    parsed.lines.setdefault(path, node.start_mark.line + 1)
    if isinstance(node, yaml.MappingNode):
        seen: dict[str, int] = {}
        for key_node, _ in node.value:
            if isinstance(key_node, yaml.ScalarNode) and key_node.tag != "tag:yaml.org,2002:merge":
                key = str(loader.construct_object(key_node))
                if key in seen:
                    parsed.problems.append((_join(path, key), (
                        f"given twice (lines {seen[key]} and {key_node.start_mark.line + 1}); "
                        "YAML would silently keep the last")))
                seen.setdefault(key, key_node.start_mark.line + 1)
        loader.flatten_mapping(node)  # resolves << merge keys
        out: dict[str, Any] = {}
        for key_node, value_node in node.value:
            key = str(loader.construct_object(key_node, deep=True))
            out[key] = _construct(loader, value_node, _join(path, key), parsed, budget)
        return out
    if isinstance(node, yaml.SequenceNode):
        return [_construct(loader, item, _join(path, i), parsed, budget)
                for i, item in enumerate(node.value)]
    return loader.construct_object(node, deep=True)


# --- the format: pydantic reads a document into spotorch.core.pipeline's dataclasses ---------------------


def schema_candidates(environ: Mapping[str, str] | None = None) -> list[Path]:
    """Where the committed schema file is looked for: $SPOTORCH_PIPELINE_SCHEMA, then schemas/
    next to the package, in a bundle (beside spotorch/) and in the repository (shared/spotorch)."""
    env = os.environ if environ is None else environ
    here = Path(__file__).resolve().parents[1]  # the spotorch package
    found = [Path(env[SCHEMA_ENV])] if env.get(SCHEMA_ENV) else []
    bases = (here, here.parent, here.parent.parent)
    return found + [base / "schemas" / SCHEMA_FILE for base in bases]


def schema_path(environ: Mapping[str, str] | None = None) -> Path:
    """The schema file (for editors; validation does not read it); ConfigError naming every place
    looked at when there is none."""
    candidates = schema_candidates(environ)
    for candidate in candidates:
        if candidate.is_file():
            return candidate
    raise ConfigError([Problem(SCHEMA_FILE, "", "pipeline schema not found; looked in "
                               + ", ".join(map(str, candidates)) + f" (set {SCHEMA_ENV})")])


@functools.cache
def _adapter() -> TypeAdapter[Pipeline]:
    # Built on first use: a process that never reads a pipeline file never pays for it.
    return TypeAdapter(Pipeline)


def _strip_titles(node: Any) -> Any:
    """pydantic titles every class and field after its Python name; the file has its own names.
    (No field of the format is called "title", so no property is lost.)"""
    if isinstance(node, dict):
        return {k: _strip_titles(v) for k, v in node.items() if k != "title"}
    return [_strip_titles(v) for v in node] if isinstance(node, list) else node


@functools.cache
def _cached_schema() -> str:
    generated = _adapter().json_schema(schema_generator=PipelineJsonSchema, mode="validation")
    schema = {**SCHEMA_HEADER, **{k: v for k, v in _strip_titles(generated).items()
                                  if k not in SCHEMA_HEADER}}
    return json.dumps(schema, indent=2, sort_keys=False) + "\n"


def pipeline_schema() -> dict[str, Any]:
    """The JSON Schema (2020-12) of pipeline files, generated from spotorch.core.pipeline."""
    schema: dict[str, Any] = json.loads(_cached_schema())
    return schema


def pipeline_schema_text() -> str:
    """What schemas/pipeline.schema.json holds: pipeline_schema() as written by `schema`."""
    return _cached_schema()


@functools.cache
def _schema_tree() -> Mapping[str, Any]:
    return pipeline_schema()  # read-only here: pipeline_schema() gives callers their own copy


def _schema_at(loc: Sequence[int | str]) -> Mapping[str, Any]:
    """The schema node of a field location (for its known keys, enum values)."""
    root = _schema_tree()

    def resolve(node: Any) -> Mapping[str, Any]:
        while isinstance(node, Mapping) and "$ref" in node:
            node = root["$defs"][node["$ref"].rsplit("/", 1)[1]]
        if isinstance(node, Mapping) and "anyOf" in node:  # X or null: X
            node = next((n for n in node["anyOf"] if n.get("type") != "null"), node)
            return resolve(node)
        return node if isinstance(node, Mapping) else {}

    node = resolve(root)
    for part in loc:
        if isinstance(part, int):
            node = resolve(node.get("items", {}))
        else:
            props = node.get("properties", {})
            node = resolve(props[part] if part in props else node.get("additionalProperties", {}))
    return node


# Python type of a parsed YAML value -> how to name it (bool before int: bools are ints).
_KINDS: tuple[tuple[type | tuple[type, ...], str], ...] = (
    (bool, "true/false"), (int, "an integer"), (float, "a number"), (str, "a string"),
    ((datetime, date), "a date"), (list, "a list"), (dict, "a mapping"), (type(None), "empty"))


def _kind(value: Any) -> str:
    return next((name for t, name in _KINDS if isinstance(value, t)), type(value).__name__)


def _show(value: Any) -> str:
    if isinstance(value, dict | list):
        return _kind(value)
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


# pydantic error type -> what the field wanted, for "must be X, not Y".
_WANTED = {"string_type": "a string", "int_type": "an integer", "int_from_float": "an integer",
           "int_parsing": "an integer", "float_type": "a number", "float_parsing": "a number",
           "bool_type": "true or false", "bool_parsing": "true or false", "tuple_type": "a list",
           "list_type": "a list", "dict_type": "a mapping", "dataclass_type": "a mapping",
           "dataclass_exact_type": "a mapping", "string_or_number": "a string or a number"}


def _type_message(wanted: str, value: Any) -> str:
    quote = "string" in wanted and isinstance(value, int | float | bool | date)
    return f"must be {wanted}, not {_kind(value)}{'; quote it' if quote else ''}"


def _choices(error: Any, schema: Mapping[str, Any]) -> str:
    if "enum" in schema:
        return ", ".join(map(str, schema["enum"]))
    return str(error.get("ctx", {}).get("expected", "")).replace("'", "").replace(" or ", ", ")


def _items_of(ctx: Mapping[str, Any], key: str) -> str:
    entries = str(ctx.get("field_type", "")).lower() == "dictionary"
    return _plural(int(ctx[key]), "entry" if entries else "item")


# pydantic error type -> message, from (error, the schema node of its field, the value).
_MESSAGES: Mapping[str, Callable[[Any, Mapping[str, Any], Any], str]] = {
    "missing": lambda e, s, v: "is required",
    "enum": lambda e, s, v: (f"must be one of {_choices(e, s)}; got {_show(v)}"),
    "literal_error": lambda e, s, v: f"must be {e['ctx']['expected']}; got {_show(v)}",
    "greater_than_equal": lambda e, s, v: f"must be at least {e['ctx']['ge']:g}; got {_show(v)}",
    "less_than_equal": lambda e, s, v: f"must be at most {e['ctx']['le']:g}; got {_show(v)}",
    "too_short": lambda e, s, v: f"needs at least {_items_of(e['ctx'], 'min_length')}",
    "too_long": lambda e, s, v: f"takes at most {_items_of(e['ctx'], 'max_length')}",
    "string_too_short": lambda e, s, v: "must not be empty",
    "unique": lambda e, s, v: e["msg"],
    "pattern": lambda e, s, v: f"{e['msg']}; got {_show(v)}",
    "duration": lambda e, s, v: f"{e['msg']}; got {_show(v)}",
}


def _path(loc: Sequence[int | str]) -> str:
    out = ""
    for part in loc:
        out = _join(out, part)
    return out


def _unknown_field(loc: Sequence[int | str]) -> str:
    known = list(_schema_at(loc[:-1]).get("properties", {}))
    close = difflib.get_close_matches(str(loc[-1]), known, n=1)
    return f"unknown field; did you mean {close[0]!r}?" if close else \
        f"unknown field (known: {', '.join(known)})"


def _describe(error: Any, originals: Mapping[str, Any]) -> tuple[str, str]:
    """(field path, message) of one pydantic error; originals holds values JSON could not carry."""
    loc = [part for part in error["loc"] if part != "[key]"]
    path = _path(loc)
    value = originals.get(path, error["input"])
    kind = str(error["type"])
    if kind == "unexpected_keyword_argument":
        return path, _unknown_field(loc)
    if "[key]" in error["loc"]:  # the key itself is wrong, not its value
        message = _MESSAGES.get(kind)
        text = message(error, {}, loc[-1]) if message else str(error["msg"])
        return path, f"key {text}"
    if kind in _WANTED:
        return path, _type_message(_WANTED[kind], value)
    message = _MESSAGES.get(kind)
    return path, message(error, _schema_at(loc), value) if message else str(error["msg"])


def _json_ready(node: Any, path: str, originals: dict[str, Any]) -> Any:
    """The document as JSON carries it: YAML dates (and other non-JSON values) become text, and
    are remembered so that messages can name what YAML really read."""
    if isinstance(node, Mapping):
        return {k: _json_ready(v, _join(path, k), originals) for k, v in node.items()}
    if isinstance(node, list):
        return [_json_ready(v, _join(path, i), originals) for i, v in enumerate(node)]
    if node is None or isinstance(node, str | int | float | bool):
        return node
    originals[path] = node
    return str(node)


def _read(doc: Mapping[str, Any]) -> tuple[Pipeline | None, list[tuple[str, str]]]:
    """The pipeline of a document, or every format problem in it.

    Validated as JSON in strict mode, so that types mean what they mean in JSON Schema: 1 is not
    true, "5" is not 5, and a list may stand for a tuple."""
    originals: dict[str, Any] = {}
    text = json.dumps(_json_ready(doc, "", originals))
    problems: list[tuple[str, str]] = []
    try:
        pipeline = _adapter().validate_json(text, strict=True)
    except ValidationError as exc:
        pipeline = None
        errors = exc.errors()
        # pydantic counts only the items that passed, so a list with a bad item also reads as
        # too short: the item's own error says what is wrong.
        deeper = {tuple(e["loc"][:n]) for e in errors for n in range(len(e["loc"]))}
        problems = [_describe(error, originals) for error in errors
                    if not (error["type"] in ("too_short", "too_long")
                            and tuple(error["loc"]) in deeper)]
    wrong = {path for path, _ in problems}
    for path, value in originals.items():
        if path not in wrong:  # a text field took it: YAML still read something else
            problems.append((path, f"must be a string, not {_kind(value)}; quote it"))
    return (pipeline if not problems else None), problems


# --- semantic checks (what the schema cannot say) -------------------------------------------------


def _get(doc: Any, path: str) -> Any:
    node = doc
    for part in path.split("."):
        if not isinstance(node, Mapping):
            return None
        node = node.get(part)
    return node


def _duration(doc: Any, path: str) -> float | None:
    value = _get(doc, path)
    try:
        return None if value is None else parse_duration(value)
    except ValueError:
        return None  # the schema reports it


def _str(doc: Any, path: str, default: str = "") -> str:
    value = _get(doc, path)
    return value if isinstance(value, str) else default


def _items(doc: Any, path: str) -> list[Any]:
    value = _get(doc, path)
    return value if isinstance(value, list) else []


_Found = Iterator[tuple[str, str]]

_POSITIVE_DURATIONS = ("deadline", "trigger.quiet_period", "job.timeout", "job.flex_max_wait",
                       "recovery.stockout_wait", "recovery.expected_compute")


def _check_positive_durations(doc: Any) -> _Found:
    for path in _POSITIVE_DURATIONS:
        if _duration(doc, path) == 0:
            yield path, "must be longer than zero"


def _check_deadline(doc: Any) -> _Found:
    deadline = _duration(doc, "deadline")
    compute = _duration(doc, "recovery.expected_compute")
    overhead = _duration(doc, "recovery.restart_overhead")
    overhead = RecoveryPolicy.restart_overhead_s if overhead is None else overhead
    if deadline and compute and deadline < compute + overhead:
        yield "deadline", (f"{format_duration(deadline)} is shorter than recovery.expected_compute "
                           f"({format_duration(compute)}) plus one start "
                           f"(restart_overhead {format_duration(overhead)}): it cannot be met even "
                           "on standard VMs")


def _check_backoff(doc: Any) -> _Found:
    base, cap = _duration(doc, "recovery.backoff_base"), _duration(doc, "recovery.backoff_cap")
    base = RecoveryPolicy.backoff_base_s if base is None else base
    cap = RecoveryPolicy.backoff_cap_s if cap is None else cap
    if base > cap:
        yield "recovery.backoff_base", (f"{format_duration(base)} is longer than backoff_cap "
                                        f"({format_duration(cap)})")


# Trigger option -> the batch mode it belongs to.
_BATCH_OPTIONS = {"marker": "marker", "manifest": "marker", "quiet_period": "quiet_period",
                  "min_objects": "min_objects"}


def _check_batch_options(doc: Any) -> _Found:
    trigger = _get(doc, "trigger")
    if not isinstance(trigger, Mapping):
        return
    batch = trigger.get("batch", BatchMode.EACH_OBJECT.value)
    for option, mode in _BATCH_OPTIONS.items():
        if option in trigger and trigger[option] is not False and batch != mode:
            yield f"trigger.{option}", f"only applies when batch is {mode} (here it is {batch})"
    depth = trigger.get("snapshot_depth", Trigger.snapshot_depth)
    if batch == BatchMode.EACH_OBJECT and "snapshot_depth" in trigger:
        yield "trigger.snapshot_depth", "has no effect with batch: each_object (every object is " \
                                        "its own snapshot)"
    if batch in (BatchMode.QUIET_PERIOD, BatchMode.MIN_OBJECTS) and depth == 0:
        yield "trigger.snapshot_depth", (
            f"must be at least 1 when batch is {batch}: the prefix itself would be one snapshot "
            "that completes once, and files added later count as late (use one folder per "
            "delivery, batch: marker, or batch: each_object)")


def _check_ignore(doc: Any) -> _Found:
    extra = [p for p in _items(doc, "trigger.ignore") if isinstance(p, str)]
    for i, pattern in enumerate(extra):
        if not pattern.strip("*/"):
            yield f"trigger.ignore[{i}]", f"{pattern!r} ignores every object"
    if _get(doc, "trigger.batch") != BatchMode.MARKER:
        return
    marker = _str(doc, "trigger.marker", Trigger.marker)
    depth = _get(doc, "trigger.snapshot_depth")
    depth = depth if isinstance(depth, int) and 0 <= depth <= 16 else Trigger.snapshot_depth
    trigger = Trigger(bucket="-", ignore=DEFAULT_IGNORE + tuple(extra))
    example = _str(doc, "trigger.prefix") + "snapshot/" * depth + marker
    rule = ignore_rule(trigger, example)
    if rule is not None:
        yield "trigger.marker", (f"{marker!r} matches the ignore rule {rule!r} ({example}): the "
                                 "snapshot would never complete")


_OWN_URIS = ("checkpoint_uri", "output_uri", "job.base_output_uri")


def _check_overlap(doc: Any) -> _Found:
    bucket, prefix = _str(doc, "trigger.bucket"), _str(doc, "trigger.prefix")
    if not bucket:
        return
    for path in _OWN_URIS:
        uri = _str(doc, path)
        if not uri.startswith("gs://"):
            continue
        own_bucket, own = split_gs_uri(uri)
        if own_bucket != bucket:
            continue
        if prefix.startswith(own):
            yield path, (f"the trigger (gs://{bucket}/{prefix}) lies inside {uri}: objects there "
                         "are the pipeline's own output and never start a run")
        elif own.startswith(prefix):
            yield path, (f"{uri} lies inside the trigger (gs://{bucket}/{prefix}): keep a "
                         "pipeline's own writes out of the folder it watches")


_PATTERN_LISTS = ("preemption_patterns", "infra_patterns", "timeout_patterns")


def _check_regexes(doc: Any) -> _Found:
    lists = [f"recovery.{name}" for name in _PATTERN_LISTS] + ["health.oom_patterns"]
    for path in lists:
        for i, pattern in enumerate(_items(doc, path)):
            if isinstance(pattern, str):
                try:
                    re.compile(pattern)
                except re.error as exc:
                    yield f"{path}[{i}]", f"not a valid regular expression: {exc}"


def _check_pools(doc: Any) -> _Found:
    pools = [p if isinstance(p, Mapping) else {} for p in _items(doc, "job.worker_pools")]
    chief = pools[0].get("replica_count", 1) if pools else 1
    if isinstance(chief, int) and not isinstance(chief, bool) and chief != 1:
        yield "job.worker_pools[0].replica_count", "must be 1: the first pool is the chief"
    for i, pool in enumerate(pools):
        where = f"job.worker_pools[{i}]"
        kind, count = pool.get("accelerator_type"), pool.get("accelerator_count", 0)
        if kind and not count:
            yield f"{where}.accelerator_count", "must be at least 1 when accelerator_type is set"
        if count and not kind:
            yield f"{where}.accelerator_type", "is required when accelerator_count is set"
        env = pool.get("env")
        for key in env if isinstance(env, Mapping) else ():
            if str(key).startswith(RESERVED_ENV_PREFIXES):
                reserved = " and ".join(f"{p}*" for p in RESERVED_ENV_PREFIXES)
                yield f"{where}.env.{key}", f"is reserved: spotorch and Vertex AI set {reserved}"


def _check_candidates(doc: Any) -> _Found:
    candidates = [c if isinstance(c, Mapping) else {}
                  for c in _items(doc, "hardware.candidates")]
    seen: set[str] = set()
    for i, candidate in enumerate(candidates):
        where = f"hardware.candidates[{i}]"
        name = candidate.get("name")
        if isinstance(name, str) and name in seen:
            yield f"{where}.name", f"{name!r} is already the name of another candidate"
        seen.add(str(name))
        kind, count = candidate.get("accelerator_type"), candidate.get("accelerator_count", 0)
        if kind and not count:
            yield f"{where}.accelerator_count", "must be at least 1 when accelerator_type is set"
        if count and not kind:
            yield f"{where}.accelerator_type", "is required when accelerator_count is set"
        if candidate.get("tpu_topology") and not str(kind or "").startswith("TPU_"):
            yield f"{where}.tpu_topology", "applies only to a TPU accelerator_type"
        env = candidate.get("env")
        for key in env if isinstance(env, Mapping) else ():
            if str(key).startswith(RESERVED_ENV_PREFIXES):
                reserved = " and ".join(f"{p}*" for p in RESERVED_ENV_PREFIXES)
                yield f"{where}.env.{key}", f"is reserved: spotorch and Vertex AI set {reserved}"


def _check_labels(doc: Any) -> _Found:
    labels = _get(doc, "job.labels")
    for key in labels if isinstance(labels, Mapping) else ():
        if str(key).startswith(RESERVED_LABEL_PREFIXES):
            yield f"job.labels.{key}", ("is reserved: spotorch sets the spotorch_* labels "
                                        "(spotorch-* too, from earlier releases)")


def _selects_some_kind(pattern: str) -> bool:
    """Mirrors notify.route_matches: '*', fnmatch, a dot-bounded suffix, or the full type."""
    from fnmatch import fnmatchcase

    if pattern.startswith(TYPE_PREFIX):
        pattern = pattern[len(TYPE_PREFIX):].rsplit(".", 1)[0]
    return pattern == "*" or any(fnmatchcase(kind, pattern) or kind.endswith(f".{pattern}")
                                 for kind in EVENT_KINDS)


def _check_routes(doc: Any) -> _Found:
    for i, route in enumerate(_items(doc, "routes")):
        if not isinstance(route, Mapping):
            continue
        events = route.get("events")
        for j, pattern in enumerate(events if isinstance(events, list) else ()):
            if isinstance(pattern, str) and not _selects_some_kind(pattern):
                yield f"routes[{i}].events[{j}]", (f"{pattern!r} selects no spotorch event "
                                                   f"(kinds: {', '.join(EVENT_KINDS)})")
        target = route.get("target")
        if isinstance(target, str) and "@" in target and route.get("channel") != "email" \
                and "://" not in target:
            yield f"routes[{i}].target", "addresses are for email routes; name an environment " \
                                         "variable or an sm:// secret"


# --- secrets -------------------------------------------------------------------------------------

_SECRET_KEY = re.compile(r"(?i)(passw(or)?d|passwd|secret|token|api[_-]?key|apikey|private[_-]?key"
                         r"|credential|webhook)")
_SECRET_REFERENCE = re.compile(r"^(sm://)?projects/[^/]+/secrets/[^/]+(/versions/[^/]+)?$")
# Value pattern -> what it looks like. Checked on every string in the file.
_SECRET_VALUES: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"https://hooks\.slack\.com/"), "a Slack webhook URL"),
    (re.compile(r"https://chat\.googleapis\.com/v1/spaces/"), "a Google Chat webhook URL"),
    (re.compile(r"(?i)https?://\S*webhook"), "a webhook URL"),
    (re.compile(r"(?i)https?://\S*[?&](key|token|sig|signature|secret|password|access_token|"
                r"api_key)="), "a URL carrying a credential"),
    (re.compile(r"://[^/\s:@]+:[^/\s@]+@"), "a URL with a password"),
    (re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----"), "a private key"),
    (re.compile(r"\bxox[abprs]-[0-9A-Za-z-]{10,}"), "a Slack token"),
    (re.compile(r"\bgh[pousr]_[0-9A-Za-z]{30,}"), "a GitHub token"),
    (re.compile(r"\bAIza[0-9A-Za-z_-]{35}"), "a Google API key"),
    (re.compile(r"\bAKIA[0-9A-Z]{16}\b"), "an AWS access key"),
)
_NO_SECRETS = ("secrets never go in pipeline files: keep it in Secret Manager (or the functions' "
               "environment) and name it, e.g. routes[].target: CHAT_WEBHOOK_URL or "
               "sm://projects/P/secrets/S")


def _walk(node: Any, path: str = "") -> Iterator[tuple[str, Any, Any]]:
    """(path, key, value) of every field and list item below node."""
    items = node.items() if isinstance(node, Mapping) else \
        enumerate(node) if isinstance(node, list) else ()
    for key, value in items:
        child = _join(path, key)
        yield child, key, value
        yield from _walk(value, child)


def _check_secrets(doc: Any) -> _Found:
    for path, key, value in _walk(doc):
        if isinstance(key, str) and _SECRET_KEY.search(key) and not (
                isinstance(value, str) and _SECRET_REFERENCE.match(value)):
            yield path, f"{key!r} looks like a secret; {_NO_SECRETS}"
            continue
        if isinstance(value, str):
            what = next((w for pattern, w in _SECRET_VALUES if pattern.search(value)), None)
            if what:
                yield path, f"looks like {what} (value not shown); {_NO_SECRETS}"


# --- warnings: settings that have no effect ------------------------------------------------------


def _escalation(doc: Any) -> str:
    value = _get(doc, "recovery.escalation")
    return value if isinstance(value, str) else EscalationKind.DEADLINE.value


def _set(doc: Any, path: str) -> bool:
    parent, _, key = path.rpartition(".")
    node = _get(doc, parent) if parent else doc
    return isinstance(node, Mapping) and key in node


# (field that is set, escalations under which it does nothing, why).
_NO_EFFECT: tuple[tuple[str, frozenset[str], str], ...] = (
    ("recovery.escalate_after_preemptions",
     frozenset({"never", "deadline", "always_standard"}),
     "only escalation: count uses it"),
    ("deadline", frozenset({"count"}),
     "the count policy ignores deadlines: it moves to standard VMs after "
     "escalate_after_preemptions preemptions whatever the time left (use escalation: deadline "
     "to let the deadline decide)"),
    ("recovery.stockout_wait", frozenset({"always_standard"}),
     "escalation: always_standard never queues for Spot VMs"),
    ("recovery.spot_cooldown", frozenset({"always_standard"}),
     "escalation: always_standard never moves to Spot VMs"),
    ("recovery.spot_probes", frozenset({"never", "count", "always_standard"}),
     "only the deadline policy weighs a probe's answer (policy.probe_worth)"),
)


def _no_effect(doc: Any) -> _Found:
    escalation = _escalation(doc)
    for path, escalations, why in _NO_EFFECT:
        if escalation in escalations and _set(doc, path):
            yield path, f"has no effect with escalation: {escalation}; {why}"


_CHECKS: tuple[Callable[[Any], _Found], ...] = (
    _check_positive_durations, _check_deadline, _check_backoff, _check_batch_options,
    _check_ignore, _check_overlap, _check_regexes, _check_pools, _check_labels, _check_routes,
    _check_candidates,
)


# --- loading ------------------------------------------------------------------------------------


def _line_of(lines: Mapping[str, int], path: str) -> int:
    """Line of a field, else of its nearest parent that is in the file."""
    while path:
        if path in lines:
            return lines[path]
        path = re.sub(r"(\.[^.\[]*|\[\d+\])$", "", path) if re.search(r"[.\[]", path) else ""
    return lines.get("", 0)


@dataclass(frozen=True)
class FileCheck:
    """What checking one file found: its pipeline (only when there are no problems), the problems
    (each fails the load) and the warnings (settings without effect; they do not)."""

    pipeline: Pipeline | None
    problems: tuple[Problem, ...]
    warnings: tuple[Problem, ...] = ()


def _located(file: str, lines: Mapping[str, int], found: Iterable[tuple[str, str]],
             ) -> tuple[Problem, ...]:
    unique = dict.fromkeys(found)  # several checks can say the same thing
    ordered = sorted(unique, key=lambda pm: (_line_of(lines, pm[0]), pm[0]))
    return tuple(Problem(file, p, f"{m} (line {line})" if (line := _line_of(lines, p)) else m)
                 for p, m in ordered)


def inspect_file(path: str | os.PathLike[str], catalog: Catalog | None = None) -> FileCheck:
    """Every problem and warning of one file, and its pipeline when it has no problems."""
    file = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        return FileCheck(None, (Problem(file, "", f"cannot read: {exc}"),))
    parsed = _parse_yaml(text)
    found = list(parsed.problems)
    warned: list[tuple[str, str]] = []
    pipeline = None
    if parsed.doc is not None:
        if not isinstance(parsed.doc, Mapping):
            found.append(("", f"must be a mapping of pipeline fields, not {_kind(parsed.doc)}"))
        else:
            pipeline, format_problems = _read(parsed.doc)
            found += format_problems
            if pipeline is not None:  # the health rules' own consistency (health.HealthPolicy)
                found += [(f"health.{f}", m) for f, m in pipeline.health.problems()]
            for check in _CHECKS:
                found += check(parsed.doc)
            names = catalog or load_catalog()
            # A name the format already rejects needs no second message.
            found += [(p, m) for p, m in check_names(parsed.doc, names)
                      if p not in {fp for fp, _ in format_problems}]
            warned = [*_no_effect(parsed.doc), *accelerator_region_warnings(parsed.doc, names)]
        # A secret wins over any other complaint about the same field: the others may echo it.
        secrets = dict(_check_secrets(parsed.doc))
        found = [(p, m) for p, m in found if p not in secrets] + list(secrets.items())
    problems = _located(file, parsed.lines, found)
    warnings = _located(file, parsed.lines, warned)
    if problems or pipeline is None:
        return FileCheck(None, problems, warnings)
    return FileCheck(replace(pipeline, source=file), (), warnings)


def check_file(path: str | os.PathLike[str]) -> tuple[Pipeline | None, tuple[Problem, ...]]:
    """The pipeline of one file and every problem in it (the pipeline only when there are none)."""
    checked = inspect_file(path)
    return checked.pipeline, checked.problems


def load_pipeline(path: str | os.PathLike[str]) -> Pipeline:
    """One pipeline file; ConfigError listing every problem in it."""
    pipeline, problems = check_file(path)
    if pipeline is None:
        raise ConfigError(problems)
    return pipeline


def pipeline_files(path: str | os.PathLike[str]) -> tuple[Path, ...]:
    """The file itself, or every *.yaml / *.yml below a directory (hidden ones left out), sorted."""
    root = Path(path)
    if not root.is_dir():
        return (root,)
    return tuple(sorted(p for p in root.rglob("*") if p.is_file()
                        and p.suffix in PIPELINE_SUFFIXES
                        and not any(part.startswith(".") for part in p.relative_to(root).parts)))


def _duplicates(pipelines: Sequence[Pipeline]) -> list[Problem]:
    by_name: dict[str, list[str]] = {}
    for p in pipelines:
        by_name.setdefault(p.name, []).append(p.source)
    return [Problem(source, "name", f"pipeline {name!r} is also defined in "
                    + ", ".join(s for s in sources if s != source))
            for name, sources in by_name.items() if len(sources) > 1 for source in sources]


_Report = Callable[[str, FileCheck], None]


def _check_all(paths: Iterable[str | os.PathLike[str]], report: _Report | None = None,
               ) -> tuple[tuple[Pipeline, ...], list[Problem]]:
    """Every pipeline and every problem of the given files and directories, duplicates included;
    report(file, check) hears about each file as it is checked (warnings are logged otherwise)."""
    def tell(file: str, checked: FileCheck) -> None:
        if report is not None:
            report(file, checked)
        else:
            for warning in checked.warnings:
                _log.warning("pipeline warning: %s", warning)

    pipelines: list[Pipeline] = []
    problems: list[Problem] = []
    for given in paths:
        if not Path(given).exists() or (Path(given).is_dir() and not pipeline_files(given)):
            missing = "no such file or directory" if not Path(given).exists() \
                else "no pipeline files (*.yaml, *.yml) here"
            problems.append(Problem(str(given), "", missing))
            tell(str(given), FileCheck(None, tuple(problems[-1:])))
            continue
        for file in pipeline_files(given):
            checked = inspect_file(file)
            tell(str(file), checked)
            problems += checked.problems
            pipelines += [checked.pipeline] if checked.pipeline else []
    duplicates = _duplicates(pipelines)
    if duplicates:
        tell("", FileCheck(None, tuple(duplicates)))
    return tuple(pipelines), problems + duplicates


def load_pipelines(path_or_dir: str | os.PathLike[str]) -> tuple[Pipeline, ...]:
    """Every pipeline of a file or directory; ConfigError listing every problem in every file."""
    pipelines, problems = _check_all([path_or_dir])
    if problems:
        raise ConfigError(problems)
    return pipelines


_cache_lock = threading.Lock()
_log = logging.getLogger(__name__)


@functools.cache
def _cached(resolved: str) -> tuple[Pipeline, ...]:
    return load_pipelines(resolved)


def cached_pipelines(path: str | os.PathLike[str] | None = None) -> tuple[Pipeline, ...]:
    """Pipelines at path (default $SPOTORCH_PIPELINES, relative to the working directory), loaded
    once per process: a cold start reads them, warm invocations reuse them."""
    where = Path(path if path is not None else Settings.from_env().pipelines).resolve()
    with _cache_lock:
        return _cached(str(where))


def clear_pipeline_cache() -> None:
    _cached.cache_clear()


# --- `spotorch validate` ------------------------------------------------------------------------


def validate_main(argv: list[str] | None = None) -> int:
    """`spotorch validate [PATH...]`: every problem of every file, OK per good file; 1 on any."""
    parser = argparse.ArgumentParser(
        prog="spotorch validate",
        description="Check pipeline files against the schema and spotorch's own rules.")
    parser.add_argument("paths", nargs="*", metavar="PATH",
                        help="pipeline files or directories (default: $SPOTORCH_PIPELINES, "
                             "else ./pipelines)")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    paths = args.paths or [Settings.from_env().pipelines]

    def report(file: str, checked: FileCheck) -> None:
        if checked.pipeline is not None and not checked.problems:
            print(f"OK {file} (pipeline {checked.pipeline.name})")
        for problem in checked.problems:
            print(problem)
        for warning in checked.warnings:
            print(f"warning: {warning}")

    try:
        _, problems = _check_all(paths, report)
    except ConfigError as exc:  # a machine table that cannot be read
        problems = list(exc.problems)
        report("", FileCheck(None, exc.problems))
    if problems:
        files = len({p.file for p in problems})
        print(f"{_plural(len(problems), 'problem')} in {_plural(files, 'file')}", file=sys.stderr)
        return 1
    return 0


# --- `python -m spotorch.spec.loader schema` --------------------------------------------------------

REPO_SCHEMA = Path(__file__).resolve().parents[3] / "schemas" / SCHEMA_FILE
REGENERATE = "python -m spotorch.spec.loader schema"


def schema_main(argv: list[str] | None = None) -> int:
    """Write schemas/pipeline.schema.json from spotorch.core.pipeline; --check: 1 if it differs."""
    parser = argparse.ArgumentParser(
        prog=REGENERATE, description="Write the pipeline JSON Schema generated from "
                                     "spotorch/core/pipeline.py (the one definition of the format).")
    parser.add_argument("--out", type=Path, default=REPO_SCHEMA)
    parser.add_argument("--check", action="store_true",
                        help="write nothing; exit 1 when the file differs from the generated one")
    args = parser.parse_args(argv)
    generated = pipeline_schema_text()
    current = args.out.read_text(encoding="utf-8") if args.out.is_file() else None
    if args.check:
        if current != generated:
            print(f"{args.out} differs from the schema generated from spotorch/core/pipeline.py; "
                  f"run: {REGENERATE}", file=sys.stderr)
            return 1
        return 0
    if current != generated:
        args.out.write_text(generated, encoding="utf-8")
        print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["schema"]:
        sys.exit(schema_main(sys.argv[2:]))
    sys.exit(validate_main())
