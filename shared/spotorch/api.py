"""The operator HTTP API (function `api`): submit, cancel, retry and read runs. JSON in, JSON out."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

from spotorch.errors import SpotorchError

Response = tuple[str, int, dict[str, str]]
JSON = {"Content-Type": "application/json"}


def _reply(body: Mapping[str, Any], status: int = 200) -> Response:
    return json.dumps(body, default=str), status, JSON


def _get(deps: Any, body: Mapping[str, Any]) -> Response:
    from spotorch.service import run_summary

    run, _ = deps.runs.load(str(body.get("run_id", "")))
    return _reply(run_summary(run)) if run else _reply({"error": "no such run"}, 404)


def _cancel(deps: Any, body: Mapping[str, Any]) -> Response:
    from spotorch.service import cancel_run, run_summary

    run = cancel_run(deps, str(body["run_id"]), str(body.get("reason") or "cancelled via API"))
    return _reply(run_summary(run))


def _retry(deps: Any, body: Mapping[str, Any]) -> Response:
    from spotorch.service import retry_run, run_summary

    run = retry_run(deps, str(body["run_id"]), str(body.get("request_id") or "1"))
    return _reply(run_summary(run), 201)


def _submit(deps: Any, body: Mapping[str, Any]) -> Response:
    from spotorch.service import run_summary, submit

    run = submit(deps, str(body["pipeline"]), str(body["data_uri"]),
                 request_id=str(body.get("request_id") or ""))
    return _reply(run_summary(run) if run else {"skipped": True}, 201 if run else 200)


def _list(deps: Any, body: Mapping[str, Any]) -> Response:
    return _reply({"active": [{"run_id": r.run_id, "pipeline": r.pipeline, "status": str(r.status)}
                              for r in deps.runs.active()]})


ROUTES: Mapping[tuple[str, str], Callable[[Any, Mapping[str, Any]], Response]] = {
    ("GET", "runs"): _list,
    ("GET", "run"): _get,
    ("POST", "cancel"): _cancel,
    ("POST", "retry"): _retry,
    ("POST", "submit"): _submit,
}


def handle_request(request: Any, deps: Any = None) -> Response:
    """Route /<action> to the service layer; errors come back as JSON with a clear message."""
    from spotorch.entry import deps as production

    action = request.path.strip("/").split("/")[-1]
    route = ROUTES.get((request.method, action))
    if route is None:
        return _reply({"error": f"no route {request.method} /{action}",
                       "routes": [f"{m} /{a}" for m, a in ROUTES]}, 404)
    body = dict(request.args) if request.method == "GET" else (request.get_json(silent=True) or {})
    try:
        return route(deps or production(), body)
    except KeyError as exc:
        return _reply({"error": f"missing field {exc}"}, 400)
    except SpotorchError as exc:
        return _reply({"error": str(exc), "kind": type(exc).__name__}, 409)
