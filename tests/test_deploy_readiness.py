"""`spotorch deploy check` on a new project (issue 40): it passes on deploy/, and fails on a copy
of deploy/ with each defect a first apply or a feature would stumble on planted in it."""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest

from spotorch.operate import deploy_check

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"


@dataclass(frozen=True)
class Defect:
    """Replace `old` by `new` (exactly once) in deploy/<file>; check must then report `expect`
    (a sentence among its problems, or "identity permission" among the calls not granted)."""

    name: str
    file: str
    old: str
    new: str
    expect: str


DEFECTS = [
    # APIs per feature
    Defect("compute API", "main.tf", '    "compute.googleapis.com", # Dataflow', '    # Dataflow',
           "compute.googleapis.com (preprocess steps"),
    Defect("bigquery API", "main.tf", '    "bigquery.googleapis.com", # trigger.bigquery',
           "    # trigger.bigquery", "bigquery.googleapis.com (BigQuery triggers"),
    # the build account: its grants, nothing at project level, a wait
    Defect("build image push", "build.tf", 'role       = "roles/artifactregistry.writer"',
           'role       = "roles/artifactregistry.reader"',
           "build artifactregistry.repositories.uploadArtifacts"),
    Defect("build source read", "build.tf", "bucket = google_storage_bucket.source.name",
           'bucket = "some-other-bucket"', "build storage.objects.get"),
    Defect("build builder on the project", "build.tf", 'role    = "roles/logging.logWriter"',
           'role    = "roles/cloudbuild.builds.builder"',
           "the build account holds roles/cloudbuild.builds.builder on the project"),
    Defect("build wait", "functions.tf", "    time_sleep.build_account_ready,\n    "
           "google_project_iam_member.functions_event_receiver,\n    google_project_iam_member."
           "functions_firestore,\n    time_sleep.eventarc_agent_ready,\n  ]\n}\n\n# The trigger's",
           "    google_project_iam_member.functions_event_receiver,\n    google_project_iam_member."
           "functions_firestore,\n    time_sleep.eventarc_agent_ready,\n  ]\n}\n\n# The trigger's",
           "google_cloudfunctions2_function.objects does not wait for its build account"),
    # the launcher's spec and image
    Defect("spec read", "dataflow.tf", "  bucket = local.dataflow_launcher_bucket\n",
           '  bucket = "templates"\n', "functions storage.objects.get"),
    Defect("image read", "dataflow.tf", 'role       = "roles/artifactregistry.reader"',
           'role       = "roles/viewer"', "dataflow-worker artifactregistry.repositories."
                                          "downloadArtifacts"),
    # job logs through the view, not the project
    Defect("no view grant", "logs.tf", 'role     = "roles/logging.viewAccessor"\n  member   = '
           'local.functions_member', 'role     = "roles/logging.logWriter"\n  member   = '
           'local.functions_member', "functions logging.views.access"),
    # trigger locations
    Defect("no Query trigger", "bigquery.tf", 'value     = "google.cloud.bigquery.v2.JobService.Query"',
           'value     = "google.cloud.bigquery.v2.JobService.InsertJob"',
           "no BigQuery trigger takes google.cloud.bigquery.v2.JobService.Query"),
    Defect("regional BigQuery trigger", "variables.tf",
           'description = "Eventarc location of the BigQuery audit-log trigger. Which location '
           'receives a multi-region (US, EU) dataset\'s entries is not something spotorch has '
           'checked: global receives them all."\n  type        = string\n  default     = "global"',
           'description = "x"\n  type        = string\n  default     = "us-central1"',
           "location us-central1 is not global"),
    Defect("Query trigger elsewhere", "bigquery.tf", "  location        = var.bigquery_trigger_region",
           '  location        = "us-central1"', "trigger is in us-central1"),
    Defect("Dataflow trigger in one region", "functions.tf", "  location        = each.value",
           "  location        = var.region", "is not created in each region a step runs in"),
    # monitoring
    Defect("untyped alert filter", "monitoring.tf",
           'filter   = "resource.type=\\"${local.metric_resource_type}\\" AND metric.type',
           'filter   = "metric.type', "filter names no resource.type"),
    Defect("alert without the wait", "monitoring.tf",
           "depends_on = [google_logging_metric.spotorch, time_sleep.log_metrics_ready]",
           "depends_on = [google_logging_metric.spotorch]", "does not wait (>= 300s)"),
    # secrets: only the notifier
    Defect("functions read secrets", "secrets.tf",
           "secret_id = google_secret_manager_secret.alert[each.value].id\n  role      = "
           '"roles/secretmanager.secretAccessor"\n  member    = local.notifier_member',
           "secret_id = google_secret_manager_secret.alert[each.value].id\n  role      = "
           '"roles/secretmanager.secretAccessor"\n  member    = local.functions_member',
           "reads alert secrets (only the notifier may)"),
    Defect("notifier as functions", "functions.tf",
           "service_account_email = each.value.secrets ? google_service_account.notifier.email "
           ": google_service_account.functions.email\n    environment",
           "service_account_email = google_service_account.functions.email\n    environment",
           "mounts secrets but runs as"),
    # waits
    Defect("short Eventarc wait", "iam.tf", 'create_duration = "180s"', 'create_duration = "90s"',
           "the Eventarc agent's wait is 90s"),
]


def test_deploy_check_passes_on_deploy(capsys: pytest.CaptureFixture[str]) -> None:
    report = deploy_check.check(DEPLOY)
    assert report.ok, (report.problems, [f for f in report.findings if f.missing])
    assert deploy_check.main(["check", "--dir", str(DEPLOY)]) == 0


@pytest.mark.parametrize("defect", DEFECTS, ids=lambda d: d.name)
def test_deploy_check_fails_on_each_planted_defect(defect: Defect, tmp_path: Path) -> None:
    for path in DEPLOY.glob("*.tf"):
        shutil.copy(path, tmp_path / path.name)
    target = tmp_path / defect.file
    text = target.read_text()
    assert text.count(defect.old) == 1, f"{defect.file} no longer holds the text once"
    target.write_text(text.replace(defect.old, defect.new))
    assert deploy_check.main(["check", "--dir", str(tmp_path), "--json"]) == 1
    report = deploy_check.check(tmp_path)
    missing = [f"{f.identity} {p}" for f in report.findings for p in f.missing]
    assert any(defect.expect in p for p in (*report.problems, *missing)), \
        (report.problems, missing)
