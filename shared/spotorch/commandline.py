"""What every `spotorch` command shares: click settings, one-line failures, lazy command groups,
and running a command as `main(argv) -> exit code` (tests, `python -m`, the console script).

Imports click only: `spotorch --help` must start fast (tests/test_cli_process.py).
"""

from __future__ import annotations

import difflib
import importlib
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import click

# --help and -h everywhere; every default shown; help not cut narrower than 100 columns.
CONTEXT: dict[str, Any] = {"help_option_names": ["-h", "--help"], "show_default": True,
                           "max_content_width": 100}


class CommandFailure(click.ClickException):
    """An expected failure: one line `spotorch: ...` on stderr, exit code 1, no traceback."""

    exit_code = 1

    def show(self, file: Any = None) -> None:
        """One line `spotorch: message` on stderr, no usage text."""
        click.echo(f"spotorch: {self.message}", err=True)


class UsageFailure(CommandFailure):
    """Input the command cannot act on: exit code 2."""

    exit_code = 2


def failure(message: str, exit_code: int = 1) -> CommandFailure:
    """The failure for an exit code: 2 is a usage failure, anything else a command failure."""
    return UsageFailure(message) if exit_code == 2 else CommandFailure(message)


class SuggestingGroup(click.Group):
    """A group that answers a mistyped command with the commands it might have meant."""

    def resolve_command(self, ctx: click.Context,
                        args: list[str]) -> tuple[str | None, click.Command | None, list[str]]:
        """Refuse an unknown command, naming the commands it might have meant."""
        name = args[0] if args else ""
        if name and not name.startswith("-") and self.get_command(ctx, name) is None:
            close = difflib.get_close_matches(name, self.list_commands(ctx), n=3, cutoff=0.5)
            hint = f" Did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
            raise click.UsageError(f"no command {name!r}.{hint}", ctx)
        return super().resolve_command(ctx, args)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """Every command with its whole first line of help (click cuts it at 45 characters)."""
        rows = [(name, line) for name in self.list_commands(ctx)
                if (line := self.summary_of(ctx, name)) is not None]
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)

    def summary_of(self, ctx: click.Context, name: str) -> str | None:
        """A command's first line of help, None for a hidden or unknown one."""
        command = self.commands.get(name)
        if command is None or command.hidden:
            return None
        return command.get_short_help_str(limit=300)


# name -> (module, attribute, one-line help): a command imported only when it runs (or its
# own --help is asked for); the group's --help lists it from this line.
LazyTable = Mapping[str, tuple[str, str, str]]


class LazyGroup(SuggestingGroup):
    """A group some of whose commands live in modules that are slow to import."""

    def __init__(self, *args: Any, lazy: LazyTable | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.lazy: dict[str, tuple[str, str, str]] = dict(lazy or {})

    def list_commands(self, ctx: click.Context) -> list[str]:
        """The commands added and the lazy ones, sorted."""
        return sorted({*super().list_commands(ctx), *self.lazy})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        """The command, its module imported only now if it is a lazy one."""
        if cmd_name in self.lazy and cmd_name not in self.commands:
            module, attribute, _ = self.lazy[cmd_name]
            command = getattr(importlib.import_module(module), attribute)
            if not isinstance(command, click.Command):
                raise TypeError(f"{module}.{attribute} is not a click command")
            self.add_command(command, cmd_name)
        return super().get_command(ctx, cmd_name)

    def summary_of(self, ctx: click.Context, name: str) -> str | None:
        """A lazy command's line from its table, without importing it."""
        if name in self.lazy and name not in self.commands:
            return self.lazy[name][2]
        return super().summary_of(ctx, name)


def run(command: click.Command, argv: Sequence[str] | None = None,
        prog_name: str | None = None) -> int:
    """Run a click command as a function: its exit code; an expected failure prints one line."""
    try:
        result = command.main(args=list(sys.argv[1:] if argv is None else argv),
                              prog_name=prog_name or command.name, standalone_mode=False)
        sys.stdout.flush()  # a closed pipe shows here, not in the interpreter's exit
    except click.exceptions.Exit as exc:
        return int(exc.exit_code)
    except click.ClickException as exc:
        exc.show()
        return int(exc.exit_code)
    except click.Abort:
        click.echo("spotorch: aborted", err=True)
        return 1
    except BrokenPipeError:
        # The reader went away (`spotorch runs | head`): stop quietly, flush nothing more, and
        # exit 1 as click itself does when the pipe closes inside a command.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 1
    except KeyboardInterrupt:
        return 130
    except Exception as exc:
        message = expected_failure(exc)
        if message is None:
            raise  # a bug: the traceback is what a bug report needs
        click.echo(f"spotorch: {message}", err=True)
        return 1
    return result if isinstance(result, int) else 0


# Exceptions of the Google client libraries that are the world's answer, not a bug: what they
# mean for the person at the terminal, and what to do (by class name: the libraries are imported
# only by the commands that use them).
_CLOUD_FAILURES: Mapping[str, Callable[[Exception], str]] = {
    "DefaultCredentialsError": lambda e: (
        "no Google credentials found: run `gcloud auth application-default login` (or start "
        "the local stack: eval \"$(spotorch dev up)\")"),
    "RefreshError": lambda e: (
        f"your Google credentials could not be refreshed ({_first_line(e)}): run "
        "`gcloud auth application-default login` again"),
    "PermissionDenied": lambda e: f"permission denied: {_first_line(e)}",
    "Forbidden": lambda e: f"permission denied: {_first_line(e)}",
    "Unauthenticated": lambda e: (
        f"not authenticated ({_first_line(e)}): run `gcloud auth application-default login`"),
    "NotFound": lambda e: f"not found: {_first_line(e)}",
    "ServiceUnavailable": lambda e: (
        f"service unavailable ({_first_line(e)}): is the local stack up, or the network there?"),
    "DeadlineExceeded": lambda e: f"no answer in time: {_first_line(e)}",
    "RetryError": lambda e: f"gave up retrying: {_first_line(e)}",
    "ConfigError": lambda e: str(e),
    "StackError": lambda e: str(e),
}


def _first_line(exc: Exception) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def expected_failure(exc: Exception) -> str | None:
    """One line for an exception that is an expected failure; None for a bug."""
    for cls in type(exc).__mro__:
        describe = _CLOUD_FAILURES.get(cls.__name__)
        if describe is not None and (cls.__module__.startswith(("google.", "spotorch."))):
            return describe(exc)
    return None
