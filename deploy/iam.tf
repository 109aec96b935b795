# Five identities (functions, notifier in notifier.tf, training, dataflow, build in build.tf),
# each with only what it needs. Resource-level grants wherever the resource
# supports IAM; project-level only for roles that have no narrower home (each says why).

resource "google_service_account" "functions" {
  account_id   = "spotorch-functions"
  display_name = "spotorch functions (runtime and trigger identity)"
  depends_on   = [google_project_service.api]
}

resource "google_service_account" "training" {
  account_id   = "spotorch-training"
  display_name = "spotorch training jobs (Vertex AI custom jobs run as this)"
  depends_on   = [google_project_service.api]
}

# Preprocess steps (issue 31): Dataflow's launcher VM and workers run as this account unless a
# pipeline names its own preprocess.service_account.
resource "google_service_account" "dataflow" {
  account_id   = "spotorch-dataflow"
  display_name = "spotorch preprocess jobs (Dataflow workers run as this)"
  depends_on   = [google_project_service.api]
}

# Cloud Build runs the functions' builds as this account, not as the project's default build
# account: projects created since mid-2024 (or under the "disable default grants" organisation
# policy) leave the default without the rights a build needs.
resource "google_service_account" "build" {
  account_id   = "spotorch-build"
  display_name = "spotorch function builds (Cloud Build runs as this)"
  depends_on   = [google_project_service.api]
}

# Service agents spotorch's resources rely on.
resource "google_project_service_identity" "pubsub" {
  provider   = google-beta
  project    = var.project_id
  service    = "pubsub.googleapis.com"
  depends_on = [google_project_service.api]
}

# Enabling eventarc.googleapis.com does not create its service agent at once, and a Cloud Storage
# trigger created before the agent exists with its role fails with "Permission denied while using
# the Eventarc Service Agent" (hashicorp/terraform-provider-google#25294). So: create the agent,
# give it its role explicitly, and let the grant propagate before any trigger (eventarc_agent_ready).
resource "google_project_service_identity" "eventarc" {
  provider   = google-beta
  project    = var.project_id
  service    = "eventarc.googleapis.com"
  depends_on = [google_project_service.api]
}

data "google_storage_project_service_account" "gcs" {
  project    = var.project_id
  depends_on = [google_project_service.api]
}

locals {
  functions_member = "serviceAccount:${google_service_account.functions.email}"
  dataflow_member  = "serviceAccount:${google_service_account.dataflow.email}"
  training_member  = "serviceAccount:${google_service_account.training.email}"
  pubsub_agent     = "serviceAccount:${google_project_service_identity.pubsub.email}"

  # Least-privilege alternative to roles/aiplatform.user: exactly the Vertex AI methods spotorch
  # calls (shared/spotorch/operate/permissions.py; `spotorch deploy check` compares the two).
  vertex_job_permissions = [
    # custom jobs: launch, find, watch, cancel
    "aiplatform.customJobs.cancel",
    "aiplatform.customJobs.create",
    "aiplatform.customJobs.get",
    "aiplatform.customJobs.list",
    # Model Registry: UploadModel (polling its operation needs models.get), ListModelVersions,
    # MergeVersionAliases (the promotion gate moves its alias: models.update)
    "aiplatform.models.get",
    "aiplatform.models.list",
    "aiplatform.models.update",
    "aiplatform.models.upload",
    # Endpoints (model.serve): the endpoint, canary deploys, traffic splits, undeploys
    "aiplatform.endpoints.create",
    "aiplatform.endpoints.deploy",
    "aiplatform.endpoints.get",
    "aiplatform.endpoints.undeploy",
    "aiplatform.endpoints.update",
    # Experiments: the default metadata store and the experiment and run contexts
    "aiplatform.contexts.addContextChildren",
    "aiplatform.contexts.create",
    "aiplatform.contexts.get",
    "aiplatform.contexts.list",
    "aiplatform.contexts.update",
    "aiplatform.metadataStores.create",
    "aiplatform.metadataStores.get",
    # Vizier: a sweep with search vizier (its study, suggestions, measurements, completions)
    "aiplatform.studies.create",
    "aiplatform.studies.get",
    "aiplatform.trials.create",
    "aiplatform.trials.get",
    "aiplatform.trials.list",
    "aiplatform.trials.update",
  ]
  vertex_role = var.use_custom_vertex_role ? google_project_iam_custom_role.vertex_jobs[0].name : "roles/aiplatform.user"
}

resource "google_project_iam_custom_role" "vertex_jobs" {
  count       = var.use_custom_vertex_role ? 1 : 0
  project     = var.project_id
  role_id     = "spotorchVertexJobs"
  title       = "spotorch Vertex AI custom jobs"
  description = "Vertex AI custom jobs, Model Registry uploads and Experiments contexts; nothing else."
  permissions = local.vertex_job_permissions
  depends_on  = [google_project_service.api]
}

# --- functions: project level (no resource-level IAM exists for these) -------------------------

# Firestore has no per-collection IAM; the condition narrows the grant to spotorch's database.
resource "google_project_iam_member" "functions_firestore" {
  project = var.project_id
  role    = "roles/datastore.user"
  member  = local.functions_member

  condition {
    title       = "spotorch-database-only"
    description = "Only the Firestore database spotorch uses."
    expression  = "resource.name == \"projects/${var.project_id}/databases/${local.firestore_database}\""
  }
}

# Vertex AI custom jobs are project resources: launching needs a project-level grant.
resource "google_project_iam_member" "functions_vertex" {
  project = var.project_id
  role    = local.vertex_role
  member  = local.functions_member
}

# Eventarc delivers object events as this identity; the role only exists at project level.
resource "google_project_iam_member" "functions_event_receiver" {
  project = var.project_id
  role    = "roles/eventarc.eventReceiver"
  member  = local.functions_member
}

resource "google_project_iam_member" "functions_log_writer" {
  project = var.project_id
  role    = "roles/logging.logWriter"
  member  = local.functions_member
}

# A canary on a Vertex AI endpoint (model.serve) is judged on its own traffic: the endpoint's
# prediction metrics in Cloud Monitoring (ListTimeSeries: monitoring.timeSeries.list).
resource "google_project_iam_member" "functions_monitoring_viewer" {
  project = var.project_id
  role    = "roles/monitoring.viewer"
  member  = local.functions_member
}

# A failed attempt's own error (the last lines its workers wrote) is read through the job-log
# view, not from the project: logs.tf.

# --- functions: resource level -------------------------------------------------------------------

# The right to launch jobs that run as the training identity, and no other.
resource "google_service_account_iam_member" "functions_act_as_training" {
  service_account_id = google_service_account.training.name
  role               = "roles/iam.serviceAccountUser"
  member             = local.functions_member
}

# Pipelines that name their own job.service_account: the right to run jobs as those, too.
resource "google_service_account_iam_member" "functions_act_as_pipeline_accounts" {
  for_each           = toset(var.pipeline_service_accounts)
  service_account_id = "projects/-/serviceAccounts/${each.value}"
  role               = "roles/iam.serviceAccountUser"
  member             = local.functions_member
}

# Latest-checkpoint lookup (list step-*/, read _COMPLETE markers and probe reports), and deleting
# checkpoints: retention, and the diverged ones a relaunch must not find. objectUser, not
# objectViewer: a delete needs storage.objects.delete.
resource "google_storage_bucket_iam_member" "functions_checkpoints" {
  for_each = local.checkpoint_buckets
  bucket   = each.value
  role     = "roles/storage.objectUser"
  member   = local.functions_member
}

# Model registration lists the run's model folder: a prebuilt serving container must find a
# file it loads there (model.joblib, model.bst, ...) before the version is uploaded (issue 37).
resource "google_storage_bucket_iam_member" "functions_list_models" {
  for_each = local.model_buckets
  bucket   = each.value
  role     = "roles/storage.objectViewer"
  member   = local.functions_member
}

# Python packages (python_package pools): before a launch the functions upload the built packages
# the staging bucket lacks (create-if-absent: names are content hashes, nothing is overwritten,
# so creating is all it takes).
resource "google_storage_bucket_iam_member" "functions_staging" {
  for_each = local.staging_buckets
  bucket   = each.value
  role     = "roles/storage.objectCreator"
  member   = local.functions_member
}

# Snapshot completion: read marker / manifest objects and list a snapshot's prefix.
resource "google_storage_bucket_iam_member" "functions_read_landing" {
  for_each = local.landing_buckets
  bucket   = each.value
  role     = "roles/storage.objectViewer"
  member   = local.functions_member
}

# --- training jobs ---------------------------------------------------------------------------------

resource "google_project_iam_member" "training_log_writer" {
  project = var.project_id
  role    = "roles/logging.logWriter"
  member  = local.training_member
}

# Read the data snapshot.
resource "google_storage_bucket_iam_member" "training_read_data" {
  for_each = local.landing_buckets
  bucket   = each.value
  role     = "roles/storage.objectViewer"
  member   = local.training_member
}

# Write, overwrite and prune checkpoints and models. objectUser is objectAdmin without the
# right to change object ACLs/IAM, which a trainer never needs.
# Vertex's prebuilt container downloads the job's package_uris as the job's account.
resource "google_storage_bucket_iam_member" "training_read_staging" {
  for_each = local.staging_buckets
  bucket   = each.value
  role     = "roles/storage.objectViewer"
  member   = local.training_member
}

resource "google_storage_bucket_iam_member" "training_write" {
  for_each = local.training_buckets
  bucket   = each.value
  role     = "roles/storage.objectUser"
  member   = local.training_member
}

# --- a pipeline's own job.service_account ---------------------------------------------------------
# What the training account gets, for the buckets of the pipelines that name the account and no
# others (deploy/package.py lists the pairs); its trainer events: pubsub.tf.

resource "google_storage_bucket_iam_member" "job_accounts_read_data" {
  for_each = var.pipeline_account_data_buckets
  bucket   = each.value.bucket
  role     = "roles/storage.objectViewer"
  member   = "serviceAccount:${each.value.account}"

  depends_on = [google_project_service.api]
}

resource "google_storage_bucket_iam_member" "job_accounts_write" {
  for_each = var.pipeline_account_output_buckets
  bucket   = each.value.bucket
  role     = "roles/storage.objectUser"
  member   = "serviceAccount:${each.value.account}"

  depends_on = [google_project_service.api]
}

# A preprocess step that names its own service_account: its workers run as it (actAs: the
# functions' grant on pipeline_service_accounts above; reads: job_accounts_read_data), so it
# needs its kind's worker role and writes its output folder.
resource "google_project_iam_member" "step_accounts_dataflow_worker" {
  for_each = toset(var.pipeline_account_beam_workers)
  project  = var.project_id
  role     = "roles/dataflow.worker"
  member   = "serviceAccount:${each.value}"

  depends_on = [google_project_service.api]
}

resource "google_project_iam_member" "step_accounts_dataproc_worker" {
  for_each = toset(var.pipeline_account_spark_workers)
  project  = var.project_id
  role     = "roles/dataproc.worker"
  member   = "serviceAccount:${each.value}"

  depends_on = [google_project_service.api, google_project_service.dataproc]
}

resource "google_storage_bucket_iam_member" "step_accounts_write" {
  for_each = var.pipeline_account_step_output_buckets
  bucket   = each.value.bucket
  role     = "roles/storage.objectUser"
  member   = "serviceAccount:${each.value.account}"

  depends_on = [google_project_service.api]
}

# --- operators (var.operators): what the CLI calls as them ----------------------------------------
# Reads go to Firestore and Cloud Logging directly; dead letters are listed and replayed through
# Pub/Sub (pubsub.tf). Actions go through the api function (functions.tf: run.invoker).

# `spotorch runs`, `show`, `watch`, `dead-letters` (the recorded failure reasons): reads only.
resource "google_project_iam_member" "operators_firestore_read" {
  for_each = toset(var.operators)
  project  = var.project_id
  role     = "roles/datastore.viewer"
  member   = each.value

  condition {
    title       = "spotorch-database-only"
    description = "Only the Firestore database spotorch uses."
    expression  = "resource.name == \"projects/${var.project_id}/databases/${local.firestore_database}\""
  }

  depends_on = [google_project_service.api]
}

# `spotorch logs`: the training job's log entries, through the job-log view (logs.tf).

# `spotorch dead-letters --replay` reads a dead letter's source subscription: granted on the
# push subscriptions themselves (pubsub.tf, operators_read_push_subscriptions).

# --- service agents --------------------------------------------------------------------------------

# UploadModel reads the model's artifact_uri as Vertex AI's service agent, not as the caller
# (UploadModelRequest.service_account is left empty). Its own project-level role may already cover
# buckets in this project; this grant makes model buckets elsewhere work too.
resource "google_project_service_identity" "aiplatform" {
  provider   = google-beta
  project    = var.project_id
  service    = "aiplatform.googleapis.com"
  depends_on = [google_project_service.api]
}

resource "google_storage_bucket_iam_member" "vertex_agent_read_models" {
  for_each = local.model_buckets
  bucket   = each.value
  role     = "roles/storage.objectViewer"
  member   = "serviceAccount:${google_project_service_identity.aiplatform.email}"
}

# Eventarc's Cloud Storage triggers publish through a topic Eventarc creates (its name is not known
# in advance), so Google documents this grant at project level for the Cloud Storage service agent.
resource "google_project_iam_member" "gcs_agent_publisher" {
  project = var.project_id
  role    = "roles/pubsub.publisher"
  member  = "serviceAccount:${data.google_storage_project_service_account.gcs.email_address}"
}

# Pub/Sub signs push requests with an OIDC token of the functions identity.
resource "google_service_account_iam_member" "pubsub_agent_token_creator" {
  service_account_id = google_service_account.functions.name
  role               = "roles/iam.serviceAccountTokenCreator"
  member             = local.pubsub_agent
}

# The Eventarc service agent's own role. Google grants it when the API is enabled, but only once
# the agent exists; granting it here makes the order explicit.
resource "google_project_iam_member" "eventarc_agent" {
  project = var.project_id
  role    = "roles/eventarc.serviceAgent"
  member  = "serviceAccount:${google_project_service_identity.eventarc.email}"
}

# IAM changes take a while to reach Eventarc; the object-finalized functions (their triggers) wait
# for this. The workaround in #25294 waits a minute after creating the agents and another after
# granting them; Eventarc's own error says "a few minutes": this waits 3 minutes after the grant.
# Only the first apply waits (time_sleep runs on create); a failure after it is fixed by applying
# again (docs/deploy.md).
resource "time_sleep" "eventarc_agent_ready" {
  create_duration = "180s"

  depends_on = [
    google_project_iam_member.eventarc_agent,
    google_project_iam_member.gcs_agent_publisher,
  ]
}

# --- builds ----------------------------------------------------------------------------------------

# The build account's grants are in build.tf: logs, the image repository, the source bucket.

# --- preprocess steps: Dataflow (issue 31) --------------------------------------------------------

# Dataflow jobs are project resources: launching a flex template, reading a job, its messages and
# metrics, and cancelling it need a project-level grant (local.dataflow_role, dataflow.tf: a
# custom role with jobs.create, get, list, cancel, messages.list, metrics.get, or
# roles/dataflow.developer).
resource "google_project_iam_member" "functions_dataflow" {
  count   = local.dataflow_enabled ? 1 : 0
  project = var.project_id
  role    = local.dataflow_role
  member  = local.functions_member
}

# The right to launch jobs that run as spotorch-dataflow, and no other.
resource "google_service_account_iam_member" "functions_act_as_dataflow" {
  count              = local.dataflow_enabled ? 1 : 0
  service_account_id = google_service_account.dataflow.name
  role               = "roles/iam.serviceAccountUser"
  member             = local.functions_member
}

# The outputs' completion markers: read (the cache) and written once GetJob said DONE.
resource "google_storage_bucket_iam_member" "functions_preprocess" {
  for_each = local.preprocess_buckets
  bucket   = each.key # a set: key and value are the bucket
  role     = "roles/storage.objectUser"
  member   = local.functions_member
}

# Dataflow's workers lease and report work items as the worker account (project level only).
resource "google_project_iam_member" "dataflow_worker" {
  count   = local.dataflow_enabled ? 1 : 0
  project = var.project_id
  role    = "roles/dataflow.worker"
  member  = local.dataflow_member
}

# The Beam module reads the snapshot, and the launcher installs the code package.
resource "google_storage_bucket_iam_member" "dataflow_read_landing" {
  for_each = local.dataflow_enabled ? local.landing_buckets : toset([])
  bucket   = each.value
  role     = "roles/storage.objectViewer"
  member   = local.dataflow_member
}

resource "google_storage_bucket_iam_member" "dataflow_read_staging" {
  for_each = local.dataflow_enabled ? local.staging_buckets : toset([])
  bucket   = each.value
  role     = "roles/storage.objectViewer"
  member   = local.dataflow_member
}

# The output shards, and Dataflow's temp and staging files under the key's folder.
resource "google_storage_bucket_iam_member" "dataflow_write_preprocess" {
  for_each = local.dataflow_enabled ? local.preprocess_buckets : toset([])
  bucket   = each.value
  role     = "roles/storage.objectUser"
  member   = local.dataflow_member
}

# The training reads the step's output.
resource "google_storage_bucket_iam_member" "training_read_preprocess" {
  for_each = local.preprocess_buckets
  bucket   = each.value
  role     = "roles/storage.objectViewer"
  member   = local.training_member
}
