"""benchmarks/plan_first_token.py: the gap it reports is the first-token cost the model
leaves out, in time and in decode iterations."""

from __future__ import annotations

from collections.abc import Iterator
from types import ModuleType

import pytest

from gpufleet.perf.calibration import default_calibration
from gpufleet.validation.measured import predict_rows, read_rows

from .helpers import SAMPLE, benchmark_module


@pytest.fixture(scope="module")
def bench() -> Iterator[ModuleType]:
    with benchmark_module("plan_first_token") as module:
        yield module


def test_the_zeroed_calibration_has_no_first_token_cost(bench: ModuleType) -> None:
    zero = bench.zeroed(default_calibration())
    assert zero.moe_first_token_s == 0.0
    for b in zero.backends.values():
        assert b.ttft_overhead_s == 0.0 and b.first_token_iterations == 0.0
    rows = read_rows(SAMPLE)
    full, _ = predict_rows(rows, default_calibration())
    gpu, _ = predict_rows(rows, zero)
    assert all(g.ttft_s < f.ttft_s for g, f in zip(gpu, full, strict=True))


def test_gaps_cover_every_modelled_row_once(bench: ModuleType) -> None:
    rows = read_rows(SAMPLE)
    gaps = bench.gaps(rows, default_calibration())
    modelled, _ = predict_rows(rows, default_calibration())
    assert sum(g["rows"] for g in gaps) == len(modelled)
    assert all(g["rows_low"] <= g["rows"] for g in gaps)
    assert "| campaign |" in bench.render(gaps, [], {"rows": 0})
