"""Memory per GPU: vLLM's accounting of weights, activations, reserve and KV blocks."""

from __future__ import annotations

import math

import pytest

from gpufleet.plan.layout import Layout
from gpufleet.plan.memory import (
    GIB,
    memory_breakdown,
    sequences_that_fit,
    stage_layer_ids,
    total_weight_bytes,
    weight_bytes_per_gpu,
)
from gpufleet.specs import load_gpu, load_model

H100 = load_gpu("h100-sxm")


def test_usable_is_utilization_of_total_and_parts_add_up() -> None:
    m = memory_breakdown(load_model("llama-3.1-8b"), H100, Layout(), 8192)
    assert m.usable_bytes == pytest.approx(0.9 * H100.memory_bytes)
    parts = m.weights_bytes + m.activation_bytes + m.framework_reserve_bytes + m.kv_cache_bytes
    assert parts == pytest.approx(m.usable_bytes)


def test_bf16_weights_are_two_bytes_per_param_at_tp1_plus_the_rope_cache() -> None:
    model = load_model("llama-3.1-8b")
    rope = 2 * model.max_position_embeddings * model.head_dim  # bf16 cos/sin rows
    assert weight_bytes_per_gpu(model, Layout()) == 2 * model.total_params() + rope
    assert total_weight_bytes(model, "bf16") == 2 * model.total_params() + rope


def test_tp_splits_weights_and_pp_splits_layers() -> None:
    model = load_model("llama-3.1-70b")
    one = weight_bytes_per_gpu(model, Layout())
    assert weight_bytes_per_gpu(model, Layout(tp=2)) == pytest.approx(one / 2, rel=0.01)
    assert weight_bytes_per_gpu(model, Layout(tp=8)) == pytest.approx(one / 8, rel=0.02)
    assert weight_bytes_per_gpu(model, Layout(pp=2)) == pytest.approx(one / 2, rel=0.02)
    assert list(stage_layer_ids(126, 4, 0)) == list(range(32))
    assert sum(len(stage_layer_ids(126, 4, s)) for s in range(4)) == 126


def test_quantized_weights_keep_embeddings_bf16_and_carry_scales() -> None:
    model = load_model("llama-3.1-70b")
    vocab = model.embedding_params() + model.lm_head_params()
    linear = model.total_params() - vocab
    rope = 2 * model.rope_cache_elements()
    fp8 = weight_bytes_per_gpu(model, Layout(weight_dtype="fp8")) - rope
    int4 = weight_bytes_per_gpu(model, Layout(weight_dtype="int4")) - rope
    # fp8: 1 byte per linear weight; vocab matrices 2 bytes (norms are a rounding error).
    assert fp8 == pytest.approx(linear + 2 * vocab, rel=1e-3)
    # int4 AWQ/GPTQ group 128: 0.5 byte + fp16 scale and 4-bit zero per 128 weights.
    assert int4 == pytest.approx(linear * (0.5 + 2.5 / 128) + 2 * vocab, rel=1e-3)


def test_mxfp4_quantizes_only_experts() -> None:
    model = load_model("gpt-oss-20b")
    bf16 = weight_bytes_per_gpu(model, Layout())
    fp4 = weight_bytes_per_gpu(model, Layout(weight_dtype="mxfp4"))
    assert model.moe is not None
    experts = model.num_moe_layers * model.moe.num_experts * model.expert_params()
    assert bf16 - fp4 == pytest.approx(experts * (2 - (0.5 + 1 / 32)), rel=1e-6)
    assert 12 * GIB < fp4 < 14 * GIB  # gpt-oss-20b loads at ~13 GiB in vLLM


def test_ep_splits_whole_experts_same_bytes_as_tp_sharding() -> None:
    model = load_model("deepseek-v3")
    tp8 = weight_bytes_per_gpu(model, Layout(tp=8, weight_dtype="fp8"))
    ep8 = weight_bytes_per_gpu(model, Layout(tp=8, ep=8, weight_dtype="fp8"))
    assert ep8 == pytest.approx(tp8, rel=1e-6)
    assert 75 * GIB < tp8 < 85 * GIB  # ~671 GB fp8 over 8 GPUs


def test_kv_capacity_in_16_token_blocks() -> None:
    model = load_model("llama-3.1-8b")
    m = memory_breakdown(model, H100, Layout(), 8192)
    per_block = 16 * 131072
    assert m.kv_blocks == math.floor(m.kv_cache_bytes / per_block)
    assert m.kv_capacity_tokens == 16 * m.kv_blocks
    assert m.max_concurrent_seqs == math.floor(m.kv_cache_bytes / (8192 * 131072))
    # vLLM reports ~54 GiB of KV for Llama-3.1-8B bf16 on one H100 at 0.9.
    assert 50 * GIB < m.kv_cache_bytes < 58 * GIB


def test_fp8_kv_doubles_capacity() -> None:
    model = load_model("llama-3.1-8b")
    bf16 = memory_breakdown(model, H100, Layout(), 8192)
    fp8 = memory_breakdown(model, H100, Layout(kv_dtype="fp8"), 8192)
    assert fp8.kv_capacity_tokens == pytest.approx(2 * bf16.kv_capacity_tokens, rel=1e-3)


def test_sliding_layers_bounded_by_window() -> None:
    model = load_model("gpt-oss-20b")
    layout = Layout(weight_dtype="mxfp4")
    m = memory_breakdown(model, H100, layout, 65536)
    per_layer = 2 * 8 * 64 * 2
    per_seq = 12 * per_layer * 65536 + 12 * per_layer * (128 + 16)
    assert m.kv_bytes_per_sequence == per_seq
    assert m.max_concurrent_seqs == math.floor(m.kv_cache_bytes / per_seq)
    # If sliding layers held every token, far fewer sequences would fit.
    assert m.max_concurrent_seqs > 1.9 * math.floor(m.kv_cache_bytes / (24 * per_layer * 65536))


def test_mla_kv_replicated_on_every_rank() -> None:
    model = load_model("deepseek-v3")
    m = memory_breakdown(model, load_gpu("h200"), Layout(tp=8, weight_dtype="fp8"), 8192)
    assert m.kv_bytes_per_token == 61 * 576 * 2
    assert m.kv_capacity_tokens == 16 * math.floor(m.kv_cache_bytes / (16 * 61 * 576 * 2))


def test_seed_fits() -> None:
    big = load_model("llama-3.1-70b")
    assert not memory_breakdown(big, H100, Layout(), 8192).weights_fit
    assert memory_breakdown(big, H100, Layout(tp=2), 8192).weights_fit
    assert memory_breakdown(big, H100, Layout(tp=4), 8192).fits
    int4 = Layout(weight_dtype="int4")
    m = memory_breakdown(big, H100, int4, 8192)
    assert m.fits and m.kv_cache_bytes > 20 * GIB
    assert sequences_that_fit(big, int4, m, 1280) >= 16
    huge = load_model("llama-3.1-405b")
    assert not memory_breakdown(huge, H100, Layout(tp=8), 8192).weights_fit
    assert memory_breakdown(huge, H100, Layout(tp=8, pp=2), 8192).fits


def test_activation_grows_with_batched_tokens_and_nccl_only_when_split() -> None:
    model = load_model("llama-3.1-8b")
    small = memory_breakdown(model, H100, Layout(), 8192, max_num_batched_tokens=2048)
    large = memory_breakdown(model, H100, Layout(), 8192, max_num_batched_tokens=16384)
    assert large.activation_bytes > small.activation_bytes
    assert large.max_num_batched_tokens == 16384
    split = memory_breakdown(model, H100, Layout(tp=2), 8192)
    assert split.framework_reserve_bytes > small.framework_reserve_bytes
    # GPUs under 70 GiB get vLLM's smaller default batch.
    assert memory_breakdown(model, load_gpu("l4"), Layout(), 8192).max_num_batched_tokens == 2048


def test_vllm_keeps_its_small_serving_defaults_on_the_a100() -> None:
    """vLLM gives >= 70 GiB GPUs 8192 batched tokens and 1024 sequences, except the A100
    (80 GB but 2048 / 256): its sampler's profiling pass over 256 sequences leaves
    gpt-oss-20b 36.6 GiB of KV at 0.65 on an A100, as logged (benchmarks/data)."""
    gpt_oss = load_model("openai/gpt-oss-20b")
    a100, h100 = load_gpu("a100-80gb"), H100
    on_a100 = memory_breakdown(gpt_oss, a100, Layout(weight_dtype="mxfp4"), 131072,
                               gpu_memory_utilization=0.65, engine_version=(0, 19))  # fmt: skip
    on_h100 = memory_breakdown(gpt_oss, h100, Layout(weight_dtype="mxfp4"), 131072,
                               gpu_memory_utilization=0.65)  # fmt: skip
    assert (on_a100.max_num_batched_tokens, on_h100.max_num_batched_tokens) == (2048, 8192)
    assert on_a100.activation_bytes < 0.5 * on_h100.activation_bytes
    assert on_a100.kv_cache_bytes / GIB == pytest.approx(36.56, rel=0.02)


def test_vllm_v0_profiles_its_default_256_sequences() -> None:
    """vLLM's V0 engine (the default before 0.8) schedules 256 sequences by default and its
    profiling pass samples that many. vllm-project/vllm#10511's 0.6.5 log of Llama-3-8B on an
    H100 (TP 1, 0.9, 8192 tokens) gives an activation peak of 1.26 GiB; charging V1's 1024
    sequences gave 4.77 GiB (KV -3.7 %); 256 give 1.19 GiB. From 0.8 on, 1024 as before."""
    model = load_model("meta-llama/Meta-Llama-3.1-8B")
    v0 = memory_breakdown(model, H100, Layout(), 8192, engine_version=(0, 6, 5))
    assert v0.activation_bytes / GIB == pytest.approx(1.26, abs=0.1)
    v1 = memory_breakdown(model, H100, Layout(), 8192, engine_version=(0, 9, 2))
    assert v1.activation_bytes / GIB == pytest.approx(4.77, abs=0.05)
    told = memory_breakdown(model, H100, Layout(), 8192, engine_version=(0, 6), max_num_seqs=1024)
    assert told.activation_bytes == v1.activation_bytes
