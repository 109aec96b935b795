"""The operator HTTP API (function `api`): read, list, submit, cancel, retry and rerun runs; list,
read, submit and cancel sweeps. JSON in and out. POST /rerun {run_id, request_id}: a new run on
exactly the run's recorded inputs (spotorch.app.runs.rerun_run).

Times are ISO 8601 (UTC). GET /runs lists every run newest first: ?status=active,FAILED
&pipeline=NAME&since=6h|ISO&limit=N&page_token=T; the reply carries next_page_token. GET /sweeps
takes the same (sweep statuses), GET /sweep?sweep_id=S one sweep; POST /submit-sweep
{pipeline, data_uri, request_id} and POST /cancel-sweep {sweep_id, reason}. GET (or POST)
/models?pipeline=P: its judged versions, champion and endpoint; POST /promote {version, reason}
and POST /rollback {endpoint, reason} (spotorch.app.releases).

Ids that name documents (run, pipeline, request, sweep ids) are checked before anything reads: a
request the API cannot act on answers 400 with the reason and is recorded in rejected_events
(event type "api METHOD /action"), never a 5xx; an unknown run answers 404 on GET /run and
409 on the actions, as an unknown pipeline does. An id Firestore would refuse (a '/', '.' or
'..', __x__, over 1500 bytes) is named with its rule. A body nested deeper than
depth.MAX_JSON_DEPTH is refused (400) before it is parsed. Submit and submit-sweep check the data
URI (spotorch.app.submissions): 400 for one that escapes its folder or lies outside the landing
bucket the pipeline watches, 404 when nothing is there. Every refusal (400, 404, 409) is
recorded in rejected_events.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

from spotorch.core.errors import SpotorchError

if TYPE_CHECKING:
    from spotorch.app.deps import Deps
    from spotorch.core.model import Run
    from spotorch.ports.reads import RunReader

Response = tuple[str, int, dict[str, str]]
JSON_HEADERS = {"Content-Type": "application/json"}


class HttpRequest(Protocol):
    """What the API reads of a (Flask) request."""

    @property
    def path(self) -> str:
        """The request's path, without the query."""
        ...

    @property
    def method(self) -> str:
        """The HTTP method, upper case."""
        ...

    @property
    def args(self) -> Mapping[str, str]:
        """The query parameters."""
        ...

    def get_json(self, silent: bool = ...) -> Any:
        """The body parsed as JSON; with silent, None when it is not JSON."""
        ...


class BadRequest(ValueError):
    """A request the API cannot act on as sent (HTTP 400)."""


def _reply(body: Mapping[str, Any], status: int = 200) -> Response:
    return json.dumps(body), status, JSON_HEADERS


def reader_of(deps: Deps) -> RunReader:
    """How to list runs in this deployment: Firestore's ordered query, or any document store."""
    from spotorch.adapters.gcp.firestore import FirestoreDocumentStore
    from spotorch.adapters.gcp.firestore_reads import FirestoreRunReader
    from spotorch.app.queries import DocumentRunReader

    if isinstance(deps.docs, FirestoreDocumentStore):
        return FirestoreRunReader(deps.docs.client)
    return DocumentRunReader(deps.docs)


def _view(deps: Deps, run: Run) -> dict[str, Any]:
    from spotorch.app.views import run_view

    return run_view(run, deps.pipelines.get(run.pipeline), deps.clock.now(), deps.prices)


MAX_TEXT = 2048  # a data URI, a reason: longer is not something an operator typed


def _field(body: Mapping[str, Any], name: str) -> str:
    value = body.get(name)
    if value in (None, ""):
        raise BadRequest(f"missing field {name!r}")
    if not isinstance(value, str | int) or isinstance(value, bool) or len(str(value)) > MAX_TEXT:
        raise BadRequest(f"field {name!r} is not a string of at most {MAX_TEXT} characters")
    return str(value)


def _id(body: Mapping[str, Any], name: str, *, required: bool = True) -> str:
    """A field that names a document (a run, a pipeline, a request): checked before any read."""
    from spotorch.core.ids import check_id

    if not required and body.get(name) in (None, ""):
        return ""
    return check_id(_field(body, name), name)


def _get(deps: Deps, body: Mapping[str, Any]) -> Response:
    run_id = _id(body, "run_id")
    run = reader_of(deps).get(run_id)
    return _reply(_view(deps, run)) if run else _reply({"error": f"no such run {run_id!r}"}, 404)


def _list(deps: Deps, body: Mapping[str, Any]) -> Response:
    from spotorch.app.views import run_row
    from spotorch.ports.reads import RunQuery, parse_since, parse_statuses

    try:
        limit = int(body.get("limit") or 20)
    except ValueError:
        raise BadRequest(f"limit must be a whole number, not {body.get('limit')!r}") from None
    now = deps.clock.now()
    query = RunQuery(statuses=parse_statuses([str(body.get("status") or "")]),
                     pipeline=_id(body, "pipeline", required=False) or None,
                     since=parse_since(str(body["since"]), now) if body.get("since") else None,
                     limit=limit, page_token=str(body.get("page_token") or "") or None)
    page = reader_of(deps).list(query)
    return _reply({"runs": [run_row(r, deps.pipelines.get(r.pipeline), now, deps.prices)
                                 for r in page.runs],
                   "next_page_token": page.next_page_token})


def _cancel(deps: Deps, body: Mapping[str, Any]) -> Response:
    from spotorch.app.runs import cancel_run

    reason = str(body.get("reason") or "cancelled via API")[:500]
    run = cancel_run(deps, _id(body, "run_id"), reason)
    return _reply(_view(deps, run))


def _retry(deps: Deps, body: Mapping[str, Any]) -> Response:
    from spotorch.app.runs import retry_run

    run = retry_run(deps, _id(body, "run_id"), _id(body, "request_id", required=False) or "1")
    return _reply(_view(deps, run), 201)


def _rerun(deps: Deps, body: Mapping[str, Any]) -> Response:
    from spotorch.app.runs import rerun_run

    run = rerun_run(deps, _id(body, "run_id"), _id(body, "request_id", required=False) or "1",
                    hardware=str(body.get("hardware") or "recorded")[:20])
    return _reply(_view(deps, run), 201)


def _submit(deps: Deps, body: Mapping[str, Any]) -> Response:
    from spotorch.app.runs import submit

    run = submit(deps, _id(body, "pipeline"), _field(body, "data_uri"),
                 request_id=_id(body, "request_id", required=False))
    return _reply(_view(deps, run) if run else {"skipped": True}, 201 if run else 200)


def _sweep_reader(deps: Deps) -> Any:
    from spotorch.adapters.gcp.firestore import FirestoreDocumentStore
    from spotorch.adapters.gcp.firestore_reads import FirestoreSweepReader
    from spotorch.app.queries import DocumentSweepReader

    if isinstance(deps.docs, FirestoreDocumentStore):
        return FirestoreSweepReader(deps.docs.client)
    return DocumentSweepReader(deps.docs)


def _sweep_view(deps: Deps, sweep_id: str) -> Response:
    from spotorch.app.views import sweep_view

    found = _sweep_reader(deps).get(sweep_id)
    if found is None:
        return _reply({"error": f"no such sweep {sweep_id!r}"}, 404)
    return _reply(sweep_view(found, deps.pipelines.get(found.pipeline)))


def _sweeps(deps: Deps, body: Mapping[str, Any]) -> Response:
    from spotorch.app.views import sweep_row
    from spotorch.ports.reads import SweepQuery, parse_since, parse_sweep_statuses

    try:
        limit = int(body.get("limit") or 20)
    except ValueError:
        raise BadRequest(f"limit must be a whole number, not {body.get('limit')!r}") from None
    query = SweepQuery(statuses=parse_sweep_statuses([str(body.get("status") or "")]),
                       pipeline=_id(body, "pipeline", required=False) or None,
                       since=parse_since(str(body["since"]), deps.clock.now())
                       if body.get("since") else None,
                       limit=limit, page_token=str(body.get("page_token") or "") or None)
    page = _sweep_reader(deps).list(query)
    return _reply({"sweeps": [sweep_row(sw, deps.pipelines.get(sw.pipeline))
                              for sw in page.sweeps], "next_page_token": page.next_page_token})


def _submit_sweep(deps: Deps, body: Mapping[str, Any]) -> Response:
    from spotorch.app.sweeps import submit_sweep
    from spotorch.app.views import sweep_view

    sw = submit_sweep(deps, _id(body, "pipeline"), _field(body, "data_uri"),
                      request_id=_id(body, "request_id", required=False))
    return _reply(sweep_view(sw, deps.pipelines.get(sw.pipeline)), 201)


def _cancel_sweep(deps: Deps, body: Mapping[str, Any]) -> Response:
    from spotorch.app.sweeps import cancel_sweep
    from spotorch.app.views import sweep_view

    sw = cancel_sweep(deps, _id(body, "sweep_id"),
                      str(body.get("reason") or "cancelled via API"))
    return _reply(sweep_view(sw, deps.pipelines.get(sw.pipeline)))


def _models(deps: Deps, body: Mapping[str, Any]) -> Response:
    from spotorch.app.releases import models_view

    return _reply(models_view(deps, _field(body, "pipeline")))


def _promote(deps: Deps, body: Mapping[str, Any]) -> Response:
    from spotorch.app.releases import promote_version

    return _reply(promote_version(deps, _field(body, "version"),
                                  str(body.get("reason") or "promoted via API")))


def _rollback(deps: Deps, body: Mapping[str, Any]) -> Response:
    from spotorch.app.releases import rollback_endpoint

    return _reply(rollback_endpoint(deps, _field(body, "endpoint"),
                                    str(body.get("reason") or "rolled back via API")))


Route = Callable[["Deps", Mapping[str, Any]], Response]
ROUTES: Mapping[tuple[str, str], Route] = {
    ("GET", "runs"): _list,
    ("GET", "run"): _get,
    ("POST", "cancel"): _cancel,
    ("POST", "retry"): _retry,
    ("POST", "rerun"): _rerun,
    ("POST", "submit"): _submit,
    ("GET", "sweeps"): _sweeps,
    ("GET", "sweep"): lambda deps, body: _sweep_view(deps, _id(body, "sweep_id")),
    ("POST", "submit-sweep"): _submit_sweep,
    ("POST", "cancel-sweep"): _cancel_sweep,
    # issue 37: models, promotion and rollback (spotorch.app.releases)
    ("GET", "models"): _models,
    ("POST", "models"): _models,
    ("POST", "promote"): _promote,
    ("POST", "rollback"): _rollback,
}


def _record(deps: Deps, method: str, action: str, body: Mapping[str, Any], reason: str,
            level: int = 30) -> None:
    """Keep a refused request in rejected_events, as the event functions keep bad events."""
    import hashlib
    import logging
    import time

    from spotorch.app.runs import record_rejected

    what = json.dumps([method, action, body], sort_keys=True, default=str)
    key = "api-" + hashlib.sha256(what.encode()).hexdigest()[:32]
    logging.getLogger("spotorch.entrypoints.api").log(level, "api: refused %s /%s: %s", method,
                                                      action[:60], reason[:300])
    try:
        record_rejected(deps.docs, event_id=key, event_type=f"api {method} /{action[:60]}",
                        reason=reason, now=time.time(), payload=dict(body))
    except Exception as exc:  # best effort: the answer says what was wrong either way
        logging.getLogger("spotorch.entrypoints.api").error("could not record: %s", exc)


def handle_request(request: HttpRequest, deps: Deps | None = None) -> Response:
    """Route /<action> to the service layer; errors come back as JSON with a clear message."""
    # Imported per request, not with functions/main.py: the event functions' cold starts stay light.
    from spotorch.app.snapshots import InvalidSubmit
    from spotorch.core.errors import InvalidEvent
    from spotorch.ports.reads import BadQuery

    action = request.path.strip("/").split("/")[-1][:60]
    if deps is None:
        from spotorch.entrypoints.functions import deps as production

        deps = production()
    route = ROUTES.get((request.method, action))
    if route is None:
        reason = f"no route {request.method} /{action}"
        _record(deps, request.method, action, {}, reason, level=20)
        return _reply({"error": reason, "routes": [f"{m} /{a}" for m, a in ROUTES]}, 404)
    body: Mapping[str, Any]
    if request.method == "GET":
        body = dict(request.args)
    else:
        try:
            parsed = request.get_json(silent=True)
        except RecursionError:  # nested too deep to parse (depth.install refuses it earlier)
            reason = "the request body is JSON nested too deep"
            _record(deps, request.method, action, {}, reason)
            return _reply({"error": reason}, 400)
        if parsed is not None and not isinstance(parsed, dict):
            reason = "the request body must be a JSON object"
            _record(deps, request.method, action, {"body": str(parsed)[:200]}, reason)
            return _reply({"error": reason}, 400)
        body = parsed or {}
    try:
        return route(deps, body)
    except (BadRequest, BadQuery, InvalidEvent, InvalidSubmit) as exc:
        _record(deps, request.method, action, body, str(exc))
        return _reply({"error": str(exc)}, 400)
    except SpotorchError as exc:
        status = 404 if isinstance(exc, LookupError) else 409  # NothingThere: 404
        _record(deps, request.method, action, body, str(exc), level=20)  # logged as info
        return _reply({"error": str(exc), "kind": type(exc).__name__}, status)
