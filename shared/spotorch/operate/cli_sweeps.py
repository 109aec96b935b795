"""`spotorch sweeps` and `spotorch sweep show|submit|cancel`: hyperparameter sweeps."""

from __future__ import annotations

from typing import Any

import click

from spotorch.commandline import CONTEXT, SuggestingGroup
from spotorch.operate.cli_actions import act, gs_uri
from spotorch.operate.cli_runs import DEFAULT_PAGE, print_page
from spotorch.operate.cli_session import backend, console, guard, json_option, print_json, target_options


@click.command()
@click.option("--status", "statuses", multiple=True, metavar="STATUS",
              help="Only these sweep statuses (repeat or comma-separate); also active, ended.")
@click.option("--pipeline", help="Only sweeps of this pipeline.")
@click.option("--since", metavar="WHEN",
              help="Only sweeps created since: an ISO 8601 time or a span (30m, 6h, 2d, 1w).")
@click.option("--limit", type=click.IntRange(1, 500), default=DEFAULT_PAGE, help="Sweeps per page.")
@click.option("--page-token", metavar="TOKEN", help="Continue a listing (its next_page_token).")
@json_option
@target_options()
@click.pass_context
def sweeps(ctx: click.Context, statuses: tuple[str, ...], pipeline: str | None,
           since: str | None, limit: int, page_token: str | None, as_json: bool) -> None:
    """List hyperparameter sweeps, newest first: trials ended, the best trial and its metric."""
    from spotorch.app.views import sweep_row
    from spotorch.ports.reads import SweepQuery, parse_since, parse_sweep_statuses

    found = backend(ctx)

    def listing() -> Any:
        query = SweepQuery(statuses=parse_sweep_statuses(statuses), pipeline=pipeline,
                           since=parse_since(since, found.clock()) if since else None,
                           limit=limit, page_token=page_token)
        return found.sweeps.list(query)

    from spotorch.operate.render import sweeps_table

    page = guard(listing)
    rows = [sweep_row(sw, found.pipeline(sw.pipeline)) for sw in page.sweeps]
    print_page("sweeps", rows, page.next_page_token, as_json=as_json, table=sweeps_table,
               filters=[("--status", statuses), ("--pipeline", pipeline), ("--since", since)],
               limit=limit)


class SweepGroup(SuggestingGroup):
    """`spotorch sweep SWEEP` (the older form) means `spotorch sweep show SWEEP`."""

    def resolve_command(self, ctx: click.Context,
                        args: list[str]) -> tuple[str | None, click.Command | None, list[str]]:
        """Read `sweep SWEEP` as `sweep show SWEEP` when the first argument is not a subcommand."""
        if args and not args[0].startswith("-") and args[0] not in self.commands:
            args = ["show", *args]
        return super().resolve_command(ctx, args)


@click.group(cls=SweepGroup, context_settings=CONTEXT)
def sweep() -> None:
    """One sweep: show it, submit one, cancel one (`spotorch sweep SWEEP` shows it)."""


@sweep.command(name="show")
@click.argument("sweep_id", metavar="SWEEP")
@json_option
@target_options()
@click.pass_context
def sweep_show(ctx: click.Context, sweep_id: str, as_json: bool) -> None:
    """Every trial's parameters, status, metric and step, the stopping decisions, the best, the
    registered model."""
    from spotorch.app.views import sweep_view

    found = backend(ctx)
    got = guard(lambda: found.sweep(sweep_id))
    view = sweep_view(got, found.pipeline(got.pipeline))
    if as_json:
        print_json(view)
        return
    from spotorch.operate.render import show_sweep

    out = console()
    for part in show_sweep(view):
        out.print(part)


@sweep.command(name="submit")
@click.argument("pipeline")
@click.argument("data_uri")
@click.option("--request-id", default="", help="The same id gives the same sweep (safe to repeat).")
@json_option
@target_options()
@click.pass_context
def sweep_submit(ctx: click.Context, pipeline: str, data_uri: str, request_id: str,
                 as_json: bool) -> None:
    """Start a sweep of PIPELINE (a pipeline with a `sweep:` section) on DATA_URI."""
    act(ctx, "submit-sweep", {"pipeline": pipeline, "data_uri": gs_uri(data_uri),
                              "request_id": request_id}, as_json, id_field="sweep_id")


@sweep.command(name="cancel")
@click.argument("sweep_id", metavar="SWEEP")
@click.option("--reason", default="cancelled by an operator", help="Recorded in the sweep's history.")
@json_option
@target_options()
@click.pass_context
def sweep_cancel(ctx: click.Context, sweep_id: str, reason: str, as_json: bool) -> None:
    """Cancel a sweep: its live trials are cancelled, no new ones start."""
    act(ctx, "cancel-sweep", {"sweep_id": sweep_id, "reason": reason}, as_json,
        id_field="sweep_id")
