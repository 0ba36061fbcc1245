"""gpt-oss' MXFP4 experts as vLLM's MoE backends hold them, by GPU and version (wave 19,
issue 14): Marlin's padding before vLLM shipped triton_kernels, Triton's layouts on Hopper
after (scales held twice, fp32 biases, the newer value pre-pad), against logged weights."""

from __future__ import annotations

import pytest

from gpufleet.plan.layout import Layout
from gpufleet.plan.memory import GIB, memory_breakdown
from gpufleet.plan.mxfp4_experts import mxfp4_backend
from gpufleet.plan.weights import stage_weight_bytes
from gpufleet.specs import load_gpu, load_model

H100 = "h100-sxm"


def _weights_gib(name: str, tp: int, gpu: str, version: tuple[int, ...]) -> float:
    model = load_model(name)
    layout = Layout(tp=tp, weight_dtype="mxfp4")
    return stage_weight_bytes(model, layout, 0, load_gpu(gpu), version) / GIB


def test_backend_by_gpu_and_version() -> None:
    h100, a100, b200 = load_gpu(H100), load_gpu("a100-80gb"), load_gpu("b200")
    assert mxfp4_backend(h100, (0, 10, 1)) == "marlin"  # no triton_kernels in the install
    assert mxfp4_backend(h100, (0, 11, 0)) == "marlin"
    assert mxfp4_backend(h100, (0, 14, 1)) == "triton"  # vendored since #28788
    assert mxfp4_backend(h100, (1,)) == "triton"
    assert mxfp4_backend(a100, (0, 19, 0)) == "marlin"  # Triton needs sm90+
    assert mxfp4_backend(b200, (0, 19, 0)) == "flashinfer_trtllm"


@pytest.mark.parametrize(
    ("name", "tp", "version", "logged"),
    [
        # vllm-project/vllm#23278: "Using Marlin backend", Model loading took 65.9651 GiB
        ("openai/gpt-oss-120b", 1, (0, 10, 1), 65.9651),
        # vllm-project/vllm#33155: Triton backend, 64.38 GiB (Marlin's padding gave +2.3 %)
        ("openai/gpt-oss-120b", 1, (0, 14, 1), 64.38),
        # llm-d-planner v0.19.0 logs: "Using 'TRITON' Mxfp4 MoE backend"
        ("openai/gpt-oss-20b", 1, (0, 19, 0), 13.64),
        ("openai/gpt-oss-20b", 2, (0, 19, 0), 7.01),
    ],
)
def test_weights_as_each_backend_holds_them(
    name: str, tp: int, version: tuple[int, ...], logged: float
) -> None:
    assert _weights_gib(name, tp, H100, version) == pytest.approx(logged, rel=0.006)


def test_triton_holds_scales_twice_and_newer_triton_kernels_prepads_values() -> None:
    """gpt-oss-20b, one H100: Triton without the pre-pad (0.14) holds its 2880-wide experts
    unpadded plus a swizzled copy of the scales; the pre-pad (0.19) adds 32 bytes to each
    1440-byte row of both GEMMs: 24 layers x 32 experts x 32 x (5760 + 2880) B."""
    old = _weights_gib("openai/gpt-oss-20b", 1, H100, (0, 14, 1))
    new = _weights_gib("openai/gpt-oss-20b", 1, H100, (0, 19, 0))
    assert (new - old) * GIB == pytest.approx(24 * 32 * 32 * (5760 + 2880))
    marlin = _weights_gib("openai/gpt-oss-20b", 1, H100, (0, 11, 0))
    assert marlin > new > old


def test_vllm_memory_breakdown_uses_the_backend_of_its_version_other_engines_do_not() -> None:
    model, gpu = load_model("openai/gpt-oss-120b"), load_gpu(H100)
    layout = Layout(weight_dtype="mxfp4")
    at = {
        v: memory_breakdown(model, gpu, layout, 8192, engine_version=v).weights_bytes / GIB
        for v in ((0, 10, 1), (0, 14, 1))
    }
    assert at[(0, 10, 1)] == pytest.approx(65.97, rel=0.006)
    assert at[(0, 14, 1)] == pytest.approx(64.38, rel=0.006)
    sglang = memory_breakdown(model, gpu, layout, 8192, engine="sglang").weights_bytes
    assert sglang == stage_weight_bytes(model, layout, 0, gpu)  # unchanged for SGLang
