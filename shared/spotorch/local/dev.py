"""`spotorch dev up|down|restart|reload|alerts`: the background stack, as plain functions.

Each `*_main(argv) -> int` takes the command's arguments (the CLI wires them). `up_main` starts
a detached supervisor (`python -m spotorch.local.dev supervise`) that owns a DevStack, writes
the state file once it is ready, carries out restart/reload requests, and stops the stack on
SIGTERM. Human-readable output goes to stderr, so `eval "$(spotorch dev up)"` sees only exports.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shlex
import signal
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

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

def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="spotorch dev up",
                                     description="Start the local stack in the background.")
    parser.add_argument("--state", type=Path, default=DEFAULT_STATE)
    parser.add_argument("--run-dir", type=Path, default=DEFAULT_RUN_DIR)
    parser.add_argument("--project", default=StackConfig.project)
    parser.add_argument("--pipelines", type=Path,
                        help="pipeline files to serve (default ./pipelines if it exists, "
                             "else spotorch's examples)")
    parser.add_argument("--functions-source", type=Path)
    parser.add_argument("--function", action="append", metavar="NAME[=SIGNATURE]",
                        help="only these functions (default: all of functions/main.py)")
    parser.add_argument("--push", choices=PUSH_MODES, default="eventarc")
    parser.add_argument("--gcs-events", choices=GCS_EVENT_FORMS, default="pubsub")
    parser.add_argument("--no-vertex", action="store_true")
    parser.add_argument("--schedule", type=Path, help="Vertex emulator preemption schedule")
    parser.add_argument("--trace", type=Path, help="Vertex emulator spot trace")
    parser.add_argument("--trace-speed", type=float)
    parser.add_argument("--grace-s", type=float)
    parser.add_argument("--vertex-arg", action="append", default=[], metavar="ARG",
                        help="pass ARG on to the Vertex emulator, e.g. "
                             "--vertex-arg=--every-spot-job-after-s=20")
    parser.add_argument("--tick-s", type=float, default=5.0, help="0: no ticker")
    parser.add_argument("--max-delivery-attempts", type=int, default=5)
    parser.add_argument("--env", action="append", default=[], metavar="KEY=VALUE",
                        help="extra environment for the functions (wins over the receivers)")
    parser.add_argument("--fresh", action="store_true",
                        help="forget the data kept by earlier runs, start empty")
    parser.add_argument("--ephemeral", action="store_true",
                        help="keep nothing across `dev down` (everything in memory)")
    parser.add_argument("--no-receivers", action="store_true",
                        help="no local webhook/SMTP receivers (alerts go where --env says)")
    parser.add_argument("--no-reload", action="store_true",
                        help="do not watch the pipeline files (`spotorch dev reload` still works)")
    parser.add_argument("--timeout", type=float, default=90.0)
    return parser


def _config_from_args(args: argparse.Namespace) -> StackConfig:
    pipelines = (args.pipelines or default_pipelines_dir(Path.cwd())).resolve()
    overrides: dict[str, Any] = {
        "project": args.project, "run_dir": args.run_dir.resolve(), "push": args.push,
        "gcs_events": args.gcs_events, "vertex": not args.no_vertex,
        "vertex_schedule": args.schedule, "vertex_trace": args.trace,
        "vertex_trace_speed": args.trace_speed, "vertex_grace_s": args.grace_s,
        "vertex_args": tuple(args.vertex_arg),
        "tick_seconds": args.tick_s or None, "max_delivery_attempts": args.max_delivery_attempts,
        "extra_env": dict(kv.split("=", 1) for kv in args.env), "cwd": Path.cwd(),
        "pipelines_dir": pipelines, "durable": not args.ephemeral, "fresh": args.fresh,
        "receivers": not args.no_receivers,
        "pipeline_reload_s": None if args.no_reload else RELOAD_EVERY_S,
    }
    if args.functions_source:
        overrides["functions_source"] = args.functions_source.resolve()
    if args.function:
        overrides["functions"] = {
            n: (s or DEFAULT_FUNCTIONS.get(n, CLOUDEVENT))
            for n, _, s in (f.partition("=") for f in args.function)}
    return dataclasses.replace(StackConfig(), **overrides)


def _already_up(args: argparse.Namespace, state: Mapping[str, Any], state_path: Path) -> int:
    """`dev up` while the stack runs: switch pipelines if asked to, never ignore it silently."""
    if args.fresh:
        sys.stderr.write("spotorch dev up: the local stack is running; --fresh needs "
                         "`spotorch dev down` first\n")
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
    sys.stdout.write(exports(state.get("env") or {}))
    return 0


def up_main(argv: Sequence[str]) -> int:
    """`spotorch dev up`: start the stack under a detached supervisor; print env exports."""
    args = _build_parser().parse_args(list(argv))
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
                sys.stdout.write(exports(state.get("env") or {}))
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

def _state_parser(prog: str, description: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument("--state", type=Path, default=DEFAULT_STATE)
    return parser


def down_main(argv: Sequence[str]) -> int:
    """`spotorch dev down`: stop everything the state file records (idempotent)."""
    args = _state_parser("spotorch dev down", "Stop the background local stack.").parse_args(
        list(argv))
    state_path: Path = args.state.resolve()
    state = read_state(state_path)
    if state is None:
        sys.stderr.write(f"no local stack is running (no state file {state_path})\n")
        return 0
    stopped = stop_recorded(state)
    state_path.unlink(missing_ok=True)
    if not stopped:
        sys.stderr.write("local stack was not running any more; state file removed\n")
    return 0


# ------------------------------------------------------------------ operations on a running stack

def _running(state_path: Path, command: str) -> dict[str, Any] | None:
    state = read_state(state_path.resolve())
    if state and supervisor_alive(state) and state.get("status") == "ready":
        return state
    sys.stderr.write(f"spotorch dev {command}: no local stack is running "
                     f"(state {state_path}); start one with `spotorch dev up`\n")
    return None


def restart_main(argv: Sequence[str]) -> int:
    """`spotorch dev restart PIECE`: restart one piece of the running stack on its port."""
    parser = _state_parser("spotorch dev restart", "Restart one piece of the running stack.")
    parser.add_argument("piece", help="firestore, pubsub, gcs, vertex, adapter, or a function "
                                      "name (on_tick, api, ...)")
    parser.add_argument("--timeout", type=float, default=90.0)
    args = parser.parse_args(list(argv))
    state = _running(args.state, "restart")
    if state is None:
        return 1
    answer = ask_supervisor(state, {"op": "restart", "piece": args.piece}, args.timeout)
    if not answer.get("ok"):
        sys.stderr.write(f"spotorch dev restart: {answer.get('error')}\n")
        return 1
    sys.stderr.write(f"restarted {answer['restarted']}\n")
    return 0


def reload_main(argv: Sequence[str]) -> int:
    """`spotorch dev reload [--pipelines DIR]`: check the pipeline files again, serve the valid
    ones; exit 1 when a file was left out (every problem is listed)."""
    parser = _state_parser("spotorch dev reload", "Reload the running stack's pipelines.")
    parser.add_argument("--pipelines", type=Path, help="serve this directory from now on")
    parser.add_argument("--timeout", type=float, default=90.0)
    args = parser.parse_args(list(argv))
    state = _running(args.state, "reload")
    if state is None:
        return 1
    request: dict[str, Any] = {"op": "reload"}
    if args.pipelines is not None:
        request["pipelines"] = str(args.pipelines.resolve())
    answer = ask_supervisor(state, request, args.timeout)
    if not answer.get("ok"):
        sys.stderr.write(f"spotorch dev reload: {answer.get('error')}\n")
        return 1
    sys.stderr.write("".join(f"# {line}\n" for line in _pipeline_lines(answer["pipelines"])))
    return 1 if answer["pipelines"].get("rejected") else 0


def _alert_line(alert: Mapping[str, Any]) -> str:
    where = ", ".join(alert.get("to") or []) or alert.get("path", "")
    status = f" -> {alert['status']}" if alert.get("status") not in (None, 200) else ""
    return (f"{alert.get('at', '')} {alert.get('channel', ''):<6} "
            f"{alert.get('event_type') or '-':<40} {where}{status}")


def alerts_main(argv: Sequence[str]) -> int:
    """`spotorch dev alerts`: what the local webhook and SMTP receivers were sent."""
    parser = _state_parser("spotorch dev alerts", "Show the alerts the local receivers got.")
    parser.add_argument("--run-dir", type=Path, help="read RUN_DIR/alerts.jsonl directly "
                                                     "(also after `dev down`)")
    parser.add_argument("--json", action="store_true", help="one JSON object per line")
    args = parser.parse_args(list(argv))
    if args.run_dir is not None:
        path = args.run_dir / ALERTS_FILE
    else:
        state = read_state(args.state.resolve())
        if state is None:
            sys.stderr.write(f"no local stack is running (state {args.state}); "
                             "use --run-dir to read a stopped stack's alerts\n")
            return 1
        path = Path(str(state["run_dir"])) / ALERTS_FILE
    alerts = read_alerts(path)
    for alert in alerts:
        sys.stdout.write(json.dumps(alert, sort_keys=True) + "\n" if args.json
                         else _alert_line(alert) + "\n")
    if not args.json:
        sys.stderr.write(f"{len(alerts)} alerts delivered ({path})\n")
    return 0


# ------------------------------------------------------------------ the supervisor

def _restart(stack: DevStack, request: Mapping[str, Any]) -> dict[str, Any]:
    return {"ok": True, "restarted": stack.restart(str(request.get("piece", "")))}


def _reload(stack: DevStack, request: Mapping[str, Any]) -> dict[str, Any]:
    source = request.get("pipelines")
    pipelines = stack.reload_pipelines(Path(str(source)) if source else None)
    return {"ok": True, "pipelines": pipelines.to_json()}


_OPERATIONS: Mapping[str, Callable[[DevStack, Mapping[str, Any]], dict[str, Any]]] = {
    "restart": _restart, "reload": _reload}


def _serve_requests(stack: DevStack) -> bool:
    """Carry out waiting requests; True when one was."""
    requests = pending_requests(stack.run_dir)
    for done, request in requests:
        operation = _OPERATIONS.get(str(request.get("op")))
        try:
            answer = operation(stack, request) if operation else \
                {"ok": False, "error": f"unknown operation {request.get('op')!r}"}
        except (StackError, OSError) as exc:
            answer = {"ok": False, "error": str(exc)}
        print(f"{request} -> {answer.get('ok')}", flush=True)
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
    while True:
        time.sleep(0.3)
        _serve_requests(stack)
        current = {**base, **stack.describe(), "status": "ready"}
        if current != recorded:
            write_json(state_path, current)
            recorded = current
        for name, child in stack.processes.children.items():
            if not child.alive() and (name, child.pid) not in reported:
                reported.add((name, child.pid))
                print(f"{name} exited with {child.process.returncode}; see {child.log_path}",
                      flush=True)
        if stack.config.durable and time.monotonic() - exported > EXPORT_EVERY_S:
            stack.export_data()
            exported = time.monotonic()


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m spotorch.local.dev up|down|restart|reload|alerts|supervise ...`."""
    args = list(sys.argv[1:] if argv is None else argv)
    command, rest = (args[0], args[1:]) if args else ("", [])
    commands: Mapping[str, Callable[[Sequence[str]], int]] = {
        "up": up_main, "down": down_main, "restart": restart_main, "reload": reload_main,
        "alerts": alerts_main}
    if command in commands:
        return commands[command](rest)
    if command == "supervise":
        parser = argparse.ArgumentParser(prog="spotorch-stack-supervisor")
        parser.add_argument("--config", type=Path, required=True)
        parser.add_argument("--state", type=Path, required=True)
        ns = parser.parse_args(rest)
        return _supervise(ns.config, ns.state)
    sys.stderr.write("usage: python -m spotorch.local.dev up|down|restart|reload|alerts "
                     "[options]\n")
    return 2


if __name__ == "__main__":
    sys.exit(main())
