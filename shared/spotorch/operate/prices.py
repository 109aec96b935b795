"""`spotorch prices`: the price table the ledger uses, and refreshing it from Google's Catalog API.

`spotorch prices refresh --out prices.json` reads Compute Engine's SKUs from the Cloud Billing
Catalog API (an API key in $SPOTORCH_BILLING_API_KEY, or --api-key-env NAME) and writes a table
of its own shape; point SPOTORCH_PRICES at it (functions: deploy/ sets it from the bundle) and every
cost spotorch states uses it. Machines priced whole in the shipped table (A2, A3 hosts) are
priced from their family's unit rates in a refreshed one; TPUs keep the shipped prices (their
SKUs are in another service) and the command says so.
"""

from __future__ import annotations

import json
import os
import sys
from datetime import UTC, datetime
from pathlib import Path

import click

from spotorch.commandline import CONTEXT, SuggestingGroup, run

API_KEY_ENV = "SPOTORCH_BILLING_API_KEY"


@click.group(cls=SuggestingGroup, context_settings=CONTEXT)
def prices() -> None:
    """The price table every cost is stated with (list prices, or SPOTORCH_PRICES)."""


@prices.command(context_settings=CONTEXT)
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), required=True,
              help="Where to write the table (JSON); SPOTORCH_PRICES then names it.")
@click.option("--api-key-env", default=API_KEY_ENV,
              help="Environment variable holding a Cloud Billing API key.")
@click.option("--regions", default="",
              help="Comma-separated regions to keep (default: every region).")
@click.option("--endpoint", default="https://cloudbilling.googleapis.com",
              help="The Catalog API's address.")
@click.option("--keep-tpu/--no-keep-tpu", default=True,
              help="Carry the shipped TPU prices over (their SKUs are not read).")
def refresh(out: Path, api_key_env: str, regions: str, endpoint: str, keep_tpu: bool) -> None:
    """Read Compute Engine's list prices from the Cloud Billing Catalog API into a table."""
    from dataclasses import replace

    from spotorch.adapters.gcp.billing_catalog import BillingCatalog, CatalogError
    from spotorch.core.price_catalog import COMPUTE_ENGINE, table_from_skus
    from spotorch.core.price_list import LIST_PRICES
    from spotorch.core.prices import PriceTable
    from spotorch.spec.prices import table_doc

    key = os.environ.get(api_key_env, "")
    if not key:
        raise click.ClickException(f"no API key: set {api_key_env} to a Cloud Billing API key "
                                   "(console: APIs & Services > Credentials)")
    keep = frozenset(r.strip() for r in regions.split(",") if r.strip()) or None
    today = datetime.now(UTC).date().isoformat()
    try:
        skus = list(BillingCatalog(api_key=key, endpoint=endpoint).skus(COMPUTE_ENGINE))
    except CatalogError as exc:
        raise click.ClickException(str(exc)) from None
    table, notes = table_from_skus(skus, as_of=today, regions=keep,
                                   source=f"Cloud Billing Catalog API ({COMPUTE_ENGINE})")
    if keep_tpu:
        tpu = {k: v for k, v in LIST_PRICES.accelerators.items() if k.startswith("TPU_")}
        hosts = {k: v for k, v in LIST_PRICES.machines.items() if k.startswith("ct")}
        table = PriceTable(families=table.families, machines=hosts,
                           accelerators={**tpu, **table.accelerators},
                           source=table.source, as_of=table.as_of)
    # Dataflow's SKUs are another service's (not read here): the shipped ones carry over.
    table = replace(table, dataflow=LIST_PRICES.dataflow)
    out.write_text(json.dumps(table_doc(table), indent=1, sort_keys=True) + "\n")
    click.echo(f"{out}: {len(table.families)} machine families, {len(table.accelerators)} "
               f"accelerators from {len(skus)} SKUs (as of {today})")
    for line in notes[:20]:
        click.echo(f"  left out: {line}", err=True)
    click.echo(f"point SPOTORCH_PRICES at {out} to price with it", err=True)


@prices.command(context_settings=CONTEXT)
@click.argument("machine")
@click.option("--accelerator", default="", help="Accelerator type on the machine, if any.")
@click.option("--count", default=1, help="How many accelerators.")
@click.option("--region", default="us-central1", help="The region whose prices to show.")
def show(machine: str, accelerator: str, count: int, region: str) -> None:
    """What one hour of MACHINE costs on each capacity, and where each figure comes from."""
    from spotorch.core.cost import hourly_rate
    from spotorch.core.errors import ConfigError
    from spotorch.core.pipeline import Capacity, JobTemplate, Pipeline, Trigger, WorkerPool
    from spotorch.spec.prices import price_table

    try:
        table = price_table()
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from None
    pool = WorkerPool(machine_type=machine, accelerator_type=accelerator or None,
                      accelerator_count=count if accelerator else 0)
    pipeline = Pipeline(name="prices", trigger=Trigger(bucket="b"), checkpoint_uri="gs://c/",
                        output_uri="gs://m/", job=JobTemplate(worker_pools=(pool,)))
    basis: list[str] = []
    for capacity in Capacity:
        rate = hourly_rate(pipeline, capacity, region, table)
        price = "unknown price" if rate.per_hour is None else f"${rate.per_hour:.4f}/h"
        click.echo(f"{capacity:>9}: {price}" + (f" (no price for {', '.join(rate.unknown)})"
                                                  if rate.unknown else ""))
        basis += [b for b in rate.basis if b not in basis]
    for line in basis:
        click.echo(f"  {line}")


def main(argv: list[str] | None = None) -> int:
    """`spotorch prices ...` as a delegated command: the exit code (spotorch.commandline.run)."""
    return run(prices, argv, prog_name="spotorch prices")


if __name__ == "__main__":
    sys.exit(main())
