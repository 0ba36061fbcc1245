"""Expert weights are read no faster than HBM peak, whatever the efficiencies multiply to."""

from __future__ import annotations

from types import MappingProxyType

from gpufleet.perf.calibration import (
    BOUNDS,
    BackendCalibration,
    Calibration,
    prior_calibration,
)
from gpufleet.perf.roofline import RooflineStepTimeModel
from gpufleet.perf.step_time import StepBatch
from gpufleet.plan.layout import Layout
from gpufleet.specs.catalog import load_model
from gpufleet.specs.gpus import load_gpu


def _decode_step_s(memory_efficiency: float, moe_efficiency: float) -> float:
    cal = Calibration(
        memory_efficiency=memory_efficiency,
        backends=MappingProxyType({"default": BackendCalibration(moe_efficiency=moe_efficiency)}),
    )
    model = RooflineStepTimeModel(
        load_model("Qwen/Qwen3-235B-A22B"),
        load_gpu("h200"),
        Layout(tp=4, pp=1, ep=4, weight_dtype="fp8"),
        calibration=cal,
    )
    return model.step_time_s(StepBatch(num_decode=64, decode_context_tokens=64 * 2000))


def test_moe_read_bandwidth_is_capped_at_hbm_peak() -> None:
    at_peak = _decode_step_s(0.95, 1.0 / 0.95)
    assert _decode_step_s(0.95, 1.149) == at_peak  # 1.09 x peak: capped at peak
    assert _decode_step_s(0.95, 1.0) > at_peak  # 0.95 x peak: slower


def test_moe_efficiency_bound_stays_below_peak_at_the_prior_copy_efficiency() -> None:
    prior = prior_calibration()
    high = BOUNDS["moe_efficiency"][1]
    assert high * prior.memory_efficiency <= 1.0
