"""Serving predictions for one layout of a model on a GPU: the planner's entry points to
the closed-loop solver (`plan.closed_loop`) with the engine's own limits (`plan.engines`:
token budget, running requests, mixed or separate prefill, CUDA-graph sizes, admission
rule) and the calibrated overheads of its front-end."""

from __future__ import annotations

from gpufleet.errors import UserError
from gpufleet.perf.calibration import Calibration, default_calibration
from gpufleet.perf.roofline import LayoutLike, RooflineStepTimeModel
from gpufleet.perf.speculative import accepted_tokens
from gpufleet.perf.step_time import StepTimeModel
from gpufleet.plan.closed_loop import (
    FIXED_LENGTH_QUEUE_SCALE,
    SchedulerShape,
    ServingPrediction,
    max_concurrency_within_slo,
    predict_closed_loop,
)
from gpufleet.plan.engines import (
    EngineRules,
    engine_rules,
    kv_admitted_running,
    moe_padded_expert_rows,
)
from gpufleet.specs.gpus import GpuSpec
from gpufleet.specs.models import ModelSpec
from gpufleet.specs.quant import QuantScheme

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
    scheme: QuantScheme | None = None,
    rules: EngineRules | None = None,
) -> RooflineStepTimeModel:
    """The roofline model of `layout` with the engine's CUDA-graph sizes and MoE padding.

    scheme: the weights' quantization (default: the layout's weight dtype's scheme);
    rules: the engine as launched (default: its defaults for the layout), e.g. a launch
    recipe's CUDA-graph sizes. The one place the step model of a layout is built, so the
    planner and the validation of measured rows (`validation.measured`) cannot drift."""
    rules = rules or engine_rules(
        backend, gpu, tp=layout.tp, pp=layout.pp, dp=getattr(layout, "dp", 1)
    )
    scheme = scheme or model.weight_scheme(layout.weight_dtype)
    return RooflineStepTimeModel(
        model,
        gpu,
        layout,
        calibration=calibration,
        backend=backend,
        scheme=scheme,
        cuda_graph_max_batch=rules.cuda_graph_max_batch,
        moe_padded_expert_rows=moe_padded_expert_rows(backend, gpu, model, scheme, layout.tp),
    )


def scheduler_for(
    gpu: GpuSpec,
    *,
    backend: str = "vllm",
    max_num_seqs: int | None = None,
    max_num_batched_tokens: int | None = None,
    kv_capacity_tokens: int | None = None,
    tokens_per_request: float = 0,
    calibration: Calibration | None = None,
    tp: int = 1,
    dp: int = 1,
    context_tokens: int | None = None,
) -> SchedulerShape:
    """The engine's limits: token budget (its default for the GPU unless given), how many
    requests run at once (max_num_seqs, or the engine's default for its KV pool and the
    model's `context_tokens` (SGLang's), or fewer when the KV cache holds fewer requests
    of `tokens_per_request` tokens — the engine's admission footprint), and its front-end
    ceiling. A KV cache that holds no request at all is a UserError, never one request at
    a time."""
    rules = engine_rules(backend, gpu, tp=tp, dp=dp)
    cal = (calibration or default_calibration()).backend(backend)
    budget = max_num_batched_tokens or rules.max_num_batched_tokens
    running = max_num_seqs or rules.max_num_seqs
    if kv_capacity_tokens is not None:
        running = kv_admitted_running(
            rules, kv_capacity_tokens, tokens_per_request, context_tokens, max_num_seqs
        )
        if running < 1:
            raise UserError(
                f"the KV cache holds {kv_capacity_tokens} tokens, less than one request's "
                f"{tokens_per_request:.0f}",
                field="layout",
                fix="use a layout with more KV cache per GPU (more GPUs, fp8 KV, shorter requests)",
            )
    return shape_of(
        rules,
        max_running=running,
        max_output_tokens_per_s=cal.frontend_tokens_per_s,
        max_num_batched_tokens=budget,
        attention_dp=dp,
        first_token_iterations=cal.first_token_iterations,
    )


def shape_of(
    rules: EngineRules,
    *,
    max_running: int,
    max_output_tokens_per_s: float,
    max_num_batched_tokens: int | None = None,
    attention_dp: int = 1,
    first_token_iterations: float = 0.0,
    mtp_acceptance_rate: float = 0.0,
) -> SchedulerShape:
    """The closed-loop solver's view of an engine's scheduling rules: its token budget
    (`rules`' unless given), `max_running` at once, chunk interleaving, overlap scheduling,
    batch waiting (its threshold a fraction of the budget, as TRT-LLM sets it) and the
    attention-DP balancing across `attention_dp` ranks, the engine's calibrated
    first-token iterations, and the tokens a decode emits per iteration under the rules'
    multi-token prediction at `mtp_acceptance_rate`."""
    budget = max_num_batched_tokens or rules.max_num_batched_tokens
    return SchedulerShape(
        max_num_batched_tokens=budget,
        max_running=max_running,
        mixed_prefill=rules.mixed_prefill,
        max_output_tokens_per_s=max_output_tokens_per_s,
        iterations_ahead=1 if rules.overlap_scheduling else 0,
        batch_wait_iterations=rules.batch_wait_iters,
        batch_wait_tokens=int(rules.batch_wait_max_tokens_ratio * budget),
        balance_timeout_iterations=rules.adp_balance_timeout_iters if attention_dp > 1 else 0,
        balance_ranks=attention_dp,
        first_token_iterations=first_token_iterations,
        accepted_tokens=accepted_tokens(rules.mtp_draft_tokens, mtp_acceptance_rate),
    )


def _serving_setup(
    model: ModelSpec,
    gpu: GpuSpec,
    layout: LayoutLike,
    input_tokens: int,
    output_tokens: int,
    backend: str,
    max_num_seqs: int | None,
    max_num_batched_tokens: int | None,
    kv_capacity_tokens: int | None,
    calibration: Calibration | None,
    step_model: StepTimeModel | None,
) -> tuple[Calibration, StepTimeModel, SchedulerShape]:
    """Calibration, step-time model and scheduler limits of one layout's serving setup."""
    cal = calibration or default_calibration()
    step = step_model or layout_step_model(model, gpu, layout, backend=backend, calibration=cal)
    dp = getattr(layout, "dp", 1)
    rules = engine_rules(backend, gpu, tp=layout.tp, pp=layout.pp, dp=dp)
    sched = scheduler_for(
        gpu,
        backend=backend,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
        kv_capacity_tokens=kv_capacity_tokens,
        tokens_per_request=rules.admission_tokens(input_tokens, output_tokens),
        calibration=cal,
        tp=layout.tp,
        dp=dp,
        context_tokens=model.max_position_embeddings,
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
    max_num_seqs: int | None = None,
    max_num_batched_tokens: int | None = None,
    kv_capacity_tokens: int | None = None,
    calibration: Calibration | None = None,
    step_model: StepTimeModel | None = None,
) -> ServingPrediction:
    """Steady-state mean TTFT / TPOT / throughput of one replica of `layout` serving
    `concurrency` clients (per attention DP rank) of `input_tokens` in and `output_tokens`
    out. Pass `kv_capacity_tokens` (per rank, from plan.memory) to cap the running requests
    by the KV cache, and a prebuilt `step_model` to save its construction when sweeping."""
    cal, step, sched = _serving_setup(
        model, gpu, layout, input_tokens, output_tokens, backend, max_num_seqs,
        max_num_batched_tokens, kv_capacity_tokens, calibration, step_model,
    )  # fmt: skip
    return predict_closed_loop(
        step,
        input_tokens,
        output_tokens,
        concurrency,
        sched,
        ttft_overhead_s=cal.first_token_overhead_s(backend, model.moe is not None),
        queue_scale=FIXED_LENGTH_QUEUE_SCALE,
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
    max_num_seqs: int | None = None,
    max_num_batched_tokens: int | None = None,
    kv_capacity_tokens: int | None = None,
    calibration: Calibration | None = None,
    step_model: StepTimeModel | None = None,
) -> ServingPrediction | None:
    """The layout's best steady state within the SLOs (highest concurrency per attention
    rank), or None."""
    cal, step, sched = _serving_setup(
        model, gpu, layout, input_tokens, output_tokens, backend, max_num_seqs,
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
        ttft_overhead_s=cal.first_token_overhead_s(backend, model.moe is not None),
        queue_scale=FIXED_LENGTH_QUEUE_SCALE,
    )
