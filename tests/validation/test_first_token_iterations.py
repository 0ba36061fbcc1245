"""The first-token cost in the engine's iterations (`BackendCalibration.first_token_iterations`):
each one holds a prompt's first token for one more decode iteration, wherever a serving
prediction is made (the planner's `predict_serving`, the measured rows' `model_row`)."""

from __future__ import annotations

import dataclasses
from types import MappingProxyType

import pytest

from gpufleet.perf.calibration import Calibration, default_calibration
from gpufleet.perf.step_time import LinearStepTimeModel
from gpufleet.plan.closed_loop import SchedulerShape, predict_closed_loop
from gpufleet.plan.layout import Layout
from gpufleet.plan.perf_serving import predict_serving, scheduler_for
from gpufleet.specs.catalog import load_model
from gpufleet.specs.gpus import load_gpu
from gpufleet.validation.measured import model_row, read_rows

from .helpers import SAMPLE

LINEAR = LinearStepTimeModel(base_s=0.01, per_token_s=2e-5, per_context_token_s=1e-8)


def _with_iterations(cal: Calibration, backend: str, k: float) -> Calibration:
    backends = dict(cal.backends)
    backends[backend] = dataclasses.replace(cal.backend(backend), first_token_iterations=k)
    return dataclasses.replace(cal, backends=MappingProxyType(backends))


def test_each_first_token_iteration_adds_one_decode_iteration_to_ttft() -> None:
    plain = predict_closed_loop(LINEAR, 1024, 256, 8, SchedulerShape())
    late = predict_closed_loop(LINEAR, 1024, 256, 8, SchedulerShape(first_token_iterations=2.0))
    assert late.ttft_s - plain.ttft_s == pytest.approx(2.0 * late.tpot_s, rel=0.05)
    assert late.tpot_s == pytest.approx(plain.tpot_s, rel=0.02)


def test_the_planner_reads_the_engines_calibrated_iterations() -> None:
    h200 = load_gpu("h200")
    cal = _with_iterations(default_calibration(), "sglang", 3.0)
    assert scheduler_for(h200, backend="sglang", calibration=cal).first_token_iterations == 3.0
    model = load_model("llama-3.1-8b")
    layout = Layout(tp=1, weight_dtype="bf16", kv_dtype="bf16")
    few = predict_serving(model, h200, layout, 1024, 256, 16, backend="sglang",
                          calibration=_with_iterations(cal, "sglang", 0.0))  # fmt: skip
    many = predict_serving(model, h200, layout, 1024, 256, 16, backend="sglang", calibration=cal)
    assert many.ttft_s - few.ttft_s == pytest.approx(3.0 * many.tpot_s, rel=0.1)


def test_measured_rows_are_predicted_with_the_engines_iterations() -> None:
    row = read_rows(SAMPLE)[0]
    base = _with_iterations(default_calibration(), row.backend, 0.0)
    few = model_row(row, base)
    many = model_row(row, _with_iterations(base, row.backend, 2.0))
    assert many.ttft_s - few.ttft_s == pytest.approx(2.0 * many.tpot_s, rel=0.1)
