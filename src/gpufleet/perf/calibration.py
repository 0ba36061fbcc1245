"""The few fitted constants of the step-time model.

Constants are physical — efficiencies as fractions of a roofline, overheads in seconds,
a front-end's streaming rate in tokens per second — and few, so the model carries over to
models and GPUs it was not fitted on. Each has bounds that say what is physically
plausible (`BOUNDS`); a fit that presses a constant against a bound is compensating for
something the model lacks, and a test says none does. They live in `data/calibration.yaml`;
`python -m gpufleet.validation.fit [CSV]` refits them on a measured-serving CSV.

What the engines document (memory fractions, token budgets, CUDA-graph sizes, mixed or
separate prefill, admission rules) is not fitted: it is in `gpufleet.plan.engines`.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib import resources
from types import MappingProxyType
from typing import Any, Final

import yaml


@dataclass(frozen=True)
class BackendCalibration:
    """What differs between serving engines running the same kernels.

    step_overhead_s: CPU + launch time per iteration (scheduler, sampler, graph replay).
    seq_overhead_s: the part of it each running sequence adds (input preparation,
        sampling, detokenizing and streaming its token).
    eager_layer_overhead_s: kernel launches per layer when an iteration is not replayed
        from a CUDA graph (prefill iterations, decode batches above the captured sizes).
    moe_layer_overhead_s: the fixed work of one MoE layer in every iteration, whatever
        the batch: routing (top-k), sorting and permuting tokens to their experts and
        back, the grouped GEMM's launch (a dozen small kernels).
    ttft_overhead_s: per-request time outside the GPU before the first token (HTTP,
        tokenization, the scheduler's hand-off).
    first_token_iterations: iterations of the engine's loop a request's first token costs
        beyond the running iteration's rest (half of one) and those overlap scheduling has
        already formed (`plan.closed_loop.SchedulerShape`), each as long as the decode
        iteration then: in a closed loop a prompt is sent on another request's last token,
        so it reaches the scheduler just after the next iteration started (a whole one to
        wait, not half: +0.5), and the front-end process that streams every running
        request's tokens between iterations delays the prompt's hand-off and its first
        token by its share of each iteration.
    moe_efficiency: the backend's fused-MoE kernels' achieved HBM bandwidth relative to its
        dense GEMMs when reading expert weights (decode: bandwidth-bound; grouped GEMMs on
        an H200 reach 55-75 % of a dense GEMV).
    moe_gemm_efficiency: the same kernels' achieved tensor FLOP/s relative to dense GEMMs
        when compute-bound (prefill: grouped GEMMs reach 85-95 % of dense on an H200).
    frontend_tokens_per_s: streamed output tokens per second the engine's API process
        delivers (detokenize + SSE in one Python process): a replica's throughput ceiling
        whatever the GPUs could do.
    benchmark_requests_per_client: the measured benchmarks ran a finite number of
        requests per client, all clients starting at once; the first wave's queueing
        weighs 1/this in their mean TTFT (a property of each backend's benchmark harness,
        used only when predicting measured rows, never by the planner).
    """

    step_overhead_s: float = 0.003
    seq_overhead_s: float = 10e-6
    eager_layer_overhead_s: float = 100e-6
    moe_layer_overhead_s: float = 30e-6
    ttft_overhead_s: float = 0.02
    first_token_iterations: float = 0.5
    moe_efficiency: float = 0.65
    moe_gemm_efficiency: float = 0.9
    frontend_tokens_per_s: float = 20000.0
    benchmark_requests_per_client: float = 8.0


@dataclass(frozen=True)
class Calibration:
    gemm_efficiency: float = 0.7  # achieved / peak dense tensor FLOP/s for GEMMs
    attention_efficiency: float = 0.5  # achieved / peak FLOP/s for attention kernels
    memory_efficiency: float = 0.85  # achieved / peak HBM bandwidth
    allreduce_latency_s: float = 10e-6  # one small all-reduce (custom one-shot kernels)
    # Zipf exponent of routed experts' popularity (0: uniform routing): how much fewer
    # distinct experts a batch reads than uniform routing says (perf.expert_routing).
    routing_skew: float = 0.0
    # GPU time of one kernel beyond its bytes / bandwidth, inside a CUDA graph: the ramp and
    # tail of a memory-bound kernel that fills the GPU only between its first and last
    # waves, plus the in-graph launch gap. Paid per GEMM / attention kernel of every layer
    # (`layer_costs.LayerClass.kernels`), so it grows with the layers a model has, not per
    # step: what sets a small model's step at high TP. Source: the H200 GEMV measurements
    # (h200_rates.csv, M=1) take 28 µs + bytes / 4.4 TB/s, the 28 µs including PyTorch's
    # launch from the CPU, which a CUDA graph removes.
    kernel_fixed_s: float = 5e-6
    # Per-request time before the first token that MoE models add to the engine's own
    # (`ttft_overhead_s`), in every engine: at <= 8 clients measured TTFT less the model's
    # GPU time is 13-27 ms on dense models and 110-360 ms on MoE ones, and it does not stall
    # the other requests' decodes (their TPOT does not move with the output length), so it
    # is no GPU iteration's time. One constant for all engines: what the rows show is a
    # property of MoE serving, and each held-out MoE model is then told it by the others.
    moe_first_token_s: float = 0.0
    backends: Mapping[str, BackendCalibration] = field(
        default_factory=lambda: MappingProxyType({"default": BackendCalibration()})
    )

    def backend(self, name: str | None) -> BackendCalibration:
        if name and name.lower() in self.backends:
            return self.backends[name.lower()]
        return self.backends.get("default", BackendCalibration())

    def first_token_overhead_s(self, backend: str | None, is_moe: bool) -> float:
        """Per-request time outside the GPU's iterations before the first token: the
        engine's own, plus MoE models' `moe_first_token_s`."""
        return self.backend(backend).ttft_overhead_s + (self.moe_first_token_s if is_moe else 0.0)


SCALAR_CONSTANTS: Final = ("gemm_efficiency", "attention_efficiency", "memory_efficiency",
                           "allreduce_latency_s", "routing_skew", "kernel_fixed_s",
                           "moe_first_token_s")  # fmt: skip
BACKEND_CONSTANTS: Final = tuple(f.name for f in dataclasses.fields(BackendCalibration))

# Device-to-device copies on an H200 reach 0.87 of HBM peak (kernel measurements, not the
# serving rows): the prior's memory efficiency, and what bounds the MoE read efficiency.
COPY_EFFICIENCY: Final = 0.87

# What is physically plausible for each constant (low, high). The kernel measurements on
# an H200 (PyTorch, no CUDA graphs) are the floor for efficiencies: dense GEMMs reach 0.70-
# 0.78 of peak, copies 0.87 of HBM, attention 0.1-0.65 depending on size.
BOUNDS: Final[Mapping[str, tuple[float, float]]] = MappingProxyType({
    "gemm_efficiency": (0.4, 0.95),
    "attention_efficiency": (0.2, 0.95),
    "memory_efficiency": (0.6, 0.95),
    "allreduce_latency_s": (2e-6, 40e-6),
    "routing_skew": (0.0, 1.5),
    "kernel_fixed_s": (0.5e-6, 30e-6),
    "moe_first_token_s": (0.0, 0.5),
    "step_overhead_s": (0.0, 0.02),
    "seq_overhead_s": (0.0, 200e-6),
    "eager_layer_overhead_s": (0.0, 300e-6),
    "moe_layer_overhead_s": (0.0, 300e-6),
    "ttft_overhead_s": (0.0, 0.4),
    # A few iterations at most: the phase of the closed loop (0.5), the output's and the
    # next prompt's passes through the front-end process.
    "first_token_iterations": (0.0, 8.0),
    # Relative to memory_efficiency: expert reads can at best reach HBM peak, so the
    # product stays <= 1 at the prior's copy efficiency (the roofline also caps it at peak).
    "moe_efficiency": (0.2, round(1.0 / COPY_EFFICIENCY, 3)),
    "moe_gemm_efficiency": (0.2, 1.0),
    "frontend_tokens_per_s": (2000.0, 200000.0),
    "benchmark_requests_per_client": (1.0, 50.0),
})  # fmt: skip


def calibration_from_dict(raw: Mapping[str, Any]) -> Calibration:
    known = set(BACKEND_CONSTANTS)
    backends = {
        str(name).lower(): BackendCalibration(
            **{k: float(v) for k, v in dict(values).items() if k in known}
        )
        for name, values in (raw.get("backends") or {}).items()
    }
    backends.setdefault("default", BackendCalibration())
    scalars = {k: float(raw[k]) for k in SCALAR_CONSTANTS if k in raw}
    return Calibration(**scalars, backends=MappingProxyType(backends))


def calibration_to_dict(cal: Calibration) -> dict[str, Any]:
    out: dict[str, Any] = {k: round(float(getattr(cal, k)), 9) for k in SCALAR_CONSTANTS}
    out["backends"] = {
        name: {k: round(float(v), 9) for k, v in dataclasses.asdict(b).items()}
        for name, b in sorted(cal.backends.items())
    }
    return out


@functools.cache
def default_calibration() -> Calibration:
    """The shipped constants (`data/calibration.yaml`)."""
    text = resources.files("gpufleet.perf").joinpath("data/calibration.yaml").read_text()
    return calibration_from_dict(yaml.safe_load(text) or {})


# The engines a prior is written for (each starts from the same engine-agnostic values:
# what differs between them is what a fit learns from their rows).
PRIOR_BACKENDS: Final = ("sglang", "trtllm", "vllm")


def _geometric_midpoint(key: str) -> float:
    lo, hi = BOUNDS[key]
    return float((lo * hi) ** 0.5)


def prior_calibration() -> Calibration:
    """A data-independent starting point for fits: no value here comes from the measured
    rows (nor from `data/calibration.yaml`, which was fitted on them), so a refit on a
    subset of rows started here cannot inherit what the left-out rows taught the shipped
    constants. Each value's source is beside it; where neither physics nor an engine's
    documentation gives one, the geometric midpoint of its `BOUNDS`."""
    backend = BackendCalibration(
        # Order of magnitude of one iteration's CPU work in a Python engine with CUDA
        # graphs (schedule, prepare inputs, sample, launch): a few milliseconds.
        step_overhead_s=3e-3,
        # Per running sequence: its input slots, sampling and streaming, ~10 µs.
        seq_overhead_s=10e-6,
        # ~10-20 kernel launches per layer at ~5-10 µs each without a CUDA graph.
        eager_layer_overhead_s=100e-6,
        # Routing top-k + permute / un-permute + the grouped GEMM's launch: a handful of
        # small kernels of a few µs each.
        moe_layer_overhead_s=30e-6,
        # HTTP request, tokenization and the scheduler's hand-off: tens of milliseconds.
        ttft_overhead_s=20e-3,
        # The closed loop's phase: a prompt sent on another's last token waits a whole
        # iteration for the one that just began, half more than a random arrival.
        first_token_iterations=0.5,
        # Grouped-GEMM expert reads on an H200 reach 55-75 % of a dense GEMV's bandwidth.
        moe_efficiency=0.65,
        # Compute-bound grouped GEMMs reach 85-95 % of dense GEMMs on an H200.
        moe_gemm_efficiency=0.9,
        # No documented figure: the geometric midpoint of its bounds (20k tokens / s).
        frontend_tokens_per_s=_geometric_midpoint("frontend_tokens_per_s"),
        # A property of each benchmark harness, undocumented: the bounds' midpoint (~7).
        benchmark_requests_per_client=_geometric_midpoint("benchmark_requests_per_client"),
    )
    backends = {"default": backend} | {name: backend for name in PRIOR_BACKENDS}
    return Calibration(
        # Dense GEMMs measured at 0.70-0.78 of peak on an H200 (kernel benchmarks, not rows).
        gemm_efficiency=0.74,
        # Attention kernels measured at 0.1-0.65 of peak depending on size: no single
        # figure, so the geometric midpoint of its bounds (~0.44).
        attention_efficiency=_geometric_midpoint("attention_efficiency"),
        # Device-to-device copies measured at 0.87 of HBM peak.
        memory_efficiency=COPY_EFFICIENCY,
        # One-shot custom all-reduce kernels over NVLink: ~10 µs for a small message.
        allreduce_latency_s=10e-6,
        # Uniform routing (the load balancing MoE training aims for): no skew assumed.
        routing_skew=0.0,
        # In-graph launch gap (~2 µs) plus a memory-bound kernel's ramp and tail (a few µs):
        # ~5 µs; the H200 measurements' 28 µs intercept includes the CPU launch (the bound).
        kernel_fixed_s=5e-6,
        # None assumed: no engine documents a MoE-specific first-token cost. (The bounds'
        # geometric midpoint, the convention where nothing says, needs a floor above 0:
        # with a 2 ms floor, ~32 ms, the leave-one-model-out refits came out TTFT 27.9 %
        # vs 24.7 % from 0, every architecture worse; leave-one-GPU-out 30.1 vs 37.7 %.)
        moe_first_token_s=0.0,
        backends=MappingProxyType(backends),
    )
