"""benchmarks/plan_moe_physics.py: its variants leave the shipped model as it was, and an
MoE prefill step never costs less for more tokens."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from types import ModuleType

import pytest

from gpufleet.perf import moe_traffic
from gpufleet.perf.calibration import default_calibration
from gpufleet.validation.measured import read_rows, resolve_model

from .helpers import SAMPLE, benchmark_module


@pytest.fixture(scope="module")
def physics() -> Iterator[ModuleType]:
    with benchmark_module("plan_moe_physics") as module:
        yield module


def test_prefill_steps_grow_with_their_tokens_in_every_variant(physics: ModuleType) -> None:
    dense = read_rows(SAMPLE)[0]  # vLLM Llama-70B on H100: its MoE twin, TRT-LLM Qwen3 EP 4
    moe = dataclasses.replace(dense, id="qwen3", backend="trtllm", moe_quant="fp8_block",
                              model_path="Qwen/Qwen3-235B-A22B-FP8", moe_tp=1, moe_ep=4)  # fmt: skip
    assert resolve_model(moe.model_path).moe is not None
    rows = [dense, moe]
    steps = physics.step_rows(rows, default_calibration())
    assert len(steps) == 1 and not moe_traffic.MOE_ACTIVATION_TRAFFIC  # switched back off
    for s in steps:
        shipped, at_prior, traffic = (s[v] for v in physics.VARIANTS)
        for ms in (shipped, at_prior, traffic):
            assert ms[0] <= ms[1] <= ms[2]  # 128, 1024, 8192 prompt tokens
        assert traffic[2] > at_prior[2]  # the 8192-token prefill pays the traffic
        assert traffic[3] == pytest.approx(at_prior[3], rel=0.02)  # a decode barely
