"""A Spark preprocess step's Dataproc Serverless batch (issue 42): pure rules.

The batch's id (Dataproc's rule: 4-63 characters of [a-z0-9-], unique in the project and region
for as long as the batch exists, so a create retried under the same id is answered
ALREADY_EXISTS: "started before"), its states (google.cloud.dataproc.v1.Batch.State), how a
failed batch's state_message is classified, and Dataproc's DCU rule for the usage of a batch.

There is no Eventarc event for a batch's state (FACTS.md): the reconcile tick follows the live
batch with GetBatch by its recorded name (docs/preprocess.md says what latency that gives).
"""

from __future__ import annotations

import hashlib
import re

from spotorch.core.model import FailureClass

# google.cloud.dataproc.v1.Batch.State names, as GetBatch answers them.
BATCH_PENDING = "PENDING"
BATCH_RUNNING = "RUNNING"
BATCH_CANCELLING = "CANCELLING"
BATCH_CANCELLED = "CANCELLED"
BATCH_SUCCEEDED = "SUCCEEDED"
BATCH_FAILED = "FAILED"
BATCH_LIVE_STATES = frozenset({"STATE_UNSPECIFIED", BATCH_PENDING, BATCH_RUNNING,
                               BATCH_CANCELLING})
BATCH_TERMINAL_STATES = frozenset({BATCH_SUCCEEDED, BATCH_FAILED, BATCH_CANCELLED})

# Dataproc's batch id rule (CreateBatchRequest.batch_id).
BATCH_ID_RE = re.compile(r"^[a-z0-9-]{4,63}$")
_NOT_ID = re.compile(r"[^a-z0-9-]+")

# Dataproc's quotas per project and region (FACTS.md): over them RESOURCE_EXHAUSTED.
BATCH_OPERATIONS_PER_MINUTE = 200  # CreateBatch, DeleteBatch (and CancelBatch)
BATCH_READS_PER_MINUTE = 7500  # GetBatch, ListBatches


def batch_id(run_id: str, launch: int) -> str:
    """The batch id of a run's launch number `launch`: deterministic, so a repeated create is
    refused ALREADY_EXISTS and read back as the batch started before. At most 63 characters:
    a long run id is cut and a hash of the whole id keeps two long ids apart."""
    suffix = f"-pre{launch}"
    base = _NOT_ID.sub("-", run_id.lower()).strip("-") or "run"
    room = 63 - len("spotorch-") - len(suffix)
    if len(base) > room:
        digest = hashlib.sha256(run_id.encode()).hexdigest()[:8]
        base = f"{base[:room - 9].strip('-')}-{digest}"
    return f"spotorch-{base}{suffix}"


def valid_batch_id(value: str) -> bool:
    """Whether Dataproc accepts value as a batch id."""
    return bool(BATCH_ID_RE.match(value))


# A failed batch's state_message. Dataproc reports a driver's exception as the job's failure
# ("Job failed with message [... Traceback ... SomeException: ...]"); a refusal for quota or
# capacity, and its own failures, by name. Quota and capacity win over a traceback.
QUOTA_PATTERNS = (r"(?i)quota", r"RESOURCE_EXHAUSTED", r"(?i)insufficient '?\w+'? quota")
CAPACITY_PATTERNS = (r"(?i)does not have enough resources", r"(?i)ZONE_RESOURCE_POOL_EXHAUSTED",
                     r"(?i)stockout", r"(?i)insufficient capacity")
INFRA_PATTERNS = (r"(?i)internal (server )?error", r"(?i)\bunavailable\b",
                  r"(?i)failed to (start|create) (the )?(driver|executors?|cluster)",
                  r"(?i)lost (the )?(driver|executor)")
USER_PATTERNS = (r"Traceback \(most recent call last\)", r"(?i)job failed with message",
                 r"(?i)\b[A-Za-z_.]*(Error|Exception)\b: ")


def classify_batch(state: str, error: str) -> FailureClass:
    """Why a batch ended without SUCCEEDED. The Spark driver's exception is the user's code; a
    quota or capacity refusal, or Dataproc's own failure, is not (an unexplained failure is
    infrastructure, which retries within its budget)."""
    if state == BATCH_CANCELLED:
        return FailureClass.CANCELLED
    if any(re.search(p, error) for p in QUOTA_PATTERNS):
        return FailureClass.QUOTA
    if any(re.search(p, error) for p in CAPACITY_PATTERNS + INFRA_PATTERNS):
        return FailureClass.INFRA
    if any(re.search(p, error) for p in USER_PATTERNS):
        return FailureClass.USER_ERROR
    return FailureClass.INFRA


# Dataproc Serverless's DCU rule (cloud.google.com/dataproc-serverless/pricing, as last read;
# not re-checked from this machine): a vCPU counts 0.6 DCU; each GB of memory 0.1 DCU up to
# 8 GB per vCPU and 0.2 DCU beyond. Billed per second with a one-minute minimum.
DCU_PER_VCPU = 0.6
DCU_PER_GB = 0.1
DCU_PER_GB_OVER = 0.2
GB_PER_VCPU_AT_BASE_RATE = 8.0
MINIMUM_BILLED_S = 60.0


def dcus(vcpus: float, memory_gb: float) -> float:
    """The DCUs of a node (the driver, an executor) of vcpus and memory_gb (with overhead)."""
    base = min(memory_gb, GB_PER_VCPU_AT_BASE_RATE * vcpus)
    return vcpus * DCU_PER_VCPU + base * DCU_PER_GB + (memory_gb - base) * DCU_PER_GB_OVER


def milli_dcu_seconds(nodes: list[tuple[float, float]], seconds: float) -> int:
    """UsageMetrics.milli_dcu_seconds of nodes [(vcpus, memory GB)] that ran `seconds`."""
    billed = max(seconds, MINIMUM_BILLED_S)
    return round(1000 * sum(dcus(c, m) for c, m in nodes) * billed)
