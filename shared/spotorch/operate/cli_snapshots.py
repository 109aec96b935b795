"""`spotorch snapshots`: every upload accounted for, in a snapshot (open, complete, the run it
started) or unmatched (per pipeline, the rule it missed and what the pipeline expects)."""

from __future__ import annotations

import click

from spotorch.operate.cli_session import backend, console, guard, json_option, print_json, target_options


@click.command()
@click.option("--limit", type=click.IntRange(1, 500), default=20,
              help="Snapshots, and unmatched folders, to show (most recently active first).")
@json_option
@target_options()
@click.pass_context
def snapshots(ctx: click.Context, limit: int, as_json: bool) -> None:
    """What arrived in the landing buckets: snapshots (open and what they wait for, complete,
    the run each started) and uploads that matched no pipeline (and why)."""
    found = backend(ctx)
    gathered, strays = guard(lambda: found.snapshots(limit))
    if as_json:
        print_json({"snapshots": gathered, "unmatched": strays})
        return
    from spotorch.operate.render import snapshots_table, unmatched_lines

    out = console()
    if not gathered and not strays:
        out.print("nothing arrived yet")
        return
    if gathered:
        out.print(snapshots_table(gathered))
    for part in unmatched_lines(strays):
        out.print(part)
