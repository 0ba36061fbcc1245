"""How a replica's engine is sized and timed for a layout: the ONE place that decides it.

`load_replica_profile` turns the replica's flags (model, GPU, TP, PP, quantization, ...)
into a `ReplicaProfile`: the step-time model, the number of KV blocks and the scheduler
limits. It uses `gpufleet.plan.profile.replica_profile` when the plan package provides it,
and otherwise a provisional roofline estimate (weights read once per iteration, FLOPs per
new token, KV bytes per attended token) from the model's config.json and a small GPU
table, so that the replica works before the planner does.
"""

from __future__ import annotations

import importlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpufleet.errors import UserError
from gpufleet.plan.step_time import LinearStepTimeModel, StepTimeModel

_MODELS_DIR = Path(__file__).resolve().parent.parent / "specs" / "data" / "models"


@dataclass(frozen=True)
class ReplicaProfile:
    model_name: str
    step_time_model: StepTimeModel
    num_gpu_blocks: int
    block_size: int
    max_model_len: int
    max_num_seqs: int
    max_num_batched_tokens: int
    pipeline_stages: int


@dataclass(frozen=True)
class _GpuSpec:
    memory_gib: float
    hbm_gbps: float
    bf16_tflops: float


# Provisional GPU table (vendor datasheet numbers), used only until gpufleet.plan lands.
_GPUS: dict[str, _GpuSpec] = {
    "h100-sxm": _GpuSpec(80, 3350, 989),
    "h100-pcie": _GpuSpec(80, 2000, 756),
    "h200": _GpuSpec(141, 4800, 989),
    "h200-sxm": _GpuSpec(141, 4800, 989),
    "a100-80gb": _GpuSpec(80, 2039, 312),
    "a100-sxm": _GpuSpec(80, 2039, 312),
    "a100-40gb": _GpuSpec(40, 1555, 312),
    "l40s": _GpuSpec(48, 864, 362),
    "b200": _GpuSpec(180, 8000, 2250),
}
_BYTES_PER_PARAM = {"bf16": 2.0, "fp16": 2.0, "fp8": 1.0, "int8": 1.0, "int4": 0.5, "awq": 0.5}
_MFU = 0.6  # share of peak FLOP/s a prefill reaches
_STEP_OVERHEAD_S = 0.002  # scheduler, sampling and kernel launches per iteration
_PER_SEQ_S = 20e-6


def load_replica_profile(
    model: str,
    gpu: str,
    *,
    tp: int = 1,
    pp: int = 1,
    ep: int = 1,
    quant: str = "bf16",
    kv_dtype: str = "auto",
    max_model_len: int = 8192,
    gpu_memory_utilization: float = 0.9,
    max_num_seqs: int = 256,
    max_num_batched_tokens: int = 8192,
) -> ReplicaProfile:
    planned = _planned_profile_fn()
    if planned is not None:
        profile: ReplicaProfile = planned(
            model,
            gpu,
            tp=tp,
            pp=pp,
            ep=ep,
            quant=quant,
            kv_dtype=kv_dtype,
            max_model_len=max_model_len,
            gpu_memory_utilization=gpu_memory_utilization,
            max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max_num_batched_tokens,
        )
        return profile
    return _provisional_profile(
        model,
        gpu,
        tp=tp,
        pp=pp,
        quant=quant,
        kv_dtype=kv_dtype,
        max_model_len=max_model_len,
        gpu_memory_utilization=gpu_memory_utilization,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
    )


def _planned_profile_fn() -> Any:
    try:
        module = importlib.import_module("gpufleet.plan.profile")
    except ImportError:
        return None
    return getattr(module, "replica_profile", None)


def known_models() -> list[str]:
    return sorted(p.stem.replace("--", "/") for p in _MODELS_DIR.glob("*.json"))


def _find_model_config(model: str) -> dict[str, Any]:
    """The config.json shipped for `model`; "Llama-3.1-8B" also finds "Meta-Llama-3.1-8B"."""
    wanted = model.lower().split("/")[-1]
    for path in sorted(_MODELS_DIR.glob("*.json")):
        name = path.stem.split("--")[-1].lower()
        if name in (wanted, "meta-" + wanted) or wanted == "meta-" + name:
            data: dict[str, Any] = json.loads(path.read_text())
            return data
    raise UserError(
        f"unknown model {model!r}",
        field="--model",
        fix="use one of: " + ", ".join(known_models()),
    )


def _provisional_profile(
    model: str,
    gpu: str,
    *,
    tp: int,
    pp: int,
    quant: str,
    kv_dtype: str,
    max_model_len: int,
    gpu_memory_utilization: float,
    max_num_seqs: int,
    max_num_batched_tokens: int,
) -> ReplicaProfile:
    spec = _GPUS.get(gpu.lower())
    if spec is None:
        raise UserError(
            f"unknown GPU {gpu!r}", field="--gpu", fix="use one of: " + ", ".join(_GPUS)
        )
    if quant not in _BYTES_PER_PARAM:
        raise UserError(
            f"unknown quantization {quant!r}",
            field="--quant",
            fix="use one of: " + ", ".join(_BYTES_PER_PARAM),
        )
    cfg = _find_model_config(model)
    cfg = cfg.get("text_config", cfg)
    hidden = int(cfg["hidden_size"])
    layers = int(cfg["num_hidden_layers"])
    heads = int(cfg["num_attention_heads"])
    kv_heads = int(cfg.get("num_key_value_heads") or heads)
    head_dim = int(cfg.get("head_dim") or hidden // heads)
    inter = int(cfg.get("moe_intermediate_size") or cfg.get("intermediate_size") or 4 * hidden)
    experts = int(cfg.get("num_local_experts") or cfg.get("n_routed_experts") or 1)
    experts_active = int(cfg.get("num_experts_per_tok") or 1)
    vocab = int(cfg.get("vocab_size", 32000))

    attn_params = hidden * (heads * head_dim) * 2 + hidden * (kv_heads * head_dim) * 2
    total_params = layers * (attn_params + 3 * hidden * inter * experts) + 2 * vocab * hidden
    active_params = (
        layers * (attn_params + 3 * hidden * inter * experts_active) + 2 * vocab * hidden
    )
    weight_bytes = total_params * _BYTES_PER_PARAM[quant]
    kv_elem_bytes = 1.0 if kv_dtype.startswith("fp8") else 2.0
    kv_bytes_per_token = 2 * layers * kv_heads * head_dim * kv_elem_bytes
    gpus = tp * pp
    hbm_bytes_per_s = spec.hbm_gbps * 1e9
    free_bytes = spec.memory_gib * 2**30 * gpu_memory_utilization * gpus - weight_bytes
    free_bytes -= 2 * 2**30 * gpus  # activations and CUDA graphs
    block_size = 16
    num_gpu_blocks = int(free_bytes // (kv_bytes_per_token * block_size))
    if num_gpu_blocks * block_size < max_model_len:
        raise UserError(
            f"{model} does not fit {gpus} x {gpu} with a KV cache for max_model_len={max_model_len}",
            field="--tp",
            fix="raise --tp or --pp, quantize with --quant fp8, or lower --max-model-len",
        )
    # One micro-batch end to end: every stage reads its weights once (all of them across
    # the pipeline) split over TP; new tokens cost 2 FLOPs per active parameter.
    step_time_model = LinearStepTimeModel(
        base_s=weight_bytes / tp / hbm_bytes_per_s + _STEP_OVERHEAD_S,
        per_token_s=2 * active_params / (tp * spec.bf16_tflops * 1e12 * _MFU),
        per_seq_s=_PER_SEQ_S,
        per_context_token_s=kv_bytes_per_token / tp / hbm_bytes_per_s,
    )
    return ReplicaProfile(
        model_name=model,
        step_time_model=step_time_model,
        num_gpu_blocks=num_gpu_blocks,
        block_size=block_size,
        max_model_len=max_model_len,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
        pipeline_stages=pp,
    )
