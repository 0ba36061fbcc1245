"""A measured row's weight formats (`validation.measured.row_scheme`)."""

from __future__ import annotations

import dataclasses

import pytest

from gpufleet.specs.quant import FP8, FP8_BLOCK, QuantScheme
from gpufleet.validation.measured import row_scheme
from gpufleet.validation.rows import MeasuredRow

ROW = MeasuredRow(
    id="r", backend="vllm", model_path="Qwen/Qwen3-235B-A22B-FP8", system="h200_sxm",
    gemm_quant="fp8", moe_quant="fp8", isl=1000, osl=100, batch_size=8, tp=2, pp=1,
    attention_dp=1, moe_tp=2, moe_ep=1, ttft_s=0.3, tpot_s=0.05,
)  # fmt: skip


def test_an_fp8_label_on_a_block_scaled_checkpoint_is_block_scaled() -> None:
    # Qwen's -FP8 checkpoints carry 128 x 128 block scales (weight_block_size): what the
    # engines serve, and what picks vLLM's DeepGEMM MoE path.
    scheme = row_scheme(ROW)
    assert scheme.format(0, "experts") == FP8_BLOCK
    assert scheme.format(0, "attn") == FP8_BLOCK


def test_an_fp8_label_elsewhere_stays_per_tensor() -> None:
    row = dataclasses.replace(ROW, model_path="Qwen/Qwen3-235B-A22B")
    assert row_scheme(row).format(0, "experts") == FP8


def test_nvidia_modelopt_fp8_checkpoints_stay_per_tensor() -> None:
    # nvidia/Llama-3.1-8B-Instruct-FP8 is a ModelOpt export (quant_algo FP8: per-tensor
    # weight and activation scales), not block-scaled like Qwen's -FP8 checkpoints: an -FP8
    # name alone does not make a checkpoint block-scaled.
    row = dataclasses.replace(ROW, model_path="nvidia/Llama-3.1-8B-Instruct-FP8", moe_tp=1)
    assert row_scheme(row).format(0, "attn") == FP8
    assert row_scheme(row).format(0, "mlp") == FP8


def test_vllm_rows_at_the_engines_default_kv_dtype_read_bf16_kv(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`measured.VLLM_DEFAULT_KV_DTYPE` (on): vLLM's `--kv-cache-dtype auto` keeps KV in
    bf16 for fp8 weights; InferenceMAX's vLLM recipe sets fp8, TRT-LLM rows keep fp8."""
    from gpufleet.validation import measured

    fp8 = QuantScheme.of({"attn": FP8})
    rows = {
        "vllm": dataclasses.replace(ROW, backend="vllm", id="aic_row"),
        "imax": dataclasses.replace(ROW, backend="vllm", id="2026_04_06_llama_row"),
        "trtllm": dataclasses.replace(ROW, backend="trtllm", id="aic_row"),
    }
    got = {k: measured.row_kv_dtype(r, fp8) for k, r in rows.items()}
    assert got == {"vllm": "bf16", "imax": "fp8", "trtllm": "fp8"}
    monkeypatch.setattr(measured, "VLLM_DEFAULT_KV_DTYPE", False)  # as before wave 15
    assert {measured.row_kv_dtype(r, fp8) for r in rows.values()} == {"fp8"}
