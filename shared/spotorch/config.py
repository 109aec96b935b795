"""Pipeline files: YAML validated against schemas/pipeline.schema.json plus semantic checks.

Every problem in every file is reported at once (file, field path, what is wrong, line), never
just the first. Pipelines load once per process (cold start) through cached_pipelines().
"""

from __future__ import annotations

import argparse
import difflib
import functools
import json
import os
import re
import sys
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import date, datetime
from pathlib import Path
from typing import Any

import yaml

from spotorch.errors import ConfigError, Problem
from spotorch.events import EVENT_KINDS, TYPE_PREFIX
from spotorch.pipeline import (
    BatchMode,
    EscalationKind,
    JobTemplate,
    OnActiveRun,
    Pipeline,
    RecoveryPolicy,
    Route,
    Trigger,
    WorkerPool,
)
from spotorch.settings import Settings
from spotorch.triggers import ignore_rule, split_gs_uri

SCHEMA_FILE = "pipeline.schema.json"
SCHEMA_ENV = "SPOTORCH_PIPELINE_SCHEMA"  # the schema file, when it is not shipped next to spotorch
PIPELINE_SUFFIXES = (".yaml", ".yml")
DEFAULT_IGNORE: tuple[str, ...] = Trigger(bucket="-").ignore  # always on; files add to them
RESERVED_ENV_PREFIXES = ("SPOTORCH_", "AIP_")  # set by spotorch and by Vertex AI on every worker
RESERVED_LABEL_PREFIX = "spotorch-"  # spotorch-run, spotorch-attempt, spotorch-pipeline
MAX_NODES = 20_000  # YAML aliases can expand a small file into a huge one; pipelines are small
MAX_DEPTH = 32  # and a recursive alias into an endless one


# --- durations ----------------------------------------------------------------------------------

_DURATION = re.compile(r"(?:[0-9]+(?:\.[0-9]+)?[smhd])+")
_DURATION_PART = re.compile(r"([0-9]+(?:\.[0-9]+)?)([smhd])")
_UNIT_SECONDS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_duration(value: Any) -> float:
    """Seconds of a duration: a number of seconds, or a string like '90s', '30m', '2h', '1h30m'."""
    if isinstance(value, int | float) and not isinstance(value, bool) and value >= 0:
        return float(value)
    if isinstance(value, str) and _DURATION.fullmatch(value):
        return sum(float(n) * _UNIT_SECONDS[u] for n, u in _DURATION_PART.findall(value))
    raise ValueError(f"not a duration: {value!r}")


def format_duration(seconds: float) -> str:
    """The shortest exact form of a duration, e.g. 5400 -> '1h30m'."""
    rest, out = int(seconds), []
    for unit in ("d", "h", "m", "s"):
        count, rest = divmod(rest, int(_UNIT_SECONDS[unit]))
        if count:
            out.append(f"{count}{unit}")
    return "".join(out) if out and float(seconds).is_integer() else f"{seconds:g}s"


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


# --- the schema -------------------------------------------------------------------------------


def schema_candidates(environ: Mapping[str, str] | None = None) -> list[Path]:
    """Where the schema file is looked for: $SPOTORCH_PIPELINE_SCHEMA, then schemas/ next to the
    package, in a bundle (beside spotorch/) and in the repository (shared/spotorch)."""
    env = os.environ if environ is None else environ
    here = Path(__file__).resolve().parent
    found = [Path(env[SCHEMA_ENV])] if env.get(SCHEMA_ENV) else []
    bases = (here, here.parent, here.parent.parent)
    return found + [base / "schemas" / SCHEMA_FILE for base in bases]


def schema_path(environ: Mapping[str, str] | None = None) -> Path:
    """The schema file; ConfigError naming every place looked at when there is none."""
    candidates = schema_candidates(environ)
    for candidate in candidates:
        if candidate.is_file():
            return candidate
    raise ConfigError([Problem(SCHEMA_FILE, "", "pipeline schema not found; looked in "
                               + ", ".join(map(str, candidates)) + f" (set {SCHEMA_ENV})")])


@functools.cache
def _validator(path: Path) -> Any:
    # jsonschema costs ~0.1 s to import: only code that validates pays for it.
    from jsonschema import Draft202012Validator

    schema = json.loads(path.read_text())
    Draft202012Validator.check_schema(schema)
    return Draft202012Validator(schema)


_TYPE_NAMES = {"string": "a string", "integer": "an integer", "number": "a number",
               "boolean": "true or false", "array": "a list", "object": "a mapping",
               "null": "null"}


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


def _type_message(error: Any) -> str:
    expected = error.validator_value if isinstance(error.validator_value, list) \
        else [error.validator_value]
    want = " or ".join(_TYPE_NAMES.get(str(t), str(t)) for t in expected)
    hint = ("; quote it" if "string" in expected
            and isinstance(error.instance, int | float | bool | date) else "")
    return f"must be {want}, not {_kind(error.instance)}{hint}"


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


# JSON Schema keyword -> message (the keyword's own wording is written for schema authors).
_MESSAGES: Mapping[str, Callable[[Any], str]] = {
    "type": _type_message,
    "enum": lambda e: (f"must be one of {', '.join(map(str, e.validator_value))}; "
                       f"got {_show(e.instance)}"),
    "const": lambda e: f"must be {e.validator_value!r}; got {_show(e.instance)}",
    "minimum": lambda e: f"must be at least {e.validator_value}; got {_show(e.instance)}",
    "maximum": lambda e: f"must be at most {e.validator_value}; got {_show(e.instance)}",
    "minItems": lambda e: f"needs at least {_plural(e.validator_value, 'item')}",
    "maxItems": lambda e: f"takes at most {_plural(e.validator_value, 'item')}",
    "uniqueItems": lambda e: "lists the same item twice",
    "minLength": lambda e: "must not be empty",
    "maxProperties": lambda e: f"takes at most {_plural(e.validator_value, 'entry')}",
    "pattern": lambda e: f"{_show(e.instance)} does not match {e.validator_value}",
}


def _describe(error: Any) -> list[tuple[str, str]]:
    """(field path, message) for one schema error; several for required/additionalProperties."""
    from jsonschema.exceptions import best_match

    path = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in error.absolute_path)
    path = path.lstrip(".")
    schema = error.schema if isinstance(error.schema, Mapping) else {}
    if error.validator == "required":
        return [(_join(path, name), "is required") for name in error.validator_value
                if isinstance(error.instance, Mapping) and name not in error.instance]
    if error.validator == "additionalProperties" and "properties" in schema:
        known = list(schema["properties"])
        out = []
        for key in error.instance:
            if key not in schema["properties"]:
                close = difflib.get_close_matches(str(key), known, n=1)
                hint = f"; did you mean {close[0]!r}?" if close else \
                    f" (known: {', '.join(known)})"
                out.append((_join(path, key), f"unknown field{hint}"))
        return out
    if "errorMessage" in schema:
        if "propertyNames" in error.schema_path:
            return [(_join(path, error.instance), f"key {schema['errorMessage']}")]
        return [(path, f"{schema['errorMessage']}; got {_show(error.instance)}")]
    if error.validator in ("anyOf", "oneOf") and error.context:
        return _describe(best_match(error.context))
    message = _MESSAGES.get(str(error.validator))
    return [(path, message(error) if message else str(error.message))]


def _schema_problems(doc: Any) -> list[tuple[str, str]]:
    from jsonschema.exceptions import relevance

    validator = _validator(schema_path())
    out: list[tuple[str, str]] = []
    for error in sorted(validator.iter_errors(doc), key=relevance):
        out.extend(_describe(error))
    return out


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
    for name in _PATTERN_LISTS:
        for i, pattern in enumerate(_items(doc, f"recovery.{name}")):
            if isinstance(pattern, str):
                try:
                    re.compile(pattern)
                except re.error as exc:
                    yield f"recovery.{name}[{i}]", f"not a valid regular expression: {exc}"


def _check_pools(doc: Any) -> _Found:
    pools = [p if isinstance(p, Mapping) else {} for p in _items(doc, "job.worker_pools")]
    if pools and pools[0].get("replica_count", 1) != 1:
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


def _check_labels(doc: Any) -> _Found:
    labels = _get(doc, "job.labels")
    for key in labels if isinstance(labels, Mapping) else ():
        if str(key).startswith(RESERVED_LABEL_PREFIX):
            yield f"job.labels.{key}", (f"is reserved: spotorch sets the "
                                        f"{RESERVED_LABEL_PREFIX}* labels")


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


_CHECKS: tuple[Callable[[Any], _Found], ...] = (
    _check_positive_durations, _check_deadline, _check_backoff, _check_batch_options,
    _check_ignore, _check_overlap, _check_regexes, _check_pools, _check_labels, _check_routes,
)


# --- building the dataclasses -------------------------------------------------------------------

_Table = Mapping[str, tuple[str, Callable[[Any], Any]]]


def _build(raw: Mapping[str, Any], table: _Table) -> dict[str, Any]:
    return {name: convert(raw[key]) for key, (name, convert) in table.items() if key in raw}


def _pairs(mapping: Mapping[str, Any]) -> tuple[tuple[str, str], ...]:
    return tuple((str(k), str(v)) for k, v in mapping.items())


_TRIGGER: _Table = {
    "bucket": ("bucket", str), "prefix": ("prefix", str), "glob": ("glob", str),
    "suffixes": ("suffixes", tuple),
    "ignore": ("ignore", lambda extra: tuple(dict.fromkeys(DEFAULT_IGNORE + tuple(extra)))),
    "batch": ("batch", BatchMode), "marker": ("marker", str), "manifest": ("manifest", bool),
    "quiet_period": ("quiet_period_s", parse_duration), "min_objects": ("min_objects", int),
    "snapshot_depth": ("snapshot_depth", int), "on_active_run": ("on_active_run", OnActiveRun),
}
_POOL: _Table = {
    "machine_type": ("machine_type", str), "replica_count": ("replica_count", int),
    "accelerator_type": ("accelerator_type", str), "accelerator_count": ("accelerator_count", int),
    "boot_disk_type": ("boot_disk_type", str), "boot_disk_size_gb": ("boot_disk_size_gb", int),
    "image_uri": ("image_uri", str), "command": ("command", tuple), "args": ("args", tuple),
    "env": ("env", _pairs),
}
_JOB: _Table = {
    "worker_pools": ("worker_pools", lambda pools: tuple(WorkerPool(**_build(p, _POOL))
                                                         for p in pools)),
    "regions": ("regions", tuple), "service_account": ("service_account", str),
    "network": ("network", str), "labels": ("labels", _pairs),
    "timeout": ("timeout_s", parse_duration), "flex_max_wait": ("flex_max_wait_s", parse_duration),
    "base_output_uri": ("base_output_uri", str),
}
_RECOVERY: _Table = {
    **{k: (k, int) for k in ("max_preemptions", "max_stockouts", "max_user_errors",
                              "max_infra_errors", "max_timeouts", "max_no_progress_attempts",
                              "escalate_after_preemptions")},
    **{k: (k, tuple) for k in ("retryable_exit_codes", *_PATTERN_LISTS)},
    **{k: (f"{k}_s", parse_duration) for k in ("backoff_base", "backoff_cap", "stockout_wait",
                                                "restart_overhead", "expected_compute",
                                                "decision_interval", "spot_cooldown")},
    "escalation": ("escalation", EscalationKind),
}
_ROUTE: _Table = {"channel": ("channel", str), "events": ("events", tuple),
                  "target": ("target", str)}
_PIPELINE: _Table = {
    "name": ("name", str),
    "trigger": ("trigger", lambda t: Trigger(**_build(t, _TRIGGER))),
    "job": ("job", lambda j: JobTemplate(**_build(j, _JOB))),
    "checkpoint_uri": ("checkpoint_uri", str), "output_uri": ("output_uri", str),
    "recovery": ("recovery", lambda r: RecoveryPolicy(**_build(r, _RECOVERY))),
    "deadline": ("deadline_s", parse_duration), "max_cost": ("max_cost", float),
    "prices": ("prices", lambda m: tuple((str(k), float(v)) for k, v in sorted(m.items()))),
    "routes": ("routes", lambda rs: tuple(Route(**_build(r, _ROUTE)) for r in rs)),
}


# --- loading ------------------------------------------------------------------------------------


def _line_of(lines: Mapping[str, int], path: str) -> int:
    """Line of a field, else of its nearest parent that is in the file."""
    while path:
        if path in lines:
            return lines[path]
        path = re.sub(r"(\.[^.\[]*|\[\d+\])$", "", path) if re.search(r"[.\[]", path) else ""
    return lines.get("", 0)


def check_file(path: str | os.PathLike[str]) -> tuple[Pipeline | None, tuple[Problem, ...]]:
    """The pipeline of one file and every problem in it (the pipeline only when there are none)."""
    file = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        return None, (Problem(file, "", f"cannot read: {exc}"),)
    parsed = _parse_yaml(text)
    found = list(parsed.problems)
    if parsed.doc is not None:
        if not isinstance(parsed.doc, Mapping):
            found.append(("", f"must be a mapping of pipeline fields, not {_kind(parsed.doc)}"))
        else:
            found += _schema_problems(parsed.doc)
            for check in _CHECKS:
                found += check(parsed.doc)
        # A secret wins over any other complaint about the same field: the others may echo it.
        secrets = dict(_check_secrets(parsed.doc))
        found = [(p, m) for p, m in found if p not in secrets] + list(secrets.items())
    unique = dict.fromkeys(found)  # schema keywords can repeat themselves
    ordered = sorted(unique, key=lambda pm: (_line_of(parsed.lines, pm[0]), pm[0]))
    problems = tuple(Problem(file, p, f"{m} (line {line})" if (line := _line_of(parsed.lines, p))
                             else m) for p, m in ordered)
    if problems:
        return None, problems
    return Pipeline(**_build(parsed.doc, _PIPELINE), source=file), ()


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


_Report = Callable[[str, Pipeline | None, Sequence[Problem]], None]


def _check_all(paths: Iterable[str | os.PathLike[str]], report: _Report | None = None,
               ) -> tuple[tuple[Pipeline, ...], list[Problem]]:
    """Every pipeline and every problem of the given files and directories, duplicates included;
    report(file, pipeline or None, problems) hears about each file as it is checked."""
    def tell(file: str, pipeline: Pipeline | None, found: Sequence[Problem]) -> None:
        if report is not None:
            report(file, pipeline, found)

    pipelines: list[Pipeline] = []
    problems: list[Problem] = []
    for given in paths:
        if not Path(given).exists() or (Path(given).is_dir() and not pipeline_files(given)):
            missing = "no such file or directory" if not Path(given).exists() \
                else "no pipeline files (*.yaml, *.yml) here"
            problems.append(Problem(str(given), "", missing))
            tell(str(given), None, problems[-1:])
            continue
        for file in pipeline_files(given):
            pipeline, found = check_file(file)
            tell(str(file), pipeline, found)
            problems += found
            pipelines += [pipeline] if pipeline else []
    duplicates = _duplicates(pipelines)
    if duplicates:
        tell("", None, duplicates)
    return tuple(pipelines), problems + duplicates


def load_pipelines(path_or_dir: str | os.PathLike[str]) -> tuple[Pipeline, ...]:
    """Every pipeline of a file or directory; ConfigError listing every problem in every file."""
    pipelines, problems = _check_all([path_or_dir])
    if problems:
        raise ConfigError(problems)
    return pipelines


_cache_lock = threading.Lock()


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

    def report(file: str, pipeline: Pipeline | None, found: Sequence[Problem]) -> None:
        if pipeline is not None and not found:
            print(f"OK {file} (pipeline {pipeline.name})")
        for problem in found:
            print(problem)

    try:
        _, problems = _check_all(paths, report)
    except ConfigError as exc:  # no schema to validate against
        problems = list(exc.problems)
        report("", None, problems)
    if problems:
        files = len({p.file for p in problems})
        print(f"{_plural(len(problems), 'problem')} in {_plural(files, 'file')}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(validate_main())
