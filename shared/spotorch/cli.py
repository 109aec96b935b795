"""The `spotorch` command: demo, local stack, simulator, pipeline validation and operator calls."""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import urllib.request
from collections.abc import Callable, Mapping, Sequence

# Subcommand -> (module, function, help). Each takes the remaining argv and returns an exit code.
# Modules are imported only when their subcommand runs.
DELEGATES: Mapping[str, tuple[str, str, str]] = {
    "demo": ("spotorch.local.demo", "main", "run the end-to-end demo on the local stack"),
    "simulate": ("spotorch.sim.simulate", "main", "replay spot traces through the policies"),
    "validate": ("spotorch.config", "validate_main", "check pipeline files"),
}
DEV_DELEGATES: Mapping[str, tuple[str, str, str]] = {
    "up": ("spotorch.local.stack", "up_main", "start the local stack in the background"),
    "down": ("spotorch.local.stack", "down_main", "stop the local stack"),
    "vertex": ("spotorch.local.vertex_emulator", "main", "run the local Vertex AI emulator"),
}
API_ACTIONS: Mapping[str, tuple[str, Sequence[str]]] = {
    "status": ("GET", ("run_id",)),
    "runs": ("GET", ()),
    "cancel": ("POST", ("run_id",)),
    "retry": ("POST", ("run_id",)),
    "submit": ("POST", ("pipeline", "data_uri")),
}
_API_PATH = {"status": "run"}


def _delegate(table: Mapping[str, tuple[str, str, str]], name: str, argv: list[str]) -> int:
    module, func, _ = table[name]
    main: Callable[[list[str]], int] = getattr(importlib.import_module(module), func)
    return int(main(argv) or 0)


def _api(action: str, argv: list[str]) -> int:
    method, fields = API_ACTIONS[action]
    parser = argparse.ArgumentParser(prog=f"spotorch {action}")
    parser.add_argument("--url", required=True, help="the api function's URL")
    parser.add_argument("--token", default="", help="identity token (gcloud auth print-identity-token)")
    for f in fields:
        parser.add_argument(f)
    args = parser.parse_args(argv)
    body = {f: getattr(args, f) for f in fields}
    url = f"{args.url.rstrip('/')}/{_API_PATH.get(action, action)}"
    data = None
    if method == "GET":
        url += "?" + "&".join(f"{k}={v}" for k, v in body.items()) if body else ""
    else:
        data = json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method,
                                     headers={"Content-Type": "application/json"})
    if args.token:
        request.add_header("Authorization", f"Bearer {args.token}")
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            print(response.read().decode())
            return 0
    except urllib.error.HTTPError as exc:
        print(exc.read().decode(), file=sys.stderr)
        return 1


def _usage() -> str:
    lines = ["usage: spotorch COMMAND [ARGS]", "", "commands:"]
    lines += [f"  {name:<10} {help_}" for name, (_, _, help_) in DELEGATES.items()]
    lines += [f"  dev {name:<6} {help_}" for name, (_, _, help_) in DEV_DELEGATES.items()]
    lines += [f"  {name:<10} operator API: {' '.join(fields) or '(no args)'} --url URL"
              for name, (_, fields) in API_ACTIONS.items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(_usage())
        return 0
    command, rest = argv[0], argv[1:]
    if command in DELEGATES:
        return _delegate(DELEGATES, command, rest)
    if command == "dev" and rest and rest[0] in DEV_DELEGATES:
        return _delegate(DEV_DELEGATES, rest[0], rest[1:])
    if command in API_ACTIONS:
        return _api(command, rest)
    print(f"spotorch: unknown command {' '.join(argv[:2])!r}\n\n{_usage()}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
