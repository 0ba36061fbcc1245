"""Real `config.json` files of models the planner was never fitted to (wave 18; sources,
commits and the parameter counts their names state in `data/unseen_configs/SOURCES.json`):
each plans without error, or is refused with an error that names the config field; and the
architecture read from each is checked by hand where it used to be read wrong."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gpufleet.errors import UserError
from gpufleet.perf.layer_costs import layer_classes
from gpufleet.plan.layout import Layout
from gpufleet.plan.search import plan
from gpufleet.plan.types import PlanRequest
from gpufleet.plan.weights import weight_bytes_per_gpu
from gpufleet.specs.catalog import load_model
from gpufleet.specs.config_parse import parse_config
from gpufleet.specs.gpus import load_gpu
from gpufleet.specs.quant import UNQUANTIZED

DATA = Path(__file__).parent / "data" / "unseen_configs"
SOURCES: dict[str, dict[str, object]] = json.loads((DATA / "SOURCES.json").read_text())
PLANNED = sorted(f for f, s in SOURCES.items() if "refused_field" not in s)
REFUSED = sorted(f for f, s in SOURCES.items() if "refused_field" in s)
STATED = sorted(f for f, s in SOURCES.items() if "stated_params_b" in s)
# Published parameter counts round to the name (Qwen3-VL-8B is 8.8B, MiMo-7B 7.8B with
# its MTP layer): within 10 % of the number the name or card states.
PARAMS_TOLERANCE = 0.10


def test_every_shipped_config_has_its_source() -> None:
    files = {p.name for p in DATA.glob("*.json")} - {"SOURCES.json"}
    assert files == set(SOURCES)
    assert len(files) >= 15
    for entry in SOURCES.values():
        assert entry["repo"] and entry["path"] and len(str(entry["commit"])) == 40


@pytest.mark.parametrize("name", PLANNED)
@pytest.mark.parametrize("gpu", ["h100-sxm", "l40s"])
def test_config_plans_without_error(name: str, gpu: str) -> None:
    model = load_model(str(DATA / name))
    for max_len in (4096, min(32768, model.max_position_embeddings)):
        result = plan(PlanRequest(model=model, gpu=load_gpu(gpu), max_model_len=max_len, rps=5))
        assert result.chosen is not None, (name, gpu, max_len)


@pytest.mark.parametrize("name", STATED)
def test_weights_match_the_stated_parameter_count(name: str) -> None:
    model = load_model(str(DATA / name))
    stated = float(SOURCES[name]["stated_params_b"]) * 1e9  # type: ignore[arg-type]
    counted = model.total_params() + model.vision_params
    assert abs(counted / stated - 1) <= PARAMS_TOLERANCE, (name, counted / 1e9)


@pytest.mark.parametrize("name", PLANNED)
def test_memory_plan_weighs_what_the_parameter_count_counts(name: str) -> None:
    """bf16 on one GPU: 2 B per counted parameter (+ the RoPE cache). The memory plan
    weighed every layer as GQA attention + MLP whatever the parameter count said (Mamba
    and DeltaNet mixers, MLP-only blocks, Qwen3.5's gated q_proj)."""
    model = load_model(str(DATA / name))
    layout = Layout(tp=1, pp=1, ep=1, weight_dtype="bf16", kv_dtype="bf16")
    counted = 2 * (model.total_params() + model.vision_params)
    assert abs(weight_bytes_per_gpu(model, layout) / counted - 1) < 0.01


@pytest.mark.parametrize("name", REFUSED)
def test_unmodelled_architecture_is_refused_by_field(name: str) -> None:
    with pytest.raises(UserError) as err:
        load_model(str(DATA / name))
    assert err.value.field == SOURCES[name]["refused_field"]
    assert err.value.fix


def _load(name: str) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((DATA / name).read_text())
    return loaded


def test_qwen3_next_linear_layers_hold_state_not_kv() -> None:
    """48 layers, every 4th full attention (2 KV heads x 256): 12 x 2 x 2 x 256 x 2 B =
    24 KiB per token in bf16, not 96 KiB; each of the 36 Gated DeltaNet layers holds 32
    heads x 128 x 128 of state (bf16) plus a 3-token conv window of 8192 channels."""
    model = load_model(str(DATA / "Qwen--Qwen3-Next-80B-A3B-Thinking.json"))
    kv = model.kv_breakdown(2, tp=1)
    assert kv.full_bytes == 12 * 2 * 2 * 256 * 2
    assert kv.sliding_bytes_by_window == ()
    per_layer = 32 * 128 * 128 * 2 + 8192 * 3 * 2
    assert kv.state_bytes == 36 * per_layer
    assert kv.bytes_for_sequence(1000) == 1000 * kv.full_bytes + 36 * per_layer
    assert abs(model.total_params() / 80e9 - 1) < 0.01


def test_qwen35_layer_types_and_output_gate_count_its_weights() -> None:
    """Qwen3.5-27B: 48 of 64 layers are `linear_attention`; full attention has a gated
    q_proj. Read as 64 plain attention layers it was 24.35B + 0.44B vision (8 % short)."""
    model = load_model(str(DATA / "Qwen--Qwen3.5-27B.json"))
    assert sum(layer.linear for layer in model.layers) == 48
    assert model.attn_output_gate
    counted = (model.total_params() + model.vision_params) / 1e9
    assert 26.7 < counted < 28.0
    assert model.kv_breakdown(2, 1).full_bytes == 16 * 2 * 4 * 256 * 2


def test_linear_layers_cost_as_a_bounded_window_in_the_step_model() -> None:
    model = load_model(str(DATA / "Qwen--Qwen3-Next-80B-A3B-Thinking.json"))
    classes = layer_classes(
        model, load_gpu("h100-sxm"), UNQUANTIZED, tp=1, moe_tp=1, gemm_efficiency=0.7
    )
    full = sum(c.count for c in classes if c.window is None)
    assert full == 12
    assert all(c.window and c.window < 1024 for c in classes if c.window is not None)


def test_mimo_v2_flash_hybrid_layer_pattern_keeps_its_full_layers() -> None:
    """hybrid_layer_pattern 0 = full attention: 9 of 48 layers; it was read as 48 sliding."""
    model = load_model(str(DATA / "XiaomiMiMo--MiMo-V2-Flash.json"))
    assert sum(layer.sliding_window is None for layer in model.layers) == 9
    assert {layer.sliding_window for layer in model.layers} == {None, 128}


def test_unknown_layer_type_is_refused() -> None:
    cfg = _load("Qwen--Qwen3.5-27B.json")
    text = dict(cfg["text_config"])
    text["layer_types"] = ["mamba", *text["layer_types"][1:]]
    with pytest.raises(UserError) as err:
        parse_config({**cfg, "text_config": text}, "x")
    assert err.value.field == "layer_types" and "mamba" in err.value.message


def test_nemotron_h_blocks_are_mamba_attention_or_mlp() -> None:
    """hybrid_override_pattern: 54 Mamba-2 (M), 10 attention (*), 54 relu2 MLP (-) blocks.
    Read as 118 attention + gated-MLP layers it came to 115B parameters and 472 KiB of KV
    per token; it is 56B with 10 x 2 x 8 x 128 x 2 B = 40 KiB, plus 54 Mamba states of
    (256 x 64 + 2 x 8 x 256) x 3 conv (bf16) + 256 x 64 x 256 SSM values per sequence, fp32:
    its config names no `mamba_ssm_cache_dtype` and vLLM's NemotronH default is float32
    (vllm-project/vllm#39032)."""
    model = load_model(str(DATA / "nvidia--Nemotron-H-56B-Base-8K.json"))
    assert abs(model.total_params() / 56.3e9 - 1) < 0.01
    kv = model.kv_breakdown(2, tp=1)
    assert kv.full_bytes == 10 * 2 * 8 * 128 * 2
    assert kv.state_bytes == 54 * ((256 * 64 + 2 * 8 * 256) * 3 * 2 + 256 * 64 * 256 * 4)


def test_nemotron3_nano_is_a_mamba_moe_hybrid() -> None:
    """23 Mamba-2, 6 attention and 23 MoE blocks (128 relu2 experts, 6 active, one shared
    of 3712): 31.6B parameters, 3.6B active with the embeddings (its card's figures); fp32
    SSM state (mamba_ssm_cache_dtype)."""
    model = load_model(str(DATA / "nvidia--NVIDIA-Nemotron-3-Nano-30B-A3B-BF16.json"))
    assert abs(model.total_params() / 31.6e9 - 1) < 0.01
    assert abs(model.active_params() / 3.6e9 - 1) < 0.03
    assert model.num_moe_layers == 23 and not model.gated_mlp
    kv = model.kv_breakdown(2, tp=1)
    assert kv.full_bytes == 6 * 2 * 2 * 128 * 2
    assert kv.state_bytes == 23 * (6144 * 3 * 2 + 64 * 64 * 128 * 4)
    classes = layer_classes(
        model, load_gpu("h100-sxm"), UNQUANTIZED, tp=1, moe_tp=1, gemm_efficiency=0.7
    )
    assert sum(c.count for c in classes if c.window == 0) == 23  # MoE blocks: no attention


def test_nemotron_nas_blocks_have_their_own_mlp_widths() -> None:
    """Llama-3.3-Nemotron-Super-49B: 80 DeciLM blocks, 31 without attention, MLP widths
    from ffn_mult (0.5 to 5.25): 49.9B parameters, 49 x 2 x 8 x 128 x 2 B of KV per token.
    The step model groups layers of equal shapes only (its classes weigh every layer)."""
    model = load_model(str(DATA / "nvidia--Llama-3_3-Nemotron-Super-49B-v1.json"))
    assert abs(model.total_params() / 49.87e9 - 1) < 0.005
    assert sum(layer.mixer for layer in model.layers) == 49
    assert model.kv_breakdown(2, tp=1).full_bytes == 49 * 2 * 8 * 128 * 2
    classes = layer_classes(
        model, load_gpu("h100-sxm"), UNQUANTIZED, tp=1, moe_tp=1, gemm_efficiency=0.7
    )
    layers = sum(model.attention_params(i) + model.mlp_params(i) for i in range(80))
    assert sum(c.count * c.weight_bytes for c in classes) == pytest.approx(2 * layers)


def test_nemotron_nas_linear_replacement_is_refused() -> None:
    cfg = _load("nvidia--Llama-3_3-Nemotron-Super-49B-v1.json")
    cfg["block_configs"][3]["attention"]["replace_with_linear"] = True
    with pytest.raises(UserError) as err:
        parse_config(cfg, "x")
    assert err.value.field == "block_configs"


def test_deepseek_v32_caches_its_indexer_keys_beside_the_latent() -> None:
    """61 MLA layers x (512 latent + 64 rope) x 2 B, plus the sparse-attention indexer's
    fp8 key (128 B + one 4-B scale) per token and layer: 78,324 B, not 70,272."""
    model = load_model(str(DATA / "deepseek-ai--DeepSeek-V3.2.json"))
    assert model.kv_breakdown(2, tp=8).full_bytes == 61 * ((512 + 64) * 2 + 132)
    assert model.kv_breakdown(1, tp=1).full_bytes == 61 * ((512 + 64) + 132)


@pytest.mark.process
def test_cli_refuses_a_hybrid_config_without_a_traceback() -> None:
    import subprocess
    import sys

    path = DATA / "nvidia--NVIDIA-Nemotron-3-Super-120B-A12B-FP8.json"
    cmd = [sys.executable, "-c", "from gpufleet.cli import main; main()"]
    r = subprocess.run(
        [*cmd, "plan", "--model", str(path), "--gpu", "h100-sxm"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert r.returncode == 2
    assert "moe_latent_size" in r.stderr and "Traceback" not in r.stderr


MODELOPT = Path(__file__).parent / "data" / "modelopt"


@pytest.mark.parametrize(
    ("name", "headline"),
    [("nvidia--Qwen3-235B-A22B-NVFP4", "nvfp4"), ("nvidia--Llama-3.1-70B-Instruct-FP8", "fp8")],
)
def test_modelopt_hf_quant_config_beside_config_json_is_read(name: str, headline: str) -> None:
    """These ModelOpt checkpoints state their format only in hf_quant_config.json (their
    config.json has no quantization_config); they were planned as bf16."""
    model = load_model(str(MODELOPT / name))
    assert model.checkpoint_dtype == headline
    assert model.quant.format(0, "attn").name == headline
    assert model.quant.format(0, "lm_head").name == "bf16"  # exclude_modules
    # A path to the config.json itself reads its sibling too.
    assert load_model(str(MODELOPT / name / "config.json")).checkpoint_dtype == headline
