"""deploy/*.tf against the google, google-beta and time providers' schemas (the extracts vendored
in deploy/provider-schema/): unknown resource types, arguments and blocks fail, every one listed."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from spotorch.operate import deploy_check
from spotorch.operate.tf_schema import SCHEMA_DIR, SCHEMA_FILES, problems

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"


def test_deploy_matches_the_provider_schemas() -> None:
    assert problems(DEPLOY) == []


def test_each_extract_says_where_it_comes_from() -> None:
    for file in SCHEMA_FILES.values():
        source = json.loads((DEPLOY / SCHEMA_DIR / file).read_text())["_source"]
        assert source["repository"].startswith("https://github.com/hashicorp/terraform-provider-")
        assert len(source["commit"]) == 40 and source["ref"] and source["files"]
    google = json.loads((DEPLOY / SCHEMA_DIR / SCHEMA_FILES["google"]).read_text())["_source"]
    assert google["ref"] == "v6.50.0" and google["commit"].startswith("956f5109")
    readme = (DEPLOY / SCHEMA_DIR / "README.md").read_text()
    assert all(file in readme for file in SCHEMA_FILES.values())


@pytest.fixture
def doctored(tmp_path: Path) -> Path:
    for path in DEPLOY.glob("*.tf"):
        shutil.copy(path, tmp_path / path.name)
    shutil.copytree(DEPLOY / SCHEMA_DIR, tmp_path / SCHEMA_DIR)
    return tmp_path


def _edit(directory: Path, file: str, old: str, new: str) -> None:
    path = directory / file
    text = path.read_text()
    assert text.count(old) == 1, f"{file} no longer holds {old!r} once"
    path.write_text(text.replace(old, new))


EDITS = [
    ("pubsub.tf", 'resource "google_pubsub_topic" "topic" {', 'resource "google_pubsub_topics" "topic" {',
     "google_pubsub_topics.topic: resource type google_pubsub_topics is not in"),
    ("pubsub.tf", "  ack_deadline_seconds       = 600\n", "  ack_deadline_second = 600\n",
     "google_pubsub_subscription.push: argument 'ack_deadline_second' is not in the schema"),
    ("pubsub.tf", "  retry_policy {\n    minimum_backoff", "  retry_polcy {\n    minimum_backoff",
     "google_pubsub_subscription.push: block 'retry_polcy' is not in the schema"),
    ("iam.tf", '  account_id   = "spotorch-functions"\n',
     '  account_id   = "spotorch-functions"\n  email        = "x@y"\n',
     "google_service_account.functions: 'email' is computed by the provider, it cannot be set"),
    ("iam.tf", '  account_id   = "spotorch-training"\n', "",
     "google_service_account.training: required 'account_id' is missing"),
    # a 7.x argument: not in 6.50
    ("functions.tf", '    ingress_settings               = "ALLOW_ALL"',
     '    ingress_settings               = "ALLOW_ALL"\n'
     '    direct_vpc_egress              = "VPC_EGRESS_ALL_TRAFFIC"',
     "google_cloudfunctions2_function.api.service_config: argument 'direct_vpc_egress' is not in"),
    ("pubsub.tf", '  expiration_policy {\n    ttl = ""\n  }\n}\n\n# The Pub/Sub service agent',
     '  expiration_policy = { ttl = "" }\n}\n\n# The Pub/Sub service agent',
     "google_pubsub_subscription.dead_letter_hold: 'expiration_policy' is a block, written as"),
    ("firestore.tf", "  ttl_config {}\n", "  ttl_config {}\n  ttl_config {}\n",
     "google_firestore_field.ttl: 2 'ttl_config' blocks, at most 1"),
    ("iam.tf", '  provider   = google-beta\n  project    = var.project_id\n  service    = "pubsub.'
     'googleapis.com"', '  project    = var.project_id\n  service    = "pubsub.googleapis.com"',
     "google_project_service_identity.pubsub: resource type google_project_service_identity is "
     "not in https://github.com/hashicorp/terraform-provider-google v6.50.0"),
]


@pytest.mark.parametrize("file, old, new, expect", EDITS, ids=[e[3][:60] for e in EDITS])
def test_a_mistake_is_found(doctored: Path, file: str, old: str, new: str, expect: str) -> None:
    _edit(doctored, file, old, new)
    found = problems(doctored)
    assert any(expect in p for p in found), found


def test_every_problem_is_listed(doctored: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _edit(doctored, "pubsub.tf", "  ack_deadline_seconds       = 600\n", "  ack_deadline_second = 600\n")
    _edit(doctored, "iam.tf", '  account_id   = "spotorch-training"\n', "")
    _edit(doctored, "firestore.tf", "  ttl_config {}\n", "  ttl_configs {}\n")
    assert len(problems(doctored)) == 3
    assert deploy_check.main(["schema", "--dir", str(doctored)]) == 1
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 3 and any("ttl_configs" in line for line in out)
    assert deploy_check.main(["schema", "--dir", str(DEPLOY)]) == 0
