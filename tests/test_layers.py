"""The layers hold by construction (issue 36): every core/ and app/ module is named in its inner
import-linter contract (an unnamed module is unconstrained), and no import cycle joins
spotorch's modules, function-level imports included (import-linter sees those too, but only
between modules its contracts name)."""

from __future__ import annotations

import ast
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "shared" / "spotorch"


def _modules(folder: Path) -> set[str]:
    return {p.stem for p in folder.glob("*.py") if p.stem != "__init__"} | \
        {p.name for p in folder.iterdir() if (p / "__init__.py").exists()}


def _contract_layers(container: str) -> set[str]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    for contract in config["tool"]["importlinter"]["contracts"]:
        if contract.get("containers") == [container]:
            return {name.strip() for layer in contract["layers"] for name in layer.split("|")}
    raise AssertionError(f"no inner contract for {container}")


@pytest.mark.parametrize("folder", ["core", "app"])
def test_every_module_is_named_in_its_inner_contract(folder: str) -> None:
    named = _contract_layers(f"spotorch.{folder}")
    missing = sorted(_modules(PACKAGE / folder) - named)
    assert not missing, (f"spotorch.{folder} modules in no layer of its import-linter contract "
                         f"(pyproject.toml): {missing}")
    assert not named - _modules(PACKAGE / folder), "the contract names modules that do not exist"


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, known: set[str], module: str | None = None) -> Iterator[str]:
    """spotorch modules a file imports anywhere in it (module level, functions, TYPE_CHECKING
    excluded: a type-only import is no cycle at run time)."""
    tree = ast.parse(path.read_text(), str(path))
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skip.update(id(n) for child in node.body for n in ast.walk(child))
    module = module or _module_name(path)
    package = module.rsplit(".", 1)[0] if path.name != "__init__.py" else module
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[:len(package.split(".")) - node.level + 1]
                                + ([base] if base else []))
            names = [f"{base}.{a.name}" for a in node.names] + [base]
        else:
            continue
        for name in names:
            while name and name not in known:
                name = name.rpartition(".")[0]
            if name and name.startswith("spotorch"):
                yield name


def import_graph() -> dict[str, set[str]]:
    files = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    known = set(files)
    return {m: {d for d in _imports(p, known) if d != m and d != "spotorch"}
            for m, p in files.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_cycle_among_spotorch_modules() -> None:
    graph = import_graph()
    assert len(graph) > 150 and graph["spotorch.app.tick"]  # the walk found the package
    assert cycles(graph) == []


def test_the_cycle_finder_sees_function_level_imports(tmp_path: Path) -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    source = tmp_path / "m.py"
    source.write_text("def f():\n    from spotorch.app import unit_of_work\n")
    known = {"spotorch.app.unit_of_work", "spotorch.app"}
    assert list(_imports(source, known, "spotorch.app.m")) == [
        "spotorch.app.unit_of_work", "spotorch.app"]
