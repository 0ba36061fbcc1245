"""benchmarks/plan_fixed_part.py: a held-out fold's TTFT with its fixed first-token part
swapped for the shipped one (no timing)."""

from __future__ import annotations

import dataclasses
import json
import statistics
from collections.abc import Iterator
from pathlib import Path
from types import MappingProxyType, ModuleType

import pytest

from gpufleet.perf.calibration import Calibration, calibration_to_dict, default_calibration
from gpufleet.validation.measured import predict_rows, read_rows

from .helpers import SAMPLE, benchmark_module


@pytest.fixture(scope="module")
def fixed_part() -> Iterator[ModuleType]:
    with benchmark_module("plan_fixed_part") as module:
        yield module


def _with_overhead(cal: Calibration, backend: str, value: float) -> Calibration:
    backends = dict(cal.backends)
    backends[backend] = dataclasses.replace(cal.backend(backend), ttft_overhead_s=value)
    return dataclasses.replace(cal, backends=MappingProxyType(backends))


def test_the_swap_replaces_only_the_fixed_part(fixed_part: ModuleType) -> None:
    shipped = default_calibration()
    fold = _with_overhead(shipped, "trtllm", shipped.backend("trtllm").ttft_overhead_s + 0.2)
    rows = [r for r in read_rows(SAMPLE) if r.backend == "trtllm"]
    preds, _ = predict_rows(rows, fold)
    assert preds
    for p in preds:
        swapped = fixed_part.with_fixed_part(p, fold, shipped)
        assert swapped == pytest.approx(p.ttft_s - 0.2)
        ttft, ttft_swapped, tpot = fixed_part.row_errors(p, fold, shipped)
        assert ttft == p.ttft_ape_pct and tpot == p.tpot_ape_pct
        assert ttft_swapped == pytest.approx(abs(swapped / p.row.ttft_s - 1) * 100)
    # The fold's own fixed part swapped for itself changes nothing.
    same = [fixed_part.row_errors(p, fold, fold) for p in preds]
    assert all(e[0] == pytest.approx(e[1]) for e in same)
    assert fixed_part.score([])["rows"] == 0


def test_the_report_reads_each_folds_kept_constants(fixed_part: ModuleType, tmp_path: Path) -> None:
    """A report whose H100 fold kept constants 0.2 s slower to the first token in TRT-LLM:
    the fold's rows are scored with those constants, and with the shipped fixed part."""
    shipped = default_calibration()
    slow = _with_overhead(shipped, "trtllm", shipped.backend("trtllm").ttft_overhead_s + 0.2)
    report = {
        "leave_one_gpu_out": {
            "per_group": {
                "h100_sxm": {
                    "start": "prior",
                    "starts": {"prior": {"constants": calibration_to_dict(slow)}},
                },
            }
        }
    }
    path = tmp_path / "report.json"
    path.write_text(json.dumps(report))
    out = fixed_part.run(SAMPLE, json.loads(path.read_text()))
    h100 = out["leave_one_gpu_out"]["per_group"]["h100_sxm"]
    rows = [r for r in read_rows(SAMPLE) if r.system == "h100_sxm"]
    preds, _ = predict_rows(rows, shipped)
    fold_preds, _ = predict_rows(rows, slow)
    assert h100["rows"] == len(preds) == 6
    assert h100["trtllm_ttft_overhead_ms"] == pytest.approx(
        round((shipped.backend("trtllm").ttft_overhead_s + 0.2) * 1e3, 1)
    )
    swapped = [fixed_part.with_fixed_part(p, slow, shipped) for p in fold_preds]
    want = statistics.median(
        abs(t / p.row.ttft_s - 1) * 100 for t, p in zip(swapped, fold_preds, strict=True)
    )
    assert h100["ttft_shipped_fixed_ape_pct"] == pytest.approx(round(want, 1))
    assert h100["ttft_ape_pct"] == pytest.approx(
        round(statistics.median(p.ttft_ape_pct for p in fold_preds), 1)
    )
    assert h100["ttft_ape_pct"] != h100["ttft_shipped_fixed_ape_pct"]
    assert out["leave_one_gpu_out"]["overall"]["rows"] == 6
    assert "leave_one_model_out" not in out
    md = fixed_part.markdown(out)
    assert "h100_sxm | 6 | prior" in md
