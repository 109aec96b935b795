# Topics, the push subscriptions that feed the functions, dead letters, the Vertex AI log sink and
# the tick. Pub/Sub-fed functions use subscriptions of ours rather than Eventarc's managed ones:
# only ours can carry a dead-letter policy, a bounded retry, and never expire.

resource "google_pubsub_topic" "topic" {
  for_each   = local.topics
  name       = each.value
  depends_on = [google_project_service.api]
}

# One push subscription per Pub/Sub-fed function (local.pushed_functions in functions.tf).
resource "google_pubsub_subscription" "push" {
  for_each = local.pushed_functions
  name     = "${each.key}-push"
  topic    = google_pubsub_topic.topic[each.value.topic].id

  # Pub/Sub waits this long for the function's answer: longer than the function's timeout.
  ack_deadline_seconds       = 600
  message_retention_duration = "604800s"
  enable_message_ordering    = each.value.ordered

  expiration_policy {
    ttl = "" # a quiet topic must not lose its subscription after 31 days
  }

  retry_policy {
    minimum_backoff = "10s"
    maximum_backoff = "600s"
  }

  dead_letter_policy {
    dead_letter_topic     = google_pubsub_topic.topic["dead_letter"].id
    max_delivery_attempts = var.max_delivery_attempts
  }

  push_config {
    # The topic in the path lets functions-framework name the CloudEvent's source
    # (//pubsub.googleapis.com/projects/P/topics/T) exactly as Eventarc would.
    push_endpoint = "${google_cloudfunctions2_function.pushed[each.key].service_config[0].uri}/${google_pubsub_topic.topic[each.value.topic].id}"

    oidc_token {
      # the notifier's push authenticates as the notifier (notifier.tf), the others as functions
      service_account_email = each.value.secrets ? google_service_account.notifier.email : google_service_account.functions.email
      audience              = google_cloudfunctions2_function.pushed[each.key].service_config[0].uri
    }
  }

  depends_on = [
    google_cloud_run_v2_service_iam_member.pushed_invoker,
    google_cloud_run_v2_service_iam_member.notifier_invoker,
    google_service_account_iam_member.pubsub_agent_token_creator,
    google_service_account_iam_member.pubsub_agent_token_creator_notifier,
  ]
}

# Dead letters are kept here for a week for inspection and replay (docs/deploy.md).
resource "google_pubsub_subscription" "dead_letter_hold" {
  name                       = "spotorch-dead-letter-hold"
  topic                      = google_pubsub_topic.topic["dead_letter"].id
  message_retention_duration = "604800s"
  ack_deadline_seconds       = 60

  expiration_policy {
    ttl = ""
  }
}

# The Pub/Sub service agent forwards undeliverable messages: it publishes to the dead-letter
# topic and acknowledges them on the source subscription.
resource "google_pubsub_topic_iam_member" "dead_letter_publisher" {
  topic  = google_pubsub_topic.topic["dead_letter"].id
  role   = "roles/pubsub.publisher"
  member = local.pubsub_agent
}

resource "google_pubsub_subscription_iam_member" "dead_letter_subscriber" {
  for_each     = local.pushed_functions
  subscription = google_pubsub_subscription.push[each.key].id
  role         = "roles/pubsub.subscriber"
  member       = local.pubsub_agent
}

# What spotorch publishes: its own CloudEvents.
resource "google_pubsub_topic_iam_member" "functions_publish_events" {
  topic  = google_pubsub_topic.topic["events"].id
  role   = "roles/pubsub.publisher"
  member = local.functions_member
}

# The tick fans out past one function's share of live jobs: one message per shard, on the tick
# topic itself (spotorch.adapters.gcp.pubsub.PubSubShardDispatcher).
resource "google_pubsub_topic_iam_member" "functions_publish_tick" {
  topic  = google_pubsub_topic.topic["tick"].id
  role   = "roles/pubsub.publisher"
  member = local.functions_member
}

# What training jobs publish: trainer events (progress, checkpoint, preempting).
resource "google_pubsub_topic_iam_member" "training_publish_trainer_events" {
  topic  = google_pubsub_topic.topic["trainer_events"].id
  role   = "roles/pubsub.publisher"
  member = local.training_member
}

# ... and the jobs of pipelines that run as their own job.service_account: without it their
# progress, checkpoints and "preempting" never arrive (and hang detection cancels them).
resource "google_pubsub_topic_iam_member" "job_accounts_publish_trainer_events" {
  for_each = toset(var.pipeline_service_accounts)
  topic    = google_pubsub_topic.topic["trainer_events"].id
  role     = "roles/pubsub.publisher"
  member   = "serviceAccount:${each.value}"
}

# Operators: `spotorch dead-letters` pulls, acknowledges and releases held messages, and a replay
# republishes a message to the topic it came from (one of the topics the push subscriptions read).
resource "google_pubsub_subscription_iam_member" "operators_dead_letter_hold" {
  for_each     = toset(var.operators)
  subscription = google_pubsub_subscription.dead_letter_hold.id
  role         = "roles/pubsub.subscriber"
  member       = each.value
}

# `spotorch dead-letters --replay` reads a dead letter's source subscription (one of the push
# subscriptions) for its topic: GetSubscription needs pubsub.subscriptions.get, which
# pubsub.subscriber lacks. On each push subscription, not on the project.
resource "google_pubsub_subscription_iam_member" "operators_read_push_subscriptions" {
  for_each     = local.operator_push_subscriptions
  subscription = google_pubsub_subscription.push[each.value.function].id
  role         = "roles/pubsub.viewer"
  member       = each.value.member
}

resource "google_pubsub_topic_iam_member" "operators_replay" {
  for_each = local.operator_replay
  topic    = google_pubsub_topic.topic[each.value.topic].id
  role     = "roles/pubsub.publisher"
  member   = each.value.member
}

# Vertex AI job logs to the job-events topic: a hint that a job moved, so on_job_event can look.
resource "google_logging_project_sink" "job_logs" {
  name                   = "spotorch-job-logs"
  destination            = "pubsub.googleapis.com/${google_pubsub_topic.topic["job_events"].id}"
  filter                 = var.job_log_filter
  unique_writer_identity = true
}

resource "google_pubsub_topic_iam_member" "job_logs_publisher" {
  topic  = google_pubsub_topic.topic["job_events"].id
  role   = "roles/pubsub.publisher"
  member = google_logging_project_sink.job_logs.writer_identity
}

# The reconciler's heartbeat. Cloud Scheduler's own service agent publishes (no grant needed).
resource "google_cloud_scheduler_job" "tick" {
  name        = "spotorch-tick"
  region      = local.scheduler_region
  description = "spotorch reconciler tick: polls active runs and repairs what events missed."
  schedule    = var.tick_schedule
  time_zone   = "Etc/UTC"

  pubsub_target {
    topic_name = google_pubsub_topic.topic["tick"].id
    data       = base64encode("{}")
  }

  depends_on = [google_project_service.api]
}
