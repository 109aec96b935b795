"""What the schema cannot say of model.evaluation and model.promote (issue 37)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from spotorch.core.promotion import RESERVED_ALIASES


def check_promotion(doc: Any) -> Iterator[tuple[str, str]]:
    """model.promote needs model.evaluation; its alias is its own; evaluation names one source."""
    model = doc.get("model") if isinstance(doc, Mapping) else None
    if not isinstance(model, Mapping):
        return
    evaluation, promote = model.get("evaluation"), model.get("promote")
    serve = model.get("serve")
    if isinstance(serve, Mapping):
        if not isinstance(promote, Mapping):
            yield "model.serve", "needs model.promote: the endpoint serves the promoted version"
        low, high = serve.get("min_replicas", 1), serve.get("max_replicas", 1)
        if isinstance(low, int) and isinstance(high, int) and high < low:
            yield "model.serve.max_replicas", f"must be at least min_replicas ({low})"
    if isinstance(evaluation, Mapping):
        sources = [k for k in ("data_uri", "split") if evaluation.get(k) is not None]
        if len(sources) != 1:
            yield "model.evaluation", ("must name exactly one of data_uri (a fixed held-out "
                                       "folder) and split (rows held out by a hash of a key)")
    if not isinstance(promote, Mapping):
        return
    if not isinstance(evaluation, Mapping):
        yield "model.promote", ("needs model.evaluation: versions are compared on held-out data "
                                "only")
    alias = promote.get("alias", "production")
    if alias in RESERVED_ALIASES:
        yield "model.promote.alias", (f"{alias!r} is spotorch's or Vertex AI's own; choose "
                                      "another (e.g. production)")
    aliases = model.get("aliases")
    if isinstance(aliases, list) and alias in aliases:
        yield "model.aliases", (f"must not list {alias!r}: model.promote moves it, only to a "
                                "version that passes the gate")
