"""docs/architecture.md and docs/contributing.md name only files that exist (issue 36): a path
in them is looked up from the repository's root, from shared/spotorch/ and from trainer/."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BASES = (ROOT, ROOT / "shared" / "spotorch", ROOT / "trainer")
# a path-looking word: folders and a file name with one of these suffixes (globs allowed)
PATH = re.compile(r"(?<![\w./*-])((?:[\w.*-]+/)*[\w*-]+\.(?:py|md|toml|tf|yaml))\b")


def named_paths(text: str) -> set[str]:
    return {m.group(1) for m in PATH.finditer(text)}


FOLDERS = ("shared", "functions", "trainer", "tests", "docs", "deploy", "benchmarks",
           "examples", "schemas")


def _files_by_name() -> set[str]:
    found = {p.name for p in ROOT.iterdir() if p.is_file()}
    for folder in FOLDERS:
        found |= {p.name for p in (ROOT / folder).rglob("*") if "__pycache__" not in p.parts}
    return found


FILES: set[str] = set()


def exists(name: str) -> bool:
    """A path from a base; a bare file name anywhere in the repository; never outside it."""
    if ".." in name.split("/"):
        return False
    if "/" not in name:
        if not FILES:
            FILES.update(_files_by_name())
        return any(Path(f).match(name) for f in FILES)
    return any(list(base.glob(name)) for base in BASES)


@pytest.mark.parametrize("doc", ["docs/architecture.md", "docs/contributing.md"])
def test_every_file_the_map_names_exists(doc: str) -> None:
    names = named_paths((ROOT / doc).read_text())
    assert len(names) > 10  # the pattern finds the map's paths
    assert sorted(n for n in names if not exists(n)) == []


def test_the_finder_sees_a_missing_file() -> None:
    assert named_paths("see `core/nowhere.py` and ../shared/DESIGN.md") == {
        "core/nowhere.py", "../shared/DESIGN.md"}
    assert not exists("core/nowhere.py") and not exists("../shared/DESIGN.md")
    assert not exists("DESIGN.md") and exists("recovery.py")
    assert exists("core/recovery.py") and exists("local/_vertex_*.py")
