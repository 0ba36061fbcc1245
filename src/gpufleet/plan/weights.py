"""Weight bytes on each GPU of a layout, module by module, in the checkpoint's formats.

Each GPU holds its pipeline stage's layers (the heaviest stage counts). Inside a stage:
attention heads, dense-MLP columns, shared experts and the vocabulary (embedding, lm_head)
are split over the attention group's tp ranks and repeated in every attention data-parallel
rank; KV-head projections are replicated when tp > KV heads; MLA's down-projections
(q_a, kv_a) are replicated; routed experts are spread over all tp × dp GPUs of the stage —
whole experts over ep ranks, each split over the remaining moe_tp (a rank holds
ceil(experts / ep) of them). Norms, routers and embeddings stay bf16. Each module's bytes
per weight come from the `QuantScheme` (the checkpoint's own per-module formats, or a
uniform re-quantization). A multimodal checkpoint's vision encoder loads on the first stage,
split over tp. Every GPU also holds the rotary cos/sin cache for all max_position_embeddings
positions (vLLM's RotaryEmbedding buffer). Multi-token-prediction layers (DeepSeek's MTP) are not loaded: vLLM loads
them only for speculative decoding.

MXFP4 experts are padded the way vLLM's kernels need them (mxfp4.py create_weights): each
expert's intermediate size per rank to a multiple of 128 and the hidden size to 256 on GPUs
without fp4 tensor cores (Marlin), both to 256 on Blackwell (FlashInfer); gpt-oss-120b on
one H100 loads 65.97 GiB with Marlin where the unpadded count is ~60.7 GiB. Given vLLM's
version, the backend that version runs on the GPU sets the bytes instead
(`plan.mxfp4_experts`: Triton on Hopper from 0.12, with its own layouts).
"""

from __future__ import annotations

import math

from gpufleet.plan.layout import Layout
from gpufleet.plan.mxfp4_experts import expert_bytes_per_rank
from gpufleet.specs.dtypes import BYTES_PER_PARAM
from gpufleet.specs.gpus import GpuSpec
from gpufleet.specs.models import ModelSpec
from gpufleet.specs.quant import QuantScheme

UNQUANTIZED_BYTES = BYTES_PER_PARAM["bf16"]


def scheme_of(model: ModelSpec, layout: Layout) -> QuantScheme:
    return model.weight_scheme(layout.weight_dtype)


def attention_bytes_per_gpu(
    model: ModelSpec, layout: Layout, layer: int, scheme: QuantScheme | None = None
) -> float:
    per_param = (scheme or scheme_of(model, layout)).format(layer, "attn").bytes_per_param
    tp = layout.tp
    h = model.hidden_size
    spec = model.layers[layer]
    if not spec.mixer:
        return 0.0  # an MLP-only block (Nemotron-H)
    if spec.linear and model.recurrent_mixer is not None:
        # Gated DeltaNet / Mamba-2: heads, projections and conv split over TP ranks.
        return model.attention_params(layer) / tp * per_param
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
        replicated += model.indexer_params()  # replicated on every rank, as vLLM loads it
        return (replicated + sharded / tp) * per_param
    n = model.num_attention_heads
    kv_heads, k_dim, v_dim = model.layer_attention_shape(layer)
    kv_width_per_rank = max(1, kv_heads // tp) * (k_dim + (0 if spec.kv_shared else v_dim))
    gate = 2 if model.attn_output_gate else 1  # q_proj also yields the output gate
    params = (gate * n * k_dim + n * v_dim) * h / tp + h * kv_width_per_rank
    return params * per_param


def experts_per_gpu(model: ModelSpec, layout: Layout) -> float:
    """Routed experts one GPU holds (fractions: an expert split over moe_tp GPUs)."""
    if model.moe is None:
        return 0.0
    return math.ceil(model.moe.num_experts / layout.ep) / layout.moe_tp


def _round_up(x: float, multiple: int) -> float:
    return math.ceil(x / multiple) * multiple


def expert_params_per_rank(
    model: ModelSpec, layout: Layout, fmt_name: str, gpu: GpuSpec | None
) -> float:
    """One routed expert's parameters on one of its moe_tp ranks, padded for MXFP4 on
    `gpu` (no GPU: unpadded)."""
    assert model.moe is not None
    if fmt_name != "mxfp4" or gpu is None:
        return model.expert_params() / layout.moe_tp
    fp4_gpu = gpu.supports("fp4")
    inter = _round_up(model.moe.expert_intermediate_size / layout.moe_tp, 256 if fp4_gpu else 128)
    hidden = _round_up(model.hidden_size, 256)
    bias = (2 * inter + hidden) if model.moe.expert_bias else 0.0
    return 3 * inter * hidden + bias


def mlp_bytes_per_gpu(
    model: ModelSpec,
    layout: Layout,
    layer: int,
    scheme: QuantScheme | None = None,
    gpu: GpuSpec | None = None,
    vllm_version: tuple[int, ...] | None = None,
) -> float:
    sch = scheme or scheme_of(model, layout)
    if not (model.layers[layer].is_moe and model.moe is not None):
        return model.mlp_params(layer) / layout.tp * sch.format(layer, "mlp").bytes_per_param
    fmt = sch.format(layer, "experts")
    per_rank = math.ceil(model.moe.num_experts / layout.ep)
    if fmt.name == "mxfp4" and gpu is not None and vllm_version is not None:
        # vLLM's MXFP4 backends by GPU and version (plan.mxfp4_experts), in bytes
        inter = model.moe.expert_intermediate_size / layout.moe_tp
        held = expert_bytes_per_rank(
            model.hidden_size, inter, model.moe.expert_bias, gpu, vllm_version
        )
        routed_bytes = per_rank * held
    else:
        routed_bytes = per_rank * expert_params_per_rank(model, layout, fmt.name, gpu)
        routed_bytes *= fmt.bytes_per_param
    shared = model.shared_expert_params() / layout.tp
    return (
        routed_bytes
        + shared * sch.format(layer, "shared").bytes_per_param
        + model.router_params() * UNQUANTIZED_BYTES
    )


def stage_layer_ids(num_layers: int, pp: int, stage: int) -> range:
    """vLLM's even split of decoder layers over PP stages (earlier stages take the
    remainder)."""
    base, extra = divmod(num_layers, pp)
    start = stage * base + min(stage, extra)
    return range(start, start + base + (1 if stage < extra else 0))


def stage_weight_bytes(
    model: ModelSpec,
    layout: Layout,
    stage: int,
    gpu: GpuSpec | None = None,
    vllm_version: tuple[int, ...] | None = None,
) -> float:
    """Weight bytes on one GPU of pipeline stage `stage` (`gpu`: for kernel padding;
    `vllm_version`: MXFP4 experts as that vLLM's backend holds them, else padded for
    Marlin / FlashInfer without the backend's layouts)."""
    scheme = scheme_of(model, layout)
    total = 0.0
    for i in stage_layer_ids(model.num_layers, layout.pp, stage):
        total += attention_bytes_per_gpu(model, layout, i, scheme)
        total += mlp_bytes_per_gpu(model, layout, i, scheme, gpu, vllm_version)
        total += model.norm_params(i) * UNQUANTIZED_BYTES
    total += model.rope_cache_elements() * UNQUANTIZED_BYTES  # every GPU, every stage
    if stage == 0:
        total += model.embedding_params() / layout.tp * UNQUANTIZED_BYTES
        total += model.vision_params / layout.tp * UNQUANTIZED_BYTES
    if stage == layout.pp - 1:
        # Tied embeddings still need the matrix on the last stage when pp > 1.
        tied_elsewhere = model.tie_word_embeddings and layout.pp > 1
        head = model.lm_head_params() or (model.embedding_params() if tied_elsewhere else 0)
        head_bytes = scheme.format(0, "lm_head").bytes_per_param
        total += head / layout.tp * head_bytes + model.hidden_size * UNQUANTIZED_BYTES
    return total


def weight_bytes_per_gpu(model: ModelSpec, layout: Layout, gpu: GpuSpec | None = None) -> float:
    """Weights on the most loaded GPU (the heaviest pipeline stage)."""
    return max(stage_weight_bytes(model, layout, s, gpu) for s in range(layout.pp))


def total_weight_bytes(model: ModelSpec, weight_dtype: str) -> float:
    """All weights of one copy of the model at `weight_dtype` (no TP replication)."""
    return weight_bytes_per_gpu(model, Layout(weight_dtype=weight_dtype))


def heaviest_stage(model: ModelSpec, layout: Layout) -> int:
    return max(range(layout.pp), key=lambda s: stage_weight_bytes(model, layout, s))
