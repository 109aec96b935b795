"""The Vertex emulator's state machine: moves jobs through their states, runs and stops workers.

Called under the store's lock. Every state change is recorded as a Transition in `outbox`,
which the emulator turns into log entries after releasing the lock.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from spotorch.adapters.gcp.vertex import JobState
from spotorch.local._vertex_jobs import (
    CODE_CANCELLED,
    CODE_DEADLINE_EXCEEDED,
    CODE_INTERNAL,
    CODE_INVALID_ARGUMENT,
    CODE_RESOURCE_EXHAUSTED,
    TERMINAL,
    JobRecord,
    Stop,
    utc,
)
from spotorch.local._vertex_logs import Transition
from spotorch.local._vertex_schedule import SpotSchedule
from spotorch.local._vertex_workers import Replica, SpawnError, kill, restart, spawn

log = logging.getLogger("spotorch.local.vertex_emulator")

# What the Spot preemption of ONE replica's VM does to a multi-replica job. Google does not
# document it (docs/vertex-emulator.md), so it is a setting: the job fails with the STOCKOUT
# error as a whole-job preemption does (the default: it assumes the least of the training
# code), or Vertex restarts that replica in place, as it does a worker that exits non-zero.
FAIL_JOB, RESTART_REPLICA = "fail_job", "restart_replica"
REPLICA_PREEMPTION = (FAIL_JOB, RESTART_REPLICA)
# Vertex restarts a failed worker in place up to five times, then gives up on the job
# (Google's "Understanding the training service" page): a replica preempted once more
# than that fails the job as fail_job would.
MAX_IN_PLACE_RESTARTS = 5
PRIMARY = "workerpool0-0"  # the primary replica: its status is the job's (docs/vertex-emulator.md)


def resident_mb(leader: int) -> float:
    """Resident memory of a replica (MiB), from /proc: every process of its group but the
    leader (the shim that starts it, _vertex_shim); 0 when gone."""
    total = 0.0
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or proc.name == str(leader):
            continue
        try:
            group = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[2])
            if group != leader:
                continue
            fields = dict(line.split(":", 1) for line in (proc / "status").read_text().splitlines()
                          if ":" in line)
        except (OSError, ValueError, IndexError):
            continue
        total += int(fields.get("VmRSS", "0 kB").split()[0]) / 1024
    return total


class JobRunner:
    """Advances jobs (QUEUED > PENDING > RUNNING > ended), preempts Spot jobs, cancels."""

    def __init__(self, *, grace_s: float, queued_s: float, pending_s: float,
                 on_change: Callable[[JobRecord], None] = lambda record: None,
                 synthetic_run_s: float | None = None,
                 memory_limits_mb: Mapping[str, float] | None = None,
                 replica_preemption: str = FAIL_JOB) -> None:
        if replica_preemption not in REPLICA_PREEMPTION:
            raise ValueError(f"replica_preemption must be one of {REPLICA_PREEMPTION}")
        self.grace_s = grace_s
        self.replica_preemption = replica_preemption
        # Synthetic jobs (scale benchmarks): no worker process; a job runs this long, then
        # succeeds, unless Spot preempts it first. Everything else (states, lines, quotas) as usual.
        self.synthetic_run_s = synthetic_run_s
        # Memory per machine type (MiB): a replica whose resident set grows past its machine's
        # is killed as the kernel's OOM killer kills a container (SIGKILL, exit 137). Off by
        # default; the demo's oom story scales machines down to what this computer has.
        self.memory_limits_mb = dict(memory_limits_mb or {})
        self.oom_killed: dict[str, str] = {}  # job id -> the replica the OOM killer took
        self.queued_s = queued_s
        self.pending_s = pending_s
        self.on_change = on_change  # e.g. save the store
        self.outbox: list[Transition] = []

    def advance(self, job: JobRecord, now: float, spot_ok: bool, schedule: SpotSchedule) -> None:
        state = job.state
        if state in TERMINAL:
            return
        if job.stop is not None:
            self._progress_stop(job, now)
            return
        capacity = spot_ok or not job.spot
        if state is JobState.QUEUED:
            if now - job.since >= self.queued_s and capacity:
                self.set_state(job, JobState.PENDING, now)
        elif state is JobState.PENDING:
            if now - job.since >= self.pending_s and capacity:
                self._start_workers(job, now)
        elif state is JobState.RUNNING:
            self._watch(job, now, spot_ok, schedule)

    def _start_workers(self, job: JobRecord, now: float) -> None:
        if self.synthetic_run_s is not None:
            job.replicas = []
            job.started = now
            self.set_state(job, JobState.RUNNING, now)
            return
        try:
            job.replicas = spawn(job.proto.job_spec, job.job_id, job.log_dir, os.environ)
        except SpawnError as exc:
            message = (f"The replica {exc.replica} exited with a non-zero status of 127. "
                       f"Termination reason: ContainerCannotRun. {exc}")
            self.set_state(job, JobState.FAILED, now, CODE_INVALID_ARGUMENT, message)
            return
        job.started = now
        self.set_state(job, JobState.RUNNING, now)

    def _watch(self, job: JobRecord, now: float, spot_ok: bool, schedule: SpotSchedule) -> None:
        if self.synthetic_run_s is not None:
            self._watch_synthetic(job, now, spot_ok, schedule)
            return
        self._oom_kill(job)
        self._restart_in_place(job, now)
        codes = [(r, r.exit_code()) for r in job.replicas if r.name not in job.restarting]
        if all(c == 0 for _, c in codes) and not job.restarting:
            self.set_state(job, JobState.SUCCEEDED, now)
            return
        if dict((r.name, c) for r, c in codes).get(PRIMARY) == 0:
            # The primary "reports status for the job as a whole": once it exited 0 the job has
            # succeeded, whatever the others do after (a peer whose collective lost the primary
            # exits non-zero); the replicas still running are shut down (SIGTERM, then SIGKILL).
            self.begin_stop(job, now, JobState.SUCCEEDED, 0, "")
            return
        failed = next(((r, c) for r, c in codes if c not in (None, 0)), None)
        if failed is not None:
            replica, code = failed
            reason = "OOMKilled" if self.oom_killed.get(job.job_id) == replica.name else "Error"
            # Vertex shuts the whole job down when a replica fails for good.
            self.begin_stop(job, now, JobState.FAILED, CODE_INVALID_ARGUMENT,
                            f"The replica {replica.name} exited with a non-zero status of {code}."
                            f" Termination reason: {reason}. To find out more about why your job "
                            f"exited please check the logs: {replica.log_path.parent}")
            return
        if self._spot_lost(job, now, spot_ok, schedule):
            return
        if now - (job.started or now) >= job.timeout_s:
            self.begin_stop(job, now, JobState.FAILED, CODE_DEADLINE_EXCEEDED,
                            f"Job exceeded its scheduling timeout of {job.timeout_s:g} seconds "
                            "and was stopped.")

    def _oom_kill(self, job: JobRecord) -> None:
        if not self.memory_limits_mb or job.job_id in self.oom_killed:
            return
        pools = job.proto.job_spec.worker_pool_specs
        for replica in job.replicas:
            limit = self.memory_limits_mb.get(pools[replica.pool].machine_spec.machine_type)
            if limit is None or replica.exit_code() is not None:
                continue
            if resident_mb(replica.process.pid) > limit:
                log.info("%s: %s passed its machine's %s MiB: OOM-killed", job.proto.name,
                         replica.name, limit)
                self.oom_killed[job.job_id] = replica.name
                replica.signal(signal.SIGKILL)

    def _watch_synthetic(self, job: JobRecord, now: float, spot_ok: bool,
                         schedule: SpotSchedule) -> None:
        if self._spot_lost(job, now, spot_ok, schedule):
            return
        if self.synthetic_run_s is not None and now - (job.started or now) >= self.synthetic_run_s:
            self.set_state(job, JobState.SUCCEEDED, now)

    def _spot_lost(self, job: JobRecord, now: float, spot_ok: bool,
                   schedule: SpotSchedule) -> bool:
        """Preempt a running Spot job when capacity is gone or its schedule says so."""
        if not job.spot:
            return False
        running_s = now - (job.started or now)
        for i, rule in schedule.replica_rules(job.proto.labels):
            if i not in job.replica_rules_done and running_s >= rule.after_s:
                job.replica_rules_done.add(i)
                if self.preempt_replica(job, now, rule.replica or ""):
                    return job.stop is not None
        after = schedule.preempt_after(job.proto.labels)
        if spot_ok and (after is None or now - (job.started or now) < after):
            return False
        self.preempt(job, now)
        return True

    def preempt(self, job: JobRecord, now: float) -> bool:
        """What Compute Engine does to a Spot VM: SIGTERM, grace period, SIGKILL, job FAILED."""
        if job.state is not JobState.RUNNING or job.stop is not None:
            return False
        names = ", ".join(r.name for r in job.replicas) or "the job"
        self.begin_stop(job, now, JobState.FAILED, CODE_RESOURCE_EXHAUSTED,
                        f"STOCKOUT: the Spot VMs of {names} were preempted by Compute Engine in "
                        f"{job.region} (workers got SIGTERM and {self.grace_s:g}s before "
                        "SIGKILL).")
        return True

    def preempt_replica(self, job: JobRecord, now: float, name: str) -> bool:
        """Compute Engine takes one replica's Spot VM: SIGTERM to it alone, then what
        replica_preemption says (the job fails with STOCKOUT, or the replica restarts)."""
        replica = next((r for r in job.replicas if r.name == name), None)
        if job.state is not JobState.RUNNING or job.stop is not None or replica is None \
                or replica.exit_code() is not None or name in job.restarting:
            return False
        log.info("%s: the Spot VM of %s is preempted (%s)", job.proto.name, name,
                 self.replica_preemption)
        replica.signal(signal.SIGTERM)
        if self.replica_preemption == RESTART_REPLICA and replica.restarts < MAX_IN_PLACE_RESTARTS:
            job.restarting[name] = now + self.grace_s
            if job.proto.job_spec.scheduling.restart_job_on_worker_restart:
                # Scheduling.restart_job_on_worker_restart: every worker restarts with it.
                for other in job.replicas:
                    if other.name != name:
                        other.signal(signal.SIGTERM)
                        job.restarting[other.name] = now + self.grace_s
            return True
        spent = (f" after {replica.restarts} restarts in place"
                 if self.replica_preemption == RESTART_REPLICA else "")
        job.stop = Stop(JobState.FAILED, CODE_RESOURCE_EXHAUSTED,
                        f"STOCKOUT: the Spot VM of {name} was preempted by Compute Engine in "
                        f"{job.region}{spent} (it got SIGTERM and {self.grace_s:g}s before "
                        "SIGKILL; the other replicas were stopped).", now + self.grace_s,
                        only=name)
        return True

    def _restart_in_place(self, job: JobRecord, now: float) -> None:
        """Start again each preempted replica that is gone (or past its grace), on a new VM of
        the same name, as Vertex restarts a worker; the others keep running."""
        for name, kill_at in list(job.restarting.items()):
            at = next(i for i, r in enumerate(job.replicas) if r.name == name)
            old: Replica = job.replicas[at]
            if old.exit_code() is None and now < kill_at:
                continue
            del job.restarting[name]
            try:
                job.replicas[at] = restart(old)
            except SpawnError as exc:
                log.info("%s: %s could not restart: %s", job.proto.name, name, exc)
                continue
            log.info("%s: %s restarted in place (restart %d)", job.proto.name, name,
                     job.replicas[at].restarts)

    def cancel(self, job: JobRecord, now: float) -> None:
        """CANCELLING now (workers get SIGTERM); CANCELLED once they are gone."""
        if job.state is JobState.CANCELLING:
            return
        kill_at = job.stop.kill_at if job.stop else now + self.grace_s
        if job.stop is None:
            for replica in job.replicas:
                replica.signal(signal.SIGTERM)
        job.stop = Stop(JobState.CANCELLED, CODE_CANCELLED, "CANCELED", kill_at)
        self.set_state(job, JobState.CANCELLING, now)

    def begin_stop(self, job: JobRecord, now: float, end_state: JobState, code: int,
                   message: str) -> None:
        job.stop = Stop(end_state, code, message, now + self.grace_s)
        log.info("%s: stopping (%s): %s", job.proto.name, end_state.name, message)
        for replica in job.replicas:
            replica.signal(signal.SIGTERM)
        self._progress_stop(job, now)

    def _progress_stop(self, job: JobRecord, now: float) -> None:
        stop = job.stop
        assert stop is not None
        if stop.only is not None:  # one replica's VM went first; then the job shuts down
            gone = [r for r in job.replicas if r.name == stop.only]
            if any(r.exit_code() is None for r in gone) and now < stop.kill_at:
                return
            kill(gone)
            stop.only, stop.kill_at = None, now + self.grace_s
            for replica in job.replicas:
                replica.signal(signal.SIGTERM)
        if any(r.exit_code() is None for r in job.replicas) and now < stop.kill_at:
            return
        kill(job.replicas)
        job.stop = None
        self.set_state(job, stop.end_state, now, stop.error_code, stop.error_message)

    def recover(self, job: JobRecord, now: float) -> None:
        """A job found in the saved store at start: its workers died with the last emulator.

        Queued and pending jobs carry on (nothing ran yet); a running job's workers are lost,
        so it fails as a lost VM would; a job being cancelled is cancelled.
        """
        state = job.state
        if state is JobState.RUNNING:
            self.set_state(job, JobState.FAILED, now, CODE_INTERNAL,
                           "The workers of this job were lost: the Vertex AI emulator stopped "
                           "while it ran.")
        elif state is JobState.CANCELLING:
            self.set_state(job, JobState.CANCELLED, now, CODE_CANCELLED, "CANCELED")

    def set_state(self, job: JobRecord, state: JobState, now: float, error_code: int = 0,
                  error_message: str = "") -> None:
        previous = job.state
        wall = time.time()
        proto = job.proto
        proto.state = int(state)
        proto.update_time = utc(wall)
        if state is JobState.RUNNING:
            proto.start_time = utc(wall)
        if state in TERMINAL:
            proto.end_time = utc(wall)
            kill(job.replicas)  # whatever the workers left running goes with the VMs
        if error_code or error_message:
            proto.error = {"code": error_code, "message": error_message}
        job.since = now
        job.states.append(state)
        log.info("%s: %s -> %s %s", proto.name, previous.name, state.name, error_message)
        self.record(job, state, wall, error_message)
        self.on_change(job)

    def record(self, job: JobRecord, state: JobState, wall: float, error_message: str = "") -> None:
        self.outbox.append(Transition(job.project, job.job_id, state, wall, error_message,
                                      labels=job.labels))

    def drain(self) -> list[Transition]:
        out, self.outbox = self.outbox, []
        return out
