"""YAML as pipeline files are read: field paths, line numbers, duplicate keys, bounded size."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import yaml

MAX_NODES = 20_000  # YAML aliases can expand a small file into a huge one; pipelines are small
MAX_DEPTH = 32  # and a recursive alias into an endless one


# --- YAML with field paths, lines and duplicate keys ---------------------------------------------


def join_path(path: str, key: object) -> str:
    """A field path one step deeper: `a.b` for a key, `a[0]` for a list index."""
    return f"{path}[{key}]" if isinstance(key, int) else (f"{path}.{key}" if path else str(key))


@dataclass
class _Parsed:
    doc: Any
    lines: dict[str, int]  # field path -> 1-based line
    problems: list[tuple[str, str]]


class _TooLarge(Exception):
    """The document expands beyond MAX_NODES or MAX_DEPTH; the message says which."""


def parse_yaml(text: str) -> _Parsed:
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
                    parsed.problems.append((join_path(path, key), (
                        f"given twice (lines {seen[key]} and {key_node.start_mark.line + 1}); "
                        "YAML would silently keep the last")))
                seen.setdefault(key, key_node.start_mark.line + 1)
        loader.flatten_mapping(node)  # resolves << merge keys
        out: dict[str, Any] = {}
        for key_node, value_node in node.value:
            key = str(loader.construct_object(key_node, deep=True))
            out[key] = _construct(loader, value_node, join_path(path, key), parsed, budget)
        return out
    if isinstance(node, yaml.SequenceNode):
        return [_construct(loader, item, join_path(path, i), parsed, budget)
                for i, item in enumerate(node.value)]
    return loader.construct_object(node, deep=True)
