"""The launch recipes behind measured rows (validation.recipes)."""

from __future__ import annotations

import dataclasses

import pytest

from gpufleet.perf.calibration import default_calibration
from gpufleet.plan.engines import EngineRules, engine_rules
from gpufleet.specs.gpus import load_gpu
from gpufleet.validation import measured, recipes
from gpufleet.validation.measured import MeasuredRow, model_row
from gpufleet.validation.recipes import batch_wait_rules, is_inferencemax, recipe_rules
from gpufleet.validation.rows import resolve_model

H200 = load_gpu("h200_sxm")


def _row(**kw: object) -> MeasuredRow:
    base: dict[str, object] = dict(
        id="2026_04_06_llama_3_1_70b_h200_sxm_trtllm_fp8_agg_1024x1024_c4_tp2_ep1_1",
        backend="trtllm", model_path="meta-llama/Llama-3.1-70B", system="h200_sxm",
        gemm_quant="fp8", moe_quant="", isl=1024, osl=1024, batch_size=4, tp=2, pp=1,
        attention_dp=1, moe_tp=2, moe_ep=1, ttft_s=0.34, tpot_s=0.012,
    )  # fmt: skip
    base.update(kw)
    return MeasuredRow(**base)  # type: ignore[arg-type]


def test_inferencemax_trtllm_llama_1k1k_below_tp8_waits_for_batches() -> None:
    trt = engine_rules("trtllm", H200, tp=2)
    rules = recipe_rules(_row(), trt)
    assert (rules.batch_wait_iters, rules.batch_wait_max_tokens_ratio) == (20, 0.9)
    assert rules.max_num_batched_tokens == 16384
    # Not at TP 8, not for 1k/8k, not for the aiconfigurator campaigns' rows.
    assert recipe_rules(_row(tp=8), trt).batch_wait_iters == 0
    assert recipe_rules(_row(osl=8192), trt).batch_wait_iters == 0
    assert recipe_rules(_row(id="meta_llama_x_h100_sxm_trtllm_agg_1024x1024_c4"), trt) == trt


def test_batch_wait_shows_in_the_row_prediction() -> None:
    # The recipe's 20-iteration hold is most of this row's TTFT (measured 340 ms).
    held = model_row(_row(), recipes=True)
    free = model_row(_row(id=_AICONFIGURATOR_ID))  # the engine's defaults: no batch waiting
    assert held.ttft_s - free.ttft_s > 15 * held.tpot_s


_AICONFIGURATOR_ID = "meta_llama_x_h200_sxm_trtllm_agg_1024x1024_c4_tp2_epnone_1"


def test_batch_wait_is_modelled_without_the_other_recipes() -> None:
    # The hold is what those rows' servers did to every prompt: predicted by default, with
    # the engine's own token budget (the recipe's 16384 only under recipes=True).
    rules = batch_wait_rules(_row(), engine_rules("trtllm", H200, tp=2))
    assert (rules.batch_wait_iters, rules.max_num_batched_tokens) == (20, 8192)
    default = model_row(_row())
    assert default.ttft_s - model_row(_row(id=_AICONFIGURATOR_ID)).ttft_s > 15 * default.tpot_s
    trt = engine_rules("trtllm", H200, tp=8)
    for other in (_row(tp=8), _row(osl=8192), _row(id=_AICONFIGURATOR_ID)):
        assert batch_wait_rules(other, trt) == trt
    vllm = engine_rules("vllm", H200, tp=2)
    assert batch_wait_rules(_row(backend="vllm"), vllm) == vllm


def test_inferencemax_rows_are_told_by_their_ids() -> None:
    assert is_inferencemax(_row())
    assert is_inferencemax(_row(id="dsr1_h200_trtllm_fp8_agg_1024x1024_c4_cfg181"))
    assert not is_inferencemax(_row(id="meta_llama_x_h100_sxm_trtllm_agg_1024x128_c8"))


def test_trtllm_deepseek_recipe_sizes_the_token_budget_by_concurrency() -> None:
    row = _row(
        id="2026_04_06_deepseek_r1_h200_sxm_trtllm_fp8_agg_1024x1024_c64_tp8_ep8_1",
        model_path="deepseek-ai/DeepSeek-R1",
    )
    rules = recipe_rules(row, engine_rules("trtllm", H200, tp=8))
    assert rules.max_num_batched_tokens == (64 + 1024 + 127) // 64 * 64
    assert rules.batch_wait_iters == 0


def test_vllm_and_sglang_recipes() -> None:
    v = recipe_rules(_row(backend="vllm", id="2026_04_06_llama_3_1_70b_h200_sxm_vllm_fp8_agg_1024x1024_c16_tp4_ep1_1"), engine_rules("vllm", H200))  # fmt: skip
    assert v.overlap_scheduling and v.max_num_seqs == 16
    s = recipe_rules(_row(backend="sglang", osl=8192, id="dsr1_h200_sglang_fp8_agg_1024x8192_c4_cfg81"), engine_rules("sglang", H200, tp=8))  # fmt: skip
    assert s.max_num_batched_tokens == 32768 and s.max_num_seqs == 256


def test_inferencemax_trtllm_deepseek_with_attention_dp_balances_its_ranks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # dsr1_fp8_h200_trt_slurm.sh: attention DP above 64 clients (32 for 8k/1k), with
    # attention_dp_config {enable_balance: true, timeout_iters: 60}: a recipe option.
    deepseek: dict[str, object] = dict(
        model_path="deepseek-ai/DeepSeek-R1", gemm_quant="fp8", moe_quant="fp8_block",
        batch_size=16, tp=1, attention_dp=8, moe_tp=1, moe_ep=8, ttft_s=3.2, tpot_s=0.0315,
    )  # fmt: skip
    row = _row(id="2026_03_25_deepseek_r1_h200_sxm_trtllm_fp8_agg_1024x1024_c128_tp1", **deepseek)
    trt = engine_rules("trtllm", H200, tp=1, dp=8)
    assert recipe_rules(row, trt).adp_balance_timeout_iters == 60
    assert batch_wait_rules(row, trt) == trt  # not applied by default
    # Not without attention DP, not for the aiconfigurator campaigns' rows.
    no_dp = dict(deepseek, tp=8, attention_dp=1)
    assert recipe_rules(_row(id=row.id, **no_dp), trt).adp_balance_timeout_iters == 0
    other = _row(id="deepseek_r1_h200_sxm_trtllm_agg_1024x1024_c16_tp1_dp8", **deepseek)
    assert recipe_rules(other, trt) == trt
    # The hold is most of the row's TTFT: tens of iterations at 16 clients per rank.
    held = model_row(row, recipes=True)

    def without_balance(r: MeasuredRow, rules: EngineRules) -> EngineRules:
        return dataclasses.replace(recipe_rules(r, rules), adp_balance_timeout_iters=0)

    monkeypatch.setattr(measured, "recipe_rules", without_balance)
    assert held.ttft_s - model_row(row, recipes=True).ttft_s > 20 * held.tpot_s


_MTP_ID = "2026_03_25_deepseek_r1_h200_sxm_trtllm_fp8_agg_1024x1024_c4_tp8_0_ep8_0_1252"
_PLAIN_ID = "dsr1_h200_trtllm_fp8_agg_1024x1024_c4_cfg181"


def _deepseek(**kw: object) -> MeasuredRow:
    base: dict[str, object] = dict(
        id=_MTP_ID, model_path="deepseek-ai/DeepSeek-R1", gemm_quant="fp8", moe_quant="fp8",
        tp=8, moe_tp=1, moe_ep=8, ttft_s=0.494, tpot_s=0.00858,
    )  # fmt: skip
    base.update(kw)
    return _row(**base)


def test_the_inferencemax_mtp_sweep_runs_mtp3_and_mtp1_under_attention_dp(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(recipes, "MTP_SWEEP_MODELLED", True)
    assert recipes.runs_mtp_recipe(_deepseek())
    trt = engine_rules("trtllm", H200, tp=8)
    assert recipes.speculative_rules(_deepseek(), trt).mtp_draft_tokens == 3
    adp = _deepseek(tp=1, attention_dp=8, batch_size=16)
    assert recipes.speculative_rules(adp, trt).mtp_draft_tokens == 1
    # The plain sweep's rows (dsr1_ ids; the dated campaign's EP 1 copies), other models
    # and other engines run no drafts.
    for plain in (
        _deepseek(id=_PLAIN_ID, tp=64, moe_tp=8),
        _deepseek(moe_tp=8, moe_ep=1),
        _row(),
        _deepseek(backend="sglang"),
    ):
        assert recipes.speculative_rules(plain, trt) == trt


def test_mtp_shows_in_the_row_prediction(monkeypatch: pytest.MonkeyPatch) -> None:
    # Switched off (`MTP_SWEEP_MODELLED`), the row is predicted as a plain one.
    monkeypatch.setattr(recipes, "MTP_SWEEP_MODELLED", False)
    assert model_row(_deepseek()).tpot_s == model_row(_deepseek(id=_PLAIN_ID)).tpot_s
    monkeypatch.setattr(recipes, "MTP_SWEEP_MODELLED", True)
    # At DeepSeek's own acceptance (the prior: 0.85), not whatever a fit left.
    cal = dataclasses.replace(default_calibration(), mtp_acceptance_rate=0.85)
    mtp = model_row(_deepseek(), cal)
    plain = model_row(_deepseek(id=_PLAIN_ID), cal)
    # The same layout and load, but each iteration emits 1 + a + a^2 + a^3 tokens.
    assert mtp.tpot_s < 0.8 * plain.tpot_s


def test_inferencemax_trtllm_deepseek_rows_run_their_experts_expert_parallel(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # InferenceMAX's scripts set EP_SIZE = TP: a row labelled MoE TP 8 x EP 1 ran EP 8.
    cfg83 = _deepseek(id="dsr1_h200_trtllm_fp8_agg_1024x1024_c4_cfg83", moe_tp=8, moe_ep=1)
    assert recipes.recipe_expert_parallel(cfg83)
    model = resolve_model(cfg83.model_path)
    # Off by default (`EXPERT_PARALLEL_AS_LAUNCHED`): read as labelled.
    monkeypatch.setattr(measured, "EXPERT_PARALLEL_AS_LAUNCHED", False)
    assert measured.row_layout(cfg83, model, H200).layout.ep == 1
    monkeypatch.setattr(measured, "EXPERT_PARALLEL_AS_LAUNCHED", True)
    assert measured.row_layout(cfg83, model, H200).layout.ep == 8
    # Labelled EP already, other engines, other campaigns: as labelled.
    assert not recipes.recipe_expert_parallel(_deepseek())
    sglang = _deepseek(id="dsr1_h200_sglang_fp8_agg_1024x1024_c4_cfg81", backend="sglang",
                       moe_tp=8, moe_ep=1)  # fmt: skip
    assert measured.row_layout(sglang, model, H200).layout.ep == 1
    other = _deepseek(id="deepseek_v3_h200_sxm_trtllm_agg_1024x1024_c4", moe_tp=8, moe_ep=1)
    assert measured.row_layout(other, model, H200).layout.ep == 1
