# Cloud Monitoring: log-based metrics from spotorch's structured logs, a dashboard and an alerting
# policy. Each metric selects the lines whose spotorch_metric field names it (spotorch.logs
# METRIC_*: shared/spotorch/app/run_log.py and the tick), and extracts the fields those lines
# carry; tests/test_monitoring.py runs the code and checks each filter against what it logs.

locals {
  metric_prefix = "logging.googleapis.com/user/"

  # metric -> what it counts (or measures), the line it reads, its labels (field names)
  log_metrics = {
    "spotorch/runs_ended" = {
      description = "Runs that ended, by status and pipeline."
      event       = "run_ended"
      labels      = ["status", "pipeline"]
      value       = null
      unit        = "1"
    }
    "spotorch/run_spend" = {
      description = "What each ended run cost (the ledger's total), by status and pipeline."
      event       = "run_ended"
      labels      = ["status", "pipeline"]
      value       = "spent"
      unit        = "{USD}"
    }
    "spotorch/preemptions" = {
      description = "Attempts preempted (Spot VMs taken back while running), by pipeline and region."
      event       = "attempt_preempted"
      labels      = ["pipeline", "region"]
      value       = null
      unit        = "1"
    }
    "spotorch/relaunch_latency" = {
      description = "Seconds from a preempted attempt's end to its run's next attempt, by pipeline."
      event       = "attempt_relaunched"
      labels      = ["pipeline"]
      value       = "relaunch_s"
      unit        = "s"
    }
    "spotorch/ticks" = {
      description = "Reconcile ticks handled: the reconciler is alive."
      event       = "tick"
      labels      = []
      value       = null
      unit        = "1"
    }
  }

  # The dashboard: one chart per metric, two to a row.
  dashboard_tiles = [
    {
      title = "Runs ended, by status", metric = "spotorch/runs_ended", plot = "STACKED_BAR",
      by    = ["metric.label.status"], aligner = "ALIGN_SUM", reducer = "REDUCE_SUM"
    },
    {
      title = "Preemptions, by region", metric = "spotorch/preemptions", plot = "STACKED_BAR",
      by    = ["metric.label.region"], aligner = "ALIGN_SUM", reducer = "REDUCE_SUM"
    },
    {
      title   = "Preemption to relaunch (s, 95th percentile)", metric = "spotorch/relaunch_latency",
      plot    = "LINE", by = ["metric.label.pipeline"], aligner = "ALIGN_DELTA",
      reducer = "REDUCE_PERCENTILE_95"
    },
    {
      title = "Spend per ended run (USD, mean), by pipeline", metric = "spotorch/run_spend",
      plot  = "LINE", by = ["metric.label.pipeline"], aligner = "ALIGN_DELTA", reducer = "REDUCE_MEAN"
    },
    {
      title   = "Reconcile ticks", metric = "spotorch/ticks", plot = "LINE", by = [],
      aligner = "ALIGN_SUM", reducer = "REDUCE_SUM"
    },
  ]

  # The monitored resource of spotorch's log-based metrics: the entries' own, which for Cloud
  # Functions (2nd gen) is the Cloud Run revision. Every alert filter names it.
  metric_resource_type = "cloud_run_revision"

  # the relaunch latency counts relaunches after a preemption only
  log_metric_extra_filter = {
    "spotorch/relaunch_latency" = " AND jsonPayload.after=\"preempted\""
  }
}

resource "google_logging_metric" "spotorch" {
  for_each    = local.log_metrics
  name        = each.key
  description = each.value.description
  filter      = "jsonPayload.spotorch_metric=\"${each.value.event}\"${lookup(local.log_metric_extra_filter, each.key, "")}"

  label_extractors = { for label in each.value.labels : label => "EXTRACT(jsonPayload.${label})" }
  value_extractor  = each.value.value == null ? null : "EXTRACT(jsonPayload.${each.value.value})"

  metric_descriptor {
    metric_kind  = "DELTA"
    value_type   = each.value.value == null ? "INT64" : "DISTRIBUTION"
    unit         = each.value.unit
    display_name = each.key

    dynamic "labels" {
      for_each = toset(each.value.labels)
      content {
        key        = labels.value
        value_type = "STRING"
      }
    }
  }

  # Distributions: exponential buckets from 1 s (latency) or 1 cent (spend), doubling.
  dynamic "bucket_options" {
    for_each = each.value.value == null ? [] : [each.value.value]
    content {
      exponential_buckets {
        num_finite_buckets = 24
        growth_factor      = 2
        scale              = bucket_options.value == "spent" ? 0.01 : 1
      }
    }
  }

  depends_on = [google_project_service.api]
}

resource "google_monitoring_dashboard" "spotorch" {
  dashboard_json = jsonencode({
    displayName = "spotorch"
    mosaicLayout = {
      columns = 12
      tiles = [
        for i, tile in local.dashboard_tiles : {
          xPos   = (i % 2) * 6
          yPos   = floor(i / 2) * 4
          width  = 6
          height = 4
          widget = {
            title = tile.title
            xyChart = {
              dataSets = [{
                plotType = tile.plot
                timeSeriesQuery = {
                  timeSeriesFilter = {
                    filter = "metric.type=\"${local.metric_prefix}${tile.metric}\""
                    aggregation = {
                      alignmentPeriod    = "3600s"
                      perSeriesAligner   = tile.aligner
                      crossSeriesReducer = tile.reducer
                      groupByFields      = tile.by
                    }
                  }
                }
              }]
            }
          }
        }
      ]
    }
  })

  depends_on = [google_logging_metric.spotorch]
}

# Monitoring answers 404 "Cannot find metric(s)" for a log-based metric created moments before
# (hashicorp/terraform-provider-google#11102: up to about 10 minutes): the alert policy waits.
# A new metric (a new key) makes the wait run again; only creation waits.
resource "time_sleep" "log_metrics_ready" {
  create_duration = "600s"
  triggers        = { metrics = join(",", sort([for m in google_logging_metric.spotorch : m.id])) }
}

resource "google_monitoring_alert_policy" "spotorch" {
  display_name          = "spotorch: runs failing or the reconciler silent"
  combiner              = "OR"
  notification_channels = var.alert_notification_channels
  severity              = "ERROR"

  conditions {
    display_name = "a run ended in a FAILED status"
    condition_threshold {
      filter          = "resource.type=\"${local.metric_resource_type}\" AND metric.type=\"${local.metric_prefix}spotorch/runs_ended\" AND metric.label.status=starts_with(\"FAILED\")"
      comparison      = "COMPARISON_GT"
      threshold_value = 0
      duration        = "0s"
      aggregations {
        alignment_period     = "300s"
        per_series_aligner   = "ALIGN_SUM"
        cross_series_reducer = "REDUCE_SUM"
        group_by_fields      = ["metric.label.pipeline", "metric.label.status"]
      }
    }
  }

  conditions {
    display_name = "no reconcile tick for 30 minutes"
    condition_absent {
      filter   = "resource.type=\"${local.metric_resource_type}\" AND metric.type=\"${local.metric_prefix}spotorch/ticks\""
      duration = "1800s"
      aggregations {
        alignment_period   = "300s"
        per_series_aligner = "ALIGN_SUM"
      }
    }
  }

  alert_strategy {
    auto_close = "86400s"
  }

  documentation {
    mime_type = "text/markdown"
    subject   = "spotorch: $${condition.display_name}"
    content   = <<-EOT
      A run ended FAILED*: `spotorch runs --status failed` lists it, `spotorch show RUN` says why
      (docs/operating.md). No tick for 30 minutes: the reconciler is not running; check the
      spotorch-tick Cloud Scheduler job and the spotorch-on-tick function's logs.
    EOT
  }

  depends_on = [google_logging_metric.spotorch, time_sleep.log_metrics_ready]
}
