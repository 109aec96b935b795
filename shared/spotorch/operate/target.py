"""Which spotorch an operator talks to: the local stack when it is up, or a deployed project.

Precedence: options, then the environment (SPOTORCH_API_URL, SPOTORCH_PROJECT, what
`eval "$(spotorch dev up)"` exports), then the running local stack's state file (--state, or
SPOTORCH_STATE, which `dev up` exports, or .spotorch/stack.json), then the config file
($XDG_CONFIG_HOME/spotorch/config.toml: project, region, api_url, database, pipelines).
"""

from __future__ import annotations

import json
import os
import tomllib
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from spotorch import settings as S

ENV_API_URL = "SPOTORCH_API_URL"
API_FUNCTION = "spotorch-api"
ENV_CONFIG = "SPOTORCH_CONFIG"
ENV_STATE = S.ENV_STATE  # the local stack's state file; `dev up` exports it
DEFAULT_STACK_STATE = Path(".spotorch/stack.json")
DEPLOYED_DEAD_LETTERS = S.SUBSCRIPTION_DEAD_LETTER
LOCAL_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})


class TargetError(ValueError):
    """The target cannot be used as given (bad URL, unreadable config file)."""


@dataclass(frozen=True)
class Target:
    """Where runs are read (Firestore or its emulator) and where actions go (the api function)."""

    project: str
    api_url: str | None
    region: str = "us-central1"
    database: str = "(default)"
    firestore_emulator: str | None = None  # host:port of the local stack's Firestore
    vertex_workdir: Path | None = None  # the local Vertex emulator's job folders (worker logs)
    pipelines: str | None = None  # where the pipelines live (for prices)
    source: str = "defaults"  # what chose this target, for messages
    # The local stack's environment (emulator hosts) when it is the target: commands that use
    # Google's clients directly (dead-letters, advise) set it before they build one.
    stack_env: Mapping[str, str] = field(default_factory=dict)
    dead_letter_subscription: str = DEPLOYED_DEAD_LETTERS  # the hold subscription to list

    @property
    def local(self) -> bool:
        """Whether the target is the local stack (its Firestore emulator is known)."""
        return self.firestore_emulator is not None

    @property
    def needs_token(self) -> bool:
        """A deployed api wants an identity token; the local stack's does not."""
        if self.api_url is None:
            return False
        return urllib.parse.urlsplit(self.api_url).hostname not in LOCAL_HOSTS


def check_url(url: str) -> str:
    """The URL itself when it is http(s)://host[...]; TargetError naming what is wrong otherwise."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise TargetError(f"api URL {url!r} is not an http(s) URL with a host "
                          "(e.g. https://us-central1-PROJECT.cloudfunctions.net/spotorch-api)")
    return url.rstrip("/") + "/"


def _pid_alive(pid: Any) -> bool:
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def read_stack_state(path: Path) -> Mapping[str, Any] | None:
    """The running local stack's recorded state, or None when it is not up."""
    try:
        state = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(state, dict) or state.get("status") != "ready":
        return None
    return state if _pid_alive((state.get("supervisor") or {}).get("pid")) else None


def _vertex_workdir(state: Mapping[str, Any]) -> Path | None:
    run_dir = state.get("run_dir")
    if not run_dir:
        return None
    try:
        config = json.loads((Path(run_dir) / "config.json").read_text())
    except (OSError, ValueError):
        config = {}
    return Path(config.get("vertex_workdir") or Path(run_dir) / "vertex")


def config_path(environ: Mapping[str, str]) -> Path:
    """The config file: SPOTORCH_CONFIG, else the XDG config folder."""
    if environ.get(ENV_CONFIG):
        return Path(environ[ENV_CONFIG])
    base = environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "spotorch" / "config.toml"


def read_config(path: Path) -> Mapping[str, Any]:
    """The config file's settings, none if it does not exist; TargetError if unreadable."""
    try:
        with path.open("rb") as f:
            return tomllib.load(f)
    except FileNotFoundError:
        return {}
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise TargetError(f"config file {path}: {exc}") from None


def state_path(environ: Mapping[str, str], given: Path | str | None = None) -> Path:
    """The local stack's state file: given, else SPOTORCH_STATE, else .spotorch/stack.json."""
    return Path(given or environ.get(ENV_STATE) or DEFAULT_STACK_STATE)


def resolve(*, project: str | None = None, api_url: str | None = None,
            region: str | None = None, pipelines: str | None = None,
            stack_state: Path | str | None = None,
            environ: Mapping[str, str] | None = None) -> Target:
    """The target these options, the environment, the local stack and the config file point at."""
    env = os.environ if environ is None else environ
    state = read_stack_state(state_path(env, stack_state))
    stack_env: Mapping[str, str] = (state or {}).get("env") or {}
    function_env: Mapping[str, str] = (state or {}).get("function_env") or {}
    conf = read_config(config_path(env))
    explicit_project = project or env.get(S.ENV_PROJECT)
    # An explicit project other than the local stack's means a deployed one: ignore the stack.
    use_stack = state is not None and explicit_project in (None, stack_env.get(S.ENV_PROJECT))
    emulator = env.get("FIRESTORE_EMULATOR_HOST") or (
        stack_env.get("FIRESTORE_EMULATOR_HOST") if use_stack else None)
    chosen_project = (explicit_project or (stack_env.get(S.ENV_PROJECT) if use_stack else None)
                      or conf.get("project") or env.get("GOOGLE_CLOUD_PROJECT"))
    if not chosen_project:
        chosen_project = "spotorch-local"
    chosen_region = region or env.get(S.ENV_REGION) or conf.get("region") or "us-central1"
    url = (api_url or env.get(ENV_API_URL)
           or (stack_env.get(ENV_API_URL) if use_stack else None) or conf.get("api_url"))
    if url is None and emulator is None:
        # A deployed project's api function (deploy/functions.tf names it spotorch-api); its
        # Cloud Run URL (`terraform output api_url`) works as well, through --api-url.
        url = f"https://{chosen_region}-{chosen_project}.cloudfunctions.net/{API_FUNCTION}"
    source = ("options" if (project or api_url) else "environment" if env.get(ENV_API_URL)
              or env.get(S.ENV_PROJECT) else "local stack" if use_stack
              else "config file" if conf else "defaults")
    return Target(
        project=str(chosen_project), api_url=check_url(str(url)) if url else None,
        region=str(chosen_region),
        database=str(env.get(S.ENV_FIRESTORE_DATABASE) or conf.get("database") or "(default)"),
        firestore_emulator=emulator,
        vertex_workdir=_vertex_workdir(state) if use_stack and state else None,
        pipelines=(pipelines or env.get(S.ENV_PIPELINES) or function_env.get(S.ENV_PIPELINES)
                   or conf.get("pipelines")),
        source=source,
        stack_env=dict(stack_env) if use_stack else {},
        dead_letter_subscription=str(((state or {}).get("observers") or {}).get("dead_letter")
                                     or DEPLOYED_DEAD_LETTERS) if use_stack
        else DEPLOYED_DEAD_LETTERS)


def use_stack_environment(target: Target) -> None:
    """Point Google's clients at the local stack's emulators and project (they find emulators
    only in the environment); what the environment already says wins."""
    for key, value in target.stack_env.items():
        if key.endswith("_EMULATOR_HOST") or key in (S.ENV_PROJECT, "GOOGLE_CLOUD_PROJECT",
                                                      S.ENV_VERTEX_TOKEN,
                                                      S.ENV_VERTEX_ENDPOINT):  # advise --probe
            os.environ.setdefault(key, value)
