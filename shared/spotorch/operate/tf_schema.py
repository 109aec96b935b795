"""deploy/*.tf against the providers' published schemas: every resource type, argument and block.

The schemas are extracts vendored in deploy/provider-schema/ (resource -> settable arguments,
required ones, computed attributes, nested blocks), each file naming its source repository,
release and commit. `terraform validate` would do this with the provider binaries; they cannot be
downloaded here, so this is the check that runs. It lists every problem, not the first.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from spotorch.operate.terraform import Tf, load_tf

SCHEMA_DIR = "provider-schema"
# Provider (the resource's `provider` meta-argument, else its type's prefix) -> schema file.
SCHEMA_FILES: Mapping[str, str] = {
    "google": "google-6.50.0.json",
    "google-beta": "google-beta-6.50.0.json",
    "time": "time-0.x.json",
}
# Meta-arguments Terraform itself takes on every resource and data source.
META_ARGUMENTS = frozenset({"count", "for_each", "depends_on", "provider", "lifecycle"})
BLOCK_MARK = "__is_block__"


@dataclass(frozen=True)
class Schemas:
    """The vendored extracts, by provider; resource type (data sources as data.<type>) -> schema."""

    providers: Mapping[str, Mapping[str, Any]]

    @classmethod
    def load(cls, directory: Path) -> Schemas:
        """Read the vendored schema extracts from their folder."""
        return cls({name: json.loads((directory / file).read_text())
                    for name, file in SCHEMA_FILES.items()})

    def source(self, provider: str) -> str:
        """The provider's repository and version the extract came from, for messages."""
        src = self.providers.get(provider, {}).get("_source", {})
        return f"{src.get('repository', provider)} {src.get('ref', '?')}"


def _provider(rtype: str, body: Mapping[str, Any]) -> str:
    given = str(body.get("provider", "")).strip("${}")
    return given.split(".")[0] if given else rtype.split("_", 1)[0]


def _is_block(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(
        isinstance(v, dict) and v.get(BLOCK_MARK) for v in value)


def _blocks_of(body: Mapping[str, Any]) -> Iterator[tuple[str, dict[str, Any], bool]]:
    """(name, body, dynamic) for each nested block, dynamic ones by the content they make."""
    for key, value in body.items():
        if key == "dynamic" and isinstance(value, list):
            for entry in value:
                for name, spec in entry.items():
                    if name == BLOCK_MARK:
                        continue
                    specs = spec if isinstance(spec, list) else [spec]
                    for one in specs:
                        for content in one.get("content", [{}]):
                            yield name, content, True
        elif _is_block(value):
            for item in value:
                yield key, item, False


def _check_body(where: str, body: Mapping[str, Any], schema: Mapping[str, Any],
                top: bool) -> Iterator[str]:
    arguments = set(schema.get("arguments", ()))
    computed = set(schema.get("attributes", ()))
    blocks: Mapping[str, Any] = schema.get("blocks", {})
    allowed_meta = META_ARGUMENTS if top else frozenset()
    given_blocks: dict[str, int] = {}
    dynamic_blocks: set[str] = set()
    for name, inner, dynamic in _blocks_of(body):
        given_blocks[name] = given_blocks.get(name, 0) + 1
        if dynamic:
            dynamic_blocks.add(name)
        if name == "timeouts" and top and schema.get("timeouts_block"):
            continue
        if name == "lifecycle" and top:
            continue
        if name not in blocks:
            kind = "an argument" if name in arguments else "computed" if name in computed else None
            yield f"{where}: block {name!r} is not in the schema" + (
                f" ({name} is {kind}, not a block)" if kind else "")
            continue
        yield from _check_body(f"{where}.{name}", inner, blocks[name], top=False)
    for name, count in given_blocks.items():
        most = blocks.get(name, {}).get("maxitems")
        if most is not None and name not in dynamic_blocks and count > int(most):
            yield f"{where}: {count} {name!r} blocks, at most {most}"
    for key in body:
        if key in ("dynamic", BLOCK_MARK) or key in given_blocks or key in allowed_meta:
            continue
        if key in arguments:
            continue
        if key in computed:
            yield f"{where}: {key!r} is computed by the provider, it cannot be set"
        elif key in blocks:
            yield f"{where}: {key!r} is a block, written as an argument"
        else:
            yield f"{where}: argument {key!r} is not in the schema"
    for name in schema.get("required", ()):
        if name not in body and name not in given_blocks:
            yield f"{where}: required {name!r} is missing"


def problems(directory: Path, schemas: Schemas | None = None, tf: Tf | None = None) -> list[str]:
    """Every resource, data source, argument and block of directory/*.tf the schemas lack."""
    schemas = schemas or Schemas.load(directory / SCHEMA_DIR)
    tf = tf or load_tf(directory, explicit_blocks=True)
    found: list[str] = []
    for kind, prefix, everything in (("resource", "", tf.resources), ("data", "data.", tf.data)):
        for rtype, named in sorted(everything.items()):
            for name, body in sorted(named.items()):
                provider = _provider(rtype, body)
                known = schemas.providers.get(provider)
                where = f"{prefix}{rtype}.{name}"
                if known is None:
                    found.append(f"{where}: provider {provider!r} has no schema in {SCHEMA_DIR}/")
                    continue
                schema = known.get(f"{prefix}{rtype}")
                if schema is None:
                    found.append(f"{where}: {kind} type {rtype} is not in {schemas.source(provider)}")
                    continue
                found.extend(_check_body(where, body, schema, top=True))
    return found
