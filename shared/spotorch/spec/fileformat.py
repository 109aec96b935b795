"""pydantic reads the pipeline format: the core's field markers, taught to validate and describe.

spotorch.core.fields holds plain markers (Field, Duration, Matches, Pairs, ...) that the pipeline
dataclasses carry in their annotations; the core never imports pydantic. Importing this module
gives each marker class the two hooks pydantic looks for (`__get_pydantic_core_schema__`, how a
value in the file is checked and converted; `__get_pydantic_json_schema__`, how it looks in
schemas/pipeline.schema.json). Everything that validates a file (spotorch.spec.loader) imports
this module first; a function that reads an already validated pipeline never does.
"""

from __future__ import annotations

import dataclasses
import re
import typing
from collections.abc import Callable, Mapping
from typing import Any

from pydantic import ConfigDict, GetCoreSchemaHandler, GetJsonSchemaHandler
from pydantic.json_schema import GenerateJsonSchema, JsonSchemaValue
from pydantic_core import CoreSchema, PydanticCustomError, core_schema

from spotorch.core.fields import (
    DURATION_MESSAGE,
    DURATION_PATTERN,
    AddedTo,
    Duration,
    Field,
    FileSection,
    Matches,
    OneOf,
    Pairs,
    StringOrNumber,
    Unique,
    format_duration,
    parse_duration,
)

JsonSchema = dict[str, Any]

# Key of core-schema metadata holding how to write a default in the file's own form.
_TO_FILE = "spotorch_to_file"


def _custom(kind: str, message: str) -> PydanticCustomError:
    # Braces in our own wording must not be read as pydantic's {placeholders}.
    return PydanticCustomError(kind, message.replace("{", "{{").replace("}", "}}"))


# --- Field: bounds on the value's own schema, wording in the JSON Schema ------------------------

# Core schema type -> the bounds it checks natively (pydantic's own errors and schema keywords).
_NATIVE_BOUNDS: Mapping[str, tuple[str, ...]] = {
    "int": ("ge", "le"), "float": ("ge", "le"), "str": ("min_length", "max_length"),
    "tuple": ("min_length", "max_length"), "list": ("min_length", "max_length"),
    "dict": ("min_length", "max_length"),
}
# Schemas that wrap the value's schema: the bounds go inside.
_WRAPPERS = ("nullable", "function-after", "function-before", "default")


def _bound(schema: CoreSchema, bounds: Mapping[str, float | int]) -> None:
    node: Any = schema
    while node.get("type") in _WRAPPERS:
        node = node["schema"]
    allowed = _NATIVE_BOUNDS.get(node.get("type", ""), ())
    unknown = set(bounds) - set(allowed)
    if unknown:  # a marker combination the format does not use: say so, never check nothing
        raise TypeError(f"bounds {sorted(unknown)} do not apply to a {node.get('type')} schema")
    node.update(bounds)


def _field_core(self: Field, source: Any, handler: GetCoreSchemaHandler) -> CoreSchema:
    schema = handler(source)
    bounds = {k: v for k in ("ge", "le", "min_length", "max_length")
              if (v := getattr(self, k)) is not None}
    if bounds:
        _bound(schema, bounds)
    return schema


def _field_json(self: Field, schema: CoreSchema, handler: GetJsonSchemaHandler) -> JsonSchemaValue:
    out = dict(handler(schema))
    if self.description is not None:
        out["description"] = self.description
    return out


# --- durations ----------------------------------------------------------------------------------


def _duration_core(self: Duration, source: Any, handler: GetCoreSchemaHandler) -> CoreSchema:
    def check(value: Any) -> float:
        try:
            return parse_duration(value)
        except ValueError:
            raise _custom("duration", DURATION_MESSAGE) from None

    return core_schema.no_info_plain_validator_function(check, metadata={_TO_FILE: format_duration})


def _duration_json(self: Duration, schema: CoreSchema,
                   handler: GetJsonSchemaHandler) -> JsonSchemaValue:
    return {"anyOf": [{"type": "number", "minimum": 0},
                      {"type": "string", "pattern": DURATION_PATTERN}],
            "errorMessage": DURATION_MESSAGE}


# --- strings of a given form ----------------------------------------------------------------------


def _matches_core(self: Matches, source: Any, handler: GetCoreSchemaHandler) -> CoreSchema:
    regex = re.compile(self.pattern)

    def check(value: str | None) -> str | None:
        if value is not None and not regex.search(value):
            raise _custom("pattern", self.message)
        return value

    return core_schema.no_info_after_validator_function(check, handler(source))


def _matches_json(self: Matches, schema: CoreSchema,
                  handler: GetJsonSchemaHandler) -> JsonSchemaValue:
    out = dict(handler(schema))
    out.update(pattern=self.pattern, errorMessage=self.message)
    return out


def _unique_core(self: Unique, source: Any, handler: GetCoreSchemaHandler) -> CoreSchema:
    def check(items: tuple[Any, ...]) -> tuple[Any, ...]:
        if len(set(items)) != len(items):
            raise _custom("unique", "lists the same item twice")
        return items

    return core_schema.no_info_after_validator_function(check, handler(source))


def _unique_json(self: Unique, schema: CoreSchema,
                 handler: GetJsonSchemaHandler) -> JsonSchemaValue:
    return {**handler(schema), "uniqueItems": True}


def _string_or_number_core(self: StringOrNumber, source: Any,
                           handler: GetCoreSchemaHandler) -> CoreSchema:
    def check(value: Any) -> str:
        if isinstance(value, bool) or not isinstance(value, str | int | float):
            raise _custom("string_or_number", "must be a string or a number")
        return str(value)

    return core_schema.no_info_plain_validator_function(check)


def _string_or_number_json(self: StringOrNumber, schema: CoreSchema,
                           handler: GetJsonSchemaHandler) -> JsonSchemaValue:
    return {"type": ["string", "number"]}


# --- mappings kept as pairs, lists added to defaults ------------------------------------------------


def _pairs_core(self: Pairs, source: Any, handler: GetCoreSchemaHandler) -> CoreSchema:
    mapping = core_schema.dict_schema(handler.generate_schema(self.key),
                                      handler.generate_schema(self.value),
                                      max_length=self.max_entries)

    def to_pairs(value: Mapping[Any, Any]) -> tuple[tuple[Any, Any], ...]:
        pairs = tuple((str(k), v) for k, v in value.items())
        return tuple(sorted(pairs)) if self.sort else pairs

    return core_schema.no_info_after_validator_function(to_pairs, mapping, metadata={_TO_FILE: dict})


def _pairs_json(self: Pairs, schema: CoreSchema, handler: GetJsonSchemaHandler) -> JsonSchemaValue:
    out = dict(handler(schema))
    # pydantic writes a key pattern as patternProperties, which lets other keys through
    # unchecked; propertyNames says what the file must do.
    patterns = out.pop("patternProperties", None)
    if patterns:
        (pattern, value), = patterns.items()
        out["propertyNames"] = {**out.get("propertyNames", {}), "pattern": pattern}
        out["additionalProperties"] = value
    return out


def _added_to_core(self: AddedTo, source: Any, handler: GetCoreSchemaHandler) -> CoreSchema:
    def add(extra: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(dict.fromkeys(self.builtin + tuple(extra)))

    # The file's default is "nothing added", not the built-ins themselves.
    return core_schema.no_info_after_validator_function(
        add, handler(source), metadata={_TO_FILE: lambda _builtin: []})


def _added_to_json(self: AddedTo, schema: CoreSchema,
                   handler: GetJsonSchemaHandler) -> JsonSchemaValue:
    return dict(handler(schema))


def _one_of_core(self: OneOf, source: Any, handler: GetCoreSchemaHandler) -> CoreSchema:
    def check(value: Any) -> Any:
        if str(value) not in self.values:
            raise _custom("enum", f"must be one of {', '.join(self.values)}")
        return value

    return core_schema.no_info_after_validator_function(check, handler(source))


def _one_of_json(self: OneOf, schema: CoreSchema, handler: GetJsonSchemaHandler) -> JsonSchemaValue:
    return {"enum": list(self.values)}


# --- what a dataclass is in the file -----------------------------------------------------------


def _field_markers(cls: type) -> dict[str, Field]:
    """Each dataclass field's Field marker (its file name and wording), from its annotation."""
    hints = typing.get_type_hints(cls, include_extras=True)
    out: dict[str, Field] = {}
    for name, hint in hints.items():
        for meta in getattr(hint, "__metadata__", ()):
            if isinstance(meta, Field):
                out[name] = meta
    return out


def _section_core(cls: type[FileSection], source: Any, handler: GetCoreSchemaHandler) -> CoreSchema:
    """The file may not name unknown or code-only fields, must name FILE_REQUIRES, and names
    each field by its Field's validation_alias where it has one."""
    schema = handler(source)
    if schema.get("type") != "dataclass":
        return schema
    args: Any = schema["schema"]
    markers = _field_markers(cls)
    fields = [f for f in args["fields"] if f["name"] not in cls.FILE_OMITS]
    for field in fields:
        if field["name"] in cls.FILE_REQUIRES and field["schema"]["type"] == "default":
            field["schema"] = field["schema"]["schema"]
        alias = markers[field["name"]].validation_alias if field["name"] in markers else None
        if alias is not None:
            field["validation_alias"] = alias
    args["fields"] = fields
    return schema


class PipelineJsonSchema(GenerateJsonSchema):
    """JSON Schema of the file form: defaults written as the file writes them, no titles."""

    def field_title_should_be_set(self, schema: Any) -> bool:
        """No titles: the descriptions say what a field is."""
        return False

    def default_schema(self, schema: core_schema.WithDefaultSchema) -> JsonSchemaValue:
        """A field's schema with its default written as the file writes it, when it has one."""
        out = dict(self.generate_inner(schema["schema"]))
        if "default" not in schema:
            return out  # a default_factory: a nested section whose fields say their own defaults
        default = schema["default"]
        if default is None or dataclasses.is_dataclass(default):
            return out
        to_file: Callable[[Any], Any] | None = (schema["schema"].get("metadata") or {}).get(_TO_FILE)
        if to_file is not None:
            default = to_file(default)
        out["default"] = self.encode_default(default)
        return out


# The hooks, given to the core's marker classes once, when the format is first read.
_HOOKS: Mapping[type, tuple[Callable[..., CoreSchema], Callable[..., JsonSchemaValue]]] = {
    Field: (_field_core, _field_json),
    Duration: (_duration_core, _duration_json),
    Matches: (_matches_core, _matches_json),
    Unique: (_unique_core, _unique_json),
    StringOrNumber: (_string_or_number_core, _string_or_number_json),
    Pairs: (_pairs_core, _pairs_json),
    AddedTo: (_added_to_core, _added_to_json),
    OneOf: (_one_of_core, _one_of_json),
}
for _marker, (_core, _json) in _HOOKS.items():
    _marker.__get_pydantic_core_schema__ = _core  # type: ignore[attr-defined]
    _marker.__get_pydantic_json_schema__ = _json  # type: ignore[attr-defined]
FileSection.__get_pydantic_core_schema__ = classmethod(_section_core)  # type: ignore[attr-defined]
FileSection.__pydantic_config__ = ConfigDict(extra="forbid")  # type: ignore[attr-defined]

