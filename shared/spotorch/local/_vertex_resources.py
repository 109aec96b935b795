"""Vertex AI's resource quotas in the emulator: GPUs by type, TPUs and CPUs per project and region.

A job in use (any state but ended) holds its pools' replicas x accelerators and replicas x vCPUs
against its region's metrics; CreateCustomJob over a limit is refused RESOURCE_EXHAUSTED with
Vertex's message (FACTS.md, "Vertex AI quotas"):

    The following quota metrics exceed quota limits:
    aiplatform.googleapis.com/custom_model_training_nvidia_l4_gpus

(one line in the message).
Spot (and FLEX_START) jobs count against the `custom_model_training_preemptible_*` metrics, others
against `custom_model_training_*` (the metric names are seen in public code and user reports, not
in Google's quota page we have; FLEX_START's is our guess). Limits are configured per region
(`"*"`: every region); a metric without a limit is unlimited, as is everything by default (a new
Google project often starts with 0 GPUs per region: configure that to try it).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

PREFIX = "aiplatform.googleapis.com/"
MESSAGE = "The following quota metrics exceed quota limits: "
ANY_REGION = "*"

# AcceleratorType -> the name in its quota metric, where dropping TESLA_ and lowercasing is wrong.
ACCELERATOR_NAMES: Mapping[str, str] = {
    "NVIDIA_H100_80GB": "nvidia_h100",
    "NVIDIA_H100_MEGA_80GB": "nvidia_h100_mega",
    "NVIDIA_H200_141GB": "nvidia_h200",
}
# vCPUs of machine types whose name does not end in them (Compute Engine's machine pages).
_VCPUS_PER_GPU = {"a2-highgpu": 12, "a2-ultragpu": 12, "a2-megagpu": 6, "a3-highgpu": 26}
_FIXED_VCPUS = {"a3-megagpu-8g": 208, "a3-ultragpu-8g": 224, "a4-highgpu-8g": 224}
_SIZED = re.compile(r"^[a-z0-9]+-(?:standard|highmem|highcpu|megamem|ultramem)-(\d+)$")
_PER_GPU = re.compile(r"^([a-z0-9]+-[a-z]+)-(\d+)g$")


def vcpus(machine_type: str) -> int:
    """vCPUs of a machine type (0 when unknown, e.g. TPU hosts: not counted)."""
    if machine_type in _FIXED_VCPUS:
        return _FIXED_VCPUS[machine_type]
    sized = _SIZED.match(machine_type)
    if sized:
        return int(sized.group(1))
    per_gpu = _PER_GPU.match(machine_type)
    if per_gpu and per_gpu.group(1) in _VCPUS_PER_GPU:
        return _VCPUS_PER_GPU[per_gpu.group(1)] * int(per_gpu.group(2))
    return 0


def accelerator_metric(accelerator: str, preemptible: bool) -> str:
    """The quota metric (without the service prefix) of an AcceleratorType name."""
    kind = "preemptible_" if preemptible else ""
    if accelerator.startswith("TPU_"):
        return f"custom_model_training_{kind}{accelerator.lower()}"
    name = ACCELERATOR_NAMES.get(accelerator, accelerator.replace("TESLA_", "").lower())
    return f"custom_model_training_{kind}{name}_gpus"


def cpu_metric(preemptible: bool) -> str:
    return f"custom_model_training_{'preemptible_' if preemptible else ''}cpus"


def usage(job_spec: Any, preemptible: bool) -> dict[str, int]:
    """What one job holds: metric -> amount (vCPUs, accelerators)."""
    held: dict[str, int] = {}
    for pool in job_spec.worker_pool_specs:
        replicas = int(pool.replica_count)
        if not replicas:
            continue
        machine = pool.machine_spec
        cpus = vcpus(str(machine.machine_type)) * replicas
        if cpus:
            held[cpu_metric(preemptible)] = held.get(cpu_metric(preemptible), 0) + cpus
        accelerator = machine.accelerator_type.name if machine.accelerator_type else ""
        if accelerator and accelerator != "ACCELERATOR_TYPE_UNSPECIFIED" \
                and machine.accelerator_count:
            metric = accelerator_metric(accelerator, preemptible)
            held[metric] = held.get(metric, 0) + int(machine.accelerator_count) * replicas
    return held


@dataclass(frozen=True)
class ResourceQuotas:
    """region ("*": every region) -> metric -> limit; what is not listed is unlimited."""

    limits: Mapping[str, Mapping[str, int]] = field(default_factory=dict)

    @classmethod
    def parse(cls, data: Mapping[str, Any]) -> ResourceQuotas:
        """From {"us-central1": {"custom_model_training_nvidia_l4_gpus": 0}, "*": {...}}."""
        out: dict[str, dict[str, int]] = {}
        for region, metrics in data.items():
            if not isinstance(metrics, Mapping):
                raise ValueError(f"resource quotas: {region!r} must map metrics to limits")
            for metric, limit in metrics.items():
                if not isinstance(limit, int) or isinstance(limit, bool) or limit < 0:
                    raise ValueError(f"resource quotas: {region}/{metric} must be a count >= 0")
                out.setdefault(str(region), {})[str(metric).removeprefix(PREFIX)] = limit
        return cls(out)

    @classmethod
    def load(cls, source: str | Path | Mapping[str, Any]) -> ResourceQuotas:
        """From a mapping, a JSON text or a JSON file."""
        if isinstance(source, Mapping):
            return cls.parse(source)
        text = str(source)
        return cls.parse(json.loads(text if text.lstrip().startswith("{")
                                    else Path(text).read_text()))

    def limit(self, region: str, metric: str) -> int | None:
        own = self.limits.get(region, {})
        if metric in own:
            return own[metric]
        return self.limits.get(ANY_REGION, {}).get(metric)

    def exceeded(self, region: str, wanted: Mapping[str, int],
                 in_use: Iterable[Mapping[str, int]]) -> list[str]:
        """The metrics a new job's `wanted` would take past their limit in `region`."""
        used: dict[str, int] = {}
        for held in in_use:
            for metric, amount in held.items():
                used[metric] = used.get(metric, 0) + amount
        return [metric for metric, amount in wanted.items()
                if (limit := self.limit(region, metric)) is not None
                and used.get(metric, 0) + amount > limit]

    def refusal(self, metrics: Iterable[str]) -> str:
        """Vertex's message for these metrics."""
        return MESSAGE + ", ".join(PREFIX + m for m in metrics)
