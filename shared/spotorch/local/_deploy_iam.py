"""What deploy/ grants each identity at project level, read from its Terraform (python-hcl2).

The local stack gives the Vertex emulator these grants, so a function can do locally only what
its service account could do once deployed. Vertex AI's resources have no IAM of their own: the
project-level grants (google_project_iam_member) are all that decide a Vertex call. The reading
is kept in this one module so it can switch to deploy's permission map (method -> permission ->
role -> account) once that exists; it evaluates only the expression forms deploy/ uses (literals,
local.X, var.X with its default or a tfvars value, `cond ? a : b`, concat(), the custom role's
name, a service account's email) and refuses any other with the expression named.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# The permissions of the predefined roles deploy/ may grant, as far as Vertex AI is concerned
# (fnmatch patterns; Google's role reference). roles/aiplatform.user holds nearly every
# aiplatform.* permission; roles not listed here grant no aiplatform permission.
PREDEFINED_ROLES: Mapping[str, tuple[str, ...]] = {
    "roles/owner": ("*",),
    "roles/editor": ("*",),
    "roles/viewer": ("*.get", "*.list"),
    "roles/aiplatform.admin": ("aiplatform.*",),
    "roles/aiplatform.user": ("aiplatform.*",),
    "roles/aiplatform.viewer": ("aiplatform.*.get", "aiplatform.*.list"),
}

# The operator of a local stack (the person running `spotorch`): their own account, as a project
# owner, is what the CLI uses in production (docs/deploy.md).
OPERATOR = "user:developer@localhost"


class DeployReadError(ValueError):
    """deploy/ says something this reader cannot evaluate."""


@dataclass(frozen=True)
class Grants:
    """member ("serviceAccount:EMAIL") -> permission patterns granted at project level."""

    by_member: Mapping[str, tuple[str, ...]]

    def of(self, member: str) -> tuple[str, ...]:
        return self.by_member.get(member, ())


def service_account_email(account_id: str, project: str) -> str:
    return f"{account_id}@{project}.iam.gserviceaccount.com"


def _blocks(doc: Mapping[str, Any], kind: str) -> dict[str, dict[str, dict[str, Any]]]:
    """type -> name -> attributes of every `kind` block (resource, data) in a parsed file."""
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for block in doc.get(kind, ()):
        for rtype, named in block.items():
            for name, attrs in named.items():
                out.setdefault(rtype.strip('"'), {})[name.strip('"')] = attrs
    return out


_REF = re.compile(r"\$\{([^}]*)\}")


class _Evaluator:
    def __init__(self, files: Sequence[Mapping[str, Any]], tfvars: Mapping[str, Any],
                 project: str) -> None:
        self.project = project
        self.resources: dict[str, dict[str, dict[str, Any]]] = {}
        self.locals: dict[str, Any] = {}
        self.vars: dict[str, Any] = {}
        for doc in files:
            for rtype, named in _blocks(doc, "resource").items():
                self.resources.setdefault(rtype, {}).update(named)
            for block in doc.get("locals", ()):
                self.locals.update(block)
            for block in doc.get("variable", ()):
                for name, attrs in block.items():
                    self.vars[name.strip('"')] = attrs.get("default")
        self.vars.update(tfvars)
        self.vars["project_id"] = f'"{project}"'

    def value(self, raw: Any) -> Any:
        if isinstance(raw, list):
            return [self.value(x) for x in raw]
        if not isinstance(raw, str):
            return raw
        whole = re.fullmatch(r"\$\{(.*)\}", raw.strip(), re.S)
        if whole:
            return self.expr(whole.group(1).strip())
        text = raw.strip()
        if text.startswith('"') and text.endswith('"'):
            text = text[1:-1]
        return _REF.sub(lambda m: str(self.expr(m.group(1).strip())), text)

    def expr(self, text: str) -> Any:
        cond = re.fullmatch(r"(.+?)\s*\?\s*(.+?)\s*:\s*(.+)", text, re.S)
        if cond:
            return self.expr(cond.group(2) if self.expr(cond.group(1)) else cond.group(3))
        if text.startswith('"') and text.endswith('"'):
            return text[1:-1]
        if text in ("true", "false"):
            return text == "true"
        concat = re.fullmatch(r"concat\((.*)\)", text, re.S)
        if concat:
            return [x for part in concat.group(1).split(",") for x in self.expr(part.strip())]
        found = re.fullmatch(r"(local|var)\.(\w+)", text)
        if found:
            table = self.locals if found.group(1) == "local" else self.vars
            if found.group(2) not in table:
                raise DeployReadError(f"{text} is not defined in deploy/")
            return self.value(table[found.group(2)])
        role = re.fullmatch(r"google_project_iam_custom_role\.(\w+)(\[0\])?\.(name|id)", text)
        if role:
            return ("custom", role.group(1))
        account = re.fullmatch(r"google_service_account\.(\w+)\.(email|member)", text)
        if account:
            attrs = self.resources.get("google_service_account", {}).get(account.group(1))
            if attrs is None:
                raise DeployReadError(f"{text}: no such service account in deploy/")
            email = service_account_email(str(self.value(attrs["account_id"])), self.project)
            return email if account.group(2) == "email" else f"serviceAccount:{email}"
        if re.fullmatch(r"(data\.)?google_\w+\.\w+\.(email|email_address)", text):
            return f"agent-{text}"  # a Google service agent: it never calls Vertex here
        raise DeployReadError(f"cannot evaluate the expression {text!r} in deploy/")

    def permissions(self, role: Any) -> tuple[str, ...]:
        if isinstance(role, tuple) and role[0] == "custom":
            attrs = self.resources.get("google_project_iam_custom_role", {}).get(role[1])
            if attrs is None:
                raise DeployReadError(f"custom role {role[1]} is not defined in deploy/")
            return tuple(str(p) for p in self.value(attrs["permissions"]))
        return PREDEFINED_ROLES.get(str(role), ())


def _tfvars(path: Path | None) -> dict[str, Any]:
    if path is None or not path.exists():
        return {}
    import hcl2

    with path.open() as fh:
        return dict(hcl2.load(fh))


def read_grants(deploy_dir: Path, project: str, *, tfvars: Path | None = None) -> Grants:
    """Every project-level grant in deploy/*.tf: member -> the permissions its roles hold."""
    import hcl2

    files = []
    for tf in sorted(deploy_dir.glob("*.tf")):
        with tf.open() as fh:
            files.append(hcl2.load(fh))
    ev = _Evaluator(files, _tfvars(tfvars), project)
    grants: dict[str, list[str]] = {}
    for attrs in ev.resources.get("google_project_iam_member", {}).values():
        if "for_each" in attrs or ev.value(attrs.get("count", 1)) in (0, "0"):
            continue  # not made for one project's fixed identities (or made zero times)
        member = str(ev.value(attrs["member"]))
        grants.setdefault(member, []).extend(ev.permissions(ev.value(attrs["role"])))
    return Grants({m: tuple(dict.fromkeys(p)) for m, p in grants.items()})


def functions_member(deploy_dir: Path, project: str) -> str:
    """The member every Cloud Function runs as (service_config.service_account_email in
    deploy/functions.tf; one account for all, which this checks)."""
    import hcl2

    files = []
    for tf in sorted(deploy_dir.glob("*.tf")):
        with tf.open() as fh:
            files.append(hcl2.load(fh))
    ev = _Evaluator(files, {}, project)
    emails = {str(ev.value(config["service_account_email"]))
              for attrs in ev.resources.get("google_cloudfunctions2_function", {}).values()
              for config in attrs.get("service_config", ())
              if "service_account_email" in config}
    if len(emails) != 1:
        raise DeployReadError(f"expected the functions to run as one service account, found "
                              f"{sorted(emails) or 'none'} in deploy/functions.tf")
    return f"serviceAccount:{emails.pop()}"
