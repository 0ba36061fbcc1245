"""Per-layer constants of the roofline model: weight bytes and GEMM seconds per token of each
class of identical layers, in each module's own storage format and tensor-core path.

A layer's attention projections, dense MLP (or shared experts and router) are GEMMs over
the weights one GPU holds. Each module is stored in the format the checkpoint's
`QuantScheme` gives it and multiplied on the tensor-core path that format has on the GPU:
W8A8 fp8 / int8 where the GPU has those units; W4A4 NVFP4 (and W4A8 MXFP4) only on GPUs
with fp4 tensor cores (Blackwell) — elsewhere the engines run 4-bit weights through a
weight-only kernel at bf16 (Marlin: W4A16), reading 4-bit weights but computing at bf16.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpufleet.specs.gpus import GpuSpec
from gpufleet.specs.models import ModelSpec
from gpufleet.specs.quant import QuantScheme, WeightFormat


def compute_dtype(fmt: WeightFormat, gpu: GpuSpec) -> str:
    """The tensor-core dtype a module in `fmt` is multiplied at on `gpu`."""
    if fmt.name in ("mxfp4", "nvfp4") and not gpu.supports("fp4"):
        return "bf16"  # Hopper and older: W4A16 (Marlin / Triton)
    return fmt.act_dtype if gpu.supports(fmt.act_dtype) else "bf16"


@dataclass(frozen=True, slots=True)
class LayerClass:
    """Layers that cost the same, and how many of them there are (per whole model)."""

    count: int
    window: int | None
    weight_bytes: float  # per GPU: attention projections + dense MLP / shared / router
    gemm_s_per_token: float  # per GPU, at the achieved tensor rate of each module's path
    is_moe: bool
    # GEMM and attention kernels one layer launches (each pays `kernel_fixed_s`): the
    # attention projections (fused QKV and O; MLA's low-rank Q and KV projections two
    # more), attention itself, and the dense MLP's gate-up and down, or an MoE layer's
    # router and shared expert's two (the routed experts' kernels are the backend's
    # moe_layer_overhead_s).
    kernels: int = 0


_CACHE: dict[tuple[object, ...], tuple[LayerClass, ...]] = {}


def layer_classes(
    model: ModelSpec,
    gpu: GpuSpec,
    scheme: QuantScheme,
    *,
    tp: int,
    moe_tp: int,
    gemm_efficiency: float,
) -> tuple[LayerClass, ...]:
    """Group the model's layers by (window, MoE, attention format, MLP format)."""
    key = (model, gpu.name, tuple(gpu.dense_tflops.items()), scheme, tp, moe_tp, gemm_efficiency)
    if key not in _CACHE:
        if len(_CACHE) > 4096:  # a long fit sweeps many efficiencies
            _CACHE.clear()
        _CACHE[key] = _layer_classes(model, gpu, scheme, tp, moe_tp, gemm_efficiency)
    return _CACHE[key]


def _layer_classes(
    model: ModelSpec,
    gpu: GpuSpec,
    scheme: QuantScheme,
    tp: int,
    moe_tp: int,
    gemm_efficiency: float,
) -> tuple[LayerClass, ...]:
    groups: dict[tuple[int | None, bool, WeightFormat, WeightFormat, tuple[int, int]], list[int]]
    groups = {}
    for i, spec in enumerate(model.layers):
        is_moe = spec.is_moe and model.moe is not None
        mlp_fmt = scheme.format(i, "shared" if is_moe else "mlp")
        window = spec.sliding_window
        recurrent = model.recurrent_mixer
        if not spec.mixer:
            window = 0  # an MLP-only block (Nemotron-H): no attention at all
        elif spec.linear and recurrent is not None:
            # A recurrent mixer reads its fixed state each step, not a KV cache: cost it
            # as a window holding the same bytes.
            per_token = model.kv_elements_per_token_per_layer(tp) * 2
            window = max(1, round(recurrent.state_bytes(tp) / per_token))
        elif window is not None and model.attention_kind == "gqa":
            # The step model reads every layer's KV at the reference layer's bytes per
            # token; a window layer of another shape (MiMo-V2-Flash's sliding layers,
            # Gemma 4's) reads its own bytes through a window scaled to hold them.
            own = model.kv_elements_per_token_per_layer(tp, i)
            ref = model.kv_elements_per_token_per_layer(tp)
            if own != ref:
                window = max(1, round(window * own / ref))
        # Layers of one class have the same shapes too (hybrid and NAS models differ).
        shapes = (model.attention_params(i), model.mlp_params(i))
        key = (window, is_moe, scheme.format(i, "attn"), mlp_fmt, shapes)
        groups.setdefault(key, []).append(i)
    out = []
    for (window, is_moe, attn_fmt, mlp_fmt, _), ids in groups.items():
        first = ids[0]
        attn = model.attention_params(first) / tp
        if is_moe:
            # Shared experts run like the dense MLP they are, on the attention ranks'
            # tokens, sharded over attention TP (replicated under attention DP), not over
            # the routed experts' moe_tp (TRT-LLM's shared_tp_size, vLLM's and SGLang's
            # shared-expert MLPs).
            mlp = model.shared_expert_params() / tp
            router = float(model.router_params())
        else:
            mlp = model.mlp_params(first) / tp
            router = 0.0
        attn_rate = gpu.tflops(compute_dtype(attn_fmt, gpu)) * 1e12 * gemm_efficiency
        mlp_rate = gpu.tflops(compute_dtype(mlp_fmt, gpu)) * 1e12 * gemm_efficiency
        bf16_rate = gpu.tflops("bf16") * 1e12 * gemm_efficiency
        out.append(
            LayerClass(
                count=len(ids),
                window=window,
                weight_bytes=attn * attn_fmt.bytes_per_param
                + mlp * mlp_fmt.bytes_per_param
                + router * 2.0,
                gemm_s_per_token=2.0 * attn / attn_rate
                + 2.0 * mlp / mlp_rate
                + 2.0 * router / bf16_rate,
                is_moe=is_moe,
                kernels=(5 if model.attention_kind == "mla" else 3)
                + (1 + (2 if model.shared_expert_params() else 0) if is_moe else 2),
            )
        )
    return tuple(out)
