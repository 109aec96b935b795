"""What Google's predefined roles grant: the roles deploy/ uses, with their permissions.

Copied from https://github.com/iann0036/iam-dataset (gcp/roles/<role>.json, commit 2073fa52, 2026-08-22),
a machine-collected copy of Google's own role definitions (`gcloud iam roles describe`; the
human-readable lists are at https://cloud.google.com/iam/docs/roles-permissions). Permissions
of roles/aiplatform.user are those of the Vertex AI families spotorch calls (its 446 in all
include every other Vertex AI product). A role missing here grants nothing as far as
`spotorch deploy check` knows: add it, with its permissions, when deploy/ grants it.
"""

from __future__ import annotations

from collections.abc import Mapping

SOURCE = "https://github.com/iann0036/iam-dataset/tree/2073fa52ac008a45477aa0b1b4580cd99135bf60/gcp/roles"

PREDEFINED_ROLES: Mapping[str, frozenset[str]] = {
    # issue 42: gcp/roles/dataproc.worker.json of the same dataset (commit 17e37aef).
    "roles/dataproc.worker": frozenset({
        "dataproc.agents.create", "dataproc.agents.delete", "dataproc.agents.get",
        "dataproc.agents.list", "dataproc.agents.update", "dataproc.tasks.lease",
        "dataproc.tasks.listInvalidatedLeases", "dataproc.tasks.reportStatus",
        "logging.logEntries.create", "logging.logEntries.route",
        "monitoring.metricDescriptors.create", "monitoring.metricDescriptors.get",
        "monitoring.metricDescriptors.list", "monitoring.monitoredResourceDescriptors.get",
        "monitoring.monitoredResourceDescriptors.list", "monitoring.timeSeries.create",
        "storage.buckets.get", "storage.managedFolders.create", "storage.managedFolders.delete",
        "storage.managedFolders.get", "storage.managedFolders.list",
        "storage.multipartUploads.abort", "storage.multipartUploads.create",
        "storage.multipartUploads.list", "storage.multipartUploads.listParts",
        "storage.objects.create", "storage.objects.delete", "storage.objects.get",
        "storage.objects.getIamPolicy", "storage.objects.list",
        "storage.objects.overrideUnlockedRetention", "storage.objects.setIamPolicy",
        "storage.objects.setRetention", "storage.objects.update"}),
    # The two Dataflow roles (issue 31) from the same dataset at a later commit: gcp/roles/
    # dataflow.developer.json (0e00ce8c) and dataflow.worker.json (000967c1).
    "roles/dataflow.developer": frozenset({
        "cloudbuild.builds.create", "cloudbuild.builds.get", "cloudbuild.builds.list",
        "cloudbuild.builds.update", "cloudbuild.operations.get", "cloudbuild.operations.list",
        "compute.projects.get", "compute.regions.list", "compute.zones.list",
        "dataflow.jobs.cancel", "dataflow.jobs.create", "dataflow.jobs.get", "dataflow.jobs.list",
        "dataflow.jobs.snapshot", "dataflow.jobs.updateContents", "dataflow.messages.list",
        "dataflow.metrics.get", "dataflow.snapshots.delete", "dataflow.snapshots.get",
        "dataflow.snapshots.list", "recommender.dataflowDiagnosticsInsights.get",
        "recommender.dataflowDiagnosticsInsights.list",
        "recommender.dataflowDiagnosticsInsights.update", "remotebuildexecution.blobs.get",
        "resourcemanager.projects.get", "resourcemanager.projects.list"}),
    "roles/dataflow.worker": frozenset({
        "autoscaling.sites.readRecommendations", "autoscaling.sites.writeMetrics",
        "autoscaling.sites.writeState", "compute.instanceGroupManagers.update",
        "compute.instances.delete", "compute.instances.setDiskAutoDelete", "dataflow.jobs.get",
        "dataflow.shuffle.read", "dataflow.shuffle.write",
        "dataflow.streamingWorkItems.ImportState", "dataflow.streamingWorkItems.commitWork",
        "dataflow.streamingWorkItems.getData", "dataflow.streamingWorkItems.getWork",
        "dataflow.streamingWorkItems.getWorkerMetadata", "dataflow.workItems.lease",
        "dataflow.workItems.sendMessage", "dataflow.workItems.update",
        "logging.logEntries.create", "monitoring.timeSeries.create", "storage.buckets.get",
        "storage.objects.create", "storage.objects.get"}),
    # The two BigQuery data roles from the same dataset at later commits (1818bc70 for
    # dataViewer, 078b24f2 for dataEditor): BigQuery's rows were read there, not at 2073fa52.
    "roles/bigquery.dataViewer": frozenset({
        "bigquery.datasets.get", "bigquery.datasets.getIamPolicy", "bigquery.models.export",
        "bigquery.models.getData", "bigquery.models.getMetadata", "bigquery.models.list",
        "bigquery.routines.get", "bigquery.routines.list", "bigquery.tables.createSnapshot",
        "bigquery.tables.export", "bigquery.tables.get", "bigquery.tables.getData",
        "bigquery.tables.getIamPolicy", "bigquery.tables.list", "resourcemanager.projects.get",
        "resourcemanager.projects.list"}),
    "roles/bigquery.dataEditor": frozenset({
        "bigquery.config.get", "bigquery.datasets.create", "bigquery.datasets.get",
        "bigquery.datasets.getIamPolicy", "bigquery.datasets.updateTag", "bigquery.models.create",
        "bigquery.models.delete", "bigquery.models.export", "bigquery.models.getData",
        "bigquery.models.getMetadata", "bigquery.models.list", "bigquery.models.updateData",
        "bigquery.models.updateMetadata", "bigquery.models.updateTag",
        "bigquery.propertyGraphs.create", "bigquery.propertyGraphs.delete",
        "bigquery.propertyGraphs.get", "bigquery.propertyGraphs.list",
        "bigquery.propertyGraphs.update", "bigquery.routines.create", "bigquery.routines.delete",
        "bigquery.routines.get", "bigquery.routines.list", "bigquery.routines.update",
        "bigquery.routines.updateTag", "bigquery.tables.create", "bigquery.tables.createIndex",
        "bigquery.tables.createSnapshot", "bigquery.tables.delete", "bigquery.tables.deleteIndex",
        "bigquery.tables.export", "bigquery.tables.get", "bigquery.tables.getData",
        "bigquery.tables.getIamPolicy", "bigquery.tables.list", "bigquery.tables.replicateData",
        "bigquery.tables.restoreSnapshot", "bigquery.tables.update", "bigquery.tables.updateData",
        "bigquery.tables.updateIndex", "bigquery.tables.updateTag", "cloudkms.keyHandles.create",
        "cloudkms.keyHandles.get", "cloudkms.keyHandles.list", "cloudkms.operations.get",
        "cloudkms.projects.showEffectiveAutokeyConfig", "dataplex.datascans.cancel",
        "dataplex.datascans.create", "dataplex.datascans.delete", "dataplex.datascans.get",
        "dataplex.datascans.getData", "dataplex.datascans.getIamPolicy",
        "dataplex.datascans.list", "dataplex.datascans.run", "dataplex.datascans.update",
        "dataplex.operations.get", "dataplex.operations.list", "resourcemanager.projects.get",
        "resourcemanager.projects.list"}),
    "roles/aiplatform.user": frozenset({
        "aiplatform.artifacts.create", "aiplatform.artifacts.delete", "aiplatform.artifacts.get",
        "aiplatform.artifacts.list", "aiplatform.artifacts.update",
        "aiplatform.contexts.addContextArtifactsAndExecutions",
        "aiplatform.contexts.addContextChildren", "aiplatform.contexts.create",
        "aiplatform.contexts.delete", "aiplatform.contexts.get", "aiplatform.contexts.list",
        "aiplatform.contexts.queryContextLineageSubgraph", "aiplatform.contexts.update",
        "aiplatform.customJobs.cancel", "aiplatform.customJobs.create",
        "aiplatform.customJobs.delete", "aiplatform.customJobs.get", "aiplatform.customJobs.list",
        "aiplatform.endpoints.create", "aiplatform.endpoints.delete", "aiplatform.endpoints.deploy",
        "aiplatform.endpoints.explain", "aiplatform.endpoints.get", "aiplatform.endpoints.list",
        "aiplatform.endpoints.predict", "aiplatform.endpoints.undeploy",
        "aiplatform.endpoints.update",
        "aiplatform.executions.addExecutionEvents", "aiplatform.executions.create",
        "aiplatform.executions.delete", "aiplatform.executions.get", "aiplatform.executions.list",
        "aiplatform.executions.queryExecutionInputsAndOutputs", "aiplatform.executions.update",
        "aiplatform.metadataStores.create", "aiplatform.metadataStores.delete",
        "aiplatform.metadataStores.get", "aiplatform.metadataStores.list",
        "aiplatform.models.delete", "aiplatform.models.export", "aiplatform.models.get",
        "aiplatform.models.list", "aiplatform.models.update", "aiplatform.models.upload",
        "aiplatform.operations.list",
        # Vizier (issue 38), from gcp/roles/aiplatform.user.json at commit 02b6c7c8
        "aiplatform.studies.create", "aiplatform.studies.delete", "aiplatform.studies.get",
        "aiplatform.studies.list", "aiplatform.studies.update", "aiplatform.trials.create",
        "aiplatform.trials.delete", "aiplatform.trials.get", "aiplatform.trials.list",
        "aiplatform.trials.update",
    }),
    "roles/datastore.user": frozenset({
        "appengine.applications.get", "databasesconsole.locations.get",
        "databasesconsole.locations.list", "databasesconsole.studioQueries.create",
        "databasesconsole.studioQueries.delete", "databasesconsole.studioQueries.search",
        "databasesconsole.studioQueries.update", "datastore.databases.get",
        "datastore.databases.getMetadata", "datastore.databases.list",
        "datastore.entities.allocateIds", "datastore.entities.create", "datastore.entities.delete",
        "datastore.entities.get", "datastore.entities.list", "datastore.entities.update",
        "datastore.namespaces.get", "datastore.namespaces.list", "datastore.schemas.list",
        "datastore.statistics.get", "datastore.statistics.list", "resourcemanager.projects.get",
        "resourcemanager.projects.list",
    }),
    "roles/datastore.viewer": frozenset({
        "appengine.applications.get", "databasesconsole.locations.get",
        "databasesconsole.locations.list", "databasesconsole.studioQueries.search",
        "datastore.databases.get", "datastore.databases.getMetadata", "datastore.databases.list",
        "datastore.entities.get", "datastore.entities.list", "datastore.insights.get",
        "datastore.namespaces.get", "datastore.namespaces.list", "datastore.schemas.get",
        "datastore.schemas.list", "datastore.statistics.get", "datastore.statistics.list",
        "resourcemanager.projects.get", "resourcemanager.projects.list",
    }),
    "roles/storage.objectViewer": frozenset({
        "resourcemanager.projects.get", "resourcemanager.projects.list", "storage.folders.get",
        "storage.folders.list", "storage.managedFolders.get", "storage.managedFolders.list",
        "storage.objects.get", "storage.objects.list",
    }),
    "roles/storage.objectCreator": frozenset({
        "orgpolicy.policy.get", "resourcemanager.projects.get", "resourcemanager.projects.list",
        "storage.folders.create", "storage.managedFolders.create",
        "storage.multipartUploads.abort", "storage.multipartUploads.create",
        "storage.multipartUploads.list", "storage.multipartUploads.listParts",
        "storage.objects.create",
    }),
    "roles/storage.objectUser": frozenset({
        "monitoring.timeSeries.create", "orgpolicy.policy.get", "resourcemanager.projects.get",
        "resourcemanager.projects.list", "storage.folders.create", "storage.folders.delete",
        "storage.folders.get", "storage.folders.list", "storage.folders.rename",
        "storage.managedFolders.create", "storage.managedFolders.delete",
        "storage.managedFolders.get", "storage.managedFolders.list",
        "storage.multipartUploads.abort", "storage.multipartUploads.create",
        "storage.multipartUploads.list", "storage.multipartUploads.listParts",
        "storage.objects.create", "storage.objects.createContext", "storage.objects.delete",
        "storage.objects.deleteContext", "storage.objects.get", "storage.objects.list",
        "storage.objects.move", "storage.objects.restore", "storage.objects.update",
        "storage.objects.updateContext",
    }),
    "roles/pubsub.publisher": frozenset({
        "pubsub.topics.publish",
    }),
    "roles/pubsub.subscriber": frozenset({
        "pubsub.snapshots.seek", "pubsub.subscriptions.consume", "pubsub.topics.attachSubscription",
    }),
    "roles/pubsub.viewer": frozenset({
        "pubsub.messageTransforms.validate", "pubsub.schemas.get", "pubsub.schemas.list",
        "pubsub.schemas.listRevisions", "pubsub.schemas.validate", "pubsub.snapshots.get",
        "pubsub.snapshots.list", "pubsub.snapshots.listEffectiveTags",
        "pubsub.snapshots.listTagBindings", "pubsub.subscriptions.get", "pubsub.subscriptions.list",
        "pubsub.subscriptions.listEffectiveTags", "pubsub.subscriptions.listTagBindings",
        "pubsub.topics.get", "pubsub.topics.list", "pubsub.topics.listEffectiveTags",
        "pubsub.topics.listTagBindings", "resourcemanager.projects.get",
        "serviceusage.consumerpolicy.analyze", "serviceusage.consumerpolicy.get",
        "serviceusage.effectivepolicy.get", "serviceusage.groups.list",
        "serviceusage.groups.listExpandedMembers", "serviceusage.groups.listMembers",
        "serviceusage.quotas.get", "serviceusage.services.get", "serviceusage.services.list",
        "serviceusage.values.test",
    }),
    "roles/secretmanager.secretAccessor": frozenset({
        "resourcemanager.projects.get", "resourcemanager.projects.list",
        "secretmanager.versions.access",
    }),
    "roles/logging.logWriter": frozenset({
        "logging.logEntries.create", "logging.logEntries.route",
    }),
    "roles/logging.viewer": frozenset({
        "logging.buckets.get", "logging.buckets.list", "logging.exclusions.get",
        "logging.exclusions.list", "logging.links.get", "logging.links.list",
        "logging.locations.get", "logging.locations.list", "logging.logEntries.list",
        "logging.logMetrics.get", "logging.logMetrics.list", "logging.logScopes.get",
        "logging.logScopes.list", "logging.logServiceIndexes.list", "logging.logServices.list",
        "logging.logs.list", "logging.operations.get", "logging.operations.list",
        "logging.queries.getShared", "logging.queries.listShared", "logging.queries.usePrivate",
        "logging.sinks.get", "logging.sinks.list", "logging.usage.get", "logging.views.get",
        "logging.views.list", "observability.scopes.get", "resourcemanager.projects.get",
    }),
    # issue 37 (a canary's traffic): the time-series and descriptor reads of roles/monitoring.viewer
    # from Google's roles page (https://cloud.google.com/monitoring/access-control#roles); its
    # other read permissions (dashboards, alerting, uptime checks, groups) are left out.
    "roles/monitoring.viewer": frozenset({
        "monitoring.timeSeries.list", "monitoring.metricDescriptors.get",
        "monitoring.metricDescriptors.list", "monitoring.monitoredResourceDescriptors.get",
        "monitoring.monitoredResourceDescriptors.list", "resourcemanager.projects.get",
    }),
    "roles/iam.serviceAccountUser": frozenset({
        "iam.serviceAccounts.actAs", "iam.serviceAccounts.get", "iam.serviceAccounts.list",
        "resourcemanager.projects.get", "resourcemanager.projects.list",
    }),
    "roles/eventarc.eventReceiver": frozenset({
        "eventarc.events.receiveAuditLogWritten", "eventarc.events.receiveEvent",
    }),
    "roles/run.invoker": frozenset({
        "run.instances.invoke", "run.jobs.run", "run.routes.invoke",
    }),
    # The two Artifact Registry roles (issue 40: the build account pushes, Dataflow's launcher
    # VM pulls): the repository permissions of Google's roles page
    # (https://cloud.google.com/artifact-registry/docs/access-control#roles), not the dataset
    # above; their other permissions (tags, versions, files, attachments) are left out.
    # roles/logging.viewAccessor (issue 40: the job-log view), from the same roles page: reading
    # entries through a view, and the view's log and resource listings.
    "roles/logging.viewAccessor": frozenset({
        "logging.views.access", "logging.views.listLogs", "logging.views.listResourceKeys",
        "logging.views.listResourceValues",
    }),
    "roles/artifactregistry.reader": frozenset({
        "artifactregistry.repositories.downloadArtifacts", "artifactregistry.repositories.get",
        "artifactregistry.repositories.list", "artifactregistry.dockerimages.get",
        "artifactregistry.dockerimages.list",
    }),
    "roles/artifactregistry.writer": frozenset({
        "artifactregistry.repositories.downloadArtifacts", "artifactregistry.repositories.get",
        "artifactregistry.repositories.list", "artifactregistry.dockerimages.get",
        "artifactregistry.dockerimages.list", "artifactregistry.repositories.uploadArtifacts",
    }),
}
