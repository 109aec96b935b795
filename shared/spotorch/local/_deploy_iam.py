"""What deploy/ grants each identity at project level, for the local stack's Vertex emulator.

The local stack gives the Vertex emulator these grants, so a function can do locally only what
its service account could do once deployed. Vertex AI's resources have no IAM of their own: the
project-level grants are all that decide a Vertex call. The grants are read by deploy's own
reader (spotorch.operate.deploy_check.read_grants, the one `spotorch deploy check` matches the
permission map against), so the stack and the check never disagree about deploy/.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# The operator of a local stack (the person running `spotorch`, the demo, the tests): the one
# who deploys, a project owner. deploy/'s var.operators get less (they act through the api
# function); their calls to Vertex are not what the local stack checks.
OPERATOR = "user:developer@localhost"


class DeployReadError(ValueError):
    """deploy/ says something its reader cannot evaluate."""


@dataclass(frozen=True)
class Grants:
    """member ("serviceAccount:EMAIL") -> permission patterns granted at project level, and
    service account email -> the members deploy/ lets act as it (iam.serviceAccounts.actAs
    granted on that account)."""

    by_member: Mapping[str, tuple[str, ...]]
    act_as: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    def of(self, member: str) -> tuple[str, ...]:
        return self.by_member.get(member, ())


def service_account_email(account_id: str, project: str) -> str:
    return f"{account_id}@{project}.iam.gserviceaccount.com"


def _accounts(tf: Any, project: str) -> dict[str, str]:
    """deploy/'s service accounts by resource name -> member."""
    return {name: f"serviceAccount:{service_account_email(str(body['account_id']), project)}"
            for name, body in tf.resource("google_service_account").items()
            if "account_id" in body}


def read_grants(deploy_dir: Path, project: str,
                overrides: Mapping[str, Any] | None = None) -> Grants:
    """Every project-level grant of deploy/ to its service accounts: member -> permissions."""
    from spotorch.operate.deploy_check import read_grants as deploy_grants
    from spotorch.operate.permissions import Scope
    from spotorch.operate.terraform import TerraformError, load_tf

    try:
        tf = load_tf(deploy_dir)
        grants = deploy_grants(tf, overrides)
    except TerraformError as exc:
        raise DeployReadError(str(exc)) from exc
    accounts = _accounts(tf, project)
    out: dict[str, list[str]] = {}
    act_as: dict[str, list[str]] = {}
    on_accounts = tf.resource("google_service_account_iam_member")
    for grant in grants:
        member = accounts.get(str(grant.identity))
        if member is None:
            continue
        # the project's, and the job-log view's (the emulator's entries are all in that view)
        if Scope.PROJECT in grant.scopes or Scope.JOB_LOG_VIEW in grant.scopes:
            out.setdefault(member, []).extend(sorted(grant.permissions))
        kind, _, name = grant.address.partition(".")
        if kind == "google_service_account_iam_member" and \
                "iam.serviceAccounts.actAs" in grant.permissions:
            target = re.search(r"google_service_account\.(\w+)\.",
                               str(on_accounts.get(name, {}).get("service_account_id", "")))
            account = accounts.get(target.group(1)) if target else None
            if account is not None:
                act_as.setdefault(account.removeprefix("serviceAccount:"), []).append(member)
    return Grants({m: tuple(dict.fromkeys(p)) for m, p in out.items()},
                  {a: tuple(dict.fromkeys(m)) for a, m in act_as.items()})


@functools.lru_cache(maxsize=16)  # the stack's env asks on every read: parse deploy/ once
def account_email(deploy_dir: Path, project: str, resource: str) -> str:
    """The email of deploy/'s service account resource `resource` (e.g. "dataflow")."""
    from spotorch.operate.terraform import load_tf

    member = _accounts(load_tf(deploy_dir), project).get(resource)
    if member is None:
        raise DeployReadError(f"deploy/ has no google_service_account.{resource}")
    return member.removeprefix("serviceAccount:")


def functions_member(deploy_dir: Path, project: str) -> str:
    """The member every Cloud Function runs as (service_config.service_account_email in
    deploy/functions.tf; one account for all but the notifier, which this checks)."""
    from spotorch.operate.terraform import load_tf

    tf = load_tf(deploy_dir)
    accounts = _accounts(tf, project)
    used = {found for body in tf.resource("google_cloudfunctions2_function").values()
            for config in body.get("service_config", ())
            for found in [str(config.get("service_account_email", ""))]}
    names = {name for name in accounts for text in used
             if f"google_service_account.{name}." in text}
    # The notifier (on_run_event) runs as its own account (deploy/notifier.tf): it makes none
    # of the calls the emulators check IAM on (Vertex AI, Dataflow, Cloud Logging reads).
    names.discard("notifier")
    if len(names) != 1:
        raise DeployReadError(f"expected the functions to run as one of deploy/'s service "
                              f"accounts, found {sorted(used) or 'none'} in deploy/functions.tf")
    return accounts[names.pop()]
