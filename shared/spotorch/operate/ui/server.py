"""The web view's HTTP server: localhost only by default, one thread per request, no JavaScript.

Routes: / (runs, with ?status=&pipeline=&since=&page_token=), /runs/RUN (a run and its timeline),
/runs/RUN/timeline.svg, /sweeps (with the same filters) and /sweeps/SWEEP (its trials),
/api/runs, /api/runs/RUN, /api/sweeps and /api/sweeps/SWEEP (the same views as JSON), /healthz.
"""

from __future__ import annotations

import json
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


class NotFound(Exception):
    pass


class UIServer:
    """Serves the views of a Backend on host:port (port 0: a free one)."""

    def __init__(self, backend: Backend, *, host: str = "127.0.0.1", port: int = 8765,
                 refresh_s: int = 5) -> None:
        self.backend = backend
        self.refresh_s = refresh_s
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
        host, port = self.httpd.server_address[:2]
        return f"http://{host!s}:{port}/"

    def serve_forever(self) -> None:
        self.httpd.serve_forever(poll_interval=0.2)

    def start(self) -> UIServer:
        """Serve in a background thread (tests)."""
        self._thread = threading.Thread(target=self.serve_forever, name="spotorch-ui", daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
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

    def respond(self, path: str, args: Mapping[str, str]) -> Reply:
        """The reply to GET path?args (status, content type, body)."""
        from spotorch.operate.ui import pages

        parts = [urllib.parse.unquote(p) for p in path.strip("/").split("/") if p]
        try:
            if not parts:
                rows, token = self._rows(args)
                return 200, HTML, pages.runs_page(rows, args, token, target=self.target_label,
                                                  refresh_s=self.refresh_s).encode()
            if parts == ["favicon.ico"]:
                return 204, "image/x-icon", b""
            if parts == ["healthz"]:
                return 200, "text/plain", b"ok"
            if parts == ["api", "runs"]:
                rows, token = self._rows(args)
                return 200, JSON_TYPE, json.dumps({"runs": rows,
                                                   "next_page_token": token}).encode()
            if len(parts) == 3 and parts[:2] == ["api", "runs"]:
                return 200, JSON_TYPE, json.dumps(self._run(parts[2])[0]).encode()
            if len(parts) == 2 and parts[0] == "runs":
                view, svg = self._run(parts[1])
                return 200, HTML, pages.run_page(view, svg, target=self.target_label,
                                                 refresh_s=self.refresh_s).encode()
            if len(parts) == 3 and parts[0] == "runs" and parts[2] == "timeline.svg":
                return 200, SVG, self._run(parts[1])[1].encode()
            if parts == ["sweeps"]:
                rows, token = self._sweep_rows(args)
                return 200, HTML, pages.sweeps_page(rows, args, token, target=self.target_label,
                                                    refresh_s=self.refresh_s).encode()
            if len(parts) == 2 and parts[0] == "sweeps":
                return 200, HTML, pages.sweep_page(self._sweep(parts[1]), target=self.target_label,
                                                   refresh_s=self.refresh_s).encode()
            if parts == ["api", "sweeps"]:
                rows, token = self._sweep_rows(args)
                return 200, JSON_TYPE, json.dumps({"sweeps": rows,
                                                   "next_page_token": token}).encode()
            if len(parts) == 3 and parts[:2] == ["api", "sweeps"]:
                return 200, JSON_TYPE, json.dumps(self._sweep(parts[2])).encode()
            raise NotFound(f"no page {path}")
        except NotFound as exc:
            return 404, HTML, pages.error_page(str(exc), target=self.target_label).encode()
        except BadQuery as exc:
            return 400, HTML, pages.error_page(str(exc), target=self.target_label).encode()
        except OperatorError as exc:
            return 502, HTML, pages.error_page(str(exc), target=self.target_label).encode()


def _handler(server: UIServer) -> Callable[..., BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        server_version = "spotorch-ui"

        def do_GET(self) -> None:
            url = urllib.parse.urlsplit(self.path)
            args = {k: v[-1] for k, v in urllib.parse.parse_qs(url.query).items()}
            status, content_type, body = server.respond(url.path, args)
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            self.wfile.write(body)

        def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
            # Only what went wrong: a page a second while a run is live is noise.
            if str(code).isdigit() and int(code) >= HTTPStatus.BAD_REQUEST:
                super().log_request(code, size)

    return Handler
