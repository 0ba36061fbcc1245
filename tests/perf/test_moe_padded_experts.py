"""vLLM's DeepGEMM MoE path (block-scaled fp8 experts on Hopper, TP != 8) computes a
128-row block for every local expert each step: decode reads all of its experts whatever
the batch, so its TPOT barely moves with concurrency (the Qwen3-235B vLLM rows)."""

from __future__ import annotations

from dataclasses import replace
from types import MappingProxyType

from gpufleet.perf.calibration import BackendCalibration, Calibration
from gpufleet.perf.roofline import RooflineStepTimeModel
from gpufleet.perf.step_time import StepBatch
from gpufleet.plan.engines import DEEPGEMM_BLOCK_ROWS, moe_padded_expert_rows
from gpufleet.plan.layout import Layout
from gpufleet.plan.perf_serving import layout_step_model
from gpufleet.specs.catalog import load_model
from gpufleet.specs.gpus import gpu_names, load_gpu
from gpufleet.specs.quant import FP8, FP8_BLOCK, QuantScheme, uniform_scheme

QWEN = "Qwen/Qwen3-235B-A22B"


def _decode_s(
    pad_rows: int, n: int, layout: Layout | None = None, moe_gemm_efficiency: float = 0.9
) -> float:
    backend = BackendCalibration(moe_gemm_efficiency=moe_gemm_efficiency)
    model = RooflineStepTimeModel(
        load_model(QWEN),
        load_gpu("h200"),
        layout or Layout(tp=2, pp=1, weight_dtype="fp8", kv_dtype="fp8"),
        calibration=Calibration(backends=MappingProxyType({"default": backend})),
        scheme=uniform_scheme(FP8_BLOCK),
        moe_padded_expert_rows=pad_rows,
    )
    return model.step_time_s(StepBatch(num_decode=n, decode_context_tokens=n * 2000))


def test_padded_experts_make_small_batches_read_every_expert() -> None:
    routed_1, routed_16 = _decode_s(0, 1), _decode_s(0, 16)
    padded_1, padded_16 = _decode_s(128, 1), _decode_s(128, 16)
    # Routed only: one sequence touches 8 of 128 experts, sixteen touch most of them.
    assert routed_16 > 1.5 * routed_1
    # Padded: every expert is read at any batch, so the step is nearly flat and slower.
    assert padded_1 > 2.0 * routed_1
    assert padded_16 < 1.15 * padded_1
    assert padded_16 >= routed_16


def test_padding_blocks_run_at_the_dense_gemm_rate() -> None:
    # The padding is one dense fp8 GEMM block per expert (DeepGEMM), not the fused-MoE
    # path whose prefill efficiency the engine's constant carries: a slow fused-MoE rate
    # must not turn every decode step into 16k rows of slow compute.
    slow, fast = _decode_s(128, 1, moe_gemm_efficiency=0.2), _decode_s(128, 1)
    assert slow < 1.02 * fast


def test_padded_experts_are_the_rank_s_own_under_ep() -> None:
    ep2 = Layout(tp=2, pp=1, ep=2, weight_dtype="fp8", kv_dtype="fp8")
    tp2 = Layout(tp=2, pp=1, weight_dtype="fp8", kv_dtype="fp8")
    # Half the experts, whole: the same bytes per GPU as every expert sliced in half.
    assert abs(_decode_s(128, 1, ep2) / _decode_s(128, 1, tp2) - 1.0) < 0.05


def _rows(engine: str, gpu: str, scheme: QuantScheme, tp: int) -> int:
    return moe_padded_expert_rows(engine, load_gpu(gpu), load_model(QWEN), scheme, tp)


def test_only_vllm_block_fp8_on_hopper_below_tp8_pads_every_expert() -> None:
    block = uniform_scheme(FP8_BLOCK)
    assert _rows("vllm", "h200", block, 2) == DEEPGEMM_BLOCK_ROWS
    assert _rows("vllm", "h100", block, 4) == DEEPGEMM_BLOCK_ROWS
    assert _rows("vllm", "h200", block, 8) == 0  # PR #29346: Triton MoE at TP 8
    assert _rows("vllm", "h200", uniform_scheme(FP8), 2) == 0  # per-tensor fp8: no DeepGEMM
    assert _rows("vllm", "b200", block, 2) == 0  # not Hopper
    assert _rows("sglang", "h200", block, 2) == 0
    assert _rows("trtllm", "h200", block, 2) == 0
    dense = load_model("meta-llama/Llama-3.1-8B")
    assert moe_padded_expert_rows("vllm", load_gpu("h200"), dense, block, 2) == 0


def test_hopper_is_read_from_the_gpu_s_architecture_not_its_name() -> None:
    """A Hopper part the name list did not know (H20, H800, GH200, a renamed entry) takes
    DeepGEMM's path; a GPU named like a Hopper but of another architecture does not."""
    block = uniform_scheme(FP8_BLOCK)
    model = load_model(QWEN)
    h20 = replace(load_gpu("h200"), name="nvidia-h20")
    assert moe_padded_expert_rows("vllm", h20, model, block, 2) == DEEPGEMM_BLOCK_ROWS
    not_hopper = replace(load_gpu("h200"), architecture="blackwell")
    assert moe_padded_expert_rows("vllm", not_hopper, model, block, 2) == 0


def test_every_catalog_gpu_names_its_architecture() -> None:
    known = {"ampere", "ada", "hopper", "blackwell", "cdna3"}
    assert {name: load_gpu(name).architecture in known for name in gpu_names()} == {
        name: True for name in gpu_names()
    }
    assert load_gpu("gb200").architecture == "blackwell"
    assert load_gpu("h100-sxm").architecture == "hopper"


def test_planner_step_model_applies_the_engine_rule() -> None:
    model = load_model(QWEN)
    gpu = load_gpu("h200")
    layout = Layout(tp=2, pp=1, weight_dtype="fp8", kv_dtype="fp8")
    step = layout_step_model(model, gpu, layout, backend="vllm")
    # The catalog's Qwen3 is a bf16 checkpoint: fp8 is online per-tensor, no DeepGEMM.
    assert step._pad_rows == 0
