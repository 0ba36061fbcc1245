"""benchmarks/plan_fold_residuals.py: a fold's held-out errors beside the in-sample ones,
per campaign and per engine, and the constants the fold moved (no timing)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from types import MappingProxyType, ModuleType
from typing import Any

import pytest

from gpufleet.perf.calibration import Calibration, default_calibration, prior_calibration
from gpufleet.plan.closed_loop import ServingPrediction
from gpufleet.validation import fit as fit_module
from gpufleet.validation import fit_starts
from gpufleet.validation.measured import MeasuredRow, RowPrediction

from .helpers import CONFIGS, SAMPLE, benchmark_module


@pytest.fixture(scope="module")
def folds() -> Iterator[ModuleType]:
    with benchmark_module("plan_fold_residuals") as module:
        yield module


def _pred(row_id: str, backend: str, ttft_s: float, measured_ttft_s: float = 1.0) -> RowPrediction:
    row = MeasuredRow(
        id=row_id, backend=backend, model_path="deepseek-ai/DeepSeek-V3", system="h200_sxm",
        gemm_quant="fp8", moe_quant="fp8", isl=1024, osl=1024, batch_size=4, tp=8, pp=1,
        attention_dp=1, moe_tp=8, moe_ep=1, ttft_s=measured_ttft_s, tpot_s=0.01,
    )  # fmt: skip
    serving = ServingPrediction(4, ttft_s, 0.01, 1.0, 1.0, 1.0, 4.0, 0.0, 0.1)
    return RowPrediction(row=row, ttft_s=ttft_s, tpot_s=0.01, serving=serving)


def test_an_engine_at_its_in_sample_error_shows_its_share_of_the_loss(folds: ModuleType) -> None:
    # The fold over-predicts SGLang's rows 2x; TRT-LLM's are as good as in-sample.
    fold = [_pred(f"s{i}", "sglang", 2.0) for i in range(3)] + [
        _pred(f"t{i}", "trtllm", 1.1) for i in range(2)
    ]
    shipped = [_pred(f"s{i}", "sglang", 1.05) for i in range(3)] + [
        _pred(f"t{i}", "trtllm", 1.1) for i in range(2)
    ]
    out = folds.compare(fold, shipped, {})
    assert out["rows"] == 5
    assert out["ttft_ape_pct"] == pytest.approx(100.0)
    assert out["ttft_in_sample_ape_pct"] == pytest.approx(5.0)
    swapped = out["ttft_ape_pct_with_engine_in_sample"]
    assert swapped["sglang"] == pytest.approx(5.0)  # the loss is all SGLang's
    assert swapped["trtllm"] == pytest.approx(100.0)
    campaigns = out["per_campaign"]
    assert len(campaigns) == 2 and all(" - DeepSeek-V3 h200_sxm " in c for c in campaigns)
    sglang = next(s for c, s in campaigns.items() if c.startswith("sglang"))
    assert sglang["ttft_bias_log"] > 0.6 and abs(sglang["ttft_in_sample_bias_log"]) < 0.1


def test_moved_constants_are_those_off_the_shipped_ones(folds: ModuleType) -> None:
    shipped = default_calibration()
    backends = dict(shipped.backends)
    sg = shipped.backend("sglang")
    backends["sglang"] = dataclasses.replace(sg, ttft_overhead_s=sg.ttft_overhead_s * 3)
    fold = dataclasses.replace(shipped, backends=MappingProxyType(backends))
    moved = folds.moved_constants(fold, shipped)
    assert [(m["constant"], m["backend"]) for m in moved] == [("ttft_overhead_s", "sglang")]
    assert moved[0]["ratio"] == pytest.approx(3.0, rel=1e-3)
    assert folds.moved_constants(shipped, shipped) == []


def test_each_fold_is_refitted_from_the_prior(
    folds: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each fold's first start is the prior; none is the shipped constants."""
    seen: list[Calibration] = []

    def recording_descend(
        search: Any, cal: Calibration, steps: Any, **_: Any
    ) -> tuple[Calibration, float]:
        seen.append(cal)
        return cal, 1.0

    def no_shipped() -> Calibration:
        raise AssertionError("a held-out refit read the shipped (all-rows) calibration")

    monkeypatch.setattr(fit_module, "descend", recording_descend)
    monkeypatch.setattr(fit_starts, "default_calibration", no_shipped)
    report = folds.run(SAMPLE, CONFIGS, rounds=1)
    assert (
        len(report["folds"]) == 2 and len(seen) == 8 and seen[0] == seen[4] == prior_calibration()
    )
    assert all(f["start"] == "prior" for f in report["folds"].values())  # first on a tie
    for f in report["folds"].values():
        assert f["rows"] >= 1 and f["per_campaign"] and "calibration" in f
    assert "### Held out:" in folds.markdown(report)
    only = folds.run(SAMPLE, CONFIGS, folds=["70B"], rounds=1)
    assert list(only["folds"]) == ["meta-llama/Llama-3.1-70B"]
    by_gpu = folds.run(SAMPLE, CONFIGS, rounds=1, by_gpu=True)
    assert sorted(by_gpu["folds"]) == ["h100_sxm", "h200_sxm"]  # tpu_v9's row is unmodelled
