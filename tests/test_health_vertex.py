"""Out-of-memory classification of Vertex AI job errors (spotorch.adapters.gcp.vertex, training health)."""

from __future__ import annotations

import pytest

from classifying import classify
from spotorch.adapters.gcp.vertex import JobState
from spotorch.core.health import HealthPolicy
from spotorch.core.model import FailureClass
from spotorch.core.pipeline import RecoveryPolicy

EXITED = ("The replica workerpool0-0 exited with a non-zero status of {}. Termination reason: {}. "
          "To find out more about why your job exited please check the logs: "
          "https://console.cloud.google.com/logs/viewer?project=spotorch-prod&resource=ml_job")


@pytest.mark.parametrize(("code", "message", "failure", "exit_code"), [
    # the kernel's OOM killer: exit 137 with its signature
    (3, EXITED.format(137, "OOMKilled"), FailureClass.OUT_OF_MEMORY, 137),
    (3, EXITED.format(137, "Error") + " Out of memory: Killed process 4242 (python)",
     FailureClass.OUT_OF_MEMORY, 137),
    (3, EXITED.format(137, "Error") + " Memory cgroup out of memory", FailureClass.OUT_OF_MEMORY,
     137),
    # 137 alone is a SIGKILL (e.g. the grace-period kill after a preemption): not OOM, and not
    # the training code's doing either: infrastructure (issue 27)
    (3, EXITED.format(137, "Error"), FailureClass.INFRA, 137),
    # CUDA (its message speaks of "total capacity": must not read as a stockout)
    (3, EXITED.format(1, "Error") + " torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to "
     "allocate 2.00 GiB (GPU 0; 15.78 GiB total capacity; 13.1 GiB already allocated)",
     FailureClass.OUT_OF_MEMORY, 1),
    (13, "RuntimeError: CUDA error: out of memory", FailureClass.OUT_OF_MEMORY, None),
    # XLA / TPU
    (3, EXITED.format(1, "Error") + " jaxlib.xla_extension.XlaRuntimeError: RESOURCE_EXHAUSTED: "
     "Out of memory while trying to allocate 8589934592 bytes.", FailureClass.OUT_OF_MEMORY, 1),
    (8, "Ran out of memory in memory space hbm. Used 17.2G of 15.48G hbm.",
     FailureClass.OUT_OF_MEMORY, None),
    # host allocators
    (3, EXITED.format(1, "Error") + " MemoryError", FailureClass.OUT_OF_MEMORY, 1),
    (3, EXITED.format(1, "Error") + " OSError: [Errno 12] Cannot allocate memory",
     FailureClass.OUT_OF_MEMORY, 1),
    # not memory: a resource quota's RESOURCE_EXHAUSTED is a quota (spotorch.core.quotas), and
    # the trainer's preempted exit stays what it was
    (8, "The following quota metrics exceed quota limits: aiplatform.googleapis.com/"
        "custom_model_training_nvidia_a100_gpus", FailureClass.QUOTA, None),
    (3, EXITED.format(143, "Error") + " out of memory", FailureClass.PREEMPTED, 143),
])
def test_out_of_memory_errors_are_classified(code: int, message: str, failure: FailureClass,
                                             exit_code: int | None) -> None:
    assert classify(JobState.FAILED, code, message, started=True) == (
        classify(JobState.FAILED, code, message, started=True)[0], failure, exit_code)


def test_oom_patterns_come_from_the_health_policy() -> None:
    health = HealthPolicy(oom_patterns=(r"(?i)heap exhausted",))
    assert classify(5, 3, "java: heap exhausted", RecoveryPolicy(), health)[1] is FailureClass.OUT_OF_MEMORY
    assert classify(5, 3, "CUDA out of memory", RecoveryPolicy(), health)[1] is FailureClass.USER_ERROR
