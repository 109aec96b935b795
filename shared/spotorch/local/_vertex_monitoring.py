"""Cloud Monitoring's ListTimeSeries over the Vertex emulator's endpoints, so the real client
(google-cloud-monitoring's MetricServiceClient) reads a canary's traffic (issue 37).

What it serves is two of the online-prediction metrics Vertex AI writes to Cloud Monitoring
(Monitoring's metric list, "aiplatform"), on the monitored resource
aiplatform.googleapis.com/Endpoint (labels resource_container, location, endpoint_id):

- prediction/online/response_count: DELTA, INT64; labels deployed_model_id, response_code (the
  HTTP status the caller saw);
- prediction/online/prediction_latencies: DELTA, DISTRIBUTION in ms; labels deployed_model_id,
  latency_type (only "total" here: Vertex also writes "model" and "overhead").

Like Vertex, one point per deployed model, code and sampling period (`sample_period_s`; Vertex
samples every 60 s), visible only once its period has closed and `visible_after_s` more have
passed (Google documents a delay of up to a few minutes; the exact figure is unknown, so both
are settings, and the demo shortens them). The latency distribution's buckets are
exponential (`BUCKETS`): Vertex's own bucket options are not documented; the reader must take
them from the answer, as it does. Two things are the emulator's own: resource_container is the
project id (Google writes the project number), and only `=` comparisons of metric.type,
resource.type, resource.labels.* and metric.labels.* joined by AND are understood, anything
else refused with INVALID_ARGUMENT, never ignored; aggregation is refused likewise (the adapter
sums the raw points itself).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from spotorch.local._vertex_iam import IamPolicy
from spotorch.local._vertex_jobs import Invalid

if TYPE_CHECKING:
    from spotorch.local._vertex_endpoints import EndpointServices

SERVICE = "google.monitoring.v3.MetricService"
LIST_PERMISSION = "monitoring.timeSeries.list"  # roles/monitoring.viewer grants it
RESOURCE_TYPE = "aiplatform.googleapis.com/Endpoint"
RESPONSE_COUNT = "aiplatform.googleapis.com/prediction/online/response_count"
LATENCIES = "aiplatform.googleapis.com/prediction/online/prediction_latencies"
# Exponential buckets (Monitoring's form): bucket i (1..N) holds [scale*g^(i-1), scale*g^i) ms.
BUCKETS = {"num_finite_buckets": 60, "growth_factor": 1.2, "scale": 1.0}
_TERM = re.compile(r'^\s*(?P<field>metric\.type|resource\.type|resource\.labels\.[a-z_]+|'
                   r'metric\.labels\.[a-z_]+)\s*=\s*"(?P<value>(?:[^"\\]|\\.)*)"\s*$')


@dataclass(frozen=True)
class Series:
    """One time series before it becomes a TimeSeries message."""

    metric: str
    labels: Mapping[str, str]
    resource: Mapping[str, str]
    points: tuple[tuple[float, float, Any], ...]  # (start, end, value), newest first

    def field(self, name: str) -> str | None:
        if name == "metric.type":
            return self.metric
        if name == "resource.type":
            return RESOURCE_TYPE
        kind, _, key = name.partition(".labels.")
        return (self.labels if kind == "metric" else self.resource).get(key)


def parse_filter(text: str) -> list[tuple[str, str]]:
    """(field, value) of each `field = "value"` term joined by AND; Invalid otherwise."""
    terms = []
    for part in re.split(r"\s+AND\s+", text.strip()):
        found = _TERM.match(part)
        if found is None:
            raise Invalid("INVALID_ARGUMENT", f"the emulator does not understand {part.strip()!r} "
                          "(it takes metric.type, resource.type, resource.labels.* and "
                          'metric.labels.* = "value", joined by AND)')
        terms.append((found["field"], found["value"].replace('\\"', '"')))
    if not any(f == "metric.type" for f, _ in terms):
        raise Invalid("INVALID_ARGUMENT", "the filter must name one metric.type")
    return terms


def bucket_of(ms: float) -> int:
    """The index of a latency's bucket in BUCKETS (0: underflow, N+1: overflow)."""
    n, g, scale = (BUCKETS["num_finite_buckets"], BUCKETS["growth_factor"], BUCKETS["scale"])
    if ms < scale:
        return 0
    return min(int(n) + 1, 1 + math.floor(math.log(ms / scale, g)))


class MonitoringService:
    """MetricService.ListTimeSeries over the predictions EndpointServices answered."""

    def __init__(self, project: str | None, endpoints: EndpointServices,
                 iam: IamPolicy | None = None, *, sample_period_s: float = 60.0,
                 visible_after_s: float = 0.0, clock: Callable[[], float] | None = None) -> None:
        import time

        self.project = project
        self.endpoints = endpoints
        self.iam = iam  # None: callers are not checked
        self.sample_period_s = sample_period_s
        self.visible_after_s = visible_after_s
        self.clock = clock or time.time

    def series(self, project: str) -> Iterable[Series]:
        """Every series of both metrics, from the endpoints' predictions whose period closed."""
        now = self.clock()
        period = self.sample_period_s
        for endpoint, served in self.endpoints.all_traffic().items():
            parts = endpoint.split("/")  # projects/P/locations/L/endpoints/E
            resource = {"resource_container": project, "location": parts[3],
                        "endpoint_id": parts[5]}
            counts: dict[tuple[str, str, float], int] = {}
            latencies: dict[tuple[str, float], list[float]] = {}
            for s in served:
                start = math.floor(s.at / period) * period
                if start + period + self.visible_after_s > now:
                    continue  # its period has not closed, or is not visible yet
                key = (s.deployed_model_id, s.response_code, start)
                counts[key] = counts.get(key, 0) + 1
                latencies.setdefault((s.deployed_model_id, start), []).append(s.latency_ms)
            yield from _count_series(counts, resource, period)
            yield from _latency_series(latencies, resource, period)

    def handle(self, request: Any, metadata: Any) -> Any:
        """ListTimeSeries as Monitoring answers it: the caller's monitoring.timeSeries.list on
        the project first (UNAUTHENTICATED, PERMISSION_DENIED), then the page."""
        from google.cloud.monitoring_v3.types import ListTimeSeriesRequest, ListTimeSeriesResponse

        name = str(request.name)
        if not re.fullmatch(r"projects/[^/]+", name):
            raise Invalid("INVALID_ARGUMENT", f"name {name!r}: projects/P")
        if self.iam is not None:
            principal = self.iam.principal(metadata)
            if not self.iam.allows(principal, LIST_PERMISSION):
                raise Invalid("PERMISSION_DENIED", f"Permission '{LIST_PERMISSION}' denied on "
                              f"resource '//monitoring.googleapis.com/{name}' (or it may not "
                              "exist).")
        project = name.split("/", 1)[1]
        if self.project is not None and project != self.project:
            raise Invalid("PERMISSION_DENIED", f"this emulator serves project {self.project}")
        if request.aggregation and (request.aggregation.per_series_aligner or
                                    request.aggregation.cross_series_reducer):
            raise Invalid("INVALID_ARGUMENT", "the emulator does not aggregate (read the points)")
        if not request.interval or not request.interval.end_time:
            raise Invalid("INVALID_ARGUMENT", "interval.end_time is required")
        terms = parse_filter(str(request.filter))
        since = request.interval.start_time.timestamp() if request.interval.start_time else None
        until = request.interval.end_time.timestamp()
        headers = request.view == ListTimeSeriesRequest.TimeSeriesView.HEADERS
        out = []
        for s in self.series(project):
            if not all(s.field(f) == v for f, v in terms):
                continue
            points = tuple(p for p in s.points
                           if p[1] <= until and (since is None or p[1] > since))
            if points:
                out.append(_message(s, () if headers else points))
        size = min(int(request.page_size) or 100_000, 100_000)
        start = int(request.page_token or 0)
        token = str(start + size) if start + size < len(out) else ""
        return ListTimeSeriesResponse(time_series=out[start:start + size], next_page_token=token)

    def handlers(self) -> Any:
        import grpc
        from google.cloud.monitoring_v3.types import ListTimeSeriesRequest, ListTimeSeriesResponse

        def handle(request: Any, context: Any) -> Any:
            try:
                return self.handle(request, context.invocation_metadata())
            except Invalid as exc:
                context.abort(getattr(grpc.StatusCode, exc.code), str(exc))

        return grpc.method_handlers_generic_handler(SERVICE, {
            "ListTimeSeries": grpc.unary_unary_rpc_method_handler(
                handle, request_deserializer=ListTimeSeriesRequest.deserialize,
                response_serializer=ListTimeSeriesResponse.serialize)})


def _count_series(counts: Mapping[tuple[str, str, float], int], resource: Mapping[str, str],
                  period: float) -> Iterable[Series]:
    grouped: dict[tuple[str, str], list[tuple[float, float, Any]]] = {}
    for (deployed, code, start), n in counts.items():
        grouped.setdefault((deployed, code), []).append((start, start + period, n))
    for (deployed, code), points in grouped.items():
        yield Series(RESPONSE_COUNT, {"deployed_model_id": deployed, "response_code": code},
                     resource, tuple(sorted(points, reverse=True)))


def _latency_series(latencies: Mapping[tuple[str, float], list[float]],
                    resource: Mapping[str, str], period: float) -> Iterable[Series]:
    grouped: dict[str, list[tuple[float, float, Any]]] = {}
    for (deployed, start), values in latencies.items():
        grouped.setdefault(deployed, []).append((start, start + period, values))
    for deployed, points in grouped.items():
        yield Series(LATENCIES, {"deployed_model_id": deployed, "latency_type": "total"},
                     resource, tuple(sorted(points, key=lambda p: p[0], reverse=True)))


def _message(s: Series, points: tuple[tuple[float, float, Any], ...]) -> Any:
    from google.api import metric_pb2, monitored_resource_pb2
    from google.cloud.monitoring_v3.types import TimeSeries

    distribution = s.metric == LATENCIES
    return TimeSeries(
        metric=metric_pb2.Metric(type=s.metric, labels=dict(s.labels)),
        resource=monitored_resource_pb2.MonitoredResource(type=RESOURCE_TYPE,
                                                          labels=dict(s.resource)),
        metric_kind=metric_pb2.MetricDescriptor.MetricKind.DELTA,
        value_type=(metric_pb2.MetricDescriptor.ValueType.DISTRIBUTION if distribution
                    else metric_pb2.MetricDescriptor.ValueType.INT64),
        unit="ms" if distribution else "1",
        points=[_point(start, end, value, distribution) for start, end, value in points])


def _point(start: float, end: float, value: Any, distribution: bool) -> Any:
    from google.api import distribution_pb2
    from google.cloud.monitoring_v3.types import Point, TimeInterval, TypedValue

    interval = TimeInterval(start_time=datetime.fromtimestamp(start, UTC),
                            end_time=datetime.fromtimestamp(end, UTC))
    if not distribution:
        return Point(interval=interval, value=TypedValue(int64_value=int(value)))
    counts = [0] * (int(BUCKETS["num_finite_buckets"]) + 2)
    for ms in value:
        counts[bucket_of(ms)] += 1
    mean = sum(value) / len(value)
    dist = distribution_pb2.Distribution(
        count=len(value), mean=mean,
        sum_of_squared_deviation=sum((v - mean) ** 2 for v in value),
        bucket_options=distribution_pb2.Distribution.BucketOptions(
            exponential_buckets=distribution_pb2.Distribution.BucketOptions.Exponential(
                num_finite_buckets=int(BUCKETS["num_finite_buckets"]),
                growth_factor=BUCKETS["growth_factor"], scale=BUCKETS["scale"])),
        bucket_counts=counts)
    return Point(interval=interval, value=TypedValue(distribution_value=dist))

