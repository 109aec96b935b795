"""The JSON Schemas of spotorch's events (schemas/events/): found, loaded once, and checked."""

from __future__ import annotations

import functools
import json
import os
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from spotorch.core.events import TYPE_VERSION

# Where the JSON Schemas live: $SPOTORCH_SCHEMAS_DIR, else schemas/events/ found next to the package
# (repo: <root>/shared/spotorch + <root>/schemas; bundle: <root>/spotorch + <root>/schemas).
SCHEMAS_ENV = "SPOTORCH_SCHEMAS_DIR"
ENVELOPE_SCHEMA = "envelope.schema.json"



class SchemasNotFound(FileNotFoundError):
    """The schemas/events directory is not where spotorch looks for it."""


def schema_file(kind: str, version: str = TYPE_VERSION) -> str:
    """File name of the schema of one event type, e.g. run.failed.v1.schema.json."""
    return f"{kind}.{version}.schema.json"


def schema_dir_candidates(package_dir: Path | None = None,
                          environ: Mapping[str, str] | None = None) -> list[Path]:
    """Directories searched for the schemas, in order."""
    env = os.environ if environ is None else environ
    here = package_dir or Path(__file__).resolve().parents[1]  # the spotorch package
    found = [Path(env[SCHEMAS_ENV])] if env.get(SCHEMAS_ENV) else []
    # The package itself, its parent (a bundle), its grandparent (the repo: shared/spotorch).
    return found + [base / "schemas" / "events" for base in (here, here.parent, here.parent.parent)]


def find_schemas_dir(package_dir: Path | None = None,
                     environ: Mapping[str, str] | None = None) -> Path:
    """The first candidate directory that holds the envelope schema."""
    candidates = schema_dir_candidates(package_dir, environ)
    for candidate in candidates:
        if (candidate / ENVELOPE_SCHEMA).is_file():
            return candidate
    raise SchemasNotFound("spotorch event schemas not found; looked in: "
                          + ", ".join(str(c) for c in candidates)
                          + f" (set {SCHEMAS_ENV} or ship schemas/events next to spotorch/)")


@dataclass(frozen=True)
class _Schemas:
    envelope: Any  # a jsonschema validator
    by_type: Mapping[str, Any]


_schemas_lock = threading.Lock()


@functools.cache
def _schemas(directory: Path) -> _Schemas:
    # jsonschema costs ~0.1 s to import: only the code paths that validate pay for it.
    from jsonschema import Draft202012Validator, FormatChecker
    from referencing import Registry, Resource

    documents = {path.name: json.loads(path.read_text())
                 for path in directory.glob("*.schema.json")}
    registry: Registry[Any] = Registry().with_resources(
        (doc["$id"], Resource.from_contents(doc)) for doc in documents.values())
    checker = FormatChecker()

    def validator(doc: Mapping[str, Any]) -> Any:
        return Draft202012Validator(doc, registry=registry, format_checker=checker)

    by_type = {doc["title"]: validator(doc) for name, doc in documents.items()
               if name != ENVELOPE_SCHEMA}
    return _Schemas(validator(documents[ENVELOPE_SCHEMA]), by_type)


def load_schemas(directory: Path | None = None) -> _Schemas:
    """Validators for the envelope and every event type (loaded once per directory)."""
    with _schemas_lock:
        return _schemas((directory or find_schemas_dir()).resolve())


def _format(errors: Iterable[Any]) -> list[tuple[str, str]]:
    return [("/".join(str(p) for p in error.absolute_path), error.message) for error in errors]


def _consistency(event: Mapping[str, Any]) -> list[tuple[str, str]]:
    """Cross-field rules a JSON Schema cannot state: id, subject and source name the data's run."""
    data = event.get("data")
    if not isinstance(data, Mapping):
        return []
    run_id, pipeline = data.get("run_id"), data.get("pipeline")
    expected = {
        "id": (str(event.get("id", "")).rsplit(":", 1)[0], run_id, "must start with data.run_id"),
        "subject": (event.get("subject"), f"runs/{run_id}", "must be runs/{data.run_id}"),
        "source": (event.get("source"), f"//spotorch/pipelines/{pipeline}",
                   "must be //spotorch/pipelines/{data.pipeline}"),
    }
    return [(key, f"{actual!r} {rule}") for key, (actual, wanted, rule) in expected.items()
            if isinstance(run_id, str) and isinstance(pipeline, str) and actual != wanted]


def event_problems(event: Any, directory: Path | None = None) -> list[tuple[str, str]]:
    """(path, message) for everything wrong with an event; path "" is the event as a whole."""
    if not isinstance(event, Mapping):
        return [("", "event is not a JSON object")]
    schemas = load_schemas(directory)
    type_ = event.get("type")
    validator = schemas.by_type.get(type_) if isinstance(type_, str) else None
    problems = _format((validator or schemas.envelope).iter_errors(dict(event)))
    if validator is None and isinstance(type_, str) and not any(p == "type" for p, _ in problems):
        problems.append(("type", f"unknown event type {type_!r}"))
    problems += _consistency(event)
    return sorted(set(problems))


def validate_event(event: Mapping[str, Any]) -> list[str]:
    """Problems of an event against its JSON Schema in schemas/events/; empty when it is valid."""
    return [f"{path or '<event>'}: {message}" for path, message in event_problems(event)]
