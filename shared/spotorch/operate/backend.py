"""What the CLI and the UI use: run and sweep readers, the pipelines (for prices), the api for
actions, and the training logs. Built from a Target; every cloud client is created on first use."""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from spotorch.core.model import Run
from spotorch.core.pipeline import Pipeline
from spotorch.core.sweeps import Sweep
from spotorch.operate.logsource import CloudLoggingSource, LocalWorkerLogs, LogLine, LogSource
from spotorch.operate.target import Target
from spotorch.ports.reads import ArrivalReader, RunReader, SweepReader


class OperatorError(Exception):
    """Something expected went wrong (unreachable, unauthorised, unknown run): one line, no trace."""

    def __init__(self, message: str, exit_code: int = 1) -> None:
        super().__init__(message)
        self.exit_code = exit_code


class Actions(Protocol):
    """Operator actions through the api function: POST /submit, /cancel, /retry, /rerun."""

    def post(self, action: str, body: Mapping[str, Any]) -> dict[str, Any]:
        """POST the action's body; the api's JSON answer, OperatorError naming its refusal."""
        ...


TokenSource = Callable[[str], str]


def google_identity_token(audience: str) -> str:
    """An identity token for the api function, from the user's Google credentials (google-auth)."""
    import google.auth
    import google.auth.exceptions
    from google.auth.transport.requests import Request
    from google.oauth2 import id_token

    try:
        return str(id_token.fetch_id_token(Request(), audience))
    except google.auth.exceptions.GoogleAuthError:
        pass  # user credentials cannot mint one for an audience: use their own ID token
    try:
        credentials, _ = google.auth.default()
        credentials.refresh(Request())
    except google.auth.exceptions.GoogleAuthError as exc:
        raise OperatorError(f"no Google credentials for {audience}: {exc} "
                            "(run `gcloud auth application-default login`)") from None
    token = getattr(credentials, "id_token", None)
    if not token:
        raise OperatorError("these Google credentials give no identity token; use a user login "
                            "(`gcloud auth application-default login`) or a service account")
    return str(token)


@dataclass(frozen=True)
class HttpActions:
    """Calls the api function over HTTP, with an identity token when it is deployed."""

    base_url: str
    token: TokenSource | None = None
    timeout_s: float = 60.0

    def post(self, action: str, body: Mapping[str, Any]) -> dict[str, Any]:
        """Actions.post: a JSON POST to the api's URL, signed with an identity token when deployed."""
        url = f"{self.base_url.rstrip('/')}/{action}"
        request = urllib.request.Request(url, data=json.dumps(dict(body)).encode(), method="POST",
                                         headers={"Content-Type": "application/json"})
        if self.token is not None:
            # The audience is the service URL as Cloud Run spells it: no trailing slash.
            audience = self.base_url.rstrip("/")
            request.add_header("Authorization", f"Bearer {self.token(audience)}")
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                reply: dict[str, Any] = json.loads(response.read() or b"{}")
                return reply
        except urllib.error.HTTPError as exc:
            raise OperatorError(_http_error(url, exc)) from None
        except (TimeoutError, urllib.error.URLError, ConnectionError) as exc:
            why = getattr(exc, "reason", exc)
            raise OperatorError(f"cannot reach the api at {self.base_url}: {why} "
                                "(is the local stack up? `eval \"$(spotorch dev up)\"`)") from None
        except ValueError:
            raise OperatorError(f"the api at {self.base_url} did not answer JSON") from None


def _http_error(url: str, exc: urllib.error.HTTPError) -> str:
    if exc.code in (401, 403):
        return (f"not authorised to call {url} (HTTP {exc.code}): your account needs "
                "roles/cloudfunctions.invoker (run.invoker) on the api function")
    try:
        message = json.loads(exc.read()).get("error")
    except (ValueError, AttributeError):
        message = None
    return message or f"{url}: HTTP {exc.code} {exc.reason}"


@dataclass
class Backend:
    """Everything operator commands read and steer."""

    reader: RunReader
    sweeps: SweepReader
    actions: Actions
    logs: LogSource
    pipelines: Mapping[str, Pipeline] = field(default_factory=dict)
    clock: Callable[[], float] = time.time
    target: Target | None = None
    arrivals: ArrivalReader | None = None  # snapshots and unmatched uploads
    poll_s: float = 2.0  # how often follow_run looks for the run's next attempt

    def run(self, run_id: str) -> Run:
        """The run, or OperatorError naming it when there is none."""
        try:
            run = self.reader.get(run_id)
        except OperatorError:
            raise
        except Exception as exc:  # the store's own errors: unreachable, permission denied
            raise OperatorError(describe_store_error(exc, self.target)) from None
        if run is None:
            raise OperatorError(f"no run {run_id!r} (list them with `spotorch runs`)")
        return run

    def sweep(self, sweep_id: str) -> Sweep:
        """The sweep, or OperatorError naming it when there is none."""
        try:
            found = self.sweeps.get(sweep_id)
        except OperatorError:
            raise
        except Exception as exc:  # the store's own errors: unreachable, permission denied
            raise OperatorError(describe_store_error(exc, self.target, "sweeps")) from None
        if found is None:
            raise OperatorError(f"no sweep {sweep_id!r} (list them with `spotorch sweeps`)")
        return found

    def pipeline(self, name: str) -> Pipeline | None:
        """The loaded pipeline of this name (for prices), None if not loaded."""
        return self.pipelines.get(name)

    def follow_logs(self, run: Run, attempt: int, follow: bool) -> Iterator[LogLine]:
        """The training output of one attempt of the run; with follow, until that attempt ends."""
        chosen = run.attempt(attempt)
        if chosen is None:
            raise OperatorError(f"run {run.run_id} has no attempt {attempt} "
                                f"(it has {len(run.attempts)})")
        if not chosen.job_name:
            raise OperatorError(f"attempt {attempt} of {run.run_id} has no job yet")

        def ended() -> bool:
            fresh = self.reader.get(run.run_id)
            now = fresh.attempt(attempt) if fresh else None
            return now is None or not now.live

        return self.logs.lines(chosen.job_name, follow=follow, ended=ended)

    def follow_run(self, run: Run) -> Iterator[tuple[int, LogLine]]:
        """(attempt, line) of the run's latest attempt and of every attempt after it, until the
        run ends: `logs --follow` across relaunches."""
        number = max(len(run.attempts), 1)
        while True:
            fresh = self.run(run.run_id)
            chosen = fresh.attempt(number)
            if chosen is not None and chosen.job_name:
                for line in self.follow_logs(fresh, number, follow=True):
                    yield number, line
                number += 1
                continue
            if not fresh.active:
                return  # every attempt it had was followed to its end
            time.sleep(self.poll_s)  # the next attempt is not launched (or has no job) yet

    def snapshots(self, limit: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """Views of the latest snapshots and unmatched uploads (OperatorError without a reader)."""
        from spotorch.app.views import snapshot_view, unmatched_view

        if self.arrivals is None:
            raise OperatorError("this spotorch has no snapshot reader")
        arrivals = self.arrivals
        try:
            docs = arrivals.snapshots(limit)
            strays = arrivals.unmatched(limit)
        except OperatorError:
            raise
        except Exception as exc:
            raise OperatorError(describe_store_error(exc, self.target, "snapshots")) from None
        statuses: dict[str, str | None] = {}

        def run_status(run_id: str) -> str | None:
            if run_id not in statuses:
                try:
                    found = self.reader.get(run_id)
                except Exception:
                    found = None
                statuses[run_id] = str(found.status) if found is not None else None
            return statuses[run_id]

        return ([snapshot_view(d, self.pipeline(str(d.get("pipeline"))), run_status)
                 for d in docs], [unmatched_view(d) for d in strays])


def alerts(backend: Backend, limit: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The newest alert deliveries and delivery failures (the web view's /alerts), from a
    Firestore store; OperatorError where the store cannot list them (the in-memory one)."""
    read = getattr(backend.arrivals, "signals", None)
    if read is None:
        raise OperatorError("this spotorch's store cannot list alerts (only Firestore can)")
    try:
        sent, failed = read(limit)
    except Exception as exc:
        raise OperatorError(describe_store_error(exc, backend.target, "alerts")) from None
    return [dict(d) for d in sent], [dict(d) for d in failed]


def describe_store_error(exc: Exception, target: Target | None, what: str = "runs") -> str:
    """One line for what went wrong reading runs (or sweeps), naming the store."""
    where = ("the local stack's Firestore emulator at " + target.firestore_emulator
             if target and target.firestore_emulator else
             f"Firestore of project {target.project}" if target else "the run store")
    name = type(exc).__name__
    if name == "DefaultCredentialsError":
        return (f"no Google credentials to read {what} from {where} "
                "(run `gcloud auth application-default login`, or start the local stack)")
    if name in ("PermissionDenied", "Forbidden", "Unauthenticated"):
        return f"not authorised to read {what} from {where}: {exc}"
    if name == "URLError" and target is not None and target.firestore_emulator:
        return (f"cannot read {what} from {where}: {getattr(exc, 'reason', exc)} (is the stack "
                "up? `eval \"$(spotorch dev up)\"`)")
    return f"cannot read {what} from {where}: {name}: {str(exc).splitlines()[0] if str(exc) else ''}"


def load_pipelines(path: str | None, cache_dir: Path | None = None) -> Mapping[str, Pipeline]:
    """Pipelines by name (for prices and snapshot rules); none when there is no path or it does
    not load. Kept in the user's cache between commands (a pickle of the parsed pipelines, keyed
    by the files' sizes and times and by spotorch's own format code): reading them again costs
    pydantic's import and validation, a quarter of a second of every `spotorch runs`."""
    if not path or not Path(path).exists():
        return {}
    key = _pipelines_key(Path(path))
    cached = _cache_file(Path(path), cache_dir)
    try:
        with cached.open("rb") as f:
            found = pickle.load(f)
        if isinstance(found, dict) and found.get("key") == key:
            return dict(found["pipelines"])
    except (OSError, pickle.PickleError, EOFError, AttributeError, ImportError, TypeError):
        pass  # no cache yet, or from another spotorch: read the files
    from spotorch.core.errors import ConfigError
    from spotorch.spec.loader import load_pipelines as load

    try:
        pipelines = {p.name: p for p in load(path)}
    except ConfigError:
        return {}
    with contextlib.suppress(OSError, pickle.PickleError):
        cached.parent.mkdir(parents=True, exist_ok=True)
        tmp = cached.with_suffix(f".{os.getpid()}.tmp")
        with tmp.open("wb") as f:
            pickle.dump({"key": key, "pipelines": pipelines}, f)
        os.replace(tmp, cached)
    return pipelines


def _pipelines_key(path: Path) -> list[tuple[str, int, int]]:
    """What the parsed pipelines depend on: the files, and the code that reads them."""
    import spotorch.core.pipeline as format_code

    code = Path(format_code.__file__).parent.parent
    sources = [*(sorted(path.rglob("*")) if path.is_dir() else [path]),
               code / "core" / "pipeline.py", code / "core" / "fields.py",
               code / "spec" / "loader.py", code / "spec" / "fileformat.py",
               code / "spec" / "machines.json"]
    key = []
    for source in sources:
        with contextlib.suppress(OSError):
            stat = source.stat()
            if source.is_file():
                key.append((str(source.resolve()), stat.st_mtime_ns, stat.st_size))
    return key


def _cache_file(path: Path, cache_dir: Path | None) -> Path:
    import hashlib

    base = cache_dir or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    digest = hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:24]
    return base / "spotorch" / "pipelines" / f"{digest}.pickle"


def backend_for(target: Target) -> Backend:
    """The backend of a target: Firestore (or its emulator) for reads, HTTP for actions."""
    from spotorch.adapters.gcp.firestore_reads import (
        FirestoreArrivalReader,
        FirestoreRunReader,
        FirestoreSweepReader,
    )

    # Firestore's REST API: no gRPC client to import (a third of `spotorch runs`' time).
    source = _rest_source(target)
    reader = FirestoreRunReader(source)
    sweeps = FirestoreSweepReader(source)
    if target.api_url is None:
        raise OperatorError("no api URL: pass --api-url or set SPOTORCH_API_URL", exit_code=2)
    actions = HttpActions(target.api_url, google_identity_token if target.needs_token else None)
    logs: LogSource = (LocalWorkerLogs(target.vertex_workdir) if target.vertex_workdir
                       else CloudLoggingSource(target.project))
    return Backend(reader=_GuardedReader(reader, target),
                   sweeps=_GuardedSweepReader(sweeps, target), actions=actions, logs=logs,
                   pipelines=load_pipelines(target.pipelines), target=target,
                   arrivals=FirestoreArrivalReader(source))


def _rest_source(target: Target) -> Any:
    from spotorch.adapters.gcp.firestore_reads import RestSource

    return RestSource(target.project, target.database, emulator=target.firestore_emulator
                      or os.environ.get("FIRESTORE_EMULATOR_HOST") or None)


def _store_call(target: Target, fn: Callable[[], Any], what: str = "runs") -> Any:
    """fn(); the store's own errors become one-line OperatorErrors naming the store."""
    from spotorch.ports.reads import BadQuery

    try:
        return fn()
    except (BadQuery, OperatorError):
        raise
    except Exception as exc:
        raise OperatorError(describe_store_error(exc, target, what)) from None


@dataclass(frozen=True)
class _GuardedReader:
    """A run reader whose store errors become one-line OperatorErrors naming the store."""

    inner: RunReader
    target: Target

    def get(self, run_id: str) -> Run | None:
        found: Run | None = _store_call(self.target, lambda: self.inner.get(run_id))
        return found

    def list(self, query: Any) -> Any:
        return _store_call(self.target, lambda: self.inner.list(query))


@dataclass(frozen=True)
class _GuardedSweepReader:
    """A sweep reader whose store errors become one-line OperatorErrors naming the store."""

    inner: SweepReader
    target: Target

    def get(self, sweep_id: str) -> Sweep | None:
        found: Sweep | None = _store_call(self.target, lambda: self.inner.get(sweep_id), "sweeps")
        return found

    def list(self, query: Any) -> Any:
        return _store_call(self.target, lambda: self.inner.list(query), "sweeps")
