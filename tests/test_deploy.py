"""deploy/ against the code it deploys: entry points, topics, environment, secrets, indexes, TTL,
IAM, dead letters and retries; and the offline packaging. Each check also runs on a doctored copy
of deploy/ (or of the code's contract) to show that it can fail."""

from __future__ import annotations

import ast
import base64
import contextlib
import importlib
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from spotorch import settings
from spotorch.operate.permissions import Identity, permissions_of
from spotorch.operate.terraform import (
    Instance,
    Tf,
    block,
    dependency_graph,
    depends_on,
    dynamic,
    instances,
    load_tf,
)

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
MAIN = ROOT / "functions" / "main.py"
SPOTORCH = ROOT / "shared" / "spotorch"


def _load_packager() -> Any:
    """deploy/package.py, under a name that cannot clash with another `package` module."""
    spec = importlib.util.spec_from_file_location("spotorch_deploy_package", DEPLOY / "package.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


package = _load_packager()

# What the functions' entry points are and what feeds them (the issue's contract).
EXPECTED_ENTRY_POINTS = frozenset({"on_object_finalized", "on_job_event", "on_tick",
                                   "on_run_event", "on_table_changed", "api"})
EXPECTED_FEEDS = frozenset({(settings.TOPIC_JOB_EVENTS, "on_job_event"),
                            (settings.TOPIC_TRAINER_EVENTS, "on_job_event"),
                            (settings.TOPIC_TICK, "on_tick"),
                            (settings.TOPIC_EVENTS, "on_run_event")})
LOCAL_ONLY_TOPICS = frozenset({settings.TOPIC_GCS_NOTIFICATIONS})
HTTP_ENTRY_POINTS = frozenset({"api"})
NOTIFIER = "on_run_event"
MAX_EVENT_TIMEOUT_S = 540
# Used when store_firestore.py does not say (the queries the issue describes).
# Project-level roles deploy/ may grant, and why no narrower grant exists.
PROJECT_ROLES = {
    "roles/datastore.user": "Firestore has no per-collection IAM (narrowed by a condition)",
    "roles/eventarc.eventReceiver": "exists only at project level",
    "roles/logging.logWriter": "log entries are written to the project",
    "roles/monitoring.viewer": "time series are read from the project (a canary's traffic)",
    "roles/pubsub.publisher": "the GCS service agent publishes to Eventarc's own topic",
    "${local.vertex_role}": "Vertex AI custom jobs are project resources",
    "roles/eventarc.serviceAgent": "the Eventarc service agent's own role, granted before triggers",
    "roles/logging.viewer": "log entries are read from the project (worker logs, `spotorch logs`)",
    "roles/datastore.viewer": "operators read runs (narrowed by a condition, like datastore.user)",
    "roles/dataflow.developer": "Dataflow jobs are project resources (preprocess steps)",
    "${local.dataflow_role}": "Dataflow jobs are project resources (a custom role by default)",
    "roles/dataflow.worker": "Dataflow work items are leased in the project (preprocess workers)",
    "${google_project_iam_custom_role.dataproc_batches[0].name}":
        "Dataproc batches are project resources (a custom role: the batch calls spotorch makes)",
    "roles/dataproc.worker": "Dataproc Serverless runs a Spark step's batch in the project",
    "${google_project_iam_custom_role.bigquery_jobs[0].name}":
        "BigQuery jobs are project resources (a custom role: jobs.create and jobs.get only)",
}
# Roles on service accounts: acting as the training identity (or a pipeline's own job identity),
# and Pub/Sub minting push tokens for the functions identity.
SERVICE_ACCOUNT_GRANTS = (
    ("roles/iam.serviceAccountUser", r"google_service_account\.training\.name"),
    ("roles/iam.serviceAccountUser", r"google_service_account\.dataflow\.name"),
    ("roles/iam.serviceAccountUser", r"google_service_account\.dataproc\.name"),
    ("roles/iam.serviceAccountUser", r"^projects/-/serviceAccounts/\$\{each\.value\} for "
                                     r"\$\{toset\(var\.pipeline_service_accounts\)\}$"),
    ("roles/iam.serviceAccountTokenCreator", r"google_service_account\.functions\.name"),
    ("roles/iam.serviceAccountTokenCreator", r"google_service_account\.notifier\.name"),
)
BROAD_ROLE = re.compile(r"^roles/(owner|editor|viewer|browser)$|\.admin$|Admin$|^roles/iam\.|"
                        r"^roles/resourcemanager\.")
PUBLIC_MEMBERS = frozenset({"allUsers", "allAuthenticatedUsers"})
# Vertex's own job-state lines, not the containers' output (FACTS: gcloud's stream-logs code).
JOB_LOG_FILTER = 'resource.type="ml_job" AND resource.labels.task_name="service"'
# Eventarc's service agent needs time after it is granted its role (provider issue #25294).
EVENTARC_AGENT_WAIT_S = 60
# Functions fed by bursts (a zone preempting every job, a snapshot's shards landing together):
# Cloud Run's default cap is 100; far below it a burst turns into 429s that use up deliveries.
BURST_TOPICS = frozenset({settings.TOPIC_JOB_EVENTS, settings.TOPIC_TRAINER_EVENTS})
MIN_BURST_INSTANCES = 50
# Resource type (prefix) -> the APIs it needs; every type deploy/ uses must be listed.
RESOURCE_APIS: dict[str, frozenset[str]] = {
    "google_project_service": frozenset({"serviceusage.googleapis.com"}),
    "google_project_service_identity": frozenset({"serviceusage.googleapis.com"}),
    "google_project_iam_member": frozenset({"cloudresourcemanager.googleapis.com"}),
    "google_project_iam_custom_role": frozenset({"iam.googleapis.com"}),
    "google_service_account": frozenset({"iam.googleapis.com"}),
    "google_cloudfunctions2_function": frozenset({
        "cloudfunctions.googleapis.com", "cloudbuild.googleapis.com", "run.googleapis.com",
        "artifactregistry.googleapis.com"}),
    "google_cloud_run_v2_service_iam_member": frozenset({"run.googleapis.com"}),
    "google_artifact_registry_repository": frozenset({"artifactregistry.googleapis.com"}),
    "google_storage": frozenset({"storage.googleapis.com"}),
    "google_pubsub": frozenset({"pubsub.googleapis.com"}),
    "google_logging_project_sink": frozenset({"logging.googleapis.com"}),
    "google_logging_metric": frozenset({"logging.googleapis.com"}),
    "google_logging_log_view": frozenset({"logging.googleapis.com"}),
    "google_monitoring": frozenset({"monitoring.googleapis.com"}),
    "google_cloud_scheduler_job": frozenset({"cloudscheduler.googleapis.com"}),
    "google_firestore": frozenset({"firestore.googleapis.com"}),
    "google_secret_manager": frozenset({"secretmanager.googleapis.com"}),
    "google_eventarc_trigger": frozenset({"eventarc.googleapis.com"}),
    "google_bigquery": frozenset({"bigquery.googleapis.com"}),
    "time_sleep": frozenset(),
}
# What the functions call at run time, beyond the resources deploy/ creates.
RUNTIME_APIS = frozenset({"aiplatform.googleapis.com", "dataflow.googleapis.com"})
EVENT_TRIGGER_APIS = frozenset({"eventarc.googleapis.com"})
APIS_RESOURCE = "google_project_service.api"


def functions(tf: Tf) -> list[Instance]:
    return list(instances(tf, "google_cloudfunctions2_function"))


def entry_point(fn: Instance, tf: Tf) -> Any:
    return fn.value(block(fn.body, "build_config").get("entry_point"), tf)


def topic_key(tf: Tf, topic: str) -> str | None:
    """Key of local.topics naming this topic."""
    return next((k for k, v in tf.locals.get("topics", {}).items() if v == topic), None)


def topic_ref(tf: Tf, topic: str) -> str:
    return f'google_pubsub_topic.topic["{topic_key(tf, topic)}"]'


def push_feeds(tf: Tf) -> set[tuple[str, str]]:
    """(topic, entry point) for each function fed by a push subscription of ours."""
    subscribed = {b.get("for_each") for b in tf.resource("google_pubsub_subscription").values()
                  if block(b, "push_config")}
    feeds = set()
    for fn in functions(tf):
        body_for_each = fn.body.get("for_each")
        if body_for_each in subscribed and isinstance(fn.each, dict) and "topic" in fn.each:
            topic = tf.locals.get("topics", {}).get(fn.each["topic"])
            feeds.add((topic, entry_point(fn, tf)))
    return feeds


# --- reading the code's contract ----------------------------------------------------------------

def main_functions(path: Path = MAIN) -> dict[str, tuple[str, ...]]:
    """Top-level functions of functions/main.py and their decorators (dotted names)."""
    if not path.is_file():
        pytest.fail(f"{path} does not exist: deploy/ deploys its entry points")
    tree = ast.parse(path.read_text())
    return {node.name: tuple(ast.unparse(d.func if isinstance(d, ast.Call) else d)
                             for d in node.decorator_list)
            for node in tree.body if isinstance(node, ast.FunctionDef)}


def _module_constants(path: Path) -> dict[str, Any]:
    """Top-level constants of a module, names resolved against earlier string constants."""
    names: dict[str, Any] = {}
    for node in ast.parse(path.read_text()).body:
        target, value = None, None
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target, value = node.targets[0], node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            target, value = node.target, node.value
        if not isinstance(target, ast.Name) or value is None:
            continue
        with contextlib.suppress(ValueError):
            names[target.id] = _literal(value, names)
    return names


def _literal(node: ast.expr, names: Mapping[str, Any]) -> Any:
    if isinstance(node, ast.Name):
        if node.id not in names:
            raise ValueError(node.id)
        return names[node.id]
    if isinstance(node, ast.Tuple | ast.List):
        return tuple(_literal(e, names) for e in node.elts)
    return ast.literal_eval(node)


def spotorch_constant(name: str, root: Path = SPOTORCH) -> Any:
    """A top-level constant from whichever spotorch module defines it (None if none does)."""
    for path in sorted(root.rglob("*.py"), key=lambda p: (p.name != "notify.py", str(p))):
        constants = _module_constants(path)
        if name in constants:
            return constants[name]
    return None


def secret_env_names() -> tuple[str, ...] | None:
    found = spotorch_constant("SECRET_ENV")
    return tuple(found) if found else None


def required_indexes() -> tuple[tuple[str, tuple[str, ...]], ...]:
    """Composite indexes the store declares, plus the single fields it queries."""
    from spotorch.adapters.gcp.firestore import QUERIED_FIELDS, REQUIRED_INDEXES

    return tuple(REQUIRED_INDEXES) + tuple((c, (f,)) for c, f in QUERIED_FIELDS)


def required_ttl() -> set[tuple[str, str]]:
    """Collections whose documents carry a TTL field (settings.RETENTION)."""
    return {(c, f) for c, (f, _) in settings.RETENTION.items() if f}


def _all_constants() -> dict[str, Any]:
    merged: dict[str, Any] = {}
    for path in sorted(SPOTORCH.glob("*.py")):
        merged.update(_module_constants(path))
    return merged


def settings_topics() -> set[str]:
    return {v for k, v in vars(settings).items() if k.startswith("TOPIC_") and isinstance(v, str)}


# --- the checks: each returns what is wrong -------------------------------------------------------

def check_entry_points(tf: Tf, defined: Mapping[str, tuple[str, ...]]) -> list[str]:
    problems = []
    deployed = {}
    for fn in functions(tf):
        ep = entry_point(fn, tf)
        deployed[ep] = fn
        if ep not in defined:
            problems.append(f"function {fn.name}[{fn.key}]: entry point {ep} is not defined "
                            f"in functions/main.py")
    missing = sorted(EXPECTED_ENTRY_POINTS - deployed.keys())
    problems += [f"entry point {ep} is not deployed" for ep in missing]
    return problems


def check_signatures(tf: Tf, defined: Mapping[str, tuple[str, ...]]) -> list[str]:
    """Functions deployed without an event trigger get CloudEvents only if main.py declares them."""
    problems = []
    for fn in functions(tf):
        ep = entry_point(fn, tf)
        if block(fn.body, "event_trigger") or ep in HTTP_ENTRY_POINTS:
            continue
        if "functions_framework.cloud_event" not in defined.get(ep, ()):
            problems.append(f"{ep} is fed by a push subscription (an HTTP function): main.py must "
                            f"declare it @functions_framework.cloud_event")
    return problems


def check_topics(tf: Tf, code_topics: set[str]) -> list[str]:
    problems = []
    topics = tf.resource("google_pubsub_topic").get("topic", {})
    provisioned = set(tf.locals.get("topics", {}).values()) \
        if topics.get("for_each") == "${local.topics}" else set()
    problems += [f"topic {t} (settings.py) is not provisioned"
                 for t in sorted(code_topics - LOCAL_ONLY_TOPICS - provisioned)]
    problems += [f"topic {t} is local-stack only and must not be provisioned"
                 for t in sorted(provisioned & LOCAL_ONLY_TOPICS)]
    feeds = push_feeds(tf)
    problems += [f"nothing delivers {t} to {ep}" for t, ep in sorted(EXPECTED_FEEDS - feeds)]
    sink = tf.resource("google_logging_project_sink").get("job_logs", {})
    if topic_ref(tf, settings.TOPIC_JOB_EVENTS) not in str(sink.get("destination")):
        problems.append(f"the Vertex AI log sink does not route to {settings.TOPIC_JOB_EVENTS}")
    log_filter = tf.variables.get("job_log_filter", {}).get("default", "")
    if 'resource.type="ml_job"' not in log_filter:
        problems.append('the log sink filter does not select resource.type="ml_job"')
    if log_filter != JOB_LOG_FILTER:
        problems.append(f"the log sink filter {log_filter!r} does not select Vertex's service "
                        f"lines: {JOB_LOG_FILTER}")
    tick = tf.resource("google_cloud_scheduler_job").get("tick", {})
    tick_topic = block(tick, "pubsub_target").get("topic_name")
    if topic_ref(tf, settings.TOPIC_TICK) not in str(tick_topic):
        problems.append(f"Cloud Scheduler does not publish to {settings.TOPIC_TICK}")
    env = tf.locals.get("function_env", {})
    for var, topic in ((settings.ENV_EVENTS_TOPIC, settings.TOPIC_EVENTS),
                       (settings.ENV_TRAINER_EVENTS_TOPIC, settings.TOPIC_TRAINER_EVENTS)):
        if topic_ref(tf, topic) not in str(env.get(var)):
            problems.append(f"{var} does not name topic {topic}")
    return problems


def check_env(tf: Tf, names: tuple[str, ...]) -> list[str]:
    env = tf.locals.get("function_env", {})
    problems = [f"{name} (settings.FUNCTION_ENV) is not in local.function_env"
                for name in names if name not in env]
    for fn in functions(tf):
        given = block(fn.body, "service_config").get("environment_variables")
        if not (isinstance(given, str) and given.startswith(("${local.function_env}",
                                                             "${merge(local.function_env"))):
            problems.append(f"function {fn.name}[{fn.key}] does not get local.function_env")
    return problems


def check_secrets(tf: Tf, names: tuple[str, ...] | None) -> list[str]:
    hcl_names = tuple(tf.locals.get("secret_env_names", ()))
    names = names or hcl_names
    problems = [f"{n} (the notifier's SECRET_ENV) is not in local.secret_env_names"
                for n in names if n not in hcl_names]
    plain: set[str] = set(tf.locals.get("function_env", {}))
    for fn in functions(tf):
        given = block(fn.body, "service_config").get("environment_variables")
        if isinstance(given, dict):
            plain |= set(given)
    problems += [f"{n} is set as a plain environment variable" for n in sorted(plain & set(names))]
    secrets = tf.resource("google_secret_manager_secret").get("alert", {}).get("for_each")
    if not _derives_from(tf, secrets, "secret_env_names"):
        problems.append("no Secret Manager secret per name in local.secret_env_names")
    if not _derives_from(tf, tf.locals.get("mounted_secrets"), "secret_env_names"):
        problems.append("local.mounted_secrets is not built from local.secret_env_names")
    readers = tf.resource("google_secret_manager_secret_iam_member").values()
    if not any(_derives_from(tf, r.get("for_each"), "secret_env_names")
               and r.get("role") == "roles/secretmanager.secretAccessor" for r in readers):
        problems.append("the functions cannot read the alert secrets")
    notifiers = 0
    for fn in functions(tf):
        mounts = dynamic(block(fn.body, "service_config"), "secret_environment_variables")
        mounts_secrets = (mounts is not None
                          and "local.mounted_secrets" in str(mounts.get("for_each"))
                          and (not isinstance(fn.each, dict) or fn.each.get("secrets") is True))
        is_notifier = entry_point(fn, tf) == NOTIFIER
        notifiers += is_notifier
        if is_notifier and not mounts_secrets:
            problems.append(f"the notifier {fn.name}[{fn.key}] does not mount the alert secrets")
        if mounts_secrets and not is_notifier:
            problems.append(f"{fn.name}[{fn.key}] mounts alert secrets it does not need")
    if not notifiers:
        problems.append("no notifier function")
    return problems


def _derives_from(tf: Tf, expr: Any, local: str, depth: int = 3) -> bool:
    """Whether an expression uses local.<local>, directly or through other locals."""
    text = str(expr)
    if f"local.{local}" in text:
        return True
    return depth > 0 and any(_derives_from(tf, tf.locals.get(name), local, depth - 1)
                             for name in re.findall(r"\blocal\.(\w+)", text))


def check_indexes(tf: Tf, required: tuple[tuple[str, tuple[str, ...]], ...]) -> list[str]:
    composite = {(v["collection"], tuple(v["fields"]))
                 for v in tf.locals.get("composite_indexes", {}).values()}
    wanted = {(c, tuple(f)) for c, f in required if len(f) > 1}
    problems = [f"composite index {c}({', '.join(f)}) is missing"
                for c, f in sorted(wanted - composite)]
    problems += [f"composite index {c}({', '.join(f)}) is not required by any query"
                 for c, f in sorted(composite - wanted)]
    if composite and tf.resource("google_firestore_index").get("composite", {}).get("for_each") \
            != "${local.composite_indexes}":
        problems.append("google_firestore_index does not provision local.composite_indexes")
    unindexed = {(v["collection"], v["field"]) for v in tf.locals.get("ttl_fields", {}).values()}
    queried = {(c, f[0]) for c, f in required if len(f) == 1}
    problems += [f"{c}.{f} is queried but its single-field index is disabled"
                 for c, f in sorted(queried & unindexed)]
    return problems


def check_ttl(tf: Tf, required: set[tuple[str, str]]) -> list[str]:
    fields = tf.resource("google_firestore_field").get("ttl", {})
    ttl = {(v["collection"], v["field"]) for v in tf.locals.get("ttl_fields", {}).values()} \
        if fields.get("for_each") == "${local.ttl_fields}" and "ttl_config" in fields else set()
    return [f"no TTL policy on {c}.{f}" for c, f in sorted(required - ttl)]


def _iam_grants(tf: Tf) -> Iterator[tuple[str, str, dict[str, Any]]]:
    for rtype, named in tf.resources.items():
        if re.search(r"_iam_(member|binding|policy)$", rtype):
            for name, body in named.items():
                yield rtype, name, body


def check_iam(tf: Tf) -> list[str]:
    problems = []
    for rtype, name, body in _iam_grants(tf):
        where = f"{rtype}.{name}"
        if not rtype.endswith("_iam_member"):
            problems.append(f"{where}: authoritative IAM ({rtype}) would remove others' grants")
            continue
        role, member = str(body.get("role")), str(body.get("member"))
        if member in PUBLIC_MEMBERS or re.search(r"all(Authenticated)?Users", member):
            problems.append(f"{where}: {role} granted to the public")
        if re.fullmatch(r"roles/(owner|editor)", role):
            problems.append(f"{where}: {role} is never needed")
        if rtype == "google_project_iam_member":
            if role not in PROJECT_ROLES or BROAD_ROLE.search(role):
                problems.append(f"{where}: {role} at project level")
            if role.startswith("roles/datastore.") and not block(body, "condition").get("expression"):
                problems.append(f"{where}: {role} is not narrowed to spotorch's database")
            gcs_agent = "google_storage_project_service_account" in member
            if role == "roles/pubsub.publisher" and not gcs_agent:
                problems.append(f"{where}: pubsub.publisher at project level for {member}")
        elif rtype == "google_storage_bucket_iam_member":
            if role not in {"roles/storage.objectViewer", "roles/storage.objectUser",
                            "roles/storage.objectCreator", "roles/storage.objectAdmin"}:
                problems.append(f"{where}: {role} on a bucket")
        elif rtype == "google_service_account_iam_member":
            target = f"{body.get('service_account_id')} for {body.get('for_each')}"
            if not any(role == r and re.search(t, target) for r, t in SERVICE_ACCOUNT_GRANTS):
                problems.append(f"{where}: {role} on {target}")
        elif BROAD_ROLE.search(role):
            problems.append(f"{where}: {role}")
    vertex = tf.locals.get("vertex_role", "")
    if "roles/aiplatform.admin" in vertex:
        problems.append("the Vertex AI role is admin")
    for custom in tf.resource("google_project_iam_custom_role").values():
        perms = custom.get("permissions")
        perms = tf.locals.get(perms[len("${local."):-1], ()) if isinstance(perms, str) else perms
        # exactly the permissions of its family the permission map says the functions need:
        # Vertex AI (spotorchVertexJobs), BigQuery jobs (spotorchBigQueryJobs)
        families = ("bigquery.jobs.", "dataflow.", "dataproc.", "aiplatform.")
        family = next((f for f in families if any(str(p).startswith(f.split(".")[0] + ".")
                                                  for p in perms or ())), "aiplatform.")
        wanted = {p for p in permissions_of(Identity.FUNCTIONS) if p.startswith(family)}
        problems += [f"custom role grants {p}" for p in perms or () if p not in wanted]
        problems += [f"custom role lacks {p}" for p in sorted(wanted - set(perms or ()))]
    return problems


def check_dead_letters(tf: Tf) -> list[str]:
    problems = []
    dlq = topic_ref(tf, settings.TOPIC_DEAD_LETTER)
    holders = 0
    grants = tf.resource("google_pubsub_subscription_iam_member").values()
    for name, sub in tf.resource("google_pubsub_subscription").items():
        if dlq in str(sub.get("topic")):
            holders += 1
            continue
        policy = block(sub, "dead_letter_policy")
        if dlq not in str(policy.get("dead_letter_topic")) \
                or not policy.get("max_delivery_attempts"):
            problems.append(f"subscription {name} has no dead-letter policy "
                            f"to {settings.TOPIC_DEAD_LETTER}")
        if not block(sub, "retry_policy"):
            problems.append(f"subscription {name} has no retry backoff")
        if block(sub, "expiration_policy").get("ttl") != "":
            problems.append(f"subscription {name} expires when idle")
        if not any(f"google_pubsub_subscription.{name}[" in str(g.get("subscription"))
                   and g.get("role") == "roles/pubsub.subscriber"
                   and "local.pubsub_agent" in str(g.get("member")) for g in grants):
            problems.append(f"the Pub/Sub service agent cannot forward dead letters from {name}")
    if not holders:
        problems.append("no subscription keeps the dead letters (a topic alone drops them)")
    publishers = tf.resource("google_pubsub_topic_iam_member").values()
    if not any(dlq in str(p.get("topic")) and p.get("role") == "roles/pubsub.publisher"
               and "local.pubsub_agent" in str(p.get("member")) for p in publishers):
        problems.append("the Pub/Sub service agent cannot publish to the dead-letter topic")
    return problems


def check_retries(tf: Tf) -> list[str]:
    problems = []
    pushed = {str(s.get("for_each")): s for s in tf.resource("google_pubsub_subscription").values()
              if block(s, "push_config")}
    for fn in functions(tf):
        ep = entry_point(fn, tf)
        where = f"function {fn.name}[{fn.key}] ({ep})"
        timeout = fn.value(block(fn.body, "service_config").get("timeout_seconds"), tf)
        trigger = block(fn.body, "event_trigger")
        if trigger:
            if trigger.get("retry_policy") != "RETRY_POLICY_RETRY":
                problems.append(f"{where}: event trigger without retries")
        elif ep not in HTTP_ENTRY_POINTS:
            sub = pushed.get(str(fn.body.get("for_each")))
            if sub is None:
                problems.append(f"{where}: no trigger and no push subscription")
                continue
            push = block(sub, "push_config")
            endpoint = str(push.get("push_endpoint"))
            if f"google_cloudfunctions2_function.{fn.name}[" not in endpoint \
                    or not endpoint.endswith("/${google_pubsub_topic.topic[each.value.topic].id}"):
                problems.append(f"{where}: push endpoint must be the function URL + /<topic id>")
            if not block(push, "oidc_token").get("service_account_email"):
                problems.append(f"{where}: push requests are not authenticated")
            ack = sub.get("ack_deadline_seconds")
            if not isinstance(ack, int) or not isinstance(timeout, int) or ack < timeout:
                problems.append(f"{where}: ack deadline {ack} shorter than the timeout {timeout}")
        too_long = not isinstance(timeout, int) or timeout > MAX_EVENT_TIMEOUT_S
        if ep not in HTTP_ENTRY_POINTS and too_long:
            problems.append(f"{where}: timeout {timeout} above {MAX_EVENT_TIMEOUT_S} s")
    return problems


def check_references(tf: Tf) -> list[str]:
    """What `terraform validate` would catch first: names used but never declared."""
    problems = []
    declared = {f"{t}.{n}" for t, named in tf.resources.items() for n in named}
    data = {f"data.{t}.{n}" for t, named in tf.data.items() for n in named}
    for var in sorted(set(re.findall(r"\bvar\.(\w+)", tf.text)) - set(tf.variables)):
        problems.append(f"var.{var} is not declared")
    for local in sorted(set(re.findall(r"\blocal\.(\w+)", tf.text)) - set(tf.locals)):
        problems.append(f"local.{local} is not declared")
    for ref in sorted(set(re.findall(r"\bdata\.google[\w-]*\.\w+", tf.text)) - data):
        problems.append(f"{ref} is not declared")
    text = re.sub(r"\bdata\.google[\w-]*\.\w+", "", tf.text)
    text = re.sub(r'(resource|data)\s+"[^"]+"\s+"[^"]+"', "", text)
    for ref in sorted(set(re.findall(r"(?<![\w.\"/-])google_[a-z0-9_]+\.[a-z_][a-z0-9_]*", text))
                      - declared):
        problems.append(f"{ref} is not declared")
    return problems


# --- a fresh project: APIs first, service agents ready, a build identity that can build ---------

def enabled_apis(tf: Tf) -> set[str]:
    """local.apis, a toset([...]) of service names."""
    return set(re.findall(r'"([a-z0-9-]+\.googleapis\.com)"', str(tf.locals.get("apis"))))


def _apis_for(rtype: str) -> frozenset[str] | None:
    prefixes = sorted((p for p in RESOURCE_APIS if rtype == p or rtype.startswith(p + "_")),
                      key=len, reverse=True)
    return RESOURCE_APIS[prefixes[0]] if prefixes else None


def check_apis(tf: Tf) -> list[str]:
    """Every API a resource needs is enabled, and every resource waits for the APIs."""
    problems = []
    enabled = enabled_apis(tf)
    if tf.resource("google_project_service").get("api", {}).get("for_each") != "${local.apis}":
        problems.append(f"{APIS_RESOURCE} does not enable local.apis")
    needed: dict[str, set[str]] = {api: {"the functions at run time"} for api in RUNTIME_APIS}
    for rtype, named in tf.resources.items():
        apis = _apis_for(rtype)
        if apis is None:
            problems.append(f"{rtype}: which APIs it needs is not in RESOURCE_APIS")
            continue
        for api in apis:
            needed.setdefault(api, set()).add(rtype)
        if rtype == "google_cloudfunctions2_function" and any(
                block(body, "event_trigger") for body in named.values()):
            for api in EVENT_TRIGGER_APIS:
                needed.setdefault(api, set()).add("event triggers")
    problems += [f"{api} ({', '.join(sorted(users))}) is not enabled in local.apis"
                 for api, users in sorted(needed.items()) if api not in enabled]
    graph = dependency_graph(tf)
    if APIS_RESOURCE not in graph:
        return [*problems, f"{APIS_RESOURCE} is not declared"]
    problems += [f"{address} does not depend on {APIS_RESOURCE}: on a fresh project it may be "
                 f"created before the API it needs" for address in sorted(graph)
                 if address != APIS_RESOURCE and not depends_on(graph, address, APIS_RESOURCE)]
    return problems


def _duration_s(text: Any) -> float:
    units = {"s": 1, "m": 60, "h": 3600}
    parts = re.findall(r"(\d+(?:\.\d+)?)([smh])", str(text))
    return sum(float(n) * units[u] for n, u in parts)


def check_first_apply(tf: Tf) -> list[str]:
    """The Eventarc service agent exists, holds its role and has had time before any trigger."""
    problems = []
    identities = {name: body for name, body in tf.resource("google_project_service_identity").items()
                  if body.get("service") == "eventarc.googleapis.com"}
    if not identities:
        return ["no google_project_service_identity creates the Eventarc service agent"]
    (agent, body), = identities.items()
    address = f"google_project_service_identity.{agent}"
    if body.get("provider") not in ("${google-beta}", "google-beta"):
        problems.append(f"{address} needs the google-beta provider")
    grants = [f"google_project_iam_member.{n}"
              for n, g in tf.resource("google_project_iam_member").items()
              if g.get("role") == "roles/eventarc.serviceAgent" and address in str(g.get("member"))]
    if not grants:
        problems.append("the Eventarc service agent is not granted roles/eventarc.serviceAgent")
    graph = dependency_graph(tf)
    waits = [f"time_sleep.{n}" for n, s in tf.resource("time_sleep").items()
             if _duration_s(s.get("create_duration")) >= EVENTARC_AGENT_WAIT_S
             and all(depends_on(graph, f"time_sleep.{n}", g) for g in grants or [address])]
    for name, sleep in tf.resource("time_sleep").items():
        if f"time_sleep.{name}" not in waits and depends_on(graph, f"time_sleep.{name}", address):
            problems.append(f"time_sleep.{name} waits {sleep.get('create_duration')}, less than "
                            f"{EVENTARC_AGENT_WAIT_S}s after the agent's role")
    if not waits:
        problems.append("nothing waits for the Eventarc service agent's role to propagate")
    for name, fn in tf.resource("google_cloudfunctions2_function").items():
        if block(fn, "event_trigger") and not any(
                depends_on(graph, f"google_cloudfunctions2_function.{name}", w) for w in waits):
            problems.append(f"google_cloudfunctions2_function.{name} (an Eventarc trigger) does "
                            f"not wait for the Eventarc service agent")
    return problems


def check_build_identity(tf: Tf) -> list[str]:
    """Every function builds as a service account of ours with its narrow grants, and waits for
    them (spotorch deploy check's own check: operate/deploy_readiness.py)."""
    from spotorch.operate.deploy_readiness import check_build_account

    return check_build_account(tf)


def check_scaling(tf: Tf) -> list[str]:
    """Every function has a cap; the ones fed by bursts have room for them."""
    problems = []
    for fn in functions(tf):
        where = f"function {fn.name}[{fn.key}] ({entry_point(fn, tf)})"
        cap = fn.resolved(block(fn.body, "service_config").get("max_instance_count"), tf)
        if not isinstance(cap, int):
            problems.append(f"{where}: max_instance_count {cap!r} is not a number")
            continue
        topic = tf.locals.get("topics", {}).get(fn.each.get("topic")) \
            if isinstance(fn.each, dict) else None
        bursty = bool(block(fn.body, "event_trigger")) or topic in BURST_TOPICS
        if bursty and cap < MIN_BURST_INSTANCES:
            problems.append(f"{where}: max_instance_count {cap} is below {MIN_BURST_INSTANCES}; "
                            f"bursts become 429s")
    return problems


def check_labels(tf: Tf) -> list[str]:
    """Label keys as Vertex filters show them: lowercase, digits and underscores."""
    problems = []
    for rtype, named in tf.resources.items():
        for name, body in named.items():
            labels = body.get("labels")
            if isinstance(labels, dict):
                problems += [f"{rtype}.{name}: label key {key} is not lowercase_with_underscores"
                             for key in labels if not re.fullmatch(r"[a-z][a-z0-9_]{0,62}", key)]
    problems += [f"{key} in deploy/ is the old label key; jobs carry {key.replace('-', '_')}"
                 for key in sorted(set(re.findall(r"spotorch-(?:run|attempt|pipeline)\b",
                                                  tf.text)))]
    return problems


# --- the real deploy/ passes every check ---------------------------------------------------------

@pytest.fixture(scope="module")
def tf() -> Tf:
    return load_tf(DEPLOY)


@pytest.fixture(scope="module")
def defined() -> dict[str, tuple[str, ...]]:
    return main_functions()


def test_entry_points_exist(tf: Tf, defined: dict[str, tuple[str, ...]]) -> None:
    assert check_entry_points(tf, defined) == []


def test_pushed_functions_are_cloud_events(tf: Tf, defined: dict[str, tuple[str, ...]]) -> None:
    assert check_signatures(tf, defined) == []


def test_topics_provisioned_and_wired(tf: Tf) -> None:
    assert check_topics(tf, settings_topics()) == []


def test_function_env(tf: Tf) -> None:
    assert check_env(tf, settings.FUNCTION_ENV) == []


def test_alert_secrets_from_secret_manager(tf: Tf) -> None:
    names = secret_env_names()
    assert names, "the notifier declares no SECRET_ENV"
    assert check_secrets(tf, names) == []


def test_indexes_cover_queries(tf: Tf) -> None:
    assert check_indexes(tf, required_indexes()) == []


def test_ttl_policies(tf: Tf) -> None:
    assert check_ttl(tf, required_ttl()) == []
    assert {settings.COLLECTION_FAILURES, settings.COLLECTION_JOBS} <= {c for c, _ in required_ttl()}


def test_every_collection_says_how_long_it_lives() -> None:
    """Each Firestore collection the code names (a COLLECTION_* constant anywhere in production
    code) has an entry in settings.RETENTION: its TTL field, or why it keeps its documents."""
    named: dict[str, tuple[str, str]] = {}
    for path in sorted(SPOTORCH.rglob("*.py")):
        if {"local", "sim"} & set(path.relative_to(SPOTORCH).parts):
            continue
        named |= {k: (v, path.name) for k, v in _module_constants(path).items()
                  if k.startswith("COLLECTION_") and isinstance(v, str)}
    assert len(named) >= 12
    missing = sorted(f"{v} ({k}, {where})" for k, (v, where) in named.items()
                     if v not in settings.RETENTION)
    assert missing == []
    assert set(settings.RETENTION) <= {v for v, _ in named.values()}
    assert all(why for _, why in settings.RETENTION.values())


def test_job_records_carry_their_ttl_timestamp() -> None:
    """record_job writes expires_at as a timestamp: the job's timeout plus the grace period."""
    from datetime import datetime

    from fakes import fake_deps
    from spotorch.app.unit_of_work import record_job
    from spotorch.core.pipeline import JobTemplate, Pipeline, Trigger

    pipeline = Pipeline(name="p", trigger=Trigger(bucket="b"), checkpoint_uri="gs://c/p",
                        output_uri="gs://m/p", job=JobTemplate(timeout_s=3600.0))
    deps = fake_deps(pipeline)
    record_job(deps, "projects/x/locations/us-central1/customJobs/42", "p-1", 1, "p")
    doc, _ = deps.docs.get(settings.COLLECTION_JOBS, "42")
    assert doc is not None and isinstance(doc["expires_at"], datetime)
    assert doc["expires_at"].timestamp() == doc["recorded_at"] + 3600.0 + \
        settings.JOB_RECORD_GRACE_S


def test_least_privilege(tf: Tf) -> None:
    assert check_iam(tf) == []


def test_dead_letters(tf: Tf) -> None:
    assert check_dead_letters(tf) == []


def test_retries(tf: Tf) -> None:
    assert check_retries(tf) == []


def test_references_declared(tf: Tf) -> None:
    assert check_references(tf) == []


def test_apis_enabled_before_use(tf: Tf) -> None:
    assert check_apis(tf) == []
    enabled = enabled_apis(tf)
    assert {"cloudresourcemanager.googleapis.com", "serviceusage.googleapis.com",
            "aiplatform.googleapis.com", "eventarc.googleapis.com"} <= enabled


def test_first_apply_waits_for_eventarc_agent(tf: Tf) -> None:
    assert check_first_apply(tf) == []


def test_functions_build_as_their_own_account(tf: Tf) -> None:
    assert check_build_identity(tf) == []


def test_burst_functions_scale(tf: Tf) -> None:
    assert check_scaling(tf) == []


def test_label_keys(tf: Tf) -> None:
    assert check_labels(tf) == []


def test_dependency_graph_reads_depends_on_and_locals(tf: Tf) -> None:
    graph = dependency_graph(tf)
    # explicit depends_on
    assert "time_sleep.eventarc_agent_ready" in \
        graph["google_cloudfunctions2_function.objects"]
    # through local.functions_member -> google_service_account.functions
    assert "google_service_account.functions" in \
        graph["google_storage_bucket_iam_member.functions_checkpoints"]
    assert depends_on(graph, "google_cloudfunctions2_function.objects", APIS_RESOURCE)
    assert not depends_on(graph, APIS_RESOURCE, "google_cloudfunctions2_function.objects")


def test_terraform_fmt() -> None:
    terraform = shutil.which("terraform")
    if terraform is None:
        pytest.skip("terraform is not installed")
    result = subprocess.run([terraform, "fmt", "-check", "-diff", str(DEPLOY)],
                            capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stdout + result.stderr


def test_deploy_script_syntax() -> None:
    result = subprocess.run(["bash", "-n", str(DEPLOY / "deploy.sh")], capture_output=True,
                            text=True, timeout=30, check=False)
    assert result.returncode == 0, result.stderr


# --- each check fails on a doctored deploy/ ------------------------------------------------------

@dataclass(frozen=True)
class Doctor:
    """Replace `old` by `new` (exactly once) in deploy/<file>; `check` must then report `expect`."""

    check: str
    file: str
    old: str
    new: str
    expect: str


CHECKS: dict[str, Callable[[Tf], list[str]]] = {
    "entry_points": lambda t: check_entry_points(t, main_functions()),
    "topics": lambda t: check_topics(t, settings_topics()),
    "env": lambda t: check_env(t, settings.FUNCTION_ENV),
    "secrets": lambda t: check_secrets(t, secret_env_names()),
    "indexes": lambda t: check_indexes(t, required_indexes()),
    "ttl": lambda t: check_ttl(t, required_ttl()),
    "iam": check_iam,
    "dead_letters": check_dead_letters,
    "retries": check_retries,
    "references": check_references,
    "apis": check_apis,
    "first_apply": check_first_apply,
    "build": check_build_identity,
    "scaling": check_scaling,
    "labels": check_labels,
}

API_ENV = ("    environment_variables          = ENV\n  }\n\n"
           "  depends_on = [time_sleep.build_account_ready, "
           "google_project_iam_member.functions_firestore]")
HOLD_TOPIC = 'topic                      = google_pubsub_topic.topic["{}"].id'
TRAINING_LOGS = 'role    = "{}"\n  member  = local.training_member'
ACT_AS = 'service_account_id = google_service_account.{}.name\n  role               = "roles/iam.se'
D = Doctor
DOCTORED = [
    D("entry_points", "functions.tf", '= "on_object_finalized"', '= "on_object_created"',
      "on_object_created is not defined"),
    D("entry_points", "functions.tf", 'entry_point   = "on_tick"',
      'entry_point   = "on_job_event"', "on_tick is not deployed"),
    D("topics", "main.tf", '= "spotorch-tick"', '= "spotorch-ticks"',
      "topic spotorch-tick (settings.py) is not provisioned"),
    D("topics", "main.tf", '= "spotorch-dead-letter"',
      '= "spotorch-dead-letter"\n    gcs = "spotorch-gcs-notifications"', "local-stack only"),
    D("topics", "functions.tf", '"on_tick", topic = "tick"', '"on_tick", topic = "events"',
      "nothing delivers spotorch-tick to on_tick"),
    D("topics", "pubsub.tf", 'googleapis.com/${google_pubsub_topic.topic["job_events"]',
      'googleapis.com/${google_pubsub_topic.topic["events"]', "log sink"),
    D("env", "main.tf", '    SPOTORCH_PIPELINES                = "pipelines"\n', "",
      "SPOTORCH_PIPELINES"),
    D("env", "functions.tf", API_ENV.replace("ENV", "merge(local.function_env, local.optional_env)"),
      API_ENV.replace("ENV", "{ SPOTORCH_PROJECT = var.project_id }"),
      "does not get local.function_env"),
    D("secrets", "secrets.tf", '    "SPOTORCH_SMTP_PASSWORD",\n', "",
      "SPOTORCH_SMTP_PASSWORD (the notifier's SECRET_ENV) is not in"),
    D("secrets", "main.tf", '    LOG_EXECUTION_ID                  = "true"',
      '    LOG_EXECUTION_ID = "true"\n    SPOTORCH_SMTP_PASSWORD = "hunter2"',
      "SPOTORCH_SMTP_PASSWORD is set as a plain environment variable"),
    D("secrets", "functions.tf", '"events", secrets = true', '"events", secrets = false',
      "does not mount the alert secrets"),
    D("secrets", "functions.tf", '"tick", secrets = false', '"tick", secrets = true',
      "mounts alert secrets it does not need"),
    D("indexes", "firestore.tf", "composite_indexes = {}",
      'composite_indexes = {\n    x = { collection = "runs", fields = ["pipeline", "at"] }\n  }',
      "not required by any query"),
    D("indexes", "firestore.tf", '    "notifications-expires_at" = {',
      '    "r" = { collection = "runs", field = "active" }\n    "notifications-expires_at" = {',
      "runs.active is queried but its single-field index is disabled"),
    D("ttl", "firestore.tf", '"dedupe", field = "expires_at"', '"dedupe", field = "expiry"',
      "no TTL policy on dedupe.expires_at"),
    D("iam", "iam.tf", '= "roles/eventarc.eventReceiver"', '= "roles/editor"',
      "roles/editor is never needed"),
    D("iam", "iam.tf", TRAINING_LOGS.format("roles/logging.logWriter"),
      TRAINING_LOGS.format("roles/storage.objectAdmin"), "roles/storage.objectAdmin at project"),
    D("iam", "iam.tf", TRAINING_LOGS.format("roles/logging.logWriter"),
      TRAINING_LOGS.format("roles/iam.serviceAccountUser"),
      "roles/iam.serviceAccountUser at project level"),
    D("iam", "iam.tf", '"google_project_iam_member" "functions_event_receiver"',
      '"google_project_iam_binding" "functions_event_receiver"', "authoritative IAM"),
    D("iam", "iam.tf", '    expression  = "resource.name == \\"projects/${var.project_id}/databases/'
      '${local.firestore_database}\\""\n  }\n}\n\n# Vertex',
      '  }\n}\n\n# Vertex',
      "not narrowed to spotorch's database"),
    D("iam", "functions.tf", "member   = each.value\n}", 'member   = "allUsers"\n}',
      "granted to the public"),
    D("iam", "iam.tf", '"aiplatform.customJobs.list",',
      '"aiplatform.customJobs.list", "aiplatform.models.delete",',
      "custom role grants aiplatform.models.delete"),
    D("iam", "iam.tf", ACT_AS.format("training"), ACT_AS.format("functions"),
      "roles/iam.serviceAccountUser on"),
    D("iam", "iam.tf", "toset(var.pipeline_service_accounts)", "toset(var.operators)",
      "roles/iam.serviceAccountUser on projects/-/serviceAccounts/"),
    D("dead_letters", "pubsub.tf", "    max_delivery_attempts = var.max_delivery_attempts\n", "",
      "has no dead-letter policy"),
    D("dead_letters", "pubsub.tf", HOLD_TOPIC.format("dead_letter"), HOLD_TOPIC.format("events"),
      "no subscription keeps the dead letters"),
    D("dead_letters", "pubsub.tf", 'push[each.key].id\n  role         = "roles/pubsub.subscriber"',
      'push[each.key].id\n  role         = "roles/pubsub.viewer"',
      "cannot forward dead letters"),
    D("dead_letters", "pubsub.tf", 'ttl = "" # a quiet', 'ttl = "2678400s" # a quiet',
      "expires when idle"),
    D("retries", "functions.tf", '= "RETRY_POLICY_RETRY"', '= "RETRY_POLICY_DO_NOT_RETRY"',
      "event trigger without retries"),
    D("retries", "pubsub.tf", "ack_deadline_seconds       = 600", "ack_deadline_seconds = 60",
      "ack deadline 60 shorter than the timeout 540"),
    D("retries", "functions.tf", "event_timeout_s = 540", "event_timeout_s = 900", "above 540 s"),
    D("retries", "pubsub.tf", '}/${google_pubsub_topic.topic[each.value.topic].id}"', '}"',
      "push endpoint must be"),
    D("references", "pubsub.tf", "= var.tick_schedule", "= var.tick_schedules",
      "var.tick_schedules is not declared"),
    D("references", "pubsub.tf", "iam_member.pushed_invoker,", "iam_member.pushed_invokers,",
      "google_cloud_run_v2_service_iam_member.pushed_invokers is not declared"),
    D("topics", "variables.tf", 'AND resource.labels.task_name=\\"service\\""',
      'AND logName:\\"ml.googleapis.com\\""', "does not select Vertex's service lines"),
    D("apis", "main.tf", '    "cloudresourcemanager.googleapis.com",\n', "",
      "cloudresourcemanager.googleapis.com (google_project_iam_member) is not enabled"),
    D("apis", "main.tf", '    "serviceusage.googleapis.com",\n', "",
      "serviceusage.googleapis.com (google_project_service"),
    D("apis", "main.tf", '    "eventarc.googleapis.com",\n', "",
      "eventarc.googleapis.com (event triggers"),
    D("apis", "iam.tf", "  permissions = local.vertex_job_permissions\n  depends_on  = "
      "[google_project_service.api]\n", "  permissions = local.vertex_job_permissions\n",
      "google_project_iam_custom_role.vertex_jobs does not depend on google_project_service.api"),
    D("apis", "pubsub.tf", "  name       = each.value\n  depends_on = [google_project_service.api]",
      "  name       = each.value", "google_pubsub_topic.topic does not depend on"),
    D("apis", "iam.tf", 'resource "time_sleep"', 'resource "time_wait"',
      "time_wait: which APIs it needs is not in RESOURCE_APIS"),
    D("first_apply", "functions.tf", "    time_sleep.eventarc_agent_ready,\n", "",
      "google_cloudfunctions2_function.objects (an Eventarc trigger) does not wait"),
    D("first_apply", "iam.tf", 'create_duration = "180s"', 'create_duration = "10s"',
      "waits 10s, less than 60s"),
    D("first_apply", "iam.tf", '  provider   = google-beta\n  project    = var.project_id\n'
      '  service    = "eventarc.googleapis.com"', '  project    = var.project_id\n'
      '  service    = "eventarc.googleapis.com"', "needs the google-beta provider"),
    D("first_apply", "iam.tf", '"roles/eventarc.serviceAgent"', '"roles/eventarc.viewer"',
      "not granted roles/eventarc.serviceAgent"),
    D("first_apply", "iam.tf", '  service    = "eventarc.googleapis.com"',
      '  service    = "eventarcpublishing.googleapis.com"', "creates the Eventarc service agent"),
    D("build", "build.tf", '"roles/logging.logWriter"', '"roles/cloudbuild.builds.builder"',
      "holds roles/cloudbuild.builds.builder on the project"),
    D("build", "functions.tf", '    entry_point       = "api"\n    docker_repository = '
      'google_artifact_registry_repository.functions.id\n    service_account   = '
      'google_service_account.build.id', '    entry_point       = "api"\n    docker_repository = '
      'google_artifact_registry_repository.functions.id\n    service_account   = null',
      "google_cloudfunctions2_function.api builds as None"),
    D("build", "functions.tf", "depends_on = [time_sleep.build_account_ready, ",
      "depends_on = [", "google_cloudfunctions2_function.api does not wait for its build"),
    D("scaling", "variables.tf", "  default     = 100\n", "  default     = 10\n",
      "max_instance_count 10 is below 50"),
    D("scaling", "functions.tf", "max_instance_count             = var.burst_max_instances",
      "max_instance_count             = var.max_instances", "(on_object_finalized): "
      "max_instance_count 10 is below 50"),
    D("labels", "functions.tf", '  name        = "spotorch-api"\n',
      '  name        = "spotorch-api"\n  labels      = { "spotorch-run" = "r" }\n',
      "label key spotorch-run is not lowercase_with_underscores"),
]


@pytest.mark.parametrize("doctor", DOCTORED, ids=lambda d: f"{d.check}:{d.expect[:40]}")
def test_check_fails_on_doctored_copy(doctor: Doctor, tmp_path: Path) -> None:
    for path in DEPLOY.glob("*.tf"):
        shutil.copy(path, tmp_path / path.name)
    target = tmp_path / doctor.file
    text = target.read_text()
    assert text.count(doctor.old) == 1, f"{doctor.file} no longer contains the doctored text once"
    target.write_text(text.replace(doctor.old, doctor.new))
    check = CHECKS[doctor.check]
    assert check(load_tf(DEPLOY)) == [], "the real deploy/ must pass before doctoring"
    problems = check(load_tf(tmp_path))
    assert problems, f"{doctor.check} did not notice"
    assert any(doctor.expect in p for p in problems), problems


def test_checks_fail_on_doctored_main(tf: Tf, tmp_path: Path) -> None:
    """A main.py without on_tick, or whose on_job_event is not declared a CloudEvent function."""
    text = MAIN.read_text()
    doctored = tmp_path / "main.py"
    doctored.write_text(text.replace("def on_tick(", "def on_tick_renamed("))
    assert "entry point on_tick is not defined in functions/main.py" in \
        " ".join(check_entry_points(tf, main_functions(doctored)))
    assert text.count("@functions_framework.cloud_event\ndef on_job_event(") == 1
    doctored.write_text(text.replace("@functions_framework.cloud_event\ndef on_job_event(",
                                     "def on_job_event("))
    problems = check_signatures(tf, main_functions(doctored))
    assert problems and all("on_job_event is fed by a push subscription" in p for p in problems)


def test_checks_fail_on_doctored_code(tf: Tf) -> None:
    """The other side of each contract: the code asks for more than deploy/ provides."""
    assert check_topics(tf, settings_topics() | {"spotorch-new-topic"}) == \
        ["topic spotorch-new-topic (settings.py) is not provisioned"]
    assert check_env(tf, (*settings.FUNCTION_ENV, "SPOTORCH_NEW")) == \
        ["SPOTORCH_NEW (settings.FUNCTION_ENV) is not in local.function_env"]
    assert check_secrets(tf, (*(secret_env_names() or ()), "SPOTORCH_NEW_TOKEN")) == \
        ["SPOTORCH_NEW_TOKEN (the notifier's SECRET_ENV) is not in local.secret_env_names"]
    assert check_indexes(tf, (("runs", ("pipeline", "active")),)) == \
        ["composite index runs(pipeline, active) is missing"]
    assert check_ttl(tf, required_ttl() | {("leases", "expires_at")}) == \
        ["no TTL policy on leases.expires_at"]


def test_contract_readers_see_the_code() -> None:
    """The sources the checks read are the ones the code uses (not silently empty)."""
    assert settings.TOPIC_EVENTS in settings_topics()
    assert "on_tick" in main_functions()
    assert secret_env_names() and "SPOTORCH_SMTP_PASSWORD" in (secret_env_names() or ())
    assert (settings.COLLECTION_DEDUPE, "expires_at") in required_ttl()


# --- packaging (offline) --------------------------------------------------------------------------

PIPELINE_YAML = """\
name: demo
trigger:
  bucket: gs://landing-a
  prefix: incoming/
checkpoint_uri: gs://ckpt-b/demo
output_uri: gs://models-c/demo
job:
  base_output_uri: gs://models-d/vertex
  service_account: trainer@p.iam.gserviceaccount.com
routes:
  - {channel: chat, events: ["*"], target: TEAM_CHAT_URL}
  - {channel: email, events: ["*"], target: sm://projects/p/secrets/oncall/versions/3}
  - {channel: email, events: ["*"], target: a@example.com}
"""


@pytest.fixture
def pipelines(tmp_path: Path) -> Path:
    directory = tmp_path / "pipelines"
    directory.mkdir()
    (directory / "demo.yaml").write_text(PIPELINE_YAML)
    (directory / "notes.txt").write_text("not a pipeline")
    return directory


def test_bundle_contents(pipelines: Path, tmp_path: Path) -> None:
    out, tfvars = tmp_path / "b.zip", tmp_path / "buckets.tfvars.json"
    bundle = package.build(ROOT, pipelines, out, tfvars, validate=False)
    names = set(zipfile.ZipFile(out).namelist())
    assert names == set(bundle.names)
    for required in ("main.py", "requirements.txt", "spotorch/__init__.py", "spotorch/settings.py",
                     "spotorch_trainer/__init__.py", "spotorch_trainer/contract.py",
                     "pipelines/demo.yaml"):
        assert required in names, required
    assert "pipelines/notes.txt" not in names
    # The only bytecode is the bundle's own: hash-checked, one per bundled module (cold starts).
    pycs = {n for n in names if "__pycache__" in n or n.endswith(".pyc")}
    tag = sys.implementation.cache_tag
    assert pycs == ({f"{n.rpartition('/')[0] + '/' if '/' in n else ''}__pycache__/"
                     f"{n.rpartition('/')[2][:-3]}.{tag}.pyc" for n in names if n.endswith(".py")}
                    if sys.version_info[:2] == package.RUNTIME_PYTHON else set())
    flags = {int.from_bytes(zipfile.ZipFile(out).read(n)[4:8], "little") for n in pycs}
    assert flags <= {0b11}  # hash-based, checked against the source
    if (ROOT / "schemas" / "events" / "envelope.schema.json").exists():
        assert "schemas/events/envelope.schema.json" in names
    requirements = zipfile.ZipFile(out).read("requirements.txt").decode().splitlines()
    locked = package.locked_requirements(ROOT)
    assert requirements[:len(locked)] == list(locked)  # the lock, as it is
    # an sm:// route target needs the Secret Manager client, which spotorch only imports then
    assert any(r.startswith("google-cloud-secret-manager") for r in requirements)
    assert json.loads(tfvars.read_text()) == {
        "pipeline_landing_buckets": ["landing-a"], "pipeline_checkpoint_buckets": ["ckpt-b"],
        "pipeline_model_buckets": ["models-c", "models-d"],
        "pipeline_service_accounts": ["trainer@p.iam.gserviceaccount.com"],
        "pipeline_route_env": ["TEAM_CHAT_URL"],
        "pipeline_route_secrets": ["projects/p/secrets/oncall"],
        "pipeline_staging_buckets": [],
        "pipeline_preprocess_buckets": [],
        "pipeline_preprocess_regions": [],
        "pipeline_spark_regions": [],
        "pipeline_export_buckets": [],
        "pipeline_bigquery_watched_datasets": [],
        "pipeline_bigquery_snapshot_datasets": [],
        "pipeline_account_data_buckets": {
            "trainer@p.iam.gserviceaccount.com landing-a": {
                "account": "trainer@p.iam.gserviceaccount.com", "bucket": "landing-a"}},
        "pipeline_account_output_buckets": {
            f"trainer@p.iam.gserviceaccount.com {b}": {
                "account": "trainer@p.iam.gserviceaccount.com", "bucket": b}
            for b in ("ckpt-b", "models-c", "models-d")},
        "pipeline_account_beam_workers": [],
        "pipeline_account_spark_workers": [],
        "pipeline_account_step_output_buckets": {},
        "bundle_prices": ""}
    assert set(json.loads(tfvars.read_text())) <= set(load_tf(DEPLOY).variables)


def test_a_bigquery_trigger_needs_its_datasets_and_export_bucket(tmp_path: Path) -> None:
    (tmp_path / "bq.yaml").write_text(
        "name: bq\n"
        "trigger:\n"
        "  bigquery:\n"
        "    tables: [data-proj.sales.rows, data-proj.sales.refunds, other-proj.crm.people]\n"
        "    snapshot_dataset: snap-proj.snapshots\n"
        "    export_uri: gs://bq-exports/runs\n"
        "job:\n"
        "  service_account: trainer@p.iam.gserviceaccount.com\n"
        "checkpoint_uri: gs://ckpt/bq\n"
        "output_uri: gs://models/bq\n")
    vars_ = package.pipeline_needs([tmp_path / "bq.yaml"]).tfvars()
    assert vars_["pipeline_bigquery_watched_datasets"] == ["data-proj:sales", "other-proj:crm"]
    assert vars_["pipeline_bigquery_snapshot_datasets"] == ["snap-proj:snapshots"]
    assert vars_["pipeline_export_buckets"] == ["bq-exports"]
    assert vars_["pipeline_landing_buckets"] == []
    # A pipeline's own job account reads its exports (the run's data) and nothing else's.
    assert vars_["pipeline_account_data_buckets"] == {
        "trainer@p.iam.gserviceaccount.com bq-exports": {
            "account": "trainer@p.iam.gserviceaccount.com", "bucket": "bq-exports"}}


def test_lock_pins_every_runtime_dependency() -> None:
    """deploy/requirements.lock: every runtime dependency of pyproject.toml, and theirs, at an
    exact version that pyproject.toml allows (`make lock` writes it from the venv)."""
    from packaging.requirements import Requirement

    lines = package.locked_requirements(ROOT)
    pins = {}
    for line in lines:
        match = re.fullmatch(r"([a-z0-9][a-z0-9._-]*)==([0-9][^\s;]*)", line)
        assert match, f"{line!r} is not name==version"
        pins[match.group(1)] = match.group(2)
    assert len(pins) == len(lines), "a package is pinned twice"
    for dep in package.runtime_requirements(ROOT / "pyproject.toml"):
        req = Requirement(dep)
        name = req.name.lower().replace("_", "-")
        assert name in pins, f"{dep} (pyproject.toml) is not in the lock: run make lock"
        assert req.specifier.contains(pins[name], prereleases=True), \
            f"the lock pins {name}=={pins[name]}, which {dep} does not allow: run make lock"
    # what those need (as this venv's versions say, markers decided for the functions' runtime)
    needed = package.dependency_closure(package.runtime_requirements(ROOT / "pyproject.toml"))
    assert sorted(set(needed) - set(pins)) == [], "dependencies missing from the lock: make lock"


def test_lock_text_is_what_make_lock_writes(tmp_path: Path) -> None:
    out = tmp_path / "requirements.lock"
    assert package.main(["--root", str(ROOT), "--write-lock", str(out)]) == 0
    written = [line for line in out.read_text().splitlines() if not line.startswith("#")]
    assert {r.split("==")[0] for r in written} == \
        {r.split("==")[0] for r in package.locked_requirements(ROOT)}


def test_bundle_carries_a_price_table(pipelines: Path, tmp_path: Path) -> None:
    """SPOTORCH_PRICES at packaging: the table is in the bundle and the functions' env names it."""
    from spotorch.core.price_list import LIST_PRICES
    from spotorch.spec.prices import table_doc

    table = tmp_path / "prices.json"
    table.write_text(json.dumps(table_doc(LIST_PRICES)))
    tfvars = tmp_path / "t.tfvars.json"
    out = package.build(ROOT, pipelines, tmp_path / "b.zip", tfvars, validate=False,
                        prices=table).path
    assert zipfile.ZipFile(out).read(package.BUNDLE_PRICES) == table.read_bytes()
    assert json.loads(tfvars.read_text())["bundle_prices"] == package.BUNDLE_PRICES
    tf = load_tf(DEPLOY)
    assert tf.locals["optional_env"] == (
        '${merge(var.bundle_prices == "" ? {} : {SPOTORCH_PRICES = var.bundle_prices}, '
        'var.dataflow_launcher_template == "" ? {} : '
        '{SPOTORCH_DATAFLOW_LAUNCHER = var.dataflow_launcher_template}, '
        'var.bigquery_location == "" ? {} : '
        '{SPOTORCH_BIGQUERY_LOCATION = var.bigquery_location}, '
        'var.dataflow_network == "" ? {} : {SPOTORCH_DATAFLOW_NETWORK = var.dataflow_network}, '
        'var.dataflow_subnetwork == "" ? {} : '
        '{SPOTORCH_DATAFLOW_SUBNETWORK = var.dataflow_subnetwork}, '
        'var.spark_driver_uri == "" ? {} : {SPOTORCH_SPARK_DRIVER = var.spark_driver_uri}, '
        'local.spark_enabled ? {SPOTORCH_DATAPROC_SERVICE_ACCOUNT = '
        'google_service_account.dataproc.email} : {})}')
    table.write_text(json.dumps({"families": {"n1": {"us-central1": {"vcpu": {"standard": -1}}}}}))
    with pytest.raises(package.PackageError, match="SPOTORCH_PRICES"):
        package.build(ROOT, pipelines, tmp_path / "c.zip", validate=False, prices=table)


def _run_deploy(tmp_path: Path, argv: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """Run make or deploy.sh with a terraform on PATH that only records that it ran."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    fake = bin_dir / "terraform"
    fake.write_text(f"#!/bin/sh\necho \"$@\" >> {tmp_path / 'terraform-ran'}\n")
    fake.chmod(0o755)
    inherited = {k: v for k, v in os.environ.items() if k not in ("PIPELINES", "TFVARS", "MAKEFLAGS")}
    full = {**inherited, "PATH": f"{bin_dir}:{os.environ['PATH']}", **env}
    return subprocess.run(argv, cwd=ROOT, env=full, capture_output=True, text=True, timeout=300,
                          check=False)


def test_make_deploy_refuses_without_pipelines(tmp_path: Path) -> None:
    result = _run_deploy(tmp_path, ["make", "--no-print-directory", "deploy"], {})
    assert result.returncode != 0
    assert "set PIPELINES=path/to/your/pipelines" in result.stderr
    assert not (tmp_path / "terraform-ran").exists()


@pytest.mark.parametrize("pipelines, message", [
    ("", "set PIPELINES to the directory of your pipelines"),
    ("examples/pipelines", "PIPELINES is the examples"),
    ("no/such/dir", "is not a directory"),
])
def test_deploy_script_refuses_before_terraform(tmp_path: Path, pipelines: str, message: str) -> None:
    result = _run_deploy(tmp_path, ["bash", str(DEPLOY / "deploy.sh"), "plan"],
                         {"PIPELINES": pipelines, "PROJECT": "p"})
    assert result.returncode != 0 and message in result.stderr, result.stderr
    assert not (tmp_path / "terraform-ran").exists()


def test_requirements_only_add_what_pipelines_use() -> None:
    runtime = ("google-cloud-pubsub>=2.23", "PyYAML>=6")
    assert package.bundle_requirements(runtime, package.Needs()) == runtime
    with_sm = package.Needs(route_secrets=("projects/p/secrets/s",))
    assert package.bundle_requirements(runtime, with_sm) == \
        (*runtime, package.SECRET_MANAGER_REQUIREMENT)
    pinned = ("google-cloud-secret-manager==2.21.0",)
    assert package.bundle_requirements(pinned, with_sm) == pinned


def test_bundle_is_deterministic(pipelines: Path, tmp_path: Path) -> None:
    first = package.build(ROOT, pipelines, tmp_path / "1.zip", validate=False).path.read_bytes()
    second = package.build(ROOT, pipelines, tmp_path / "2.zip", validate=False).path.read_bytes()
    assert first == second
    (pipelines / "demo.yaml").write_text(PIPELINE_YAML + "# changed\n")
    third = package.build(ROOT, pipelines, tmp_path / "3.zip", validate=False).path.read_bytes()
    assert third != first


def test_bundle_imports_from_itself(pipelines: Path, tmp_path: Path) -> None:
    """Cloud Functions imports main.py from the bundle root: spotorch must come from the bundle."""
    out = package.build(ROOT, pipelines, tmp_path / "b.zip", validate=False).path
    site = tmp_path / "site"
    zipfile.ZipFile(out).extractall(site)
    probe = ("import main, spotorch, spotorch_trainer, pathlib\n"
             "from spotorch.spec.event_schemas import find_schemas_dir\n"
             "here = pathlib.Path.cwd().resolve()\n"
             "assert pathlib.Path(spotorch.__file__).resolve().is_relative_to(here)\n"
             "assert pathlib.Path(spotorch_trainer.__file__).resolve().is_relative_to(here)\n"
             "assert find_schemas_dir().resolve().is_relative_to(here), find_schemas_dir()\n"
             "print(sorted(n for n in dir(main) if n.startswith('on_')))\n")
    result = subprocess.run([sys.executable, "-c", probe], cwd=site, capture_output=True,
                            text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stderr
    assert "on_tick" in result.stdout


@pytest.mark.parametrize("setup, message", [
    (lambda d: shutil.rmtree(d), "does not exist"),
    (lambda d: (d / "demo.yaml").unlink(), "no pipeline"),
    (lambda d: (d / "demo.yaml").write_text("name: [unclosed\n"), "not valid YAML"),
])
def test_package_refuses(pipelines: Path, tmp_path: Path, setup: Callable[[Path], Any],
                         message: str) -> None:
    setup(pipelines)
    with pytest.raises(package.PackageError, match=message):
        package.build(ROOT, pipelines, tmp_path / "b.zip", validate=False)
    assert not (tmp_path / "b.zip").exists()


def test_package_cli(pipelines: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "b.zip"
    assert package.main(["--pipelines", str(pipelines), "--out", str(out), "--no-validate"]) == 0
    assert out.exists() and "landing buckets: landing-a" in capsys.readouterr().out
    assert package.main(["--pipelines", str(tmp_path / "none"), "--out", str(out)]) == 1


def test_shipped_example_pipelines_load(tmp_path: Path) -> None:
    """The default PIPELINES of deploy.sh packages and loads with spotorch's own loader."""
    examples = ROOT / "examples" / "pipelines"
    if not examples.is_dir():
        pytest.skip("no examples/pipelines yet")
    bundle = package.build(ROOT, examples, tmp_path / "b.zip", validate=True)
    assert bundle.pipelines


# --- the push endpoint format yields the CloudEvent Eventarc would deliver ------------------------

def test_push_to_topic_path_is_a_pubsub_cloud_event(tmp_path: Path) -> None:
    """deploy/ pushes to <function URL>/projects/P/topics/T; functions-framework must turn that
    raw Pub/Sub push body into a messagePublished CloudEvent whose source names the topic."""
    functions_framework = pytest.importorskip("functions_framework")
    source = tmp_path / "stub.py"
    source.write_text("import functions_framework\nseen = []\n\n"
                      "@functions_framework.cloud_event\n"
                      "def handler(event):\n    seen.append(event)\n")
    app = functions_framework.create_app("handler", str(source))
    topic = f"projects/p/topics/{settings.TOPIC_TICK}"
    body = {"message": {"data": base64.b64encode(b"{}").decode(), "attributes": {"k": "v"},
                        "messageId": "42", "publishTime": "2024-01-01T00:00:00Z"},
            "subscription": "projects/p/subscriptions/spotorch-on-tick-push"}
    response = app.test_client().post(f"/{topic}", json=body)
    assert response.status_code == 200, response.data
    module = sys.modules[next(n for n, m in sys.modules.items()
                              if getattr(m, "__file__", None) == str(source))]
    (event,) = module.seen
    assert event["type"] == "google.cloud.pubsub.topic.v1.messagePublished"
    assert event["source"] == f"//pubsub.googleapis.com/{topic}"
    assert event["id"] == "42"
    assert event.data["message"]["attributes"] == {"k": "v"}
    assert base64.b64decode(event.data["message"]["data"]) == b"{}"


def test_dataflow_and_bigquery_grants_exist_only_when_a_bundled_pipeline_uses_them(tf: Tf) -> None:
    """Least privilege for a project without Beam steps or BigQuery triggers: the features'
    project-level roles, actAs and Eventarc triggers are created by count (a Spark-only
    deployment gets none of Dataflow's: dataflow_enabled counts Beam steps' regions only)."""
    gated = {
        ("google_project_iam_member", "functions_dataflow"): "dataflow_enabled",
        ("google_project_iam_member", "dataflow_worker"): "dataflow_enabled",
        ("google_service_account_iam_member", "functions_act_as_dataflow"): "dataflow_enabled",
        ("google_eventarc_trigger", "tables_query"): "bigquery_enabled",
        ("google_project_iam_custom_role", "bigquery_jobs"): "bigquery_enabled",
        ("google_storage_bucket_iam_member", "functions_read_launcher_spec"): "dataflow_enabled",
        ("google_artifact_registry_repository_iam_member", "dataflow_read_launcher_image"):
            "dataflow_enabled",
    }
    for (rtype, name), flag in gated.items():
        body = tf.resource(rtype).get(name)
        assert body is not None, f"{rtype}.{name} is gone"
        assert f"local.{flag}" in str(body.get("count")), f"{rtype}.{name} is not gated on {flag}"
    # one statusChanged trigger per region a Beam step runs in, none without one
    trigger = tf.resource("google_eventarc_trigger")["dataflow_status"]
    assert trigger["for_each"] == "${local.dataflow_regions}"
    assert "local.dataflow_enabled" in str(tf.locals["dataflow_regions"])
    assert "var.pipeline_preprocess_regions" in str(tf.locals.get("dataflow_enabled"))
    for rtype in ("google_project_iam_member", "google_service_account_iam_member"):
        for name, body in tf.resource(rtype).items():
            role = str(body.get("role"))
            if "dataflow" in role or "dataflow" in str(body.get("service_account_id")):
                # gated by count, or made per Beam step that names its own account
                assert "local.dataflow_enabled" in str(body.get("count")) or \
                    "var.pipeline_account_beam_workers" in str(body.get("for_each")), \
                    f"{rtype}.{name}"
    for name, body in tf.resource("google_storage_bucket_iam_member").items():
        if "dataflow_member" in str(body.get("member")):
            assert "local.dataflow_enabled" in str(body.get("for_each")), name


def test_the_packager_knows_the_preprocess_default_region(tmp_path: Path) -> None:
    """A step without preprocess.region runs in Preprocess.region's default: its statusChanged
    trigger must be created there (deploy/dataflow.tf local.dataflow_regions)."""
    from spotorch.core.pipeline import Preprocess

    assert Preprocess.region == package.PREPROCESS_DEFAULT_REGION
    source = tmp_path / "p.yaml"
    source.write_text("preprocess: {output_uri: gs://o/p}\n---\n"
                      "preprocess: {output_uri: gs://o/q, region: europe-west4}\n")
    needs = package.pipeline_needs([source])
    assert needs.tfvars()["pipeline_preprocess_regions"] == ["europe-west4", "us-central1"]


def test_dataprocs_grants_exist_only_with_a_bundled_spark_step(tmp_path: Path) -> None:
    """issue 42: packaging names the regions of `kind: spark` steps; deploy/dataproc.tf gates
    the Dataproc API and every grant of the batches (functions and spotorch-dataproc) on them."""
    source = tmp_path / "p.yaml"
    source.write_text("preprocess: {output_uri: gs://o/p}\n---\n"
                      "preprocess: {kind: spark, output_uri: gs://o/q, region: europe-west4}\n")
    needs = package.pipeline_needs([source])
    assert needs.tfvars()["pipeline_spark_regions"] == ["europe-west4"]
    # the Beam step's region alone gates Dataflow's grants and triggers (dataflow_enabled)
    assert needs.tfvars()["pipeline_preprocess_regions"] == ["us-central1"]
    spark_only = tmp_path / "s.yaml"
    spark_only.write_text("preprocess: {kind: spark, output_uri: gs://o/q}\n")
    assert package.pipeline_needs([spark_only]).tfvars()["pipeline_preprocess_regions"] == []
    # a step's own account: actAs, its kind's worker role, reads and a write on its output
    own = tmp_path / "own.yaml"
    own.write_text("trigger: {bucket: land}\npreprocess: {kind: spark, output_uri: gs://o/q, "
                   "service_account: prep@p.iam.gserviceaccount.com}\n")
    vars_ = package.pipeline_needs([own]).tfvars()
    assert vars_["pipeline_service_accounts"] == ["prep@p.iam.gserviceaccount.com"]
    assert vars_["pipeline_account_spark_workers"] == ["prep@p.iam.gserviceaccount.com"]
    assert vars_["pipeline_account_beam_workers"] == []
    assert [v["bucket"] for v in vars_["pipeline_account_step_output_buckets"].values()] == ["o"]
    tf_ = load_tf(DEPLOY)
    worker = tf_.resource("google_project_iam_member")["step_accounts_dataproc_worker"]
    assert worker["role"] == "roles/dataproc.worker"
    assert "var.pipeline_account_spark_workers" in str(worker["for_each"])
    beam_only = tmp_path / "b.yaml"
    beam_only.write_text("preprocess: {output_uri: gs://o/p}\n")
    assert package.pipeline_needs([beam_only]).tfvars()["pipeline_spark_regions"] == []
    tf = load_tf(DEPLOY)
    assert "var.pipeline_spark_regions" in str(tf.locals.get("spark_enabled"))
    gated = 0
    for rtype in ("google_project_iam_member", "google_service_account_iam_member",
                  "google_storage_bucket_iam_member", "google_project_service",
                  "google_project_iam_custom_role"):
        for name, body in tf.resource(rtype).items():
            if "dataproc" in name:
                gated += 1
                # gated, or made per Spark step that names its own account (none without one)
                assert "local.spark_enabled" in str(body.get("count") or body.get("for_each")) \
                    or "var.pipeline_account_spark_workers" in str(body.get("for_each")), \
                    f"{rtype}.{name}"
    assert gated >= 8
