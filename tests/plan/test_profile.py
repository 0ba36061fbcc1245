"""replica_profile: what the simulated replica needs to run a layout."""

from __future__ import annotations

import pytest

from gpufleet.errors import UserError
from gpufleet.perf.step_time import StepBatch, StepTimeModel
from gpufleet.plan.profile import ReplicaProfile, replica_profile


def test_llama_8b_on_one_h100_with_vllm_defaults() -> None:
    p = replica_profile("meta-llama/Llama-3.1-8B", "h100-sxm", max_model_len=8192)
    assert isinstance(p, ReplicaProfile)
    assert isinstance(p.step_time_model, StepTimeModel)
    assert p.block_size == 16
    assert p.max_num_batched_tokens == 8192  # vLLM V1 serving default on >= 70 GiB GPUs
    assert p.max_num_seqs == 256
    assert p.pipeline_stages == 1
    assert p.max_model_len == 8192
    # ~72 GB usable - 16 GB weights - reserves, at 128 KiB per token: ~400k tokens.
    assert 300_000 < p.num_gpu_blocks * p.block_size < 500_000
    assert p.step_time_model.step_time_s(StepBatch(num_decode=4, decode_context_tokens=4000)) > 0


def test_small_gpu_gets_the_small_token_budget() -> None:
    p = replica_profile("Qwen/Qwen3-8B", "l40s", quant="fp8", max_model_len=4096)
    assert p.max_num_batched_tokens == 2048


def test_fp8_kv_doubles_the_blocks() -> None:
    bf16 = replica_profile("meta-llama/Llama-3.1-8B", "h100-sxm", max_model_len=8192)
    fp8 = replica_profile("meta-llama/Llama-3.1-8B", "h100-sxm", kv_dtype="fp8", max_model_len=8192)
    assert fp8.num_gpu_blocks == pytest.approx(2 * bf16.num_gpu_blocks, rel=0.01)


def test_pipeline_parallel_profile_exposes_stages() -> None:
    p = replica_profile("meta-llama/Llama-3.1-405B", "h100-sxm", tp=8, pp=2, quant="fp8",
                        max_model_len=8192)  # fmt: skip
    assert p.pipeline_stages == 2
    assert p.num_gpu_blocks > 0


def test_default_max_model_len_is_lowered_to_the_kv_cache() -> None:
    p = replica_profile("meta-llama/Llama-3.1-70B", "h100-sxm", tp=2, quant="fp8")
    assert p.max_model_len <= 131072
    assert p.max_model_len <= p.num_gpu_blocks * p.block_size


def test_what_does_not_fit_is_a_user_error() -> None:
    with pytest.raises(UserError, match="layout"):
        replica_profile("meta-llama/Llama-3.1-70B", "h100-sxm")  # 141 GB of bf16 weights
    with pytest.raises(UserError, match="quant"):
        replica_profile("meta-llama/Llama-3.1-8B", "h100-sxm", quant="fp3")
    with pytest.raises(UserError, match="max_model_len"):
        replica_profile("meta-llama/Llama-3.1-8B", "l4", max_model_len=10_000_000)
    with pytest.raises(UserError, match="ep"):
        replica_profile("meta-llama/Llama-3.1-8B", "h100-sxm", tp=2, ep=4)


def test_profile_takes_its_calibration_or_step_model_as_arguments() -> None:
    import dataclasses

    from gpufleet.perf.calibration import default_calibration
    from gpufleet.perf.step_time import LinearStepTimeModel

    batch = StepBatch(num_decode=8, decode_context_tokens=8000)
    shipped = replica_profile("meta-llama/Llama-3.1-8B", "h100-sxm", max_model_len=8192)
    slower = dataclasses.replace(default_calibration(), memory_efficiency=0.4)
    slow = replica_profile(
        "meta-llama/Llama-3.1-8B", "h100-sxm", max_model_len=8192, calibration=slower
    )
    assert slow.step_time_model.step_time_s(batch) > 1.5 * shipped.step_time_model.step_time_s(
        batch
    )
    fixed = LinearStepTimeModel(base_s=0.123)
    given = replica_profile(
        "meta-llama/Llama-3.1-8B", "h100-sxm", max_model_len=8192, step_time_model=fixed
    )
    assert given.step_time_model is fixed
    assert given.num_gpu_blocks == shipped.num_gpu_blocks  # KV still from the layout
