"""The preprocess step's ports (issue 31): Dataflow jobs (StepLauncher) and cached outputs."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from spotorch.core.errors import SpotorchError
from spotorch.core.preprocess import JobView


class StepLaunchError(SpotorchError):
    """Dataflow refused to create the job; permanent when retrying cannot help (bad spec,
    permissions), else transient (the intent stays in the outbox and the tick retries it)."""

    def __init__(self, message: str, *, permanent: bool = False) -> None:
        super().__init__(message)
        self.permanent = permanent


@dataclass(frozen=True)
class StepLaunch:
    """One Dataflow job to create: a Beam module of the code package run by spotorch's
    launcher flex template, or the user's own flex template, with its parameters."""

    job_name: str  # deterministic (spotorch.core.preprocess.job_name): a second create fails
    region: str
    input_uri: str
    output_uri: str
    temp_uri: str  # Dataflow's temp_location (under the output's cache key folder)
    machine_type: str
    max_workers: int
    python_module: str | None = None
    package_uris: tuple[str, ...] = ()  # the code package's content-hashed URIs
    template_uri: str | None = None
    options: tuple[tuple[str, str], ...] = ()
    service_account: str | None = None
    labels: Mapping[str, str] = field(default_factory=dict)
    # The run's inputs manifest (its objects at their recorded generations): spotorch's launcher
    # hands it to the module as --inputs, which reads those generations, not the live folder.
    inputs_uri: str | None = None
    # The workers' VPC network and subnetwork (the step's, else the deployment's); None:
    # Dataflow's default (the project's `default` network).
    network: str | None = None
    subnetwork: str | None = None
    # A Spark step's batch (issue 42): the step's kind, Spark properties and runtime version
    # (machine_type, max_workers and temp_uri are Dataflow's; a batch ignores them).
    kind: str = "beam"
    properties: tuple[tuple[str, str], ...] = ()
    runtime_version: str | None = None


class StepLauncher(Protocol):
    """Creates, reads and cancels the preprocess step's Dataflow jobs, by their unique name."""

    def launch(self, request: StepLaunch) -> JobView:
        """Create the job, or (it exists: a repeated intent) return the live job of that name;
        StepLaunchError when Dataflow refuses it."""
        ...

    def get(self, job_name: str, region: str, job_id: str | None = None) -> JobView | None:
        """The job of that name in the region (by job_id when it is known, else the newest of
        the name) with its state; once it has ended also its error text and billed resources
        (GetJob, and ListJobMessages, GetJobMetrics for an ended job); None when Dataflow has
        none."""
        ...

    def cancel(self, job_name: str, region: str) -> None:
        """Ask Dataflow to cancel the live job of that name (nothing if it has ended)."""
        ...


class StepOutputs(Protocol):
    """The step's input identity and its outputs' completion markers (Cloud Storage)."""

    def content_digest(self, data_uri: str,
                       pinned: Sequence[tuple[str, int]] | None = None) -> str | None:
        """A digest of the objects under the folder (names below it, sizes and CRC32C): the
        same content in another folder gives the same digest; None when a checksum is missing
        or the folder is empty (the input is then identified by its snapshot, not cached
        across snapshots). With pinned (the run's recorded (object name, generation) pairs)
        the digest is of exactly those generations, whatever the folder holds now; None when
        one of them is gone (a bucket without object versioning)."""
        ...

    def read_manifest(self, uri: str) -> Mapping[str, Any] | None:
        """The inputs manifest at uri (JSON), None when there is none."""
        ...

    def read_marker(self, uri: str) -> Mapping[str, Any] | None:
        """The completion marker at uri, None when there is none."""
        ...

    def write_marker(self, uri: str, doc: Mapping[str, Any]) -> None:
        """Write the completion marker (JSON) at uri."""
        ...
