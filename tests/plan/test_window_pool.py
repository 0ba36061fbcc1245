"""vLLM's KV pool for sliding-window models and the KV token line it logs, by version
(plan/window_pool.py). Expected figures are worked by hand from vLLM's formulas
(vllm/v1/core/kv_cache_utils.py, kv_cache_interface.py) and, where named, from real logs."""

from __future__ import annotations

import math
from pathlib import Path

from gpufleet.plan.hybrid_pool import hybrid_pool
from gpufleet.plan.layout import Layout
from gpufleet.plan.memory import memory_breakdown
from gpufleet.plan.window_pool import LOG_BY_CONCURRENCY_SINCE, window_pool
from gpufleet.specs.catalog import load_model
from gpufleet.specs.gpus import load_gpu

GEMMA3_4B = [(1024, 4096.0)] * 29 + [(None, 4096.0)] * 5  # 4 KV heads x 256 x K,V x bf16


def test_old_log_of_gemma3_4b_counts_its_padded_groups() -> None:
    """ovg-project/kvcached#215 (vLLM of November 2025, google/gemma-3-4b-it, 3,072 tokens):
    "Add 1 padding layers", "GPU KV cache size: 317,136 tokens", "102.78x". 29 sliding
    layers + 5 full make groups of 5: 6 sliding (one padded) + 1 full = 7. A request takes
    3072 / 16 = 192 blocks in the full group and cdiv(min(1023 + 8192, 3072), 16) + 1 = 193
    in each sliding one: 192 + 6 x 193 = 1350. 102.78x puts num_blocks in 138,747-138,759;
    the log's 138,750 // 7 x 16 = 317,136 narrows it to 138,747-138,753. Every layer charged
    once (34, no padding) would log 138,750 x 5 / 34 -> 326,464."""
    pool = window_pool(GEMMA3_4B, 138_750 * 16 * 4096 * 5, 3072, 8192, (0, 11))
    assert pool is not None
    assert (pool.group_size, pool.groups, pool.blocks_per_request) == (5, 7, 1350)
    assert pool.num_blocks == 138_750
    assert pool.logged_tokens == 317_136
    assert round(pool.concurrency, 2) == 102.78


def test_from_021_the_log_is_concurrency_times_length() -> None:
    """gpt-oss-120b's shape (18 sliding layers of window 128, 18 full, 2 KiB per token and
    layer in bf16), 40 GiB, 131,072 tokens, 8,192 batched tokens: num_blocks =
    40 GiB // (16 x 2048 x 18) = 72,817; a request takes 8192 + cdiv(127 + 8192, 16) + 1 =
    8713 blocks. vLLM 0.20 logs 72,817 // 2 x 16 = 582,528 tokens; 0.21 logs
    int(72,817 / 8713 x 131,072) = 1,095,405 (8.36x)."""
    layers = [(128, 2048.0)] * 18 + [(None, 2048.0)] * 18
    old = window_pool(layers, 40 * 2**30, 131072, 8192, (0, 20))
    new = window_pool(layers, 40 * 2**30, 131072, 8192, (0, 21))
    assert old is not None and new is not None
    assert (old.num_blocks, old.blocks_per_request) == (72_817, 8713)
    assert old.logged_tokens == 582_528
    assert new.logged_tokens == 1_095_405
    assert round(new.concurrency, 2) == 8.36
    assert LOG_BY_CONCURRENCY_SINCE == (0, 21)


def test_one_window_for_every_layer_is_one_group() -> None:
    """Mistral-style: 32 layers all sliding (4096), 4 KiB per token and layer, 10 GiB,
    32,768 tokens, 8,192 batched: one group; num_blocks = 10 GiB // (65,536 x 32) = 5120;
    a request cdiv(4095 + 8192, 16) + 1 = 769 blocks. Before 0.21: 5120 x 16 = 81,920
    tokens; from 0.21: int(5120 / 769 x 32768) = 218,169."""
    layers = [(4096, 4096.0)] * 32
    old = window_pool(layers, 10 * 2**30, 32768, 8192, (0, 19))
    new = window_pool(layers, 10 * 2**30, 32768, 8192, (0, 21))
    assert old is not None and new is not None
    assert (old.groups, old.num_blocks, old.blocks_per_request) == (1, 5120, 769)
    assert old.logged_tokens == 81_920
    assert new.logged_tokens == 218_169


def test_pages_of_two_sizes_scale_the_smaller_kinds_block() -> None:
    """vllm-project/vllm#49878 (Gemma 4 31B, 262,144 tokens, 32,768 batched): a unified
    page of 256 KiB (16 x 16 KiB sliding), the full layers (8 KiB per token) at 32 tokens a
    block: 8192 blocks; each of 5 sliding groups cdiv(1023 + 32768, 16) + 1 = 2113;
    (8192 + 5 x 2113) x 256 KiB x 10 layers = 45.79 GiB for one request."""
    layers = [(1024, 16384.0)] * 50 + [(None, 8192.0)] * 10
    pool = window_pool(layers, 100 * 2**30, 262144, 32768, (0, 25))
    assert pool is not None
    assert (pool.group_size, pool.groups, pool.min_block_tokens) == (10, 6, 16)
    assert pool.blocks_per_request == 8192 + 5 * 2113
    gib = pool.blocks_per_request * pool.page_bytes * pool.group_size / 2**30
    assert round(gib, 2) == 45.79
    # Pages that are no whole multiple of each other are left to the every-layer count.
    assert window_pool([(1024, 3.0)] * 5 + [(None, 2.0)] * 5, 1e9, 4096, 8192) is None
    assert window_pool([(None, 2.0)] * 5, 1e9, 4096, 8192) is None


def test_memory_plan_of_gpt_oss_logs_by_version() -> None:
    """The planner's vLLM statement for gpt-oss-20b on one H100 follows the version: the
    blocks of its KV bytes, by hand, in groups of 12 layers of 2 KiB per token (vLLM 0.21
    also starts counting its CUDA graphs, so the KV bytes differ)."""
    model = load_model("openai/gpt-oss-20b")
    gpu, layout = load_gpu("h100-sxm"), Layout(tp=1, weight_dtype="mxfp4")
    for version in ((0, 20), (0, 21)):
        mem = memory_breakdown(
            model, gpu, layout, 131072, max_num_batched_tokens=8192, engine_version=version
        )
        blocks = math.floor(mem.kv_cache_bytes / (16 * 2048 * 12))
        assert blocks > 8713
        assert mem.kv_concurrency_logged == blocks / 8713
        if version < (0, 21):
            assert mem.kv_tokens_logged == blocks // 2 * 16
        else:
            assert mem.kv_tokens_logged == int(blocks / 8713 * 131072)


def test_a_hybrid_on_020_still_logs_blocks_over_groups() -> None:
    """The one report function serves hybrids too: on vLLM 0.20 a Qwen3.5-27B-shaped pool
    (16 attention layers of 4 KiB per token, 48 DeltaNet states of 3,207,168 B: 784-token
    blocks, 4 groups of 16) of 1487 blocks logs 1487 // 4 x 784 = 290,864 tokens, though
    prefix caching (on by request) keeps two state blocks per group (42 + 2 x 3 blocks a request);
    0.21 logs int(1487 / 48 x 32768) = 1,015,125."""
    kv = 1487 * 16 * 784 * 4096
    old = hybrid_pool(16, 48, 4096, 3_207_168, kv, 32768, (0, 20), prefix_caching=True)
    new = hybrid_pool(16, 48, 4096, 3_207_168, kv, 32768, (0, 21), prefix_caching=True)
    assert old.block_tokens == 784 and old.blocks_per_request == 48 == new.blocks_per_request
    assert old.logged_tokens == 290_864
    assert new.logged_tokens == 1_015_125


def test_gemma4_31b_log_turns_tenfold_between_020_and_021() -> None:
    """vllm-project/vllm#43308 (Gemma-4-31B AWQ, A100 80GB, ~50 GB of KV): ~55k tokens on
    vLLM 0.20.0, ~525k on 0.21.0. The planner's shapes (50 sliding layers of 16 KiB per
    token, 10 full of 8 KiB: one 256 KiB page, groups of 10) in 50 GiB give 20,480 blocks:
    20,480 // 6 x 16 = 54,608 tokens on 0.20; 20,480 / (8192 + 5 x 577) x 262,144 =
    484,671 on 0.21 (262,144 tokens, 8,192 batched: the issue gives neither)."""
    config = Path(__file__).parent / "data" / "unseen_configs" / "nvidia--Gemma-4-31B-IT-NVFP4.json"
    model = load_model(str(config))
    layers = [
        (s.sliding_window, model.kv_elements_per_token_per_layer(1, i) * 2.0)
        for i, s in enumerate(model.layers)
        if s.mixer
    ]
    old = window_pool(layers, 50 * 2**30, 262144, 8192, (0, 20))
    new = window_pool(layers, 50 * 2**30, 262144, 8192, (0, 21))
    assert old is not None and new is not None
    assert (old.num_blocks, old.groups, old.blocks_per_request) == (20_480, 6, 8192 + 5 * 577)
    assert old.logged_tokens == 54_608
    assert new.logged_tokens == 484_671
