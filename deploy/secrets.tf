# Alert settings for the notifier (on_run_event), in Secret Manager, never in plain environment
# variables. spotorch's notifier (SECRET_ENV) names them; tests/test_deploy.py keeps the lists equal.

locals {
  secret_env_names = [
    "SPOTORCH_CHAT_WEBHOOK_URL",
    "SPOTORCH_SLACK_WEBHOOK_URL",
    "SPOTORCH_SMTP_HOST",
    "SPOTORCH_SMTP_PORT",
    "SPOTORCH_SMTP_USER",
    "SPOTORCH_SMTP_PASSWORD",
    "SPOTORCH_SMTP_FROM",
    "SPOTORCH_EMAIL_TO",
  ]

  # Plus the env variables the pipelines' routes name (a route's own webhook or recipients).
  alert_env_names = toset(concat(local.secret_env_names, var.pipeline_route_env))

  # Which names have a value from Terraform (keys only: the values stay sensitive).
  provided_secret_names = nonsensitive([for name, value in var.alert_secrets : name if value != ""])
}

resource "google_secret_manager_secret" "alert" {
  for_each = local.alert_env_names
  # SPOTORCH_CHAT_WEBHOOK_URL -> spotorch-chat-webhook-url; a route's TEAM_URL -> spotorch-team-url
  secret_id = lower(replace(startswith(each.value, "SPOTORCH_") ? each.value : "SPOTORCH_${each.value}", "_", "-"))

  replication {
    auto {}
  }

  depends_on = [google_project_service.api]
}

resource "google_secret_manager_secret_version" "alert" {
  for_each    = toset(local.provided_secret_names)
  secret      = google_secret_manager_secret.alert[each.value].id
  secret_data = var.alert_secrets[each.value]
}

# The notifier's own account (notifier.tf) reads these secrets, and nothing else does.
resource "google_secret_manager_secret_iam_member" "notifier_read_alerts" {
  for_each  = local.alert_env_names
  secret_id = google_secret_manager_secret.alert[each.value].id
  role      = "roles/secretmanager.secretAccessor"
  member    = local.notifier_member
}

# Secrets pipelines name as sm://projects/P/secrets/S route targets, read by the notifier itself.
resource "google_secret_manager_secret_iam_member" "notifier_read_route_secrets" {
  for_each  = toset(var.pipeline_route_secrets)
  secret_id = each.value
  role      = "roles/secretmanager.secretAccessor"
  member    = local.notifier_member
}
