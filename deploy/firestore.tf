# Firestore: the database, the composite indexes the run store's queries need, and TTL policies
# on every collection that grows with use (settings.RETENTION; Firestore deletes expired documents
# within about a day; the field must hold a timestamp, a number is ignored).

locals {
  # shared/spotorch/adapters/gcp/firestore.py REQUIRED_INDEXES, the multi-field ones, and only those: an
  # unused index still costs a write per document change. Today every query filters on one field
  # (QUERIED_FIELDS), which Firestore's automatic single-field indexes serve. An entry looks like
  #   "runs-pipeline-active" = { collection = "runs", fields = ["pipeline", "active"] }
  composite_indexes = {}

  # collection -> field holding the expiry time. Not indexed: nothing queries it.
  ttl_fields = {
    "dedupe-expires_at" = {
      collection = "dedupe", field = "expires_at"
    }
    "rejected_events-expires_at" = {
      collection = "rejected_events", field = "expires_at"
    }
    "notifications-expires_at" = {
      collection = "notifications", field = "expires_at"
    }
    "notification_runs-expires_at" = {
      collection = "notification_runs", field = "expires_at"
    }
    # a message's last transient failure (what `spotorch dead-letters` shows): 14 days
    "delivery_failures-expires_at" = {
      collection = "delivery_failures", field = "expires_at"
    }
    # job id -> run and attempt (log-sink lines name only the job): the job's timeout + 30 days
    "jobs-expires_at" = {
      collection = "jobs", field = "expires_at"
    }
    # the shared record of Spot per region and shape (spotorch/app/spot_record.py): 24 h after its
    # last observation
    "spot_regions-expires_at" = {
      collection = "spot_regions", field = "expires_at"
    }
    # a folder of uploads no pipeline took (spotorch/app/unmatched.py): 7 days after its last object
    "unmatched_uploads-expires_at" = {
      collection = "unmatched_uploads", field = "expires_at"
    }
  }
}

resource "google_firestore_database" "spotorch" {
  count       = var.create_firestore_database ? 1 : 0
  project     = var.project_id
  name        = local.firestore_database
  location_id = coalesce(var.firestore_location, var.region)
  type        = "FIRESTORE_NATIVE"

  # ABANDON (the default) keeps run history when the deployment is destroyed.
  deletion_policy = var.firestore_deletion_policy

  depends_on = [google_project_service.api]
}

resource "google_firestore_index" "composite" {
  for_each    = local.composite_indexes
  project     = var.project_id
  database    = local.firestore_database
  collection  = each.value.collection
  query_scope = "COLLECTION"

  dynamic "fields" {
    for_each = each.value.fields
    content {
      field_path = fields.value
      order      = "ASCENDING"
    }
  }

  depends_on = [google_firestore_database.spotorch, google_project_service.api]
}

resource "google_firestore_field" "ttl" {
  for_each   = local.ttl_fields
  project    = var.project_id
  database   = local.firestore_database
  collection = each.value.collection
  field      = each.value.field

  ttl_config {}
  index_config {}

  depends_on = [google_firestore_database.spotorch, google_project_service.api]
}
