"""The permission map (spotorch.operate.permissions) against the code and against deploy/.

The code side: every Google client call in spotorch's modules (those that import google.cloud;
the local stack and the simulator aside) is a row of the map, and every row names a call that is
there. The deploy side: `spotorch deploy check` passes on deploy/ and fails, naming the call, when
a grant is taken away.
"""

from __future__ import annotations

import ast
import inspect
import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from spotorch.operate import deploy_check
from spotorch.operate.permissions import CALLS, Call, Identity, Kind, Scope, permissions_of

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
SOURCES = ((ROOT / "shared", "spotorch"), (ROOT / "trainer", "spotorch_trainer"))
NOT_DEPLOYED = ("spotorch.local", "spotorch.sim")  # the local stack and the simulator

# Methods of Google's clients that build something locally and send no request.
BUILDERS = frozenset({
    "batch", "bucket", "blob", "close", "collection", "collection_group", "document", "field_path",
    "write_option", "where", "order_by", "limit", "limit_to_last", "offset", "select", "start_at",
    "start_after", "end_at", "end_before", "find_nearest", "avg", "count", "sum", "recursive",
    "pipeline", "bulk_writer", "from_string", "from_uri", "generate_signed_url", "path_helper",
    "generate_signed_post_policy_v4", "generate_upload_policy", "create_anonymous_client",
    "update_user_agent", "notification", "logger", "metric", "sink", "setup_logging",
    "flush_handlers", "get_default_handler", "resume_publish", "stop", "subscribe_path",
    "ensure_cleanup_and_commit_timer_runs", "get_mtls_endpoint_and_cert_source",
    "add_lifecycle_delete_rule", "add_lifecycle_set_storage_class_rule", "clear_lifecycle_rules",
    "add_lifecycle_abort_incomplete_multipart_upload_rule", "clear_lifecyle_rules",
    "configure_website", "disable_website", "enable_logging", "disable_logging",
})
# Calls the walk finds that are not Google's, each with why.
NOT_GOOGLE = {
    ("spotorch_trainer.storage", "LocalStorage.exists", "exists"): "pathlib.Path.exists",
    ("spotorch_trainer.storage", "_fsync_dir", "open"): "os.open",
}
# Names a dict, set or list also has: a Google call only in the form Google's client takes.
POSITIONAL_IS_NOT_GOOGLE = frozenset({"get"})  # dict.get(key); DocumentReference.get() takes none
KEYWORDS_ONLY_IS_NOT_GOOGLE = frozenset({"update"})  # dict.update(a=...); Firestore's is positional


def _public_methods(cls: type) -> set[str]:
    return {n for n in dir(cls) if not n.startswith("_") and callable(getattr(cls, n, None))
            and not isinstance(inspect.getattr_static(cls, n), property)}


def _gapic(*classes: type) -> frozenset[str]:
    names = set().union(*(_public_methods(c) for c in classes))
    return frozenset(n for n in names if not (n.endswith("_path") or n.startswith(
        ("parse_", "from_service_account", "common_"))) and n not in BUILDERS)


def vocabularies() -> dict[str, frozenset[str]]:
    """google.cloud library -> the method names of its clients that send a request."""
    import google.cloud.pubsub_v1 as pubsub_v1
    import google.cloud.storage as storage
    from google.cloud import (
        aiplatform_v1,
        bigquery,
        dataflow_v1beta3,
        dataproc_v1,
        firestore,
        monitoring_v3,
    )
    from google.cloud import logging as cloud_logging
    from google.cloud.firestore_v1 import batch, collection, document, query, transaction

    return {
        "aiplatform_v1": _gapic(aiplatform_v1.JobServiceClient, aiplatform_v1.ModelServiceClient,
                                aiplatform_v1.MetadataServiceClient,
                                aiplatform_v1.EndpointServiceClient,
                                aiplatform_v1.VizierServiceClient),
        "pubsub_v1": _gapic(pubsub_v1.PublisherClient, pubsub_v1.SubscriberClient),
        "storage": _gapic(storage.Client, storage.Bucket, storage.Blob),
        "firestore": _gapic(firestore.Client, collection.CollectionReference, query.Query,
                            document.DocumentReference, batch.WriteBatch, transaction.Transaction),
        "logging": _gapic(cloud_logging.Client),
        "dataflow_v1beta3": _gapic(dataflow_v1beta3.FlexTemplatesServiceClient,
                                   dataflow_v1beta3.JobsV1Beta3Client,
                                   dataflow_v1beta3.MessagesV1Beta3Client,
                                   dataflow_v1beta3.MetricsV1Beta3Client),
        "bigquery": _gapic(bigquery.Client, bigquery.QueryJob, bigquery.ExtractJob),
        "dataproc_v1": _gapic(dataproc_v1.BatchControllerClient),
        "monitoring_v3": _gapic(monitoring_v3.MetricServiceClient),
        # not installed here: its GAPIC client's methods by their form
        "secretmanager": frozenset({"access_secret_version", "get_secret", "list_secrets",
                                    "add_secret_version", "create_secret", "get_secret_version",
                                    "list_secret_versions", "update_secret", "delete_secret"}),
    }


SHARED_STORAGE_CLIENT = "spotorch.adapters.gcp._storage_client"


def _libraries(tree: ast.Module) -> set[str]:
    """The google.cloud libraries a module imports (anywhere, functions included)."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("google.cloud"):
            parts = (node.module or "").split(".")
            found |= {parts[2]} if len(parts) > 2 else {a.name for a in node.names}
        elif isinstance(node, ast.Import):
            found |= {a.name.split(".")[2] for a in node.names
                      if a.name.startswith("google.cloud.") and a.name.count(".") >= 2}
        # A module on the shared Storage client calls google.cloud.storage's methods through it.
        if isinstance(node, ast.ImportFrom) and node.module == SHARED_STORAGE_CLIENT:
            found.add("storage")
    return {name.split("_")[0] if name.startswith("firestore") else name for name in found}


@dataclass(frozen=True)
class Site:
    """One Google client call in the code: module, enclosing function, method, line."""

    module: str
    qualname: str
    method: str
    line: int

    @property
    def where(self) -> str:
        return f"{self.module}:{self.qualname}"


def client_calls(source: str, module: str, vocab: dict[str, frozenset[str]]) -> Iterator[Site]:
    """The calls of Google client methods in one module's source."""
    tree = ast.parse(source)
    names = frozenset().union(*(vocab.get(lib, frozenset()) for lib in _libraries(tree)))
    stack: list[str] = []

    class Walk(ast.NodeVisitor):
        def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef
                              ) -> None:
            stack.append(node.name)
            self.generic_visit(node)
            stack.pop()

        visit_AsyncFunctionDef = visit_ClassDef = visit_FunctionDef

        def visit_Call(self, node: ast.Call) -> None:
            self.generic_visit(node)
            if not isinstance(node.func, ast.Attribute) or node.func.attr not in names:
                return
            method = node.func.attr
            if method in POSITIONAL_IS_NOT_GOOGLE and node.args:
                return
            if method in KEYWORDS_ONLY_IS_NOT_GOOGLE and not node.args:
                return
            site = Site(module, ".".join(stack), method, node.lineno)
            if (module, site.qualname, method) not in NOT_GOOGLE:
                found.append(site)

    found: list[Site] = []
    Walk().visit(tree)
    yield from found


def _modules() -> Iterator[tuple[str, Path]]:
    for base, package in SOURCES:
        for path in sorted((base / package).rglob("*.py")):
            module = ".".join(path.relative_to(base).with_suffix("").parts).removesuffix(".__init__")
            if not any(module == n or module.startswith(n + ".") for n in NOT_DEPLOYED):
                yield module, path


@pytest.fixture(scope="module")
def sites() -> list[Site]:
    vocab = vocabularies()
    return [s for module, path in _modules() for s in client_calls(path.read_text(), module, vocab)]


def _mapped(site: Site) -> bool:
    return any(site.where in c.sites and c.method_name == site.method for c in CALLS)


def test_every_google_call_in_the_code_is_in_the_map(sites: list[Site]) -> None:
    assert len(sites) > 40, "the walk found too few calls: is it still reading the code?"
    unmapped = [f"{s.where} .{s.method}() (line {s.line})" for s in sites if not _mapped(s)]
    assert unmapped == [], "calls without a row in spotorch/operate/permissions.py"


def test_every_row_names_a_call_that_is_there(sites: list[Site]) -> None:
    found = {(s.where, s.method) for s in sites}
    defined = {f"{m}:{q}" for m, q in _qualnames()}
    stale = []
    for call in CALLS:
        if call.kind is not Kind.CALL:
            assert not call.sites and call.why, f"{call.client}: a {call.kind} row has no site"
            continue
        assert call.sites, f"{call.client}: a call row without a site"
        google = " " not in call.client
        for where in call.sites:
            if (google and (where, call.method_name) not in found) or where not in defined:
                stale.append(f"{call.client} at {where}")
    assert stale == []


def _qualnames() -> Iterator[tuple[str, str]]:
    for module, path in _modules():
        stack: list[str] = []

        def walk(node: ast.AST, module: str = module, stack: list[str] = stack
                 ) -> Iterator[tuple[str, str]]:
            for child in ast.iter_child_nodes(node):
                if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                    stack.append(child.name)
                    yield module, ".".join(stack)
                    yield from walk(child)
                    stack.pop()
                else:
                    yield from walk(child)

        yield from walk(ast.parse(path.read_text()))


def test_a_new_call_without_a_row_is_found() -> None:
    """The walk sees a call the map does not have (and ignores what is not Google's)."""
    source = ("def launch(client, d):\n"
              "    from google.cloud import aiplatform_v1\n"
              "    d.get('k')\n"
              "    client.create_custom_job(parent='p', custom_job=None)\n"
              "    client.delete_custom_job(name='n')\n"
              "    client.job_path('p', 'l', 'j')\n")
    found = list(client_calls(source, "spotorch.adapters.gcp.vertex", vocabularies()))
    assert [(s.qualname, s.method) for s in found] == [("launch", "create_custom_job"),
                                                       ("launch", "delete_custom_job")]
    assert not any(_mapped(s) for s in found)


def test_the_map_is_well_formed() -> None:
    for call in CALLS:
        assert call.identities and call.needs and call.source.startswith("https://"), call
        for scope, permissions in call.needs:
            assert isinstance(scope, Scope) and permissions, call
            assert all(p.count(".") >= 2 for p in permissions), call
    # the trainer's calls are made as whichever account its job runs as
    trainer = [c for c in CALLS if Identity.TRAINING in c.identities]
    assert trainer and all(Identity.JOB_ACCOUNTS in c.identities for c in trainer)
    assert all(s.startswith("spotorch_trainer.") for c in trainer for s in c.sites)
    # job logs are read through the job-log view, not from the project (deploy/logs.tf)
    assert "logging.views.access" in permissions_of(Identity.FUNCTIONS)
    assert "logging.logEntries.list" not in permissions_of(Identity.FUNCTIONS)
    # the alert secrets are the notifier's alone (deploy/notifier.tf)
    assert "secretmanager.versions.access" in permissions_of(Identity.NOTIFIER)
    assert "secretmanager.versions.access" not in permissions_of(Identity.FUNCTIONS)
    assert "artifactregistry.repositories.uploadArtifacts" in permissions_of(Identity.BUILD)


# --- spotorch deploy check -----------------------------------------------------------------------

def test_deploy_check_passes_on_deploy() -> None:
    """`spotorch deploy check --json` from the command line: every call granted, exit 0."""
    result = subprocess.run([sys.executable, "-m", "spotorch.operate.cli", "deploy", "check",
                             "--dir", str(DEPLOY), "--json"], capture_output=True, text=True,
                            timeout=120, check=False, cwd=ROOT)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    report = json.loads(result.stdout)
    assert report["ok"] and report["not_granted"] == 0
    rows = {(r["client"], r["identity"], r["resource"]): r for r in report["calls"]}
    tick = rows[("PublisherClient.publish", "functions", "topic:tick")]
    assert tick["granted_by"] == ["google_pubsub_topic_iam_member.functions_publish_tick"]
    delete = rows[("Blob.delete", "functions", "buckets:checkpoint")]
    assert delete["granted_by"] == ["google_storage_bucket_iam_member.functions_checkpoints"]
    assert rows[("ModelServiceClient.upload_model", "functions", "project")]["granted_by"] == \
        ["google_project_iam_member.functions_vertex"]
    assert {r["identity"] for r in report["calls"]} == {str(i) for i in Identity}


def test_deploy_check_passes_with_the_predefined_vertex_role() -> None:
    report = deploy_check.check(DEPLOY, {"use_custom_vertex_role": False})
    assert report.ok, [f.to_dict() for f in report.findings if f.missing]
    vertex = next(g for g in report.grants if g.address.endswith("functions_vertex"))
    assert vertex.role == "roles/aiplatform.user"


@dataclass(frozen=True)
class Removal:
    """Take text out of (or change it in) deploy/<file>: this call must then be missing."""

    file: str
    old: str
    new: str
    client: str
    identity: str
    missing: str


def _resource(rtype: str, name: str) -> str:
    return f'resource "{rtype}" "{name}" {{'


REMOVALS = [
    Removal("pubsub.tf", _resource("google_pubsub_topic_iam_member", "functions_publish_tick")
            + '\n  topic  = google_pubsub_topic.topic["tick"].id\n  role   = "roles/pubsub.'
            'publisher"\n  member = local.functions_member\n}\n', "", "PublisherClient.publish",
            "functions", "pubsub.topics.publish"),
    Removal("iam.tf", 'bucket   = each.value\n  role     = "roles/storage.objectUser"\n  member   = '
            'local.functions_member', 'bucket   = each.value\n  role     = "roles/storage.'
            'objectViewer"\n  member   = local.functions_member', "Blob.delete", "functions",
            "storage.objects.delete"),
    Removal("iam.tf", '    "aiplatform.models.upload",\n', "", "ModelServiceClient.upload_model",
            "functions", "aiplatform.models.upload"),
    Removal("iam.tf", '    "aiplatform.contexts.addContextChildren",\n', "",
            "MetadataServiceClient.add_context_children", "functions",
            "aiplatform.contexts.addContextChildren"),
    Removal("pubsub.tf", 'for_each = toset(var.pipeline_service_accounts)\n  topic    = '
            'google_pubsub_topic.topic["trainer_events"].id', 'for_each = toset(var.pipeline_'
            'service_accounts)\n  topic    = google_pubsub_topic.topic["events"].id',
            "PublisherClient.publish", "job-accounts", "pubsub.topics.publish"),
    Removal("pubsub.tf", 'role         = "roles/pubsub.viewer"',
            'role         = "roles/pubsub.subscriber"',
            "SubscriberClient.get_subscription", "operators", "pubsub.subscriptions.get"),
    Removal("logs.tf", 'role     = "roles/logging.viewAccessor"\n  member   = local.functions_member',
            'role     = "roles/logging.logWriter"\n  member   = local.functions_member',
            "GAPIC LoggingServiceV2Client.list_log_entries", "functions",
            "logging.views.access"),
    Removal("logs.tf", 'role     = "roles/logging.viewAccessor"\n  member   = each.value',
            'role     = "roles/logging.viewer"\n  member   = each.value',
            "Client.list_entries", "operators", "logging.views.access"),
    Removal("iam.tf", '  role               = "roles/iam.serviceAccountUser"\n  member             '
            '= local.functions_member\n}\n\n# Pipelines', '  role               = "roles/iam.'
            'serviceAccountTokenCreator"\n  member             = local.functions_member\n}\n\n'
            '# Pipelines', "JobServiceClient.create_custom_job", "functions",
            "iam.serviceAccounts.actAs"),
]


@pytest.mark.parametrize("removal", REMOVALS, ids=lambda r: f"{r.client}:{r.missing}")
def test_deploy_check_fails_when_a_grant_is_removed(removal: Removal, tmp_path: Path) -> None:
    for path in DEPLOY.glob("*.tf"):
        shutil.copy(path, tmp_path / path.name)
    target = tmp_path / removal.file
    text = target.read_text()
    assert text.count(removal.old) == 1, f"{removal.file} no longer holds the text once"
    target.write_text(text.replace(removal.old, removal.new))
    code = deploy_check.main(["check", "--dir", str(tmp_path), "--json"])
    assert code == 1
    report = deploy_check.check(tmp_path)
    missing = [(f.call.client, str(f.identity), p) for f in report.findings for p in f.missing]
    assert (removal.client, removal.identity, removal.missing) in missing, missing


def test_deploy_check_text_and_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert deploy_check.main(["check", "--dir", str(DEPLOY)]) == 0
    out, err = capsys.readouterr()
    assert "not granted" in err and "MISSING" not in out
    assert "aiplatform.customJobs.create <- google_project_iam_member.functions_vertex" in out
    assert deploy_check.main(["check", "--dir", str(tmp_path)]) == 1
    assert "holds no Terraform" in capsys.readouterr().err
    assert deploy_check.main(["check", "--var", "nonsense"]) == 2


def test_rows_the_check_cannot_grant_are_reported(tmp_path: Path) -> None:
    """A call whose identity has no grant at all is missing, not silently passed."""
    lonely = Call("Client.new_thing", "things.new", ((Scope.PROJECT, ("x.things.new",)),),
                  (Identity.FUNCTIONS,), ("m:f",), "https://example.com")
    report = deploy_check.check(DEPLOY, calls=(lonely,))
    assert not report.ok and report.findings[0].missing == ("x.things.new",)


def test_a_grant_on_a_resource_the_map_does_not_name_is_read_as_none(tmp_path: Path) -> None:
    """A grant on a topic no call uses (the dead-letter topic) grants nothing the map asks for,
    and does not stop the check."""
    for path in DEPLOY.glob("*.tf"):
        shutil.copy(path, tmp_path / path.name)
    extra = ('resource "google_pubsub_topic_iam_member" "odd" {\n'
             '  topic  = google_pubsub_topic.topic["dead_letter"].id\n'
             '  role   = "roles/pubsub.publisher"\n  member = local.functions_member\n}\n')
    (tmp_path / "odd.tf").write_text(extra)
    report = deploy_check.check(tmp_path)
    assert report.ok
    odd = next(g for g in report.grants if g.address.endswith(".odd"))
    assert odd.scopes == frozenset()
