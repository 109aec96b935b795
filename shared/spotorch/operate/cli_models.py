"""`spotorch models`, `promote` and `rollback` (issue 37), through the authenticated api."""

from __future__ import annotations

from typing import Any

import click

from spotorch.operate.cli_session import backend, console, guard, json_option, print_json, target_options


def _show(view: dict[str, Any]) -> None:
    out = console()
    out.print(f"{view['model']}  alias {view['alias']} -> {view.get('champion') or 'none'}")
    for v in view.get("versions") or ():
        verdict = "promoted" if v["promoted"] else "refused"
        metric = "?" if v.get("metric") is None else f"{v['metric']:.4g}"
        out.print(f"  {v['name'].rsplit('/', 1)[-1]:<24} {metric:>8}  {verdict:<9} "
                  f"[{', '.join(v.get('aliases') or ())}]  {v['reason']}")
    endpoint = view.get("endpoint")
    if endpoint:
        out.print(f"endpoint {endpoint['endpoint'] or '(not created)'}: {endpoint['phase']}")
        for model, share in (endpoint.get("traffic_split") or {}).items():
            out.print(f"  {model.rsplit('/', 1)[-1]:<24} {share:>3}%")
        cost = endpoint.get("cost")
        out.print(f"  {endpoint.get('node_hours', 0):.3f} node-hours, "
                  f"{'price unknown' if cost is None else f'{cost:.4f}'} at list prices")
        if endpoint.get("pending"):
            out.print(f"  next: {endpoint['pending']}")
        if endpoint.get("reason"):
            out.print(f"  last rollback: {endpoint['reason']}")


def _post(ctx: click.Context, action: str, body: dict[str, Any], as_json: bool) -> None:
    found = backend(ctx)
    reply: dict[str, Any] = guard(lambda: found.actions.post(action, body))
    if as_json:
        print_json(reply)
    else:
        _show(reply)


@click.command()
@click.argument("pipeline")
@json_option
@target_options()
@click.pass_context
def models(ctx: click.Context, pipeline: str, as_json: bool) -> None:
    """PIPELINE's model versions: evaluation metric, the gate's verdict, aliases; which version
    its endpoint serves and with what share."""
    _post(ctx, "models", {"pipeline": pipeline}, as_json)


@click.command()
@click.argument("version")
@click.option("--reason", default="promoted by an operator", help="Recorded with the decision.")
@json_option
@target_options()
@click.pass_context
def promote(ctx: click.Context, version: str, reason: str, as_json: bool) -> None:
    """Give VERSION (projects/P/locations/L/models/M@V) the promotion alias without the gate;
    it then rolls out on the pipeline's endpoint as any promoted version."""
    _post(ctx, "promote", {"version": version, "reason": reason}, as_json)


@click.command()
@click.argument("endpoint")
@click.option("--reason", default="rolled back by an operator", help="Recorded with the rollback.")
@json_option
@target_options()
@click.pass_context
def rollback(ctx: click.Context, endpoint: str, reason: str, as_json: bool) -> None:
    """Roll ENDPOINT's running canary back now (the id a pipeline's model.serve names); its
    promotion is undone."""
    _post(ctx, "rollback", {"endpoint": endpoint, "reason": reason}, as_json)
