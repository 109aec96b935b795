"""The Vertex emulator's JobService RPCs: validate like Vertex, charge quota, read and change jobs."""

from __future__ import annotations

import itertools
import logging
import re
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from spotorch.adapters.gcp.vertex import JobState
from spotorch.local._vertex_filter import FilterError, matches, parse_filter
from spotorch.local._vertex_iam import IamPolicy
from spotorch.local._vertex_jobs import DEFAULT_TIMEOUT_S, TERMINAL, Invalid, JobRecord, JobStore, utc
from spotorch.local._vertex_quota import QuotaExceeded, QuotaMeter
from spotorch.local._vertex_resources import ResourceQuotas, usage
from spotorch.local._vertex_runner import JobRunner

log = logging.getLogger("spotorch.local.vertex_emulator")

SERVICE = "google.cloud.aiplatform.v1.JobService"

_LABEL_KEY = re.compile(r"^[a-z][a-z0-9_-]{0,62}$")
_LABEL_VALUE = re.compile(r"^[a-z0-9_-]{0,63}$")


def _validate_labels(labels: Mapping[str, str]) -> None:
    if len(labels) > 64:
        raise Invalid("INVALID_ARGUMENT", "at most 64 labels are allowed")
    for k, v in labels.items():
        if not _LABEL_KEY.match(k) or not _LABEL_VALUE.match(v):
            raise Invalid("INVALID_ARGUMENT", f"invalid label {k}={v!r}: keys and values must "
                          "be lowercase letters, digits, - or _ (at most 63 characters; keys "
                          "start with a letter)")


def parse_parent(parent: str) -> tuple[str, str]:
    """(project, region) of projects/P/locations/R."""
    parts = parent.split("/")
    if len(parts) != 4 or parts[0] != "projects" or parts[2] != "locations" \
            or not parts[1] or not parts[3]:
        raise Invalid("INVALID_ARGUMENT", f"invalid parent {parent!r}: "
                      "expected projects/PROJECT/locations/REGION")
    return parts[1], parts[3]


def _scope(method: str, request: Any) -> tuple[str, str]:
    """(project, region) a request is charged to: from its parent or its job name."""
    if method in ("CreateCustomJob", "ListCustomJobs"):
        return parse_parent(request.parent)
    parts = str(request.name).split("/")
    return (parts[1], parts[3]) if len(parts) >= 4 else ("", "")


def copy(proto: Any) -> Any:
    return type(proto).deserialize(type(proto).serialize(proto))


class JobService:
    """CreateCustomJob, GetCustomJob, CancelCustomJob and ListCustomJobs on the store."""

    def __init__(self, project: str | None, store: JobStore, runner: JobRunner,
                 quota: QuotaMeter, workdir: Callable[[], Path],
                 iam: IamPolicy | None = None, resources: ResourceQuotas | None = None) -> None:
        self.project = project
        self.resources = resources  # GPUs, TPUs, CPUs per region (None: unlimited)
        self.iam = iam  # None: no caller is checked (in-process tests that do not ask for IAM)
        self.store = store
        self.runner = runner
        self.quota = quota
        self._workdir = workdir
        self._ids = itertools.count(time.time_ns() // 1000)  # unique across restarts

    def _check_project(self, project: str) -> None:
        if self.project is not None and project != self.project:
            raise Invalid("PERMISSION_DENIED", f"project {project!r} is not served by this "
                          f"emulator (it serves {self.project!r})")

    def _validated(self, request: Any) -> tuple[str, str, Any]:
        project, region = parse_parent(request.parent)
        self._check_project(project)
        job = request.custom_job
        if not job.display_name:
            raise Invalid("INVALID_ARGUMENT", "display_name is required")
        pools = list(job.job_spec.worker_pool_specs)
        if not pools or not pools[0].replica_count:
            raise Invalid("INVALID_ARGUMENT", "worker_pool_specs[0] with replica_count >= 1 "
                          "is required")
        for i, pool in enumerate(pools):
            if pool.replica_count and not pool.machine_spec.machine_type:
                raise Invalid("INVALID_ARGUMENT", f"worker_pool_specs[{i}].machine_spec."
                              "machine_type is required")
            package = pool.python_package_spec
            if package.python_module and not (package.executor_image_uri
                                              and package.package_uris):
                raise Invalid("INVALID_ARGUMENT", f"worker_pool_specs[{i}].python_package_spec "
                              "needs executor_image_uri and package_uris")
            if pool.replica_count and not (pool.container_spec.command
                                           or pool.container_spec.args
                                           or pool.python_package_spec.python_module):
                raise Invalid("INVALID_ARGUMENT", f"worker_pool_specs[{i}]: the emulator runs "
                              "commands, not images: set container_spec.command")
        _validate_labels(job.labels)
        return project, region, job

    def create(self, request: Any) -> Any:
        """CreateCustomJob: store the job QUEUED and return it."""
        from google.cloud import aiplatform_v1 as v1

        project, region, job = self._validated(request)
        proto = copy(job)
        job_id = str(next(self._ids))
        proto.name = f"projects/{project}/locations/{region}/customJobs/{job_id}"
        proto.state = v1.JobState.JOB_STATE_QUEUED
        now = time.time()
        proto.create_time = utc(now)
        proto.update_time = utc(now)
        for key in ("start_time", "end_time", "error"):
            proto._pb.ClearField(key)
        scheduling = job.job_spec.scheduling
        timeout = scheduling.timeout
        record = JobRecord(proto=proto, job_id=job_id, project=project, region=region,
                           spot=scheduling.strategy == v1.Scheduling.Strategy.SPOT,
                           timeout_s=timeout.total_seconds() if timeout else DEFAULT_TIMEOUT_S,
                           log_dir=self._workdir() / job_id, since=time.monotonic(),
                           states=[JobState.QUEUED])
        with self.store.lock:
            self._check_resources(project, region, job)
            self.store.add(record)
            self.runner.record(record, JobState.QUEUED, now)
            self.store.save()
            log.info("%s: created (%s) %s", proto.name, "SPOT" if record.spot else "not spot",
                     dict(proto.labels))
            return copy(proto)

    def _check_resources(self, project: str, region: str, job: Any) -> None:
        """Refuse a job the region's resource quotas cannot hold (under the store's lock)."""
        if self.resources is None or not self.resources.limits:
            return
        from google.cloud import aiplatform_v1 as v1

        preemptible = (v1.Scheduling.Strategy.SPOT, v1.Scheduling.Strategy.FLEX_START)
        in_use = [usage(r.proto.job_spec, r.proto.job_spec.scheduling.strategy in preemptible)
                  for r in self.store.records()
                  if r.project == project and r.region == region and r.state not in TERMINAL]
        wanted = usage(job.job_spec, job.job_spec.scheduling.strategy in preemptible)
        over = self.resources.exceeded(region, wanted, in_use)
        if over:
            log.info("projects/%s/locations/%s: refused, over quota %s", project, region, over)
            raise Invalid("RESOURCE_EXHAUSTED", self.resources.refusal(over))

    def get(self, request: Any) -> Any:
        """GetCustomJob."""
        with self.store.lock:
            job = self.store.get(request.name)
            if job is None:
                raise Invalid("NOT_FOUND", f"CustomJob {request.name} not found")
            return copy(job.proto)

    def cancel(self, request: Any) -> Any:
        """CancelCustomJob: CANCELLING now; CANCELLED once the workers are gone."""
        from google.protobuf import empty_pb2

        with self.store.lock:
            job = self.store.get(request.name)
            if job is None:
                raise Invalid("NOT_FOUND", f"CustomJob {request.name} not found")
            if job.state in TERMINAL:
                raise Invalid("FAILED_PRECONDITION", f"CustomJob {request.name} is in state "
                              f"JOB_STATE_{job.state.name} and cannot be cancelled")
            self.runner.cancel(job, time.monotonic())
        return empty_pb2.Empty()

    def list(self, request: Any) -> Any:
        """ListCustomJobs with the labels/display_name/state filter, newest first, paged."""
        from google.cloud import aiplatform_v1 as v1

        project, _ = parse_parent(request.parent)
        self._check_project(project)
        try:
            terms = parse_filter(request.filter)
        except FilterError as exc:
            raise Invalid("INVALID_ARGUMENT", str(exc)) from exc
        prefix = f"{request.parent}/customJobs/"
        size = request.page_size if request.page_size > 0 else 100
        start = int(request.page_token) if request.page_token.isdigit() else 0
        with self.store.lock:
            found = [j for j in self.store.records()
                     if j.name.startswith(prefix)
                     and matches(terms, j.labels, j.display_name, j.state_name)]
            found.reverse()
            # Only the page is copied: with thousands of jobs, copying every match for each page
            # made a listing quadratic in the emulator (not in Vertex).
            page = [copy(j.proto) for j in found[start:start + size]]
        token = str(start + size) if start + size < len(found) else ""
        return v1.ListCustomJobsResponse(custom_jobs=page, next_page_token=token)

    def _charge(self, method: str, request: Any) -> None:
        project, region = _scope(method, request)
        try:
            self.quota.charge(method, project, region)
        except QuotaExceeded as exc:
            raise Invalid("RESOURCE_EXHAUSTED", str(exc)) from None

    def handlers(self) -> Any:
        """The generic gRPC handler of the service: the caller's permission, quota, the method."""
        import grpc
        from google.cloud import aiplatform_v1 as v1
        from google.protobuf import empty_pb2

        def rpc(method: str, fn: Callable[[Any], Any], request_type: Any,
                serialize: Any) -> Any:
            def handle(request: Any, context: Any) -> Any:
                try:
                    if self.iam is not None:
                        self.iam.check(f"JobService/{method}", context.invocation_metadata(),
                                       request)
                    self._charge(method, request)
                    return fn(request)
                except Invalid as exc:
                    context.abort(getattr(grpc.StatusCode, exc.code), str(exc))
            return grpc.unary_unary_rpc_method_handler(
                handle, request_deserializer=request_type.deserialize,
                response_serializer=serialize)

        return grpc.method_handlers_generic_handler(SERVICE, {
            "CreateCustomJob": rpc("CreateCustomJob", self.create, v1.CreateCustomJobRequest,
                                   v1.CustomJob.serialize),
            "GetCustomJob": rpc("GetCustomJob", self.get, v1.GetCustomJobRequest,
                                v1.CustomJob.serialize),
            "CancelCustomJob": rpc("CancelCustomJob", self.cancel, v1.CancelCustomJobRequest,
                                   empty_pb2.Empty.SerializeToString),
            "ListCustomJobs": rpc("ListCustomJobs", self.list, v1.ListCustomJobsRequest,
                                  v1.ListCustomJobsResponse.serialize),
        })
