# Preprocess steps on Dataflow (issue 31), what a new project needs beyond iam.tf's grants: the
# template spec and image reads, a custom role instead of roles/dataflow.developer, and the
# regions whose statusChanged events reach on_job_event (functions.tf). Nothing here is created
# unless a bundled pipeline has a Beam preprocess step (local.dataflow_enabled).

locals {
  # gs://BUCKET/path/spec.json -> BUCKET: the functions read the spec when they launch
  dataflow_launcher_bucket = var.dataflow_launcher_template == "" ? "" : split("/", trimprefix(var.dataflow_launcher_template, "gs://"))[0]
  # REGION-docker.pkg.dev/PROJECT/REPO/IMAGE:TAG -> its repository's location, project, name
  dataflow_launcher_repo = var.dataflow_launcher_image == "" ? null : {
    location   = trimsuffix(split("/", var.dataflow_launcher_image)[0], "-docker.pkg.dev")
    project    = split("/", var.dataflow_launcher_image)[1]
    repository = split("/", var.dataflow_launcher_image)[2]
  }
  # Each region a bundled step runs in, and var.region (the steps' default may be it).
  dataflow_regions = local.dataflow_enabled ? toset(concat([var.region], var.pipeline_preprocess_regions)) : toset([])

  # Exactly the Dataflow methods spotorch calls (operate/permissions.py): launch (a flex
  # template launch is jobs.create), find, read, cancel, the error messages and billed metrics.
  dataflow_job_permissions = [
    "dataflow.jobs.cancel",
    "dataflow.jobs.create",
    "dataflow.jobs.get",
    "dataflow.jobs.list",
    "dataflow.messages.list",
    "dataflow.metrics.get",
  ]
  dataflow_role = var.use_custom_dataflow_role ? google_project_iam_custom_role.dataflow_jobs[0].name : "roles/dataflow.developer"
}

resource "google_project_iam_custom_role" "dataflow_jobs" {
  count       = var.use_custom_dataflow_role ? 1 : 0
  project     = var.project_id
  role_id     = "spotorchDataflowJobs"
  title       = "spotorch Dataflow jobs"
  description = "Launch, read and cancel Dataflow jobs, their messages and metrics; no Cloud Build, no snapshots."
  permissions = local.dataflow_job_permissions
  depends_on  = [google_project_service.api]
}

# Spec read: LaunchFlexTemplate reads the template spec (container_spec_gcs_path) as the caller.
resource "google_storage_bucket_iam_member" "functions_read_launcher_spec" {
  count  = local.dataflow_enabled && local.dataflow_launcher_bucket != "" ? 1 : 0
  bucket = local.dataflow_launcher_bucket
  role   = "roles/storage.objectViewer"
  member = local.functions_member

  depends_on = [google_project_service.api]
}

# Image read: Dataflow's launcher VM pulls the template's image as the worker account.
resource "google_artifact_registry_repository_iam_member" "dataflow_read_launcher_image" {
  count      = local.dataflow_enabled && local.dataflow_launcher_repo != null ? 1 : 0
  project    = local.dataflow_launcher_repo.project
  location   = local.dataflow_launcher_repo.location
  repository = local.dataflow_launcher_repo.repository
  role       = "roles/artifactregistry.reader"
  member     = local.dataflow_member

  depends_on = [google_project_service.api]
}
