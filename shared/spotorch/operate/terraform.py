"""Reading deploy/*.tf: resources, data sources, locals, variables and what references what.

python-hcl2 parses the files (a deploy-time dependency: `pip install 'spotorch[deploy]'`, in the dev
extras too); it is imported only by load_tf. Used by `spotorch deploy check` and tests/test_deploy.py.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any


class TerraformError(Exception):
    """A Terraform directory cannot be read (missing, or a file python-hcl2 cannot parse)."""


@dataclass(frozen=True)
class Tf:
    """The parts of a Terraform directory the checks look at."""

    resources: dict[str, dict[str, dict[str, Any]]]  # type -> name -> body
    data: dict[str, dict[str, dict[str, Any]]]
    locals: dict[str, Any]
    variables: dict[str, dict[str, Any]]
    text: str  # every .tf file, comments removed

    def resource(self, rtype: str) -> dict[str, dict[str, Any]]:
        """The resources of one type by name, none if deploy/ has none."""
        return self.resources.get(rtype, {})


def _strip_comments(text: str) -> str:
    return "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))


def load_tf(directory: Path, *, explicit_blocks: bool = False) -> Tf:
    """Every *.tf file of a directory, merged; explicit_blocks marks blocks `__is_block__`."""
    try:
        import hcl2
    except ImportError:
        raise TerraformError("reading Terraform needs python-hcl2: pip install 'spotorch[deploy]'"
                             ) from None
    if not directory.is_dir() or not any(directory.glob("*.tf")):
        raise TerraformError(f"{directory} holds no Terraform (*.tf) files")
    options = hcl2.SerializationOptions(strip_string_quotes=True, explicit_blocks=explicit_blocks,
                                        with_comments=False)
    resources: dict[str, dict[str, dict[str, Any]]] = {}
    data: dict[str, dict[str, dict[str, Any]]] = {}
    locals_: dict[str, Any] = {}
    variables: dict[str, dict[str, Any]] = {}
    texts = []
    for path in sorted(directory.glob("*.tf")):
        texts.append(_strip_comments(path.read_text()))
        try:
            with path.open() as f:
                doc = hcl2.load(f, serialization_options=options)
        except Exception as exc:  # python-hcl2 raises lark's errors for a syntax error
            raise TerraformError(f"{path}: {exc}") from exc
        for kind, target in (("resource", resources), ("data", data)):
            for entry in doc.get(kind, []):
                for rtype, named in entry.items():
                    target.setdefault(rtype, {}).update(named)
        for entry in doc.get("locals", []):
            locals_.update(entry)
        for entry in doc.get("variable", []):
            variables.update(entry)
    return Tf(resources, data, locals_, variables, "\n".join(texts))


def block(body: Mapping[str, Any], name: str) -> dict[str, Any]:
    """The first nested block of that name, or {}."""
    found = body.get(name)
    if isinstance(found, list) and found and isinstance(found[0], dict):
        return found[0]
    return {}


def dynamic(body: Mapping[str, Any], name: str) -> dict[str, Any] | None:
    """The body of the `dynamic "name"` block, or None."""
    for entry in body.get("dynamic", []):
        if name in entry:
            return entry[name]  # type: ignore[no-any-return]
    return None


@dataclass(frozen=True)
class Instance:
    """One instance of a resource: a for_each over a literal local map is expanded."""

    name: str
    key: str | None
    each: Any
    body: dict[str, Any]

    def value(self, raw: Any, tf: Tf) -> Any:
        """A literal value, each.key, each.value(.field), local.x or local.x[each.value.y]."""
        if not isinstance(raw, str):
            return raw
        if raw == "${each.key}":
            return self.key
        if raw == "${each.value}":
            return self.each
        match = re.fullmatch(r"\$\{each\.value\.(\w+)\}", raw)
        if match and isinstance(self.each, dict):
            return self.each.get(match.group(1))
        match = re.fullmatch(r"\$\{local\.(\w+)\}", raw)
        if match:
            return tf.locals.get(match.group(1), raw)
        match = re.fullmatch(r"\$\{var\.(\w+)\}", raw)
        if match:
            return tf.variables.get(match.group(1), {}).get("default", raw)
        return raw

    def resolved(self, raw: Any, tf: Tf, depth: int = 3) -> Any:
        """value(), repeated: each.value.x may name a variable, whose default is the value."""
        for _ in range(depth):
            new = self.value(raw, tf)
            if new == raw:
                break
            raw = new
        return raw


def instances(tf: Tf, rtype: str) -> Iterator[Instance]:
    """Each resource of a type; a for_each over a literal local map gives one per entry."""
    for name, body in tf.resource(rtype).items():
        for_each = body.get("for_each")
        match = re.fullmatch(r"\$\{local\.(\w+)\}", for_each) if isinstance(for_each, str) else None
        items = tf.locals.get(match.group(1)) if match else None
        if isinstance(items, dict):
            for key, each in items.items():
                yield Instance(name, key, each, body)
        else:
            yield Instance(name, None, None, body)


_REF = re.compile(r"\b(?:data\.)?[a-z][a-z0-9_]*\.[A-Za-z_]\w*")


def addresses(tf: Tf) -> set[str]:
    """Every resource and data source address."""
    return ({f"{t}.{n}" for t, named in tf.resources.items() for n in named}
            | {f"data.{t}.{n}" for t, named in tf.data.items() for n in named})


def _refs(tf: Tf, expr: Any, known: set[str], seen: set[str]) -> set[str]:
    """Resources and data sources an expression uses, directly or through locals."""
    text = str(expr)
    found = {m.group(0) for m in _REF.finditer(text) if m.group(0) in known}
    for name in set(re.findall(r"\blocal\.(\w+)", text)) - seen:
        seen.add(name)
        found |= _refs(tf, tf.locals.get(name), known, seen)
    return found


def dependency_graph(tf: Tf) -> dict[str, set[str]]:
    """address -> what it references or names in depends_on (what Terraform orders it after)."""
    known = addresses(tf)
    bodies = {**{f"{t}.{n}": b for t, named in tf.resources.items() for n, b in named.items()},
              **{f"data.{t}.{n}": b for t, named in tf.data.items() for n, b in named.items()}}
    return {address: _refs(tf, body, known, set()) - {address}
            for address, body in bodies.items()}


def depends_on(graph: Mapping[str, set[str]], address: str, target: str) -> bool:
    """Whether address depends on target, directly or through others."""
    todo, seen = [address], set()
    while todo:
        current = todo.pop()
        if current == target:
            return current != address
        if current not in seen:
            seen.add(current)
            todo.extend(graph.get(current, ()))
    return False
