"""The web view's HTTP server: localhost only by default, one thread per request, no JavaScript.

GET: / (runs, with ?status=&pipeline=&since=&page_token=, and the totals over ?period=, 7d by
default), /runs/RUN (a run, its charts and timeline), /runs/RUN/logs?attempt=N,
/runs/RUN/timeline.svg, /snapshots, /pipelines, /sweeps (the same filters as runs) and
/sweeps/SWEEP, /models/PIPELINE (through the api); /api/runs, /api/runs/RUN, /api/totals,
/api/snapshots, /api/pipelines, /api/sweeps, /api/sweeps/SWEEP (the same views as JSON); /healthz.

POST (the buttons): /runs/RUN/cancel, /runs/RUN/retry, /runs/RUN/rerun, /sweeps/SWEEP/cancel.
Each is handed to the api function (Backend.actions: the CLI's path, with the same identity token), never
written to Firestore here. A form carries this server's token and must come from its own
pages (Origin), so another site's page cannot press them (cross-site request forgery).
"""

from __future__ import annotations

import json
import secrets
import threading
import urllib.parse
from collections.abc import Callable, Mapping
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any

from spotorch.operate.backend import OperatorError
from spotorch.ports.reads import BadQuery, RunQuery, SweepQuery, parse_statuses, parse_sweep_statuses

if TYPE_CHECKING:
    from spotorch.operate.backend import Backend

HTML = "text/html; charset=utf-8"
JSON_TYPE = "application/json"
SVG = "image/svg+xml"
Reply = tuple[int, str, bytes]
TOTALS_LIMIT = 2000  # runs summed into the totals (pages of 500)
LOG_LINES = 500  # the last lines an attempt's logs page shows
ARRIVALS = 50  # snapshots and unmatched folders on their page


class NotFound(Exception):
    """No such page, run or sweep: answered with a 404 page."""
    pass


class Redirect(Exception):
    """Answer a POST with 303 See Other to this location."""

    def __init__(self, location: str) -> None:
        super().__init__(location)
        self.location = location


class UIServer:
    """Serves the views of a Backend on host:port (port 0: a free one)."""

    def __init__(self, backend: Backend, *, host: str = "127.0.0.1", port: int = 8765,
                 refresh_s: int = 5) -> None:
        self.backend = backend
        self.refresh_s = refresh_s
        self.token = secrets.token_urlsafe(24)  # what this server's forms carry
        target = backend.target
        self.target_label = ("local stack" if target is None or target.local
                             else f"project {target.project}")
        handler = _handler(self)
        try:
            self.httpd = ThreadingHTTPServer((host, port), handler)
        except OSError as exc:
            raise OperatorError(f"cannot listen on {host}:{port}: {exc.strerror}") from None
        self.httpd.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        """The address the server listens on."""
        host, port = self.httpd.server_address[:2]
        return f"http://{host!s}:{port}/"

    def serve_forever(self) -> None:
        """Serve requests until closed."""
        self.httpd.serve_forever(poll_interval=0.2)

    def start(self) -> UIServer:
        """Serve in a background thread (tests)."""
        self._thread = threading.Thread(target=self.serve_forever, name="spotorch-ui", daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        """Stop serving (and the background thread, if started) and release the port."""
        if self._thread is not None:
            self.httpd.shutdown()
            self._thread.join(timeout=5)
        self.httpd.server_close()

    # ------------------------------------------------------------ views

    def _filters(self, args: Mapping[str, str]) -> dict[str, Any]:
        """What runs and sweeps listings share: pipeline, since, limit, page token."""
        from spotorch.ports.reads import parse_since

        try:
            limit = int(args.get("limit") or 50)
        except ValueError:
            raise BadQuery(f"limit must be a whole number, not {args.get('limit')!r}") from None
        since = args.get("since")
        return {"pipeline": args.get("pipeline") or None,
                "since": parse_since(since, self.backend.clock()) if since else None,
                "limit": limit, "page_token": args.get("page_token") or None}

    def _query(self, args: Mapping[str, str]) -> RunQuery:
        return RunQuery(statuses=parse_statuses([args.get("status", "")]), **self._filters(args))

    def _sweep_rows(self, args: Mapping[str, str]) -> tuple[list[dict[str, Any]], str | None]:
        from spotorch.app.views import sweep_row

        query = SweepQuery(statuses=parse_sweep_statuses([args.get("status", "")]),
                           **self._filters(args))
        page = self.backend.sweeps.list(query)
        return ([sweep_row(sw, self.backend.pipeline(sw.pipeline)) for sw in page.sweeps],
                page.next_page_token)

    def _sweep(self, sweep_id: str) -> dict[str, Any]:
        from spotorch.app.views import sweep_view

        found = self.backend.sweeps.get(sweep_id)
        if found is None:
            raise NotFound(f"no sweep {sweep_id!r}")
        return sweep_view(found, self.backend.pipeline(found.pipeline))

    def _rows(self, args: Mapping[str, str]) -> tuple[list[dict[str, Any]], str | None]:
        from spotorch.app.views import run_row

        page = self.backend.reader.list(self._query(args))
        now = self.backend.clock()
        return ([run_row(r, self.backend.pipeline(r.pipeline), now) for r in page.runs],
                page.next_page_token)

    def _totals(self, period: str) -> dict[str, Any]:
        """Spend, savings and runs by status of the runs created in the period."""
        from spotorch.app.views import run_row, totals
        from spotorch.ports.reads import parse_since

        now = self.backend.clock()
        since = parse_since(period, now)
        rows: list[dict[str, Any]] = []
        token: str | None = None
        while len(rows) < TOTALS_LIMIT:
            page = self.backend.reader.list(RunQuery(since=since, limit=500, page_token=token))
            rows += [run_row(r, self.backend.pipeline(r.pipeline), now) for r in page.runs]
            token = page.next_page_token
            if token is None:
                break
        return {**totals(rows[:TOTALS_LIMIT]), "period": period,
                "cut": token is not None, "since": since}

    def _run(self, run_id: str) -> tuple[dict[str, Any], str]:
        from spotorch.app.views import run_view
        from spotorch.core.cost import ledger
        from spotorch.operate.ui.timeline import timeline_svg

        run = self.backend.reader.get(run_id)
        if run is None:
            raise NotFound(f"no run {run_id!r}")
        now = self.backend.clock()
        pipeline = self.backend.pipeline(run.pipeline)
        return run_view(run, pipeline, now), timeline_svg(run, ledger(run, pipeline, now), now)

    def _logs(self, run_id: str, args: Mapping[str, str]) -> str:
        from spotorch.operate.logsource import LogsUnavailable
        from spotorch.operate.ui import pages

        view, _ = self._run(run_id)
        if not view["attempts"]:
            raise NotFound(f"run {run_id!r} has no attempt yet")
        try:
            attempt = int(args.get("attempt") or len(view["attempts"]))
        except ValueError:
            raise BadQuery(f"attempt must be a number, not {args.get('attempt')!r}") from None
        run = self.backend.run(run_id)
        problem, lines = None, []
        try:
            lines = list(self.backend.follow_logs(run, attempt, follow=False))
        except (OperatorError, LogsUnavailable) as exc:
            problem = str(exc)
        return pages.logs_page(view, attempt, lines[-LOG_LINES:], target=self.target_label,
                               problem=problem, cut=len(lines), refresh_s=self.refresh_s)

    def _pipelines(self) -> list[dict[str, Any]]:
        from spotorch.operate.ui.pages_data import pipeline_row

        return [pipeline_row(p) for _, p in sorted(self.backend.pipelines.items())]

    def respond(self, path: str, args: Mapping[str, str]) -> Reply:
        """The reply to GET path?args (status, content type, body)."""
        from spotorch.operate.ui import pages, pages_data, pages_sweeps

        parts = [urllib.parse.unquote(p) for p in path.strip("/").split("/") if p]
        label, refresh = self.target_label, self.refresh_s
        try:
            if not parts:
                rows, token = self._rows(args)
                period = args.get("period") or "7d"
                return 200, HTML, pages.runs_page(rows, args, token, target=label,
                                                  refresh_s=refresh, totals=self._totals(period),
                                                  period=period).encode()
            if parts == ["favicon.ico"]:
                return 204, "image/x-icon", b""
            if parts == ["healthz"]:
                return 200, "text/plain", b"ok"
            if parts[0] == "api":
                return 200, JSON_TYPE, json.dumps(self._api(parts[1:], args)).encode()
            if len(parts) == 2 and parts[0] == "runs":
                view, svg = self._run(parts[1])
                return 200, HTML, pages.run_page(view, svg, target=label, refresh_s=refresh,
                                                 token=self.token, args=args).encode()
            if len(parts) == 3 and parts[0] == "runs" and parts[2] == "timeline.svg":
                return 200, SVG, self._run(parts[1])[1].encode()
            if len(parts) == 3 and parts[0] == "runs" and parts[2] == "logs":
                return 200, HTML, self._logs(parts[1], args).encode()
            if parts == ["snapshots"]:
                gathered, strays = self.backend.snapshots(ARRIVALS)
                return 200, HTML, pages_data.snapshots_page(gathered, strays, target=label,
                                                            refresh_s=refresh).encode()
            if parts == ["alerts"]:
                from spotorch.operate.backend import alerts
                from spotorch.operate.ui.pages_alerts import alerts_page

                try:
                    sent, failed = alerts(self.backend, ARRIVALS)
                except OperatorError as exc:
                    return 200, HTML, alerts_page((), (), target=label,
                                                  problem=str(exc)).encode()
                return 200, HTML, alerts_page(sent, failed, target=label,
                                              refresh_s=refresh).encode()
            if parts == ["pipelines"]:
                source = (self.backend.target.pipelines if self.backend.target else None) or \
                    "the pipelines given to this view"
                return 200, HTML, pages_data.pipelines_page(self._pipelines(), target=label,
                                                            source=str(source)).encode()
            if parts == ["sweeps"]:
                rows, token = self._sweep_rows(args)
                return 200, HTML, pages_sweeps.sweeps_page(rows, args, token, target=label,
                                                           refresh_s=refresh).encode()
            if len(parts) == 2 and parts[0] == "sweeps":
                return 200, HTML, pages_sweeps.sweep_page(self._sweep(parts[1]), target=label,
                                                          refresh_s=refresh, token=self.token,
                                                          args=args).encode()
            if len(parts) == 2 and parts[0] == "models":  # issue 37, through the api
                from spotorch.operate.ui import pages_models

                view = self.backend.actions.post("models", {"pipeline": parts[1]})
                return 200, HTML, pages_models.models_page(view, target=label,
                                                           refresh_s=refresh).encode()
            raise NotFound(f"no page {path}")
        except NotFound as exc:
            return 404, HTML, pages.error_page(str(exc), target=label).encode()
        except BadQuery as exc:
            return 400, HTML, pages.error_page(str(exc), target=label).encode()
        except OperatorError as exc:
            return 502, HTML, pages.error_page(str(exc), target=label).encode()

    def _api(self, parts: list[str], args: Mapping[str, str]) -> Any:
        """The JSON views behind the pages."""
        if parts == ["runs"]:
            rows, token = self._rows(args)
            return {"runs": rows, "next_page_token": token}
        if len(parts) == 2 and parts[0] == "runs":
            return self._run(parts[1])[0]
        if parts == ["totals"]:
            return self._totals(args.get("period") or "7d")
        if parts == ["snapshots"]:
            gathered, strays = self.backend.snapshots(ARRIVALS)
            return {"snapshots": gathered, "unmatched": strays}
        if parts == ["pipelines"]:
            return {"pipelines": self._pipelines()}
        if parts == ["sweeps"]:
            rows, token = self._sweep_rows(args)
            return {"sweeps": rows, "next_page_token": token}
        if len(parts) == 2 and parts[0] == "sweeps":
            return self._sweep(parts[1])
        raise NotFound(f"no page /api/{'/'.join(parts)}")

    # ------------------------------------------------------------ actions

    def act(self, path: str, form: Mapping[str, str], origin: str | None = None,
            host: str | None = None) -> Reply:
        """A button: check it came from this server's own page (its token; the browser's Origin
        names the host the page was served from), hand it to the api, redirect back to the page
        with what happened (or an error page saying why not)."""
        from spotorch.operate.ui import pages

        parts = [urllib.parse.unquote(p) for p in path.strip("/").split("/") if p]
        label = self.target_label
        foreign = origin is not None and origin != "null" and \
            urllib.parse.urlsplit(origin).netloc != (host or "")
        if not secrets.compare_digest(form.get("token", ""), self.token) or foreign:
            return 403, HTML, pages.error_page(
                "refused: this action did not come from this spotorch ui's own page (reload "
                "the page and press the button again)", target=label).encode()
        try:
            location = self._perform(parts, form)
        except NotFound as exc:
            return 404, HTML, pages.error_page(str(exc), target=label).encode()
        except OperatorError as exc:
            return 502, HTML, pages.error_page(f"the api refused: {exc}", target=label).encode()
        raise Redirect(location)

    def _perform(self, parts: list[str], form: Mapping[str, str]) -> str:
        reason = (form.get("reason") or "").strip() or "cancelled from the web view"
        if len(parts) == 3 and parts[0] == "runs" and parts[2] == "cancel":
            reply = self.backend.actions.post("cancel", {"run_id": parts[1], "reason": reason})
            return _back("runs", parts[1], f"cancel asked: {reply.get('status')}")
        if len(parts) == 3 and parts[0] == "runs" and parts[2] == "retry":
            reply = self.backend.actions.post("retry", {"run_id": parts[1], "request_id": "1"})
            new = str(reply.get("run_id") or parts[1])
            return _back("runs", new, f"retry of {parts[1]}: {reply.get('status')}")
        if len(parts) == 3 and parts[0] == "runs" and parts[2] == "rerun":
            # The form's request id (pages._actions): a resubmitted form is the same rerun.
            request = (form.get("request_id") or "1")[:32]
            reply = self.backend.actions.post("rerun", {"run_id": parts[1], "request_id": request})
            new = str(reply.get("run_id") or parts[1])
            return _back("runs", new, f"rerun of {parts[1]}: {reply.get('status')}")
        if len(parts) == 3 and parts[0] == "sweeps" and parts[2] == "cancel":
            reply = self.backend.actions.post("cancel-sweep", {"sweep_id": parts[1],
                                                               "reason": reason})
            return _back("sweeps", parts[1], f"cancel asked: {reply.get('status')}")
        raise NotFound(f"no action /{'/'.join(parts)}")


def _back(kind: str, ident: str, done: str) -> str:
    return f"/{kind}/{urllib.parse.quote(ident)}?{urllib.parse.urlencode({'done': done})}"


MAX_FORM_BYTES = 16_384


def _handler(server: UIServer) -> Callable[..., BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        server_version = "spotorch-ui"

        def _send(self, status: int, content_type: str, body: bytes,
                  location: str | None = None) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Cache-Control", "no-store")
            self.send_header("X-Frame-Options", "DENY")  # no clicks through another site's frame
            if location:
                self.send_header("Location", location)
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            url = urllib.parse.urlsplit(self.path)
            args = {k: v[-1] for k, v in urllib.parse.parse_qs(url.query).items()}
            self._send(*server.respond(url.path, args))

        def do_POST(self) -> None:
            url = urllib.parse.urlsplit(self.path)
            length = int(self.headers.get("Content-Length") or 0)
            if length > MAX_FORM_BYTES:
                self._send(413, "text/plain", b"form too large")
                return
            raw = self.rfile.read(length).decode("utf-8", "replace")
            form = {k: v[-1] for k, v in urllib.parse.parse_qs(raw).items()}
            try:
                self._send(*server.act(url.path, form, self.headers.get("Origin"),
                                       self.headers.get("Host")))
            except Redirect as go:
                self._send(303, "text/plain", b"", location=go.location)

        def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
            # Only what went wrong: a page a second while a run is live is noise.
            if str(code).isdigit() and int(code) >= HTTPStatus.BAD_REQUEST:
                super().log_request(code, size)

    return Handler
