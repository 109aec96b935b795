"""docs/deploy.md's commands exist: every `spotorch ...`, `make ...` and `deploy/deploy.sh ...` in
its shell blocks (and inline code) names a command, target or mode that is there, with options
it takes; every SPOTORCH_* variable it exports is one spotorch reads. gcloud and terraform
commands are Google's and HashiCorp's: not checked here."""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from spotorch import settings
from spotorch.operate import cli

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "deploy.md"
SPOTORCH = {"spotorch", ".venv/bin/spotorch"}


@dataclass(frozen=True)
class Command:
    """One command of the page: where, and its words (environment assignments taken off)."""

    line: int
    words: tuple[str, ...]
    env: tuple[str, ...]  # NAME of each NAME=value before it

    @property
    def where(self) -> str:
        return f"docs/deploy.md:{self.line}: {' '.join(self.words)}"


def _segments(text: str) -> Iterator[str]:
    """A shell line cut at && ; and | (outside quotes and $(...))."""
    depth, quote, start = 0, "", 0
    i = 0
    while i < len(text):
        c = text[i]
        if quote:
            quote = "" if c == quote else quote
        elif c in "'\"":
            quote = c
        elif text.startswith("$(", i):
            depth += 1
            i += 1
        elif c == ")" and depth:
            depth -= 1
        elif not depth and (text.startswith("&&", i) or c in ";|"):
            yield text[start:i]
            start = i + (2 if text.startswith("&&", i) else 1)
            i = start
            continue
        i += 1
    yield text[start:]


def _command(line: int, text: str) -> Command | None:
    text = re.sub(r"\$\([^()]*\)", "X", text)  # a command substitution stands for one word
    try:
        words = shlex.split(text, comments=True)
    except ValueError:
        return None
    env = []
    while words and re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", words[0]):
        env.append(words.pop(0).split("=", 1)[0])
    return Command(line, tuple(words), tuple(env)) if words else None


def shell_commands(text: str) -> Iterator[Command]:
    """The commands of the page's ```sh blocks, continuation lines joined."""
    in_block, pending, first = False, "", 0
    for number, raw in enumerate(text.splitlines(), 1):
        if raw.startswith("```"):
            in_block = raw.strip() in ("```sh", "```bash", "```shell") and not in_block
            continue
        if not in_block:
            continue
        if not pending:
            first = number
        if raw.rstrip().endswith("\\"):
            pending += raw.rstrip()[:-1] + " "
            continue
        for segment in _segments(pending + raw):
            command = _command(first, segment)
            if command is not None:
                yield command
        pending = ""


def inline_commands(text: str) -> Iterator[Command]:
    """`spotorch ...` and `make ...` in the prose; [optional] parts read as given."""
    in_block = False
    for number, raw in enumerate(text.splitlines(), 1):
        if raw.startswith("```"):
            in_block = not in_block
            continue
        for span in [] if in_block else re.findall(r"`([^`]+)`", raw):
            if re.match(r"(\.venv/bin/)?spotorch [a-z]|make [a-z]", span) and "..." not in span:
                command = _command(number, span.replace("[", " ").replace("]", " "))
                if command is not None:
                    yield command


def _help(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code = cli.main([*argv, "--help"])
    captured = capsys.readouterr()
    return code, captured.out + captured.err


def check_spotorch(command: Command, capsys: pytest.CaptureFixture[str]) -> list[str]:
    argv = list(command.words[1:])
    root_options = []
    while argv and argv[0].startswith("--"):  # options of `spotorch` itself, before the command
        option = argv.pop(0)
        root_options.append(option.split("=", 1)[0])
        if "=" not in option and argv:
            argv.pop(0)
    problems = []
    code, text = _help(argv, capsys)
    if code != 0:
        return [f"{command.where}: no such command or option ({text.strip()[:200]})"]
    options = [w.split("=", 1)[0] for w in argv if w.startswith("--")]
    problems += [f"{command.where}: {o} is not an option of it" for o in options if o not in text]
    root_code, root_text = _help([], capsys)
    assert root_code == 0
    problems += [f"{command.where}: {o} is not an option of spotorch" for o in root_options
                 if o not in root_text]
    return problems


def _make_targets() -> set[str]:
    return set(re.findall(r"^([a-z][\w-]*):", (ROOT / "Makefile").read_text(), re.M))


def check_make(command: Command) -> list[str]:
    makefile = (ROOT / "Makefile").read_text()
    problems = []
    for word in command.words[1:]:
        if "=" in word:
            name = word.split("=", 1)[0]
            if f"$({name})" not in makefile:
                problems.append(f"{command.where}: the Makefile does not read {name}")
        elif not word.startswith("-") and word not in _make_targets():
            problems.append(f"{command.where}: no make target {word!r}")
    return problems


def check_deploy_script(command: Command) -> list[str]:
    script = (ROOT / "deploy" / "deploy.sh").read_text()
    modes = set(re.findall(r"^\s*([a-z |]+)\)", script, re.M))
    known = {m.strip() for group in modes for m in group.split("|")}
    settings_block = script[:script.index("set -euo pipefail")]
    problems = [f"{command.where}: deploy.sh has no mode {w!r}" for w in command.words[1:2]
                if w not in known]
    problems += [f"{command.where}: deploy.sh does not read {name}" for name in command.env
                 if not re.search(rf"#\s+{name}\b", settings_block)]
    return problems


def check_exports(text: str) -> list[str]:
    """Every SPOTORCH_* variable the page exports is read by the CLI or the functions."""
    read = {v for k, v in vars(settings).items() if k.startswith("ENV_") and isinstance(v, str)}
    read |= {str(p.envvar) for p in cli.cli.params if isinstance(p.envvar, str)}
    names = re.findall(r"\b(SPOTORCH_[A-Z_]+)=", "\n".join(
        line for line in text.splitlines() if line.startswith("export ")))
    return [f"docs/deploy.md exports {n}, which nothing reads" for n in names if n not in read]


def problems_of(text: str, capsys: pytest.CaptureFixture[str]) -> list[str]:
    found = []
    for command in [*shell_commands(text), *inline_commands(text)]:
        head = command.words[0]
        if head in SPOTORCH:
            found += check_spotorch(command, capsys)
        elif head == "make":
            found += check_make(command)
        elif head == "deploy/deploy.sh":
            found += check_deploy_script(command)
    return found + check_exports(text)


def test_every_command_in_deploy_md_exists(capsys: pytest.CaptureFixture[str]) -> None:
    text = DOC.read_text()
    commands = [*shell_commands(text), *inline_commands(text)]
    ours = [c for c in commands if c.words[0] in SPOTORCH | {"make", "deploy/deploy.sh"}]
    assert len(ours) >= 20, "the page's commands were not found: is the reader still right?"
    assert {"init", "deploy", "runs", "dead-letters", "validate"} <= \
        {c.words[1] for c in ours if c.words[0] in SPOTORCH}
    assert problems_of(text, capsys) == []


@pytest.mark.parametrize(("doc", "expect"), [
    ('```sh\nspotorch runs --url "$API_URL" --token "$(gcloud auth print-identity-token)"\n```\n',
     "no such command or option"),
    ("```sh\n.venv/bin/spotorch rnus\n```\n", "no such command or option"),
    ("```sh\nspotorch dead-letters --replay-all\n```\n", "No such option '--replay-all'"),
    ("```sh\nspotorch --projcet p runs\n```\n", "--projcet is not an option of spotorch"),
    ("```sh\nmake deploy PIPELINE=x\n```\n", "the Makefile does not read PIPELINE"),
    ("```sh\nmake deplyo\n```\n", "no make target 'deplyo'"),
    ("```sh\nPIPELNES=x deploy/deploy.sh plan\n```\n", "deploy.sh does not read PIPELNES"),
    ("```sh\ndeploy/deploy.sh validate\n```\n", "deploy.sh has no mode 'validate'"),
    ("Run `spotorch deploy check --strict` first.\n", "No such option '--strict'"),
    ("```sh\nexport SPOTORCH_API=x\n```\n", "exports SPOTORCH_API, which nothing reads"),
])
def test_a_command_that_does_not_exist_is_found(doc: str, expect: str,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    found = problems_of(doc, capsys)
    assert any(expect in p for p in found), found


def test_the_reader_joins_lines_and_splits_pipelines() -> None:
    doc = ("```sh\nA=1 B=2 make deploy \\\n  PIPELINES=x  # comment\n"
           "gcloud x | spotorch runs && make lock\n```\n")
    commands = list(shell_commands(doc))
    assert [(c.words, c.env) for c in commands] == [
        (("make", "deploy", "PIPELINES=x"), ("A", "B")), (("gcloud", "x"), ()),
        (("spotorch", "runs"), ()), (("make", "lock"), ())]
