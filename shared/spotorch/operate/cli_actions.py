"""`spotorch submit`, `cancel`, `retry` and `rerun`: actions, through the authenticated api function."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import click

from spotorch.operate.cli_session import backend, console, guard, json_option, print_json, target_options


def act(ctx: click.Context, action: str, body: Mapping[str, Any], as_json: bool,
        id_field: str = "run_id") -> dict[str, Any]:
    """POST the action to the api; print what it answered (the id and the new status)."""
    found = backend(ctx)
    reply: dict[str, Any] = guard(lambda: found.actions.post(action, body))
    if as_json:
        print_json(reply)
        return reply
    if reply.get("skipped"):
        click.echo("skipped: the pipeline skips new runs while one is active")
        return reply
    from rich.text import Text

    from spotorch.operate.render import status_style

    status = str(reply.get("status"))
    console().print(Text(f"{reply.get(id_field)} ") + Text(status, style=status_style(status)))
    return reply


def gs_uri(value: str) -> str:
    """Click's check of DATA_URI: only gs:// URIs are accepted."""
    if not value.startswith("gs://"):
        raise click.BadParameter(f"{value!r} is not a gs:// URI", param_hint="DATA_URI")
    return value


@click.command()
@click.argument("pipeline")
@click.argument("data_uri")
@click.option("--request-id", default="", help="The same id gives the same run (safe to repeat).")
@json_option
@target_options()
@click.pass_context
def submit(ctx: click.Context, pipeline: str, data_uri: str, request_id: str, as_json: bool) -> None:
    """Start a run of PIPELINE by hand on DATA_URI (gs://bucket/prefix/)."""
    act(ctx, "submit", {"pipeline": pipeline, "data_uri": gs_uri(data_uri),
                        "request_id": request_id}, as_json)


@click.command()
@click.argument("run_id", metavar="RUN")
@click.option("--reason", default="cancelled by an operator", help="Recorded in the run's history.")
@json_option
@target_options()
@click.pass_context
def cancel(ctx: click.Context, run_id: str, reason: str, as_json: bool) -> None:
    """Cancel a run and stop its job."""
    act(ctx, "cancel", {"run_id": run_id, "reason": reason}, as_json)


@click.command()
@click.argument("run_id", metavar="RUN")
@click.option("--request-id", default="1", help="Retries with the same id are one retry.")
@json_option
@target_options()
@click.pass_context
def retry(ctx: click.Context, run_id: str, request_id: str, as_json: bool) -> None:
    """Start a new run resuming a failed or cancelled one from its latest checkpoint."""
    act(ctx, "retry", {"run_id": run_id, "request_id": request_id}, as_json)


@click.command()
@click.argument("run_id", metavar="RUN")
@click.option("--request-id", default="1", help="Reruns with the same id are one rerun.")
@click.option("--hardware", type=click.Choice(["recorded", "current"]), default="recorded",
              show_default=True,
              help="The machines: those RUN ran on, or those the pipeline names now.")
@json_option
@target_options()
@click.pass_context
def rerun(ctx: click.Context, run_id: str, request_id: str, hardware: str, as_json: bool) -> None:
    """Start a new run on exactly RUN's recorded inputs: the same object generations, code
    (package URIs or image), seed, parameters and hardware (docs/reproducibility.md)."""
    act(ctx, "rerun", {"run_id": run_id, "request_id": request_id, "hardware": hardware},
        as_json)
