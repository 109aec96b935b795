# The account Cloud Build runs the function builds as (google_service_account.build, iam.tf), with
# the grants Google's build-account pages name instead of roles/cloudbuild.builds.builder on the
# project (which reads and writes every bucket, publishes to every topic, reads private logs):
# build logs, the image repository, the source bucket. Nothing else at project level.

locals {
  build_member = "serviceAccount:${google_service_account.build.email}"
}

# Build logs: written to the project (no narrower home).
resource "google_project_iam_member" "build_log_writer" {
  project = var.project_id
  role    = "roles/logging.logWriter"
  member  = local.build_member
}

# The built images: pushed to spotorch's repository only (docker_repository of every function).
resource "google_artifact_registry_repository_iam_member" "build_push_images" {
  project    = var.project_id
  location   = google_artifact_registry_repository.functions.location
  repository = google_artifact_registry_repository.functions.name
  role       = "roles/artifactregistry.writer"
  member     = local.build_member
}

# The source zip: read from spotorch's source bucket only.
resource "google_storage_bucket_iam_member" "build_read_source" {
  bucket = google_storage_bucket.source.name
  role   = "roles/storage.objectViewer"
  member = local.build_member
}

# New grants take a while to reach Cloud Build: a function created at once may fail its first
# build with a permission error. Every function waits for this (first apply only, as
# time_sleep runs on create; docs/deploy.md says what to do if a build still fails).
resource "time_sleep" "build_account_ready" {
  create_duration = "60s"

  depends_on = [
    google_project_iam_member.build_log_writer,
    google_artifact_registry_repository_iam_member.build_push_images,
    google_storage_bucket_iam_member.build_read_source,
  ]
}
