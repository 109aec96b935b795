# The Cloud Functions (2nd gen) and the bundle they are built from.
#   on_object_finalized  Eventarc, object finalized, one function per landing bucket
#   on_job_event         push subscriptions on spotorch-job-events and spotorch-trainer-events;
#                        Eventarc's Dataflow statusChanged (preprocess steps) on the first
#   on_tick              push subscription on spotorch-tick (Cloud Scheduler)
#   on_run_event         push subscription on spotorch-events (the notifier; alert secrets; runs
#                        as spotorch-notifier, notifier.tf)
#   api                  HTTP, authenticated: operators only

locals {
  # Functions fed by our push subscriptions (pubsub.tf). Deployed as HTTP functions: main.py
  # declares them @functions_framework.cloud_event, and functions-framework turns the push body
  # into the same CloudEvent Eventarc would deliver.
  #
  # max_instances: where messages arrive in bursts (every job of a zone preempted at once, each
  # trainer reporting; a snapshot of many shards landing), a low cap turns the burst into 429s.
  # Pub/Sub counts each 429 as a failed delivery, so a burst alone could push messages to the
  # dead-letter topic after max_delivery_attempts. Those functions get var.burst_max_instances.
  # More instances do not add write conflicts: each event writes its own run's document.
  pushed_functions = {
    "spotorch-on-job-event" = {
      entry_point   = "on_job_event", topic = "job_events", secrets = false, ordered = false,
      max_instances = var.burst_max_instances
    }
    "spotorch-on-trainer-event" = {
      entry_point   = "on_job_event", topic = "trainer_events", secrets = false, ordered = false,
      max_instances = var.burst_max_instances
    }
    # One message per tick_schedule (every 5 minutes by default).
    "spotorch-on-tick" = {
      entry_point   = "on_tick", topic = "tick", secrets = false, ordered = false,
      max_instances = var.max_instances
    }
    # spotorch's events are published with the run as ordering key: alerts arrive in run order,
    # one message of a run at a time, so more instances would not drain a run's backlog faster.
    "spotorch-on-run-event" = {
      entry_point   = "on_run_event", topic = "events", secrets = true, ordered = true,
      max_instances = var.max_instances
    }
  }

  # One object-finalized function per landing bucket; the name must be stable and short.
  object_functions = {
    for bucket in local.landing_buckets : bucket => "spotorch-on-object-${substr(sha256(bucket), 0, 10)}"
  }

  event_timeout_s = 540 # the maximum for event-driven functions
  api_timeout_s   = 120

  bundle_md5 = fileexists(var.bundle_path) ? filemd5(var.bundle_path) : "missing"
}

# --- source -----------------------------------------------------------------------------------------

resource "google_storage_bucket" "source" {
  name                        = "${var.project_id}-spotorch-source"
  location                    = var.region
  uniform_bucket_level_access = true
  public_access_prevention    = "enforced"
  force_destroy               = true # holds nothing but the bundle
  depends_on                  = [google_project_service.api]
}

# Named by content: a new bundle is a new object, which makes every function rebuild.
resource "google_storage_bucket_object" "bundle" {
  name   = "spotorch-functions-${local.bundle_md5}.zip"
  bucket = google_storage_bucket.source.name
  source = var.bundle_path
}

# Images of the function builds, with old ones cleaned up (each is hundreds of MB).
resource "google_artifact_registry_repository" "functions" {
  location      = var.region
  repository_id = "spotorch-functions"
  format        = "DOCKER"
  description   = "Build images of the spotorch functions"

  cleanup_policy_dry_run = false

  cleanup_policies {
    id     = "keep-latest"
    action = "KEEP"
    most_recent_versions {
      keep_count = 2
    }
  }

  cleanup_policies {
    id     = "delete-older"
    action = "DELETE"
    condition {
      tag_state  = "ANY"
      older_than = "604800s"
    }
  }

  depends_on = [google_project_service.api]
}

# Alert secrets are mounted on the notifier only.
locals {
  mounted_secrets = {
    for name in local.alert_env_names : name => google_secret_manager_secret.alert[name].secret_id
    if contains(concat(local.provided_secret_names, var.alert_secrets_external), name)
  }
}

# --- Pub/Sub-fed functions ----------------------------------------------------------------------------

resource "google_cloudfunctions2_function" "pushed" {
  for_each    = local.pushed_functions
  name        = each.key
  location    = var.region
  description = "spotorch ${each.value.entry_point} fed by ${local.topics[each.value.topic]}"

  build_config {
    runtime           = var.python_runtime
    entry_point       = each.value.entry_point
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
    timeout_seconds                = local.event_timeout_s
    min_instance_count             = 0
    max_instance_count             = each.value.max_instances
    ingress_settings               = "ALLOW_INTERNAL_ONLY" # Pub/Sub push counts as internal
    all_traffic_on_latest_revision = true
    # the notifier runs as its own account: the only one that reads the alert secrets
    service_account_email = each.value.secrets ? google_service_account.notifier.email : google_service_account.functions.email
    environment_variables = merge(local.function_env, local.optional_env, each.value.secrets ? var.notifier_env : {})

    dynamic "secret_environment_variables" {
      for_each = each.value.secrets ? local.mounted_secrets : {}
      content {
        key        = secret_environment_variables.key
        project_id = var.project_id
        secret     = secret_environment_variables.value
        version    = "latest"
      }
    }
  }

  depends_on = [
    time_sleep.build_account_ready,
    google_project_iam_member.functions_firestore,
    google_secret_manager_secret_iam_member.notifier_read_alerts,
    google_secret_manager_secret_version.alert,
  ]
}

# The notifier's push authenticates as the notifier account: its invoker grant is notifier.tf's.
resource "google_cloud_run_v2_service_iam_member" "pushed_invoker" {
  for_each = { for name, f in local.pushed_functions : name => f if !f.secrets }
  location = var.region
  name     = google_cloudfunctions2_function.pushed[each.key].name
  role     = "roles/run.invoker"
  member   = local.functions_member
}

# --- object finalized (Eventarc) -------------------------------------------------------------------

resource "google_cloudfunctions2_function" "objects" {
  for_each    = local.object_functions
  name        = each.value
  location    = var.region
  description = "spotorch on_object_finalized for gs://${each.key}"

  build_config {
    runtime           = var.python_runtime
    entry_point       = "on_object_finalized"
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
    timeout_seconds                = local.event_timeout_s
    min_instance_count             = 0
    max_instance_count             = var.burst_max_instances # many objects land at once
    ingress_settings               = "ALLOW_INTERNAL_ONLY"
    all_traffic_on_latest_revision = true
    service_account_email          = google_service_account.functions.email
    environment_variables          = merge(local.function_env, local.optional_env)
  }

  event_trigger {
    trigger_region        = lookup(var.landing_bucket_locations, each.key, var.region)
    event_type            = "google.cloud.storage.object.v1.finalized"
    retry_policy          = "RETRY_POLICY_RETRY"
    service_account_email = google_service_account.functions.email

    event_filters {
      attribute = "bucket"
      value     = each.key
    }
  }

  # The trigger is created with the function: the Eventarc agent must be ready first (iam.tf).
  depends_on = [
    time_sleep.build_account_ready,
    google_project_iam_member.functions_event_receiver,
    google_project_iam_member.functions_firestore,
    time_sleep.eventarc_agent_ready,
  ]
}

# The trigger's identity invokes the function.
resource "google_cloud_run_v2_service_iam_member" "objects_invoker" {
  for_each = local.object_functions
  location = var.region
  name     = google_cloudfunctions2_function.objects[each.key].name
  role     = "roles/run.invoker"
  member   = local.functions_member
}

# A preprocess step's Dataflow job changed state (issue 31): Eventarc's direct Dataflow event, to
# the job-event function (it tells it from Pub/Sub pushes by its type). A hint only: the function
# reads the job with GetJob before the run changes; the tick's poll is the backstop. Dataflow's
# events are regional: one trigger in each region a step runs in (local.dataflow_regions,
# dataflow.tf), each delivering to the function in var.region.
resource "google_eventarc_trigger" "dataflow_status" {
  for_each        = local.dataflow_regions
  name            = "spotorch-dataflow-status"
  location        = each.value
  service_account = google_service_account.functions.email

  matching_criteria {
    attribute = "type"
    value     = "google.cloud.dataflow.job.v1beta3.statusChanged"
  }

  destination {
    cloud_run_service {
      service = google_cloudfunctions2_function.pushed["spotorch-on-job-event"].name
      region  = var.region
    }
  }

  # The Eventarc agent must be ready before any trigger (iam.tf), as for the object functions.
  depends_on = [time_sleep.eventarc_agent_ready, google_project_iam_member.functions_event_receiver,
  google_cloud_run_v2_service_iam_member.pushed_invoker]
}

# --- operator API ---------------------------------------------------------------------------------------

resource "google_cloudfunctions2_function" "api" {
  name        = "spotorch-api"
  location    = var.region
  description = "spotorch operator API: submit, cancel, retry (authenticated callers only)"

  build_config {
    runtime           = var.python_runtime
    entry_point       = "api"
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
    timeout_seconds                = local.api_timeout_s
    min_instance_count             = 0
    max_instance_count             = 3
    ingress_settings               = "ALLOW_ALL" # operators call from outside; IAM still required
    all_traffic_on_latest_revision = true
    service_account_email          = google_service_account.functions.email
    environment_variables          = merge(local.function_env, local.optional_env)
  }

  depends_on = [time_sleep.build_account_ready, google_project_iam_member.functions_firestore]
}

resource "google_cloud_run_v2_service_iam_member" "api_invoker" {
  for_each = toset(var.operators)
  location = var.region
  name     = google_cloudfunctions2_function.api.name
  role     = "roles/run.invoker"
  member   = each.value
}
