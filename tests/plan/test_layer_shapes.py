"""Per-layer attention shapes (wave 18): layers whose KV heads or head sizes are not the
model's (MiMo-V2-Flash's sliding layers, Gemma 4's global layers) are costed with their
own shape in the KV bytes per token, the KV cache capacity and the step model's KV read."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gpufleet.errors import UserError
from gpufleet.perf.layer_costs import layer_classes
from gpufleet.plan.hybrid_pool import HybridPool, hybrid_pool
from gpufleet.plan.layout import Layout
from gpufleet.plan.memory import memory_breakdown
from gpufleet.plan.weights import weight_bytes_per_gpu
from gpufleet.specs.catalog import load_model
from gpufleet.specs.config_parse import parse_config
from gpufleet.specs.gpus import load_gpu
from gpufleet.specs.quant import UNQUANTIZED

DATA = Path(__file__).parent / "data" / "unseen_configs"
MIMO = str(DATA / "XiaomiMiMo--MiMo-V2-Flash.json")
GEMMA4_MOE = str(DATA / "google--gemma-4-26B-A4B.json")
GEMMA4_DENSE = str(DATA / "nvidia--Gemma-4-31B-IT-NVFP4.json")


def _load(path: str) -> dict[str, Any]:
    cfg: dict[str, Any] = json.loads(Path(path).read_text())
    return cfg


def _windows(path: str, tp: int) -> dict[int | None, int]:
    classes = layer_classes(
        load_model(path), load_gpu("h100-sxm"), UNQUANTIZED, tp=tp, moe_tp=1, gemm_efficiency=0.7
    )
    out: dict[int | None, int] = {}
    for c in classes:
        out[c.window] = out.get(c.window, 0) + c.count
    return out


def test_mimo_v2_flash_kv_bytes_per_token_by_hand() -> None:
    """9 full layers of 4 KV heads x (K 192 + V 128), 39 sliding layers of 8 KV heads x
    (192 + 128), bf16. Before: every layer 4 x (192 + 192), so the sliding layers were 40 %
    low (1536 elements instead of 2560) and the full ones 20 % high."""
    model = load_model(MIMO)
    kv = model.kv_breakdown(2, tp=1)
    assert kv.full_bytes == 9 * 4 * (192 + 128) * 2
    assert kv.sliding_bytes_by_window == ((128, 39 * 8 * (192 + 128) * 2),)
    # TP 4: 1 full and 2 sliding KV heads per rank; TP 8: both replicated to 1 head.
    assert model.kv_breakdown(2, tp=4).sliding_bytes == 39 * 2 * 320 * 2
    assert model.kv_breakdown(2, tp=8).sliding_bytes == 39 * 1 * 320 * 2
    # o_proj reads 64 value heads of 128, v_proj 4 (full) or 8 (sliding) of them.
    h = 4096
    assert model.attention_params(0) == h * 64 * 192 + h * 4 * 320 + 64 * 128 * h
    assert model.attention_params(1) == h * 64 * 192 + h * 8 * 320 + 64 * 128 * h


def test_mimo_v2_flash_capacity_counts_its_sliding_layers_own_heads() -> None:
    model = load_model(MIMO)
    layout = Layout(tp=8, weight_dtype="fp8")
    mem = memory_breakdown(model, load_gpu("h100-sxm"), layout, 32768)
    kv = model.kv_breakdown(2, tp=8)
    assert mem.kv_bytes_per_token == kv.full_bytes + kv.sliding_bytes
    assert kv.sliding_bytes > 4 * kv.full_bytes  # 39 x 320 x 2 B against 9 x 320 x 2 B


def test_step_model_reads_each_layer_kind_at_its_own_bytes() -> None:
    """The step model reads the reference (full) layers' bytes per token; a sliding layer
    of twice the bytes reads through a window twice as long."""
    assert _windows(MIMO, tp=1) == {None: 9, 256: 39}
    assert _windows(MIMO, tp=8) == {None: 9, 128: 39}  # both replicated to one head
    # Gemma 4 31B: global 4 KV heads x 512 (K = V, cached twice), sliding 16 x 256.
    assert _windows(GEMMA4_DENSE, tp=1) == {None: 10, 2048: 50}


def test_gemma4_global_layers_have_their_own_head_size_and_kv_heads() -> None:
    """26B-A4B: 5 global layers of 2 KV heads x 512 (K doubles as V: no v_proj, but vLLM
    caches K and V), 25 sliding layers of 8 x 256; 128 experts of 704 beside a dense MLP
    of 2112 in every layer. It was refused (`global_head_dim`)."""
    model = load_model(GEMMA4_MOE)
    kv = model.kv_breakdown(2, tp=1)
    assert kv.full_bytes == 5 * 2 * 2 * 512 * 2
    assert kv.sliding_bytes_by_window == ((1024, 25 * 2 * 8 * 256 * 2),)
    h = 2816
    assert model.attention_params(5) == h * 16 * 512 + h * 2 * 512 + 16 * 512 * h
    assert model.attention_params(0) == h * 16 * 256 + h * 2 * 8 * 256 + 16 * 256 * h
    assert model.moe is not None and model.moe.experts_per_token == 8
    assert model.moe.shared_expert_intermediate_size == 2112
    assert 25.0 < model.total_params() / 1e9 < 25.5
    assert 3.7 < model.active_params() / 1e9 < 3.9  # the name's A4B
    # The memory plan weighs the global layers' attention as the count counts it.
    layout = Layout(tp=2, weight_dtype="bf16")
    assert weight_bytes_per_gpu(model, layout) > 0


def test_gemma4_31b_plans_on_one_h100() -> None:
    model = load_model(GEMMA4_DENSE)
    assert model.kv_breakdown(2, tp=1).full_bytes == 10 * 2 * 4 * 512 * 2
    mem = memory_breakdown(model, load_gpu("h100-sxm"), Layout(tp=1, weight_dtype="nvfp4"), 8192)
    assert mem.fits


def test_gemma_per_layer_input_embeddings_are_refused() -> None:
    cfg = _load(GEMMA4_MOE)
    text = {**cfg["text_config"], "hidden_size_per_layer_input": 256}
    with pytest.raises(UserError) as err:
        parse_config({**cfg, "text_config": text}, "x")
    assert err.value.field == "hidden_size_per_layer_input"


def test_sliding_layers_with_their_own_query_heads_are_refused() -> None:
    cfg = {**_load(MIMO), "swa_num_attention_heads": 32}
    with pytest.raises(UserError) as err:
        parse_config(cfg, "x")
    assert err.value.field == "swa_num_attention_heads"


def test_a_model_of_one_shape_gets_no_per_layer_override() -> None:
    model = load_model(str(DATA / "meta-llama--Llama-3.2-3B.json"))
    assert all(
        (s.kv_heads, s.head_dim, s.v_head_dim, s.kv_shared) == (None, None, None, False)
        for s in model.layers
    )


# ---- vLLM's pool for hybrid models (plan/hybrid_pool.py) ----------------------------------
QWEN35_27B = str(DATA / "Qwen--Qwen3.5-27B.json")


def _qwen35_pool(kv_bytes: float, max_model_len: int, version: tuple[int, ...]) -> HybridPool:
    model = load_model(QWEN35_27B)
    kv = model.kv_breakdown(2, tp=1)
    return hybrid_pool(
        16, 48, kv.full_bytes / 16, kv.state_bytes / 48, kv_bytes, max_model_len, version
    )


def test_vllm_019_hybrid_log_of_qwen35_27b() -> None:
    """vllm-project/vllm#40691 (vLLM 0.19, Qwen3.5-27B, max_model_len 32768): "GPU KV cache
    size: 290,864 tokens", "Maximum concurrency ... 33.04x". The attention block holds one
    DeltaNet state (fp32: 48 x 128 x 128 x 4 B + 10240 x 3 x 2 B = 3,207,168 B) in 16-token
    steps: 784 tokens x 4 KiB; 16 attention + 48 DeltaNet layers make 4 groups of 16;
    a request takes 42 attention blocks + 1 per state group; the log divides the blocks by
    the groups. The planner's old count (KV bytes over 64 KiB per token, state left out)
    logged 4.0 times as many tokens (1,165,808); its 33 sequences were right."""
    pool = _qwen35_pool(1487 * 16 * 784 * 4096, 32768, (0, 19))
    assert (pool.block_tokens, pool.group_size, pool.attention_groups, pool.state_groups) == (
        784,
        16,
        1,
        3,
    )
    assert pool.blocks_per_request == 42 + 3
    assert pool.logged_tokens == 290_864
    assert round(pool.concurrency, 2) == 33.04


def test_vllm_later_logs_concurrency_times_length_with_two_state_blocks() -> None:
    """vLLM >= 0.21 (0.26 per vllm-project/vllm#51041) logs max_concurrency x
    max_model_len, and with prefix caching ('align') a request keeps two blocks per state
    group. 388 blocks at 262,144 tokens: 388 / (335 + 6) = 1.14x, 298,275 tokens."""
    pool = _qwen35_pool(388 * 16 * 784 * 4096, 262144, (0, 28))
    assert pool.blocks_per_request == 335 + 6
    assert pool.logged_tokens == 298_275


def test_memory_plan_of_a_hybrid_uses_vllms_pool() -> None:
    model = load_model(QWEN35_27B)
    layout = Layout(tp=1, weight_dtype="bf16")
    mem = memory_breakdown(model, load_gpu("h100-sxm"), layout, 32768, engine_version=(0, 19))
    pool = _qwen35_pool(mem.kv_cache_bytes, 32768, (0, 19))
    assert mem.attention_block_tokens == 784
    assert mem.kv_tokens_logged == pool.logged_tokens
    assert mem.max_concurrent_seqs == int(pool.concurrency)
    assert mem.kv_bytes_per_sequence == pool.bytes_per_request
    # Other engines keep their own pools (the state charged per sequence).
    sglang = memory_breakdown(model, load_gpu("h100-sxm"), layout, 32768, engine="sglang")
    assert sglang.attention_block_tokens == 0


def test_group_size_follows_the_smaller_kind_unless_within_a_quarter() -> None:
    assert hybrid_pool(6, 23, 1024, 2e6, 1e10, 8192).group_size == 6  # Nemotron-3-Nano
    assert hybrid_pool(12, 13, 1024, 2e6, 1e10, 8192).group_size == 13
    with pytest.raises(ValueError):
        hybrid_pool(0, 23, 1024, 2e6, 1e10, 8192)


def test_vllm_024_log_of_a_qwen35_moe_with_fp8_kv() -> None:
    """noonghunna/club-3090#612 (vLLM 0.24.0, qwen3.6-35b-a3b NVFP4, fp8 KV, prefix caching,
    131,072 tokens): 5.98 GiB, "GPU KV cache size: 567,978 tokens", 4.33x. With Qwen3.5-35B-A3B's
    shapes (assumed the same): 1 KiB per token and attention layer in fp8, a state of
    32 x 128 x 128 x 4 + 8192 x 3 x 2 = 2,146,304 B = 2096 tokens exactly; 10 + 30 layers;
    299 blocks / (63 + 2 x 3) = 13/3."""
    model = load_model(str(DATA / "Qwen--Qwen3.5-35B-A3B.json"))
    kv = model.kv_breakdown(1, tp=1)
    pool = hybrid_pool(
        10, 30, kv.full_bytes / 10, kv.state_bytes / 30, 5.98 * 2**30, 131072, (0, 24), True
    )
    assert (pool.block_tokens, pool.num_blocks, pool.blocks_per_request) == (2096, 299, 69)
    assert pool.logged_tokens == 567_978
