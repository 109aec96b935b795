"""`spotorch deploy check`: is every Google API method spotorch calls granted by deploy/?

Reads deploy/*.tf (operate/terraform.py), turns each IAM member resource into a grant (who, on
what, which permissions: Google's predefined roles from operate/iam_roles.py, custom roles from
their own permission lists), and matches every row of the permission map (operate/permissions.py)
against them. Prints the map with the grant that allows each call; exits 1 when a call is not
granted. Terraform is read the way deploy/ writes it (see GRANT_READERS); a grant it cannot read
grants nothing, so a new shape of grant shows up as a missing permission, never as a silent pass.
Beyond the map, operate/deploy_readiness.py checks what makes a first apply on a new project
succeed and every feature get through: APIs per feature, the build account, trigger locations,
alert policies, who reads the secrets, waits.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from spotorch.commandline import CONTEXT, SuggestingGroup, run
from spotorch.operate.iam_roles import PREDEFINED_ROLES
from spotorch.operate.permissions import CALLS, Call, Identity, Scope
from spotorch.operate.terraform import TerraformError, Tf, block, load_tf

# Whose grant a member expression is: the member itself first, then (for `each.value`-style
# members) the for_each it iterates.
IDENTITY_PATTERNS: tuple[tuple[re.Pattern[str], Identity], ...] = tuple(
    (re.compile(p), i) for p, i in (
        (r"local\.functions_member|google_service_account\.functions\.email", Identity.FUNCTIONS),
        (r"local\.training_member|google_service_account\.training\.email", Identity.TRAINING),
        (r"var\.pipeline_service_accounts|var\.pipeline_account_\w+", Identity.JOB_ACCOUNTS),
        (r"var\.operators", Identity.OPERATORS),
        (r"google_project_service_identity\.aiplatform\b", Identity.VERTEX_AGENT),
        (r"local\.dataflow_member|google_service_account\.dataflow\.email",
         Identity.DATAFLOW_WORKER),
        (r"local\.dataproc_member|google_service_account\.dataproc\.email",
         Identity.DATAPROC_WORKER),
        (r"local\.notifier_member|google_service_account\.notifier\.email", Identity.NOTIFIER),
        (r"local\.build_member|google_service_account\.build\.email", Identity.BUILD),
    ))
# Names of bucket, secret and account sets (locals and variables) -> the scopes they are.
NAMED_SCOPES: Mapping[str, tuple[Scope, ...]] = {
    "landing_buckets": (Scope.LANDING,),
    "checkpoint_buckets": (Scope.CHECKPOINT,),
    "model_buckets": (Scope.MODEL,),
    "staging_buckets": (Scope.STAGING,),
    "preprocess_buckets": (Scope.PREPROCESS,),
    "pipeline_account_data_buckets": (Scope.LANDING, Scope.EXPORT, Scope.STAGING,
                                      Scope.PREPROCESS),
    "pipeline_account_output_buckets": (Scope.CHECKPOINT, Scope.MODEL),
    "pipeline_account_step_output_buckets": (Scope.PREPROCESS,),
    "alert_env_names": (Scope.ALERT_SECRETS,),
    "pipeline_route_secrets": (Scope.ROUTE_SECRETS,),
    "pipeline_service_accounts": (Scope.PIPELINE_ACCOUNTS,),
    "bigquery_watched_datasets": (Scope.WATCHED_DATASETS,),
    "bigquery_snapshot_datasets": (Scope.SNAPSHOT_DATASETS,),
    "export_buckets": (Scope.EXPORT,),
    "dataflow_launcher_bucket": (Scope.LAUNCHER_SPEC,),
    "dataflow_launcher_repo": (Scope.LAUNCHER_IMAGE,),
    "spark_driver_bucket": (Scope.SPARK_DRIVER,),
}
# Resources named in a grant -> the scope they are.
REFERENCED_SCOPES: tuple[tuple[re.Pattern[str], Scope], ...] = tuple(
    (re.compile(p), s) for p, s in (
        (r"google_pubsub_subscription\.dead_letter_hold\b", Scope.HOLD_SUBSCRIPTION),
        (r"google_pubsub_subscription\.push\[", Scope.PUSH_SUBSCRIPTIONS),
        (r"google_service_account\.training\.", Scope.TRAINING_ACCOUNT),
        (r"google_service_account\.dataflow\.", Scope.DATAFLOW_ACCOUNT),
        (r"google_service_account\.dataproc\.", Scope.DATAPROC_ACCOUNT),
        (r"google_cloudfunctions2_function\.api\.", Scope.API_SERVICE),
        (r"google_cloudfunctions2_function\.pushed\[", Scope.PUSHED_SERVICES),
        (r"google_cloudfunctions2_function\.objects\[", Scope.OBJECT_SERVICES),
        (r"google_cloudfunctions2_function\.tables\[", Scope.TABLE_SERVICE),
        (r"google_artifact_registry_repository\.functions\.", Scope.FUNCTIONS_REPOSITORY),
        (r"google_storage_bucket\.source\.", Scope.SOURCE_BUCKET),
        (r"google_logging_log_view\.job_logs\.", Scope.JOB_LOG_VIEW),
    ))
SCOPES = frozenset(s.value for s in Scope)
# The attribute of each grant resource that names what it is granted on.
TARGET_ATTRIBUTE: Mapping[str, str] = {
    "google_project_iam_member": "project",
    "google_pubsub_topic_iam_member": "topic",
    "google_pubsub_subscription_iam_member": "subscription",
    "google_storage_bucket_iam_member": "bucket",
    "google_secret_manager_secret_iam_member": "secret_id",
    "google_service_account_iam_member": "service_account_id",
    "google_cloud_run_v2_service_iam_member": "name",
    "google_bigquery_dataset_iam_member": "dataset_id",
    "google_artifact_registry_repository_iam_member": "repository",
    "google_logging_log_view_iam_member": "name",
}


@dataclass(frozen=True)
class Grant:
    """One IAM member resource of deploy/, as what it allows."""

    address: str
    identity: Identity
    scopes: frozenset[Scope]  # Scope.PROJECT: every resource of the project
    role: str
    permissions: frozenset[str]

    def covers(self, scope: Scope) -> bool:
        """Whether this grant applies on the resource (a project-wide grant applies everywhere)."""
        return scope in self.scopes or Scope.PROJECT in self.scopes


@dataclass(frozen=True)
class Finding:
    """One call, for one identity on one resource: what allows it, what is missing."""

    call: Call
    identity: Identity
    scope: Scope
    granted_by: tuple[str, ...]
    missing: tuple[str, ...]

    def to_dict(self) -> dict[str, Any]:
        """The finding as --json prints it."""
        needed = dict(self.call.needs)[self.scope]
        return {"client": self.call.client, "method": self.call.method, "kind": str(self.call.kind),
                "sites": list(self.call.sites), "why": self.call.why, "source": self.call.source,
                "identity": str(self.identity), "resource": str(self.scope),
                "permissions": list(needed), "granted_by": list(self.granted_by),
                "missing": list(self.missing)}


@dataclass(frozen=True)
class Report:
    """The map checked against one Terraform directory."""

    findings: tuple[Finding, ...]
    grants: tuple[Grant, ...]
    notes: tuple[str, ...]
    problems: tuple[str, ...] = ()  # deploy_readiness: what is not a missing grant

    @property
    def ok(self) -> bool:
        """Whether every call is granted and nothing else is in the way."""
        return not any(f.missing for f in self.findings) and not self.problems

    def to_dict(self, directory: Path) -> dict[str, Any]:
        """The report as --json prints it."""
        return {"deploy": str(directory), "ok": self.ok,
                "not_granted": sum(1 for f in self.findings if f.missing),
                "calls": [f.to_dict() for f in self.findings], "notes": list(self.notes),
                "problems": list(self.problems)}


# --- reading grants ---------------------------------------------------------------------------

def _expand(tf: Tf, text: str, depth: int = 4) -> str:
    """An expression with the locals it names written out (for the names inside them)."""
    out = text
    for name in set(re.findall(r"\blocal\.(\w+)", text)):
        if depth and name in tf.locals:
            out += " " + _expand(tf, str(tf.locals[name]), depth - 1)
    return out


def _identity(tf: Tf, body: Mapping[str, Any]) -> Identity | None:
    member = str(body.get("member", ""))
    texts = [_expand(tf, member)]
    if "each." in member:
        texts.append(_expand(tf, str(body.get("for_each", ""))))
    for text in texts:
        for pattern, identity in IDENTITY_PATTERNS:
            if pattern.search(text):
                return identity
    return None


def _scopes(tf: Tf, rtype: str, body: Mapping[str, Any]) -> frozenset[Scope]:
    if rtype == "google_project_iam_member":
        condition = str(block(body, "condition").get("expression", ""))
        if not condition:
            return frozenset({Scope.PROJECT})
        return frozenset({Scope.DATABASE}) if "/databases/" in condition else frozenset()
    target = str(body.get(TARGET_ATTRIBUTE.get(rtype, ""), ""))
    found = {s for pattern, s in REFERENCED_SCOPES if pattern.search(target)}
    topics = {k for k in tf.locals.get("topics", {}) if f"topic:{k}" in SCOPES}
    if rtype == "google_pubsub_topic_iam_member":
        literal = re.findall(r'google_pubsub_topic\.topic\["(\w+)"\]', target)
        if literal:
            found |= {Scope(f"topic:{k}") for k in literal if k in topics}
        elif "each.value" in target:  # the topics its for_each iterates over
            text = _expand(tf, str(body.get("for_each", "")))
            found |= {Scope(f"topic:{k}") for k in re.findall(r"\w+", text) if k in topics}
    text = _expand(tf, f"{target} {body.get('for_each', '')}")
    for name in set(re.findall(r"\b(?:local|var)\.(\w+)", text)):
        found |= set(NAMED_SCOPES.get(name, ()))
    return frozenset(found)


def _variable_default(tf: Tf, name: str, overrides: Mapping[str, Any]) -> Any:
    if name in overrides:
        return overrides[name]
    return tf.variables.get(name, {}).get("default")


def _role_of(tf: Tf, raw: str, overrides: Mapping[str, Any]) -> str:
    """A role expression as the role it is: locals followed, a `var.x ? a : b` decided."""
    for _ in range(5):
        local = re.fullmatch(r"\$\{local\.(\w+)\}", raw)
        if local:
            raw = str(tf.locals.get(local.group(1), raw))
            continue
        choice = re.fullmatch(r"\$\{var\.(\w+)\s*\?\s*(.+?)\s*:\s*(.+)\}", raw)
        if choice:
            picked = choice.group(2) if _variable_default(tf, choice.group(1), overrides) \
                else choice.group(3)
            raw = picked.strip().strip('"')
            if raw.startswith("google_"):
                raw = "${" + raw + "}"
            continue
        break
    return raw


def custom_roles(tf: Tf) -> dict[str, frozenset[str]]:
    """google_project_iam_custom_role name -> its permissions (locals followed)."""
    out = {}
    for name, body in tf.resource("google_project_iam_custom_role").items():
        perms = body.get("permissions")
        local = re.fullmatch(r"\$\{local\.(\w+)\}", perms) if isinstance(perms, str) else None
        if local:
            perms = tf.locals.get(local.group(1))
        out[name] = frozenset(str(p) for p in perms or ())
    return out


def _permissions(tf: Tf, role: str, customs: Mapping[str, frozenset[str]],
                 notes: list[str]) -> frozenset[str]:
    custom = re.search(r"google_project_iam_custom_role\.(\w+)", role)
    if custom:
        return customs.get(custom.group(1), frozenset())
    if role in PREDEFINED_ROLES:
        return PREDEFINED_ROLES[role]
    note = f"role {role}: its permissions are not in spotorch.operate.iam_roles (grants nothing here)"
    if note not in notes:
        notes.append(note)
    return frozenset()


def read_grants(tf: Tf, overrides: Mapping[str, Any] | None = None,
                notes: list[str] | None = None) -> tuple[Grant, ...]:
    """Every IAM member resource of deploy/ whose member is one of spotorch's identities."""
    overrides = overrides or {}
    notes = notes if notes is not None else []
    customs = custom_roles(tf)
    grants = []
    for rtype, named in sorted(tf.resources.items()):
        if not rtype.endswith("_iam_member"):
            continue
        for name, body in sorted(named.items()):
            identity = _identity(tf, body)
            if identity is None:
                continue  # a service agent's own grant (Pub/Sub, Eventarc, the sink writer)
            role = _role_of(tf, str(body.get("role", "")), overrides)
            grants.append(Grant(f"{rtype}.{name}", identity, _scopes(tf, rtype, body), role,
                                _permissions(tf, role, customs, notes)))
    return tuple(grants)


# --- matching the map -------------------------------------------------------------------------

def _findings(calls: Iterable[Call], grants: Sequence[Grant]) -> Iterator[Finding]:
    for call in calls:
        for identity in call.identities:
            for scope, needed in call.needs:
                mine = [g for g in grants if g.identity is identity and g.covers(scope)]
                held = frozenset().union(*(g.permissions for g in mine))
                useful = tuple(sorted(g.address for g in mine if g.permissions & set(needed)))
                missing = tuple(p for p in needed if p not in held)
                yield Finding(call, identity, scope, useful, missing)


def check(directory: Path, overrides: Mapping[str, Any] | None = None,
          calls: Sequence[Call] = CALLS) -> Report:
    """The permission map against the Terraform in directory (TerraformError if unreadable)."""
    from spotorch.operate.deploy_readiness import problems

    tf = load_tf(directory)
    notes: list[str] = []
    grants = read_grants(tf, overrides, notes)
    return Report(tuple(_findings(calls, grants)), grants, tuple(notes), problems(tf))


# --- the command ------------------------------------------------------------------------------

def _parse_var(values: Sequence[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for item in values:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise click.BadParameter(f"{item!r} is not NAME=VALUE", param_hint="--var")
        out[name] = json.loads(value) if value in ("true", "false") or value.isdigit() else value
    return out


@click.group(cls=SuggestingGroup, context_settings=CONTEXT)
def deploy() -> None:
    """deploy/ checked: its grants against what spotorch calls, its Terraform against the
    providers' schemas."""


@deploy.command(name="check", context_settings=CONTEXT)
@click.option("--dir", "directory", type=click.Path(file_okay=False, path_type=Path),
              default=Path("deploy"), help="The Terraform directory.")
@click.option("--var", "variables", multiple=True, metavar="NAME=VALUE",
              help="Decide a variable as this value instead of its default "
                   "(e.g. use_custom_vertex_role=false).")
@click.option("--json", "as_json", is_flag=True, help="Print the map as JSON.")
def check_command(directory: Path, variables: tuple[str, ...], as_json: bool) -> None:
    """Every Google API method spotorch calls, the permission it needs and the grant that gives
    it, and what else a first apply needs (APIs per feature, the build account, trigger
    locations, alert policies, secrets, waits); exit 1 when one is not granted or not there."""
    try:
        report = check(directory, _parse_var(variables))
    except TerraformError as exc:
        raise click.ClickException(str(exc)) from None
    if as_json:
        click.echo(json.dumps(report.to_dict(directory), indent=2))
    else:
        for f in report.findings:
            needed = ", ".join(dict(f.call.needs)[f.scope])
            where = ("<- " + ", ".join(f.granted_by)) if not f.missing else \
                f"NOT GRANTED: {', '.join(f.missing)}"
            click.echo(f"{'ok' if not f.missing else 'MISSING':7} {f.identity:12} {f.scope:28} "
                       f"{f.call.client}: {needed} {where}")
        for note in report.notes:
            click.echo(f"note: {note}", err=True)
        for problem in report.problems:
            click.echo(f"PROBLEM {problem}")
        bad = sum(1 for f in report.findings if f.missing)
        click.echo(f"{len(report.findings)} checks (a call, as one identity, on one resource): "
                   f"{bad} not granted; {len(report.problems)} other problem(s)", err=True)
    if not report.ok:
        raise click.exceptions.Exit(1)


@deploy.command(name="schema", context_settings=CONTEXT)
@click.option("--dir", "directory", type=click.Path(file_okay=False, path_type=Path),
              default=Path("deploy"), help="The Terraform directory (with provider-schema/).")
def schema_command(directory: Path) -> None:
    """Every resource type, argument and block of the Terraform against the providers' schemas
    (the extracts in provider-schema/); exit 1 listing each one they lack."""
    from spotorch.operate.tf_schema import problems

    try:
        found = problems(directory)
    except (TerraformError, OSError, ValueError) as exc:
        raise click.ClickException(str(exc)) from None
    for line in found:
        click.echo(line)
    click.echo(f"{len(found)} problem(s)", err=True)
    if found:
        raise click.exceptions.Exit(1)


def main(argv: list[str] | None = None) -> int:
    """`spotorch deploy ...` as a delegated command: the exit code (spotorch.commandline.run)."""
    return run(deploy, argv, prog_name="spotorch deploy")


if __name__ == "__main__":
    sys.exit(main())
