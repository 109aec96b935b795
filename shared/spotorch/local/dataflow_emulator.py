"""A local Dataflow (issue 31): the REST API the real google-cloud-dataflow-client talks to,
running each job's Beam pipeline with Beam's DirectRunner; docs/local-stack.md.

    python -m spotorch.local.dataflow_emulator --port P --project PROJ --workdir DIR
        --launcher-template gs://.../launcher.json [--beam-python PATH] [--events-url URL]
        [--iam FILE]

What it serves (v1b3, regional paths only, as spotorch calls them): flexTemplates:launch,
jobs.list (with name and filter), jobs.get, jobs.update (requestedState JOB_STATE_CANCELLED),
jobs.messages.list and jobs.getMetrics. A second active job of one name is refused (409
ALREADY_EXISTS), as Dataflow does.

What a job does: the launch of spotorch's launcher template (the parameters module, packages,
input, output and the options) downloads the code package from the stack's fake GCS and
installs it (the Vertex emulator's package installer), stages the input folder to a local
directory, runs `python -m MODULE --input DIR --output DIR OPTIONS --runner DirectRunner` in the
Beam environment (apache-beam in a venv of its own: it pins protobuf), and uploads the output
files to the output prefix. Staged, not read in place: Beam's GCS IO reaches fake-gcs-server
(STORAGE_EMULATOR_HOST), but its write finalization uses the JSON batch API that fake-gcs-server
does not implement ("Bad response: not multi-part"). A non-zero exit fails the job with the
worker's last stderr lines as its JOB_MESSAGE_ERROR ("Error message from worker: ..."), as
Dataflow reports a worker's exception. Billed resources are the machine type's vCPUs and memory
times the running time on one worker (250 GB of standard disk): the same pipeline code, not
Dataflow's scaling. Every state change is POSTed to --events-url as Eventarc delivers
google.cloud.dataflow.job.v1beta3.statusChanged to Cloud Run (a binary-mode CloudEvent, data
{"payload": Job}). With --iam, each call needs a known bearer token whose principal holds the
method's permission (the local stack writes the file from deploy/'s grants).
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

import click

from spotorch.core.preprocess import LIVE_STATES, STATUS_CHANGED_TYPE
from spotorch.core.prices import shape_of
from spotorch.local._eventarc import post
from spotorch.local._vertex_iam import IamPolicy
from spotorch.local._vertex_jobs import Invalid

log = logging.getLogger("spotorch.local.dataflow_emulator")

READY_LINE = "dataflow emulator listening on {address}"
SERVICE_HOST = "dataflow.googleapis.com"
REPO = Path(__file__).resolve().parents[3]
DEFAULT_BEAM_PYTHON = REPO / ".venv-beam" / "bin" / "python"
LAUNCHER = REPO / "deploy" / "dataflow-launcher" / "launcher.py"  # spotorch's flex template
DEFAULT_DISK_GB = 250.0  # Dataflow's default persistent disk of a batch worker
ERROR_LINES = 40  # of the worker's stderr, in the failed job's error message
_PATH = re.compile(r"^/v1b3/projects/(?P<project>[^/]+)/locations/(?P<location>[^/]+)/"
                   r"(?P<rest>.+)$")
_HTTP = {"INVALID_ARGUMENT": 400, "FAILED_PRECONDITION": 400, "UNAUTHENTICATED": 401,
         "PERMISSION_DENIED": 403, "NOT_FOUND": 404, "ALREADY_EXISTS": 409, "INTERNAL": 500}
# The REST client sends enums as numbers ($alt=json;enum-encoding=int): JobState and
# ListJobsRequest.Filter by number (google/dataflow/v1beta3/jobs.proto).
JOB_STATES = ("JOB_STATE_UNKNOWN", "JOB_STATE_STOPPED", "JOB_STATE_RUNNING", "JOB_STATE_DONE",
              "JOB_STATE_FAILED", "JOB_STATE_CANCELLED", "JOB_STATE_UPDATED",
              "JOB_STATE_DRAINING", "JOB_STATE_DRAINED", "JOB_STATE_PENDING",
              "JOB_STATE_CANCELLING", "JOB_STATE_QUEUED", "JOB_STATE_RESOURCE_CLEANING_UP")
LIST_FILTERS = ("UNKNOWN", "ALL", "TERMINATED", "ACTIVE")
LAUNCHER_METADATA = REPO / "deploy" / "dataflow-launcher" / "metadata.json"
# Dataflow's own words where we found them (API error bodies quoted in public issues); Dataflow
# prefixes a request id "(hex): " that is left out here. The texts for an undeclared and a
# missing parameter were not found: ours, in Dataflow's "The template parameters are invalid"
# form (whose per-parameter form "NAME: DESCRIPTION" is Dataflow's). docs/local-stack.md.
ACT_AS_DENIED = ("Current user cannot act as service account {account}. "
                 "https://cloud.google.com/iam/docs/service-accounts-actas "
                 "Causes: Current user cannot act as service account {account}.")
LABEL_INVALID = ('Encountered an invalid user label. generic::invalid_argument: Invalid field '
                 '"user_labels.{key}"; {why}')
LABEL_KEY_RULE = 'key does not conform to regular expression "[a-z][a-z0-9_-]{0,62}"'
LABEL_VALUE_RULE = 'value {value!r} does not conform to regular expression "[a-z0-9_-]{{0,63}}"'
LABELS_TOO_MANY = ("Encountered an invalid user label. generic::invalid_argument: a job has at "
                   "most {limit} user labels, not {count}")
PARAMETERS_INVALID = "The template parameters are invalid. Details: \n{details}"
PARAMETER_UNKNOWN = "Parameter is not declared in the template's metadata"
PARAMETER_MISSING = "Required parameter is missing"
MAX_LABELS = 64
# Google's label rules (cloud.google.com/resource-manager/docs/labels-overview), ASCII only: the
# international letters Google also allows are not needed by spotorch and not emulated.
_LABEL_KEY = re.compile(r"[a-z][a-z0-9_-]{0,62}")
_LABEL_VALUE = re.compile(r"[a-z0-9_-]{0,63}")
# Dataflow runs a job without a service account as the Compute Engine default account,
# PROJECT_NUMBER-compute@developer.gserviceaccount.com; the local project has no number.
DEFAULT_WORKER_ACCOUNT = "{project}-compute@developer.gserviceaccount.com"
METHOD_PERMISSIONS = {"launch": "dataflow.jobs.create", "list": "dataflow.jobs.list",
                      "get": "dataflow.jobs.get", "update": "dataflow.jobs.cancel",
                      "messages": "dataflow.messages.list", "metrics": "dataflow.metrics.get"}


def beam_available(python: Path = DEFAULT_BEAM_PYTHON) -> bool:
    """Whether the Beam environment is there (`make beam-venv`)."""
    return python.is_file()


def _rfc3339(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).isoformat().replace("+00:00", "Z")


@dataclass
class Job:
    """One Dataflow job as the emulator keeps it."""

    id: str
    name: str
    project: str
    location: str
    template: str
    parameters: Mapping[str, str]
    environment: Mapping[str, Any]
    state: str = "JOB_STATE_QUEUED"
    created_at: float = field(default_factory=time.time)
    state_at: float = field(default_factory=time.time)
    started_at: float | None = None
    ended_at: float | None = None
    requested_state: str | None = None
    messages: list[dict[str, Any]] = field(default_factory=list)
    process: subprocess.Popen[bytes] | None = None

    @property
    def live(self) -> bool:
        """Not ended yet."""
        return self.state in LIVE_STATES

    def to_json(self) -> dict[str, Any]:
        """The Job resource in the REST API's JSON (camelCase, as the client parses it)."""
        labels = self.environment.get("additionalUserLabels") or {}
        return {"id": self.id, "projectId": self.project, "name": self.name,
                "type": "JOB_TYPE_BATCH", "location": self.location,
                "currentState": self.state, "currentStateTime": _rfc3339(self.state_at),
                "createTime": _rfc3339(self.created_at),
                "requestedState": self.requested_state or "JOB_STATE_UNKNOWN",
                "labels": dict(labels)}


class DataflowEmulator:
    """The emulator: a threaded HTTP server and one runner thread per job."""

    def __init__(self, project: str, *, workdir: Path, launcher_template: str,
                 host: str = "127.0.0.1", port: int = 0,
                 beam_python: Path = DEFAULT_BEAM_PYTHON, events_url: str | None = None,
                 iam: IamPolicy | None = None) -> None:
        self.project = project
        self.workdir = workdir
        self.launcher_template = launcher_template
        self.beam_python = beam_python
        self.events_url = events_url
        self.iam = iam
        self.metadata = _template_parameters(LAUNCHER_METADATA)
        self.calls: dict[str, int] = {}  # method -> requests served (tests count them)
        self.jobs: dict[str, Job] = {}
        self._lock = threading.Lock()
        self._seq = 0
        emulator = self

        class Handler(_Handler):
            service = emulator

        self.server = ThreadingHTTPServer((host, port), Handler)
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def address(self) -> str:
        """host:port it listens on."""
        host, port = self.server.server_address[:2]
        return f"{host!s}:{port}"

    def start(self) -> DataflowEmulator:
        """Serve in a background thread."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving and kill running pipelines."""
        self.server.shutdown()
        with self._lock:
            for job in self.jobs.values():
                if job.process is not None and job.process.poll() is None:
                    job.process.kill()

    # --- the API --------------------------------------------------------------------------

    def launch(self, project: str, location: str, body: Mapping[str, Any],
               principal: str | None = None) -> dict[str, Any]:
        """flexTemplates:launch: a new QUEUED job, run in the background. Refused as Dataflow
        refuses it: a bad name, labels or template parameters (INVALID_ARGUMENT), a worker
        account the caller may not act as (PERMISSION_DENIED, when IAM is checked)."""
        param = body.get("launchParameter") or {}
        name = str(param.get("jobName") or "")
        if not re.fullmatch(r"[a-z]([-a-z0-9]{0,1022}[a-z0-9])?", name):
            raise Invalid("INVALID_ARGUMENT", f"Invalid job name {name!r}: must match "
                                              "[a-z]([-a-z0-9]{0,1022}[a-z0-9])?")
        template = str(param.get("containerSpecGcsPath") or "")
        if not template.startswith("gs://"):
            raise Invalid("INVALID_ARGUMENT", "containerSpecGcsPath must be a gs:// path")
        environment = param.get("environment") or {}
        _check_labels(environment.get("additionalUserLabels") or {})
        if template == self.launcher_template:  # its metadata is ours; another's is unknown
            _check_parameters(param.get("parameters") or {}, self.metadata)
        if self.iam is not None and principal is not None:
            account = str(environment.get("serviceAccountEmail") or "") or \
                DEFAULT_WORKER_ACCOUNT.format(project=project)
            if not self.iam.may_act_as(principal, account):
                raise Invalid("PERMISSION_DENIED", ACT_AS_DENIED.format(account=account))
        with self._lock:
            if any(j.name == name and j.live and j.location == location
                   for j in self.jobs.values()):
                raise Invalid("ALREADY_EXISTS", f"There is already an active job named {name}. "
                                                "If you want to submit a second job, try again "
                                                "by setting a different name.")
            self._seq += 1
            job_id = time.strftime("%Y-%m-%d_%H_%M_%S", time.gmtime()) + f"-{self._seq}"
            job = Job(job_id, name, project, location, template,
                      {str(k): str(v) for k, v in (param.get("parameters") or {}).items()},
                      dict(param.get("environment") or {}))
            self.jobs[job_id] = job
        self._publish(job)
        threading.Thread(target=self._run, args=(job,), daemon=True).start()
        return {"job": job.to_json()}

    def list(self, location: str, query: Mapping[str, list[str]]) -> dict[str, Any]:
        """jobs.list: the region's jobs, newest first; filter ACTIVE/TERMINATED/ALL, name."""
        wanted = _enum((query.get("filter") or ["ALL"])[0], LIST_FILTERS)
        name = (query.get("name") or [""])[0]
        with self._lock:
            jobs = [j for j in self.jobs.values() if j.location == location
                    and (not name or j.name == name)
                    and (wanted not in ("ACTIVE",) or j.live)
                    and (wanted != "TERMINATED" or not j.live)]
            jobs.sort(key=lambda j: j.created_at, reverse=True)
            return {"jobs": [j.to_json() for j in jobs]}

    def job(self, location: str, job_id: str) -> Job:
        """The job of that id in the region; Invalid(NOT_FOUND)."""
        with self._lock:
            job = self.jobs.get(job_id)
        if job is None or job.location != location:
            raise Invalid("NOT_FOUND", f"(job {job_id}) Requested entity was not found.")
        return job

    def update(self, location: str, job_id: str, body: Mapping[str, Any]) -> dict[str, Any]:
        """jobs.update: only requestedState JOB_STATE_CANCELLED is supported."""
        job = self.job(location, job_id)
        requested = _enum(body.get("requestedState"), JOB_STATES)
        if requested != "JOB_STATE_CANCELLED":
            raise Invalid("INVALID_ARGUMENT", f"the local Dataflow supports requestedState "
                                              f"JOB_STATE_CANCELLED only, not {requested!r}")
        with self._lock:
            if not job.live:
                raise Invalid("FAILED_PRECONDITION", f"Workflow modification failed. Causes: "
                                                     f"(job {job_id}) is in state "
                                                     f"{job.state} and cannot be cancelled.")
            job.requested_state = requested
            process = job.process
        self._set(job, "JOB_STATE_CANCELLING")
        if process is not None and process.poll() is None:
            process.terminate()
        return job.to_json()

    def messages(self, location: str, job_id: str) -> dict[str, Any]:
        """jobs.messages.list (every importance: the client filters nothing we send)."""
        return {"jobMessages": list(self.job(location, job_id).messages)}

    def metrics(self, location: str, job_id: str) -> dict[str, Any]:
        """jobs.getMetrics: the billed resources of one worker of the job's machine type."""
        job = self.job(location, job_id)
        start = job.started_at
        seconds = 0.0 if start is None else (job.ended_at or time.time()) - start
        shape = shape_of(str(job.environment.get("machineType") or "n1-standard-1"))
        vcpus, gib = (shape.vcpus, shape.gib) if shape is not None else (1, 3.75)
        now = _rfc3339(time.time())

        def metric(name: str, value: float) -> dict[str, Any]:
            return {"name": {"origin": "dataflow/v1b3", "name": name}, "kind": "Sum",
                    "scalar": round(value, 3), "updateTime": now}

        return {"metricTime": now, "metrics": [
            metric("TotalVcpuTime", vcpus * seconds),
            metric("TotalMemoryUsage", gib * 1024 * seconds),
            metric("TotalPdUsage", DEFAULT_DISK_GB * seconds)]}

    # --- running a job --------------------------------------------------------------------

    def _set(self, job: Job, state: str) -> None:
        with self._lock:
            if job.state == state or not job.live:
                return
            job.state, job.state_at = state, time.time()
            if state == "JOB_STATE_RUNNING":
                job.started_at = job.state_at
            if state not in LIVE_STATES:
                job.ended_at = job.state_at
        log.info("job %s (%s): %s", job.id, job.name, state)
        self._publish(job)

    def _fail(self, job: Job, text: str) -> None:
        job.messages.append({"id": str(len(job.messages) + 1), "time": _rfc3339(time.time()),
                             "messageText": text, "messageImportance": "JOB_MESSAGE_ERROR"})
        self._set(job, "JOB_STATE_FAILED")

    def _run(self, job: Job) -> None:
        try:
            self._set(job, "JOB_STATE_PENDING")
            if job.template != self.launcher_template:
                self._fail(job, f"The local Dataflow runs spotorch's launcher template "
                                f"({self.launcher_template}) only, not {job.template}: it has "
                                "no container runtime for other flex templates.")
                return
            where = self.workdir / "jobs" / job.id
            site = self._install(job)
            local_out = where / "output"
            # With an inputs manifest the module reads the pinned generations itself (GCS reads
            # reach fake-gcs-server), so the live folder is not staged: it is not the input.
            local_in: Path | None = None
            if not job.parameters.get("inputs"):
                local_in = where / "input"
                _download_folder(job.parameters["input"], local_in)
            local_out.mkdir(parents=True, exist_ok=True)
            if job.requested_state:
                self._set(job, "JOB_STATE_CANCELLED")
                return
            self._set(job, "JOB_STATE_RUNNING")
            code, stderr = self._beam(job, site, local_in, local_out, where)
            if job.requested_state:
                self._set(job, "JOB_STATE_CANCELLED")
            elif code != 0:
                tail = "\n".join(stderr.splitlines()[-ERROR_LINES:])
                self._fail(job, f"Error message from worker: {tail}")
            else:
                _upload_folder(local_out, job.parameters["output"])
                self._set(job, "JOB_STATE_DONE")
        except Exception as exc:  # the service's own failure: an infrastructure error
            log.exception("job %s failed in the emulator", job.id)
            self._fail(job, f"Workflow failed. Causes: internal error: {exc}")

    def _install(self, job: Job) -> Path | None:
        from spotorch.local import _vertex_packages as packages

        uris = [u for u in job.parameters.get("packages", "").split(",") if u]
        if not uris:
            return None
        archives = [(uri.rsplit("/", 1)[1], packages.download(uri)) for uri in uris]
        return packages.install(self.workdir / "packages", archives)

    def _beam(self, job: Job, site: Path | None, local_in: Path | None, local_out: Path,
              where: Path) -> tuple[int, str]:
        options = [f"--{k}={v}" for k, v in sorted(job.parameters.items())
                   if k not in ("module", "packages", "input", "output")]
        # Through the launcher a deployment's template runs (deploy/dataflow-launcher): its
        # arguments reach the module as on Dataflow. The code is installed above already (the
        # Vertex emulator's installer: nothing downloaded), so it gets no --packages.
        argv = [str(self.beam_python), str(LAUNCHER), f"--module={job.parameters['module']}",
                "--input", f"{local_in}/" if local_in is not None else job.parameters["input"],
                "--output", f"{local_out}/", *options,
                "--runner", "DirectRunner", "--job_name", job.name]
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("SPOTORCH_", "PYTHON"))}
        if site is not None:
            env["PYTHONPATH"] = str(site)
        err = where / "worker-stderr.log"
        with err.open("wb") as fh:
            process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=fh,
                                       stdin=subprocess.DEVNULL, cwd=where, env=env)
            with self._lock:
                job.process = process
            code = process.wait()
        return code, err.read_text(errors="replace")

    def _publish(self, job: Job) -> None:
        """POST statusChanged to the events URL as Eventarc would (retried a few times)."""
        if not self.events_url:
            return
        body = json.dumps({"payload": job.to_json()}).encode()
        headers = {"Content-Type": "application/json", "ce-specversion": "1.0",
                   "ce-id": str(uuid.uuid4()), "ce-type": STATUS_CHANGED_TYPE,
                   "ce-source": f"//{SERVICE_HOST}/projects/{job.project}/locations/"
                                f"{job.location}",
                   "ce-subject": f"jobs/{job.id}", "ce-time": _rfc3339(time.time()),
                   # google-cloudevents' extension attribute `job`, "the name of the Job
                   # triggering the event": which name (id or job name) is not said; spotorch
                   # reads neither (the data's payload names the job).
                   "ce-job": job.id}
        threading.Thread(target=post, args=(self.events_url, body, headers),
                         kwargs={"timeout_s": 30.0}, daemon=True).start()


def _storage() -> Any:
    from google.cloud import storage

    return storage.Client.create_anonymous_client() if os.environ.get(
        "STORAGE_EMULATOR_HOST") else storage.Client()


def _split(uri: str) -> tuple[str, str]:
    bucket, _, prefix = uri.removeprefix("gs://").partition("/")
    return bucket, prefix if not prefix or prefix.endswith("/") else prefix + "/"


def _download_folder(uri: str, to: Path) -> None:
    """Every object under the gs:// folder, to a local directory (names below the folder)."""
    bucket, prefix = _split(uri)
    to.mkdir(parents=True, exist_ok=True)
    for blob in _storage().list_blobs(bucket, prefix=prefix):
        target = to / blob.name[len(prefix):]
        target.parent.mkdir(parents=True, exist_ok=True)
        blob.download_to_filename(str(target))


def _upload_folder(local: Path, uri: str) -> None:
    """Every file under the local directory, to the gs:// folder."""
    bucket, prefix = _split(uri)
    client = _storage()
    for path in sorted(p for p in local.rglob("*") if p.is_file()):
        client.bucket(bucket).blob(prefix + path.relative_to(local).as_posix()) \
            .upload_from_filename(str(path))


class _Handler(BaseHTTPRequestHandler):
    service: DataflowEmulator

    def log_message(self, format: str, *args: Any) -> None:
        log.debug(format, *args)

    def _reply(self, status: int, body: Mapping[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _body(self) -> dict[str, Any]:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b"{}"
        doc = json.loads(raw or b"{}")
        if not isinstance(doc, dict):
            raise Invalid("INVALID_ARGUMENT", "the request body is not a JSON object")
        return doc

    def _route(self, verb: str) -> None:
        try:
            url = urlparse(self.path)
            match = _PATH.match(url.path)
            if match is None:
                raise Invalid("NOT_FOUND", f"no such method: {verb} {url.path}")
            project, location, rest = match["project"], match["location"], match["rest"]
            method, job_id = _method(verb, rest)
            resource = f"projects/{project}/locations/{location}" + (
                f"/jobs/{job_id}" if job_id else "")
            principal = self._authorize(method, resource)
            with self.service._lock:
                self.service.calls[method] = self.service.calls.get(method, 0) + 1
            if project != self.service.project:
                raise Invalid("NOT_FOUND", f"project {project} is not this emulator's "
                                           f"({self.service.project})")
            svc = self.service
            if method == "launch":
                self._reply(200, svc.launch(project, location, self._body(), principal))
            elif method == "list":
                self._reply(200, svc.list(location, parse_qs(url.query)))
            elif method == "get":
                self._reply(200, svc.job(location, job_id).to_json())
            elif method == "update":
                self._reply(200, svc.update(location, job_id, self._body()))
            elif method == "messages":
                self._reply(200, svc.messages(location, job_id))
            else:
                self._reply(200, svc.metrics(location, job_id))
        except Invalid as exc:
            status = _HTTP.get(exc.code, 400)
            self._reply(status, {"error": {"code": status, "message": str(exc),
                                           "status": exc.code}})
        except Exception as exc:  # a bug of ours: say so, as a 500
            log.exception("request failed")
            self._reply(500, {"error": {"code": 500, "message": str(exc), "status": "INTERNAL"}})

    def _authorize(self, method: str, resource: str) -> str | None:
        """The caller, who holds the method's permission (None when IAM is not checked)."""
        iam = self.service.iam
        if iam is None:
            return None
        principal = iam.principal([("authorization", self.headers.get("Authorization") or "")]
                                  if self.headers.get("Authorization") else [])
        permission = METHOD_PERMISSIONS[method]
        if not iam.allows(principal, permission):
            raise Invalid("PERMISSION_DENIED",
                          f"Permission '{permission}' denied on resource "
                          f"'//{SERVICE_HOST}/{resource}' (or it may not exist).")
        return principal

    def do_GET(self) -> None:
        self._route("GET")

    def do_POST(self) -> None:
        self._route("POST")

    def do_PUT(self) -> None:
        self._route("PUT")


def _template_parameters(path: Path) -> dict[str, bool]:
    """A flex template's metadata.json parameters: name -> required."""
    doc = json.loads(path.read_text())
    return {str(p["name"]): not p.get("isOptional", False) for p in doc.get("parameters", ())}


def _check_parameters(given: Mapping[str, Any], declared: Mapping[str, bool]) -> None:
    """Invalid(INVALID_ARGUMENT) naming each undeclared or missing parameter, as Dataflow
    checks a flex template launch against the template's metadata."""
    details = [f"{name}: {PARAMETER_UNKNOWN}" for name in sorted(given) if name not in declared]
    details += [f"{name}: {PARAMETER_MISSING}" for name, required in sorted(declared.items())
                if required and not str(given.get(name) or "")]
    if details:
        raise Invalid("INVALID_ARGUMENT", PARAMETERS_INVALID.format(details="\n".join(details)))


def _check_labels(labels: Mapping[str, Any]) -> None:
    """Invalid(INVALID_ARGUMENT) naming the first label Google's rules refuse."""
    if len(labels) > MAX_LABELS:
        raise Invalid("INVALID_ARGUMENT", LABELS_TOO_MANY.format(limit=MAX_LABELS,
                                                                 count=len(labels)))
    for key, value in sorted(labels.items()):
        if not _LABEL_KEY.fullmatch(str(key)):
            raise Invalid("INVALID_ARGUMENT", LABEL_INVALID.format(key=key, why=LABEL_KEY_RULE))
        if not _LABEL_VALUE.fullmatch(str(value)):
            raise Invalid("INVALID_ARGUMENT", LABEL_INVALID.format(
                key=key, why=LABEL_VALUE_RULE.format(value=str(value))))


def _enum(value: Any, names: tuple[str, ...]) -> str:
    """An enum field as its name, whether the client sent the name or the number."""
    text = str(value if value is not None else "")
    if text.isdigit():
        number = int(text)
        return names[number] if number < len(names) else text
    return text


def _method(verb: str, rest: str) -> tuple[str, str]:
    """(method, job id) of a request below projects/P/locations/L/."""
    if verb == "POST" and rest == "flexTemplates:launch":
        return "launch", ""
    if verb == "GET" and rest == "jobs":
        return "list", ""
    parts = rest.split("/")
    if len(parts) >= 2 and parts[0] == "jobs":
        job_id = parts[1]
        if len(parts) == 2 and verb == "GET":
            return "get", job_id
        if len(parts) == 2 and verb == "PUT":
            return "update", job_id
        if len(parts) == 3 and verb == "GET" and parts[2] in ("messages", "metrics"):
            return parts[2], job_id
    raise Invalid("NOT_FOUND", f"no such method: {verb} {rest}")


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", type=int, default=0, show_default=True)
@click.option("--project", required=True)
@click.option("--workdir", type=click.Path(path_type=Path), required=True)
@click.option("--launcher-template", required=True,
              help="gs:// spec of spotorch's launcher flex template (SPOTORCH_DATAFLOW_LAUNCHER).")
@click.option("--beam-python", type=click.Path(path_type=Path), default=DEFAULT_BEAM_PYTHON,
              show_default=True, help="Python of the Beam environment (make beam-venv).")
@click.option("--events-url", default=None, help="Where statusChanged events are POSTed.")
@click.option("--iam", "iam_file", type=click.Path(path_type=Path), default=None,
              help="tokens and grants (the local stack's file): check every call.")
def main(host: str, port: int, project: str, workdir: Path, launcher_template: str,
         beam_python: Path, events_url: str | None, iam_file: Path | None) -> None:
    """Run the local Dataflow until interrupted."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    if not beam_available(beam_python):
        raise click.ClickException(f"no Beam environment at {beam_python}: make beam-venv")
    emulator = DataflowEmulator(project, workdir=workdir, launcher_template=launcher_template,
                                host=host, port=port, beam_python=beam_python,
                                events_url=events_url,
                                iam=IamPolicy.load(iam_file) if iam_file else None).start()
    print(READY_LINE.format(address=emulator.address), flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        emulator.stop()
        shutil.rmtree(workdir / "jobs", ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
