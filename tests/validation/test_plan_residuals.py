"""benchmarks/plan_residuals.py: its shape test and its per-campaign groups (no timing)."""

from __future__ import annotations

from collections.abc import Iterator
from types import ModuleType

import pytest

from gpufleet.validation.measured import MeasuredRow

from .helpers import CONFIGS, SAMPLE, benchmark_module


@pytest.fixture(scope="module")
def residuals() -> Iterator[ModuleType]:
    with benchmark_module("plan_residuals") as module:
        yield module


def _row(osl: int, c: int, ttft_s: float, tpot_s: float = 0.01) -> MeasuredRow:
    return MeasuredRow(
        id=f"r{osl}-{c}", backend="trtllm", model_path="meta-llama/Llama-3.1-8B-Instruct",
        system="h100_sxm", gemm_quant="", moe_quant="", isl=1024, osl=osl, batch_size=c,
        tp=1, pp=1, attention_dp=1, moe_tp=1, moe_ep=1, ttft_s=ttft_s, tpot_s=tpot_s,
    )  # fmt: skip


def test_a_wait_of_one_completion_interval_reads_slope_one(residuals: ModuleType) -> None:
    # TTFT = 60 ms + osl x TPOT / c: every request waits for one other to finish.
    rows = [_row(osl, c, 0.06 + osl * 0.01 / c) for c in (8, 16) for osl in (128, 256, 512)]
    assert residuals.cell_slopes(rows) == pytest.approx([1.0, 1.0])


def test_ttft_that_ignores_the_output_length_reads_slope_zero(residuals: ModuleType) -> None:
    rows = [_row(osl, 8, 0.2) for osl in (128, 512, 2048)]
    assert residuals.cell_slopes(rows) == pytest.approx([0.0])


def test_cells_without_spread_in_output_length_give_no_slope(residuals: ModuleType) -> None:
    assert residuals.cell_slopes([_row(512, 8, 0.2)]) == []  # one output length
    assert residuals.osl_slope([(1.0, 0.2), (1.1, 0.3)]) is None  # x barely varies


def test_groups_are_campaigns_with_their_bias_and_spread(residuals: ModuleType) -> None:
    report, lines = residuals.run(SAMPLE, CONFIGS)
    assert report["rows_modelled"] == 8 and report["rows_unmodelled"] == 1
    assert len(lines) == 8 and len(lines[0]) == len(residuals.ROW_COLUMNS)
    groups = report["per_group"]
    assert sum(s["rows"] for s in groups.values()) == 8
    assert all(name.startswith(("vllm ", "sglang ", "trtllm ")) for name in groups)
    for s in groups.values():
        assert s["ttft_median_ape_pct"] >= 0 and s["ttft_spread_ape_pct"] >= 0
        assert s["osl_slope"] is None or s["osl_cells"] >= 1
    assert report["ttft_oracle_group_bias_ape_pct"] >= 0
    assert "| group (backend version model GPU layout) |" in residuals.markdown(report)


def test_low_load_gap_is_what_the_model_misses_with_few_clients(residuals: ModuleType) -> None:
    report, _ = residuals.run(SAMPLE, CONFIGS)
    gaps = [s["low_load_gap_ms"] for s in report["per_group"].values()]
    assert any(g is not None for g in gaps)
    assert set(report["low_load_gap_ms"]) == {"dense", "moe"}
    assert report["low_load_gap_ms"]["moe"] is None  # the sample holds only Llama rows
    assert residuals.low_load_gap_ms([]) is None
