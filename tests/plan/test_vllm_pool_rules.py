"""vLLM's KV pool rules read from its source, wave 19 (issue 14): the state blocks a hybrid's
request keeps by version and prefix-caching setting, chunked-local layers, the in-flight
batches a windowed group reserves for, Gemma 4's page unification by TP, and the state
dtype each recurrent mixer's config key sets."""

from __future__ import annotations

import math
from collections import Counter
from pathlib import Path
from typing import Any

from gpufleet.plan.hybrid_pool import hybrid_pool, state_blocks_per_request
from gpufleet.plan.layout import Layout
from gpufleet.plan.memory import memory_breakdown
from gpufleet.plan.window_pool import window_pool
from gpufleet.specs import load_gpu, load_model
from gpufleet.specs.config_parse import parse_config
from gpufleet.specs.models import ModelSpec

DATA = Path(__file__).parent / "data" / "unseen_configs"


def _json(name: str) -> dict[str, Any]:
    import json

    return dict(json.loads((DATA / name).read_text()))


# ---- hybrids: state blocks per request (MambaSpec.max_memory_usage_bytes) ------------------
def test_state_blocks_follow_prefix_caching_and_align_mode() -> None:
    """'align' mode (two state blocks) arrived with vllm-project/vllm#30877 (0.15); hybrids
    kept prefix caching opt-in until vllm-project/vllm#50991 (0.28)."""
    assert state_blocks_per_request((0, 14), True) == 1  # no 'align' yet: one block
    assert state_blocks_per_request((0, 15), True) == 2
    assert state_blocks_per_request((0, 19)) == 1  # opt-in: off by default
    assert state_blocks_per_request((0, 27)) == 1
    assert state_blocks_per_request((0, 28)) == 2  # on by default, 'align'
    assert state_blocks_per_request((0, 28), False) == 1
    assert state_blocks_per_request((1,)) == 2


def test_a_024_hybrid_run_without_the_flag_keeps_one_state_block() -> None:
    """Qwen3.5-27B's shapes (16 attention layers of 4 KiB per token, 48 DeltaNet states of
    3,207,168 B: 784-token blocks, 4 groups of 16) at 32k: 42 attention blocks + 1 per
    state group on vLLM 0.24 by default (the planner gave 2 per group from 0.20 on), 2 per
    group when the run passes --enable-prefix-caching."""
    kv = 1487 * 16 * 784 * 4096
    default = hybrid_pool(16, 48, 4096, 3_207_168, kv, 32768, (0, 24))
    cached = hybrid_pool(16, 48, 4096, 3_207_168, kv, 32768, (0, 24), prefix_caching=True)
    assert default.blocks_per_request == 42 + 3
    assert cached.blocks_per_request == 42 + 6
    assert round(default.concurrency, 2) == 33.04


def test_memory_plan_passes_prefix_caching_to_the_hybrid_pool() -> None:
    model = load_model(str(DATA / "Qwen--Qwen3.5-27B.json"))
    layout, gpu = Layout(tp=1, weight_dtype="bf16"), load_gpu("h100-sxm")
    off = memory_breakdown(model, gpu, layout, 32768, engine_version=(0, 24))
    on = memory_breakdown(model, gpu, layout, 32768, engine_version=(0, 24), prefix_caching=True)
    blocks = math.floor(off.kv_cache_bytes / (784 * 4096 * 16))
    assert off.kv_concurrency_logged == blocks / 45
    assert on.kv_concurrency_logged == blocks / 48
    assert on.kv_bytes_per_sequence == 48 * 784 * 4096 * 16


# ---- chunked-local layers (ChunkedLocalAttentionSpec) ---------------------------------------
def test_llama4_chunked_layers_take_no_extra_block() -> None:
    """Llama 4 Scout: 36 chunked layers (8192) + 12 full, one page size: groups of 12. A
    request of 131,072 tokens with 8192 batched takes 8192 full blocks + 3 x
    cdiv(8192 + 8192, 16) = 1024 chunked ones; a sliding window of 8192 would take
    cdiv(8191 + 8192, 16) + 1 = 1025 (what the planner charged before)."""
    model = load_model("meta-llama/Llama-4-Scout-17B-16E-Instruct")
    assert Counter((s.sliding_window, s.chunked) for s in model.layers) == {
        (8192, True): 36,
        (None, False): 12,
    }
    layout = Layout(tp=4, weight_dtype="bf16")
    mem = memory_breakdown(
        model, load_gpu("h100-sxm"), layout, 131072, max_num_batched_tokens=8192,
        engine_version=(0, 21),
    )  # fmt: skip
    per_layer = mem.kv_bytes_per_token / 48
    blocks = math.floor(mem.kv_cache_bytes / (16 * per_layer * 12))
    assert mem.kv_concurrency_logged == blocks / (8192 + 3 * 1024)
    assert mem.kv_tokens_logged == int(blocks / (8192 + 3 * 1024) * 131072)


def test_chunk_bounded_by_max_model_len() -> None:
    layers = [(8192, 1024.0)] * 3 + [(None, 1024.0)]
    pool = window_pool(layers, 2**30, 4096, 2048, (0, 21), chunked=True)
    assert pool is not None
    assert pool.blocks_per_request == 4 * 256  # every group bounded by 4096 tokens


# ---- in-flight batches (VllmConfig.max_in_flight_tokens) ------------------------------------
def _gemma4_31b_layers(tp: int = 1) -> list[tuple[int | None, float]]:
    model = load_model(str(DATA / "nvidia--Gemma-4-31B-IT-NVFP4.json"))
    return [
        (s.sliding_window, model.kv_elements_per_token_per_layer(tp, i) * 2.0)
        for i, s in enumerate(model.layers)
        if s.mixer
    ]


def test_sliding_groups_reserve_two_batches_from_026() -> None:
    """vllm-project/vllm#49878 (Gemma 4 31B, 262,144 tokens, 32,768 batched): 0.25 sizes a
    sliding group for one batch, cdiv(1023 + 32,768, 16) + 1 = 2113 blocks; 0.26 for the
    two in flight under async scheduling, cdiv(1023 + 65,536, 16) + 1 = 4161."""
    layers = _gemma4_31b_layers()
    v025 = window_pool(layers, 50 * 2**30, 262144, 32768, (0, 25))
    v026 = window_pool(layers, 50 * 2**30, 262144, 32768, (0, 26))
    pp2 = window_pool(layers, 50 * 2**30, 262144, 32768, (0, 26), pp=3)
    assert v025 is not None and v026 is not None and pp2 is not None
    assert v025.blocks_per_request == 8192 + 5 * 2113
    assert v026.blocks_per_request == 8192 + 5 * 4161
    assert pp2.blocks_per_request == 8192 + 5 * (-(-(1023 + 3 * 32768) // 16) + 1)


# ---- Gemma 4: two page sizes unified by the block, by TP ------------------------------------
def test_gemma4_pages_unify_by_block_at_each_tp() -> None:
    """gemma-4-26B-A4B: 25 sliding layers of 8 KV heads x 256, 5 global of 2 heads x 512
    (K and V apiece). vLLM scales the smaller page's block (unify_kv_cache_spec_page_size):
    TP 1-2 the global layers take 32-token blocks; TP 4 replicates the 2 global heads to 1
    per rank, both pages equal (16 tokens each, 2048 blocks for 32k); TP 8 leaves 1 sliding
    head of 256, the sliding layers take 32-token blocks. Groups of 5: 6 groups."""
    model = load_model(str(DATA / "google--gemma-4-26B-A4B.json"))
    expected = {1: (8192, 1024), 2: (4096, 1024), 4: (2048, 2048), 8: (2048, 2048)}
    sliding_blocks = {1: 577, 2: 577, 4: 577, 8: 289}  # cdiv(1023 + 8192, block) + 1
    for tp, (page_per_token, full_blocks) in expected.items():
        layers = [
            (s.sliding_window, model.kv_elements_per_token_per_layer(tp, i) * 2.0)
            for i, s in enumerate(model.layers)
            if s.mixer
        ]
        pool = window_pool(layers, 2**34, 32768, 8192, (0, 21))
        assert pool is not None
        assert (pool.group_size, pool.groups) == (5, 6)
        assert pool.page_bytes == 16 * page_per_token
        assert pool.blocks_per_request == full_blocks + 5 * sliding_blocks[tp], tp


# ---- recurrent state dtype: each mixer its own config key -----------------------------------
def _state_dtype_bytes(model: ModelSpec) -> set[int]:
    out = set()
    for spec in (model.linear_attention, model.mamba):
        if spec is not None:
            out.add(spec.ssm_state_bytes)
    return out


def test_deltanet_state_dtype_reads_mamba_ssm_dtype_only() -> None:
    """vLLM's Qwen3.5 hook reads the config's `mamba_ssm_dtype`; a `mamba_ssm_cache_dtype`
    key is not read for a DeltaNet model (the planner read it second before)."""
    cfg = _json("Qwen--Qwen3.5-27B.json")
    assert _state_dtype_bytes(parse_config(cfg, "q")) == {4}
    text = dict(cfg["text_config"])
    text.pop("mamba_ssm_dtype")
    text["mamba_ssm_cache_dtype"] = "float32"
    assert _state_dtype_bytes(parse_config({**cfg, "text_config": text}, "q")) == {2}


def test_mamba2_state_dtype_reads_mamba_ssm_cache_dtype_else_fp32() -> None:
    """NemotronH: the config's `mamba_ssm_cache_dtype`, else float32 (vllm-project/vllm#39032);
    `mamba_ssm_dtype` is not read (the planner read it second, and fell back to bf16)."""
    cfg = _json("nvidia--Nemotron-H-56B-Base-8K.json")
    assert _state_dtype_bytes(parse_config(cfg, "n")) == {4}
    assert _state_dtype_bytes(parse_config({**cfg, "mamba_ssm_dtype": "bfloat16"}, "n")) == {4}
    half = {**cfg, "mamba_ssm_cache_dtype": "bfloat16", "mamba_ssm_dtype": "float32"}
    assert _state_dtype_bytes(parse_config(half, "n")) == {2}


# ---- rotary caches: a linear-scaled RoPE and Gemma 3's second, local one ---------------------
def test_gemma3_rope_caches_scale_and_double() -> None:
    """vLLM's LinearScalingRotaryEmbedding caches max_position x factor rows, and Gemma 3's
    sliding layers keep a second, unscaled RoPE: (131,072 x 8 + 131,072) x 256 x 2 B =
    576 MiB on gemma-3-4b-it, where one cache of 131,072 rows was counted (64 MiB). The
    vLLM 0.19 log (llm-d-planner, 8.58 GiB loaded) is then met within 0.2 % (it was -6 %)."""
    text = {
        "model_type": "gemma3_text", "head_dim": 256, "hidden_size": 2560,
        "intermediate_size": 10240, "max_position_embeddings": 131072,
        "num_attention_heads": 8, "num_hidden_layers": 34, "num_key_value_heads": 4,
        "rope_scaling": {"factor": 8.0, "rope_type": "linear"}, "sliding_window": 1024,
        "sliding_window_pattern": 6, "vocab_size": 262208,
    }  # fmt: skip
    model = parse_config({"model_type": "gemma3", "text_config": text}, "gemma-3-4b")
    assert model.rope_cache_elements() == (131072 * 8 + 131072) * 256
    unscaled = parse_config({**text, "rope_scaling": None, "model_type": "llama"}, "x")
    assert unscaled.rope_cache_elements() == 131072 * 256


def test_gemma4_caches_one_rope_per_layer_type_the_proportional_one_head_wide() -> None:
    """Gemma 4's `rope_parameters` give the sliding layers a default RoPE (head 256) and the
    global layers a "proportional" one (partial factor 0.25 of a 512 head). vLLM builds one
    cache per distinct RoPE, and Gemma4RotaryEmbedding passes rotary_dim = head_size to its
    base class (zero frequencies pad the unrotated pairs), so the global cache is 512 wide:
    262,144 x (256 + 512) x 2 B = 384 MiB, where one 256-wide cache (128 MiB) was counted."""
    cfg = _json("google--gemma-4-26B-A4B.json")
    model = parse_config(cfg, "gemma-4-26B-A4B")
    assert model.rope_cache_elements() == 262144 * (256 + 512)
    text = cfg["text_config"]
    # a partial default RoPE is as wide as its rotated dims; an absent layer type adds none
    params = {"sliding_attention": {"rope_type": "default", "partial_rotary_factor": 0.5},
              "full_attention": {"rope_type": "default", "partial_rotary_factor": 0.25}}  # fmt: skip
    partial = parse_config({**text, "rope_parameters": params}, "x")
    assert partial.rope_cache_elements() == 262144 * (128 + 128)
    slid = parse_config({**text, "layer_types": ["sliding_attention"] * 30}, "x")
    assert slid.rope_cache_elements() == 262144 * 256


def test_gemma4_vision_tower_is_gated_with_a_position_table() -> None:
    """Gemma 4's vision tower (transformers' Gemma4VisionModel, which vLLM loads through
    AutoModel) has gated MLPs (gate, up, down), a learned position table of
    position_embedding_size x 2 axes x h, and one h -> text projection (Gemma4MultimodalEmbedder):
    0.573B parameters on gemma-4-26B-A4B, where a SigLIP-shaped reading gave 0.417B (0.29 GiB
    of the A100 log's remaining weights gap)."""
    model = parse_config(_json("google--gemma-4-26B-A4B.json"), "gemma-4-26B-A4B")
    h, inter, layers = 1152, 4304, 27
    body = layers * (4 * h * h + 3 * h * inter + 4 * h)
    assert model.vision_params == body + 3 * 16 * 16 * h + h * 2816 + 10240 * 2 * h


def test_pixtral_vision_tower_is_gated_and_mistral3_merges_patches() -> None:
    """Mistral-Small-3.1's Pixtral tower has gated MLPs (w1, w2, w3) and its projector merges
    2 x 2 patches before two linear layers: 0.44B parameters, where a SigLIP-shaped reading
    gave 0.33B (the vLLM 0.19 log, 44.76 GiB loaded, was 0.6 % above the planner; now 0.0 %)."""
    vision = {"model_type": "pixtral", "hidden_size": 1024, "intermediate_size": 4096,
              "num_hidden_layers": 24, "patch_size": 14}  # fmt: skip
    text = {
        "model_type": "mistral", "head_dim": 128, "hidden_size": 5120,
        "intermediate_size": 32768, "max_position_embeddings": 131072,
        "num_attention_heads": 32, "num_hidden_layers": 40, "num_key_value_heads": 8,
        "vocab_size": 131072,
    }  # fmt: skip
    model = parse_config({**text, "spatial_merge_size": 2, "vision_config": vision}, "m")
    body = 24 * (4 * 1024**2 + 3 * 1024 * 4096 + 4 * 1024) + 3 * 14 * 14 * 1024
    assert model.vision_params == body + 4 * 1024 * 1024 + 1024 * 5120 + 5120 * 5120


def test_phi2_mlp_has_no_gate() -> None:
    """microsoft/phi-2 (PhiForCausalLM): fc1 / fc2 with gelu_new, no gate. Read as gated it
    came to 3.62B parameters and 6.74 GiB against the 5.19 GiB vLLM 0.19 loads; 2.78B now."""
    cfg = {
        "hidden_act": "gelu_new", "hidden_size": 2560, "intermediate_size": 10240,
        "max_position_embeddings": 2048, "model_type": "phi", "num_attention_heads": 32,
        "num_hidden_layers": 32, "num_key_value_heads": 32, "partial_rotary_factor": 0.4,
        "tie_word_embeddings": False, "vocab_size": 51200,
    }  # fmt: skip
    model = parse_config(cfg, "phi-2")
    assert not model.gated_mlp
    assert abs(model.total_params() / 2.7789e9 - 1) < 1e-3
