"""Predictions of measured-serving rows (`validation.rows`): the roofline step-time model
and the closed-loop solver, with each row's engine as it behaves (`plan.engines`: memory
fraction, admission rule, token budget, mixed or separate prefill, CUDA-graph sizes) and
its layout as labelled (attention TP × DP ranks, experts over moe_tp × moe_ep GPUs).

Shared by the calibration fit and `benchmarks/plan_accuracy.py`; a row that cannot be
modelled raises UserError with the reason.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from gpufleet.errors import UserError
from gpufleet.perf.calibration import BackendCalibration, Calibration, default_calibration
from gpufleet.perf.roofline import RooflineStepTimeModel
from gpufleet.perf.speculative import SpeculativeStepModel
from gpufleet.plan.closed_loop import FIXED_LENGTH_QUEUE_SCALE, ServingPrediction
from gpufleet.plan.engines import EngineRules, engine_rules, kv_admitted_running
from gpufleet.plan.layout import Layout
from gpufleet.plan.memory import memory_breakdown
from gpufleet.plan.perf_serving import layout_step_model, shape_of
from gpufleet.specs.gpus import GpuSpec, load_gpu
from gpufleet.specs.models import ModelSpec
from gpufleet.specs.quant import BF16, FP8, FP8_BLOCK, QuantScheme
from gpufleet.validation.engine_loop import EngineLoopResult, simulate_closed_loop
from gpufleet.validation.feasibility import infeasible_reason
from gpufleet.validation.recipes import (
    is_inferencemax,
    recipe_expert_parallel,
    recipe_rules,
    speculative_rules,
)
from gpufleet.validation.rows import (
    QUANT_MODES,
    MeasuredRow,
    default_csv,
    read_rows,
    resolve_model,
)
from gpufleet.validation.what_if import SHIPPED, WhatIf

__all__ = [
    "MeasuredRow",
    "RowPrediction",
    "WhatIf",
    "default_csv",
    "model_row",
    "predict_row",
    "predict_rows",
    "read_rows",
    "resolve_model",
    "row_layout",
]


@dataclass(frozen=True)
class RowPrediction:
    row: MeasuredRow
    ttft_s: float
    tpot_s: float
    serving: ServingPrediction
    engine: EngineLoopResult | None = None  # what the engine measured (engine mode only)
    note: str = ""  # how the row's labels were read, when not as written
    # Why the measured rate is impossible as labelled (validation.feasibility), else "".
    infeasible: str = ""

    @property
    def ttft_ape_pct(self) -> float:
        """Absolute percentage error of the predicted TTFT against the measured one."""
        return abs(self.ttft_s - self.row.ttft_s) / self.row.ttft_s * 100.0

    @property
    def tpot_ape_pct(self) -> float:
        """Absolute percentage error of the predicted TPOT against the measured one."""
        return abs(self.tpot_s - self.row.tpot_s) / self.row.tpot_s * 100.0


# Checkpoints the CSV names whose weights are block-scaled fp8 whatever the row's "fp8"
# label. Their configs are not in the repo (specs/data/models holds the base models'), so
# the fact is written here from each checkpoint's published quantization_config:
# Qwen/Qwen3-235B-A22B-FP8: quant_method fp8, weight_block_size [128, 128].
# Not listed, so per-tensor: nvidia/Llama-3.1-8B-Instruct-FP8 (ModelOpt, quant_algo FP8:
# one weight and one activation scale per tensor).
BLOCK_SCALED_FP8_CHECKPOINTS: Final = frozenset({"qwen/qwen3-235b-a22b-fp8"})


def row_scheme(row: MeasuredRow) -> QuantScheme:
    """The row's weight formats: its GEMM quant mode for the dense modules, its MoE quant
    mode for the experts; lm_head bf16. An "fp8" label on a block-scaled checkpoint
    (`BLOCK_SCALED_FP8_CHECKPOINTS`) is its block-scaled format."""
    gemm = QUANT_MODES.get(row.gemm_quant.lower())
    moe = QUANT_MODES.get(row.moe_quant.lower())
    if row.model_path.lower() in BLOCK_SCALED_FP8_CHECKPOINTS:
        # The engines serve the checkpoint's block scales (and vLLM picks its DeepGEMM MoE
        # path for them).
        gemm = FP8_BLOCK if gemm == FP8 else gemm
        moe = FP8_BLOCK if moe == FP8 else moe
    if gemm is None or moe is None:
        raise UserError(
            f"unknown quant mode {row.gemm_quant!r}/{row.moe_quant!r}",
            field="gemm_quant_mode",
            fix=f"use one of {', '.join(sorted(k for k in QUANT_MODES if k))}",
        )
    return QuantScheme.of(
        {"attn": gemm, "mlp": gemm, "experts": moe, "shared": gemm, "lm_head": BF16},
        method="measured row",
    )


@dataclass(frozen=True)
class RowLayout:
    """How a row is modelled: its layout, the clients of one attention rank, and a note
    when the labels were read differently from how they are written."""

    layout: Layout
    clients_per_rank: int
    note: str = ""


# vLLM's `--kv-cache-dtype auto` (its default) stores KV in the model's activation dtype
# (bf16) whatever the weights; InferenceMAX's vLLM recipe sets `kv-cache-dtype: fp8`, the
# other vLLM campaigns publish no launch. True: vLLM rows outside InferenceMAX are read
# with a bf16 KV cache (docs/performance-model.md, "Wave 15: held-out").
VLLM_DEFAULT_KV_DTYPE = True


# Read the InferenceMAX TRT-LLM DeepSeek rows labelled MoE TP with the expert parallelism
# their launch scripts set (`recipes.recipe_expert_parallel`). Off: refitted from the
# shipped constants the objective rises 1.1713 -> 1.1773 (docs/performance-model.md,
# "Wave 17: DeepSeek").
EXPERT_PARALLEL_AS_LAUNCHED = False


def row_kv_dtype(row: MeasuredRow, scheme: QuantScheme) -> str:
    """The KV cache dtype a row ran: fp8 where the attention weights are fp8, except vLLM
    at its default dtype (`VLLM_DEFAULT_KV_DTYPE`)."""
    if VLLM_DEFAULT_KV_DTYPE and row.backend == "vllm" and not is_inferencemax(row):
        return "bf16"
    return "fp8" if scheme.format(0, "attn").name == "fp8" else "bf16"


def row_layout(row: MeasuredRow, model: ModelSpec, gpu: GpuSpec) -> RowLayout:
    """The row's layout: tp attention ranks in each of dp data-parallel groups; for MoE
    models the group's GPUs are moe_tp × moe_ep and dp = GPUs / tp. fp8 rows run an fp8
    KV cache.

    Rows labelled with more GPUs than one node of their system are read as one node: the
    shared CSV's 64-GPU H200 rows (tp 64 or attention DP 64, moe_tp 8 × moe_ep 8) repeat,
    to the last digit, the figures of 8-GPU rows labelled tp 8 (or DP 8) × ep 8 with the
    same clients, and no 64-GPU run could give an 8-GPU run's TPOT. The labels are scaled
    down to the node (moe_tp and tp or dp divided alike, the clients kept) and the row
    says so in its note."""
    if row.isl < 1 or row.osl < 1 or row.batch_size < 1 or row.tp < 1 or row.pp < 1:
        raise UserError("non-positive isl/osl/batch_size/tp/pp", field="row")
    scheme = row_scheme(row)
    headline = scheme.headline
    kv = row_kv_dtype(row, scheme)
    if model.moe is None:
        dp = max(1, row.attention_dp)
        layout = Layout(tp=row.tp, pp=row.pp, dp=dp, weight_dtype=headline, kv_dtype=kv)
        return RowLayout(layout, row.batch_size)
    tp, moe_tp, ep = row.tp, row.moe_tp, row.moe_ep
    if EXPERT_PARALLEL_AS_LAUNCHED and recipe_expert_parallel(row):
        moe_tp, ep = 1, moe_tp * ep  # the recipe's EP_SIZE = TP
    gpus = moe_tp * ep
    if gpus % tp:
        raise UserError(
            f"moe_tp × moe_ep = {gpus} GPUs is not a multiple of tp_size {tp}",
            field="tp_size",
            fix="label the row with tp_size dividing moe_tp_size × moe_ep_size",
        )
    dp = gpus // tp
    clients = row.batch_size * dp
    note = ""
    node = gpu.gpus_per_node
    if gpus > node and gpus % node == 0 and moe_tp % (gpus // node) == 0:
        scale = gpus // node
        moe_tp //= scale
        if tp % scale == 0:
            tp //= scale
        else:
            dp //= scale
        note = (
            f"labelled {gpus} GPUs (tp {row.tp}, moe_tp {row.moe_tp} x ep {ep}) on "
            f"{node}-GPU nodes; read as one node: tp {tp} x dp {node // tp}, moe_tp {moe_tp} "
            f"x ep {ep}, {clients} clients"
        )
        dp = node // tp
    layout = Layout(
        tp=tp, pp=row.pp, dp=dp, ep=ep, weight_dtype=headline, kv_dtype=kv,
    )  # fmt: skip
    return RowLayout(layout, max(1, clients // dp), note)


def model_row(
    row: MeasuredRow,
    cal: Calibration | None = None,
    configs_dir: Path | None = None,
    *,
    engine: bool = False,
    recipes: bool = False,
    what_if: WhatIf = SHIPPED,
) -> RowPrediction:
    """Predict one row; raises UserError (with the reason) when the row cannot be modelled.

    engine: play the closed loop out on `gpufleet.engine` (engine_loop) instead of the
    analytic mean-value solver; the same step-time model and constants either way.
    recipes: run the engine as the row's launch recipe set it (`validation.recipes`), not
    with its defaults. what_if: a counterfactual's engine rules and closed-loop solver
    (`validation.what_if`; default: the shipped model)."""
    cal = cal or default_calibration()
    model = resolve_model(row.model_path, configs_dir)
    gpu = load_gpu(row.system)
    how = row_layout(row, model, gpu)
    layout = how.layout
    # Modelled all the same (issue 14: no row left out); the reason rides on the prediction.
    infeasible = infeasible_reason(row, model, gpu, layout, row_scheme(row), how.clients_per_rank)
    rules = engine_rules(row.backend, gpu, tp=layout.tp, pp=layout.pp, dp=layout.dp)
    # The batch waiting a row's launch recipe set is always modelled (what_if.row_rules:
    # `recipes.batch_wait_rules` as shipped); the recipes' other options only on request.
    rules = recipe_rules(row, rules) if recipes else what_if.row_rules(row, rules)
    # So is the multi-token prediction it turned on (`speculative_rules`).
    rules = speculative_rules(row, rules)
    step = layout_step_model(
        model,
        gpu,
        layout,
        backend=row.backend,
        calibration=cal,
        scheme=row_scheme(row),
        rules=rules,
    )
    b = cal.backend(row.backend)
    first_token_s = cal.first_token_overhead_s(row.backend, model.moe is not None)
    max_running = _kv_limited_running(model, gpu, layout, rules, row)
    if engine:
        pred = _engine_row(
            row, step, b, rules, max_running, how.clients_per_rank, how.note, first_token_s
        )
        return dataclasses.replace(pred, infeasible=infeasible or "")
    serving = what_if.closed_loop(
        SpeculativeStepModel(step, rules.mtp_draft_tokens, model.num_layers)
        if rules.mtp_draft_tokens
        else step,
        row.isl,
        row.osl,
        how.clients_per_rank,
        shape_of(
            rules,
            max_running=max_running,
            max_output_tokens_per_s=b.frontend_tokens_per_s,
            attention_dp=layout.dp,
            first_token_iterations=b.first_token_iterations,
            mtp_acceptance_rate=cal.mtp_acceptance_rate,
        ),
        ttft_overhead_s=first_token_s,
        queue_scale=FIXED_LENGTH_QUEUE_SCALE,
        requests_per_client=b.benchmark_requests_per_client,
    )
    return RowPrediction(
        row=row,
        ttft_s=serving.ttft_s,
        tpot_s=serving.tpot_s,
        serving=serving,
        note=how.note,
        infeasible=infeasible or "",
    )


def _engine_row(
    row: MeasuredRow,
    step: RooflineStepTimeModel,
    b: BackendCalibration,
    rules: EngineRules,
    max_running: int,
    clients: int,
    note: str,
    first_token_s: float,
) -> RowPrediction:
    """The row's closed loop on the engine. The per-request overhead outside the engine is
    the clients' think time and adds to TTFT; the benchmark's first wave (all clients at
    once) weighs 1/requests_per_client in the mean TTFT, as in the analytic path."""
    sim = simulate_closed_loop(
        step,
        row.isl,
        row.osl,
        clients,
        max_num_batched_tokens=rules.max_num_batched_tokens,
        max_running=max_running,
        mixed_prefill=rules.mixed_prefill,
        think_s=first_token_s,
    )
    k = max(1.0, b.benchmark_requests_per_client)
    ttft_s = first_token_s + sim.ttft_s + (sim.first_wave_ttft_s - sim.ttft_s) / k
    ttft_s += b.first_token_iterations * sim.tpot_s  # the engine's first-token iterations
    tpot_s = sim.tpot_s
    rate = clients / (ttft_s + (row.osl - 1) * tpot_s)
    serving = ServingPrediction(
        concurrency=clients,
        ttft_s=ttft_s,
        tpot_s=tpot_s,
        requests_per_s=rate,
        output_tokens_per_s=rate * row.osl,
        e2e_latency_s=ttft_s + (row.osl - 1) * tpot_s,
        running_decodes=float("nan"),
        prefill_share=float("nan"),
        prefill_s=float("nan"),
    )
    return RowPrediction(
        row=row, ttft_s=ttft_s, tpot_s=tpot_s, serving=serving, engine=sim, note=note
    )


def _kv_limited_running(
    model: ModelSpec, gpu: GpuSpec, layout: Layout, rules: EngineRules, row: MeasuredRow
) -> int:
    """Requests one attention rank runs at once: the engine's limit, or fewer when its KV
    cache (under the engine's memory rule) holds fewer requests under its admission rule.
    A KV cache that holds no request is a UserError naming the shortfall."""
    seq = row.isl + row.osl
    key = (model, gpu.name, layout, rules, row.isl, row.osl)
    if key not in _KV_CACHE:
        mem = memory_breakdown(model, gpu, layout, seq, engine=rules.name)
        footprint = rules.admission_tokens(row.isl, row.osl)
        running = kv_admitted_running(
            rules, mem.kv_capacity_tokens, footprint, model.max_position_embeddings
        )
        if running < 1:
            raise UserError(
                f"{model.name} {layout.label} on {gpu.name} leaves "
                f"{mem.kv_cache_bytes / (1 << 30):.1f} GiB of KV cache under {rules.name}'s "
                f"memory rule: not one {row.isl}+{row.osl}-token request",
                field="layout",
                fix="check the row's layout and quantization",
            )
        _KV_CACHE[key] = running
    return _KV_CACHE[key]


_KV_CACHE: dict[tuple[ModelSpec, str, Layout, EngineRules, int, int], int] = {}


def predict_row(
    row: MeasuredRow,
    cal: Calibration | None = None,
    *,
    engine: bool = False,
    recipes: bool = False,
    what_if: WhatIf = SHIPPED,
) -> RowPrediction | None:
    """Like model_row, but None for a row that cannot be modelled."""
    try:
        return model_row(row, cal, engine=engine, recipes=recipes, what_if=what_if)
    except UserError:
        return None


def predict_rows(
    rows: Sequence[MeasuredRow],
    cal: Calibration | None = None,
    configs_dir: Path | None = None,
    *,
    engine: bool = False,
    recipes: bool = False,
    what_if: WhatIf = SHIPPED,
) -> tuple[list[RowPrediction], list[tuple[MeasuredRow, str]]]:
    """Predictions for the rows it can model, and (row, reason) for those it cannot
    (`what_if`: a counterfactual, `validation.what_if`; default: the shipped model)."""
    done: list[RowPrediction] = []
    skipped: list[tuple[MeasuredRow, str]] = []
    for row in rows:
        try:
            done.append(
                model_row(row, cal, configs_dir, engine=engine, recipes=recipes, what_if=what_if)
            )
        except UserError as e:
            skipped.append((row, str(e)))
    return done, skipped
