"""`spotorch dev up|down|restart|reload|alerts`: the background stack, as plain functions.

Each `*_main(argv) -> int` takes the command's arguments (the CLI wires them). `up_main` starts
a detached supervisor (`python -m spotorch.local.dev supervise`) that owns a DevStack, writes
the state file once it is ready, carries out restart/reload requests, and stops the stack on
SIGTERM. Human-readable output goes to stderr, so `eval "$(spotorch dev up)"` sees only exports.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
import signal
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

import click

from spotorch.commandline import CONTEXT, LazyGroup, run
from spotorch.local._stack_alerts import ALERTS_FILE, read_alerts
from spotorch.local._stack_config import (
    CLOUDEVENT,
    DEFAULT_FUNCTIONS,
    DEFAULT_RUN_DIR,
    DEFAULT_STATE,
    GCS_EVENT_FORMS,
    OBSERVER_SUBSCRIPTION,
    PUSH_MODES,
    VERTEX_MODULE,
    StackConfig,
    StackError,
    vertex_available,
)
from spotorch.local._stack_pipelines import default_pipelines_dir
from spotorch.local._stack_procs import log_tail, proc_start_time, spawn, stop_groups
from spotorch.local._stack_state import (
    ask_supervisor,
    pending_requests,
    read_state,
    stop_recorded,
    supervisor_alive,
    write_json,
)
from spotorch.settings import ENV_STATE, ENV_VERTEX_TOKEN

if TYPE_CHECKING:
    from spotorch.local.stack import DevStack

EXPORT_EVERY_S = 60.0  # a durable stack's Firestore export while it runs (and at stop)
RELOAD_EVERY_S = 2.0  # how often `dev up` looks at the pipeline files


def _spotorch_root() -> str:
    return str(Path(__file__).resolve().parents[2])


def exports(env: Mapping[str, str]) -> str:
    """Shell lines that export env (for `eval "$(spotorch dev up)"`)."""
    return "".join(f"export {k}={shlex.quote(v)}\n" for k, v in sorted(env.items()))


# ------------------------------------------------------------------ the summary

def _pipeline_lines(pipelines: Mapping[str, Any] | None) -> list[str]:
    if not pipelines:
        return ["pipelines: none (start with --pipelines DIR)"]
    loaded = pipelines.get("loaded") or []
    lines = [f"pipelines from {pipelines['source']}: {len(loaded)} loaded"]
    lines += [f"  {p['name']:<20} {p['trigger']}  ({p['file']})" for p in loaded]
    for file, problems in (pipelines.get("rejected") or {}).items():
        lines.append(f"  LEFT OUT {file}:")
        lines += [f"    {problem}" for problem in problems]
    if pipelines.get("buckets"):
        lines.append(f"buckets (created): {', '.join(pipelines['buckets'])}")
    for route in pipelines.get("unrouted") or []:
        lines.append(f"not routed to the local receivers: {route} (Secret Manager is not "
                     "emulated; this route sends where its target says)")
    return lines


def summary(state: Mapping[str, Any]) -> str:
    """What runs where, the pipelines, the buckets, the URLs: for a person starting the stack."""
    lines = [f"spotorch local stack, project {state.get('project')}"
             + (f", ready in {state['startup_s']}s" if state.get("startup_s") else "")
             + f"; logs in {state.get('run_dir')}"]
    lines.append(f"data: kept across `dev down`/`dev up` in {state['data_dir']} "
                 "(`dev up --fresh` starts empty)" if state.get("durable")
                 else "data: in memory, gone at `dev down`")
    lines += _pipeline_lines(state.get("pipelines"))
    emulators = state.get("emulators") or {}
    lines.append("emulators: " + ", ".join(f"{n} {a}" for n, a in emulators.items()))
    if state.get("vertex"):
        lines.append(f"vertex AI emulator: {state['vertex']['address']} "
                     f"(worker logs in {state['vertex'].get('workdir', '')})")
    for name, info in (state.get("functions") or {}).items():
        lines.append(f"function {name:<20} {info.get('url')}")
    env = state.get("env") or {}
    if env.get("SPOTORCH_API_URL"):
        lines.append(f"API: {env['SPOTORCH_API_URL']}")
    receivers = state.get("receivers")
    if receivers:
        lines.append(f"alerts: webhook {receivers['webhook']} (chat, slack), email "
                     f"{receivers['smtp']}; see them with `spotorch dev alerts`")
    lines.append(f"observer subscription: {OBSERVER_SUBSCRIPTION} (spotorch's events)")
    return "".join(f"# {line}\n" for line in lines)


# ------------------------------------------------------------------ dev up

STATE_OPTION = click.option(
    "--state", type=click.Path(dir_okay=False, path_type=Path), default=DEFAULT_STATE,
    envvar=ENV_STATE, show_envvar=True,
    help="The stack's state file (`dev up` exports SPOTORCH_STATE: every spotorch command finds "
         "the stack by it).")


@click.group(cls=LazyGroup, context_settings=CONTEXT, lazy={
    "vertex": ("spotorch.local.vertex_emulator", "vertex",
               "Run the local Vertex AI emulator in the foreground (the stack starts its own).")})
def dev() -> None:
    """The local stack: emulators, functions and the Vertex AI emulator on this machine.

    Start it with `eval "$(spotorch dev up)"`: the exports point every spotorch command at it.
    """


@dev.command(name="up")
@STATE_OPTION
@click.option("--run-dir", type=click.Path(file_okay=False, path_type=Path),
              default=DEFAULT_RUN_DIR, help="Logs, the stack's config and its kept data.")
@click.option("--project", default=StackConfig.project, help="The stack's Google Cloud project id.")
@click.option("--pipelines", type=click.Path(path_type=Path),
              help="Pipeline files to serve  [default: ./pipelines if it exists, else "
                   "spotorch's examples]")
@click.option("--functions-source", type=click.Path(dir_okay=False, path_type=Path),
              help="The functions' main.py  [default: spotorch's functions/main.py]")
@click.option("--function", "functions", multiple=True, metavar="NAME[=SIGNATURE]",
              help="Only these functions (repeat)  [default: all of functions/main.py]")
@click.option("--push", type=click.Choice(PUSH_MODES), default="eventarc",
              help="How Pub/Sub pushes reach the functions (eventarc: through the push adapter).")
@click.option("--gcs-events", type=click.Choice(GCS_EVENT_FORMS), default="pubsub",
              help="The form of object events the functions get.")
@click.option("--no-vertex", is_flag=True, help="No Vertex AI emulator.")
@click.option("--dataflow", is_flag=True,
              help="Also run the local Dataflow, for pipelines with a preprocess step (needs "
                   "`make beam-venv`).")
@click.option("--dataproc", is_flag=True,
              help="Also run the local Dataproc, for pipelines with a Spark preprocess step "
                   "(needs `make spark-venv`).")
@click.option("--schedule", type=click.Path(dir_okay=False, path_type=Path),
              help="Vertex emulator preemption schedule (JSON; docs/vertex-emulator.md).")
@click.option("--trace", type=click.Path(dir_okay=False, path_type=Path),
              help="Vertex emulator Spot availability trace.")
@click.option("--trace-speed", type=float, help="Trace seconds per wall-clock second.")
@click.option("--grace-s", type=float, help="Seconds between SIGTERM and SIGKILL on preemption.")
@click.option("--vertex-arg", "vertex_args", multiple=True, metavar="ARG",
              help="Pass ARG on to the Vertex emulator, e.g. --vertex-arg=--every-spot-job-after-s=20.")
@click.option("--tick-s", type=click.FloatRange(0), default=5.0,
              help="Seconds between reconcile ticks (0: no ticker).")
@click.option("--max-delivery-attempts", type=click.IntRange(5, 100), default=5,
              help="Pub/Sub deliveries before a message is dead-lettered.")
@click.option("--env", "extra_env", multiple=True, metavar="KEY=VALUE",
              help="Extra environment for the functions (wins over the receivers).")
@click.option("--fresh", is_flag=True, help="Forget the data kept by earlier runs, start empty.")
@click.option("--ephemeral", is_flag=True, help="Keep nothing across `dev down` (all in memory).")
@click.option("--no-receivers", is_flag=True,
              help="No local webhook/SMTP receivers (alerts go where --env says).")
@click.option("--no-reload", is_flag=True,
              help="Do not watch the pipeline files (`spotorch dev reload` still works).")
@click.option("--timeout", type=click.FloatRange(1), default=90.0,
              help="Seconds to wait for the stack to be ready.")
def up_command(**options: Any) -> None:
    """Start the local stack in the background; print the exports that point spotorch at it.

    `eval "$(spotorch dev up ...)"`: the summary goes to stderr, the exports to stdout.
    """
    code = _up(SimpleNamespace(**options))
    if code:
        raise click.exceptions.Exit(code)


def _config_from_args(args: SimpleNamespace) -> StackConfig:
    pipelines = (args.pipelines or default_pipelines_dir(Path.cwd())).resolve()
    overrides: dict[str, Any] = {
        "project": args.project, "run_dir": args.run_dir.resolve(), "push": args.push,
        "gcs_events": args.gcs_events, "vertex": not args.no_vertex,
        "dataflow": bool(getattr(args, "dataflow", False)),
        "dataproc": bool(getattr(args, "dataproc", False)),
        "vertex_schedule": args.schedule, "vertex_trace": args.trace,
        "vertex_trace_speed": args.trace_speed, "vertex_grace_s": args.grace_s,
        "vertex_args": tuple(args.vertex_args),
        "tick_seconds": args.tick_s or None, "max_delivery_attempts": args.max_delivery_attempts,
        "extra_env": _env_pairs(args.extra_env), "cwd": Path.cwd(),
        "pipelines_dir": pipelines, "durable": not args.ephemeral, "fresh": args.fresh,
        "receivers": not args.no_receivers,
        "pipeline_reload_s": None if args.no_reload else RELOAD_EVERY_S,
    }
    if args.functions_source:
        overrides["functions_source"] = args.functions_source.resolve()
    if args.functions:
        overrides["functions"] = {
            n: (s or DEFAULT_FUNCTIONS.get(n, CLOUDEVENT))
            for n, _, s in (f.partition("=") for f in args.functions)}
    return dataclasses.replace(StackConfig(), **overrides)


def _env_pairs(pairs: Sequence[str]) -> dict[str, str]:
    bad = [kv for kv in pairs if "=" not in kv or not kv.split("=", 1)[0]]
    if bad:
        raise StackError(f"--env {bad[0]!r}: give KEY=VALUE")
    return dict(kv.split("=", 1) for kv in pairs)


def up_exports(state: Mapping[str, Any], state_path: Path) -> str:
    """The exports of a running stack: its env, and its state file (every command reads it).

    Not the operator's emulator token: printed exports end up in terminals and pasted logs, so
    commands read it from the state file (mode 600) instead (operate.target)."""
    env = {k: v for k, v in (state.get("env") or {}).items() if k != ENV_VERTEX_TOKEN}
    return exports({**env, ENV_STATE: str(state_path)})


def _already_up(args: SimpleNamespace, state: Mapping[str, Any], state_path: Path) -> int:
    """`dev up` while the stack runs: switch pipelines if asked to, never ignore it silently."""
    if args.fresh:
        sys.stderr.write("spotorch dev up: the local stack is running; --fresh needs "
                         "`spotorch dev down` first\n")
        return 1
    unmet = _options_unlike(args, state)
    if unmet:
        sys.stderr.write(f"spotorch dev up: the local stack is running without "
                         f"{', '.join(unmet)}; that needs `spotorch dev down` first\n")
        return 1
    running = Path(str((state.get("pipelines") or {}).get("source", "")))
    if args.pipelines is not None and args.pipelines.resolve() != running:
        sys.stderr.write(f"the local stack is running with pipelines from {running}; "
                         f"switching to {args.pipelines.resolve()} (functions restart)\n")
        answer = ask_supervisor(state, {"op": "reload", "pipelines": str(args.pipelines)},
                                args.timeout)
        if not answer.get("ok"):
            sys.stderr.write(f"spotorch dev up: the switch failed: {answer.get('error')}\n")
            return 1
        state = read_state(state_path) or state
    else:
        sys.stderr.write(f"local stack already running (state {state_path}); options other "
                         "than --pipelines need `spotorch dev down` first\n")
    sys.stderr.write(summary(state))
    sys.stdout.write(up_exports(state, state_path))
    return 0


def _options_unlike(args: SimpleNamespace, state: Mapping[str, Any]) -> list[str]:
    """The options given to `dev up` that the running stack was not started with."""
    try:
        running = json.loads((Path(str(state.get("run_dir", ""))) / "config.json").read_text())
    except (OSError, ValueError):
        running = {}
    asked = (("vertex_schedule", "--schedule", args.schedule),
             ("vertex_trace", "--trace", args.trace),
             ("vertex_trace_speed", "--trace-speed", args.trace_speed),
             ("vertex_grace_s", "--grace-s", args.grace_s),
             ("vertex_args", "--vertex-arg", list(args.vertex_args) or None),
             ("dataflow", "--dataflow", True if getattr(args, "dataflow", False) else None))
    unlike = []
    for key, option, value in asked:
        if value is None:
            continue
        had = running.get(key)
        if isinstance(value, Path):
            same = bool(had) and value.resolve() == Path(str(had)).resolve()
        else:
            same = value == had or (isinstance(had, list) and isinstance(value, list)
                                    and value == had)
        if not same:
            unlike.append(f"{option} {value}" if value is not True else option)
    return unlike


def up_main(argv: Sequence[str]) -> int:
    """`spotorch dev up` as a function (tests): start the stack; print the exports."""
    return run(up_command, argv, prog_name="spotorch dev up")


def _up(args: SimpleNamespace) -> int:
    """Start the stack under a detached supervisor; print env exports."""
    state_path: Path = args.state.resolve()
    state = read_state(state_path)
    if state and supervisor_alive(state) and state.get("status") == "ready":
        return _already_up(args, state, state_path)
    if state:  # a dead or half-started stack: clear what is left of it
        stop_recorded(state, quiet=True)
        state_path.unlink(missing_ok=True)
    try:
        config = _config_from_args(args)
    except (StackError, ValueError) as exc:
        sys.stderr.write(f"spotorch dev up: {exc}\n")
        return 2
    if config.vertex and not vertex_available():
        sys.stderr.write(f"spotorch dev up: {VERTEX_MODULE} is not installed; "
                         "use --no-vertex\n")
        return 2
    run_dir = config.run_dir
    run_dir.mkdir(parents=True, exist_ok=True)
    config_path = run_dir / "config.json"
    write_json(config_path, config.to_json())
    log_path = run_dir / "supervisor.log"
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (_spotorch_root(), env.get("PYTHONPATH")) if p)
    env["PYTHONUNBUFFERED"] = "1"
    child = spawn("supervisor", [sys.executable, "-m", "spotorch.local.dev", "supervise",
                                 "--config", str(config_path), "--state", str(state_path)],
                  log_path, env)
    deadline = time.monotonic() + args.timeout
    while time.monotonic() < deadline:
        state = read_state(state_path)
        if state and state.get("supervisor", {}).get("pid") == child.pid:
            if state.get("status") == "ready":
                sys.stderr.write(summary(state))
                sys.stdout.write(up_exports(state, state_path))
                return 0
            if state.get("status") == "failed":
                break
        if not child.alive():
            break
        time.sleep(0.1)
    else:
        sys.stderr.write(f"spotorch dev up: not ready within {args.timeout:.0f}s\n")
    state = read_state(state_path) or {}
    sys.stderr.write(f"spotorch dev up failed: {state.get('error', '')}\n"
                     f"{log_tail(log_path, 25)}\n(log {log_path})\n")
    stop_groups([child.pid], 15, owned=[child.process])
    if state:
        stop_recorded(state, quiet=True)
    state_path.unlink(missing_ok=True)
    return 1


# ------------------------------------------------------------------ dev down

@dev.command(name="down")
@STATE_OPTION
def down_command(state: Path) -> None:
    """Stop everything the state file records (nothing running is fine)."""
    state_path = state.resolve()
    found = read_state(state_path)
    if found is None:
        sys.stderr.write(f"no local stack is running (no state file {state_path})\n")
        return
    stopped = stop_recorded(found)
    state_path.unlink(missing_ok=True)
    if not stopped:
        sys.stderr.write("local stack was not running any more; state file removed\n")


def down_main(argv: Sequence[str]) -> int:
    """`spotorch dev down` as a function (tests)."""
    return run(down_command, argv, prog_name="spotorch dev down")


# ------------------------------------------------------------------ operations on a running stack

def _running(state_path: Path, command: str) -> dict[str, Any] | None:
    state = read_state(state_path.resolve())
    if state and supervisor_alive(state) and state.get("status") == "ready":
        return state
    sys.stderr.write(f"spotorch dev {command}: no local stack is running "
                     f"(state {state_path}); start one with `spotorch dev up`\n")
    return None


def _fail(command: str, why: str) -> click.exceptions.Exit:
    sys.stderr.write(f"spotorch dev {command}: {why}\n")
    return click.exceptions.Exit(1)


@dev.command(name="restart")
@click.argument("piece")
@STATE_OPTION
@click.option("--timeout", type=click.FloatRange(1), default=90.0,
              help="Seconds to wait for the piece to be back.")
def restart_command(piece: str, state: Path, timeout: float) -> None:
    """Restart one PIECE of the running stack on its port: firestore, pubsub, gcs, vertex,
    adapter, or a function name (on_tick, api, ...)."""
    running = _running(state, "restart")
    if running is None:
        raise click.exceptions.Exit(1)
    answer = ask_supervisor(running, {"op": "restart", "piece": piece}, timeout)
    if not answer.get("ok"):
        raise _fail("restart", str(answer.get("error")))
    sys.stderr.write(f"restarted {answer['restarted']}\n")


def restart_main(argv: Sequence[str]) -> int:
    """`spotorch dev restart` as a function (tests)."""
    return run(restart_command, argv, prog_name="spotorch dev restart")


@dev.command(name="reload")
@STATE_OPTION
@click.option("--pipelines", type=click.Path(path_type=Path),
              help="Serve this directory from now on  [default: the one it serves]")
@click.option("--timeout", type=click.FloatRange(1), default=90.0,
              help="Seconds to wait for the functions to be back.")
def reload_command(state: Path, pipelines: Path | None, timeout: float) -> None:
    """Check the pipeline files again and serve the valid ones now; exits 1 when a file was
    left out (every problem is listed)."""
    running = _running(state, "reload")
    if running is None:
        raise click.exceptions.Exit(1)
    request: dict[str, Any] = {"op": "reload"}
    if pipelines is not None:
        request["pipelines"] = str(pipelines.resolve())
    answer = ask_supervisor(running, request, timeout)
    if not answer.get("ok"):
        raise _fail("reload", str(answer.get("error")))
    sys.stderr.write("".join(f"# {line}\n" for line in _pipeline_lines(answer["pipelines"])))
    if answer["pipelines"].get("rejected"):
        raise click.exceptions.Exit(1)


def reload_main(argv: Sequence[str]) -> int:
    """`spotorch dev reload` as a function (tests)."""
    return run(reload_command, argv, prog_name="spotorch dev reload")


def _alert_line(alert: Mapping[str, Any]) -> str:
    where = ", ".join(alert.get("to") or []) or alert.get("path", "")
    status = f" -> {alert['status']}" if alert.get("status") not in (None, 200) else ""
    return (f"{alert.get('at', '')} {alert.get('channel', ''):<6} "
            f"{alert.get('event_type') or '-':<40} {where}{status}")


@dev.command(name="alerts")
@STATE_OPTION
@click.option("--run-dir", type=click.Path(file_okay=False, path_type=Path),
              help="Read RUN_DIR/alerts.jsonl directly (also after `dev down`).")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line.")
def alerts_command(state: Path, run_dir: Path | None, as_json: bool) -> None:
    """What the local webhook and SMTP receivers were sent."""
    if run_dir is not None:
        path = run_dir / ALERTS_FILE
    else:
        found = read_state(state.resolve())
        if found is None:
            raise _fail("alerts", f"no local stack is running (state {state}); use --run-dir to "
                                  "read a stopped stack's alerts")
        path = Path(str(found["run_dir"])) / ALERTS_FILE
    alerts = read_alerts(path)
    for alert in alerts:
        sys.stdout.write(json.dumps(alert, sort_keys=True) + "\n" if as_json
                         else _alert_line(alert) + "\n")
    if not as_json:
        sys.stderr.write(f"{len(alerts)} alerts delivered ({path})\n")


def alerts_main(argv: Sequence[str]) -> int:
    """`spotorch dev alerts` as a function (tests)."""
    return run(alerts_command, argv, prog_name="spotorch dev alerts")


@dev.command(name="upload")
@click.argument("local", type=click.Path(exists=False, path_type=Path))
@click.argument("destination", metavar="gs://BUCKET/PREFIX/")
@STATE_OPTION
@click.option("--no-marker", is_flag=True,
              help="Do not write the marker a watching pipeline waits for when LOCAL has none.")
def upload_command(local: Path, destination: str, state: Path, no_marker: bool) -> None:
    """Put LOCAL (a file or a folder) into the local stack's Cloud Storage at
    gs://BUCKET/PREFIX/, as a producer does: a folder's files in name order, the marker last
    (the folder's own, or an empty one a watching `batch: marker` pipeline waits for)."""
    from spotorch.local._stack_upload import UploadError, plan, upload

    found = _running(state, "upload")
    if found is None:
        raise click.exceptions.Exit(1)
    env = found.get("env") or {}
    host = env.get("STORAGE_EMULATOR_HOST")
    if not host:
        raise _fail("upload", "the running stack has no Cloud Storage emulator")
    # The client finds the emulator through the environment; set it for this upload only, so a
    # caller in the same process (a test, a script) keeps talking to its own Cloud Storage.
    before = os.environ.get("STORAGE_EMULATOR_HOST")
    try:
        bucket, objects, notes = plan(local, destination, _served(found), marker=not no_marker)
        os.environ["STORAGE_EMULATOR_HOST"] = str(host)
        from google.cloud import storage

        client = storage.Client.create_anonymous_client()
        client.project = str(env.get("GOOGLE_CLOUD_PROJECT") or found.get("project") or "local")
        uris = upload(bucket, objects, client, lambda uri: click.echo(uri))
    except UploadError as exc:
        raise _fail("upload", str(exc)) from None
    finally:
        if before is None:
            os.environ.pop("STORAGE_EMULATOR_HOST", None)
        else:
            os.environ["STORAGE_EMULATOR_HOST"] = before
    for note in notes:
        sys.stderr.write(f"# {note}\n")
    sys.stderr.write(f"{len(uris)} objects uploaded to gs://{bucket}\n")


def _served(state: Mapping[str, Any]) -> tuple[Any, ...]:
    """The pipelines the running stack serves (to find the marker they wait for); () if none."""
    from spotorch.spec.compiled import read_compiled

    try:
        return read_compiled(Path(str(state.get("run_dir", ""))) / "pipelines-active") or ()
    except Exception:  # an older or half-started stack: upload without that knowledge
        return ()


def upload_main(argv: Sequence[str]) -> int:
    """`spotorch dev upload` as a function (tests)."""
    return run(upload_command, argv, prog_name="spotorch dev upload")


# ------------------------------------------------------------------ the supervisor

def _restart(stack: DevStack, request: Mapping[str, Any]) -> dict[str, Any]:
    return {"ok": True, "restarted": stack.restart(str(request.get("piece", "")))}


def _reload(stack: DevStack, request: Mapping[str, Any]) -> dict[str, Any]:
    source = request.get("pipelines")
    pipelines = stack.reload_pipelines(Path(str(source)) if source else None)
    return {"ok": True, "pipelines": pipelines.to_json()}


_OPERATIONS: Mapping[str, Callable[[DevStack, Mapping[str, Any]], dict[str, Any]]] = {
    "restart": _restart, "reload": _reload}


def _serve_requests(stack: DevStack, record: Callable[[], object] = lambda: None) -> bool:
    """Carry out waiting requests; True when one was. `record` writes the state file before
    each answer: who asked reads it next and must see what the request changed."""
    requests = pending_requests(stack.run_dir)
    for done, request in requests:
        operation = _OPERATIONS.get(str(request.get("op")))
        try:
            answer = operation(stack, request) if operation else \
                {"ok": False, "error": f"unknown operation {request.get('op')!r}"}
        except (StackError, OSError) as exc:
            answer = {"ok": False, "error": str(exc)}
        print(f"{request} -> {answer.get('ok')}", flush=True)
        record()
        write_json(done, answer)
    return bool(requests)


def _supervise(config_path: Path, state_path: Path) -> int:
    """The detached owner of a background stack: start it, record it, stop it on SIGTERM."""
    from spotorch.local.stack import DevStack

    me = {"pid": os.getpid(), "start_time": proc_start_time(os.getpid()),
          "log": str(config_path.parent / "supervisor.log")}
    config = StackConfig.from_json(json.loads(config_path.read_text()))
    base = {"supervisor": me, "project": config.project, "run_dir": str(config.run_dir),
            "stop_timeout_s": config.stop_timeout_s}

    def terminate(signum: int, _frame: Any) -> None:
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, signal.SIG_IGN)  # a second signal must not cut the cleanup short
        raise SystemExit(0)

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, terminate)
    write_json(state_path, {**base, "status": "starting"})
    stack = DevStack(config)
    try:
        try:
            stack.start()
        except Exception as exc:
            print(f"start failed: {exc}", flush=True)
            write_json(state_path, {**base, "status": "failed", "error": str(exc)})
            return 1
        recorded = {**base, **stack.describe(), "status": "ready"}
        write_json(state_path, recorded)
        print(f"stack ready in {stack.startup_s}s", flush=True)
        _watch(stack, state_path, base, recorded)
        return 0
    finally:
        stack.stop()
        state = read_state(state_path)
        if state and (state.get("supervisor") or {}).get("pid") == me["pid"] \
                and state.get("status") != "failed":
            state_path.unlink(missing_ok=True)
        print("stack stopped", flush=True)


def _watch(stack: DevStack, state_path: Path, base: Mapping[str, Any],
           recorded: Mapping[str, Any]) -> None:
    """Until SIGTERM: serve requests, keep the state file current, report children that die,
    export a durable stack's Firestore every EXPORT_EVERY_S (a killed supervisor loses less)."""
    reported: set[tuple[str, int]] = set()
    exported = time.monotonic()
    last = dict(recorded)

    def record() -> None:
        current = {**base, **stack.describe(), "status": "ready"}
        if current != last:
            write_json(state_path, current)
            last.clear()
            last.update(current)

    while True:
        time.sleep(0.3)
        _serve_requests(stack, record)
        record()
        for name, child in stack.processes.children.items():
            if not child.alive() and (name, child.pid) not in reported:
                reported.add((name, child.pid))
                print(f"{name} exited with {child.process.returncode}; see {child.log_path}",
                      flush=True)
        if stack.config.durable and time.monotonic() - exported > EXPORT_EVERY_S:
            stack.export_data()
            exported = time.monotonic()


@dev.command(name="supervise", hidden=True)
@click.option("--config", "config_path", type=click.Path(dir_okay=False, path_type=Path),
              required=True, help="The stack's config (written by `dev up`).")
@click.option("--state", "state_path", type=click.Path(dir_okay=False, path_type=Path),
              required=True, help="Where to record the stack.")
def supervise_command(config_path: Path, state_path: Path) -> None:
    """The detached owner of a background stack (started by `dev up`)."""
    code = _supervise(config_path, state_path)
    if code:
        raise click.exceptions.Exit(code)


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m spotorch.local.dev up|down|restart|reload|alerts|supervise ...`."""
    return run(dev, argv, prog_name="spotorch dev")


if __name__ == "__main__":
    sys.exit(main())
