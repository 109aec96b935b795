"""The local stack's identities: who each caller of the Vertex emulator is, and what it may do.

Every function runs as the functions' service account of deploy/ with that account's project
grants (read from deploy/*.tf by spotorch.local._deploy_iam); the person using the stack (the
CLI, tests, the demo) is the operator, a project owner. Each identity gets a random local token
per stack; the functions get theirs in SPOTORCH_VERTEX_TOKEN, the operator's is in DevStack.env,
and the Vertex emulator is handed the token -> principal table and the grants (--iam FILE).
"""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass, field
from pathlib import Path

from spotorch import settings as S
from spotorch.local._deploy_iam import OPERATOR, functions_member, read_grants

IAM_FILE = "vertex-iam.json"  # under run_dir


@dataclass
class StackIdentities:
    """Local tokens of the functions' account and of the operator."""

    functions_token: str = field(default_factory=lambda: secrets.token_urlsafe(24))
    operator_token: str = field(default_factory=lambda: secrets.token_urlsafe(24))

    def write_policy(self, path: Path, deploy_dir: Path, project: str) -> Path:
        """The emulator's --iam file: tokens -> principals, principals -> deploy/'s grants."""
        grants = read_grants(deploy_dir, project)
        member = functions_member(deploy_dir, project)
        policy = {"tokens": {self.functions_token: member, self.operator_token: OPERATOR},
                  "grants": {**{m: list(p) for m, p in grants.by_member.items()},
                             OPERATOR: ["*"]},
                  "act_as": {a: list(m) for a, m in grants.act_as.items()}}
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(policy, indent=1))
        path.chmod(0o600)
        return path

    def function_env(self) -> dict[str, str]:
        return {S.ENV_VERTEX_TOKEN: self.functions_token}

    def operator_env(self) -> dict[str, str]:
        return {S.ENV_VERTEX_TOKEN: self.operator_token}
