"""Probe measurements: step rate, its noise and peak memory (host RSS; accelerator where the
framework exposes it). Standard library only; a framework is asked only if already imported."""

from __future__ import annotations

import math
import re
import resource
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

# An exception whose text says memory ran out (PyTorch, JAX/XLA, TensorFlow, numpy, Python).
_OOM = re.compile(r"(?i)out of memory|\boom\b|cannot allocate memory|unable to allocate|"
                  r"resource_?exhausted.*(memory|hbm|alloc)")


def is_oom(exc: BaseException) -> bool:
    """Whether an exception means the step did not fit in memory."""
    return isinstance(exc, MemoryError) or bool(_OOM.search(f"{type(exc).__name__}: {exc}"))


def peak_host_rss_mb() -> float:
    """Peak resident set size of this process (Linux reports KiB, macOS bytes)."""
    peak = float(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
    return peak / (1024.0 * 1024.0) if sys.platform == "darwin" else peak / 1024.0


def _torch_peak() -> float | None:
    torch = sys.modules.get("torch")
    cuda = getattr(torch, "cuda", None)
    if cuda is None or not cuda.is_available():
        return None
    return sum(float(cuda.max_memory_allocated(i)) for i in range(cuda.device_count())) / 2**20


def _jax_peak() -> float | None:
    jax = sys.modules.get("jax")
    if jax is None:
        return None
    peaks = [float((d.memory_stats() or {}).get("peak_bytes_in_use", 0)) for d in jax.devices()
             if d.platform != "cpu" and hasattr(d, "memory_stats")]
    return sum(peaks) / 2**20 if peaks else None


# Frameworks whose accelerator memory the probe can read, in order; each returns MiB or None.
ACCELERATOR_PEAKS: tuple[Callable[[], float | None], ...] = (_torch_peak, _jax_peak)


def peak_accelerator_mb() -> float | None:
    """Peak accelerator memory from the first framework that is loaded and exposes it."""
    for peak in ACCELERATOR_PEAKS:
        try:
            found = peak()
        except Exception:  # a framework in a bad state must not break the report
            found = None
        if found is not None:
            return found
    return None


@dataclass
class StepTimer:
    """Step durations of a probe; the first step is warm-up (compilation, caches) and not timed."""

    samples_per_step: int | None = None
    durations: list[float] = field(default_factory=list)
    steps: int = 0

    def record(self, seconds: float) -> None:
        self.steps += 1
        if self.steps > 1:
            self.durations.append(seconds)

    def report(self, now: float, error: BaseException | None = None) -> Mapping[str, Any]:
        timed = sum(self.durations)
        rate = len(self.durations) / timed if timed > 0 else None
        cv = 0.0
        if len(self.durations) > 1 and timed > 0:
            mean = timed / len(self.durations)
            var = sum((d - mean) ** 2 for d in self.durations) / (len(self.durations) - 1)
            cv = math.sqrt(var) / mean
        return {
            "steps": self.steps,
            "steps_per_s": rate,
            "samples_per_s": rate * self.samples_per_step if rate and self.samples_per_step
            else None,
            "step_time_cv": cv,
            "peak_host_rss_mb": peak_host_rss_mb(),
            "peak_accelerator_mb": peak_accelerator_mb(),
            "oom": error is not None and is_oom(error),
            "error": None if error is None else f"{type(error).__name__}: {error}"[:500],
            "time": now,
        }
