"""Engines that overlap their host loop with the GPU (SGLang, TRT-LLM by default) take the
longer of the loop and the iteration in series, not their sum (`perf.host_overlap`)."""

from __future__ import annotations

import dataclasses
from types import MappingProxyType

import pytest

from gpufleet.perf.calibration import BackendCalibration, Calibration
from gpufleet.perf.roofline import RooflineStepTimeModel
from gpufleet.perf.step_time import StepBatch
from gpufleet.plan.engines import engine_rules
from gpufleet.plan.layout import Layout
from gpufleet.plan.perf_serving import layout_step_model
from gpufleet.specs.catalog import load_model
from gpufleet.specs.gpus import load_gpu

STEP_S, SEQ_S, LOOP_SEQ_S = 1e-3, 5e-6, 50e-6  # in series; the host loop per request


def _models() -> tuple[RooflineStepTimeModel, RooflineStepTimeModel]:
    backend = BackendCalibration(
        step_overhead_s=STEP_S, seq_overhead_s=SEQ_S, host_seq_overhead_s=LOOP_SEQ_S
    )
    cal = Calibration(backends=MappingProxyType({"default": backend}))
    model, gpu, layout = load_model("meta-llama/Llama-3.1-8B"), load_gpu("h200"), Layout(tp=8)
    serial, overlapped = (
        RooflineStepTimeModel(model, gpu, layout, calibration=cal, host_overlap=overlap)
        for overlap in (False, True)
    )
    return serial, overlapped


def test_a_host_bound_iteration_lasts_the_host_loop() -> None:
    """512 requests of an 8B model on 8 GPUs: the GPU's decode step is a few ms, the host
    loop's turn of 512 requests 25.6 ms; the iteration lasts the loop, not the sum."""
    serial, overlapped = _models()
    batch = StepBatch(num_decode=512, decode_context_tokens=512 * 1500)
    loop_s = LOOP_SEQ_S * 512
    assert serial.step_time_s(batch) < loop_s
    assert overlapped.step_time_s(batch) == loop_s
    assert overlapped.breakdown_s(batch)["total_s"] == loop_s
    # the decode-run fast path gives the same floats
    assert overlapped.decode_step_times_s(512, 512 * 1500, 3) == [
        overlapped.step_time_s(StepBatch(num_decode=512, decode_context_tokens=512 * c))
        for c in (1500, 1501, 1502)
    ]


def test_a_gpu_bound_iteration_hides_the_host_loop() -> None:
    serial, overlapped = _models()
    for batch in (
        StepBatch(num_decode=8, decode_context_tokens=8 * 1500),
        StepBatch(
            prefill_tokens=(8192,),
            prefill_context_tokens=(0,),
            num_decode=4,
            decode_context_tokens=4 * 2000,
        ),
    ):
        assert serial.step_time_s(batch) > LOOP_SEQ_S * batch.num_seqs
        assert overlapped.step_time_s(batch) == serial.step_time_s(batch)


@pytest.mark.parametrize(("engine", "overlap"), [("vllm", False), ("sglang", True),
                                                 ("trtllm", True)])  # fmt: skip
def test_the_engines_defaults_say_which_overlap(engine: str, overlap: bool) -> None:
    gpu, model = load_gpu("h200"), load_model("meta-llama/Llama-3.1-8B")
    assert engine_rules(engine, gpu).overlap_scheduling is overlap
    assert layout_step_model(model, gpu, Layout(tp=1), backend=engine)._host_overlap is overlap
    rules = dataclasses.replace(engine_rules(engine, gpu), overlap_scheduling=True)
    recipe = layout_step_model(model, gpu, Layout(tp=1), backend=engine, rules=rules)
    assert recipe._host_overlap  # vLLM launched with --async-scheduling too
