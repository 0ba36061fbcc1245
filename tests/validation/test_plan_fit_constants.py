"""benchmarks/plan_fit_constants.py: which fitted constants the refits disagree on."""

from __future__ import annotations

from typing import Any

import pytest

from gpufleet.perf.calibration import BOUNDS

from .helpers import benchmark_module


def _start(skew: float, sglang_step_s: float) -> dict[str, Any]:
    return {
        "training_objective": 1.0,
        "constants": {
            "routing_skew": skew,
            "gemm_efficiency": 0.74,
            "backends": {
                "default": {"step_overhead_s": 0.02},
                "sglang": {"step_overhead_s": sglang_step_s},
            },
        },
    }


def test_a_constant_that_moves_between_folds_comes_first_and_fixed_ones_are_left_out() -> None:
    report = {
        "leave_one_model_out": {
            "per_group": {
                "a": {"start": "prior", "starts": {"prior": _start(1.5, 1e-3),
                                                   "midpoint": _start(0.0, 1e-3)}},
                "b": {"start": "midpoint", "starts": {"prior": _start(1.5, 2e-3),
                                                      "midpoint": _start(1.5, 2e-3)}},
            }
        }
    }  # fmt: skip
    with benchmark_module("plan_fit_constants") as m:
        rows = m.disagreement(report)
        assert [r["constant"] for r in rows] == ["sglang.step_overhead_s", "routing_skew"]
        skew = rows[1]
        assert skew["across_folds"] == 0.0  # kept at the upper bound in both folds
        assert skew["within_folds"] == pytest.approx(0.5)  # one fold's starts span it all
        assert m.log_position("routing_skew", BOUNDS["routing_skew"][1]) == pytest.approx(1.0)
        assert "sglang.step_overhead_s" in m.markdown(rows)
