# Inputs. Only project_id is required; buckets also come from the pipelines (build/pipelines.tfvars.json).

variable "project_id" {
  description = "Google Cloud project to deploy into."
  type        = string
}

variable "region" {
  description = "Region of the functions, topics' consumers, scheduler and (by default) Firestore."
  type        = string
  default     = "us-central1"
}

variable "landing_buckets" {
  description = "Existing buckets where data lands; each gets an Eventarc object-finalized trigger."
  type        = list(string)
  default     = []
}

variable "landing_bucket_locations" {
  description = "Bucket -> location for landing buckets outside var.region (e.g. \"us\" for the US multi-region)."
  type        = map(string)
  default     = {}
}

variable "checkpoint_buckets" {
  description = "Existing buckets holding checkpoints (training writes, functions read)."
  type        = list(string)
  default     = []
}

variable "model_buckets" {
  description = "Existing buckets receiving trained models (training writes)."
  type        = list(string)
  default     = []
}

# The pipeline_* lists are written by deploy/package.py from the pipelines it bundles.
variable "pipeline_landing_buckets" {
  description = "Generated: trigger buckets named by the bundled pipelines."
  type        = list(string)
  default     = []
}

variable "pipeline_checkpoint_buckets" {
  description = "Generated: buckets of the bundled pipelines' checkpoint_uri."
  type        = list(string)
  default     = []
}

variable "pipeline_model_buckets" {
  description = "Generated: buckets of the bundled pipelines' output_uri / base_output_uri."
  type        = list(string)
  default     = []
}

variable "pipeline_service_accounts" {
  description = "Generated: service accounts the bundled pipelines run their jobs as (job.service_account)."
  type        = list(string)
  default     = []
}

variable "pipeline_staging_buckets" {
  description = "Generated: buckets of the bundled pipelines' job.staging_uri (their built Python packages)."
  type        = list(string)
  default     = []
}

variable "pipeline_preprocess_buckets" {
  description = "Generated: buckets of the bundled pipelines' preprocess.output_uri (the preprocess step's outputs)."
  type        = list(string)
  default     = []
}

variable "pipeline_account_data_buckets" {
  description = "Generated: \"account bucket\" -> {account, bucket} for the trigger, export, staging and preprocess-output buckets of each pipeline with its own job.service_account (read)."
  type        = map(object({ account = string, bucket = string }))
  default     = {}
}

variable "pipeline_account_output_buckets" {
  description = "Generated: \"account bucket\" -> {account, bucket} for the checkpoint and model buckets of each pipeline with its own job.service_account (write)."
  type        = map(object({ account = string, bucket = string }))
  default     = {}
}

variable "pipeline_account_beam_workers" {
  description = "Generated: the preprocess.service_account of each Beam step that names one: its Dataflow workers run as it (roles/dataflow.worker)."
  type        = list(string)
  default     = []
}

variable "pipeline_account_spark_workers" {
  description = "Generated: the preprocess.service_account of each Spark step that names one: its batch runs as it (roles/dataproc.worker)."
  type        = list(string)
  default     = []
}

variable "pipeline_account_step_output_buckets" {
  description = "Generated: \"account bucket\" -> {account, bucket} for the preprocess.output_uri buckets of each step with its own preprocess.service_account (write)."
  type        = map(object({ account = string, bucket = string }))
  default     = {}
}

variable "pipeline_route_env" {
  description = "Generated: env variables the bundled pipelines' alert routes name (webhook URLs, recipients)."
  type        = list(string)
  default     = []
}

variable "pipeline_route_secrets" {
  description = "Generated: Secret Manager secrets (projects/P/secrets/S) the pipelines' routes name as sm://."
  type        = list(string)
  default     = []
}

variable "bundle_prices" {
  description = "Generated: the price table the bundle carries (deploy.sh with SPOTORCH_PRICES set), relative to the bundle; empty: the shipped list prices."
  type        = string
  default     = ""
}

variable "dataflow_launcher_template" {
  description = "gs:// path of spotorch's Dataflow launcher flex template spec (built from deploy/dataflow-launcher/), for preprocess steps that name a python_module; empty: such steps are refused at launch, template_uri steps need nothing."
  type        = string
  default     = ""
}

variable "dataflow_launcher_image" {
  description = "The launcher template's container image (REGION-docker.pkg.dev/PROJECT/REPO/IMAGE:TAG, deploy/dataflow-launcher/README.md): spotorch-dataflow gets roles/artifactregistry.reader on its repository, which Dataflow's launcher VM pulls it from. Empty: no grant (set it with dataflow_launcher_template)."
  type        = string
  default     = ""

  validation {
    condition     = var.dataflow_launcher_image == "" || can(regex("^[a-z0-9-]+-docker\\.pkg\\.dev/[^/]+/[^/]+/.+", var.dataflow_launcher_image))
    error_message = "dataflow_launcher_image must be an Artifact Registry image: REGION-docker.pkg.dev/PROJECT/REPO/IMAGE[:TAG]."
  }
}

variable "dataflow_network" {
  description = "VPC network Dataflow's workers use (a name, or projects/P/global/networks/N); empty: Dataflow's default, the project's `default` network, which organisation policy often leaves out. A step's preprocess.network overrides it."
  type        = string
  default     = ""
}

variable "dataflow_subnetwork" {
  description = "Subnetwork of the workers (https://www.googleapis.com/compute/v1/projects/P/regions/R/subnetworks/S or regions/R/subnetworks/S); needed for a custom-mode network. A step's preprocess.subnetwork overrides it."
  type        = string
  default     = ""
}

variable "use_custom_dataflow_role" {
  description = "Grant the functions a custom role with only the Dataflow permissions spotorch uses (create, get, list and cancel jobs; messages; metrics) instead of roles/dataflow.developer."
  type        = bool
  default     = true
}

variable "pipeline_preprocess_regions" {
  description = "Generated: the regions the bundled pipelines' Beam preprocess steps run in (preprocess.region); each gets a Dataflow statusChanged trigger; any: Dataflow's API grants."
  type        = list(string)
  default     = []
}

variable "pipeline_spark_regions" {
  description = "Generated: the regions the bundled pipelines' Spark preprocess steps (preprocess.kind: spark) run in; any: Dataproc's API and grants (deploy/dataproc.tf)."
  type        = list(string)
  default     = []
}

variable "spark_driver_uri" {
  description = "gs:// URI of spotorch's PySpark driver (deploy/spark-driver/spotorch_spark_main.py, uploaded by you): the main file of every Spark step's batch (SPOTORCH_SPARK_DRIVER). Empty: a Spark step's launch is refused."
  type        = string
  default     = ""
}

variable "bigquery_location" {
  description = "Location of the BigQuery snapshot datasets when it is neither US nor EU (e.g. europe-west4): jobs.get of spotorch's snapshot and export jobs needs it (SPOTORCH_BIGQUERY_LOCATION); empty: US or EU."
  type        = string
  default     = ""
}

variable "bundle_path" {
  description = "Zip built by deploy/package.py (main.py, spotorch, spotorch_trainer, requirements.txt, pipelines/)."
  type        = string
  default     = "build/spotorch-functions.zip"
}

variable "alert_secrets" {
  description = "Alert settings stored in Secret Manager, by env var name (local.secret_env_names, or a pipeline route's target). Values end up in Terraform state: keep state private, or use alert_secrets_external."
  type        = map(string)
  default     = {}
  sensitive   = true
}

variable "alert_secrets_external" {
  description = "Names of alert secrets whose versions you add yourself (gcloud secrets versions add); mounted without Terraform seeing the value."
  type        = list(string)
  default     = []
}

variable "notifier_env" {
  description = "Optional, non-secret notifier settings (NOTIFY_OPTIONAL_ENV, e.g. SPOTORCH_ALERT_MAX_PER_WINDOW)."
  type        = map(string)
  default     = {}
}

variable "operators" {
  description = "IAM members allowed to call the operator API (e.g. \"group:ml-oncall@example.com\")."
  type        = list(string)
  default     = []
}

variable "firestore_database" {
  description = "Firestore database id the functions use."
  type        = string
  default     = "(default)"
}

variable "create_firestore_database" {
  description = "Create the Firestore database (false when it already exists in the project)."
  type        = bool
  default     = true
}

variable "firestore_location" {
  description = "Firestore location; defaults to var.region."
  type        = string
  default     = null
}

variable "firestore_deletion_policy" {
  description = "ABANDON keeps the database and its run history on destroy; DELETE removes it."
  type        = string
  default     = "ABANDON"

  validation {
    condition     = contains(["ABANDON", "DELETE"], var.firestore_deletion_policy)
    error_message = "firestore_deletion_policy must be ABANDON or DELETE."
  }
}

variable "python_runtime" {
  description = "Cloud Functions runtime; python311 is what the test suite runs."
  type        = string
  default     = "python311"
}

variable "function_memory" {
  description = "Memory per function instance (the Vertex AI client is the heaviest import)."
  type        = string
  default     = "512Mi"
}

variable "max_instances" {
  description = "Upper bound on instances of the steady functions (tick, notifier): bounds cost."
  type        = number
  default     = 10
}

variable "burst_max_instances" {
  description = "Upper bound on instances of the functions that get bursts (object finalized, job and trainer events): above it Pub/Sub and Eventarc get 429s, which use up delivery attempts."
  type        = number
  default     = 100
}

variable "max_delivery_attempts" {
  description = "Deliveries of one message before it goes to the dead-letter topic (5-100)."
  type        = number
  default     = 20

  validation {
    condition     = var.max_delivery_attempts >= 5 && var.max_delivery_attempts <= 100
    error_message = "Pub/Sub allows 5 to 100 delivery attempts."
  }
}

variable "tick_schedule" {
  description = "Cron schedule of the reconciler tick."
  type        = string
  default     = "*/5 * * * *"
}

variable "scheduler_region" {
  description = "Cloud Scheduler location; defaults to var.region."
  type        = string
  default     = null
}

variable "job_log_filter" {
  description = "Log sink filter for Vertex AI job state lines. The default keeps Vertex's own service lines (task_name \"service\"), not the containers' output (task_name \"workerpool0-0\", ...); the tick's polling covers anything it misses."
  type        = string
  default     = "resource.type=\"ml_job\" AND resource.labels.task_name=\"service\""
}

variable "use_custom_vertex_role" {
  description = "Grant the functions a custom role with only the Vertex AI permissions spotorch uses (custom jobs, Model Registry, Experiments) instead of roles/aiplatform.user."
  type        = bool
  default     = true
}

variable "shared_request_budget" {
  description = "Vertex AI request budgets shared by every function instance through Firestore (SPOTORCH_SHARED_BUDGET); false: each instance keeps its own (docs/scale.md)."
  type        = bool
  default     = true
}

variable "alert_notification_channels" {
  description = "Cloud Monitoring notification channels (projects/P/notificationChannels/ID) the alerting policy notifies; empty: incidents show in the console only."
  type        = list(string)
  default     = []
}

variable "pipeline_bigquery_watched_datasets" {
  description = "Generated: datasets (project:dataset) of the tables the bundled pipelines' BigQuery triggers watch."
  type        = list(string)
  default     = []
}

variable "pipeline_bigquery_snapshot_datasets" {
  description = "Generated: the datasets (project:dataset) the bundled pipelines' BigQuery snapshots are written to."
  type        = list(string)
  default     = []
}

variable "pipeline_export_buckets" {
  description = "Generated: buckets of the bundled pipelines' BigQuery export_uri (the Parquet exports runs train on)."
  type        = list(string)
  default     = []
}

variable "bigquery_trigger_region" {
  description = "Eventarc location of the BigQuery audit-log trigger. Which location receives a multi-region (US, EU) dataset's entries is not something spotorch has checked: global receives them all."
  type        = string
  default     = "global"
}
