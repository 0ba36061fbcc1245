"""What a simulated replica (gpufleet.engine) needs to run one layout: its step-time model,
KV blocks and scheduler limits, with vLLM's serving defaults."""

from __future__ import annotations

from dataclasses import dataclass

from gpufleet.errors import UserError
from gpufleet.perf.calibration import Calibration
from gpufleet.perf.step_time import StepTimeModel
from gpufleet.plan.layout import Layout
from gpufleet.plan.memory import (
    DEFAULT_BLOCK_TOKENS,
    default_max_num_batched_tokens,
    memory_breakdown,
)
from gpufleet.plan.perf_serving import layout_step_model
from gpufleet.specs.catalog import load_model
from gpufleet.specs.dtypes import KV_DTYPES, WEIGHT_DTYPES
from gpufleet.specs.gpus import load_gpu
from gpufleet.specs.quant import FORMAT_ALIASES


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


def replica_profile(
    model: str,
    gpu: str,
    *,
    tp: int = 1,
    pp: int = 1,
    ep: int = 1,
    quant: str = "bf16",
    kv_dtype: str = "auto",
    max_model_len: int | None = None,
    gpu_memory_utilization: float = 0.9,
    max_num_seqs: int = 256,
    max_num_batched_tokens: int | None = None,
    calibration: Calibration | None = None,
    step_time_model: StepTimeModel | None = None,
    backend: str = "vllm",
) -> ReplicaProfile:
    """The profile of one replica of `model` on `tp` x `pp` `gpu`s.

    quant: bf16 | fp8 | int8 | int4 | fp4, or "auto" for the checkpoint's own dtype.
    kv_dtype: "auto" (the model dtype, bf16) or fp8. max_model_len: None takes the
    model's max_position_embeddings, lowered to what the KV cache holds (vLLM would refuse
    to start instead; a simulator is more useful running). max_num_batched_tokens: None
    takes vLLM V1's serving default for the GPU (8192 on >= 70 GiB, else 2048).
    calibration: the step-time model's constants (None: the shipped ones,
    `gpufleet.perf.calibration.default_calibration()`); step_time_model: use this model as
    is instead of building the roofline one (the KV blocks still come from the layout);
    backend: whose engine overheads the roofline model carries.
    """
    spec = load_model(model)
    gpu_spec = load_gpu(gpu)
    weight_dtype = spec.checkpoint_dtype if quant == "auto" else FORMAT_ALIASES.get(quant, quant)
    if weight_dtype not in WEIGHT_DTYPES:
        raise UserError(
            f"unknown quant {quant!r}", field="quant", fix=f"use auto or one of {WEIGHT_DTYPES}"
        )
    kv = "bf16" if kv_dtype == "auto" else kv_dtype
    if kv not in KV_DTYPES:
        raise UserError(
            f"unknown kv_dtype {kv_dtype!r}", field="kv_dtype", fix=f"use auto or {KV_DTYPES}"
        )
    if not 0.0 < gpu_memory_utilization <= 1.0:
        raise UserError(
            f"gpu_memory_utilization {gpu_memory_utilization} is outside (0, 1]",
            field="gpu_memory_utilization",
            fix="use a fraction such as 0.9",
        )
    if max_num_seqs < 1:
        raise UserError("max_num_seqs must be >= 1", field="max_num_seqs", fix="use e.g. 256")
    try:
        layout = Layout(tp=tp, pp=pp, ep=ep, weight_dtype=weight_dtype, kv_dtype=kv)
    except ValueError as e:
        raise UserError(str(e), field="layout", fix="ep must divide tp; tp, pp >= 1") from e

    batched = max_num_batched_tokens or default_max_num_batched_tokens(gpu_spec)
    wanted_len = max_model_len or spec.max_position_embeddings
    mem = memory_breakdown(
        spec,
        gpu_spec,
        layout,
        wanted_len,
        max_num_batched_tokens=batched,
        max_num_seqs=max_num_seqs,
        gpu_memory_utilization=gpu_memory_utilization,
        block_tokens=DEFAULT_BLOCK_TOKENS,
    )
    if mem.kv_blocks < 1:
        raise UserError(
            f"{spec.name} {layout.label} leaves no room for a KV cache on {gpu_spec.name} "
            f"(weights {mem.weights_bytes / 1e9:.1f} GB of {mem.usable_bytes / 1e9:.1f} GB usable)",
            field="layout",
            fix="quantize, or raise tp / pp",
        )
    capacity = mem.kv_blocks * DEFAULT_BLOCK_TOKENS
    if mem.max_concurrent_seqs < 1:
        if max_model_len is not None:
            raise UserError(
                f"max_model_len {max_model_len} needs more KV cache than {spec.name} "
                f"{layout.label} has on {gpu_spec.name} ({capacity} tokens)",
                field="max_model_len",
                fix=f"use max_model_len <= {capacity}, or raise tp / quantize the KV cache",
            )
        wanted_len = capacity
    return ReplicaProfile(
        model_name=spec.name,
        step_time_model=step_time_model
        or layout_step_model(spec, gpu_spec, layout, backend=backend, calibration=calibration),
        num_gpu_blocks=mem.kv_blocks,
        block_size=DEFAULT_BLOCK_TOKENS,
        max_model_len=wanted_len,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=batched,
        pipeline_stages=layout.pp,
    )
