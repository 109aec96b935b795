# The notifier (on_run_event, functions.tf) runs as an account of its own: it alone reads the
# alert secrets (secrets.tf), so neither the internet-facing spotorch-api nor any other event
# function can. What it does besides: its alert ledger and rejected-event records in Firestore,
# its logs, and Pub/Sub's push to it (authenticated as it).

resource "google_service_account" "notifier" {
  account_id   = "spotorch-notifier"
  display_name = "spotorch notifier (on_run_event: alerts; reads the alert secrets)"
  depends_on   = [google_project_service.api]
}

locals {
  notifier_member = "serviceAccount:${google_service_account.notifier.email}"
}

# The alert ledger (claims, windows, outcomes) and the records of events it rejects.
resource "google_project_iam_member" "notifier_firestore" {
  project = var.project_id
  role    = "roles/datastore.user"
  member  = local.notifier_member

  condition {
    title       = "spotorch-database-only"
    description = "Only the Firestore database spotorch uses."
    expression  = "resource.name == \"projects/${var.project_id}/databases/${local.firestore_database}\""
  }
}

resource "google_project_iam_member" "notifier_log_writer" {
  project = var.project_id
  role    = "roles/logging.logWriter"
  member  = local.notifier_member
}

# Its push subscription calls it with an OIDC token of the notifier account (pubsub.tf).
resource "google_cloud_run_v2_service_iam_member" "notifier_invoker" {
  location = var.region
  name     = google_cloudfunctions2_function.pushed["spotorch-on-run-event"].name
  role     = "roles/run.invoker"
  member   = local.notifier_member
}

resource "google_service_account_iam_member" "pubsub_agent_token_creator_notifier" {
  service_account_id = google_service_account.notifier.name
  role               = "roles/iam.serviceAccountTokenCreator"
  member             = local.pubsub_agent
}
