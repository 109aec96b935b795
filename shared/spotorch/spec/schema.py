"""pydantic reads a pipeline document into spotorch.core.pipeline's dataclasses; the JSON Schema
and its messages."""

from __future__ import annotations

import argparse
import difflib
import functools
import json
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from datetime import date, datetime
from pathlib import Path
from typing import Any

from pydantic import TypeAdapter, ValidationError

from spotorch.core.errors import ConfigError, Problem
from spotorch.core.pipeline import Pipeline
from spotorch.spec.fileformat import PipelineJsonSchema
from spotorch.spec.yaml_source import join_path

SCHEMA_FILE = "pipeline.schema.json"
SCHEMA_ENV = "SPOTORCH_PIPELINE_SCHEMA"  # the schema file, when it is not shipped next to spotorch
SCHEMA_HEADER = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "$id": "https://spotorch.dev/schemas/pipeline.schema.json",
    "title": "spotorch pipeline",
    "description": "One pipeline: which objects start runs, the Vertex AI job each run launches, "
                   "how it recovers and whom it tells. See docs/pipelines.md. Durations are "
                   "seconds (a number) or strings like '90s', '30m', '2h', '1h30m', '1d'. "
                   "Generated from spotorch/core/pipeline.py by `python -m spotorch.spec.loader schema`.",
}


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


def value_kind(value: Any) -> str:
    """How a message names a YAML value's type ("a string", "a list")."""
    return next((name for t, name in _KINDS if isinstance(value, t)), type(value).__name__)


def _show(value: Any) -> str:
    if isinstance(value, dict | list):
        return value_kind(value)
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def plural(n: int, word: str) -> str:
    """A count with its noun, plural unless one ("1 file", "2 files")."""
    return f"{n} {word}{'' if n == 1 else 's'}"


# pydantic error type -> what the field wanted, for "must be X, not Y".
_WANTED = {"string_type": "a string", "int_type": "an integer", "int_from_float": "an integer",
           "int_parsing": "an integer", "float_type": "a number", "float_parsing": "a number",
           "bool_type": "true or false", "bool_parsing": "true or false", "tuple_type": "a list",
           "list_type": "a list", "dict_type": "a mapping", "dataclass_type": "a mapping",
           "dataclass_exact_type": "a mapping", "string_or_number": "a string or a number"}


def _type_message(wanted: str, value: Any) -> str:
    quote = "string" in wanted and isinstance(value, int | float | bool | date)
    return f"must be {wanted}, not {value_kind(value)}{'; quote it' if quote else ''}"


def _choices(error: Any, schema: Mapping[str, Any]) -> str:
    if "enum" in schema:
        return ", ".join(map(str, schema["enum"]))
    return str(error.get("ctx", {}).get("expected", "")).replace("'", "").replace(" or ", ", ")


def _items_of(ctx: Mapping[str, Any], key: str) -> str:
    entries = str(ctx.get("field_type", "")).lower() == "dictionary"
    return plural(int(ctx[key]), "entry" if entries else "item")


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
        out = join_path(out, part)
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
        return {k: _json_ready(v, join_path(path, k), originals) for k, v in node.items()}
    if isinstance(node, list):
        return [_json_ready(v, join_path(path, i), originals) for i, v in enumerate(node)]
    if node is None or isinstance(node, str | int | float | bool):
        return node
    originals[path] = node
    return str(node)


def read_document(doc: Mapping[str, Any]) -> tuple[Pipeline | None, list[tuple[str, str]]]:
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
            problems.append((path, f"must be a string, not {value_kind(value)}; quote it"))
    return (pipeline if not problems else None), problems


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
