"""Decode-step physics that must hold on models and GPUs the calibration never saw: where
the MoE exchange happens, how shared experts are sharded, and the per-kernel fixed time."""

from __future__ import annotations

import dataclasses

from gpufleet.perf.calibration import prior_calibration
from gpufleet.perf.layer_costs import layer_classes
from gpufleet.perf.roofline import RooflineStepTimeModel
from gpufleet.perf.step_time import StepBatch
from gpufleet.plan.layout import Layout
from gpufleet.specs.catalog import load_model
from gpufleet.specs.gpus import load_gpu

H200 = load_gpu("h200")
DSV3 = load_model("deepseek-ai/DeepSeek-V3")
LLAMA_8B = load_model("meta-llama/Llama-3.1-8B")
LLAMA_70B = load_model("meta-llama/Llama-3.1-70B")


def _decode(n: int, ctx: int = 1024) -> StepBatch:
    return StepBatch(num_decode=n, decode_context_tokens=n * ctx)


def test_ep_under_attention_tp_has_no_dispatch_the_all_reduce_combines() -> None:
    # tp 8 x ep 8: every GPU holds every token after attention; the TP all-reduce sums the
    # EP ranks' expert outputs. Only attention DP (tokens split over ranks) dispatches.
    tp_ep = RooflineStepTimeModel(DSV3, H200, Layout(tp=8, ep=8, weight_dtype="fp8"))
    dp_ep = RooflineStepTimeModel(DSV3, H200, Layout(tp=1, dp=8, ep=8, weight_dtype="fp8"))
    assert tp_ep.breakdown_s(_decode(16))["exchange_s"] == 0.0
    assert tp_ep.breakdown_s(_decode(16))["allreduce_s"] > 0.0
    assert dp_ep.breakdown_s(_decode(16))["exchange_s"] > 0.0


def test_shared_experts_are_sharded_over_attention_tp_not_moe_tp() -> None:
    # Under attention TP 8 the shared experts are a TP-8 MLP whether the routed experts
    # are TP-sliced (moe_tp 8) or spread whole over EP ranks (moe_tp 1).
    args = dict(tp=8, gemm_efficiency=0.7)
    sliced = layer_classes(DSV3, H200, DSV3.weight_scheme("fp8"), moe_tp=8, **args)
    whole = layer_classes(DSV3, H200, DSV3.weight_scheme("fp8"), moe_tp=1, **args)
    assert [c.weight_bytes for c in sliced] == [c.weight_bytes for c in whole]


def test_kernel_fixed_time_is_paid_per_layer_kernel_not_per_step() -> None:
    cal = prior_calibration()
    slower = dataclasses.replace(cal, kernel_fixed_s=cal.kernel_fixed_s + 1e-6)
    for model, kernels_per_layer in ((LLAMA_8B, 5), (LLAMA_70B, 5)):
        layout = Layout(tp=8, weight_dtype="bf16")
        a = RooflineStepTimeModel(model, H200, layout, calibration=cal)
        b = RooflineStepTimeModel(model, H200, layout, calibration=slower)
        for n in (1, 64):
            extra = b.step_time_s(_decode(n)) - a.step_time_s(_decode(n))
            assert abs(extra - model.num_layers * kernels_per_layer * 1e-6) < 1e-9
            # The decode-run fast path charges the same, bit for bit.
            assert b.decode_step_times_s(n, n * 1024, 1) == [b.step_time_s(_decode(n))]
    # MoE layers: attention (MLA: two more projections) + router + shared expert's two.
    moe = [c for c in layer_classes(DSV3, H200, DSV3.weight_scheme("fp8"), tp=8, moe_tp=1,
                                    gemm_efficiency=0.7) if c.is_moe]  # fmt: skip
    assert moe and all(c.kernels == 5 + 1 + 2 for c in moe)
