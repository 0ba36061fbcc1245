"""An MoE layer's activation traffic between its kernels (`perf.moe_traffic`), when on."""

from __future__ import annotations

import pytest

from gpufleet.perf import moe_traffic
from gpufleet.perf.roofline import ACT_BYTES, RooflineStepTimeModel
from gpufleet.perf.step_time import StepBatch
from gpufleet.plan.layout import Layout
from gpufleet.specs.catalog import load_model
from gpufleet.specs.gpus import load_gpu

MODEL = "deepseek-ai/DeepSeek-V3"
PREFILL = StepBatch(prefill_tokens=(8192,), prefill_context_tokens=(0,))
DECODE = StepBatch(num_decode=16, decode_context_tokens=16 * 2000)


def _steps_s(on: bool, monkeypatch: pytest.MonkeyPatch) -> tuple[float, float]:
    monkeypatch.setattr(moe_traffic, "MOE_ACTIVATION_TRAFFIC", on)
    model = RooflineStepTimeModel(  # TP 8, experts sliced over the 8 GPUs (MoE TP 8)
        load_model(MODEL), load_gpu("h200"), Layout(tp=8, pp=1, ep=1, weight_dtype="fp8")
    )
    return model.step_time_s(PREFILL), model.step_time_s(DECODE)


def test_each_assignment_streams_its_activations_between_the_grouped_gemms() -> None:
    # DeepSeek-V3 at MoE TP 8: hidden 7168, a 2048 / 8 = 256-wide slice of each expert,
    # top 8: the gated activation reads 2 x 256 and writes 256, the combine reads the
    # 7168-wide partial and writes 7168 / 8 of the token's sum.
    monkeypatch = pytest.MonkeyPatch()
    monkeypatch.setattr(moe_traffic, "MOE_ACTIVATION_TRAFFIC", True)
    in_gemms, between = moe_traffic.moe_activation_bytes(7168, 256.0, 8, ACT_BYTES)
    monkeypatch.undo()
    assert between == (7168 + 896 + 3 * 256) * 2.0
    assert in_gemms == (2 * 7168 + 3 * 256) * 2.0
    assert moe_traffic.moe_activation_bytes(7168, 256.0, 8, ACT_BYTES) == (2 * 7168 * 2.0, 0.0)


def test_an_moe_prefill_pays_the_traffic_and_a_decode_barely(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    prefill_off, decode_off = _steps_s(False, monkeypatch)
    prefill_on, decode_on = _steps_s(True, monkeypatch)
    # At least the traffic between the kernels at HBM peak: 58 MoE layers x 8192 tokens x
    # 8 assignments (all on every GPU under MoE TP) x 17.7 KB.
    between_s = 58 * 8192 * 8 * (7168 + 896 + 768) * 2.0 / (4800e9)
    assert prefill_on - prefill_off >= between_s
    assert decode_on == pytest.approx(decode_off, rel=0.01)
