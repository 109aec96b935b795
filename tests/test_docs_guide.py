"""The user guide (docs/guide.md) and the README's commands exist (issue 41): every `spotorch`
and `make` command in their shell blocks names a command and options that are there."""

from __future__ import annotations

from pathlib import Path

import pytest

from test_docs_deploy import SPOTORCH, problems_of, shell_commands

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("doc", ["docs/guide.md", "README.md"])
def test_every_command_of_the_page_exists(doc: str, capsys: pytest.CaptureFixture[str]) -> None:
    text = (ROOT / doc).read_text()
    ours = [c for c in shell_commands(text) if c.words[0] in SPOTORCH | {"make"}]
    assert len(ours) >= 4, "the page's commands were not found"
    assert problems_of(text, capsys) == []


def test_the_guide_is_short_and_in_task_order() -> None:
    text = (ROOT / "docs" / "guide.md").read_text()
    headings = [line for line in text.splitlines() if line.startswith("## ")]
    assert headings == ["## 1. A first run", "## 2. Your code", "## 3. Your data",
                        "## 4. Hardware and cost", "## 5. Deploy", "## 6. Following runs"]
    assert len(text.split()) < 1500  # a guide, not the reference
    assert "docs/guide.md" in (ROOT / "README.md").read_text()
    assert "spotorch init" in (ROOT / "README.md").read_text()
