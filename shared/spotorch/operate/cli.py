"""The `spotorch` command: read and steer runs, snapshots and sweeps, the local web view, the local
stack, the demo.

Starts fast: click only at import; Rich, the cloud clients and the slower commands' modules are
imported by the command that needs them (the LAZY table). Exit codes: 0 ok, 1 failed, 2 usage.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping

import click

from spotorch.commandline import CONTEXT, LazyGroup, run
from spotorch.operate import cli_actions, cli_models, cli_runs, cli_snapshots, cli_sweeps, cli_tools
from spotorch.operate.cli_session import OperatorFailure, OperatorUsageError, Session, target_options

__all__ = ["LAZY", "OperatorFailure", "OperatorUsageError", "cli", "main"]

# Commands whose modules are slow to import (the local stack, the simulator, pydantic, Pub/Sub):
# name -> (module, click command, the line `spotorch --help` shows).
LAZY: Mapping[str, tuple[str, str, str]] = {
    "dev": ("spotorch.local.dev", "dev",
            "The local stack: emulators, functions and the Vertex AI emulator on this machine."),
    "demo": ("spotorch.local.demo", "demo", "Run an end-to-end story on a local stack of its own."),
    "simulate": ("spotorch.sim.simulate", "simulate", "Replay Spot traces through the policies."),
    "validate": ("spotorch.operate.cli_tools", "validate",
                 "Check pipeline files; every problem listed."),
    "dead-letters": ("spotorch.operate.deadletters", "dead_letters",
                     "List dead-lettered messages with their reason; replay chosen ones."),
    "prices": ("spotorch.operate.prices", "prices",
               "The price table costs are stated with; refresh it from the Catalog API."),
    "advise": ("spotorch.operate.advise", "advise_command",
               "The table of hardware candidates from earlier probes; --probe runs them."),
    "deploy": ("spotorch.operate.deploy_check", "deploy",
               "Check deploy/: every Google call spotorch makes is granted."),
    "init": ("spotorch.operate.init_project", "init",
             "Write a starting project: a pipeline, a trainer, terraform.tfvars."),
}


@click.group(cls=LazyGroup, lazy=LAZY, context_settings=CONTEXT)
@click.version_option(None, "--version", "-V", package_name="spotorch", prog_name="spotorch")
@target_options(root=True)
@click.pass_context
def cli(ctx: click.Context) -> None:
    """Training on Spot VMs that runs itself: see and steer its runs.

    Reads go to Firestore (the local stack's emulator when it is up); actions go through the
    authenticated api function. Times are ISO 8601, UTC. The options above are accepted after
    any command too (`spotorch runs --state S`).
    """
    if ctx.obj is None:  # tests hand in a Backend as obj
        from spotorch.operate.cli_session import TARGET_KEY

        ctx.obj = Session(ctx.meta.setdefault(TARGET_KEY, {}))


for _command in (cli_runs.runs, cli_runs.show, cli_runs.status_alias, cli_runs.watch,
                 cli_runs.logs, cli_snapshots.snapshots, cli_sweeps.sweeps, cli_sweeps.sweep,
                 cli_actions.submit, cli_actions.cancel, cli_actions.retry, cli_actions.rerun,
                 cli_tools.ui, cli_models.models, cli_models.promote, cli_models.rollback):
    cli.add_command(_command)


def main(argv: list[str] | None = None) -> int:
    """The console script: run the command tree; expected failures print one line."""
    return run(cli, argv, prog_name="spotorch")


if __name__ == "__main__":
    sys.exit(main())
