"""The planner's vocabulary: what a user asks for (`PlanRequest`), what the search weighs
(`Candidate` with its memory and performance), why it decided (`Decision`) and what it
answers (`Plan`). Plain data; the search lives in `ladder` and `search`."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from gpufleet.plan.layout import Layout
from gpufleet.plan.memory import MemoryBreakdown
from gpufleet.plan.render import DisaggCommands, LaunchCommands
from gpufleet.specs.gpus import GpuSpec
from gpufleet.specs.models import ModelSpec

# A KV cache is "useful" when it holds at least this many requests of input+output tokens
# at once: below that the GPU mostly re-reads weights for a handful of tokens.
MIN_USEFUL_CONCURRENCY = 16
MAX_NODES = 64  # how far the search looks for a fitting multi-node layout
DEFAULT_MAX_MODEL_LEN = 8192


@dataclass(frozen=True)
class PlanRequest:
    model: ModelSpec
    gpu: GpuSpec
    input_tokens: int = 1024
    output_tokens: int = 256
    rps: float = 1.0
    ttft_slo_s: float = 1.0
    tpot_slo_s: float = 0.05
    gpus_per_node: int | None = None  # None: the GPU's usual node size
    quant: str = "auto"  # auto | bf16 | fp8 | int8 | int4
    kv_dtype: str = "auto"  # auto | bf16 | fp8
    max_model_len: int | None = None
    max_gpus: int | None = None
    gpu_price_per_hour_usd: float | None = None
    gpu_memory_utilization: float | None = None  # None: the engine's own default
    engine: str = "vllm"  # whose memory rule, scheduler and overheads the plan uses
    disaggregation: str = "auto"  # auto: plan prefill / decode pools beside; off: don't

    @property
    def node_gpus(self) -> int:
        return self.gpus_per_node or self.gpu.gpus_per_node

    @property
    def tp_domain_gpus(self) -> int:
        """How far tensor parallelism may reach: one NVLink domain (a node; a whole GB200 /
        GB300 NVL72 rack), at most 8 — beyond that attention heads run out and all-reduces
        dominate, and DP-attention × EP takes over for MoE models."""
        if self.gpus_per_node is not None:
            return self.gpus_per_node
        return max(self.gpu.gpus_per_node, min(self.gpu.domain_gpus, 8))

    @property
    def price_per_gpu_hour_usd(self) -> float:
        if self.gpu_price_per_hour_usd is not None:
            return self.gpu_price_per_hour_usd
        return self.gpu.price_per_gpu_hour_usd

    @property
    def request_tokens(self) -> int:
        return self.input_tokens + self.output_tokens

    def resolved_max_model_len(self) -> int:
        if self.max_model_len is not None:
            return self.max_model_len
        wanted = max(DEFAULT_MAX_MODEL_LEN, self.request_tokens)
        return min(wanted, self.model.max_position_embeddings)


@dataclass(frozen=True)
class Decision:
    step: str  # precision | tp | pp | performance | ep | moe | replicas | disagg
    option: str
    kept: bool
    reason: str


@dataclass(frozen=True)
class LayoutPerformance:
    prefill_s: float  # one prompt alone
    ttft_s: float  # at the steady-state concurrency the traffic implies
    tpot_s: float
    steady_concurrency: int  # requests in flight per replica at --rps
    max_concurrency: int  # the most in flight per replica that still meets the SLOs
    max_requests_per_s: float  # per replica, within the SLOs
    max_output_tokens_per_s: float  # per replica, within the SLOs
    allreduce_share_of_decode: float  # of one decode step at max_concurrency
    slo_met: bool


@dataclass(frozen=True)
class Candidate:
    layout: Layout
    memory: MemoryBreakdown
    kv_concurrent_requests: int  # requests of input+output tokens the KV cache holds
    performance: LayoutPerformance | None = None
    replicas: int | None = None
    total_gpus: int | None = None
    cost_per_hour_usd: float | None = None
    cost_per_million_output_tokens_usd: float | None = None  # at --rps

    @property
    def nodes(self) -> int:
        return self.layout.pp  # a PP stage is one node of TP GPUs in this search

    @property
    def output_tokens_per_s_per_gpu(self) -> float:
        if self.performance is None or not self.performance.slo_met:
            return 0.0
        return self.performance.max_output_tokens_per_s / self.layout.num_gpus


@dataclass(frozen=True)
class Pool:
    """One pool of a disaggregated plan: replicas of one layout."""

    layout: Layout
    replicas: int
    requests_per_s_per_replica: float
    latency_s: float  # prefill: TTFT at the chosen load; decode: TPOT

    @property
    def gpus(self) -> int:
        return self.replicas * self.layout.num_gpus


@dataclass(frozen=True)
class DisaggPlan:
    """Prefill and decode pools for --rps (see `plan.disagg`)."""

    prefill: Pool
    decode: Pool
    kv_bytes_per_request: float
    kv_link_gbps: float
    kv_transfer_s: float
    ttft_s: float
    tpot_s: float
    total_gpus: int
    output_tokens_per_s_per_gpu: float
    aggregated_gpus: int | None
    aggregated_tokens_per_s_per_gpu: float
    wins: bool
    reason: str


@dataclass(frozen=True)
class Plan:
    request: PlanRequest
    chosen: Candidate
    candidates: tuple[Candidate, ...]
    decisions: tuple[Decision, ...]
    max_model_len: int
    launch: LaunchCommands
    warnings: tuple[str, ...] = field(default=())
    disaggregated: DisaggPlan | None = None  # prefill / decode pools, when any pairing works
    disagg_launch: DisaggCommands | None = None

    @property
    def recommended(self) -> str:
        """ "disaggregated" when its pools serve --rps on fewer GPUs (or aggregated serving
        misses the SLOs), else "aggregated"."""
        return "disaggregated" if self.disaggregated and self.disaggregated.wins else "aggregated"

    def to_dict(self) -> dict[str, Any]:
        req = self.request
        return {
            "model": req.model.name,
            "gpu": req.gpu.name,
            "gpus_per_node": req.node_gpus,
            "traffic": {
                "input_tokens": req.input_tokens,
                "output_tokens": req.output_tokens,
                "rps": req.rps,
                "ttft_slo_s": req.ttft_slo_s,
                "tpot_slo_s": req.tpot_slo_s,
            },
            "max_model_len": self.max_model_len,
            "price_per_gpu_hour_usd": req.price_per_gpu_hour_usd,
            "chosen": _candidate_dict(self.chosen),
            "candidates": [_candidate_dict(c) for c in self.candidates],
            "decisions": [asdict(d) for d in self.decisions],
            "launch": asdict(self.launch),
            "warnings": list(self.warnings),
            "recommended": self.recommended,
            "disaggregated": _disagg_dict(self.disaggregated, self.disagg_launch),
        }


def _disagg_dict(d: DisaggPlan | None, launch: DisaggCommands | None) -> dict[str, Any] | None:
    if d is None:
        return None
    pools = {
        name: {
            "layout": {**asdict(p.layout), "num_gpus": p.layout.num_gpus, "label": p.layout.label},
            "replicas": p.replicas,
            "requests_per_s_per_replica": p.requests_per_s_per_replica,
            "gpus": p.gpus,
        }
        for name, p in (("prefill", d.prefill), ("decode", d.decode))
    }
    return {
        **pools,
        "kv_bytes_per_request": d.kv_bytes_per_request,
        "kv_link_gbps": d.kv_link_gbps,
        "kv_transfer_s": d.kv_transfer_s,
        "ttft_s": d.ttft_s,
        "tpot_s": d.tpot_s,
        "total_gpus": d.total_gpus,
        "output_tokens_per_s_per_gpu": d.output_tokens_per_s_per_gpu,
        "aggregated_gpus": d.aggregated_gpus,
        "wins": d.wins,
        "reason": d.reason,
        "launch": asdict(launch) if launch else None,
    }


def _candidate_dict(c: Candidate) -> dict[str, Any]:
    return {
        "layout": {**asdict(c.layout), "num_gpus": c.layout.num_gpus, "label": c.layout.label},
        "memory": c.memory.to_dict(),
        "kv_concurrent_requests": c.kv_concurrent_requests,
        "performance": asdict(c.performance) if c.performance else None,
        "replicas": c.replicas,
        "total_gpus": c.total_gpus,
        "cost_per_hour_usd": c.cost_per_hour_usd,
        "cost_per_million_output_tokens_usd": c.cost_per_million_output_tokens_usd,
    }
