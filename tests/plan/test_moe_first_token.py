"""MoE models' first-token time outside the GPU iterations (`moe_first_token_s`)."""

from __future__ import annotations

import dataclasses

import pytest

from gpufleet.perf.calibration import (
    BOUNDS,
    Calibration,
    default_calibration,
    prior_calibration,
)
from gpufleet.plan.layout import Layout
from gpufleet.plan.perf_serving import predict_serving
from gpufleet.specs.catalog import load_model
from gpufleet.specs.gpus import load_gpu

H200 = load_gpu("h200")
QWEN3_MOE = load_model("Qwen/Qwen3-235B-A22B")
LLAMA_70B = load_model("meta-llama/Llama-3.1-70B")
LAYOUT = Layout(tp=4, weight_dtype="fp8")


def _cal(moe_first_token_s: float):  # type: ignore[no-untyped-def]
    return dataclasses.replace(default_calibration(), moe_first_token_s=moe_first_token_s)


def test_first_token_overhead_adds_the_moe_part_to_moe_models_only() -> None:
    cal = _cal(0.1)
    engine_s = cal.backend("sglang").ttft_overhead_s
    assert cal.first_token_overhead_s("sglang", is_moe=True) == pytest.approx(engine_s + 0.1)
    assert cal.first_token_overhead_s("sglang", is_moe=False) == engine_s


@pytest.mark.parametrize("backend", ["vllm", "sglang", "trtllm"])
def test_moe_first_token_time_lengthens_moe_ttft_in_every_engine(backend: str) -> None:
    def ttft_s(model: object, extra_s: float) -> float:
        return predict_serving(
            model,
            H200,
            LAYOUT,
            1024,
            256,
            4,
            backend=backend,
            calibration=_cal(extra_s),  # type: ignore[arg-type]
        ).ttft_s

    # Outside the GPU's iterations: the request's TTFT grows by it (a little less, as the
    # slower cycle leaves slightly fewer decodes beside its prefill), nobody's GPU time.
    grown = ttft_s(QWEN3_MOE, 0.2) - ttft_s(QWEN3_MOE, 0.0)
    assert 0.19 < grown <= 0.2 + 1e-9
    assert ttft_s(LLAMA_70B, 0.2) == ttft_s(LLAMA_70B, 0.0)


def test_prior_assumes_no_moe_first_token_time_and_bounds_hold_it() -> None:
    """No engine documents it: the prior adds nothing, as does the dataclass default (for
    calibrations written before it existed)."""
    assert prior_calibration().moe_first_token_s == 0.0
    low, high = BOUNDS["moe_first_token_s"]
    assert low == 0.0 < high
    assert Calibration().first_token_overhead_s("vllm", is_moe=True) == (
        Calibration().first_token_overhead_s("vllm", is_moe=False)
    )
