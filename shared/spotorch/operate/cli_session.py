"""What the operator commands share: which spotorch they talk to (the target options, accepted
before or after the command), the backend built on first use, one-line failures, output."""

from __future__ import annotations

import io
import json
import os
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click

from spotorch.commandline import CommandFailure, UsageFailure, failure

if TYPE_CHECKING:
    from spotorch.operate.backend import Backend
    from spotorch.operate.target import Target

F = TypeVar("F", bound=Callable[..., Any])
PIPE_WIDTH = 220
TARGET_KEY = "spotorch.target"  # ctx.meta (shared by every context of one invocation)

OperatorFailure = CommandFailure  # the names the commands use
OperatorUsageError = UsageFailure


# (option, its keyword in operate.target.resolve, click settings). The same names on the root
# and after every command that reads or steers runs: `spotorch runs --state S` works as
# `spotorch --state S runs` does.
TARGET_OPTIONS: tuple[tuple[str, str, Mapping[str, Any]], ...] = (
    ("--state", "stack_state", {
        "envvar": "SPOTORCH_STATE", "default": ".spotorch/stack.json",
        "type": click.Path(dir_okay=False, path_type=Path),
        "help": "State file of the local stack (what `spotorch dev up --state` wrote; "
                "`dev up` exports SPOTORCH_STATE)."}),
    ("--project", "project", {
        "envvar": "SPOTORCH_PROJECT",
        "help": "Google Cloud project of a deployed spotorch (default: the local stack when "
                "it is up, else the config file)."}),
    ("--api-url", "api_url", {
        "envvar": "SPOTORCH_API_URL",
        "help": "The api function's URL (default: the local stack's, or the project's)."}),
    ("--region", "region", {
        "envvar": "SPOTORCH_REGION", "help": "Region of the api function  [default: us-central1]"}),
    ("--pipelines", "pipelines", {
        "envvar": "SPOTORCH_PIPELINES", "type": click.Path(file_okay=True, dir_okay=True),
        "help": "Pipeline file or folder, for prices and snapshot rules (default: the local "
                "stack's)."}),
)


def _remember(keyword: str, root: bool) -> Callable[[click.Context, click.Parameter, Any], None]:
    def callback(ctx: click.Context, param: click.Parameter, value: Any) -> None:
        chosen: dict[str, Any] = ctx.meta.setdefault(TARGET_KEY, {})
        given = ctx.get_parameter_source(param.name or "") is click.core.ParameterSource.COMMANDLINE
        # The root takes the environment and the defaults; a command's own copy of an option
        # only overrides what was typed after the command.
        if root or given:
            chosen[keyword] = value
    return callback


def target_options(root: bool = False) -> Callable[[F], F]:
    """Add the target options to a command (or, with root, to the group)."""
    def decorate(fn: F) -> F:
        for name, keyword, settings in reversed(TARGET_OPTIONS):
            fn = click.option(name, keyword, expose_value=False, show_envvar=True,
                              callback=_remember(keyword, root), **settings)(fn)
        return fn
    return decorate


class Session:
    """What the target options chose; builds the backend on first use."""

    def __init__(self, options: Mapping[str, Any], backend: Backend | None = None) -> None:
        self.options = options
        self._backend = backend

    def target(self) -> Target:
        """The spotorch this session talks to, from the options, environment and config file."""
        from spotorch.operate.target import TargetError, resolve

        try:
            return resolve(**self.options)
        except TargetError as exc:
            raise OperatorUsageError(str(exc)) from None

    def backend(self) -> Backend:
        """The backend on the target, built on first use and kept for the session."""
        if self._backend is None:
            from spotorch.operate.backend import backend_for

            target = self.target()
            self._backend = guard(lambda: backend_for(target))
        return self._backend


def session(ctx: click.Context) -> Session:
    """The invocation's session (made on first use from the target options seen so far)."""
    found = ctx.find_object(Session)
    if found is not None:
        return found
    return Session(ctx.meta.setdefault(TARGET_KEY, {}))


def guard(fn: Callable[[], Any]) -> Any:
    """Run fn; expected failures become one line and an exit code, never a traceback."""
    from spotorch.operate.backend import OperatorError
    from spotorch.operate.logsource import LogsUnavailable
    from spotorch.ports.reads import BadQuery

    try:
        return fn()
    except OperatorError as exc:
        raise failure(str(exc), exc.exit_code) from None
    except BadQuery as exc:
        raise OperatorUsageError(str(exc)) from None
    except LogsUnavailable as exc:
        raise OperatorFailure(str(exc)) from None


def backend(ctx: click.Context) -> Backend:
    """The backend: a test's (handed in as obj), else the session's."""
    from spotorch.operate.backend import Backend

    found = ctx.find_object(Backend)
    if found is not None:
        return found
    return session(ctx).backend()


def console(err: bool = False) -> Any:
    """A Rich console: colours only on a terminal, whole lines into a pipe."""
    from rich.console import Console

    # Colours only on a terminal (Rich checks isatty and NO_COLOR). Into a pipe or file, lines
    # are not cut to 80 columns: grep and awk see whole rows.
    stream = sys.stderr if err else sys.stdout
    if stream.isatty():
        return Console(stderr=err, highlight=False, soft_wrap=False)
    # Tables pad their cells to the column's width: into a pipe, the lines lose that padding.
    return Console(file=Unpadded(stream), highlight=False, soft_wrap=False,  # type: ignore[arg-type]
                   width=int(os.environ.get("COLUMNS") or PIPE_WIDTH))


class Unpadded(io.TextIOBase):
    """A text stream that writes each line without its trailing spaces."""

    def __init__(self, stream: Any) -> None:
        self.stream = stream
        self._line = ""

    def write(self, text: str) -> int:
        """Write whole lines unpadded; keep a partial one until its newline."""
        *lines, self._line = (self._line + text).split("\n")
        for line in lines:
            self.stream.write(line.rstrip(" ") + "\n")
        return len(text)

    def flush(self) -> None:
        """Flush the stream (a partial line waits for its newline: Rich ends every print)."""
        self.stream.flush()

    def isatty(self) -> bool:
        """Never a terminal."""
        return False


def print_json(data: Any) -> None:
    """Print data as indented JSON (for --json)."""
    click.echo(json.dumps(data, indent=2, default=str))


json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
