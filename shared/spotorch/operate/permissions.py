"""The permission map: every Google API method spotorch calls, where, as whom, and what it needs.

One row per call site (or per thing a Google service does as one of spotorch's identities): the
client method, the REST method, the IAM permissions on which resource, and the identities that
make it. `spotorch deploy check` (operate/deploy_check.py) reads deploy/*.tf and finds, for each
row, the grant that allows it; tests/test_permissions.py walks the code for Google client calls
and fails on one that has no row here.

Permissions are Google's own tables: Vertex AI https://cloud.google.com/vertex-ai/docs/general/
iam-permissions (and each REST method page), Firestore https://cloud.google.com/firestore/docs/
security/iam, Cloud Storage https://cloud.google.com/storage/docs/access-control/iam-json,
Pub/Sub https://cloud.google.com/pubsub/docs/access-control, Secret Manager https://cloud.google
.com/secret-manager/docs/access-control, Logging https://cloud.google.com/logging/docs/access-
control. Two are inferred, not read on a Google page: models.listVersions as aiplatform.models.list
(Google's table has no row for it) and polling a long-running operation as the resource's `get`.

Not in the map: `spotorch advise --probe` launches probe jobs as whoever runs it (it needs what
the functions have for jobs: Vertex AI and actAs on the job's account; deploy/ gives operators no
right to launch), and `spotorch prices refresh` calls the Billing Catalog API with an API key.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class Identity(StrEnum):
    """Who makes a call: deploy/'s service accounts, the operators, a Google service agent."""

    FUNCTIONS = "functions"  # spotorch-functions: every function's runtime identity
    TRAINING = "training"  # spotorch-training: jobs of pipelines without job.service_account
    JOB_ACCOUNTS = "job-accounts"  # each job.service_account the bundled pipelines name
    OPERATORS = "operators"  # each member of var.operators, running the CLI
    VERTEX_AGENT = "vertex-agent"  # Vertex AI's service agent (reads model artifacts on upload)
    DATAFLOW_WORKER = "dataflow-worker"  # spotorch-dataflow: preprocess jobs' launcher and workers
    NOTIFIER = "notifier"  # spotorch-notifier: on_run_event alone, the one that reads secrets
    BUILD = "build"  # spotorch-build: Cloud Build builds the functions' images as this
    DATAPROC_WORKER = "dataproc-worker"  # spotorch-dataproc: Spark steps' driver and executors


class Scope(StrEnum):
    """The resource a permission is needed on, as deploy/ names it."""

    PROJECT = "project"  # project resources: Vertex AI jobs, models, metadata; log entries
    DATABASE = "database"  # spotorch's Firestore database
    TOPIC_EVENTS = "topic:events"
    TOPIC_TICK = "topic:tick"
    TOPIC_TRAINER_EVENTS = "topic:trainer_events"
    TOPIC_JOB_EVENTS = "topic:job_events"
    HOLD_SUBSCRIPTION = "subscription:dead_letter_hold"
    PUSH_SUBSCRIPTIONS = "subscriptions:push"
    LANDING = "buckets:landing"  # trigger buckets: snapshots arrive here
    CHECKPOINT = "buckets:checkpoint"  # checkpoint_uri buckets
    MODEL = "buckets:model"  # output_uri / base_output_uri buckets
    STAGING = "buckets:staging"  # job.staging_uri buckets: built Python packages
    PREPROCESS = "buckets:preprocess"  # preprocess.output_uri buckets: outputs, markers, temp
    ALERT_SECRETS = "secrets:alert"  # spotorch-* secrets mounted on the notifier
    ROUTE_SECRETS = "secrets:route"  # sm:// secrets pipeline routes name
    TRAINING_ACCOUNT = "service-account:training"  # actAs: jobs that run as spotorch-training
    PIPELINE_ACCOUNTS = "service-accounts:pipelines"  # actAs: jobs that run as a pipeline's own
    DATAFLOW_ACCOUNT = "service-account:dataflow"  # actAs: preprocess jobs run as spotorch-dataflow
    API_SERVICE = "service:api"  # the api function's Cloud Run service
    PUSHED_SERVICES = "services:pushed"  # the Pub/Sub-fed functions' services
    OBJECT_SERVICES = "services:objects"  # the object-finalized functions' services
    TABLE_SERVICE = "service:tables"  # the on_table_changed function's service (BigQuery)
    WATCHED_DATASETS = "datasets:watched"  # datasets of trigger.bigquery.tables
    SNAPSHOT_DATASETS = "datasets:snapshot"  # trigger.bigquery.snapshot_dataset
    EXPORT = "buckets:export"  # trigger.bigquery.export_uri buckets: the Parquet exports
    LAUNCHER_SPEC = "bucket:launcher-spec"  # the bucket of spotorch's launcher template spec
    LAUNCHER_IMAGE = "repository:launcher-image"  # the repository of the launcher's image
    FUNCTIONS_REPOSITORY = "repository:functions"  # the functions' build images
    SOURCE_BUCKET = "bucket:source"  # the functions' source bundle
    JOB_LOG_VIEW = "log-view:job-logs"  # the log view on Vertex AI's job entries (deploy/logs.tf)
    DATAPROC_ACCOUNT = "service-account:dataproc"  # actAs: Spark batches run as spotorch-dataproc
    SPARK_DRIVER = "bucket:spark-driver"  # the bucket of spotorch's PySpark driver (main file)


class Kind(StrEnum):
    """Who makes the request: spotorch's code, or a Google service acting as the identity."""

    CALL = "call"  # a client call in spotorch's code, at `sites`
    PLATFORM = "platform"  # Cloud Run, Pub/Sub or Eventarc acting as the identity for spotorch
    PLANNED = "planned"  # a call the next change adds (`why` says which); granted ahead


F, T, J, OP, V, DW = (Identity.FUNCTIONS, Identity.TRAINING, Identity.JOB_ACCOUNTS,
                      Identity.OPERATORS, Identity.VERTEX_AGENT, Identity.DATAFLOW_WORKER)
S = Scope
TRAINER = (T, J)  # spotorch_trainer runs as the job's account: the training one or a pipeline's

VERTEX_IAM = "https://cloud.google.com/vertex-ai/docs/general/iam-permissions"
UPLOAD_MODEL = "https://cloud.google.com/vertex-ai/docs/reference/rest/v1/projects.locations.models/upload"
ACT_AS = "https://cloud.google.com/vertex-ai/docs/general/custom-service-account"
FIRESTORE_IAM = "https://cloud.google.com/firestore/docs/security/iam"
STORAGE_IAM = "https://cloud.google.com/storage/docs/access-control/iam-json"
PUBSUB_IAM = "https://cloud.google.com/pubsub/docs/access-control"
SECRETS_IAM = "https://cloud.google.com/secret-manager/docs/access-control"
LOGGING_IAM = "https://cloud.google.com/logging/docs/access-control"
MONITORING_IAM = "https://cloud.google.com/monitoring/access-control"
RUN_IAM = "https://cloud.google.com/run/docs/securing/managing-access"
EVENTARC_IAM = "https://cloud.google.com/eventarc/docs/access-control"
DATAFLOW_IAM = "https://cloud.google.com/dataflow/docs/concepts/access-control"
DATAFLOW_SECURITY = "https://cloud.google.com/dataflow/docs/concepts/security-and-permissions"
BIGQUERY_IAM = "https://cloud.google.com/bigquery/docs/access-control"
DATAPROC_IAM = "https://cloud.google.com/dataproc-serverless/docs/concepts/iam"
BIGQUERY_EXPORT = "https://cloud.google.com/bigquery/docs/exporting-data#required_permissions"


@dataclass(frozen=True)
class Call:
    """One Google API method spotorch calls, and what must allow it."""

    client: str  # Class.method of the Google client (what the code calls)
    method: str  # the REST/RPC method it sends
    needs: tuple[tuple[Scope, tuple[str, ...]], ...]  # permissions, on which resource
    identities: tuple[Identity, ...]
    sites: tuple[str, ...] = ()  # module:Qualname of each function that calls it (Kind.CALL)
    source: str = ""  # where the permission is documented
    why: str = ""
    kind: Kind = Kind.CALL

    @property
    def method_name(self) -> str:
        """The client method as the code spells it (`create_custom_job`)."""
        return self.client.rsplit(".", 1)[-1]


def _on(scopes: Scope | tuple[Scope, ...], *permissions: str) -> tuple[tuple[Scope, tuple[str, ...]], ...]:
    return tuple((s, permissions) for s in (scopes if isinstance(scopes, tuple) else (scopes,)))


VERTEX = "spotorch.adapters.gcp.vertex:VertexJobLauncher"
REGISTRY = "spotorch.adapters.gcp.registry:VertexModelRegistry"
ENDPOINTS = "spotorch.adapters.gcp.endpoints:VertexEndpoints"
EXPERIMENTS = "spotorch.adapters.gcp.registry:VertexExperimentTracker"
VIZIER = "spotorch.adapters.gcp.vizier:VertexTrialSearch"
STORE = "spotorch.adapters.gcp.firestore:FirestoreDocumentStore"
LEDGER = "spotorch.adapters.gcp.notification_ledger:FirestoreNotificationLedger"
READS = "spotorch.adapters.gcp.firestore_reads:ClientSource"  # the api function's reads
REST_READS = "spotorch.adapters.gcp.firestore_reads:RestSource"  # the CLI's and the web view's
OBJECTS = "spotorch.adapters.gcp.storage:GcsObjectStore"
GCS = "spotorch_trainer.storage:GcsStorage"
BIGQUERY = "spotorch.adapters.gcp.bigquery:BigQueryTables"
DEAD = "spotorch.operate.deadletters"
DATAFLOW = "spotorch.adapters.gcp.dataflow:DataflowStepLauncher"
OUTPUTS = "spotorch.adapters.gcp.dataflow:GcsStepOutputs"
DATAPROC = "spotorch.adapters.gcp.dataproc:DataprocStepLauncher"

CREATE, UPDATE = "datastore.entities.create", "datastore.entities.update"
GET_OBJECT, LIST_OBJECTS = "storage.objects.get", "storage.objects.list"
CHECKPOINTS_AND_MODELS = (S.CHECKPOINT, S.MODEL)
TRAINER_READS = (S.LANDING, S.EXPORT, S.CHECKPOINT, S.MODEL, S.PREPROCESS)  # preprocess: its output

CALLS: tuple[Call, ...] = (
    # --- Vertex AI custom jobs (the launcher) -------------------------------------------------
    Call("JobServiceClient.create_custom_job", "projects.locations.customJobs.create",
         _on(S.PROJECT, "aiplatform.customJobs.create"), (F,), (f"{VERTEX}.launch.find_or_create",),
         VERTEX_IAM, "launch an attempt's job"),
    Call("JobServiceClient.create_custom_job", "projects.locations.customJobs.create",
         _on((S.TRAINING_ACCOUNT, S.PIPELINE_ACCOUNTS), "iam.serviceAccounts.actAs"), (F,),
         (f"{VERTEX}.launch.find_or_create",), ACT_AS,
         "the job runs as spotorch-training or the pipeline's job.service_account"),
    Call("JobServiceClient.list_custom_jobs", "projects.locations.customJobs.list",
         _on(S.PROJECT, "aiplatform.customJobs.list"), (F,),
         (f"{VERTEX}._find_in", f"{VERTEX}.list_live"), VERTEX_IAM,
         "find an attempt's job by its labels; the tick's listing of live jobs"),
    Call("JobServiceClient.get_custom_job", "projects.locations.customJobs.get",
         _on(S.PROJECT, "aiplatform.customJobs.get"), (F,), (f"{VERTEX}.get",), VERTEX_IAM,
         "confirm a job's state (the one source of truth)"),
    Call("JobServiceClient.cancel_custom_job", "projects.locations.customJobs.cancel",
         _on(S.PROJECT, "aiplatform.customJobs.cancel"), (F,), (f"{VERTEX}.cancel",), VERTEX_IAM,
         "cancel a job (operator, stockout, switch, hang, budget)"),
    # --- Model Registry ----------------------------------------------------------------------
    Call("ModelServiceClient.list_model_versions", "projects.locations.models.listVersions",
         _on(S.PROJECT, "aiplatform.models.list"), (F,), (f"{REGISTRY}._existing",), VERTEX_IAM,
         "find the run's version before uploading (inferred: Google's table has no row)"),
    Call("ModelServiceClient.upload_model", "projects.locations.models.upload",
         _on(S.PROJECT, "aiplatform.models.upload", "aiplatform.models.get"), (F,),
         (f"{REGISTRY}.upload.find_or_upload",), UPLOAD_MODEL,
         "register the model; polling the upload's operation needs models.get"),
    Call("ModelServiceClient.upload_model", "projects.locations.models.upload",
         _on(S.MODEL, GET_OBJECT, LIST_OBJECTS), (V,), (f"{REGISTRY}.upload.find_or_upload",),
         UPLOAD_MODEL, "Vertex AI's service agent reads artifact_uri (no service_account given)"),
    Call("ModelServiceClient.get_model", "projects.locations.models.get",
         _on(S.PROJECT, "aiplatform.models.get"), (F,), (f"{REGISTRY}.version",), VERTEX_IAM,
         "read a registered version"),
    Call("ModelServiceClient.merge_version_aliases", "projects.locations.models.mergeVersionAliases",
         _on(S.PROJECT, "aiplatform.models.update"), (F,), (f"{REGISTRY}.move_alias.merge",),
         VERTEX_IAM, "move the promotion alias (model.promote) to a version that passed the gate"),
    # --- Endpoints (model.serve, issue 37): the rollout's calls; polling an operation needs .get --
    Call("EndpointServiceClient.get_endpoint", "projects.locations.endpoints.get",
         _on(S.PROJECT, "aiplatform.endpoints.get"), (F,),
         (f"{ENDPOINTS}.create.find_or_create", f"{ENDPOINTS}.get.read",
          f"{ENDPOINTS}.undeploy.remove"), VERTEX_IAM,
         "the endpoint, what it serves and the traffic split"),
    Call("EndpointServiceClient.create_endpoint", "projects.locations.endpoints.create",
         _on(S.PROJECT, "aiplatform.endpoints.create", "aiplatform.endpoints.get"), (F,),
         (f"{ENDPOINTS}.create.find_or_create",), VERTEX_IAM, "the pipeline's endpoint, once"),
    Call("EndpointServiceClient.deploy_model", "projects.locations.endpoints.deployModel",
         _on(S.PROJECT, "aiplatform.endpoints.deploy", "aiplatform.endpoints.get"), (F,),
         (f"{ENDPOINTS}.start_deploy.start",), VERTEX_IAM,
         "deploy a promoted version beside the serving one (a canary)"),
    Call("EndpointServiceClient.get_operation", "projects.locations.operations.get",
         _on(S.PROJECT, "aiplatform.endpoints.get"), (F,), (f"{ENDPOINTS}.deploy_result.poll",),
         VERTEX_IAM, "poll a deployment's operation (the tick, while it runs)"),
    Call("EndpointServiceClient.undeploy_model", "projects.locations.endpoints.undeployModel",
         _on(S.PROJECT, "aiplatform.endpoints.undeploy", "aiplatform.endpoints.get"), (F,),
         (f"{ENDPOINTS}.undeploy.remove",), VERTEX_IAM,
         "undeploy the old version after a canary passed, or the canary after a rollback"),
    Call("EndpointServiceClient.update_endpoint", "projects.locations.endpoints.patch",
         _on(S.PROJECT, "aiplatform.endpoints.update"), (F,), (f"{ENDPOINTS}.set_traffic.update",),
         VERTEX_IAM, "move the traffic split (canary to all, or back)"),
    Call("EndpointServiceClient.mutate_deployed_model",
         "projects.locations.endpoints.mutateDeployedModel",
         _on(S.PROJECT, "aiplatform.endpoints.update", "aiplatform.endpoints.get"), (F,),
         (f"{ENDPOINTS}.scale.mutate",), VERTEX_IAM, "a deployed model's replica bounds"),
    Call("MetricServiceClient.list_time_series", "projects.timeSeries.list",
         _on(S.PROJECT, "monitoring.timeSeries.list"), (F,),
         ("spotorch.adapters.gcp.endpoint_traffic:MonitoringEndpointTraffic._series",),
         MONITORING_IAM, "a canary's traffic: its responses, 5xx and latencies on the endpoint"),
    # --- Experiments (Vertex ML Metadata) ------------------------------------------------------
    Call("MetadataServiceClient.get_metadata_store", "projects.locations.metadataStores.get",
         _on(S.PROJECT, "aiplatform.metadataStores.get"), (F,), (f"{EXPERIMENTS}._store",),
         VERTEX_IAM, "the default metadata store"),
    Call("MetadataServiceClient.create_metadata_store", "projects.locations.metadataStores.create",
         _on(S.PROJECT, "aiplatform.metadataStores.create", "aiplatform.metadataStores.get"), (F,),
         (f"{EXPERIMENTS}._store",), VERTEX_IAM, "create it when missing (polled: .get)"),
    Call("MetadataServiceClient.create_context", "projects.locations.metadataStores.contexts.create",
         _on(S.PROJECT, "aiplatform.contexts.create"), (F,), (f"{EXPERIMENTS}._ensure",),
         VERTEX_IAM, "the experiment and the experiment run"),
    Call("MetadataServiceClient.update_context", "projects.locations.metadataStores.contexts.patch",
         _on(S.PROJECT, "aiplatform.contexts.update", "aiplatform.contexts.get"), (F,),
         (f"{EXPERIMENTS}._ensure",), VERTEX_IAM, "a redelivered run's metrics"),
    Call("MetadataServiceClient.add_context_children",
         "projects.locations.metadataStores.contexts.addContextChildren",
         _on(S.PROJECT, "aiplatform.contexts.addContextChildren"), (F,),
         (f"{EXPERIMENTS}.log_run.log",),
         "https://cloud.google.com/vertex-ai/docs/reference/rest/v1/projects.locations."
         "metadataStores.contexts/addContextChildren", "the run under its experiment"),
    Call("MetadataServiceClient.get_context", "projects.locations.metadataStores.contexts.get",
         _on(S.PROJECT, "aiplatform.contexts.get"), (F,),
         (f"{EXPERIMENTS}.read_run", "spotorch.adapters.gcp.registry:_display_of"), VERTEX_IAM,
         "read a logged run back"),
    Call("MetadataServiceClient.list_contexts", "projects.locations.metadataStores.contexts.list",
         _on(S.PROJECT, "aiplatform.contexts.list"), (F,), (f"{EXPERIMENTS}.runs_of",), VERTEX_IAM,
         "an experiment's runs"),
    # --- Vizier (a sweep's search; issue 38) ------------------------------------------------------
    # Google's table lists aiplatform.studies.* and aiplatform.trials.*; which one each RPC needs
    # is inferred from its verb (LookupStudy: studies.get; SuggestTrials: trials.create; polling
    # their operations: studies.get).
    Call("VizierServiceClient.create_study", "projects.locations.studies.create",
         _on(S.PROJECT, "aiplatform.studies.create"), (F,), (f"{VIZIER}.study.find_or_create",),
         VERTEX_IAM, "the sweep's study, named by the sweep"),
    Call("VizierServiceClient.lookup_study", "projects.locations.studies.lookup",
         _on(S.PROJECT, "aiplatform.studies.get"), (F,), (f"{VIZIER}.study.find_or_create",),
         VERTEX_IAM, "a redelivered sweep finds its study (inferred: studies.get)"),
    Call("VizierServiceClient.get_study", "projects.locations.studies.get",
         _on(S.PROJECT, "aiplatform.studies.get"), (F,), (f"{VIZIER}._parameters",),
         VERTEX_IAM, "the study's parameter specs, once per process"),
    Call("VizierServiceClient.suggest_trials", "projects.locations.studies.trials.suggest",
         _on(S.PROJECT, "aiplatform.trials.create", "aiplatform.studies.get"), (F,),
         (f"{VIZIER}.suggest.ask",), VERTEX_IAM,
         "a trial's parameters (inferred: trials.create; polling the operation: studies.get)"),
    Call("VizierServiceClient.add_trial_measurement",
         "projects.locations.studies.trials.addTrialMeasurement",
         _on(S.PROJECT, "aiplatform.trials.update"), (F,), (f"{VIZIER}.measure",), VERTEX_IAM,
         "a trial's progress, also after a resume"),
    Call("VizierServiceClient.complete_trial", "projects.locations.studies.trials.complete",
         _on(S.PROJECT, "aiplatform.trials.update"), (F,), (f"{VIZIER}.complete",), VERTEX_IAM,
         "a trial's final values, or infeasible with its reason"),
    Call("VizierServiceClient.check_trial_early_stopping_state",
         "projects.locations.studies.trials.checkTrialEarlyStoppingState",
         _on(S.PROJECT, "aiplatform.trials.get", "aiplatform.studies.get"), (F,),
         (f"{VIZIER}.should_stop.check",), VERTEX_IAM, "the study's stopping rule (inferred)"),
    Call("VizierServiceClient.list_optimal_trials",
         "projects.locations.studies.trials.listOptimalTrials",
         _on(S.PROJECT, "aiplatform.trials.list"), (F,), (f"{VIZIER}.optimal",), VERTEX_IAM,
         "the study's own front, beside spotorch's"),
    Call("VizierServiceClient.get_trial", "projects.locations.studies.trials.get",
         _on(S.PROJECT, "aiplatform.trials.get"), (F,), (f"{VIZIER}.trial",), VERTEX_IAM,
         "a trial read back (a CompleteTrial redelivered)"),
    Call("VizierServiceClient.list_trials", "projects.locations.studies.trials.list",
         _on(S.PROJECT, "aiplatform.trials.list"), (F,), (f"{VIZIER}.trials",), VERTEX_IAM,
         "a study's trials"),
    # --- Firestore: the run store, the alert ledger, the readers ----------------------------------
    Call("DocumentReference.get", "projects.databases.documents.get",
         _on(S.DATABASE, "datastore.entities.get"), (F, OP), (f"{STORE}.get",), FIRESTORE_IAM,
         "a run, a snapshot, a record; dead-letters reads the recorded failure"),
    Call("WriteBatch.create", "projects.databases.documents.commit",
         _on(S.DATABASE, CREATE), (F,), (f"{STORE}.put",), FIRESTORE_IAM, "a new document"),
    Call("WriteBatch.update", "projects.databases.documents.commit",
         _on(S.DATABASE, UPDATE), (F,), (f"{STORE}.put",), FIRESTORE_IAM,
         "the conditional write (update-time precondition)"),
    Call("WriteBatch.set", "projects.databases.documents.commit",
         _on(S.DATABASE, CREATE, UPDATE), (F,), (f"{STORE}.put",), FIRESTORE_IAM,
         "counters added in the same commit (merge, transforms)"),
    Call("WriteBatch.commit", "projects.databases.documents.commit",
         _on(S.DATABASE, CREATE, UPDATE), (F,), (f"{STORE}.put",), FIRESTORE_IAM,
         "the batch's writes, as above"),
    Call("Query.stream", "projects.databases.documents.runQuery",
         _on(S.DATABASE, "datastore.entities.get", "datastore.entities.list"), (F,),
         (f"{STORE}.query", f"{READS}.newest"), FIRESTORE_IAM,
         "active runs, open snapshots, unmatched uploads to alert on; the api's listings"),
    Call("HTTP POST documents:runQuery (Firestore REST)", "projects.databases.documents.runQuery",
         _on(S.DATABASE, "datastore.entities.get", "datastore.entities.list"), (OP,),
         (f"{REST_READS}.newest",), FIRESTORE_IAM,
         "the CLI's and the web view's listings: runs, sweeps, snapshots, unmatched uploads"),
    Call("HTTP GET a document (Firestore REST)", "projects.databases.documents.get",
         _on(S.DATABASE, "datastore.entities.get"), (OP,), (f"{REST_READS}.get",),
         FIRESTORE_IAM, "one run or sweep (`spotorch show`, the web view)"),
    Call("DocumentReference.delete", "projects.databases.documents.delete",
         _on(S.DATABASE, "datastore.entities.delete"), (F,), (f"{STORE}.delete",), FIRESTORE_IAM,
         "a record that is done"),
    Call("DocumentReference.get", "projects.databases.documents.get",
         _on(S.DATABASE, "datastore.entities.get"), (F,), (f"{READS}.get",), FIRESTORE_IAM,
         "one run or sweep (the api)"),
    Call("DocumentReference.create", "projects.databases.documents.commit",
         _on(S.DATABASE, CREATE), (F,), (f"{LEDGER}.claim",), FIRESTORE_IAM,
         "claim an alert (exists=false precondition)"),
    Call("DocumentReference.get", "projects.databases.documents.get",
         _on(S.DATABASE, "datastore.entities.get"), (F,),
         (f"{LEDGER}.claim", f"{LEDGER}.admit.admit_in", f"{LEDGER}.record"), FIRESTORE_IAM,
         "an alert's claim, a run's alert window"),
    Call("DocumentReference.update", "projects.databases.documents.commit",
         _on(S.DATABASE, UPDATE), (F,), (f"{LEDGER}.claim",), FIRESTORE_IAM,
         "take over an abandoned claim"),
    Call("DocumentReference.set", "projects.databases.documents.commit",
         _on(S.DATABASE, CREATE, UPDATE), (F,), (f"{LEDGER}.finish",), FIRESTORE_IAM,
         "an alert's outcome"),
    Call("Client.transaction", "projects.databases.documents.beginTransaction",
         _on(S.DATABASE, "datastore.databases.get"), (F,), (f"{LEDGER}.admit",), FIRESTORE_IAM,
         "the alert window is read and written in one transaction"),
    Call("Transaction.set", "projects.databases.documents.commit",
         _on(S.DATABASE, CREATE, UPDATE), (F,), (f"{LEDGER}.admit.admit_in",), FIRESTORE_IAM,
         "the alert window's new state"),
    # --- Cloud Storage: snapshots (functions) ---------------------------------------------------
    Call("Blob.download_as_bytes", "objects.get", _on(S.LANDING, GET_OBJECT), (F,),
         (f"{OBJECTS}.read",), STORAGE_IAM, "a snapshot's marker or manifest"),
    Call("Blob.upload_from_filename", "objects.insert",
         _on((S.STAGING, S.CHECKPOINT), "storage.objects.create"),
         (F,), (f"{OBJECTS}.ensure_file",), STORAGE_IAM,
         "a built Python package the staging bucket lacks, before the launch that runs it; a "
         "new run's inputs manifest under {checkpoint_uri}/spotorch-inputs/ (create-if-absent)"),
    Call("python_package_spec.package_uris", "objects.get", _on(S.STAGING, GET_OBJECT), TRAINER,
         source=STORAGE_IAM, kind=Kind.PLATFORM,
         why="Vertex's prebuilt container downloads the packages as the job's account (our "
             "reading: Google names no other identity for it)"),
    Call("Blob.exists", "objects.get", _on(S.LANDING, GET_OBJECT), (F,), (f"{OBJECTS}.exists",),
         STORAGE_IAM, "is a snapshot's object still there"),
    Call("Client.list_blobs", "objects.list", _on((S.LANDING, S.EXPORT), LIST_OBJECTS), (F,),
         (f"{OBJECTS}.list_page",), STORAGE_IAM,
         "a snapshot's prefix; the reconcile listing; a BigQuery export's Parquet files"),
    Call("Client.list_blobs", "objects.list", _on(S.MODEL, LIST_OBJECTS), (F,),
         (f"{OBJECTS}.list_page",), STORAGE_IAM,
         "registration: the model folder holds a file its prebuilt serving container loads"),
    # --- Cloud Storage: checkpoints (the functions, and the trainer helper in every job) ---------
    Call("Client.list_blobs", "objects.list", _on(S.CHECKPOINT, LIST_OBJECTS), (F,),
         (f"{GCS}.list_dirs", f"{GCS}.sizes"), STORAGE_IAM,
         "the latest complete checkpoint; retention's listing"),
    Call("Client.list_blobs", "objects.list", _on(TRAINER_READS, LIST_OBJECTS), TRAINER,
         (f"{GCS}.list_dirs", f"{GCS}.list_files", f"{GCS}.sizes"), STORAGE_IAM,
         "the trainer lists its data, its checkpoints and its output"),
    Call("Blob.exists", "objects.get", _on(S.CHECKPOINT, GET_OBJECT), (F,), (f"{GCS}.exists",),
         STORAGE_IAM, "a checkpoint's _COMPLETE marker"),
    Call("Blob.exists", "objects.get", _on(TRAINER_READS, GET_OBJECT), TRAINER,
         (f"{GCS}.exists",), STORAGE_IAM, "the trainer's own markers"),
    Call("Blob.download_as_bytes", "objects.get", _on(S.CHECKPOINT, GET_OBJECT), (F,),
         (f"{GCS}.read",), STORAGE_IAM, "a hardware probe's report"),
    Call("Blob.download_as_bytes", "objects.get", _on(TRAINER_READS, GET_OBJECT), TRAINER,
         (f"{GCS}.read",), STORAGE_IAM, "the data, the checkpoint to resume from"),
    Call("Blob.download_to_filename", "objects.get", _on(TRAINER_READS, GET_OBJECT), TRAINER,
         (f"{GCS}.download",), STORAGE_IAM, "a data or checkpoint file to disk"),
    Call("Blob.upload_from_string", "objects.insert",
         _on(CHECKPOINTS_AND_MODELS, "storage.objects.create", "storage.objects.delete"), TRAINER,
         (f"{GCS}.write",), STORAGE_IAM,
         "checkpoints and the model; rewriting a name needs objects.delete too"),
    Call("Blob.upload_from_filename", "objects.insert",
         _on(CHECKPOINTS_AND_MODELS, "storage.objects.create", "storage.objects.delete"), TRAINER,
         (f"{GCS}.write",), STORAGE_IAM, "as above, from a file"),
    Call("Blob.delete", "objects.delete", _on(S.CHECKPOINT, "storage.objects.delete"), (F,),
         (f"{GCS}.delete",), STORAGE_IAM,
         "retention, and diverged checkpoints before a relaunch"),
    Call("Blob.delete", "objects.delete", _on(CHECKPOINTS_AND_MODELS, "storage.objects.delete"),
         TRAINER, (f"{GCS}.delete",), STORAGE_IAM, "the trainer prunes its own checkpoints"),
    # --- Dataflow: the preprocess step (issue 31) ----------------------------------------------
    Call("FlexTemplatesServiceClient.launch_flex_template",
         "projects.locations.flexTemplates.launch", _on(S.PROJECT, "dataflow.jobs.create"), (F,),
         (f"{DATAFLOW}.launch",), DATAFLOW_IAM, "launch the step's job (a flex template)"),
    Call("FlexTemplatesServiceClient.launch_flex_template",
         "projects.locations.flexTemplates.launch",
         _on(S.DATAFLOW_ACCOUNT, "iam.serviceAccounts.actAs"), (F,), (f"{DATAFLOW}.launch",),
         DATAFLOW_SECURITY, "the job's launcher and workers run as spotorch-dataflow"),
    Call("JobsV1Beta3Client.list_jobs", "projects.locations.jobs.list",
         _on(S.PROJECT, "dataflow.jobs.list"), (F,), (f"{DATAFLOW}._find",), DATAFLOW_IAM,
         "find the step's job by its deterministic name (no second launch)"),
    Call("JobsV1Beta3Client.get_job", "projects.locations.jobs.get",
         _on(S.PROJECT, "dataflow.jobs.get"), (F,), (f"{DATAFLOW}.get",), DATAFLOW_IAM,
         "the job's state: the source of truth a statusChanged event is checked against"),
    Call("JobsV1Beta3Client.update_job", "projects.locations.jobs.update",
         _on(S.PROJECT, "dataflow.jobs.cancel"), (F,), (f"{DATAFLOW}.cancel",), DATAFLOW_IAM,
         "cancel the job (requested_state JOB_STATE_CANCELLED): the run was cancelled, timeout"),
    Call("MessagesV1Beta3Client.list_job_messages", "projects.locations.jobs.messages.list",
         _on(S.PROJECT, "dataflow.messages.list"), (F,), (f"{DATAFLOW}._errors",), DATAFLOW_IAM,
         "a failed job's error text (JOB_MESSAGE_ERROR), classified and shown"),
    Call("MetricsV1Beta3Client.get_job_metrics", "projects.locations.jobs.getMetrics",
         _on(S.PROJECT, "dataflow.metrics.get"), (F,), (f"{DATAFLOW}._metrics",), DATAFLOW_IAM,
         "the billed vCPU, memory and disk time: the step's line in the cost ledger"),
    Call("Client.list_blobs", "objects.list", _on(S.LANDING, LIST_OBJECTS), (F,),
         (f"{OUTPUTS}.content_digest",), STORAGE_IAM,
         "the input folder's names, sizes and CRC32C: the cache key's input part"),
    Call("Bucket.get_blob", "objects.get", _on(S.LANDING, GET_OBJECT), (F,),
         (f"{OUTPUTS}.content_digest",), STORAGE_IAM,
         "an input overwritten since the run was created: its recorded generation's CRC32C"),
    Call("Blob.download_as_bytes", "objects.get", _on(S.PREPROCESS, GET_OBJECT), (F,),
         (f"{OUTPUTS}._json",), STORAGE_IAM, "an output's completion marker (the cache)"),
    Call("Blob.download_as_bytes", "objects.get", _on(S.CHECKPOINT, GET_OBJECT), (F,),
         (f"{OUTPUTS}._json",), STORAGE_IAM,
         "the run's inputs manifest (its pinned objects, when the run document lists none)"),
    Call("Blob.upload_from_string", "objects.insert",
         _on(S.PREPROCESS, "storage.objects.create", "storage.objects.delete"), (F,),
         (f"{OUTPUTS}.write_marker",), STORAGE_IAM,
         "the completion marker, after GetJob said JOB_STATE_DONE, and the copy of the run's "
         "inputs manifest the job reads (rewriting needs delete)"),
    Call("Dataflow launcher VM and workers", "the Beam pipeline's reads and writes",
         _on(S.PROJECT, "dataflow.workItems.lease", "dataflow.workItems.update",
             "dataflow.workItems.sendMessage", "logging.logEntries.create"), (DW,),
         source=DATAFLOW_SECURITY, kind=Kind.PLATFORM,
         why="Dataflow's workers run as the worker service account (roles/dataflow.worker)"),
    Call("Dataflow workers read the input and the code", "objects.get",
         _on((S.LANDING, S.STAGING), GET_OBJECT, LIST_OBJECTS), (DW,), source=STORAGE_IAM,
         kind=Kind.PLATFORM,
         why="the Beam module reads the snapshot; the launcher installs the code package"),
    Call("Dataflow workers write the output", "objects.insert",
         _on(S.PREPROCESS, "storage.objects.create", "storage.objects.delete", GET_OBJECT,
             LIST_OBJECTS), (DW,), source=STORAGE_IAM, kind=Kind.PLATFORM,
         why="the output shards and Dataflow's temp and staging files under the key's folder"),
    Call("Eventarc Dataflow statusChanged trigger", "eventarc event delivery",
         _on(S.PROJECT, "eventarc.events.receiveEvent"), (F,), source=EVENTARC_IAM,
         why="the trigger's identity receives google.cloud.dataflow.job.v1beta3.statusChanged",
         kind=Kind.PLATFORM),
    Call("Eventarc delivery to on_job_event (OIDC token)", "the job-event function (Cloud Run)",
         _on(S.PUSHED_SERVICES, "run.routes.invoke"), (F,), source=RUN_IAM,
         why="the statusChanged trigger calls spotorch-on-job-event as this account",
         kind=Kind.PLATFORM),
    # --- Dataproc Serverless: the Spark preprocess step (issue 42) --------------------------------
    Call("BatchControllerClient.create_batch", "projects.locations.batches.create",
         _on(S.PROJECT, "dataproc.batches.create"), (F,), (f"{DATAPROC}.launch",), DATAPROC_IAM,
         "create the step's batch under its deterministic id"),
    Call("BatchControllerClient.create_batch", "projects.locations.batches.create",
         _on(S.DATAPROC_ACCOUNT, "iam.serviceAccounts.actAs"), (F,), (f"{DATAPROC}.launch",),
         DATAPROC_IAM, "the batch's driver and executors run as spotorch-dataproc"),
    Call("BatchControllerClient.get_batch", "projects.locations.batches.get",
         _on(S.PROJECT, "dataproc.batches.get"), (F,), (f"{DATAPROC}.get", f"{DATAPROC}.cancel"),
         DATAPROC_IAM, "the batch's state, failure and usage: the tick follows it (no event)"),
    Call("BatchControllerClient.list_batches", "projects.locations.batches.list",
         _on(S.PROJECT, "dataproc.batches.list"), (F,), (f"{DATAPROC}.list_batches",),
         DATAPROC_IAM, "spotorch's batches of a region (operations and tests)"),
    Call("BatchControllerClient.delete_batch", "projects.locations.batches.delete",
         _on(S.PROJECT, "dataproc.batches.delete"), (F,), (f"{DATAPROC}.delete",),
         DATAPROC_IAM, "an ended batch's record (its id may be taken again)"),
    Call("BatchControllerClient.cancel_operation", "projects.regions.operations.cancel",
         _on(S.PROJECT, "dataproc.operations.cancel", "dataproc.batches.cancel"), (F,),
         (f"{DATAPROC}.cancel",),
         DATAPROC_IAM, "cancel the batch through its operation (no CancelBatch RPC): the run "
                       "was cancelled, timeout"),
    Call("Dataproc Serverless driver and executors", "the Spark batch's work",
         _on(S.PROJECT, "dataproc.agents.create", "dataproc.tasks.lease",
             "logging.logEntries.create"), (Identity.DATAPROC_WORKER,), source=DATAPROC_IAM,
         kind=Kind.PLATFORM,
         why="Dataproc Serverless runs the batch as its service account (roles/dataproc.worker)"),
    Call("Dataproc driver reads the input, the code and the driver", "objects.get",
         _on((S.LANDING, S.STAGING, S.SPARK_DRIVER), GET_OBJECT, LIST_OBJECTS),
         (Identity.DATAPROC_WORKER,), source=STORAGE_IAM, kind=Kind.PLATFORM,
         why="the driver reads the snapshot, installs the code package; Dataproc reads the "
             "main file"),
    Call("Dataproc driver writes the output", "objects.insert",
         _on(S.PREPROCESS, "storage.objects.create", "storage.objects.delete", GET_OBJECT,
             LIST_OBJECTS), (Identity.DATAPROC_WORKER,), source=STORAGE_IAM,
         kind=Kind.PLATFORM, why="the output shards under the key's folder"),
    # --- BigQuery: the tables a trigger watches, their snapshots and exports ----------------------
    Call("Client.get_table", "tables.get", _on(S.WATCHED_DATASETS, "bigquery.tables.get"), (F,),
         (f"{BIGQUERY}.get_table",), BIGQUERY_IAM,
         "a watched table's lastModifiedTime and numRows (the source of truth; the tick)"),
    Call("Client.get_table", "tables.get", _on(S.SNAPSHOT_DATASETS, "bigquery.tables.get"), (F,),
         (f"{BIGQUERY}._start_create_as",), BIGQUERY_IAM,
         "is the snapshot table (of the tables or of the query) there already"),
    Call("Client.get_dataset", "datasets.get", _on(S.SNAPSHOT_DATASETS, "bigquery.datasets.get"),
         (F,), (f"{BIGQUERY}._location_of",), BIGQUERY_IAM,
         "the snapshot dataset's location, once: jobs.get of our own jobs needs it outside the "
         "US and EU (unless SPOTORCH_BIGQUERY_LOCATION names it)"),
    Call("Client.get_job", "jobs.get", _on(S.PROJECT, "bigquery.jobs.get"), (F,),
         (f"{BIGQUERY}.get_job", f"{BIGQUERY}.own_job"), BIGQUERY_IAM,
         "the job an audit entry names (any user's: jobs.get reads any job of the project); "
         "the snapshot's own query and extract jobs, followed until DONE (own_job)"),
    Call("Client.query", "jobs.insert", _on(S.PROJECT, "bigquery.jobs.create"), (F,),
         (f"{BIGQUERY}._start_create_as",), BIGQUERY_IAM,
         "the snapshot (start_snapshot, start_snapshot_query): CREATE TABLE ... AS SELECT ... "
         "FOR SYSTEM_TIME AS OF, started with its own job id and not waited for"),
    Call("Client.query", "jobs.insert", _on(S.WATCHED_DATASETS, "bigquery.tables.getData"), (F,),
         (f"{BIGQUERY}._start_create_as",), BIGQUERY_IAM,
         "the query reads the watched tables (trigger.bigquery.query reads only those)"),
    Call("Client.query", "jobs.insert",
         _on(S.SNAPSHOT_DATASETS, "bigquery.tables.create", "bigquery.tables.updateData"), (F,),
         (f"{BIGQUERY}._start_create_as",), BIGQUERY_IAM, "and writes the snapshot table"),
    Call("Client.extract_table", "jobs.insert", _on(S.PROJECT, "bigquery.jobs.create"), (F,),
         (f"{BIGQUERY}.start_extract",), BIGQUERY_EXPORT,
         "the Parquet export (extract job), started with its own job id and not waited for"),
    Call("Client.extract_table", "jobs.insert",
         _on(S.SNAPSHOT_DATASETS, "bigquery.tables.export"), (F,),
         (f"{BIGQUERY}.start_extract",), BIGQUERY_EXPORT, "it reads the snapshot table"),
    Call("Client.extract_table", "jobs.insert", _on(S.EXPORT, "storage.objects.create"), (F,),
         (f"{BIGQUERY}.start_extract",), BIGQUERY_EXPORT,
         "and writes the export bucket as the caller"),
    # --- Pub/Sub --------------------------------------------------------------------------------
    Call("PublisherClient.publish", "projects.topics.publish",
         _on(S.TOPIC_EVENTS, "pubsub.topics.publish"), (F,),
         ("spotorch.adapters.gcp.pubsub:PubSubPublisher.publish",), PUBSUB_IAM,
         "spotorch's own CloudEvents (the outbox)"),
    Call("PublisherClient.publish", "projects.topics.publish",
         _on(S.TOPIC_TICK, "pubsub.topics.publish"), (F,),
         ("spotorch.adapters.gcp.pubsub:PubSubShardDispatcher.dispatch",), PUBSUB_IAM,
         "the tick fans out: one message per shard on the tick topic"),
    Call("PublisherClient.publish", "projects.topics.publish",
         _on(S.TOPIC_TRAINER_EVENTS, "pubsub.topics.publish"), TRAINER,
         ("spotorch_trainer.events:PubSubReporter.send",), PUBSUB_IAM,
         "the trainer's progress, checkpoints and 'preempting'"),
    Call("SubscriberClient.pull", "projects.subscriptions.pull",
         _on(S.HOLD_SUBSCRIPTION, "pubsub.subscriptions.consume"), (OP,), (f"{DEAD}:_pull",),
         PUBSUB_IAM, "`spotorch dead-letters`: look at the held messages"),
    Call("SubscriberClient.modify_ack_deadline", "projects.subscriptions.modifyAckDeadline",
         _on(S.HOLD_SUBSCRIPTION, "pubsub.subscriptions.consume"), (OP,), (f"{DEAD}:_release",),
         PUBSUB_IAM, "give looked-at messages back"),
    Call("SubscriberClient.acknowledge", "projects.subscriptions.acknowledge",
         _on(S.HOLD_SUBSCRIPTION, "pubsub.subscriptions.consume"), (OP,), (f"{DEAD}:replay",),
         PUBSUB_IAM, "a replayed message leaves the hold subscription"),
    Call("SubscriberClient.get_subscription", "projects.subscriptions.get",
         _on(S.PUSH_SUBSCRIPTIONS, "pubsub.subscriptions.get"), (OP,), (f"{DEAD}:_target_topic",),
         PUBSUB_IAM, "a dead letter's source subscription names the topic to replay to"),
    Call("PublisherClient.publish", "projects.topics.publish",
         _on((S.TOPIC_JOB_EVENTS, S.TOPIC_TRAINER_EVENTS, S.TOPIC_TICK, S.TOPIC_EVENTS),
             "pubsub.topics.publish"), (OP,), (f"{DEAD}:replay",), PUBSUB_IAM,
         "`spotorch dead-letters --replay`: back to the topic it came from"),
    # --- Secret Manager, Cloud Logging, the api ------------------------------------------------
    Call("SecretManagerServiceClient.access_secret_version",
         "projects.secrets.versions.access", _on(S.ROUTE_SECRETS, "secretmanager.versions.access"),
         (F,), ("spotorch.adapters.notify.channels:_secret_manager_value",), SECRETS_IAM,
         "a route's sm:// target, read by the notifier"),
    Call("Client.list_entries", "entries.list", _on(S.JOB_LOG_VIEW, "logging.views.access"),
         (OP,), ("spotorch.operate.logsource:CloudLoggingSource._lines",), LOGGING_IAM,
         "`spotorch logs`: the training job's own output, read through the job-log view"),
    Call("HTTP POST with an identity token", "the api function (Cloud Run)",
         _on(S.API_SERVICE, "run.routes.invoke"), (OP,), ("spotorch.operate.backend:HttpActions.post",),
         RUN_IAM, "submit, cancel, retry, rerun"),
    Call("GAPIC LoggingServiceV2Client.list_log_entries", "entries.list",
         _on(S.JOB_LOG_VIEW, "logging.views.access"), (F,),
         ("spotorch.adapters.gcp.job_logs:CloudLoggingJobLogs.error_tail",), LOGGING_IAM,
         "a failed attempt's own error: its replicas' last stderr lines (one page, severity>=ERROR"
         "), read through the job-log view"),
    # --- what Google services do as spotorch-functions ------------------------------------------
    Call("Cloud Run secret environment variables", "projects.secrets.versions.access",
         _on(S.ALERT_SECRETS, "secretmanager.versions.access"), (F,), source=SECRETS_IAM,
         why="the notifier's alert secrets, mounted when an instance starts", kind=Kind.PLATFORM),
    Call("Pub/Sub push and Eventarc delivery (OIDC token)", "the event functions (Cloud Run)",
         _on((S.PUSHED_SERVICES, S.OBJECT_SERVICES, S.TABLE_SERVICE), "run.routes.invoke"), (F,),
         source=RUN_IAM,
         why="push subscriptions, object and audit-log triggers call the functions as this "
             "account",
         kind=Kind.PLATFORM),
    Call("Eventarc object-finalized trigger", "eventarc event delivery",
         _on(S.PROJECT, "eventarc.events.receiveEvent"), (F,), source=EVENTARC_IAM,
         why="the trigger's identity receives the events", kind=Kind.PLATFORM),
    Call("stdout JSON lines", "entries.write", _on(S.PROJECT, "logging.logEntries.create"), (F,),
         source=LOGGING_IAM, why="the functions' structured logs", kind=Kind.PLATFORM),
)


# --- issue 40: the notifier's own account, the build account, the launcher's spec and image ---
# The notifier (on_run_event) runs as spotorch-notifier: the rows above of the Firestore calls it
# makes (the alert ledger; the rejected-event records every function writes), its logs and its
# push are its as well; the secrets are its alone.
AR_IAM = "https://cloud.google.com/artifact-registry/docs/access-control"
BUILD_ACCOUNT = "https://cloud.google.com/functions/docs/securing/build-custom-sa"
FLEX_TEMPLATES = "https://cloud.google.com/dataflow/docs/guides/templates/configuring-flex-templates"
_NOTIFIER_SCOPES = frozenset({S.DATABASE})
_SECRETS = frozenset({S.ALERT_SECRETS, S.ROUTE_SECRETS})


def _notifier(call: Call) -> Call:
    scopes = {s for s, _ in call.needs}
    if Identity.FUNCTIONS not in call.identities:
        return call
    if scopes <= _SECRETS:  # the notifier's alone
        return Call(call.client, call.method, call.needs,
                    tuple(Identity.NOTIFIER if i is Identity.FUNCTIONS else i
                          for i in call.identities), call.sites, call.source, call.why, call.kind)
    if scopes <= _NOTIFIER_SCOPES or call.client == "stdout JSON lines":
        needs = tuple((s, p) for s, p in call.needs if s in _NOTIFIER_SCOPES or s is S.PROJECT)
        return Call(call.client, call.method, needs, (*call.identities, Identity.NOTIFIER),
                    call.sites, call.source, call.why, call.kind) if needs == call.needs else call
    return call


CALLS = (
    *(_notifier(c) for c in CALLS),
    Call("Pub/Sub push to on_run_event (OIDC token)", "the notifier function (Cloud Run)",
         _on(S.PUSHED_SERVICES, "run.routes.invoke"), (Identity.NOTIFIER,), source=RUN_IAM,
         why="its push subscription calls spotorch-on-run-event as the notifier account",
         kind=Kind.PLATFORM),
    Call("LaunchFlexTemplate reads the template spec", "objects.get",
         _on(S.LAUNCHER_SPEC, GET_OBJECT), (F,), source=FLEX_TEMPLATES, kind=Kind.PLATFORM,
         why="container_spec_gcs_path (SPOTORCH_DATAFLOW_LAUNCHER) is read as the caller"),
    Call("Dataflow's launcher VM pulls the template image",
         "artifactregistry docker pull", _on(S.LAUNCHER_IMAGE,
                                             "artifactregistry.repositories.downloadArtifacts"),
         (DW,), source=AR_IAM, kind=Kind.PLATFORM,
         why="the flex template's launcher VM runs as the worker account (spotorch-dataflow)"),
    Call("Cloud Build: the function build's logs", "entries.write",
         _on(S.PROJECT, "logging.logEntries.create"), (Identity.BUILD,), source=BUILD_ACCOUNT,
         kind=Kind.PLATFORM, why="build logs (roles/logging.logWriter)"),
    Call("Cloud Build: the function's image", "artifactregistry docker push",
         _on(S.FUNCTIONS_REPOSITORY, "artifactregistry.repositories.uploadArtifacts",
             "artifactregistry.repositories.downloadArtifacts"), (Identity.BUILD,),
         source=BUILD_ACCOUNT, kind=Kind.PLATFORM,
         why="the built image, pushed to docker_repository (spotorch-functions)"),
    Call("Cloud Build: the function's source", "objects.get",
         _on(S.SOURCE_BUCKET, GET_OBJECT), (Identity.BUILD,), source=BUILD_ACCOUNT,
         kind=Kind.PLATFORM, why="the source zip in spotorch's source bucket"),
)

def permissions_of(identity: Identity) -> frozenset[str]:
    """Every permission the map says an identity needs, on any resource."""
    return frozenset(p for c in CALLS if identity in c.identities for _, perms in c.needs
                     for p in perms)
