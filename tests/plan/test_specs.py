"""Specs: GPU catalog lookups and model parameter / KV accounting against published and
hand-computed values."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpufleet.errors import UserError
from gpufleet.plan.layout import Layout
from gpufleet.specs import BYTES_PER_PARAM, gpu_names, load_gpu, load_model, model_names

# Published totals in billions (model cards); DeepSeek without / with the MTP module.
PUBLISHED_TOTAL_B = {
    "meta-llama/Meta-Llama-3.1-8B": 8.03,
    "meta-llama/Meta-Llama-3.1-70B": 70.6,
    "meta-llama/Meta-Llama-3.1-405B": 405.9,
    "Qwen/Qwen3-8B": 8.2,
    "Qwen/Qwen3-30B-A3B": 30.5,
    "Qwen/Qwen3-235B-A22B": 235.0,
    "mistralai/Mixtral-8x7B-v0.1": 46.7,
    "mistralai/Mixtral-8x22B-v0.1": 141.0,
    "deepseek-ai/DeepSeek-V3": 671.0,
    "deepseek-ai/DeepSeek-R1": 671.0,
    "openai/gpt-oss-20b": 21.0,
    "meta-llama/Llama-4-Scout-17B-16E-Instruct": 109.0,
    "meta-llama/Llama-3.1-405B-Instruct-FP8": 405.9,
    "RedHatAI/Llama-3.1-70B-Instruct-NVFP4": 70.6,
    "google/gemma-2-9b-it": 9.24,
    "google/gemma-2-27b-it": 27.2,
    "openai/gpt-oss-120b": 116.8,
    "moonshotai/Kimi-K2-Instruct": 1030.0,  # HF lists 1.03T (the card rounds to "1T")
    "zai-org/GLM-4.5": 355.0,
    "MiniMaxAI/MiniMax-M2": 230.0,
}

# (published active B, tolerance). Qwen's card rounds 3.35B down to "3.3B", so that one
# gets the rounding of its last digit on top of 1.5%.
PUBLISHED_ACTIVE_B = {
    "deepseek-ai/DeepSeek-V3": (37.0, 0.015),
    "Qwen/Qwen3-235B-A22B": (22.0, 0.015),
    "mistralai/Mixtral-8x7B-v0.1": (12.9, 0.015),
    "Qwen/Qwen3-30B-A3B": (3.3, 0.015 + 0.05 / 3.3),
}


def test_catalog_holds_every_shipped_config() -> None:
    assert set(model_names()) == set(PUBLISHED_TOTAL_B)


@pytest.mark.parametrize("name", sorted(PUBLISHED_TOTAL_B))
def test_total_params_within_1_5_percent_of_published(name: str) -> None:
    total_b = load_model(name).total_params() / 1e9
    assert total_b == pytest.approx(PUBLISHED_TOTAL_B[name], rel=0.015)


def test_deepseek_with_mtp_is_685b() -> None:
    m = load_model("deepseek-ai/DeepSeek-V3")
    assert m.num_mtp_layers == 1
    assert m.total_params(include_mtp=True) / 1e9 == pytest.approx(685.0, rel=0.015)
    assert m.total_params(include_mtp=True) > m.total_params()


@pytest.mark.parametrize("name", sorted(PUBLISHED_ACTIVE_B))
def test_active_params_of_moe_models(name: str) -> None:
    published_b, rel = PUBLISHED_ACTIVE_B[name]
    m = load_model(name)
    assert m.is_moe
    assert m.active_params() / 1e9 == pytest.approx(published_b, rel=rel)
    assert m.active_params() < m.total_params()


def test_dense_active_equals_total() -> None:
    m = load_model("meta-llama/Meta-Llama-3.1-8B")
    assert not m.is_moe
    assert m.active_params() == m.total_params()


def test_component_counts_add_up_for_llama_8b() -> None:
    m = load_model("meta-llama/Meta-Llama-3.1-8B")
    # q,o 4096x4096; k,v 4096x1024 (8 KV heads x 128)
    assert m.attention_params(0) == 2 * 4096 * 4096 + 2 * 4096 * 1024
    assert m.mlp_params(0) == 3 * 4096 * 14336
    assert m.embedding_params() == m.lm_head_params() == 128256 * 4096


def test_deepseek_layers_moe_after_first_three() -> None:
    m = load_model("deepseek-ai/DeepSeek-V3")
    assert [layer.is_moe for layer in m.layers[:4]] == [False, False, False, True]
    assert m.moe is not None and m.moe.num_experts == 256 and m.moe.experts_per_token == 8
    assert m.expert_params() == 3 * 7168 * 2048
    assert m.checkpoint_dtype == "fp8"


# ---- KV bytes per token ---------------------------------------------------------------


def test_kv_llama_8b_gqa_hand_computed() -> None:
    m = load_model("meta-llama/Llama-3.1-8B")
    assert m.kv_bytes_per_token(2, tp=1) == 2 * 32 * 8 * 128 * 2 == 131072
    # TP=2 shards the 8 KV heads: 4 per rank.
    assert m.kv_bytes_per_token(2, tp=2) == 2 * 32 * 4 * 128 * 2
    # TP=16 > 8 KV heads: each rank keeps one (replicated) head, never zero.
    assert m.kv_bytes_per_token(2, tp=16) == 2 * 32 * 1 * 128 * 2
    assert m.kv_bytes_per_token(1, tp=1) == 65536  # fp8 KV


def test_kv_deepseek_mla_same_on_every_rank() -> None:
    m = load_model("deepseek-ai/DeepSeek-V3")
    expected = 61 * (512 + 64) * 2
    assert m.kv_bytes_per_token(2, tp=1) == expected
    assert m.kv_bytes_per_token(2, tp=8) == expected


def test_kv_gpt_oss_sliding_layers_bounded_by_window() -> None:
    m = load_model("openai/gpt-oss-20b")
    assert [layer.sliding_window for layer in m.layers[:4]] == [128, None, 128, None]
    per_layer = 2 * 8 * 64 * 2
    kv = m.kv_breakdown(2, tp=1)
    assert kv.full_bytes == 12 * per_layer
    assert kv.sliding_bytes_by_window == ((128, 12 * per_layer),)
    assert m.kv_bytes_per_token_full(2) == 12 * per_layer
    assert m.kv_bytes_per_token_sliding(2) == 12 * per_layer
    # a 10k-token sequence: full layers hold all of it, sliding layers a window + 1 block
    assert kv.bytes_for_sequence(10_000) == 12 * per_layer * 10_000 + 12 * per_layer * 144
    assert kv.bytes_for_sequence(100) == kv.total_bytes * 100


def test_kv_breakdown_for_a_pipeline_stage() -> None:
    m = load_model("meta-llama/Llama-3.1-70B")
    half = m.kv_breakdown(2, tp=1, layer_ids=range(40))
    assert half.full_bytes * 2 == m.kv_bytes_per_token(2)


# ---- name resolution and errors -------------------------------------------------------


@pytest.mark.parametrize(
    ("spelling", "canonical"),
    [
        ("meta-llama/Llama-3.1-70B", "meta-llama/Meta-Llama-3.1-70B"),
        ("Meta-Llama-3.1-70B", "meta-llama/Meta-Llama-3.1-70B"),
        ("llama-3.1-70b", "meta-llama/Meta-Llama-3.1-70B"),
        ("meta-llama/Llama-3.1-8B-Instruct", "meta-llama/Meta-Llama-3.1-8B"),
        ("nvidia/Llama-3.1-8B-Instruct-FP8", "meta-llama/Meta-Llama-3.1-8B"),
        ("Qwen/Qwen3-235B-A22B-FP8", "Qwen/Qwen3-235B-A22B"),
        ("MIXTRAL-8X7B", "mistralai/Mixtral-8x7B-v0.1"),
        ("deepseek-ai/DeepSeek-R1", "deepseek-ai/DeepSeek-R1"),
    ],
)
def test_model_spellings(spelling: str, canonical: str) -> None:
    assert load_model(spelling).name == canonical


def test_unknown_model_lists_close_names() -> None:
    with pytest.raises(UserError) as e:
        load_model("meta-llama/Llama-3.1-7B")
    assert "Llama-3.1" in str(e.value) and e.value.field == "--model"


def test_config_path_and_directory(tmp_path: Path) -> None:
    src = Path(__file__).parents[2] / "src/gpufleet/specs/data/models"
    cfg = json.loads((src / "meta-llama--Meta-Llama-3.1-8B.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    by_dir = load_model(str(tmp_path))
    by_file = load_model(str(tmp_path / "config.json"))
    assert (
        by_dir.total_params() == by_file.total_params() == load_model("llama-3.1-8b").total_params()
    )


def test_config_missing_field_is_named(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"hidden_size": 64, "vocab_size": 10}))
    with pytest.raises(UserError) as e:
        load_model(str(tmp_path))
    assert e.value.field == "num_hidden_layers"
    assert "num_hidden_layers" in str(e.value)


def test_gpu_aliases_and_catalog() -> None:
    for required in ["l4", "a10g", "l40s", "a100-40gb", "a100-80gb", "h100-pcie", "h100-sxm",
                     "h200", "b200", "b300", "mi300x"]:  # fmt: skip
        assert required in gpu_names()
    for alias in ["h100", "H100-SXM", "h100_sxm", "H100 SXM"]:
        assert load_gpu(alias).name == "h100-sxm"
    assert load_gpu("h200_sxm").name == "h200"
    h100 = load_gpu("h100-sxm")
    assert h100.memory_bytes > 80e9 and h100.hbm_gbps == 3350
    assert h100.dense_tflops["fp8"] == 2 * h100.dense_tflops["bf16"]
    assert not load_gpu("a100-80gb").supports("fp8")
    assert load_gpu("a100-80gb").tflops("fp8") == 312  # upcast to bf16 tensor cores


def test_unknown_gpu_lists_close_names() -> None:
    with pytest.raises(UserError) as e:
        load_gpu("h1000")
    assert "h100" in str(e.value) and e.value.field == "--gpu"


def test_layout_validation_and_gpus() -> None:
    layout = Layout(tp=4, pp=2, ep=4, weight_dtype="fp8", kv_dtype="fp8")
    assert layout.num_gpus == 8 and layout.kv_dtype_bytes == BYTES_PER_PARAM["fp8"]
    with pytest.raises(ValueError):
        Layout(tp=2, ep=3)
    with pytest.raises(ValueError):
        Layout(weight_dtype="fp6")


def test_generic_configs_parse(tmp_path: Path) -> None:
    from gpufleet.specs import parse_config

    # Mistral-7B-v0.1 style: every layer slides over 4096 tokens; no head_dim given.
    mistral = parse_config(
        {
            "model_type": "mistral",  # whose config class defaults to untied embeddings
            "hidden_size": 4096,
            "num_hidden_layers": 32,
            "num_attention_heads": 32,
            "num_key_value_heads": 8,
            "intermediate_size": 14336,
            "vocab_size": 32000,
            "max_position_embeddings": 32768,
            "sliding_window": 4096,
        },
        "mistral",
    )
    assert mistral.head_dim == 128
    assert all(layer.sliding_window == 4096 for layer in mistral.layers)
    assert mistral.kv_bytes_per_token_full(2) == 0
    assert mistral.total_params() / 1e9 == pytest.approx(7.24, rel=0.015)
    # GPT-2 style names, no KV heads (multi-head attention), tied embeddings.
    gpt2 = parse_config(
        {
            "n_embd": 768,
            "n_layer": 12,
            "n_head": 12,
            "vocab_size": 50257,
            "n_positions": 1024,
            "intermediate_size": 3072,
            "tie_word_embeddings": True,
        },
        "gpt2-like",
    )
    assert gpt2.num_kv_heads == 12 and gpt2.lm_head_params() == 0
    # A directory's config.json is named after the directory (what an engine loads).
    (tmp_path / "config.json").write_text(json.dumps({"hidden_size": 64}))
    with pytest.raises(UserError):
        load_model(str(tmp_path / "config.json"))


def test_a_models_own_name_wins_over_a_quantized_variant_of_it() -> None:
    """`Llama-3.1-405B` is Meta's bf16 checkpoint, not the `-Instruct-FP8` copy that the
    catalog also ships (both reduce to the same name once variant suffixes are dropped)."""
    from gpufleet.specs.catalog import load_model

    assert load_model("meta-llama/Llama-3.1-405B").name == "meta-llama/Meta-Llama-3.1-405B"
    assert load_model("Llama-3.1-405B").name == "meta-llama/Meta-Llama-3.1-405B"
    fp8 = "meta-llama/Llama-3.1-405B-Instruct-FP8"
    assert load_model(fp8).name == fp8
    assert load_model("meta-llama/Llama-3.1-8B-Instruct").name == "meta-llama/Meta-Llama-3.1-8B"
