"""Serving predictions for one layout of a model on a GPU: the planner's entry points to
the closed-loop solver (`plan.closed_loop`) with the engine's limits and calibration."""

from __future__ import annotations

from gpufleet.perf.calibration import Calibration, default_calibration
from gpufleet.perf.roofline import LayoutLike, RooflineStepTimeModel
from gpufleet.perf.step_time import StepTimeModel
from gpufleet.plan.capacity import concurrent_sequences
from gpufleet.plan.closed_loop import (
    SchedulerShape,
    ServingPrediction,
    max_concurrency_within_slo,
    predict_closed_loop,
)
from gpufleet.specs.gpus import GpuSpec
from gpufleet.specs.models import ModelSpec

__all__ = [
    "SchedulerShape",
    "ServingPrediction",
    "layout_step_model",
    "max_concurrency_within_slo",
    "max_serving_concurrency_within_slo",
    "predict_closed_loop",
    "predict_serving",
    "scheduler_for",
]


def layout_step_model(
    model: ModelSpec,
    gpu: GpuSpec,
    layout: LayoutLike,
    *,
    backend: str = "vllm",
    calibration: Calibration | None = None,
) -> RooflineStepTimeModel:
    return RooflineStepTimeModel(model, gpu, layout, calibration=calibration, backend=backend)


def scheduler_for(
    gpu: GpuSpec,
    *,
    backend: str = "vllm",
    max_num_seqs: int = 1024,
    max_num_batched_tokens: int | None = None,
    kv_capacity_tokens: int | None = None,
    tokens_per_request: int = 0,
    calibration: Calibration | None = None,
) -> SchedulerShape:
    """The engine's limits: token budget (vLLM default for the GPU unless given) and how
    many requests run at once (max_num_seqs, or fewer when the KV cache holds fewer)."""
    cal = (calibration or default_calibration()).backend(backend)
    budget = max_num_batched_tokens or (8192 if gpu.memory_bytes >= 70 * (1 << 30) else 2048)
    running = max_num_seqs
    if kv_capacity_tokens is not None and tokens_per_request > 0:
        running = concurrent_sequences(max_num_seqs, kv_capacity_tokens, tokens_per_request)
    return SchedulerShape(
        max_num_batched_tokens=budget, max_running=running, mixed_prefill=cal.mixed_prefill
    )


def _serving_setup(
    model: ModelSpec,
    gpu: GpuSpec,
    layout: LayoutLike,
    tokens_per_request: int,
    backend: str,
    max_num_seqs: int,
    max_num_batched_tokens: int | None,
    kv_capacity_tokens: int | None,
    calibration: Calibration | None,
    step_model: StepTimeModel | None,
) -> tuple[Calibration, StepTimeModel, SchedulerShape]:
    """Calibration, step-time model and scheduler limits of one layout's serving setup."""
    cal = calibration or default_calibration()
    step = step_model or layout_step_model(model, gpu, layout, backend=backend, calibration=cal)
    sched = scheduler_for(
        gpu,
        backend=backend,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
        kv_capacity_tokens=kv_capacity_tokens,
        tokens_per_request=tokens_per_request,
        calibration=cal,
    )
    return cal, step, sched


def predict_serving(
    model: ModelSpec,
    gpu: GpuSpec,
    layout: LayoutLike,
    input_tokens: int,
    output_tokens: int,
    concurrency: int,
    *,
    backend: str = "vllm",
    max_num_seqs: int = 1024,
    max_num_batched_tokens: int | None = None,
    kv_capacity_tokens: int | None = None,
    calibration: Calibration | None = None,
    step_model: StepTimeModel | None = None,
) -> ServingPrediction:
    """Steady-state mean TTFT / TPOT / throughput of one replica of `layout` serving
    `concurrency` clients of `input_tokens` in and `output_tokens` out. Pass
    `kv_capacity_tokens` (from plan.memory) to cap the running requests by the KV cache,
    and a prebuilt `step_model` to save its construction when sweeping concurrency."""
    cal, step, sched = _serving_setup(
        model, gpu, layout, input_tokens + output_tokens, backend, max_num_seqs,
        max_num_batched_tokens, kv_capacity_tokens, calibration, step_model,
    )  # fmt: skip
    return predict_closed_loop(
        step,
        input_tokens,
        output_tokens,
        concurrency,
        sched,
        ttft_overhead_s=cal.backend(backend).ttft_overhead_s,
        queue_scale=cal.queue_scale,
    )


def max_serving_concurrency_within_slo(
    model: ModelSpec,
    gpu: GpuSpec,
    layout: LayoutLike,
    input_tokens: int,
    output_tokens: int,
    *,
    ttft_slo_s: float,
    tpot_slo_s: float,
    backend: str = "vllm",
    max_num_seqs: int = 1024,
    max_num_batched_tokens: int | None = None,
    kv_capacity_tokens: int | None = None,
    calibration: Calibration | None = None,
    step_model: StepTimeModel | None = None,
) -> ServingPrediction | None:
    """The layout's best steady state within the SLOs (highest concurrency), or None."""
    cal, step, sched = _serving_setup(
        model, gpu, layout, input_tokens + output_tokens, backend, max_num_seqs,
        max_num_batched_tokens, kv_capacity_tokens, calibration, step_model,
    )  # fmt: skip
    return max_concurrency_within_slo(
        step,
        input_tokens,
        output_tokens,
        ttft_slo_s=ttft_slo_s,
        tpot_slo_s=tpot_slo_s,
        scheduler=sched,
        max_concurrency=sched.max_running,
        ttft_overhead_s=cal.backend(backend).ttft_overhead_s,
        queue_scale=cal.queue_scale,
    )
