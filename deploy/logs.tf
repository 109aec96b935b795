# The job-log view: Vertex AI's job entries (resource.type "ml_job") in the project's _Default log
# bucket, and nothing else. The functions (a failed attempt's error lines) and the operators
# (`spotorch logs`) read through it with roles/logging.viewAccessor on the view, instead of
# roles/logging.viewer on the project, which reads every log of the project (and its settings).
# The code names the view (spotorch.adapters.gcp.job_logs.job_log_view).

resource "google_logging_log_view" "job_logs" {
  bucket      = "projects/${var.project_id}/locations/global/buckets/_Default"
  name        = "spotorch-job-logs"
  description = "Vertex AI custom jobs' log entries, read by spotorch's functions and operators."
  filter      = "resource.type = \"ml_job\""

  depends_on = [google_project_service.api]
}

resource "google_logging_log_view_iam_member" "functions_read_job_logs" {
  parent   = "projects/${var.project_id}"
  location = "global"
  bucket   = "_Default"
  name     = google_logging_log_view.job_logs.id
  role     = "roles/logging.viewAccessor"
  member   = local.functions_member
}

resource "google_logging_log_view_iam_member" "operators_read_job_logs" {
  for_each = toset(var.operators)
  parent   = "projects/${var.project_id}"
  location = "global"
  bucket   = "_Default"
  name     = google_logging_log_view.job_logs.id
  role     = "roles/logging.viewAccessor"
  member   = each.value
}
