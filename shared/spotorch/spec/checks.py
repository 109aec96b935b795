"""What the schema cannot say of a pipeline file: semantic checks, secrets, settings without effect."""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from spotorch.core.events import EVENT_KINDS, TYPE_PREFIX
from spotorch.core.fields import format_duration, parse_duration
from spotorch.core.pipeline import (
    BUILTIN_IGNORE,
    POOL_POSITIONS,
    REDUCTION_SERVER_IMAGE,
    RESERVED_PREPROCESS_OPTIONS,
    BatchMode,
    EscalationKind,
    PoolRole,
    RecoveryPolicy,
    Trigger,
)
from spotorch.core.table_changes import query_problems
from spotorch.core.triggers import ignore_rule, split_gs_uri
from spotorch.spec.promotion_checks import check_promotion
from spotorch.spec.yaml_source import join_path

DEFAULT_IGNORE: tuple[str, ...] = BUILTIN_IGNORE  # always on; files add to them
RESERVED_ENV_PREFIXES = ("SPOTORCH_", "AIP_")  # set by spotorch and by Vertex AI on every worker
# spotorch_run, spotorch_attempt, ... (and the hyphenated keys of earlier releases)
RESERVED_LABEL_PREFIXES = ("spotorch_", "spotorch-")


# --- semantic checks (what the schema cannot say) -------------------------------------------------


def _get(doc: Any, path: str) -> Any:
    node = doc
    for part in path.split("."):
        if not isinstance(node, Mapping):
            return None
        node = node.get(part)
    return node


def _duration(doc: Any, path: str) -> float | None:
    value = _get(doc, path)
    try:
        return None if value is None else parse_duration(value)
    except ValueError:
        return None  # the schema reports it


def _str(doc: Any, path: str, default: str = "") -> str:
    value = _get(doc, path)
    return value if isinstance(value, str) else default


def _items(doc: Any, path: str) -> list[Any]:
    value = _get(doc, path)
    return value if isinstance(value, list) else []


_Found = Iterator[tuple[str, str]]

_POSITIVE_DURATIONS = ("deadline", "trigger.quiet_period", "job.timeout", "job.flex_max_wait",
                       "recovery.stockout_wait", "recovery.expected_compute")


def _check_positive_durations(doc: Any) -> _Found:
    for path in _POSITIVE_DURATIONS:
        if _duration(doc, path) == 0:
            yield path, "must be longer than zero"


def _check_deadline(doc: Any) -> _Found:
    deadline = _duration(doc, "deadline")
    compute = _duration(doc, "recovery.expected_compute")
    overhead = _duration(doc, "recovery.restart_overhead")
    overhead = RecoveryPolicy.restart_overhead_s if overhead is None else overhead
    if deadline and compute and deadline < compute + overhead:
        yield "deadline", (f"{format_duration(deadline)} is shorter than recovery.expected_compute "
                           f"({format_duration(compute)}) plus one start "
                           f"(restart_overhead {format_duration(overhead)}): it cannot be met even "
                           "on standard VMs")


def _check_backoff(doc: Any) -> _Found:
    base, cap = _duration(doc, "recovery.backoff_base"), _duration(doc, "recovery.backoff_cap")
    base = RecoveryPolicy.backoff_base_s if base is None else base
    cap = RecoveryPolicy.backoff_cap_s if cap is None else cap
    if base > cap:
        yield "recovery.backoff_base", (f"{format_duration(base)} is longer than backoff_cap "
                                        f"({format_duration(cap)})")


# Trigger option -> the batch mode it belongs to.
_BATCH_OPTIONS = {"marker": "marker", "manifest": "marker", "quiet_period": "quiet_period",
                  "min_objects": "min_objects"}


def _check_batch_options(doc: Any) -> _Found:
    trigger = _get(doc, "trigger")
    if not isinstance(trigger, Mapping):
        return
    batch = trigger.get("batch", BatchMode.EACH_OBJECT.value)
    for option, mode in _BATCH_OPTIONS.items():
        if option in trigger and trigger[option] is not False and batch != mode:
            yield f"trigger.{option}", f"only applies when batch is {mode} (here it is {batch})"
    depth = trigger.get("snapshot_depth", Trigger.snapshot_depth)
    if batch == BatchMode.EACH_OBJECT and "snapshot_depth" in trigger:
        yield "trigger.snapshot_depth", "has no effect with batch: each_object (every object is " \
                                        "its own snapshot)"
    if batch in (BatchMode.QUIET_PERIOD, BatchMode.MIN_OBJECTS) and depth == 0:
        yield "trigger.snapshot_depth", (
            f"must be at least 1 when batch is {batch}: the prefix itself would be one snapshot "
            "that completes once, and files added later count as late (use one folder per "
            "delivery, batch: marker, or batch: each_object)")


def _check_ignore(doc: Any) -> _Found:
    extra = [p for p in _items(doc, "trigger.ignore") if isinstance(p, str)]
    for i, pattern in enumerate(extra):
        if not pattern.strip("*/"):
            yield f"trigger.ignore[{i}]", f"{pattern!r} ignores every object"
    if _get(doc, "trigger.batch") != BatchMode.MARKER:
        return
    marker = _str(doc, "trigger.marker", Trigger.marker)
    depth = _get(doc, "trigger.snapshot_depth")
    depth = depth if isinstance(depth, int) and 0 <= depth <= 16 else Trigger.snapshot_depth
    trigger = Trigger(bucket="-", ignore=DEFAULT_IGNORE + tuple(extra))
    example = _str(doc, "trigger.prefix") + "snapshot/" * depth + marker
    rule = ignore_rule(trigger, example)
    if rule is not None:
        yield "trigger.marker", (f"{marker!r} matches the ignore rule {rule!r} ({example}): the "
                                 "snapshot would never complete")


# Options of a Cloud Storage trigger that mean nothing to a BigQuery one.
_GCS_ONLY = ("prefix", "glob", "suffixes", "ignore", "batch", "marker", "manifest",
             "quiet_period", "min_objects", "snapshot_depth")


def _check_source(doc: Any) -> _Found:
    trigger = _get(doc, "trigger")
    if not isinstance(trigger, Mapping):
        return
    has_bucket, has_bigquery = "bucket" in trigger, trigger.get("bigquery") is not None
    if has_bucket == has_bigquery:
        yield "trigger", ("needs exactly one source: bucket (Cloud Storage) or bigquery "
                          f"(here: {'both' if has_bucket else 'neither'})")
    if not has_bigquery:
        return
    for option in _GCS_ONLY:
        if option in trigger:
            where = ("bigquery.quiet_period" if option == "quiet_period" else "bucket")
            yield f"trigger.{option}", f"applies to a Cloud Storage trigger only (see {where})"
    query = _get(doc, "trigger.bigquery.query")
    if isinstance(query, str) and query.strip():
        tables = [t for t in _items(doc, "trigger.bigquery.tables") if isinstance(t, str)]
        for problem in query_problems(query, tables):
            yield "trigger.bigquery.query", problem
    else:  # a snapshot table and an export folder per table, named after the table
        named: dict[str, str] = {}
        for table in _items(doc, "trigger.bigquery.tables"):
            if not isinstance(table, str):
                continue
            leaf = table.rsplit(".", 1)[-1]
            if leaf in named and named[leaf] != table:
                yield "trigger.bigquery.tables", (
                    f"{named[leaf]} and {table} share the table name {leaf!r}: their snapshot "
                    "tables and exports would be one; watch them from two pipelines, or snapshot "
                    "them through a query")
            named.setdefault(leaf, table)
    export = _str(doc, "trigger.bigquery.export_uri")
    for path in _OWN_URIS:
        uri = _str(doc, path)
        if export.startswith("gs://") and uri.startswith("gs://") and (
                export.rstrip("/") + "/").startswith(uri.rstrip("/") + "/"):
            yield "trigger.bigquery.export_uri", (f"lies inside {path} ({uri}): keep the "
                                                  "exports apart from the pipeline's outputs")


_OWN_URIS = ("checkpoint_uri", "output_uri", "job.base_output_uri")


def _check_overlap(doc: Any) -> _Found:
    bucket, prefix = _str(doc, "trigger.bucket"), _str(doc, "trigger.prefix")
    if not bucket:
        return
    for path in _OWN_URIS:
        uri = _str(doc, path)
        if not uri.startswith("gs://"):
            continue
        own_bucket, own = split_gs_uri(uri)
        if own_bucket != bucket:
            continue
        if prefix.startswith(own):
            yield path, (f"the trigger (gs://{bucket}/{prefix}) lies inside {uri}: objects there "
                         "are the pipeline's own output and never start a run")
        elif own.startswith(prefix):
            yield path, (f"{uri} lies inside the trigger (gs://{bucket}/{prefix}): keep a "
                         "pipeline's own writes out of the folder it watches")


_PATTERN_LISTS = ("preemption_patterns", "infra_patterns", "timeout_patterns", "quota_patterns")


def _check_regexes(doc: Any) -> _Found:
    lists = [f"recovery.{name}" for name in _PATTERN_LISTS] + ["health.oom_patterns"]
    for path in lists:
        for i, pattern in enumerate(_items(doc, path)):
            if isinstance(pattern, str):
                try:
                    re.compile(pattern)
                except re.error as exc:
                    yield f"{path}[{i}]", f"not a valid regular expression: {exc}"


def _check_pools(doc: Any) -> _Found:
    pools = [p if isinstance(p, Mapping) else {} for p in _items(doc, "job.worker_pools")]
    chief = pools[0].get("replica_count", 1) if pools else 1
    if isinstance(chief, int) and not isinstance(chief, bool) and chief != 1:
        yield "job.worker_pools[0].replica_count", "must be 1: the first pool is the chief"
    yield from _check_roles(pools)
    for i, pool in enumerate(pools):
        where = f"job.worker_pools[{i}]"
        kind, count = pool.get("accelerator_type"), pool.get("accelerator_count", 0)
        if kind and not count:
            yield f"{where}.accelerator_count", "must be at least 1 when accelerator_type is set"
        if count and not kind:
            yield f"{where}.accelerator_type", "is required when accelerator_count is set"
        yield from _check_code(doc, where, pool)
        env = pool.get("env")
        for key in env if isinstance(env, Mapping) else ():
            if str(key).startswith(RESERVED_ENV_PREFIXES):
                reserved = " and ".join(f"{p}*" for p in RESERVED_ENV_PREFIXES)
                yield f"{where}.env.{key}", f"is reserved: spotorch and Vertex AI set {reserved}"


_ORDER = "Vertex AI's order is chief, workers, reduction_server or parameter_servers, evaluator"


def _check_roles(pools: list[Mapping[str, Any]]) -> _Found:
    """Roles in Vertex AI's pool order (one pool per place); a reduction server on its image."""
    roles = {r.value: r for r in PoolRole}
    last = -1
    for i, pool in enumerate(pools):
        where = f"job.worker_pools[{i}]"
        named = pool.get("role")
        role = roles.get(named) if isinstance(named, str) else None
        if named is not None and role is None:
            continue  # the schema names the allowed values
        if i == 0 and role not in (None, PoolRole.CHIEF):
            yield f"{where}.role", "must be chief: Vertex AI's first pool is the primary replica"
        place = POOL_POSITIONS[role] if role is not None else last + 1
        if place <= last or place > 3:
            yield f"{where}.role", (f"{named or 'this pool'!s} cannot come here: {_ORDER}, one "
                                    "pool each (name the roles of pools you skip to)"
                                    if named else f"a fifth place does not exist: {_ORDER}")
        last = max(last, place)
        if role is PoolRole.REDUCTION_SERVER:
            yield from _check_reduction_server(where, pool)


def _check_reduction_server(where: str, pool: Mapping[str, Any]) -> _Found:
    if pool.get("image_uri") != REDUCTION_SERVER_IMAGE or pool.get("python_package"):
        yield f"{where}.image_uri", (f"a reduction_server pool runs Vertex AI's image "
                                     f"{REDUCTION_SERVER_IMAGE} (no python_package)")
    if pool.get("accelerator_type") or pool.get("accelerator_count"):
        yield f"{where}.accelerator_type", ("a reduction_server pool has no accelerators: "
                                            "Reduction Server replicas are CPU machines")
    if pool.get("command") or pool.get("args"):
        yield f"{where}.command", "a reduction_server pool runs its image's own command"


_PACKAGE_FROM = ("source", "package", "package_uri")


def _check_code(doc: Any, where: str, pool: Mapping[str, Any]) -> _Found:
    """A pool runs an image or a Python package on a prebuilt container: one of the two."""
    package = pool.get("python_package")
    if bool(pool.get("image_uri")) == bool(package):
        yield where, ("needs image_uri (your image) or python_package (your code on a prebuilt "
                      "container), not both" if package else "needs image_uri or python_package")
    if not isinstance(package, Mapping):
        return
    given = [k for k in _PACKAGE_FROM if package.get(k)]
    if len(given) != 1:
        yield f"{where}.python_package", ("needs exactly one of source, package, package_uri"
                                          + (f" (got {', '.join(given)})" if given else ""))
    if given and given[0] != "package_uri" and not _str(doc, "job.staging_uri"):
        yield "job.staging_uri", (f"is required by {where}.python_package.{given[0]}: spotorch "
                                  "stores the packages it builds there")
    image = package.get("executor_image_uri")
    if isinstance(image, str) and image and not training_container(image):
        yield f"{where}.python_package.executor_image_uri", (
            f"{image!r} is not one of Vertex AI's prebuilt training containers this spotorch "
            f"knows ({TRAINING_CONTAINERS_FILE.name}), e.g. "
            f"us-docker.pkg.dev/vertex-ai/training/{_containers()['images'][0]}")


TRAINING_CONTAINERS_FILE = Path(__file__).resolve().parent / "training_containers.json"


@functools.cache
def _containers() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(TRAINING_CONTAINERS_FILE.read_text())
    return loaded


def training_container(uri: str) -> bool:
    """Whether uri is a Vertex AI prebuilt training container of the shipped list."""
    table = _containers()
    host, _, rest = uri.partition("/")
    repository = str(table["repository"]) + "/"
    return host in table["hosts"] and rest.startswith(repository) \
        and rest.removeprefix(repository) in table["images"]


def _check_candidates(doc: Any) -> _Found:
    candidates = [c if isinstance(c, Mapping) else {}
                  for c in _items(doc, "hardware.candidates")]
    seen: set[str] = set()
    for i, candidate in enumerate(candidates):
        where = f"hardware.candidates[{i}]"
        name = candidate.get("name")
        if isinstance(name, str) and name in seen:
            yield f"{where}.name", f"{name!r} is already the name of another candidate"
        seen.add(str(name))
        kind, count = candidate.get("accelerator_type"), candidate.get("accelerator_count", 0)
        if kind and not count:
            yield f"{where}.accelerator_count", "must be at least 1 when accelerator_type is set"
        if count and not kind:
            yield f"{where}.accelerator_type", "is required when accelerator_count is set"
        if candidate.get("tpu_topology") and not str(kind or "").startswith("TPU_"):
            yield f"{where}.tpu_topology", "applies only to a TPU accelerator_type"
        env = candidate.get("env")
        for key in env if isinstance(env, Mapping) else ():
            if str(key).startswith(RESERVED_ENV_PREFIXES):
                reserved = " and ".join(f"{p}*" for p in RESERVED_ENV_PREFIXES)
                yield f"{where}.env.{key}", f"is reserved: spotorch and Vertex AI set {reserved}"


def _check_labels(doc: Any) -> _Found:
    labels = _get(doc, "job.labels")
    for key in labels if isinstance(labels, Mapping) else ():
        if str(key).startswith(RESERVED_LABEL_PREFIXES):
            yield f"job.labels.{key}", ("is reserved: spotorch sets the spotorch_* labels "
                                        "(spotorch-* too, from earlier releases)")


def _selects_some_kind(pattern: str) -> bool:
    """Mirrors notify.route_matches: '*', fnmatch, a dot-bounded suffix, or the full type."""
    from fnmatch import fnmatchcase

    if pattern.startswith(TYPE_PREFIX):
        pattern = pattern[len(TYPE_PREFIX):].rsplit(".", 1)[0]
    return pattern == "*" or any(fnmatchcase(kind, pattern) or kind.endswith(f".{pattern}")
                                 for kind in EVENT_KINDS)


def _check_routes(doc: Any) -> _Found:
    for i, route in enumerate(_items(doc, "routes")):
        if not isinstance(route, Mapping):
            continue
        events = route.get("events")
        for j, pattern in enumerate(events if isinstance(events, list) else ()):
            if isinstance(pattern, str) and not _selects_some_kind(pattern):
                yield f"routes[{i}].events[{j}]", (f"{pattern!r} selects no spotorch event "
                                                   f"(kinds: {', '.join(EVENT_KINDS)})")
        target = route.get("target")
        if isinstance(target, str) and "@" in target and route.get("channel") != "email" \
                and "://" not in target:
            yield f"routes[{i}].target", "addresses are for email routes; name an environment " \
                                         "variable or an sm:// secret"


# --- secrets -------------------------------------------------------------------------------------

_SECRET_KEY = re.compile(r"(?i)(passw(or)?d|passwd|secret|token|api[_-]?key|apikey|private[_-]?key"
                         r"|credential|webhook)")
_SECRET_REFERENCE = re.compile(r"^(sm://)?projects/[^/]+/secrets/[^/]+(/versions/[^/]+)?$")
# Value pattern -> what it looks like. Checked on every string in the file.
_SECRET_VALUES: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"https://hooks\.slack\.com/"), "a Slack webhook URL"),
    (re.compile(r"https://chat\.googleapis\.com/v1/spaces/"), "a Google Chat webhook URL"),
    (re.compile(r"(?i)https?://\S*webhook"), "a webhook URL"),
    (re.compile(r"(?i)https?://\S*[?&](key|token|sig|signature|secret|password|access_token|"
                r"api_key)="), "a URL carrying a credential"),
    (re.compile(r"://[^/\s:@]+:[^/\s@]+@"), "a URL with a password"),
    (re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----"), "a private key"),
    (re.compile(r"\bxox[abprs]-[0-9A-Za-z-]{10,}"), "a Slack token"),
    (re.compile(r"\bgh[pousr]_[0-9A-Za-z]{30,}"), "a GitHub token"),
    (re.compile(r"\bAIza[0-9A-Za-z_-]{35}"), "a Google API key"),
    (re.compile(r"\bAKIA[0-9A-Z]{16}\b"), "an AWS access key"),
)
_NO_SECRETS = ("secrets never go in pipeline files: keep it in Secret Manager (or the functions' "
               "environment) and name it, e.g. routes[].target: CHAT_WEBHOOK_URL or "
               "sm://projects/P/secrets/S")


def _walk(node: Any, path: str = "") -> Iterator[tuple[str, Any, Any]]:
    """(path, key, value) of every field and list item below node."""
    items = node.items() if isinstance(node, Mapping) else \
        enumerate(node) if isinstance(node, list) else ()
    for key, value in items:
        child = join_path(path, key)
        yield child, key, value
        yield from _walk(value, child)


def check_secrets(doc: Any) -> _Found:
    """Fields that look like secrets, by key or value: a file holds only references to them."""
    for path, key, value in _walk(doc):
        if isinstance(key, str) and _SECRET_KEY.search(key) and not (
                isinstance(value, str) and _SECRET_REFERENCE.match(value)):
            yield path, f"{key!r} looks like a secret; {_NO_SECRETS}"
            continue
        if isinstance(value, str):
            what = next((w for pattern, w in _SECRET_VALUES if pattern.search(value)), None)
            if what:
                yield path, f"looks like {what} (value not shown); {_NO_SECRETS}"


# --- warnings: settings that have no effect ------------------------------------------------------


def _escalation(doc: Any) -> str:
    value = _get(doc, "recovery.escalation")
    return value if isinstance(value, str) else EscalationKind.DEADLINE.value


def _set(doc: Any, path: str) -> bool:
    parent, _, key = path.rpartition(".")
    node = _get(doc, parent) if parent else doc
    return isinstance(node, Mapping) and key in node


# (field that is set, escalations under which it does nothing, why).
_NO_EFFECT: tuple[tuple[str, frozenset[str], str], ...] = (
    ("recovery.escalate_after_preemptions",
     frozenset({"never", "deadline", "always_standard"}),
     "only escalation: count uses it"),
    ("deadline", frozenset({"count"}),
     "the count policy ignores deadlines: it moves to standard VMs after "
     "escalate_after_preemptions preemptions whatever the time left (use escalation: deadline "
     "to let the deadline decide)"),
    ("recovery.stockout_wait", frozenset({"always_standard"}),
     "escalation: always_standard never queues for Spot VMs"),
    ("recovery.spot_cooldown", frozenset({"always_standard"}),
     "escalation: always_standard never moves to Spot VMs"),
    ("recovery.spot_probes", frozenset({"never", "count", "always_standard"}),
     "only the deadline policy weighs a probe's answer (policy.probe_worth)"),
)


def no_effect(doc: Any) -> _Found:
    """Settings the pipeline's escalation policy ignores."""
    escalation = _escalation(doc)
    for path, escalations, why in _NO_EFFECT:
        if escalation in escalations and _set(doc, path):
            yield path, f"has no effect with escalation: {escalation}; {why}"


def _check_preprocess(doc: Any) -> _Found:
    """A preprocess step runs a module of the code package or a flex template: one of the two."""
    step = _get(doc, "preprocess")
    if not isinstance(step, Mapping):
        return
    module, template = step.get("python_module"), step.get("template_uri")
    if bool(module) == bool(template):
        yield "preprocess", ("needs python_module (a Beam pipeline in your code package) or "
                             "template_uri (your flex template), not both" if module else
                             "needs python_module or template_uri")
    trigger = _get(doc, "trigger")
    if isinstance(trigger, Mapping) and trigger.get("bigquery") is not None:
        # The step's workers are granted the landing buckets only (deploy/iam.tf), and its cache
        # key lists a landing folder: a BigQuery export as its input is not built.
        yield "preprocess", ("cannot follow a trigger.bigquery yet: a preprocess step reads a "
                             "Cloud Storage trigger's snapshot")
    if module:
        pools = _items(doc, "job.worker_pools")
        chief = pools[0] if pools and isinstance(pools[0], Mapping) else {}
        if not isinstance(chief.get("python_package"), Mapping):
            yield "preprocess.python_module", (
                "needs the chief pool's python_package (job.worker_pools[0].python_package): "
                "the Beam module is run from that code package")
    options = step.get("options")
    if isinstance(options, Mapping):
        for name in options:
            if name in RESERVED_PREPROCESS_OPTIONS:
                yield f"preprocess.options.{name}", ("is set by spotorch on every launch "
                                                     "(region, workers, input, output, ...)")
    if _duration(doc, "preprocess.timeout") == 0:
        yield "preprocess.timeout", "must be longer than zero"
    yield from _check_spark_step(step)


# Spark properties a Dataproc Serverless batch's runtime sets itself (the driver runs in its
# cluster): spotorch refuses them in the file rather than let the batch fail at creation.
SPARK_SET_PROPERTIES = ("spark.master", "spark.submit.deployMode")


def _check_spark_step(step: Mapping[str, Any]) -> _Found:
    """kind: spark runs a module of the code package; Spark-only settings need that kind."""
    if step.get("kind") == "spark":
        if step.get("template_uri"):
            yield "preprocess.template_uri", ("is a Dataflow flex template: a spark step runs "
                                              "python_module as a PySpark batch")
        properties = step.get("properties")
        if isinstance(properties, Mapping):
            for name in properties:
                if name in SPARK_SET_PROPERTIES:
                    yield f"preprocess.properties.{name}", ("is set by Dataproc Serverless "
                                                            "itself")
        return
    for name in ("runtime_version", "properties"):
        if step.get(name):
            yield f"preprocess.{name}", "applies to kind: spark only"


def _check_sweep(doc: Any) -> _Found:
    """Several objectives replace metric and goal; vizier needs a trial budget; bounds make sense."""
    sweep = _get(doc, "sweep")
    if not isinstance(sweep, Mapping):
        return
    metrics = sweep.get("metrics") or []
    if metrics and ("metric" in sweep or "goal" in sweep):
        yield "sweep.metrics", "replaces metric and goal: give one or the other"
    names = [m.get("name") for m in metrics if isinstance(m, Mapping)]
    for name in sorted({n for n in names if names.count(n) > 1 and isinstance(n, str)}):
        yield "sweep.metrics", f"names {name} twice"
    if sweep.get("search") == "vizier" and not sweep.get("trials"):
        yield "sweep.trials", "a vizier search needs a number of trials (its budget)"
    for metric, bound in (sweep.get("constraints") or {}).items():
        if not isinstance(bound, Mapping):
            continue
        if bound.get("max") is None and bound.get("min") is None:
            yield f"sweep.constraints.{metric}", "needs max, min or both"
        elif (isinstance(bound.get("max"), int | float) and isinstance(bound.get("min"), int | float)
              and bound["min"] > bound["max"]):
            yield f"sweep.constraints.{metric}", "min is above max: no trial can meet it"


CHECKS: tuple[Callable[[Any], _Found], ...] = (
    _check_positive_durations, _check_deadline, _check_backoff, _check_batch_options,
    _check_ignore, _check_overlap, _check_source, _check_regexes, _check_pools, _check_labels,
    _check_routes, _check_candidates, _check_preprocess, check_promotion, _check_sweep,
)
