"""benchmarks/plan_row_feasibility.py: its per-row bound and its tables (no timing)."""

from __future__ import annotations

from collections.abc import Iterator
from types import ModuleType

import pytest

from gpufleet.validation.measured import MeasuredRow

from .helpers import benchmark_module


@pytest.fixture(scope="module")
def feas() -> Iterator[ModuleType]:
    with benchmark_module("plan_row_feasibility") as module:
        yield module


def _row(tpot_s: float) -> MeasuredRow:
    return MeasuredRow(
        id=f"r{tpot_s}", backend="vllm", model_path="nvidia/Llama-3.1-8B-Instruct-FP8",
        system="h200_sxm", gemm_quant="fp8", moe_quant="fp8", isl=2000, osl=100,
        batch_size=64, tp=1, pp=1, attention_dp=1, moe_tp=1, moe_ep=1, ttft_s=0.12,
        tpot_s=tpot_s,
    )  # fmt: skip


def test_only_rows_above_one_are_listed(feas: ModuleType) -> None:
    fast, slow = feas.row_bound(_row(0.00974)), feas.row_bound(_row(0.03))
    assert fast["busy"] > 1.0 > slow["busy"]
    assert fast["busy_no_allreduce"] == pytest.approx(fast["busy"])  # TP 1: no all-reduce
    table = feas.markdown([fast, slow])
    assert "| vllm Llama-3.1-8B-Instruct-FP8 h200_sxm | " in table
    assert table.count("2000x100 c64 tp1 |") == 2  # the campaign's worst and the one row above 1
