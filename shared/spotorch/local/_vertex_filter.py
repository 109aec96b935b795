"""The subset of Vertex's list filter syntax the emulator understands (pure)."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass

_TERM = re.compile(
    r'^(?P<field>labels\.[A-Za-z0-9_-]+|display_name|displayName|state)\s*'
    r'(?P<op>!=|=|:)\s*(?P<value>"(?:[^"\\]|\\.)*"|[^\s"]+)$')


class FilterError(ValueError):
    """A filter the emulator cannot evaluate (Vertex answers INVALID_ARGUMENT)."""


@dataclass(frozen=True)
class Term:
    """One comparison: field (labels.K, display_name or state), operator (= != :), value."""

    field: str
    op: str
    value: str

    def test(self, fields: Callable[[str], str | None]) -> bool:
        actual = fields(self.field)
        if self.op == ":":  # has: labels.k:* means "has the key"; otherwise equality
            return actual is not None and (self.value == "*" or actual == self.value)
        equal = actual == self.value
        return equal if self.op == "=" else not equal


def _unquote(value: str) -> str:
    if value.startswith('"'):
        return re.sub(r"\\(.)", r"\1", value[1:-1])
    return value


def parse_filter(text: str) -> tuple[Term, ...]:
    """Terms of `labels.k="v" AND state="JOB_STATE_RUNNING" AND display_name="x"` (AND only)."""
    text = text.strip()
    if not text:
        return ()
    terms = []
    for part in re.split(r"\s+AND\s+", text):
        found = _TERM.match(part.strip())
        if not found:
            raise FilterError(f"unsupported filter term {part.strip()!r} (the emulator supports "
                              'labels.KEY="V", display_name="V" and state="S", joined by AND)')
        field = "display_name" if found["field"] == "displayName" else found["field"]
        terms.append(Term(field, found["op"], _unquote(found["value"])))
    return tuple(terms)


def matches(terms: tuple[Term, ...], labels: Mapping[str, str], display_name: str,
            state_name: str | Callable[[], str]) -> bool:
    """Whether a job passes every term; a state compares by full (JOB_STATE_X) or short name.

    state_name may be a function: asked only when a term reaches the state (reading a job's
    state is the slow part of filtering thousands of jobs by their labels)."""
    def fields(field: str) -> str | None:
        if field.startswith("labels."):
            return labels.get(field.removeprefix("labels."))
        if field == "display_name":
            return display_name
        return state_name() if callable(state_name) else state_name

    def normal(term: Term) -> Term:
        if term.field == "state" and not term.value.startswith("JOB_STATE_"):
            return Term(term.field, term.op, f"JOB_STATE_{term.value.upper()}")
        return term

    return all(normal(t).test(fields) for t in terms)
