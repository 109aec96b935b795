"""What `spotorch deploy check` checks beyond the permission map (issue 40): that a first apply
on a new project succeeds and every feature's events and calls get through.

- APIs: each feature's APIs are in local.apis (the preprocess step's Dataflow and Compute Engine,
  the BigQuery trigger's BigQuery, and what every deployment needs).
- The build account: every function builds as an account of ours that holds nothing at project
  level but roles/logging.logWriter, and that the function waits for (its grants, then a wait).
- Trigger locations: the BigQuery audit-log triggers cover both methods a job can be logged
  under (InsertJob, Query) in var.bigquery_trigger_region (global by default); the Dataflow
  statusChanged trigger exists in each region a bundled step runs in.
- Monitoring: every alert condition's filter names its resource.type, and the alert policy waits
  for its log-based metrics (provider issue #11102).
- Secrets: only the notifier's account reads the alert secrets, and the function that mounts
  them runs as it.
- Waits: the Eventarc service agent's grant has a few minutes to propagate.

The spec and image reads and the build account's own grants are rows of the permission map
(operate/permissions.py), checked with every other call. Each function here returns the
problems it finds, as sentences; none means ready.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

from spotorch.operate.terraform import Tf, block, dependency_graph, depends_on

# feature -> the APIs it needs; a feature is on when deploy/ has its resources (always: always).
FEATURE_APIS: Mapping[str, Mapping[str, str]] = {
    "always": {
        "aiplatform.googleapis.com": "Vertex AI custom jobs",
        "artifactregistry.googleapis.com": "the functions' images",
        "cloudbuild.googleapis.com": "the function builds",
        "cloudfunctions.googleapis.com": "the functions",
        "eventarc.googleapis.com": "the event triggers",
        "firestore.googleapis.com": "the run store",
        "iam.googleapis.com": "service accounts and custom roles",
        "logging.googleapis.com": "logs, the job-log sink, log-based metrics",
        "monitoring.googleapis.com": "the dashboard and alert policy",
        "pubsub.googleapis.com": "topics and push subscriptions",
        "run.googleapis.com": "the functions' services",
        "secretmanager.googleapis.com": "the alert secrets",
        "storage.googleapis.com": "buckets",
    },
    "preprocess": {
        "dataflow.googleapis.com": "preprocess steps (Dataflow jobs)",
        "compute.googleapis.com": "preprocess steps (Dataflow's workers are Compute Engine VMs)",
    },
    "bigquery": {"bigquery.googleapis.com": "BigQuery triggers (jobs, tables, snapshots)"},
}
# A resource of deploy/ that marks a feature as deployed.
FEATURE_MARKERS: Mapping[str, str] = {
    "preprocess": "google_eventarc_trigger.dataflow_status",
    "bigquery": "google_cloudfunctions2_function.tables",
}
BIGQUERY_METHODS = ("google.cloud.bigquery.v2.JobService.InsertJob",
                    "google.cloud.bigquery.v2.JobService.Query")
DATAFLOW_EVENT = "google.cloud.dataflow.job.v1beta3.statusChanged"
BUILD_PROJECT_ROLES = frozenset({"roles/logging.logWriter"})
MIN_EVENTARC_WAIT_S = 120  # "a few minutes", Eventarc's own error says
MIN_METRICS_WAIT_S = 300  # provider issue #11102: up to about 10 minutes


def _duration_s(text: Any) -> float:
    units = {"s": 1, "m": 60, "h": 3600}
    return sum(float(n) * units[u] for n, u in re.findall(r"(\d+(?:\.\d+)?)([smh])", str(text)))


def _enabled_apis(tf: Tf) -> set[str]:
    return set(re.findall(r"([a-z0-9-]+\.googleapis\.com)", str(tf.locals.get("apis"))))


def _exists(tf: Tf, address: str) -> bool:
    rtype, _, name = address.partition(".")
    return name in tf.resource(rtype)


def check_apis(tf: Tf) -> list[str]:
    """Each deployed feature's APIs are enabled (local.apis)."""
    enabled = _enabled_apis(tf)
    problems = []
    for feature, apis in FEATURE_APIS.items():
        marker = FEATURE_MARKERS.get(feature)
        if marker is not None and not _exists(tf, marker):
            continue
        problems += [f"{api} ({why}) is not enabled in local.apis"
                     for api, why in apis.items() if api not in enabled]
    return problems


def _grants_of(tf: Tf, account: str) -> list[tuple[str, str, dict[str, Any]]]:
    """(rtype, name, body) of every IAM member grant whose member is that account."""
    email = f"google_service_account.{account}.email"
    aliases = {f"local.{n}" for n, v in tf.locals.items() if email in str(v)}
    out = []
    for rtype, named in tf.resources.items():
        if rtype.endswith("_iam_member"):
            for name, body in named.items():
                member = str(body.get("member"))
                if email in member or any(a in member for a in aliases):
                    out.append((rtype, name, body))
    return out


def check_build_account(tf: Tf) -> list[str]:
    """Every function builds as an account of ours, with only logWriter at project level, and
    waits for that account's grants (through a wait that follows them)."""
    problems: list[str] = []
    graph = dependency_graph(tf)
    accounts: dict[str, list[str]] = {}
    for name, fn in tf.resource("google_cloudfunctions2_function").items():
        where = f"google_cloudfunctions2_function.{name}"
        account = str(block(fn, "build_config").get("service_account"))
        match = re.fullmatch(r"\$\{google_service_account\.(\w+)\.(id|name)\}", account)
        if not match:
            problems.append(f"{where} builds as {account}, not as a service account of ours")
            continue
        accounts.setdefault(match.group(1), []).append(where)
    for account, functions in sorted(accounts.items()):
        grants = _grants_of(tf, account)
        if not grants:
            problems.append(f"the build account google_service_account.{account} has no grants")
            continue
        for rtype, name, body in grants:
            role = str(body.get("role"))
            if rtype == "google_project_iam_member" and role not in BUILD_PROJECT_ROLES:
                problems.append(f"{rtype}.{name}: the build account holds {role} on the project "
                                f"(only {', '.join(sorted(BUILD_PROJECT_ROLES))} belongs there)")
        addresses = [f"{rtype}.{name}" for rtype, name, _ in grants]
        waits = [f"time_sleep.{n}" for n in tf.resource("time_sleep")
                 if all(depends_on(graph, f"time_sleep.{n}", a) for a in addresses)]
        if not waits:
            problems.append(f"nothing waits for the build account {account}'s grants to "
                            "propagate (a time_sleep after them all)")
        for where in functions:
            if not any(depends_on(graph, where, w) for w in waits):
                problems.append(f"{where} does not wait for its build account's grants")
    return problems


def _criteria(body: Mapping[str, Any], name: str) -> dict[str, str]:
    found = body.get(name)
    items = found if isinstance(found, list) else []
    return {str(c.get("attribute")): str(c.get("value")) for c in items if isinstance(c, dict)}


def _default(tf: Tf, expr: str) -> str:
    match = re.fullmatch(r"\$\{var\.(\w+)\}", expr)
    return str(tf.variables.get(match.group(1), {}).get("default")) if match else expr


def check_trigger_locations(tf: Tf) -> list[str]:
    """BigQuery: both methods, each in the function trigger's location (global by default);
    Dataflow: a statusChanged trigger in every region a bundled step runs in."""
    problems: list[str] = []
    tables = tf.resource("google_cloudfunctions2_function").get("tables")
    if tables is not None:
        trigger = block(tables, "event_trigger")
        region = str(trigger.get("trigger_region"))
        covered = {_criteria(trigger, "event_filters").get("methodName"): region}
        for name, body in tf.resource("google_eventarc_trigger").items():
            criteria = _criteria(body, "matching_criteria")
            if criteria.get("serviceName") == "bigquery.googleapis.com":
                covered[criteria.get("methodName")] = str(body.get("location"))
                if "google_cloudfunctions2_function.tables" not in str(block(body, "destination")):
                    problems.append(f"google_eventarc_trigger.{name} does not deliver to "
                                    "on_table_changed")
        for method in BIGQUERY_METHODS:
            if method not in covered:
                problems.append(f"no BigQuery trigger takes {method} entries: jobs logged so "
                                "start nothing")
            elif covered[method] != region:
                problems.append(f"the {method} trigger is in {covered[method]}, not "
                                f"{region} as the function's")
        if _default(tf, region) != "global":
            problems.append(f"the BigQuery trigger's location {_default(tf, region)} is not "
                            "global: which regional location gets a multi-region dataset's "
                            "entries is not known")
    for name, body in tf.resource("google_eventarc_trigger").items():
        if _criteria(body, "matching_criteria").get("type") != DATAFLOW_EVENT:
            continue
        where = f"google_eventarc_trigger.{name}"
        for_each = str(body.get("for_each", ""))
        regions = for_each + " " + " ".join(str(tf.locals.get(n, "")) for n in
                                            re.findall(r"local\.(\w+)", for_each))
        if "pipeline_preprocess_regions" not in regions or body.get("location") != \
                "${each.value}":
            problems.append(f"{where} is not created in each region a step runs in "
                            "(var.pipeline_preprocess_regions)")
    return problems


def check_monitoring(tf: Tf) -> list[str]:
    """Typed alert filters, and a wait between the log-based metrics and the alert policy."""
    problems: list[str] = []
    graph = dependency_graph(tf)
    metrics = [f"google_logging_metric.{n}" for n in tf.resource("google_logging_metric")]
    for name, policy in tf.resource("google_monitoring_alert_policy").items():
        where = f"google_monitoring_alert_policy.{name}"
        for condition in policy.get("conditions") or ():
            for kind in ("condition_threshold", "condition_absent"):
                text = str(block(condition, kind).get("filter", ""))
                if block(condition, kind) and "resource.type" not in text:
                    problems.append(f"{where}: condition {condition.get('display_name')!r} "
                                    "filter names no resource.type")
        waits = [f"time_sleep.{n}" for n, s in tf.resource("time_sleep").items()
                 if _duration_s(s.get("create_duration")) >= MIN_METRICS_WAIT_S
                 and all(depends_on(graph, f"time_sleep.{n}", m) for m in metrics)]
        if metrics and not any(depends_on(graph, where, w) for w in waits):
            problems.append(f"{where} does not wait (>= {MIN_METRICS_WAIT_S}s) for its "
                            "log-based metrics: Monitoring answers 404 for a new metric")
    return problems


def check_secrets(tf: Tf) -> list[str]:
    """Only the notifier reads the alert secrets; the function mounting them runs as it."""
    problems = []
    for name, body in tf.resource("google_secret_manager_secret_iam_member").items():
        if "notifier" not in str(body.get("member")):
            problems.append(f"google_secret_manager_secret_iam_member.{name}: "
                            f"{body.get('member')} reads alert secrets (only the notifier may)")
    for name, fn in tf.resource("google_cloudfunctions2_function").items():
        config = block(fn, "service_config")
        if "dynamic" in config or "secret_environment_variables" in config:
            account = str(config.get("service_account_email"))
            if "notifier" not in account:
                problems.append(f"google_cloudfunctions2_function.{name} mounts secrets but "
                                f"runs as {account}, not the notifier")
    return problems


def check_waits(tf: Tf) -> list[str]:
    """The Eventarc agent's grant gets a few minutes before any trigger."""
    graph = dependency_graph(tf)
    grants = [f"google_project_iam_member.{n}" for n, g in
              tf.resource("google_project_iam_member").items()
              if g.get("role") == "roles/eventarc.serviceAgent"]
    waits = {f"time_sleep.{n}": _duration_s(s.get("create_duration"))
             for n, s in tf.resource("time_sleep").items()
             if grants and all(depends_on(graph, f"time_sleep.{n}", g) for g in grants)}
    if not waits:
        return ["nothing waits for the Eventarc service agent's grant"]
    if max(waits.values()) < MIN_EVENTARC_WAIT_S:
        return [f"the Eventarc agent's wait is {max(waits.values()):.0f}s, under "
                f"{MIN_EVENTARC_WAIT_S}s (Eventarc says propagation takes a few minutes)"]
    return []


CHECKS: Mapping[str, Callable[[Tf], list[str]]] = {
    "apis": check_apis,
    "build account": check_build_account,
    "trigger locations": check_trigger_locations,
    "monitoring": check_monitoring,
    "secrets": check_secrets,
    "waits": check_waits,
}


def problems(tf: Tf) -> tuple[str, ...]:
    """Every problem every check finds, prefixed by the check's name."""
    return tuple(f"{name}: {p}" for name, check in CHECKS.items() for p in check(tf))
