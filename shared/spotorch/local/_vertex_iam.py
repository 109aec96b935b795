"""IAM in the Vertex emulator: who calls (a bearer token), what each RPC needs, and the refusal.

Real clients send an OAuth 2 access token (`authorization: Bearer ...`) that Google maps to a
principal; the emulator does the same with a table of local tokens (the local stack makes one per
identity: the functions' account, the operator) and refuses, as Vertex does, a call without a
token (UNAUTHENTICATED), with a token it does not know (UNAUTHENTICATED), or by a principal whose
grants lack the method's permission (PERMISSION_DENIED, in Vertex's wording). Off (None) unless
the emulator is given a policy: in-process tests that do not ask for IAM are not checked.
"""

from __future__ import annotations

import fnmatch
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from spotorch.local._vertex_jobs import Invalid

SERVICE_HOST = "aiplatform.googleapis.com"
ACT_AS = "iam.serviceAccounts.actAs"

# The permission each RPC needs (Vertex AI access control page; FACTS.md "IAM for what the
# functions call"). GetOperation needs the permission to read the resource the operation is of
# (our reading: Google does not document it per method): models.get, or metadataStores.get.
METHOD_PERMISSIONS: Mapping[str, str] = {
    "JobService/CreateCustomJob": "aiplatform.customJobs.create",
    "JobService/GetCustomJob": "aiplatform.customJobs.get",
    "JobService/ListCustomJobs": "aiplatform.customJobs.list",
    "JobService/CancelCustomJob": "aiplatform.customJobs.cancel",
    "ModelService/UploadModel": "aiplatform.models.upload",
    "ModelService/GetModel": "aiplatform.models.get",
    "ModelService/ListModelVersions": "aiplatform.models.list",
    "ModelService/MergeVersionAliases": "aiplatform.models.update",
    "EndpointService/CreateEndpoint": "aiplatform.endpoints.create",
    "EndpointService/GetEndpoint": "aiplatform.endpoints.get",
    "EndpointService/DeployModel": "aiplatform.endpoints.deploy",
    "EndpointService/UndeployModel": "aiplatform.endpoints.undeploy",
    "EndpointService/MutateDeployedModel": "aiplatform.endpoints.update",
    "EndpointService/UpdateEndpoint": "aiplatform.endpoints.update",
    "PredictionService/Predict": "aiplatform.endpoints.predict",
    "MetadataService/GetMetadataStore": "aiplatform.metadataStores.get",
    "MetadataService/CreateMetadataStore": "aiplatform.metadataStores.create",
    "MetadataService/CreateContext": "aiplatform.contexts.create",
    "MetadataService/GetContext": "aiplatform.contexts.get",
    "MetadataService/UpdateContext": "aiplatform.contexts.update",
    "MetadataService/AddContextChildren": "aiplatform.contexts.addContextChildren",
    "MetadataService/ListContexts": "aiplatform.contexts.list",
    # Vizier (LookupStudy's permission is assumed to be studies.get: Google lists none for it).
    "VizierService/CreateStudy": "aiplatform.studies.create",
    "VizierService/LookupStudy": "aiplatform.studies.get",
    "VizierService/GetStudy": "aiplatform.studies.get",
    "VizierService/SuggestTrials": "aiplatform.trials.create",
    "VizierService/AddTrialMeasurement": "aiplatform.trials.update",
    "VizierService/CompleteTrial": "aiplatform.trials.update",
    "VizierService/CheckTrialEarlyStoppingState": "aiplatform.trials.get",
    "VizierService/ListOptimalTrials": "aiplatform.trials.list",
    "VizierService/GetTrial": "aiplatform.trials.get",
    "VizierService/ListTrials": "aiplatform.trials.list",
}
OPERATION_PERMISSIONS: Mapping[str, str] = {  # resource collection in the operation's name
    "models": "aiplatform.models.get",
    "endpoints": "aiplatform.endpoints.get",
    "metadataStores": "aiplatform.metadataStores.get",
    "studies": "aiplatform.studies.get",
}

# Google's wording for a call without credentials and for credentials it cannot use.
UNAUTHENTICATED_MISSING = (
    "Request is missing required authentication credential. Expected OAuth 2 access token, login "
    "cookie or other valid authentication credential. See "
    "https://developers.google.com/identity/sign-in/web/devconsole-project.")
UNAUTHENTICATED_INVALID = (
    "Request had invalid authentication credentials. Expected OAuth 2 access token, login cookie "
    "or other valid authentication credential. See "
    "https://developers.google.com/identity/sign-in/web/devconsole-project.")


def denied_message(permission: str, resource: str) -> str:
    """Vertex's PERMISSION_DENIED message for a permission on a resource name."""
    return (f"Permission '{permission}' denied on resource '//{SERVICE_HOST}/{resource}' "
            "(or it may not exist).")


@dataclass(frozen=True)
class IamPolicy:
    """Local tokens -> principals, and each principal's permissions (fnmatch patterns: a role
    that grants every aiplatform permission is `aiplatform.*`)."""

    tokens: Mapping[str, str] = field(default_factory=dict)
    grants: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    # service account email -> members granted iam.serviceAccounts.actAs on that account alone
    # (deploy/'s google_service_account_iam_member); a project-level grant of it covers all.
    act_as: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    @classmethod
    def load(cls, path: str | Path) -> IamPolicy:
        """From the JSON file the local stack writes: {"tokens": {...}, "grants": {...}}."""
        data = json.loads(Path(path).read_text())
        unknown = set(data) - {"tokens", "grants", "act_as"}
        if unknown:
            raise ValueError(f"{path}: unknown keys {sorted(unknown)} (tokens, grants, act_as)")
        return cls({str(k): str(v) for k, v in data.get("tokens", {}).items()},
                   {str(k): tuple(str(p) for p in v) for k, v in data.get("grants", {}).items()},
                   {str(k): tuple(str(m) for m in v) for k, v in data.get("act_as", {}).items()})

    def to_json(self) -> dict[str, Any]:
        return {"tokens": dict(self.tokens), "grants": {k: list(v) for k, v in self.grants.items()},
                "act_as": {k: list(v) for k, v in self.act_as.items()}}

    def principal(self, metadata: Any) -> str:
        """The caller of a request by its `authorization` metadata; Invalid(UNAUTHENTICATED)."""
        values = [str(v) for k, v in (metadata or ()) if str(k).lower() == "authorization"]
        if not values:
            raise Invalid("UNAUTHENTICATED", UNAUTHENTICATED_MISSING)
        scheme, _, token = values[0].partition(" ")
        principal = self.tokens.get(token.strip()) if scheme.lower() == "bearer" else None
        if principal is None:
            raise Invalid("UNAUTHENTICATED", UNAUTHENTICATED_INVALID)
        return principal

    def may_act_as(self, principal: str, account: str) -> bool:
        """Whether the principal holds iam.serviceAccounts.actAs on the service account."""
        return self.allows(principal, ACT_AS) or principal in self.act_as.get(account, ())

    def allows(self, principal: str, permission: str) -> bool:
        return any(fnmatch.fnmatchcase(permission, p) for p in self.grants.get(principal, ()))

    def check(self, method: str, metadata: Any, request: Any) -> None:
        """Refuse the call as Vertex would (Invalid), or return: the caller holds the permission."""
        principal = self.principal(metadata)
        permission, resource = _needed(method, request)
        if not self.allows(principal, permission):
            raise Invalid("PERMISSION_DENIED", denied_message(permission, resource))


def _needed(method: str, request: Any) -> tuple[str, str]:
    """(permission, resource name) a call needs: a create or list is checked on its parent."""
    if method == "Operations/GetOperation":
        name = str(request.name)
        parts = name.split("/")
        collection = parts[4] if len(parts) > 4 else ""
        return OPERATION_PERMISSIONS.get(collection, "aiplatform.operations.get"), name
    permission = METHOD_PERMISSIONS[method]
    for attribute in ("name", "context", "parent", "trial_name"):
        value = getattr(request, attribute, "")
        if attribute == "context" and not isinstance(value, str):  # UpdateContext: a Context
            value = getattr(value, "name", "")
        if isinstance(value, str) and value:
            return permission, value
    return permission, ""
