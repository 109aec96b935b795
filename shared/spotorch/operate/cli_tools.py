"""`spotorch ui` (the web view) and `spotorch validate` (pipeline files)."""

from __future__ import annotations

from pathlib import Path

import click

from spotorch.operate.cli_session import backend, guard, target_options


@click.command()
@click.option("--host", default="127.0.0.1", help="Address to listen on (keep it local).")
@click.option("--port", type=click.IntRange(0, 65535), default=8765, help="0: any free port.")
@click.option("--refresh", type=click.IntRange(1, 3600), default=5,
              help="Seconds between refreshes of a live run's page.")
@target_options()
@click.pass_context
def ui(ctx: click.Context, host: str, port: int, refresh: int) -> None:
    """Serve the web view of runs, snapshots, pipelines and sweeps on localhost."""
    from spotorch.operate.ui.server import UIServer

    server = guard(lambda: UIServer(backend(ctx), host=host, port=port, refresh_s=refresh))
    click.echo(f"spotorch ui on {server.url}  (Ctrl-C stops it)", err=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.close()


@click.command()
@click.argument("paths", nargs=-1, metavar="[PATH]...",
                type=click.Path(path_type=Path))
def validate(paths: tuple[Path, ...]) -> None:
    """Check pipeline files against the schema and spotorch's own rules: every problem of
    every file, with its line; OK for each good file. Exits 1 on any problem.

    PATH: pipeline files or directories (default: $SPOTORCH_PIPELINES, else ./pipelines).
    """
    from spotorch.spec.loader import validate_paths

    code = validate_paths([str(p) for p in paths])
    if code:
        raise click.exceptions.Exit(code)
