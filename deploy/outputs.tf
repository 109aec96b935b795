output "api_url" {
  description = "Operator API (call with an identity token of a member of var.operators)."
  value       = google_cloudfunctions2_function.api.service_config[0].uri
}

output "functions_service_account" {
  description = "Identity of the functions and of their triggers."
  value       = google_service_account.functions.email
}

output "training_service_account" {
  description = "Identity Vertex AI training jobs run as (SPOTORCH_TRAINING_SERVICE_ACCOUNT)."
  value       = google_service_account.training.email
}

output "topics" {
  description = "Topic full names by role; subscribe to events for spotorch's own CloudEvents."
  value       = { for key, topic in google_pubsub_topic.topic : key => topic.id }
}

output "dead_letter_subscription" {
  description = "Pull subscription holding messages no function could process."
  value       = google_pubsub_subscription.dead_letter_hold.id
}

output "functions" {
  description = "Deployed function names."
  value = concat(
    [for f in google_cloudfunctions2_function.pushed : f.name],
    [for f in google_cloudfunctions2_function.objects : f.name],
    [google_cloudfunctions2_function.api.name],
  )
}

output "landing_buckets" {
  description = "Buckets whose new objects start runs."
  value       = sort(tolist(local.landing_buckets))
}

output "source_bucket" {
  description = "Bucket holding the functions' source bundle."
  value       = google_storage_bucket.source.name
}
