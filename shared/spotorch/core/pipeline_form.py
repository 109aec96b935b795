"""A validated pipeline as plain data and back: the form functions read without pydantic or YAML.

Pipelines are validated once, where they are deployed (deploy/package.py) or activated (the local
stack), with spotorch.spec.loader; what the functions read at their first event is this form of
the dataclasses (their attribute names, JSON types; spotorch.spec.compiled writes and reads the
file). The converter walks the dataclasses' own type hints, so it follows the pipeline format's
one definition (spotorch.core.pipeline) without a second list of fields. It trusts its input
(it was validated when it was written) but refuses a key the dataclasses do not have.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import types
import typing
from collections.abc import Mapping
from typing import Any

from spotorch.core.pipeline import Pipeline

FORM_VERSION = 1


def to_form(pipeline: Pipeline) -> dict[str, Any]:
    """The pipeline as JSON-able data: dataclass fields by attribute name, tuples as lists."""
    form: dict[str, Any] = _plain(dataclasses.asdict(pipeline))
    return form


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, enum.Enum):
        return value.value
    return value


def from_form(data: Mapping[str, Any]) -> Pipeline:
    """The Pipeline of to_form's data (ValueError naming the path of a key it does not know)."""
    result = _convert(Pipeline, data, "pipeline")
    assert isinstance(result, Pipeline)
    return result


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _convert(tp: Any, value: Any, where: str) -> Any:
    if value is None:
        return None
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin is typing.Annotated:
        return _convert(args[0], value, where)
    if origin in (typing.Union, types.UnionType):
        options = [a for a in args if a is not type(None)]
        structured = [a for a in options if dataclasses.is_dataclass(a)
                      or typing.get_origin(a) is tuple]
        return _convert(structured[0] if structured else options[0], value, where) \
            if len(options) == 1 or structured else value
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_convert(args[0], v, f"{where}[{i}]") for i, v in enumerate(value))
        return tuple(_convert(a, v, f"{where}[{i}]") for i, (a, v) in enumerate(zip(args, value,
                                                                                   strict=True)))
    if origin is typing.Literal:
        return value
    if origin in (dict, Mapping, typing.Mapping):
        return {k: _convert(args[1], v, f"{where}.{k}") for k, v in value.items()}
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        hints = _hints(tp)
        names = {f.name for f in dataclasses.fields(tp)}
        unknown = set(value) - names
        if unknown:
            raise ValueError(f"{where}: unknown field(s) {sorted(unknown)} for {tp.__name__}")
        return tp(**{k: _convert(hints[k], v, f"{where}.{k}") for k, v in value.items()})
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return tp(value)
    if tp is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    return value
