"""`spotorch runs`, `show`, `watch` and `logs`: reading runs."""

from __future__ import annotations

import json
import shlex
import time
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import click

from spotorch.operate.cli_session import (
    OperatorFailure,
    backend,
    console,
    guard,
    json_option,
    print_json,
    target_options,
)

if TYPE_CHECKING:
    from spotorch.operate.backend import Backend

CHIEF_REPLICA = "workerpool0-0"
DEFAULT_PAGE = 20  # rows per page of a listing when --limit is not given


def more_line(command: str, options: Sequence[tuple[str, Any]], token: str) -> str:
    """The command for the next page: the same filters and page size, and the token."""
    words = [command]
    for name, value in options:
        if value in (None, (), "", False):
            continue
        for one in value if isinstance(value, tuple) else (value,):
            words += [name, str(one)]
    words += ["--page-token", token]
    return "more: spotorch " + " ".join(shlex.quote(w) for w in words)


def print_page(noun: str, rows: list[dict[str, Any]], next_page_token: str | None, *,
               as_json: bool, table: Callable[[list[dict[str, Any]]], Any],
               filters: Sequence[tuple[str, Any]], limit: int) -> None:
    """One page of a listing (`runs`, `sweeps`): JSON, or a table and the command for the next
    page; "no NOUN yet" (or "match" when filtered) when it is empty."""
    if as_json:
        print_json({noun: rows, "next_page_token": next_page_token})
        return
    out = console()
    if not rows:
        filtered = any(value not in (None, (), "") for _, value in filters)
        out.print(f"no {noun}" + (" match" if filtered else " yet"))
        return
    out.print(table(rows))
    if next_page_token:
        options = [*filters, ("--limit", limit if limit != DEFAULT_PAGE else None)]
        out.print(more_line(noun, options, next_page_token), style="dim", soft_wrap=True)


@click.command()
@click.option("--status", "statuses", multiple=True, metavar="STATUS",
              help="Only these statuses (repeat or comma-separate); also active, ended, failed.")
@click.option("--pipeline", help="Only runs of this pipeline.")
@click.option("--since", metavar="WHEN",
              help="Only runs created since: an ISO 8601 time or a span (30m, 6h, 2d, 1w).")
@click.option("--limit", type=click.IntRange(1, 500), default=DEFAULT_PAGE, help="Runs per page.")
@click.option("--page-token", metavar="TOKEN", help="Continue a listing (its next_page_token).")
@json_option
@target_options()
@click.pass_context
def runs(ctx: click.Context, statuses: tuple[str, ...], pipeline: str | None, since: str | None,
         limit: int, page_token: str | None, as_json: bool) -> None:
    """List every run, newest first."""
    from spotorch.app.views import run_row
    from spotorch.ports.reads import RunQuery, parse_since, parse_statuses

    found = backend(ctx)
    now = found.clock()

    def listing() -> Any:
        query = RunQuery(statuses=parse_statuses(statuses), pipeline=pipeline,
                         since=parse_since(since, now) if since else None, limit=limit,
                         page_token=page_token)
        return found.reader.list(query)

    from spotorch.operate.render import runs_table

    page = guard(listing)
    rows = [run_row(r, found.pipeline(r.pipeline), now) for r in page.runs]
    print_page("runs", rows, page.next_page_token, as_json=as_json, table=runs_table,
               filters=[("--status", statuses), ("--pipeline", pipeline), ("--since", since)],
               limit=limit)


def view_of(found: Backend, run_id: str) -> dict[str, Any]:
    """The view of one run as `show` and `watch` print it, with its pipeline's prices."""
    from spotorch.app.views import run_view

    run = guard(lambda: found.run(run_id))
    return run_view(run, found.pipeline(run.pipeline), found.clock())


@click.command()
@click.argument("run_id", metavar="RUN")
@json_option
@target_options()
@click.pass_context
def show(ctx: click.Context, run_id: str, as_json: bool) -> None:
    """Everything about one run: attempts (with the error of a failed one), checkpoints, cost
    and savings, history."""
    view = view_of(backend(ctx), run_id)
    if as_json:
        print_json(view)
        return
    from spotorch.operate.render import show_run

    out = console()
    for part in show_run(view):
        out.print(part)


@click.command(name="status", hidden=True)
@click.argument("run_id", metavar="RUN")
@json_option
@target_options()
@click.pass_context
def status_alias(ctx: click.Context, run_id: str, as_json: bool) -> None:
    """The old name of `show`."""
    ctx.invoke(show, run_id=run_id, as_json=as_json)


@click.command()
@click.argument("run_id", metavar="RUN")
@click.option("--interval", type=click.FloatRange(0.2, 600), default=2.0,
              help="Seconds between looks at the run.")
@click.option("--timeout", type=click.FloatRange(0), default=0.0,
              help="Give up after this many seconds (0: never).")
@json_option
@target_options()
@click.pass_context
def watch(ctx: click.Context, run_id: str, interval: float, timeout: float, as_json: bool) -> None:
    """Follow a run live until it ends: status changes, attempts (with the error of a failed
    one), a progress bar of steps.

    Exits 0 when the run succeeded, 1 when it ended otherwise or the timeout passed.
    """
    found = backend(ctx)
    deadline = time.monotonic() + timeout if timeout else None
    views = _views(found, run_id, interval, deadline, first=view_of(found, run_id))
    final = _watch_json(views) if as_json else _watch_live(views)
    if final is None:
        raise OperatorFailure(f"run {run_id} still live after {timeout:.0f}s")
    if final["status"] != "SUCCEEDED":
        raise OperatorFailure(f"run {run_id} ended {final['status']}: {final.get('reason') or ''}")


def _views(found: Backend, run_id: str, interval: float, deadline: float | None,
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
        view = view_of(found, run_id)


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

    out = console()
    last: dict[str, Any] | None = None
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=out, transient=False) as bar:
        task = bar.add_task("steps", total=None)
        for view in views:
            stamp = (view.get("updated_at") or "")[11:19]
            for line in change_lines(last, view):
                bar.console.print(f"{stamp}  {line}", style=status_style(view["status"]) or None,
                                  markup=False, highlight=False)
            p = view["progress"]
            bar.update(task, completed=p["step"], total=p["total_steps"],
                       description=f"{view['status']:<10} steps")
            last = view
    if last is not None and not last["active"]:
        out.print(last["cost"]["summary"], markup=False)
        return last
    return None


@click.command()
@click.argument("run_id", metavar="RUN")
@click.option("--attempt", type=click.IntRange(1), help="Only this attempt  [default: the latest]")
@click.option("--follow", "-f", is_flag=True,
              help="Keep printing new lines: across the run's attempts until the run ends (with "
                   "--attempt: until that attempt ends).")
@json_option
@target_options()
@click.pass_context
def logs(ctx: click.Context, run_id: str, attempt: int | None, follow: bool, as_json: bool) -> None:
    """The training job's own output: Cloud Logging in a project, worker files on the local stack."""
    found = backend(ctx)
    run = guard(lambda: found.run(run_id))
    if follow and attempt is None:
        lines = guard(lambda: found.follow_run(run))
    else:
        number = attempt or len(run.attempts)
        lines = ((number, line) for line in guard(lambda: found.follow_logs(run, number, follow)))
    shown: set[int] = set()
    several = follow and attempt is None

    def emit() -> None:
        for number, line in lines:
            if as_json:
                click.echo(json.dumps({"attempt": number, "replica": line.replica, "at": line.at,
                                       "stream": line.stream, "text": line.text}))
                continue
            if several and number not in shown:
                if shown:  # the run went on in a new attempt: say so between their lines
                    click.echo(f"--- attempt {number} ---")
                shown.add(number)
            # The chief replica's lines bare; other replicas' and Vertex's own ("service") named.
            prefix = "" if line.replica == CHIEF_REPLICA else f"[{line.replica}] "
            click.echo(f"{prefix}{line.text}")

    guard(emit)
