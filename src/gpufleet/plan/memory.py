"""Memory per GPU, the way vLLM accounts for it.

vLLM takes gpu_memory_utilization (0.9) of the GPU's total memory, loads the weights, runs
one profiling forward pass of max_num_batched_tokens tokens to find the activation peak,
keeps room for non-torch memory (CUDA context, NCCL buffers, CUDA graphs), and gives the
rest to the KV cache in 16-token blocks.

Weights: each GPU holds its pipeline stage's layers (the heaviest stage counts); inside a
stage, attention heads, MLP columns and the vocabulary (embedding, lm_head) are split over
TP ranks, KV-head projections are replicated when tp > kv heads, MLA's down-projections
(q_a, kv_a) are replicated, and routed experts are either TP-sharded (ep = 1) or split
whole over EP ranks. Quantization applies to the linear layers of the decoder (attention,
MLP, experts) with the scale overhead of the usual checkpoints (dtypes.SCALE_BYTES_PER_PARAM);
embeddings, lm_head, norms and routers stay bf16, as in AWQ/GPTQ/FP8 checkpoints. MXFP4
(fp4) quantizes only the MoE experts, as gpt-oss ships and vLLM loads it. Multi-token-
prediction layers (DeepSeek's MTP) are not loaded: vLLM loads them only for speculative
decoding.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from gpufleet.plan.layout import Layout
from gpufleet.specs.dtypes import BYTES_PER_PARAM, weight_bytes_per_param
from gpufleet.specs.gpus import GpuSpec
from gpufleet.specs.models import KvBytesPerToken, ModelSpec

GIB = 1 << 30
UNQUANTIZED_BYTES = BYTES_PER_PARAM["bf16"]
ACTIVATION_BYTES = BYTES_PER_PARAM["bf16"]
LOGITS_BYTES = BYTES_PER_PARAM["fp32"]  # the sampler works on fp32 logits

DEFAULT_GPU_MEMORY_UTILIZATION = 0.9
DEFAULT_BLOCK_TOKENS = 16

# Non-torch memory vLLM must leave free. CUDA context + allocator slack on every GPU;
# NCCL's communicator buffers when the replica spans GPUs; captured CUDA graphs (vLLM V1
# captures ~67 batch sizes; their private pools are typically 0.5–1.5 GiB).
CUDA_CONTEXT_BYTES = int(0.5 * GIB)
NCCL_BYTES = int(0.5 * GIB)
CUDA_GRAPH_BYTES = int(1.0 * GIB)


def default_max_num_batched_tokens(gpu: GpuSpec) -> int:
    """vLLM V1's serving default: 8192 on GPUs with >= 70 GiB, 2048 on smaller ones."""
    return 8192 if gpu.memory_bytes >= 70 * GIB else 2048


def default_max_num_seqs(gpu: GpuSpec) -> int:
    """vLLM V1's serving default: 1024 on GPUs with >= 70 GiB, 256 on smaller ones."""
    return 1024 if gpu.memory_bytes >= 70 * GIB else 256


def stage_layer_ids(num_layers: int, pp: int, stage: int) -> range:
    """vLLM's even split of decoder layers over PP stages (earlier stages take the
    remainder)."""
    base, extra = divmod(num_layers, pp)
    start = stage * base + min(stage, extra)
    return range(start, start + base + (1 if stage < extra else 0))


def _linear_bytes(dtype: str) -> float:
    return weight_bytes_per_param(dtype) if dtype != "bf16" else UNQUANTIZED_BYTES


def attention_bytes_per_gpu(model: ModelSpec, layout: Layout, layer: int) -> float:
    tp = layout.tp
    dtype = "bf16" if layout.weight_dtype == "fp4" else layout.weight_dtype
    per_param = _linear_bytes(dtype)
    h = model.hidden_size
    if model.attention_kind == "mla":
        n = model.num_attention_heads
        qk_head = model.qk_nope_head_dim + model.qk_rope_head_dim
        replicated = h * (model.kv_lora_rank + model.qk_rope_head_dim)
        if model.q_lora_rank:
            replicated += h * model.q_lora_rank
            sharded = model.q_lora_rank * n * qk_head
        else:
            sharded = h * n * qk_head
        sharded += model.kv_lora_rank * n * (model.qk_nope_head_dim + model.v_head_dim)
        sharded += n * model.v_head_dim * h
        return (replicated + sharded / tp) * per_param
    q_width = model.num_attention_heads * model.head_dim
    kv_width_per_rank = model.kv_heads_per_rank(tp) * model.head_dim
    params = 2 * h * q_width / tp + 2 * h * kv_width_per_rank
    return params * per_param


def mlp_bytes_per_gpu(model: ModelSpec, layout: Layout, layer: int) -> float:
    tp, ep = layout.tp, layout.ep
    linear = _linear_bytes(layout.weight_dtype if layout.weight_dtype != "fp4" else "bf16")
    if not (model.layers[layer].is_moe and model.moe is not None):
        return model.mlp_params(layer) / tp * linear
    expert = _linear_bytes(layout.weight_dtype)
    routed = model.moe.num_experts * model.expert_params()
    # EP: whole experts split over ep ranks. No EP: every expert TP-sharded.
    routed_per_gpu = routed / ep if ep > 1 else routed / tp
    shared_per_gpu = model.shared_expert_params() / tp
    return (
        routed_per_gpu * expert
        + shared_per_gpu * linear
        + model.router_params() * UNQUANTIZED_BYTES
    )


def stage_weight_bytes(model: ModelSpec, layout: Layout, stage: int) -> float:
    """Weight bytes on one GPU of pipeline stage `stage`."""
    total = 0.0
    for i in stage_layer_ids(model.num_layers, layout.pp, stage):
        total += attention_bytes_per_gpu(model, layout, i)
        total += mlp_bytes_per_gpu(model, layout, i)
        total += model.norm_params(i) * UNQUANTIZED_BYTES
    vocab_bytes = model.embedding_params() / layout.tp * UNQUANTIZED_BYTES
    if stage == 0:
        total += vocab_bytes
    if stage == layout.pp - 1:
        # Tied embeddings still need the matrix on the last stage when pp > 1.
        tied_elsewhere = model.tie_word_embeddings and layout.pp > 1
        head = model.lm_head_params() or (model.embedding_params() if tied_elsewhere else 0)
        total += head / layout.tp * UNQUANTIZED_BYTES + model.hidden_size * UNQUANTIZED_BYTES
    return total


def weight_bytes_per_gpu(model: ModelSpec, layout: Layout) -> float:
    """Weights on the most loaded GPU (the heaviest pipeline stage)."""
    return max(stage_weight_bytes(model, layout, s) for s in range(layout.pp))


def total_weight_bytes(model: ModelSpec, weight_dtype: str) -> float:
    """All weights of one copy of the model at `weight_dtype` (no TP replication)."""
    return weight_bytes_per_gpu(model, Layout(weight_dtype=weight_dtype))


def heaviest_stage(model: ModelSpec, layout: Layout) -> int:
    return max(range(layout.pp), key=lambda s: stage_weight_bytes(model, layout, s))


def activation_peak_bytes(
    model: ModelSpec, layout: Layout, num_tokens: int, num_seqs: int
) -> float:
    """Peak transient memory of vLLM's profiling pass over `num_tokens` tokens: the
    residual stream and attention buffers (a few h-wide copies), the widest MLP
    intermediate on one rank (gate_up output + activation), for MoE layers the fused-MoE
    caches (top-k copies of each token), and the sampler's fp32 logits for `num_seqs`."""
    h = model.hidden_size
    tp = layout.tp
    hidden = 6 * h
    dense = 3 * model.intermediate_size / tp if model.intermediate_size else 0.0
    moe = 0.0
    if model.moe is not None:
        shard = layout.ep if layout.ep > 1 else tp
        width = model.moe.expert_intermediate_size * (1 if layout.ep > 1 else 1 / shard)
        moe = model.moe.experts_per_token * (3 * width + h)
        moe += 3 * model.moe.shared_expert_intermediate_size / tp
    per_token = (hidden + max(dense, moe)) * ACTIVATION_BYTES
    logits = 2 * num_seqs * model.vocab_size * LOGITS_BYTES
    return num_tokens * per_token + logits


@dataclass(frozen=True)
class MemoryBreakdown:
    """Memory of the most loaded GPU of one replica, in bytes unless named otherwise."""

    gpu_total_bytes: int
    usable_bytes: float  # gpu_memory_utilization × total
    weights_bytes: float
    activation_bytes: float
    framework_reserve_bytes: float  # CUDA context + NCCL + CUDA graphs
    kv_cache_bytes: float  # left for the KV cache (negative: does not fit)
    kv_bytes_per_token: float  # per GPU, all layers of the stage, short sequences
    kv_bytes_per_sequence: float  # one max_model_len sequence, sliding layers bounded
    kv_block_tokens: int
    kv_blocks: int
    kv_capacity_tokens: int
    max_concurrent_seqs: int  # sequences of max_model_len that fit in the KV cache
    max_model_len: int
    max_num_batched_tokens: int
    gpu_memory_utilization: float

    @property
    def fits(self) -> bool:
        """Weights and activations fit and the KV cache holds one max_model_len sequence."""
        return self.max_concurrent_seqs >= 1

    @property
    def weights_fit(self) -> bool:
        return self.kv_cache_bytes > 0

    def to_dict(self) -> dict[str, float | int | bool]:
        out: dict[str, float | int | bool] = dict(asdict(self))
        out["fits"] = self.fits
        return out


def memory_breakdown(
    model: ModelSpec,
    gpu: GpuSpec,
    layout: Layout,
    max_model_len: int,
    *,
    max_num_batched_tokens: int | None = None,
    max_num_seqs: int | None = None,
    gpu_memory_utilization: float = DEFAULT_GPU_MEMORY_UTILIZATION,
    block_tokens: int = DEFAULT_BLOCK_TOKENS,
) -> MemoryBreakdown:
    batched = max_num_batched_tokens or default_max_num_batched_tokens(gpu)
    usable = gpu.memory_bytes * gpu_memory_utilization
    stage = heaviest_stage(model, layout)
    weights = stage_weight_bytes(model, layout, stage)
    seqs = max_num_seqs or default_max_num_seqs(gpu)
    activation = activation_peak_bytes(model, layout, batched, seqs)
    reserve = float(CUDA_CONTEXT_BYTES + CUDA_GRAPH_BYTES)
    if layout.num_gpus > 1:
        reserve += NCCL_BYTES
    kv_bytes = usable - weights - activation - reserve

    layer_ids = stage_layer_ids(model.num_layers, layout.pp, stage)
    kv: KvBytesPerToken = model.kv_breakdown(layout.kv_dtype_bytes, layout.tp, layer_ids)
    seq_bytes = _sequence_bytes(kv, max_model_len, block_tokens)
    avg_bytes_per_token = seq_bytes / max_model_len if max_model_len else kv.total_bytes
    block_bytes = block_tokens * avg_bytes_per_token
    blocks = max(0, math.floor(kv_bytes / block_bytes)) if block_bytes > 0 else 0
    concurrent = max(0, math.floor(kv_bytes / seq_bytes)) if seq_bytes > 0 else 0
    return MemoryBreakdown(
        gpu_total_bytes=gpu.memory_bytes,
        usable_bytes=usable,
        weights_bytes=weights,
        activation_bytes=activation,
        framework_reserve_bytes=reserve,
        kv_cache_bytes=kv_bytes,
        kv_bytes_per_token=kv.total_bytes,
        kv_bytes_per_sequence=seq_bytes,
        kv_block_tokens=block_tokens,
        kv_blocks=blocks,
        kv_capacity_tokens=blocks * block_tokens,
        max_concurrent_seqs=concurrent,
        max_model_len=max_model_len,
        max_num_batched_tokens=batched,
        gpu_memory_utilization=gpu_memory_utilization,
    )


def _sequence_bytes(kv: KvBytesPerToken, tokens: int, block_tokens: int) -> float:
    """KV bytes of one sequence in whole blocks: full layers hold every token, sliding
    layers their window plus one partially filled block."""
    padded = math.ceil(tokens / block_tokens) * block_tokens
    return kv.bytes_for_sequence(padded, block_tokens)


def sequences_that_fit(
    model: ModelSpec, layout: Layout, memory: MemoryBreakdown, tokens: int
) -> int:
    """How many sequences of `tokens` tokens the KV cache of `memory` holds at once."""
    if memory.kv_cache_bytes <= 0 or tokens <= 0:
        return 0
    stage = heaviest_stage(model, layout)
    layer_ids = stage_layer_ids(model.num_layers, layout.pp, stage)
    kv = model.kv_breakdown(layout.kv_dtype_bytes, layout.tp, layer_ids)
    seq_bytes = _sequence_bytes(kv, tokens, memory.kv_block_tokens)
    return math.floor(memory.kv_cache_bytes / seq_bytes) if seq_bytes > 0 else 0
