"""ports.EndpointTraffic on Cloud Monitoring: a canary's predictions, failures and p95 latency as
Vertex AI reports them for the endpoint (issue 37).

Two ListTimeSeries calls per judgement, raw points (no aggregation), summed here:
prediction/online/response_count (DELTA INT64, labels deployed_model_id and response_code) counts
the responses, those with a 5xx code as failures (a 4xx is the caller's bad request, not the
model's); prediction/online/prediction_latencies (DELTA DISTRIBUTION in ms, latency_type
"total") gives the p95: the points' buckets are merged and the p95 read at the upper bound of
the bucket it falls in (conservative by one bucket's width). The metric and label names are
Monitoring's list of Vertex AI metrics; the bucket options are taken from each answer.

Monitoring samples Vertex's metrics every 60 s and shows a point some minutes later, so a
window sees the canary's traffic up to a few minutes back: keep canary_minutes well above that
(docs/promotion.md). The caller needs monitoring.timeSeries.list on the project
(roles/monitoring.viewer, deploy/iam.tf).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import Any

from spotorch.adapters.gcp.vertex_calls import emulator_channel
from spotorch.core.canary import Window
from spotorch.ports.serving import ServingError

RESPONSE_COUNT = "aiplatform.googleapis.com/prediction/online/response_count"
LATENCIES = "aiplatform.googleapis.com/prediction/online/prediction_latencies"
CALL_TIMEOUT_S = 20.0


def series_filter(metric: str, endpoint: str, deployed_model_id: str) -> str:
    """The Monitoring filter of one deployed model's series of a metric on its endpoint."""
    parts = endpoint.split("/")  # projects/P/locations/L/endpoints/E
    return (f'metric.type = "{metric}" AND resource.type = "aiplatform.googleapis.com/Endpoint" '
            f'AND resource.labels.location = "{parts[3]}" '
            f'AND resource.labels.endpoint_id = "{parts[5]}" '
            f'AND metric.labels.deployed_model_id = "{deployed_model_id}"')


def bucket_bounds(options: Any, count: int) -> list[float]:
    """The upper bound of each of `count` buckets (underflow first, overflow last: infinity) of
    a Distribution's bucket options (linear, exponential or explicit)."""
    if options.linear_buckets and options.linear_buckets.num_finite_buckets:
        lin = options.linear_buckets
        finite = [lin.offset + lin.width * i for i in range(lin.num_finite_buckets + 1)]
    elif options.exponential_buckets and options.exponential_buckets.num_finite_buckets:
        exp = options.exponential_buckets
        finite = [exp.scale * exp.growth_factor ** i for i in range(exp.num_finite_buckets + 1)]
    else:
        finite = list(options.explicit_buckets.bounds)
    bounds = [*finite, float("inf")]
    return (bounds + [float("inf")] * count)[:count]


def p95_of(merged: dict[float, int]) -> float | None:
    """The 95th percentile of merged bucket counts (upper bound -> count): the upper bound of
    the bucket holding it; None when nothing was counted, infinity past the last bucket."""
    total = sum(merged.values())
    if not total:
        return None
    need, seen = 0.95 * total, 0
    for bound in sorted(merged):
        seen += merged[bound]
        if seen >= need:
            return bound
    return max(merged)


class MonitoringEndpointTraffic:
    """A deployed model's traffic from Cloud Monitoring (or the Vertex emulator's stand-in)."""

    def __init__(self, project: str, *, endpoint: str | None = None, token: str | None = None,
                 client: Any = None, timeout_s: float = CALL_TIMEOUT_S) -> None:
        """endpoint: None for monitoring.googleapis.com, or host:port of the local Vertex
        emulator; token: the local caller's bearer token there."""
        self.project = project
        self.endpoint = endpoint
        self.token = token
        self.timeout_s = timeout_s
        self._client = client
        self._lock = threading.Lock()

    def _c(self) -> Any:
        with self._lock:
            if self._client is None:
                from google.cloud.monitoring_v3 import MetricServiceClient

                if self.endpoint:
                    from google.cloud.monitoring_v3.services.metric_service.transports.grpc import (
                        MetricServiceGrpcTransport,
                    )
                    self._client = MetricServiceClient(transport=MetricServiceGrpcTransport(
                        channel=emulator_channel(self.endpoint, self.token)))
                else:
                    self._client = MetricServiceClient()
            return self._client

    def _series(self, metric: str, endpoint: str, deployed_model_id: str,
                since: float) -> Sequence[Any]:
        from datetime import UTC, datetime

        from google.cloud.monitoring_v3.types import ListTimeSeriesRequest, TimeInterval

        request = ListTimeSeriesRequest(
            name=f"projects/{self.project}",
            filter=series_filter(metric, endpoint, deployed_model_id),
            interval=TimeInterval(start_time=datetime.fromtimestamp(since, UTC),
                                  end_time=datetime.fromtimestamp(time.time(), UTC)),
            view=ListTimeSeriesRequest.TimeSeriesView.FULL)
        try:
            return list(self._c().list_time_series(request=request, timeout=self.timeout_s))
        except Exception as exc:
            from spotorch.adapters.gcp.vertex_calls import classify_failure

            code, transient = classify_failure(exc)
            raise ServingError(f"Cloud Monitoring ListTimeSeries {metric}: {code}: {exc}",
                               permanent=not transient, code=code) from exc

    def window(self, endpoint: str, deployed_model_id: str, since: float) -> Window:
        """EndpointTraffic.window: responses, 5xx failures and p95 latency since `since`."""
        count = errors = 0
        for series in self._series(RESPONSE_COUNT, endpoint, deployed_model_id, since):
            n = sum(int(p.value.int64_value) for p in series.points)
            count += n
            if str(series.metric.labels.get("response_code", "")).startswith("5"):
                errors += n
        merged: dict[float, int] = {}
        for series in self._series(LATENCIES, endpoint, deployed_model_id, since):
            if series.metric.labels.get("latency_type", "total") != "total":
                continue
            for point in series.points:
                dist = point.value.distribution_value
                bounds = bucket_bounds(dist.bucket_options, len(dist.bucket_counts))
                for bound, n in zip(bounds, dist.bucket_counts, strict=True):
                    if n:
                        merged[bound] = merged.get(bound, 0) + int(n)
        p95 = p95_of(merged)
        return Window(count=count, errors=errors,
                      p95_ms=None if p95 is None else round(p95, 3))
