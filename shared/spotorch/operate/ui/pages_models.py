"""A pipeline's models page (issue 37): the versions the promotion gate judged (metric, verdict,
reason, aliases), the champion, and what its endpoint serves with what share; read through the
api's /models (spotorch.app.releases.models_view)."""

from __future__ import annotations

from collections.abc import Mapping
from html import escape
from typing import Any

from spotorch.operate.ui.layout import badge, money, num, page, table


def _short(name: str | None) -> str:
    return escape((name or "-").rsplit("/", 1)[-1])


def models_page(view: Mapping[str, Any], *, target: str, refresh_s: int) -> str:
    """The page of one pipeline's model."""
    versions = []
    for v in view.get("versions") or ():
        verdict = "PROMOTED" if v["promoted"] else ("ROLLED_BACK" if v["rule"] == "rollback"
                                                    else "REFUSED")
        versions.append(
            f'<tr class="version" data-version="{escape(v["name"])}">'
            f'<td class="ref">{_short(v["name"])}</td><td class="ref">{escape(v["run_id"])}</td>'
            f'<td class="num metric">{num(v.get("metric"), ".4g")}</td>'
            f'<td>{badge(verdict)}</td><td class="aliases">{escape(", ".join(v["aliases"]))}</td>'
            f'<td class="reason">{escape(v["reason"])}</td></tr>')
    facts = [("model", escape(view["model"])), ("alias", escape(view["alias"])),
             ("champion", _short(view.get("champion")))]
    endpoint = view.get("endpoint")
    serving = ""
    if endpoint:
        facts += [("endpoint", escape(endpoint.get("endpoint") or "(not created yet)")),
                  ("phase", badge(str(endpoint["phase"]).upper())),
                  ("node-hours", f'{endpoint.get("node_hours", 0):.3f} '
                                 f'({money(endpoint.get("cost"))} at list prices)')]
        if endpoint.get("pending"):
            facts.append(("next", _short(endpoint["pending"])))
        if endpoint.get("reason"):
            facts.append(("last rollback", escape(endpoint["reason"])))
        split = [f'<tr class="share"><td class="ref">{_short(model)}</td>'
                 f'<td class="num">{share}%</td></tr>'
                 for model, share in (endpoint.get("traffic_split") or {}).items()]
        serving = ('<section><h2>Traffic split</h2>'
                   + table("split", ("version", "share"), split, numeric=frozenset({"share"}),
                           empty="nothing deployed") + '</section>')
    body = (f'<h1>{escape(view["pipeline"])}: models</h1><dl class="facts">'
            + "".join(f"<dt>{k}</dt><dd>{v}</dd>" for k, v in facts) + "</dl>" + serving
            + '<section><h2>Versions</h2>'
            + table("versions", ("version", "run", "metric", "verdict", "aliases", "why"),
                    versions, numeric=frozenset({"metric"}), empty="no version judged yet")
            + "</section>")
    return page(f"{view['pipeline']} models", body, target=target, refresh_s=refresh_s,
                here="/pipelines")
