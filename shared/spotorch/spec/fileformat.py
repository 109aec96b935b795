"""How pipeline fields are written in a file, for pydantic: the field kinds spotorch.core.pipeline uses.

The dataclasses in spotorch.core.pipeline are the one definition of the pipeline format. Their field
annotations carry the file's names, constraints and wording (pydantic metadata); pydantic reads
files into them (spotorch.spec.loader) and writes schemas/pipeline.schema.json from them. Code that
builds a Pipeline directly is not validated: the dataclasses stay plain frozen dataclasses.

Each kind here validates the file form of a value and converts it to the attribute form (a
duration string to seconds, a mapping to sorted pairs), and says how it looks in the schema.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from pydantic import ConfigDict, GetCoreSchemaHandler, GetJsonSchemaHandler
from pydantic.json_schema import GenerateJsonSchema, JsonSchemaValue
from pydantic_core import CoreSchema, PydanticCustomError, core_schema

JsonSchema = dict[str, Any]

# Key of core-schema metadata holding how to write a default in the file's own form.
_TO_FILE = "spotorch_to_file"


# --- durations ----------------------------------------------------------------------------------

DURATION_PATTERN = r"^([0-9]+(\.[0-9]+)?(s|m|h|d))+$"
_DURATION = re.compile(r"(?:[0-9]+(?:\.[0-9]+)?[smhd])+")
_DURATION_PART = re.compile(r"([0-9]+(?:\.[0-9]+)?)([smhd])")
_UNIT_SECONDS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
DURATION_MESSAGE = ("must be a duration: seconds as a number, or a string like '90s', '30m', '2h', "
                    "'1h30m', '1d'")


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


def _custom(kind: str, message: str) -> PydanticCustomError:
    # Braces in our own wording must not be read as pydantic's {placeholders}.
    return PydanticCustomError(kind, message.replace("{", "{{").replace("}", "}}"))


@dataclass(frozen=True)
class Duration:
    """Seconds in the object; a number of seconds or a string like '1h30m' in the file."""

    def __get_pydantic_core_schema__(self, source: Any, handler: GetCoreSchemaHandler) -> CoreSchema:
        def check(value: Any) -> float:
            try:
                return parse_duration(value)
            except ValueError:
                raise _custom("duration", DURATION_MESSAGE) from None

        return core_schema.no_info_plain_validator_function(
            check, metadata={_TO_FILE: format_duration})

    def __get_pydantic_json_schema__(self, schema: CoreSchema,
                                     handler: GetJsonSchemaHandler) -> JsonSchemaValue:
        return {"anyOf": [{"type": "number", "minimum": 0},
                          {"type": "string", "pattern": DURATION_PATTERN}],
                "errorMessage": DURATION_MESSAGE}


# --- strings of a given form ----------------------------------------------------------------------


@dataclass(frozen=True)
class Matches:
    """A string matching a pattern (searched, as JSON Schema does), with the file's own wording."""

    pattern: str
    message: str

    def __get_pydantic_core_schema__(self, source: Any, handler: GetCoreSchemaHandler) -> CoreSchema:
        regex = re.compile(self.pattern)

        def check(value: str | None) -> str | None:
            if value is not None and not regex.search(value):
                raise _custom("pattern", self.message)
            return value

        return core_schema.no_info_after_validator_function(check, handler(source))

    def __get_pydantic_json_schema__(self, schema: CoreSchema,
                                     handler: GetJsonSchemaHandler) -> JsonSchemaValue:
        out = dict(handler(schema))
        out.update(pattern=self.pattern, errorMessage=self.message)
        return out


@dataclass(frozen=True)
class Unique:
    """A list that names each item once."""

    def __get_pydantic_core_schema__(self, source: Any, handler: GetCoreSchemaHandler) -> CoreSchema:
        def check(items: tuple[Any, ...]) -> tuple[Any, ...]:
            if len(set(items)) != len(items):
                raise _custom("unique", "lists the same item twice")
            return items

        return core_schema.no_info_after_validator_function(check, handler(source))

    def __get_pydantic_json_schema__(self, schema: CoreSchema,
                                     handler: GetJsonSchemaHandler) -> JsonSchemaValue:
        return {**handler(schema), "uniqueItems": True}


@dataclass(frozen=True)
class StringOrNumber:
    """A string, or a number written as its string (an env value); never true/false."""

    def __get_pydantic_core_schema__(self, source: Any, handler: GetCoreSchemaHandler) -> CoreSchema:
        def check(value: Any) -> str:
            if isinstance(value, bool) or not isinstance(value, str | int | float):
                raise _custom("string_or_number", "must be a string or a number")
            return str(value)

        return core_schema.no_info_plain_validator_function(check)

    def __get_pydantic_json_schema__(self, schema: CoreSchema,
                                     handler: GetJsonSchemaHandler) -> JsonSchemaValue:
        return {"type": ["string", "number"]}


# --- mappings kept as pairs, lists added to defaults ------------------------------------------------


@dataclass(frozen=True)
class Pairs:
    """A mapping in the file; a tuple of (key, value) pairs in the object, hashable like the rest.

    key and value are the annotated types of each key and value in the file; sort orders the
    pairs by key (for mappings whose order means nothing, such as prices)."""

    key: Any
    value: Any
    sort: bool = False
    max_entries: int | None = None

    def __get_pydantic_core_schema__(self, source: Any, handler: GetCoreSchemaHandler) -> CoreSchema:
        mapping = core_schema.dict_schema(handler.generate_schema(self.key),
                                          handler.generate_schema(self.value),
                                          max_length=self.max_entries)

        def to_pairs(value: Mapping[Any, Any]) -> tuple[tuple[Any, Any], ...]:
            pairs = tuple((str(k), v) for k, v in value.items())
            return tuple(sorted(pairs)) if self.sort else pairs

        return core_schema.no_info_after_validator_function(
            to_pairs, mapping, metadata={_TO_FILE: dict})

    def __get_pydantic_json_schema__(self, schema: CoreSchema,
                                     handler: GetJsonSchemaHandler) -> JsonSchemaValue:
        out = dict(handler(schema))
        # pydantic writes a key pattern as patternProperties, which lets other keys through
        # unchecked; propertyNames says what the file must do.
        patterns = out.pop("patternProperties", None)
        if patterns:
            (pattern, value), = patterns.items()
            out["propertyNames"] = {**out.get("propertyNames", {}), "pattern": pattern}
            out["additionalProperties"] = value
        return out


@dataclass(frozen=True)
class AddedTo:
    """Items the file adds to built-in ones (the object holds both, built-ins first, once each)."""

    builtin: tuple[str, ...]

    def __get_pydantic_core_schema__(self, source: Any, handler: GetCoreSchemaHandler) -> CoreSchema:
        def add(extra: tuple[str, ...]) -> tuple[str, ...]:
            return tuple(dict.fromkeys(self.builtin + tuple(extra)))

        # The file's default is "nothing added", not the built-ins themselves.
        return core_schema.no_info_after_validator_function(
            add, handler(source), metadata={_TO_FILE: lambda _builtin: []})

    def __get_pydantic_json_schema__(self, schema: CoreSchema,
                                     handler: GetJsonSchemaHandler) -> JsonSchemaValue:
        return dict(handler(schema))


# --- what a dataclass is in the file -----------------------------------------------------------


class FileSection:
    """Base of the pipeline dataclasses: how pydantic reads one from a file.

    The file may not name fields it does not know, nor the code-only fields (FILE_OMITS); it must
    name FILE_REQUIRES, even where the dataclass has a default for code that builds one."""

    FILE_REQUIRES: ClassVar[tuple[str, ...]] = ()
    FILE_OMITS: ClassVar[tuple[str, ...]] = ()
    __pydantic_config__: ClassVar[ConfigDict] = ConfigDict(extra="forbid")

    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any, handler: GetCoreSchemaHandler) -> CoreSchema:
        schema = handler(source)
        if schema.get("type") != "dataclass":
            return schema
        args = schema["schema"]
        fields = [f for f in args["fields"] if f["name"] not in cls.FILE_OMITS]
        for field in fields:
            if field["name"] in cls.FILE_REQUIRES and field["schema"]["type"] == "default":
                field["schema"] = field["schema"]["schema"]
        args["fields"] = fields
        return schema


def file_fields(cls: type) -> tuple[dataclasses.Field[Any], ...]:
    """The dataclass fields a file may set."""
    omits = getattr(cls, "FILE_OMITS", ())
    return tuple(f for f in dataclasses.fields(cls) if f.name not in omits)


class PipelineJsonSchema(GenerateJsonSchema):
    """JSON Schema of the file form: defaults written as the file writes them, no titles."""

    def field_title_should_be_set(self, schema: Any) -> bool:
        return False

    def default_schema(self, schema: core_schema.WithDefaultSchema) -> JsonSchemaValue:
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


@dataclass(frozen=True)
class OneOf:
    """Only some members of an enum may be written in a file (the others are for code)."""

    values: tuple[str, ...]

    def __get_pydantic_core_schema__(self, source: Any, handler: GetCoreSchemaHandler) -> CoreSchema:
        def check(value: Any) -> Any:
            if str(value) not in self.values:
                raise _custom("enum", f"must be one of {', '.join(self.values)}")
            return value

        return core_schema.no_info_after_validator_function(check, handler(source))

    def __get_pydantic_json_schema__(self, schema: CoreSchema,
                                     handler: GetJsonSchemaHandler) -> JsonSchemaValue:
        return {"enum": list(self.values)}
