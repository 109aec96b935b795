# Spark preprocess steps on Dataproc Serverless (issue 42): the API, a custom role with the batch
# calls the functions make, actAs on the batches' account, and that account's grants; all of it
# only when a bundled pipeline has a `preprocess.kind: spark` step (local.spark_enabled).
# docs/preprocess.md, "Spark on Dataproc Serverless".

locals {
  spark_enabled       = length(var.pipeline_spark_regions) > 0
  dataproc_member     = "serviceAccount:${google_service_account.dataproc.email}"
  spark_driver_bucket = var.spark_driver_uri == "" ? "" : split("/", trimprefix(var.spark_driver_uri, "gs://"))[0]
  # adapters.gcp.dataproc: CreateBatch, GetBatch, ListBatches, DeleteBatch, and the cancel of a
  # batch's operation (google.longrunning CancelOperation; which of the two permissions Dataproc
  # checks for it is not documented where we looked: both are granted).
  dataproc_batch_permissions = [
    "dataproc.batches.cancel",
    "dataproc.batches.create",
    "dataproc.batches.delete",
    "dataproc.batches.get",
    "dataproc.batches.list",
    "dataproc.operations.cancel",
  ]
}

# The batches' driver and executors run as this account unless a pipeline names its own
# preprocess.service_account.
resource "google_service_account" "dataproc" {
  account_id   = "spotorch-dataproc"
  display_name = "spotorch Spark preprocess batches (Dataproc Serverless runs as this)"
  depends_on   = [google_project_service.api]
}

resource "google_project_service" "dataproc" {
  count              = local.spark_enabled ? 1 : 0
  project            = var.project_id
  service            = "dataproc.googleapis.com"
  disable_on_destroy = false
  depends_on         = [google_project_service.api]
}

resource "google_project_iam_custom_role" "dataproc_batches" {
  count       = local.spark_enabled ? 1 : 0
  project     = var.project_id
  role_id     = "spotorchDataprocBatches"
  title       = "spotorch Dataproc batches"
  description = "Create, read, list, cancel and delete the Spark preprocess steps' batches."
  permissions = local.dataproc_batch_permissions
  depends_on  = [google_project_service.api]
}

# Batches are project resources (no narrower IAM): a project-level grant of the custom role.
resource "google_project_iam_member" "functions_dataproc" {
  count   = local.spark_enabled ? 1 : 0
  project = var.project_id
  role    = google_project_iam_custom_role.dataproc_batches[0].name
  member  = local.functions_member
}

# The right to create batches that run as spotorch-dataproc, and no other.
resource "google_service_account_iam_member" "functions_act_as_dataproc" {
  count              = local.spark_enabled ? 1 : 0
  service_account_id = google_service_account.dataproc.name
  role               = "roles/iam.serviceAccountUser"
  member             = local.functions_member
}

# Dataproc Serverless's driver and executors run as the batch's account: roles/dataproc.worker.
resource "google_project_iam_member" "dataproc_worker" {
  count   = local.spark_enabled ? 1 : 0
  project = var.project_id
  role    = "roles/dataproc.worker"
  member  = local.dataproc_member
}

# The driver reads the snapshot, the code package and spotorch's driver file; writes the output.
resource "google_storage_bucket_iam_member" "dataproc_read_landing" {
  for_each = local.spark_enabled ? local.landing_buckets : toset([])
  bucket   = each.value
  role     = "roles/storage.objectViewer"
  member   = local.dataproc_member
}

resource "google_storage_bucket_iam_member" "dataproc_read_staging" {
  for_each = local.spark_enabled ? local.staging_buckets : toset([])
  bucket   = each.value
  role     = "roles/storage.objectViewer"
  member   = local.dataproc_member
}

resource "google_storage_bucket_iam_member" "dataproc_read_driver" {
  count  = local.spark_enabled && local.spark_driver_bucket != "" ? 1 : 0
  bucket = local.spark_driver_bucket
  role   = "roles/storage.objectViewer"
  member = local.dataproc_member
}

resource "google_storage_bucket_iam_member" "dataproc_write_preprocess" {
  for_each = local.spark_enabled ? local.preprocess_buckets : toset([])
  bucket   = each.value
  role     = "roles/storage.objectUser"
  member   = local.dataproc_member
}

# A batch's end, heard sooner than the tick's GetBatch where Dataproc writes it: the last Admin
# Activity audit entry of its CreateBatch operation (unverified: entrypoints/batch_entries.py),
# delivered to on_job_event as a hint and checked with GetBatch. One trigger per region with a
# Spark step (a batch's audit entries are written in its region).
resource "google_eventarc_trigger" "dataproc_batches" {
  for_each        = local.spark_enabled ? toset(var.pipeline_spark_regions) : toset([])
  name            = "spotorch-dataproc-batches"
  location        = each.value
  service_account = google_service_account.functions.email

  matching_criteria {
    attribute = "type"
    value     = "google.cloud.audit.log.v1.written"
  }
  matching_criteria {
    attribute = "serviceName"
    value     = "dataproc.googleapis.com"
  }
  matching_criteria {
    attribute = "methodName"
    value     = "google.cloud.dataproc.v1.BatchController.CreateBatch"
  }

  destination {
    cloud_run_service {
      service = google_cloudfunctions2_function.pushed["spotorch-on-job-event"].name
      region  = var.region
    }
  }

  depends_on = [time_sleep.eventarc_agent_ready, google_project_iam_member.functions_event_receiver,
  google_cloud_run_v2_service_iam_member.pushed_invoker]
}
