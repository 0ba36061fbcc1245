"""Rows whose measured rate the labelled prompts cannot reach are flagged, and still
modelled and scored (wave 14)."""

from __future__ import annotations

import pytest

from gpufleet.specs.gpus import load_gpu
from gpufleet.validation.feasibility import infeasible_summary, prompt_busy_fraction
from gpufleet.validation.measured import (
    MeasuredRow,
    model_row,
    predict_rows,
    resolve_model,
    row_layout,
    row_scheme,
)


def _row(**kw: object) -> MeasuredRow:
    # The shared CSV's vLLM 0.12 Llama-3.1-8B-Instruct-FP8 row at 2000 x 100, 64 clients,
    # one H200: 64 / (0.1217 + 99 x 0.00974) = 58.9 requests/s, 118k prompt tokens/s.
    base: dict[str, object] = dict(
        id="fp8-2000x100-c64", backend="vllm", model_path="nvidia/Llama-3.1-8B-Instruct-FP8",
        system="h200_sxm", gemm_quant="fp8", moe_quant="fp8", isl=2000, osl=100,
        batch_size=64, tp=1, pp=1, attention_dp=1, moe_tp=1, moe_ep=1, ttft_s=0.12173,
        tpot_s=0.00974,
    )  # fmt: skip
    base.update(kw)
    return MeasuredRow(**base)  # type: ignore[arg-type]


def _busy(row: MeasuredRow) -> float:
    model = resolve_model(row.model_path)
    gpu = load_gpu(row.system)
    how = row_layout(row, model, gpu)
    return prompt_busy_fraction(row, model, gpu, how.layout, row_scheme(row), how.clients_per_rank)


def test_a_rate_beyond_the_best_kernels_is_flagged_and_still_scored() -> None:
    # 118k tokens/s x ~14.5 GFLOP a token = 1.7 PFLOP/s of GEMMs on one GPU: more than the
    # best dense GEMM an H200 ran (0.78 of the 989 TFLOP/s bf16 peak, 0.71 of fp8's 1979).
    row = _row()
    assert _busy(row) > 1.1
    done, skipped = predict_rows([row])
    assert not skipped and done[0].row is row  # no row of the shared data is left out
    assert "busy on the 2000-token prompts" in done[0].infeasible
    summary = infeasible_summary(done)
    assert summary["rows"] == 1 and summary["ids"][0][0] == row.id
    # (the summary computes the APE its own way: equal up to rounding)
    assert summary["tpot_median_ape"] == pytest.approx(100 * abs(done[0].tpot_s / row.tpot_s - 1))


def test_the_same_row_at_a_reachable_rate_is_modelled() -> None:
    # Half the rate (TPOT doubled): half the busy fraction, and the row is predicted.
    slow = _row(tpot_s=2 * 0.00974, ttft_s=2 * 0.12173)
    assert 0.4 < _busy(slow) < 0.7
    assert model_row(slow).infeasible == ""
    assert infeasible_summary([model_row(slow)]) == {"rows": 0, "ids": []}


def test_the_bound_counts_the_tp_all_reduces() -> None:
    # The same rate per GPU at TP 4 (4x the clients) carries the prompts' all-reduces too.
    one = _busy(_row(tpot_s=0.02, ttft_s=0.2))
    four = _busy(_row(tpot_s=0.02, ttft_s=0.2, tp=4, batch_size=4 * 64))
    assert four > one
