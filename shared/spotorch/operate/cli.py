"""The `spotorch` command: read and steer runs, the local web view, the local stack, the demo.

Starts fast: click only at import; Rich, the cloud clients and the delegated modules are imported
by the command that needs them. Exit codes: 0 ok, 1 failed, 2 usage.
"""

from __future__ import annotations

import difflib
import importlib
import json
import os
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

if TYPE_CHECKING:
    from spotorch.operate.backend import Backend

# Subcommands run by another module's main(argv) -> exit code; imported only when they run.
DELEGATES: Mapping[str, tuple[str, str, str]] = {
    "demo": ("spotorch.local.demo", "main", "Run the end-to-end demo on the local stack."),
    "simulate": ("spotorch.sim.simulate", "main", "Replay spot traces through the policies."),
    "validate": ("spotorch.spec.loader", "validate_main", "Check pipeline files; every problem listed."),
    "dead-letters": ("spotorch.operate.deadletters", "main",
                     "List dead-lettered messages with their reason; replay chosen ones."),
    "prices": ("spotorch.operate.prices", "main",
               "The price table costs are stated with; refresh it from the Catalog API."),
    "advise": ("spotorch.operate.advise", "main",
               "The table of hardware candidates from earlier probes; --probe runs them."),
    "deploy": ("spotorch.operate.deploy_check", "main",
               "Check deploy/: every Google call spotorch makes is granted."),
    "init": ("spotorch.operate.init_project", "main",
             "Write a starting project: a pipeline, a trainer, terraform.tfvars."),
}
DEV_DELEGATES: Mapping[str, tuple[str, str, str]] = {
    "up": ("spotorch.local.dev", "up_main", "Start the local stack in the background."),
    "down": ("spotorch.local.dev", "down_main", "Stop the local stack."),
    "vertex": ("spotorch.local.vertex_emulator", "main", "Run the local Vertex AI emulator."),
    "restart": ("spotorch.local.dev", "restart_main", "Restart one piece of the local stack."),
    "reload": ("spotorch.local.dev", "reload_main", "Reload the stack's pipelines now."),
    "alerts": ("spotorch.local.dev", "alerts_main", "Show the alerts the local receivers got."),
}
CONTEXT = {"help_option_names": ["-h", "--help"], "show_default": True, "max_content_width": 100}
CHIEF_REPLICA = "workerpool0-0"
PIPE_WIDTH = 220
PASS_THROUGH = {"ignore_unknown_options": True, "allow_extra_args": True,
                "help_option_names": []}  # the delegate prints its own --help


class OperatorFailure(click.ClickException):
    """An expected failure: one line on stderr, exit code 1, no traceback."""

    exit_code = 1

    def show(self, file: Any = None) -> None:
        click.echo(f"spotorch: {self.message}", err=True)


class OperatorUsageError(OperatorFailure):
    """Bad input the command cannot act on: exit code 2."""

    exit_code = 2


def _failure(message: str, exit_code: int = 1) -> OperatorFailure:
    return OperatorUsageError(message) if exit_code == 2 else OperatorFailure(message)


class SuggestingGroup(click.Group):
    """A group that answers a mistyped command with the commands it might have meant."""

    def resolve_command(self, ctx: click.Context,
                        args: list[str]) -> tuple[str | None, click.Command | None, list[str]]:
        name = args[0] if args else ""
        if name and not name.startswith("-") and self.get_command(ctx, name) is None:
            close = difflib.get_close_matches(name, self.list_commands(ctx), n=3, cutoff=0.5)
            hint = f" Did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
            raise click.UsageError(f"no command {name!r}.{hint}", ctx)
        return super().resolve_command(ctx, args)


class Session:
    """What the root options chose; builds the backend on first use."""

    def __init__(self, options: Mapping[str, Any], backend: Backend | None = None) -> None:
        self.options = options
        self._backend = backend

    def backend(self) -> Backend:
        if self._backend is None:
            from spotorch.operate.backend import backend_for
            from spotorch.operate.target import TargetError, resolve

            try:
                target = resolve(**self.options)
            except TargetError as exc:
                raise OperatorUsageError(str(exc)) from None
            self._backend = _guard(lambda: backend_for(target))
        return self._backend


def _guard(fn: Callable[[], Any]) -> Any:
    """Run fn; expected failures become OperatorFailure (one line, no traceback)."""
    from spotorch.operate.backend import OperatorError
    from spotorch.operate.logsource import LogsUnavailable
    from spotorch.ports.reads import BadQuery

    try:
        return fn()
    except OperatorError as exc:
        raise _failure(str(exc), exc.exit_code) from None
    except BadQuery as exc:
        raise OperatorUsageError(str(exc)) from None
    except LogsUnavailable as exc:
        raise OperatorFailure(str(exc)) from None


def _backend(ctx: click.Context) -> Backend:
    session = ctx.find_object(Session)
    if session is None:  # invoked with a Backend as obj (tests)
        from spotorch.operate.backend import Backend

        found = ctx.find_object(Backend)
        if found is None:
            raise OperatorFailure("no backend")
        return found
    return session.backend()


def _console(err: bool = False) -> Any:
    from rich.console import Console

    # Colours only on a terminal (Rich checks isatty and NO_COLOR). Into a pipe or file, lines
    # are not cut to 80 columns: grep and awk see whole rows.
    stream = sys.stderr if err else sys.stdout
    width = None if stream.isatty() else int(os.environ.get("COLUMNS") or PIPE_WIDTH)
    return Console(stderr=err, highlight=False, soft_wrap=False, width=width)


def _print_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=2))


json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")


@click.group(cls=SuggestingGroup, context_settings=CONTEXT)
@click.version_option(None, "--version", "-V", package_name="spotorch", prog_name="spotorch")
@click.option("--project", envvar="SPOTORCH_PROJECT", show_envvar=True,
              help="Google Cloud project of a deployed spotorch (default: the local stack "
                   "when it is up, else the config file).")
@click.option("--api-url", envvar="SPOTORCH_API_URL", show_envvar=True,
              help="The api function's URL (default: the local stack's, or the project's).")
@click.option("--region", envvar="SPOTORCH_REGION", show_envvar=True,
              help="Region of the api function  [default: us-central1]")
@click.option("--pipelines", envvar="SPOTORCH_PIPELINES", show_envvar=True,
              type=click.Path(file_okay=True, dir_okay=True),
              help="Pipeline file or folder, for prices (default: the local stack's).")
@click.option("--stack-state", type=click.Path(dir_okay=False, path_type=Path),
              default=Path(".spotorch/stack.json"), help="State file of the local stack.")
@click.pass_context
def cli(ctx: click.Context, project: str | None, api_url: str | None, region: str | None,
        pipelines: str | None, stack_state: Path) -> None:
    """Training on Spot VMs that runs itself: see and steer its runs.

    Reads go to Firestore (the local stack's emulator when it is up); actions go through the
    authenticated api function. Times are ISO 8601, UTC.
    """
    if ctx.obj is None:  # tests hand in a Backend as obj
        ctx.obj = Session({"project": project, "api_url": api_url, "region": region,
                           "pipelines": pipelines, "stack_state": stack_state})


def _delegate(table: Mapping[str, tuple[str, str, str]], name: str) -> click.Command:
    module, func, help_ = table[name]

    @click.command(name=name, help=help_ + "  (Options: `--help` of the command itself.)",
                   context_settings=PASS_THROUGH, add_help_option=False)
    @click.pass_context
    def run(ctx: click.Context) -> int:
        main: Callable[[list[str]], int] = getattr(importlib.import_module(module), func)
        try:
            code = int(main(list(ctx.args)) or 0)
        except SystemExit as exc:  # argparse's --help (0) and usage errors (2)
            if isinstance(exc.code, str):
                click.echo(exc.code, err=True)
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        ctx.exit(code)
        return code

    return run


for _name in DELEGATES:
    cli.add_command(_delegate(DELEGATES, _name))


@cli.group(cls=SuggestingGroup, context_settings=CONTEXT)
def dev() -> None:
    """The local stack: emulators, functions and the Vertex AI emulator on this machine."""


for _name in DEV_DELEGATES:
    dev.add_command(_delegate(DEV_DELEGATES, _name))


# ---------------------------------------------------------------- reads

@cli.command()
@click.option("--status", "statuses", multiple=True, metavar="STATUS",
              help="Only these statuses (repeat or comma-separate); also active, ended, failed.")
@click.option("--pipeline", help="Only runs of this pipeline.")
@click.option("--since", metavar="WHEN",
              help="Only runs created since: an ISO 8601 time or a span (30m, 6h, 2d, 1w).")
@click.option("--limit", type=click.IntRange(1, 500), default=20, help="Runs per page.")
@click.option("--page-token", metavar="TOKEN", help="Continue a listing (its next_page_token).")
@json_option
@click.pass_context
def runs(ctx: click.Context, statuses: tuple[str, ...], pipeline: str | None, since: str | None,
         limit: int, page_token: str | None, as_json: bool) -> None:
    """List every run, newest first."""
    from spotorch.app.views import run_row
    from spotorch.ports.reads import RunQuery, parse_since, parse_statuses

    backend = _backend(ctx)
    now = backend.clock()

    def listing() -> Any:
        query = RunQuery(statuses=parse_statuses(statuses), pipeline=pipeline,
                         since=parse_since(since, now) if since else None, limit=limit,
                         page_token=page_token)
        return backend.reader.list(query)

    page = _guard(listing)
    rows = [run_row(r, backend.pipeline(r.pipeline), now) for r in page.runs]
    if as_json:
        _print_json({"runs": rows, "next_page_token": page.next_page_token})
        return
    console = _console()
    if not rows:
        console.print("no runs" + (" match" if statuses or pipeline or since else " yet"))
        return
    from spotorch.operate.render import runs_table

    console.print(runs_table(rows))
    if page.next_page_token:
        console.print(f"more: spotorch runs --page-token {page.next_page_token}", style="dim")


def _view(backend: Backend, run_id: str) -> dict[str, Any]:
    from spotorch.app.views import run_view

    run = _guard(lambda: backend.run(run_id))
    return run_view(run, backend.pipeline(run.pipeline), backend.clock())


@cli.command()
@click.argument("run_id", metavar="RUN")
@json_option
@click.pass_context
def show(ctx: click.Context, run_id: str, as_json: bool) -> None:
    """Everything about one run: attempts, checkpoints, cost and savings, history."""
    view = _view(_backend(ctx), run_id)
    if as_json:
        _print_json(view)
        return
    from spotorch.operate.render import show_run

    console = _console()
    for part in show_run(view):
        console.print(part)


@cli.command(name="status", hidden=True)
@click.argument("run_id", metavar="RUN")
@json_option
@click.pass_context
def status_alias(ctx: click.Context, run_id: str, as_json: bool) -> None:
    """The old name of `show`."""
    ctx.invoke(show, run_id=run_id, as_json=as_json)


@cli.command()
@click.option("--status", "statuses", multiple=True, metavar="STATUS",
              help="Only these sweep statuses (repeat or comma-separate); also active, ended.")
@click.option("--pipeline", help="Only sweeps of this pipeline.")
@click.option("--since", metavar="WHEN",
              help="Only sweeps created since: an ISO 8601 time or a span (30m, 6h, 2d, 1w).")
@click.option("--limit", type=click.IntRange(1, 500), default=20, help="Sweeps per page.")
@click.option("--page-token", metavar="TOKEN", help="Continue a listing (its next_page_token).")
@json_option
@click.pass_context
def sweeps(ctx: click.Context, statuses: tuple[str, ...], pipeline: str | None,
           since: str | None, limit: int, page_token: str | None, as_json: bool) -> None:
    """List hyperparameter sweeps, newest first: trials ended, the best trial and its metric."""
    from spotorch.app.views import sweep_row
    from spotorch.ports.reads import SweepQuery, parse_since, parse_sweep_statuses

    backend = _backend(ctx)

    def listing() -> Any:
        query = SweepQuery(statuses=parse_sweep_statuses(statuses), pipeline=pipeline,
                           since=parse_since(since, backend.clock()) if since else None,
                           limit=limit, page_token=page_token)
        return backend.sweeps.list(query)

    page = _guard(listing)
    rows = [sweep_row(sw, backend.pipeline(sw.pipeline)) for sw in page.sweeps]
    if as_json:
        _print_json({"sweeps": rows, "next_page_token": page.next_page_token})
        return
    console = _console()
    if not rows:
        console.print("no sweeps" + (" match" if statuses or pipeline or since else " yet"))
        return
    from spotorch.operate.render import sweeps_table

    console.print(sweeps_table(rows))
    if page.next_page_token:
        console.print(f"more: spotorch sweeps --page-token {page.next_page_token}", style="dim")


@cli.command()
@click.argument("sweep_id", metavar="SWEEP")
@json_option
@click.pass_context
def sweep(ctx: click.Context, sweep_id: str, as_json: bool) -> None:
    """One sweep: every trial's parameters, status, metric and step, the best, the model."""
    from spotorch.app.views import sweep_view

    backend = _backend(ctx)
    found = _guard(lambda: backend.sweep(sweep_id))
    view = sweep_view(found, backend.pipeline(found.pipeline))
    if as_json:
        _print_json(view)
        return
    from spotorch.operate.render import show_sweep

    console = _console()
    for part in show_sweep(view):
        console.print(part)


@cli.command()
@click.argument("run_id", metavar="RUN")
@click.option("--interval", type=click.FloatRange(0.2, 600), default=2.0,
              help="Seconds between looks at the run.")
@click.option("--timeout", type=click.FloatRange(0), default=0.0,
              help="Give up after this many seconds (0: never).")
@json_option
@click.pass_context
def watch(ctx: click.Context, run_id: str, interval: float, timeout: float, as_json: bool) -> None:
    """Follow a run live until it ends: status changes, attempts, a progress bar of steps.

    Exits 0 when the run succeeded, 1 when it ended otherwise or the timeout passed.
    """
    backend = _backend(ctx)
    deadline = time.monotonic() + timeout if timeout else None
    views = _views(backend, run_id, interval, deadline, first=_view(backend, run_id))
    final = _watch_json(views) if as_json else _watch_live(views)
    if final is None:
        raise OperatorFailure(f"run {run_id} still live after {timeout:.0f}s")
    if final["status"] != "SUCCEEDED":
        raise OperatorFailure(f"run {run_id} ended {final['status']}: {final.get('reason') or ''}")


def _views(backend: Backend, run_id: str, interval: float, deadline: float | None,
           first: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Views of the run every interval until it ends (the last one is its end)."""
    view = first
    while True:
        yield view
        if not view["active"]:
            return
        if deadline is not None and time.monotonic() > deadline:
            return
        time.sleep(interval)
        view = _view(backend, run_id)


def _watch_json(views: Iterator[dict[str, Any]]) -> dict[str, Any] | None:
    from spotorch.operate.render import change_lines

    last: dict[str, Any] | None = None
    for view in views:
        for line in change_lines(last, view):
            click.echo(json.dumps({"at": view["updated_at"], "run_id": view["run_id"],
                                   "change": line, "step": view["progress"]["step"],
                                   "status": view["status"]}))
        last = view
    return last if last is not None and not last["active"] else None


def _watch_live(views: Iterator[dict[str, Any]]) -> dict[str, Any] | None:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from spotorch.operate.render import change_lines, status_style

    console = _console()
    last: dict[str, Any] | None = None
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=console, transient=False) as bar:
        task = bar.add_task("steps", total=None)
        for view in views:
            stamp = (view.get("updated_at") or "")[11:19]
            for line in change_lines(last, view):
                bar.console.print(f"{stamp}  {line}", style=status_style(view["status"]) or None)
            p = view["progress"]
            bar.update(task, completed=p["step"], total=p["total_steps"],
                       description=f"{view['status']:<10} steps")
            last = view
    if last is not None and not last["active"]:
        console.print(last["cost"]["summary"])
        return last
    return None


@cli.command()
@click.argument("run_id", metavar="RUN")
@click.option("--attempt", type=click.IntRange(1), help="Which attempt  [default: the latest]")
@click.option("--follow", "-f", is_flag=True, help="Keep printing new lines until the attempt ends.")
@json_option
@click.pass_context
def logs(ctx: click.Context, run_id: str, attempt: int | None, follow: bool, as_json: bool) -> None:
    """The training job's own output: Cloud Logging in a project, worker files on the local stack."""
    backend = _backend(ctx)
    run = _guard(lambda: backend.run(run_id))
    number = attempt or len(run.attempts)
    lines = _guard(lambda: backend.follow_logs(run, number, follow))

    def emit() -> None:
        for line in lines:
            if as_json:
                click.echo(json.dumps({"replica": line.replica, "at": line.at, "text": line.text}))
                continue
            # The chief replica's lines bare; other replicas' and Vertex's own ("service") named.
            prefix = "" if line.replica == CHIEF_REPLICA else f"[{line.replica}] "
            click.echo(f"{prefix}{line.text}")

    _guard(emit)


# ---------------------------------------------------------------- actions

def _act(ctx: click.Context, action: str, body: Mapping[str, Any], as_json: bool) -> None:
    backend = _backend(ctx)
    reply = _guard(lambda: backend.actions.post(action, body))
    if as_json:
        _print_json(reply)
        return
    if reply.get("skipped"):
        click.echo("skipped: the pipeline skips new runs while one is active")
        return
    from rich.text import Text

    from spotorch.operate.render import status_style

    _console().print(Text(f"{reply.get('run_id')} ") + Text(str(reply.get("status")),
                                                             style=status_style(
                                                                 str(reply.get("status")))))


@cli.command()
@click.argument("pipeline")
@click.argument("data_uri")
@click.option("--request-id", default="", help="The same id gives the same run (safe to repeat).")
@json_option
@click.pass_context
def submit(ctx: click.Context, pipeline: str, data_uri: str, request_id: str, as_json: bool) -> None:
    """Start a run of PIPELINE by hand on DATA_URI (gs://bucket/prefix/)."""
    if not data_uri.startswith("gs://"):
        raise click.BadParameter(f"{data_uri!r} is not a gs:// URI", param_hint="DATA_URI")
    _act(ctx, "submit", {"pipeline": pipeline, "data_uri": data_uri, "request_id": request_id},
         as_json)


@cli.command()
@click.argument("run_id", metavar="RUN")
@click.option("--reason", default="cancelled by an operator", help="Recorded in the run's history.")
@json_option
@click.pass_context
def cancel(ctx: click.Context, run_id: str, reason: str, as_json: bool) -> None:
    """Cancel a run and stop its job."""
    _act(ctx, "cancel", {"run_id": run_id, "reason": reason}, as_json)


@cli.command()
@click.argument("run_id", metavar="RUN")
@click.option("--request-id", default="1", help="Retries with the same id are one retry.")
@json_option
@click.pass_context
def retry(ctx: click.Context, run_id: str, request_id: str, as_json: bool) -> None:
    """Start a new run resuming a failed or cancelled one from its latest checkpoint."""
    _act(ctx, "retry", {"run_id": run_id, "request_id": request_id}, as_json)


# ---------------------------------------------------------------- the web view

@cli.command()
@click.option("--host", default="127.0.0.1", help="Address to listen on (keep it local).")
@click.option("--port", type=click.IntRange(0, 65535), default=8765, help="0: any free port.")
@click.option("--refresh", type=click.IntRange(1, 3600), default=5,
              help="Seconds between refreshes of a live run's page.")
@click.pass_context
def ui(ctx: click.Context, host: str, port: int, refresh: int) -> None:
    """Serve the web view of runs and their timelines on localhost."""
    from spotorch.operate.ui.server import UIServer

    server = _guard(lambda: UIServer(_backend(ctx), host=host, port=port, refresh_s=refresh))
    click.echo(f"spotorch ui on {server.url}  (Ctrl-C stops it)", err=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.close()


def main(argv: list[str] | None = None) -> int:
    """The console script: run the command tree; expected failures print one line."""
    try:
        result = cli.main(args=argv, prog_name="spotorch", standalone_mode=False)
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
    return result if isinstance(result, int) else 0


if __name__ == "__main__":
    sys.exit(main())
