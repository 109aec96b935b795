# What spotorch's code expects, in one place: topic names (shared/spotorch/settings.py), the
# environment every function reads (settings.FUNCTION_ENV), the APIs the project must have.
# tests/test_deploy.py reads these locals and compares them with the Python sources.

locals {
  # settings.TOPIC_*; spotorch-gcs-notifications is local-stack only (production uses Eventarc).
  topics = {
    trainer_events = "spotorch-trainer-events"
    job_events     = "spotorch-job-events"
    tick           = "spotorch-tick"
    events         = "spotorch-events"
    dead_letter    = "spotorch-dead-letter"
  }

  # Set only when given: a price table the bundle carries (SPOTORCH_PRICES at packaging time,
  # else the list prices), and spotorch's Dataflow launcher template (preprocess python_module
  # steps; deploy/dataflow-launcher/README.md builds it).
  optional_env = merge(
    var.bundle_prices == "" ? {} : { SPOTORCH_PRICES = var.bundle_prices },
    var.dataflow_launcher_template == "" ? {} : { SPOTORCH_DATAFLOW_LAUNCHER = var.dataflow_launcher_template },
    var.bigquery_location == "" ? {} : { SPOTORCH_BIGQUERY_LOCATION = var.bigquery_location },
    # preprocess steps on a project without a `default` VPC (deploy/dataflow.tf)
    var.dataflow_network == "" ? {} : { SPOTORCH_DATAFLOW_NETWORK = var.dataflow_network },
    var.dataflow_subnetwork == "" ? {} : { SPOTORCH_DATAFLOW_SUBNETWORK = var.dataflow_subnetwork },
    # Spark preprocess steps (issue 42, deploy/dataproc.tf)
    var.spark_driver_uri == "" ? {} : { SPOTORCH_SPARK_DRIVER = var.spark_driver_uri },
    local.spark_enabled ? { SPOTORCH_DATAPROC_SERVICE_ACCOUNT = google_service_account.dataproc.email } : {},
  )

  firestore_database = var.firestore_database
  scheduler_region   = coalesce(var.scheduler_region, var.region)

  # settings.FUNCTION_ENV, set on every function. Topics as full names (Settings.topic_path keeps them).
  function_env = {
    SPOTORCH_PROJECT                  = var.project_id
    SPOTORCH_REGION                   = var.region
    SPOTORCH_EVENTS_TOPIC             = google_pubsub_topic.topic["events"].id
    SPOTORCH_TRAINER_EVENTS_TOPIC     = google_pubsub_topic.topic["trainer_events"].id
    SPOTORCH_PIPELINES                = "pipelines"
    SPOTORCH_TRAINING_SERVICE_ACCOUNT = google_service_account.training.email
    SPOTORCH_FIRESTORE_DATABASE       = local.firestore_database
    SPOTORCH_DATAFLOW_SERVICE_ACCOUNT = google_service_account.dataflow.email
    SPOTORCH_SHARED_BUDGET            = var.shared_request_budget ? "1" : "0"
    LOG_EXECUTION_ID                  = "true"
  }

  # Buckets named in terraform.tfvars plus those the bundled pipelines name.
  landing_buckets    = toset(concat(var.landing_buckets, var.pipeline_landing_buckets))
  checkpoint_buckets = toset(concat(var.checkpoint_buckets, var.pipeline_checkpoint_buckets))
  model_buckets      = toset(concat(var.model_buckets, var.pipeline_model_buckets))
  training_buckets   = setunion(local.checkpoint_buckets, local.model_buckets)
  staging_buckets    = toset(var.pipeline_staging_buckets)
  # preprocess.output_uri buckets (issue 31): Dataflow writes the step's outputs there
  preprocess_buckets = toset(var.pipeline_preprocess_buckets)
  # Dataflow's grants and trigger exist only when a bundled pipeline has a Beam preprocess step
  # (each names its region), Dataproc's only with a Spark one (dataproc.tf): least privilege
  # for everyone else. The output buckets' grants (functions, training) are either kind's.
  dataflow_enabled = length(var.pipeline_preprocess_regions) > 0

  # The topics a dead letter can come from (those our push subscriptions read): operators may
  # replay to each of them.
  replay_topics = ["job_events", "trainer_events", "tick", "events"]
  operator_replay = {
    for pair in setproduct(var.operators, local.replay_topics) : "${pair[1]} ${pair[0]}" => {
      topic = pair[1], member = pair[0]
    }
  }

  # ... and read the push subscriptions a dead letter names (pubsub.tf)
  operator_push_subscriptions = {
    for pair in setproduct(var.operators, keys(local.pushed_functions)) : "${pair[1]} ${pair[0]}" => {
      function = pair[1], member = pair[0]
    }
  }

  # Every resource below depends on all of these (directly or through another resource), so a
  # fresh project enables them before anything uses them. serviceusage (enabling APIs) and
  # cloudresourcemanager (project IAM) are what Terraform itself calls first: docs/deploy.md
  # enables them with gcloud before the first apply; they are listed so the state records them.
  apis = toset([
    "aiplatform.googleapis.com",
    "artifactregistry.googleapis.com",
    "bigquery.googleapis.com", # trigger.bigquery (deploy/bigquery.tf)
    "cloudbuild.googleapis.com",
    "cloudfunctions.googleapis.com",
    "cloudresourcemanager.googleapis.com",
    "cloudscheduler.googleapis.com",
    "compute.googleapis.com", # Dataflow's workers are Compute Engine VMs (preprocess steps)
    "dataflow.googleapis.com",
    "eventarc.googleapis.com",
    "firestore.googleapis.com",
    "iam.googleapis.com",
    "logging.googleapis.com",
    "monitoring.googleapis.com",
    "pubsub.googleapis.com",
    "run.googleapis.com",
    "secretmanager.googleapis.com",
    "serviceusage.googleapis.com",
    "storage.googleapis.com",
  ])
}

resource "google_project_service" "api" {
  for_each = local.apis
  project  = var.project_id
  service  = each.value

  # Other workloads in the project may use these APIs too: never switch them off on destroy.
  disable_on_destroy = false
}
