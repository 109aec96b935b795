# BigQuery as a data source (trigger.bigquery; docs/pipelines.md): the audit-log trigger of
# on_table_changed and the least the functions and the training jobs need. Nothing here is
# created unless a bundled pipeline watches a table (deploy/package.py fills the variables).
#
# The audit entries: BigQuery writes its Data Access audit logs (where a job's jobChange and
# tableDataChange entries are) without an audit config of ours; Google's BigQuery audit-log
# page says they cannot be turned off, so no google_project_iam_audit_config is needed.

locals {
  bigquery_watched_datasets  = toset(var.pipeline_bigquery_watched_datasets)  # "project:dataset"
  bigquery_snapshot_datasets = toset(var.pipeline_bigquery_snapshot_datasets) # "project:dataset"
  export_buckets             = toset(var.pipeline_export_buckets)
  bigquery_enabled           = length(local.bigquery_watched_datasets) > 0
}

# Jobs in the project: the snapshot query and the extract job (jobs.create), and jobs.get of
# the job an audit entry names (any user's) and of our own. Nothing else at the project level.
resource "google_project_iam_custom_role" "bigquery_jobs" {
  count       = local.bigquery_enabled ? 1 : 0
  project     = var.project_id
  role_id     = "spotorchBigQueryJobs"
  title       = "spotorch BigQuery jobs"
  description = "Create BigQuery jobs and read any job's state; no table data."
  permissions = ["bigquery.jobs.create", "bigquery.jobs.get"]
  depends_on  = [google_project_service.api]
}

resource "google_project_iam_member" "functions_bigquery_jobs" {
  count   = local.bigquery_enabled ? 1 : 0
  project = var.project_id
  role    = google_project_iam_custom_role.bigquery_jobs[0].name
  member  = local.functions_member
}

# The watched tables: tables.get (the source of truth) and getData (the snapshot query reads
# them). Dataset IAM takes no conditions: the whole dataset of each watched table.
resource "google_bigquery_dataset_iam_member" "functions_read_watched" {
  for_each   = local.bigquery_watched_datasets
  project    = split(":", each.value)[0]
  dataset_id = split(":", each.value)[1]
  role       = "roles/bigquery.dataViewer"
  member     = local.functions_member
}

# The snapshot dataset: create the snapshot tables, write them, export them.
resource "google_bigquery_dataset_iam_member" "functions_snapshots" {
  for_each   = local.bigquery_snapshot_datasets
  project    = split(":", each.value)[0]
  dataset_id = split(":", each.value)[1]
  role       = "roles/bigquery.dataEditor"
  member     = local.functions_member
}

# The extract job writes the Parquet files as its caller; the functions list what it wrote.
resource "google_storage_bucket_iam_member" "functions_write_exports" {
  for_each = local.export_buckets
  bucket   = each.value
  role     = "roles/storage.objectCreator"
  member   = local.functions_member
}

resource "google_storage_bucket_iam_member" "functions_read_exports" {
  for_each = local.export_buckets
  bucket   = each.value
  role     = "roles/storage.objectViewer"
  member   = local.functions_member
}

# The run's data is the export.
resource "google_storage_bucket_iam_member" "training_read_exports" {
  for_each = local.export_buckets
  bucket   = each.value
  role     = "roles/storage.objectViewer"
  member   = local.training_member
}

resource "google_cloudfunctions2_function" "tables" {
  count       = local.bigquery_enabled ? 1 : 0
  name        = "spotorch-on-table-changed"
  location    = var.region
  description = "spotorch on_table_changed: BigQuery load and DML jobs (Cloud Audit Logs)"

  build_config {
    runtime           = var.python_runtime
    entry_point       = "on_table_changed"
    docker_repository = google_artifact_registry_repository.functions.id
    service_account   = google_service_account.build.id # projects/P/serviceAccounts/EMAIL

    source {
      storage_source {
        bucket = google_storage_bucket.source.name
        object = google_storage_bucket_object.bundle.name
      }
    }
  }

  service_config {
    available_memory               = var.function_memory
    timeout_seconds                = local.event_timeout_s # a snapshot query and an export
    min_instance_count             = 0
    max_instance_count             = var.burst_max_instances # many loads end at once
    ingress_settings               = "ALLOW_INTERNAL_ONLY"
    all_traffic_on_latest_revision = true
    service_account_email          = google_service_account.functions.email
    environment_variables          = merge(local.function_env, local.optional_env)
  }

  event_trigger {
    trigger_region        = var.bigquery_trigger_region
    event_type            = "google.cloud.audit.log.v1.written"
    retry_policy          = "RETRY_POLICY_RETRY"
    service_account_email = google_service_account.functions.email

    event_filters {
      attribute = "serviceName"
      value     = "bigquery.googleapis.com"
    }
    event_filters {
      attribute = "methodName"
      value     = "google.cloud.bigquery.v2.JobService.InsertJob"
    }
  }

  depends_on = [
    time_sleep.build_account_ready,
    google_project_iam_member.functions_event_receiver,
    google_project_iam_member.functions_firestore,
    time_sleep.eventarc_agent_ready,
  ]
}

# Jobs made by the jobs.query RPC (the console, `bq query`, client.query_and_wait, most DML) are
# logged under methodName ...JobService.Query, not ...InsertJob (BigQueryAuditMetadata
# JobInsertion.Reason QUERY_REQUEST): a second trigger, as a function has only one, to the same
# service, in the same location and as the same identity.
resource "google_eventarc_trigger" "tables_query" {
  count           = local.bigquery_enabled ? 1 : 0
  name            = "spotorch-on-table-changed-query"
  location        = var.bigquery_trigger_region
  service_account = google_service_account.functions.email

  matching_criteria {
    attribute = "type"
    value     = "google.cloud.audit.log.v1.written"
  }
  matching_criteria {
    attribute = "serviceName"
    value     = "bigquery.googleapis.com"
  }
  matching_criteria {
    attribute = "methodName"
    value     = "google.cloud.bigquery.v2.JobService.Query"
  }

  destination {
    cloud_run_service {
      service = google_cloudfunctions2_function.tables[0].name
      region  = var.region
    }
  }

  depends_on = [time_sleep.eventarc_agent_ready, google_project_iam_member.functions_event_receiver,
  google_cloud_run_v2_service_iam_member.tables_invoker]
}

resource "google_cloud_run_v2_service_iam_member" "tables_invoker" {
  count    = local.bigquery_enabled ? 1 : 0
  location = var.region
  name     = google_cloudfunctions2_function.tables[0].name
  role     = "roles/run.invoker"
  member   = local.functions_member
}
