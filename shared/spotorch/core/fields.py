"""How pipeline fields are written in a file: the markers spotorch.core.pipeline's annotations carry.

The dataclasses in spotorch.core.pipeline are the one definition of the pipeline format. Their
field annotations carry the file's names, constraints and wording as the plain markers below;
spotorch.spec.fileformat teaches pydantic to read them (validation and the JSON Schema), so the
core never imports pydantic and a function reading an already validated pipeline needs none.
Code that builds a Pipeline directly is not validated: the dataclasses stay plain frozen dataclasses.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import Any, ClassVar

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


# --- the markers --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Field:
    """A field's name in the file (validation_alias), its wording and its bounds."""

    description: str | None = None
    validation_alias: str | None = None
    ge: float | None = None  # numbers: at least
    le: float | None = None  # numbers: at most
    min_length: int | None = None  # lists and strings
    max_length: int | None = None


@dataclass(frozen=True)
class Duration:
    """Seconds in the object; a number of seconds or a string like '1h30m' in the file."""


@dataclass(frozen=True)
class Matches:
    """A string matching a pattern (searched, as JSON Schema does), with the file's own wording."""

    pattern: str
    message: str


@dataclass(frozen=True)
class Unique:
    """A list that names each item once."""


@dataclass(frozen=True)
class StringOrNumber:
    """A string, or a number written as its string (an env value); never true/false."""


@dataclass(frozen=True)
class Pairs:
    """A mapping in the file; a tuple of (key, value) pairs in the object, hashable like the rest.

    key and value are the annotated types of each key and value in the file; sort orders the
    pairs by key (for mappings whose order means nothing, such as prices)."""

    key: Any
    value: Any
    sort: bool = False
    max_entries: int | None = None


@dataclass(frozen=True)
class AddedTo:
    """Items the file adds to built-in ones (the object holds both, built-ins first, once each)."""

    builtin: tuple[str, ...]


@dataclass(frozen=True)
class OneOf:
    """Only some members of an enum may be written in a file (the others are for code)."""

    values: tuple[str, ...]


class FileSection:
    """Base of the pipeline dataclasses: what a file may and must say of one.

    The file may not name fields it does not know, nor the code-only fields (FILE_OMITS); it must
    name FILE_REQUIRES, even where the dataclass has a default for code that builds one."""

    FILE_REQUIRES: ClassVar[tuple[str, ...]] = ()
    FILE_OMITS: ClassVar[tuple[str, ...]] = ()


def file_fields(cls: type) -> tuple[dataclasses.Field[Any], ...]:
    """The dataclass fields a file may set."""
    omits = getattr(cls, "FILE_OMITS", ())
    return tuple(f for f in dataclasses.fields(cls) if f.name not in omits)
