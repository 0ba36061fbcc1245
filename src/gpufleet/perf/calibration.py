"""The few fitted constants of the step-time model.

Constants are physical (efficiencies as fractions of a roofline, overheads in seconds) and
few, so the model carries over to models and GPUs it was not fitted on. They live in
`data/calibration.yaml`; `python -m gpufleet.validation.fit [CSV]` refits them on a
measured-serving CSV.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib import resources
from types import MappingProxyType
from typing import Any

import yaml


@dataclass(frozen=True)
class BackendCalibration:
    """What differs between serving engines running the same kernels.

    step_overhead_s: fixed CPU + launch time per iteration (scheduler, sampling, graphs).
    ttft_overhead_s: per-request time outside the GPU before the first token (HTTP,
        tokenization, detokenization, streaming).
    mixed_prefill: prefill chunks share iterations with decodes (vLLM, TRT-LLM) or run as
        iterations of their own (SGLang).
    max_num_batched_tokens: default token budget per iteration on 80+ GB GPUs.
    moe_efficiency: the backend's fused-MoE kernels' achieved HBM bandwidth relative to its
        dense GEMMs when reading expert weights (decode: bandwidth-bound).
    moe_gemm_efficiency: the same kernels' achieved tensor FLOP/s relative to its dense GEMMs
        when compute-bound (prefill: every expert sees many tokens). Grouped GEMMs over many
        small experts with block-scaled fp8 reach far less than a dense GEMM in some engines.
    benchmark_requests_per_client: the measured benchmarks ran a finite number of
        requests per client, all clients starting at once; the first wave's queueing
        weighs 1/this in their mean TTFT (a property of each backend's benchmark harness,
        used only when predicting measured rows, never by the planner).
    """

    step_overhead_s: float = 0.003
    ttft_overhead_s: float = 0.02
    moe_efficiency: float = 1.0
    moe_gemm_efficiency: float = 1.0
    benchmark_requests_per_client: float = 8.0
    mixed_prefill: bool = True
    max_num_batched_tokens: int = 8192


@dataclass(frozen=True)
class Calibration:
    gemm_efficiency: float = 0.7  # achieved / peak dense tensor FLOP/s for GEMMs
    attention_efficiency: float = 0.5  # achieved / peak FLOP/s for attention kernels
    memory_efficiency: float = 0.85  # achieved / peak HBM bandwidth
    allreduce_latency_s: float = 10e-6  # one small all-reduce (custom one-shot kernels)
    queue_scale: float = 1.0  # prefill queueing relative to an exponential-service queue
    backends: Mapping[str, BackendCalibration] = field(
        default_factory=lambda: MappingProxyType({"default": BackendCalibration()})
    )

    def backend(self, name: str | None) -> BackendCalibration:
        if name and name.lower() in self.backends:
            return self.backends[name.lower()]
        return self.backends.get("default", BackendCalibration())


SCALAR_CONSTANTS = ("gemm_efficiency", "attention_efficiency", "memory_efficiency",
            "allreduce_latency_s", "queue_scale")  # fmt: skip


def calibration_from_dict(raw: Mapping[str, Any]) -> Calibration:
    backends = {
        str(name).lower(): BackendCalibration(**dict(values))
        for name, values in (raw.get("backends") or {}).items()
    }
    backends.setdefault("default", BackendCalibration())
    scalars = {k: float(raw[k]) for k in SCALAR_CONSTANTS if k in raw}
    return Calibration(**scalars, backends=MappingProxyType(backends))


def calibration_to_dict(cal: Calibration) -> dict[str, Any]:
    out: dict[str, Any] = {k: round(float(getattr(cal, k)), 9) for k in SCALAR_CONSTANTS}
    out["backends"] = {
        name: {
            k: (round(v, 9) if isinstance(v, float) else v)
            for k, v in dataclasses.asdict(b).items()
        }
        for name, b in sorted(cal.backends.items())
    }
    return out


@functools.cache
def default_calibration() -> Calibration:
    """The shipped constants (`data/calibration.yaml`)."""
    text = resources.files("gpufleet.perf").joinpath("data/calibration.yaml").read_text()
    return calibration_from_dict(yaml.safe_load(text) or {})
