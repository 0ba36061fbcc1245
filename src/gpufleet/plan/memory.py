"""Memory per GPU the way each engine accounts for it, and what the KV cache holds.

Weights come from `plan.weights`; the engine's rule for the KV cache from `plan.engines`:
vLLM gives it gpu_memory_utilization × total − weights − the activation peak of its
profiling pass − the non-torch memory that pass allocates; SGLang gives it
mem_fraction_static × what was free before loading (total − CUDA context − the process
groups' all-reduce buffers) − what loading took (the weights); TensorRT-LLM a fraction (0.9)
of what is free after loading and profiling.

The activation peak is the larger of the model's forward pass over max_num_batched_tokens
tokens (residual stream, attention buffers, the widest MLP intermediate on one rank; for
MoE layers the fused-MoE caches of top-k copies of each token) and the sampler's fp32
logits for max_num_seqs sequences (with their softmax and top-k/top-p copies).

Two KV-token counts are kept, and they differ for sliding-window models:
* `kv_tokens_logged` is what vLLM prints as "GPU KV cache size: N tokens" (and
  `kv_concurrency_logged` its "Maximum concurrency"): for sliding-window models from its
  pool of layer groups (`plan.window_pool`), every layer charged as full attention before
  vLLM 0.21 and max_concurrency × max_model_len from 0.21;
* `kv_capacity_tokens` is the planner's effective capacity for sequences of
  max_model_len tokens, whose sliding layers hold only their window (vLLM frees the blocks
  that left it), so it is larger for Gemma-2, gpt-oss or Llama 4.
For hybrid models (Mamba / DeltaNet layers) under vLLM both come from its hybrid pool
(`plan.hybrid_pool`: pages padded to the state, layers in groups).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace

from gpufleet.plan.engines import GIB, MIB, EngineRules, engine_rules
from gpufleet.plan.hybrid_pool import HybridPool, hybrid_pool
from gpufleet.plan.layout import Layout
from gpufleet.plan.sglang_fraction import sglang_vlm_fraction
from gpufleet.plan.weights import (
    heaviest_stage,
    stage_layer_ids,
    stage_weight_bytes,
    total_weight_bytes,
    weight_bytes_per_gpu,
)
from gpufleet.plan.window_pool import WindowPool, window_pool
from gpufleet.specs.dtypes import BYTES_PER_PARAM
from gpufleet.specs.gpus import GpuSpec
from gpufleet.specs.models import KvBytesPerToken, ModelSpec

__all__ = [
    "GIB",
    "MemoryBreakdown",
    "activation_peak_bytes",
    "default_max_num_batched_tokens",
    "default_max_num_seqs",
    "heaviest_stage",
    "memory_breakdown",
    "sequences_that_fit",
    "sglang_free_before_load_bytes",
    "stage_layer_ids",
    "total_weight_bytes",
    "weight_bytes_per_gpu",
]  # the weight helpers are re-exported from plan.weights

ACTIVATION_BYTES = BYTES_PER_PARAM["bf16"]
# The sampler's profiling pass over max_num_seqs sequences holds about four fp32 copies of
# the full-vocabulary logits at once (logits, probabilities, the sorted copy top-k / top-p
# need, the gathered result): vLLM 0.17+ on an H100 peaks at 15-16 bytes per logit
# (Llama-3.1-8B 1.89 GiB, Qwen2.5-7B 2.21 GiB, Granite 0.75-0.85 GiB at 1024 sequences);
# before 0.17 it kept about ten (Qwen3-14B: 5.64 GiB on 0.15-0.16, 2.23 GiB on 0.17-0.18).
SAMPLER_BYTES_PER_LOGIT = 16.0
SAMPLER_BYTES_PER_LOGIT_BEFORE_0_17 = 39.0
# vLLM's fused-MoE kernels keep one workspace, sized by the largest batch they have run
# (intermediate caches of top-k copies of each token), allocated during the forward pass
# and still held while the sampler runs.

# vLLM's V0 engine (the default before 0.8, when V1 took over) schedules at most 256
# sequences unless told otherwise (V0 EngineArgs.max_num_seqs = 256, kept for it by
# vllm-project/vllm#16158), and its profiling pass samples that many: the 0.6.5 log of
# vllm-project/vllm#10511 (Llama-3-8B, H100) gives an activation peak of 1.26 GiB, which
# 256 sequences at the pre-0.17 sampler's bytes per logit meet (1.19 GiB; 1024 give 4.77).
V1_DEFAULT_SINCE = (0, 8)
V0_MAX_NUM_SEQS = 256

DEFAULT_GPU_MEMORY_UTILIZATION = 0.9
DEFAULT_BLOCK_TOKENS = 16

# Memory outside torch's allocator, in MiB. The CUDA context (~500 MiB with cuBLAS and
# kernel images) exists before vLLM takes its snapshot and is not counted against
# gpu_memory_utilization; SGLang and TRT-LLM see it as used. During profiling every rank
# allocates cuBLAS workspaces (~70 MiB), the rank that samples its sampler's workspace
# (~180 MiB), and a replica that all-reduces over NVLink NCCL's NVLink-SHARP buffers and
# the custom all-reduce's IPC buffers (~1.85 GiB on Hopper and newer; vLLM 0.19 measures
# 0.24-0.26 GiB at TP=1, 0.07 GiB on PP ranks without the sampler, 2.06-2.21 GiB at TP≥2).
CUDA_CONTEXT_MIB = 500
WORKSPACE_MIB = 70
SAMPLER_WORKSPACE_MIB = 180
ALLREDUCE_BUFFERS_MIB = 1900  # NCCL NVLS + custom all-reduce, NVLink on Hopper+
ALLREDUCE_BUFFERS_PCIE_MIB = 500
# vLLM >= 0.21 profiles the CUDA graphs it will capture and counts them against the budget
# (earlier versions capture them afterwards, outside it): ~0.5-1.9 GiB, 1.0 GiB on average
# across the models vLLM 0.19 logs an estimate for.
CUDA_GRAPH_MIB = 1024


def default_max_num_batched_tokens(gpu: GpuSpec) -> int:
    """vLLM V1's serving default: 8192 on GPUs with >= 70 GiB but the A100, else 2048."""
    return engine_rules("vllm", gpu).max_num_batched_tokens


def default_max_num_seqs(gpu: GpuSpec) -> int:
    """vLLM V1's serving default: 1024 on GPUs with >= 70 GiB but the A100, else 256."""
    return engine_rules("vllm", gpu).max_num_seqs


def forward_peak_bytes(model: ModelSpec, layout: Layout, num_tokens: int) -> float:
    """Peak transient memory of one forward pass over `num_tokens` tokens: the residual
    stream and attention buffers (a few h-wide copies) and the widest MLP intermediate on
    one rank (for MoE layers the fused-MoE caches of top-k copies of each token)."""
    h = model.hidden_size
    tp = layout.tp
    hidden = 6 * h
    dense = 3 * model.intermediate_size / tp if model.intermediate_size else 0.0
    moe = 0.0
    if model.moe is not None:
        width = model.moe.expert_intermediate_size / layout.moe_tp
        moe = model.moe.experts_per_token * (3 * width + h)
        moe += 3 * model.moe.shared_expert_intermediate_size / tp
    return num_tokens * (hidden + max(dense, moe)) * ACTIVATION_BYTES


def sampler_peak_bytes(
    model: ModelSpec,
    num_tokens: int,
    num_seqs: int,
    bytes_per_logit: float = SAMPLER_BYTES_PER_LOGIT,
) -> float:
    """The sampler's profiling pass: full-vocabulary logits on every TP rank."""
    return bytes_per_logit * min(num_seqs, num_tokens) * model.vocab_size


def moe_workspace_bytes(model: ModelSpec, layout: Layout, num_tokens: int) -> float:
    """The fused-MoE workspace a forward pass over `num_tokens` leaves allocated: the
    gate/up output (2 × intermediate per rank) and the down-projection input / output
    (hidden) of each of the top-k copies of each token."""
    if model.moe is None or model.quant.format(0, "experts").name == "mxfp4":
        return 0.0  # gpt-oss' MXFP4 kernels keep no such cache
    width = model.moe.expert_intermediate_size / layout.moe_tp
    return num_tokens * model.moe.experts_per_token * (2 * width + model.hidden_size) * 2.0


def activation_peak_bytes(
    model: ModelSpec,
    layout: Layout,
    num_tokens: int,
    num_seqs: int,
    *,
    samples: bool = True,
    sampler_bytes_per_logit: float = SAMPLER_BYTES_PER_LOGIT,
) -> float:
    """Peak transient memory of a profiling pass: the larger of the forward pass over
    `num_tokens` tokens and (on the stage that samples) the sampler over `num_seqs` beside
    the MoE workspace the forward pass left."""
    forward = forward_peak_bytes(model, layout, num_tokens)
    if not samples:
        return forward
    sampler = sampler_peak_bytes(model, num_tokens, num_seqs, sampler_bytes_per_logit)
    return max(forward, sampler + moe_workspace_bytes(model, layout, num_tokens))


def non_torch_bytes(layout: Layout, gpu: GpuSpec, *, samples: bool = True) -> float:
    """Workspaces, the sampler's on the sampling stage, and all-reduce buffers when the
    replica's attention group spans GPUs."""
    mib = WORKSPACE_MIB + (SAMPLER_WORKSPACE_MIB if samples else 0)
    return mib * MIB + allreduce_buffer_bytes(layout, gpu)


def allreduce_buffer_bytes(layout: Layout, gpu: GpuSpec) -> float:
    """NCCL's and the custom all-reduce's buffers of a replica whose attention group spans
    GPUs (NVLink SHARP on Hopper and newer); 0 at TP 1."""
    if layout.tp <= 1:
        return 0.0
    nvls = gpu.nvlink_gbps > 0 and gpu.supports("fp8")  # NVLink SHARP: Hopper and newer
    return (ALLREDUCE_BUFFERS_MIB if nvls else ALLREDUCE_BUFFERS_PCIE_MIB) * MIB


def sglang_free_before_load_bytes(layout: Layout, gpu: GpuSpec) -> float:
    """What SGLang measures as free right before it loads the weights ("Load weight begin.
    avail mem"), the `total_gpu_memory` its KV budget is a fraction of: the device less the
    CUDA context and what initialising the process groups allocated (all-reduce buffers)."""
    return gpu.memory_bytes - CUDA_CONTEXT_MIB * MIB - allreduce_buffer_bytes(layout, gpu)


@dataclass(frozen=True)
class MemoryBreakdown:
    """Memory of the most loaded GPU of one replica, in bytes unless named otherwise."""

    gpu_total_bytes: int
    usable_bytes: float  # the engine's budget: fraction × total (TRT-LLM: of what is free)
    weights_bytes: float
    activation_bytes: float
    framework_reserve_bytes: float  # non-torch memory (and the CUDA context where counted)
    kv_cache_bytes: float  # left for the KV cache (negative: does not fit)
    kv_bytes_per_token: float  # per GPU, all layers of the stage, short sequences
    kv_bytes_per_sequence: float  # one max_model_len sequence, sliding layers bounded
    kv_block_tokens: int
    kv_blocks: int
    kv_capacity_tokens: int  # effective: sequences of max_model_len, windows bounded
    kv_tokens_logged: int  # as vLLM logs "GPU KV cache size: N tokens" (by its version)
    max_concurrent_seqs: int  # sequences of max_model_len that fit in the KV cache
    max_model_len: int
    max_num_batched_tokens: int
    gpu_memory_utilization: float  # the engine's memory fraction (its own flag)
    engine: str = "vllm"
    attention_block_tokens: int = 0  # vLLM hybrids: the block it sets (0: not a hybrid)
    kv_concurrency_logged: float = 0.0  # vLLM's "Maximum concurrency for L tokens: X.XXx"

    @property
    def fits(self) -> bool:
        """Weights and activations fit and the KV cache holds one max_model_len sequence."""
        return self.max_concurrent_seqs >= 1

    @property
    def weights_fit(self) -> bool:
        return self.kv_cache_bytes > 0

    def to_dict(self) -> dict[str, float | int | bool | str]:
        out: dict[str, float | int | bool | str] = dict(asdict(self))
        out["fits"] = self.fits
        return out


def _kv_budget(
    rules: EngineRules,
    gpu: GpuSpec,
    layout: Layout,
    weights: float,
    activation: float,
    non_torch: float,
    graphs: float,
) -> tuple[float, float, float]:
    """(usable, reserve, KV bytes) of one GPU under the engine's rule."""
    total = float(gpu.memory_bytes)
    context = CUDA_CONTEXT_MIB * MIB
    if rules.name == "sglang":
        # ModelRunner.profile_max_num_token: rest = free after loading - total_gpu_memory x
        # (1 - mem_fraction_static), total_gpu_memory being what was free before loading
        # (after the CUDA context and the process groups): mem_fraction_static x that free
        # memory, less what loading took. Nothing runs a forward pass before it.
        free = sglang_free_before_load_bytes(layout, gpu)
        usable = free * rules.memory_fraction
        return usable, total - free, usable - weights
    if rules.name == "trtllm":
        free = total - weights - activation - context - non_torch
        usable = free * rules.memory_fraction + weights + activation + context + non_torch
        return usable, context + non_torch, free * rules.memory_fraction
    usable = total * rules.memory_fraction
    return usable, non_torch + graphs, usable - weights - activation - non_torch - graphs


def memory_breakdown(
    model: ModelSpec,
    gpu: GpuSpec,
    layout: Layout,
    max_model_len: int,
    *,
    max_num_batched_tokens: int | None = None,
    max_num_seqs: int | None = None,
    gpu_memory_utilization: float | None = None,
    block_tokens: int | None = None,
    engine: str = "vllm",
    engine_version: tuple[int, ...] | None = None,
    prefix_caching: bool | None = None,
) -> MemoryBreakdown:
    """Memory of the GPU whose KV cache holds the fewest tokens (the engines size every
    rank's cache alike, by the smallest) of `layout` served by `engine` (vllm, sglang,
    trtllm); `gpu_memory_utilization` overrides the engine's memory fraction.
    engine_version: vLLM's version when it matters (None: the current one): vLLM >= 0.21
    counts its CUDA graphs against the budget, earlier versions capture them outside it;
    before 0.17 its sampler's profiling pass held more copies of the logits; before 0.8
    (the V0 engine) it profiles 256 sequences by default.
    prefix_caching: whether vLLM runs with it (None: its default at that version), which
    sets how many state blocks a hybrid's request keeps (`hybrid_pool`)."""
    rules = engine_rules(
        engine, gpu, tp=layout.tp, pp=layout.pp, dp=layout.dp,
        memory_fraction=gpu_memory_utilization,
    )  # fmt: skip
    if rules.name == "sglang" and gpu_memory_utilization is None:  # its default, for a VLM
        rules = replace(rules, memory_fraction=sglang_vlm_fraction(rules.memory_fraction, model))
    batched = max_num_batched_tokens or rules.max_num_batched_tokens
    block = block_tokens or (DEFAULT_BLOCK_TOKENS if rules.name == "vllm" else rules.block_tokens)
    version = engine_version or (1,)
    v0 = rules.name == "vllm" and version < V1_DEFAULT_SINCE
    seqs = max_num_seqs or (V0_MAX_NUM_SEQS if v0 else rules.max_num_seqs)
    graphs = CUDA_GRAPH_MIB * MIB if (rules.name == "vllm" and version >= (0, 21)) else 0.0
    per_logit = (
        SAMPLER_BYTES_PER_LOGIT if version >= (0, 17) else SAMPLER_BYTES_PER_LOGIT_BEFORE_0_17
    )
    vllm_version = version if rules.name == "vllm" else None  # MXFP4 layouts (weights)
    best: tuple[float, int, float, float, float, float, float] | None = None
    for stage in range(layout.pp):
        last = stage == layout.pp - 1
        weights = stage_weight_bytes(model, layout, stage, gpu, vllm_version)
        activation = activation_peak_bytes(
            model, layout, batched, seqs, samples=last, sampler_bytes_per_logit=per_logit
        )
        usable, reserve, kv_bytes = _kv_budget(
            rules, gpu, layout, weights, activation,
            non_torch_bytes(layout, gpu, samples=last), graphs,
        )  # fmt: skip
        ids = stage_layer_ids(model.num_layers, layout.pp, stage)
        per_token = model.kv_breakdown(layout.kv_dtype_bytes, layout.tp, ids).total_bytes
        tokens = kv_bytes / per_token if per_token else float("inf")
        if best is None or tokens < best[0]:
            best = (tokens, stage, weights, activation, usable, reserve, kv_bytes)
    assert best is not None
    _, stage, weights, activation, usable, reserve, kv_bytes = best

    layer_ids = stage_layer_ids(model.num_layers, layout.pp, stage)
    kv: KvBytesPerToken = model.kv_breakdown(layout.kv_dtype_bytes, layout.tp, layer_ids)
    seq_bytes = _sequence_bytes(kv, max_model_len, block)
    avg_bytes_per_token = seq_bytes / max_model_len if max_model_len else kv.total_bytes
    block_bytes = block * avg_bytes_per_token
    blocks = max(0, math.floor(kv_bytes / block_bytes)) if block_bytes > 0 else 0
    logged = (math.floor(kv_bytes / (block * kv.total_bytes)) if kv.total_bytes else 0) * block
    concurrent = max(0, math.floor(kv_bytes / seq_bytes)) if seq_bytes > 0 else 0
    # vLLM's own pools (hybrid, else windowed); other engines' logs are not modelled
    vllm = rules.name == "vllm"
    pool = (
        _vllm_hybrid_pool(model, kv, layer_ids, kv_bytes, max_model_len, version, prefix_caching)
        if vllm
        else None
    )
    windows = None
    if vllm and pool is None and kv.sliding_bytes_by_window:
        windows = _vllm_window_pool(
            model, layout, layer_ids, kv_bytes, max_model_len, batched, version
        )
    logged_concurrency = (
        max(0, logged) // block / -(-max_model_len // block) if max_model_len else 0.0
    )
    if windows is not None:
        # vLLM's pool for sliding-window layers: groups of one page size (window_pool).
        logged = windows.logged_tokens
        logged_concurrency = windows.concurrency
    if pool is not None:
        # vLLM's hybrid pool: pages padded to the state, layers in groups (hybrid_pool).
        seq_bytes = pool.bytes_per_request
        concurrent = math.floor(pool.concurrency)
        blocks = int(pool.concurrency * max_model_len) // block
        logged = pool.logged_tokens
        logged_concurrency = pool.concurrency
    return MemoryBreakdown(
        gpu_total_bytes=gpu.memory_bytes,
        usable_bytes=usable,
        weights_bytes=weights,
        activation_bytes=activation if rules.name != "sglang" else 0.0,
        framework_reserve_bytes=reserve,
        kv_cache_bytes=kv_bytes,
        kv_bytes_per_token=kv.total_bytes,
        kv_bytes_per_sequence=seq_bytes,
        kv_block_tokens=block,
        kv_blocks=blocks,
        kv_capacity_tokens=blocks * block,
        kv_tokens_logged=max(0, logged),
        max_concurrent_seqs=concurrent,
        max_model_len=max_model_len,
        max_num_batched_tokens=batched,
        gpu_memory_utilization=rules.memory_fraction,
        engine=rules.name,
        attention_block_tokens=pool.block_tokens if pool else 0,
        kv_concurrency_logged=logged_concurrency,
    )


def _vllm_hybrid_pool(
    model: ModelSpec,
    kv: KvBytesPerToken,
    layer_ids: range,
    kv_bytes: float,
    max_model_len: int,
    version: tuple[int, ...],
    prefix_caching: bool | None,
) -> HybridPool | None:
    """vLLM's pool for a stage holding both attention and state layers, else None."""
    if not kv.state_bytes or kv.sliding_bytes_by_window:
        return None
    specs = [model.layers[i] for i in layer_ids if model.layers[i].mixer]
    attention = sum(1 for s in specs if not s.linear)
    state = sum(1 for s in specs if s.linear)
    if not attention or not state or not kv.full_bytes:
        return None
    return hybrid_pool(
        attention,
        state,
        kv.full_bytes / attention,
        kv.state_bytes / state,
        kv_bytes,
        max_model_len,
        version,
        prefix_caching,
    )


def _vllm_window_pool(
    model: ModelSpec,
    layout: Layout,
    layer_ids: range,
    kv_bytes: float,
    max_model_len: int,
    batched: int,
    version: tuple[int, ...],
) -> WindowPool | None:
    """vLLM's pool for a stage with sliding-window attention layers (window_pool)."""
    indexer = model.indexer_bytes_per_token()
    layers = [
        (
            model.layers[i].sliding_window,
            model.kv_elements_per_token_per_layer(layout.tp, i) * layout.kv_dtype_bytes + indexer,
        )
        for i in layer_ids
        if model.layers[i].mixer and not model.layers[i].linear
    ]
    chunked = any(model.layers[i].chunked for i in layer_ids)
    return window_pool(
        layers, kv_bytes, max_model_len, batched, version, chunked=chunked, pp=layout.pp
    )


def _sequence_bytes(kv: KvBytesPerToken, tokens: int, block_tokens: int) -> float:
    """KV bytes of one sequence in whole blocks: full layers hold every token, sliding
    layers their window plus one partially filled block."""
    padded = math.ceil(tokens / block_tokens) * block_tokens
    return kv.bytes_for_sequence(padded, block_tokens)


def sequences_that_fit(
    model: ModelSpec, layout: Layout, memory: MemoryBreakdown, tokens: float
) -> int:
    """How many sequences of `tokens` tokens (a request's KV footprint under the engine's
    admission rule) the KV cache of `memory` holds at once; 0 when it holds none."""
    if memory.kv_cache_bytes <= 0 or tokens <= 0:
        return 0
    stage = heaviest_stage(model, layout)
    layer_ids = stage_layer_ids(model.num_layers, layout.pp, stage)
    kv = model.kv_breakdown(layout.kv_dtype_bytes, layout.tp, layer_ids)
    seq_bytes = _sequence_bytes(kv, math.ceil(tokens), memory.kv_block_tokens)
    return math.floor(memory.kv_cache_bytes / seq_bytes) if seq_bytes > 0 else 0
