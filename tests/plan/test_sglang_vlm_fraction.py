"""SGLang's default --mem-fraction-static for a multimodal model (wave 19, issue 14):
server_args' adjust_mem_fraction_for_vlm scales the default by 0.95 and by the vision
tower's size against ViT-L/14; a fraction given on the command line is kept."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpufleet.plan.engines import sglang_mem_fraction_static
from gpufleet.plan.layout import Layout
from gpufleet.plan.memory import memory_breakdown
from gpufleet.specs import load_gpu, load_model

CONFIGS = Path(__file__).resolve().parents[2] / "benchmarks" / "data" / "model_configs"


def test_sglang_default_fraction_shrinks_for_a_vision_tower_by_its_size() -> None:
    gemma = load_model(str(CONFIGS / "google--gemma-3-4b-it.json"))  # SigLIP: 27 x 1152
    assert gemma.vision_shape == (27, 1152)
    h100 = load_gpu("h100-sxm")
    base = sglang_mem_fraction_static(h100, 1)
    vit = 1 - 0.1 * (27 * 1152**2 / (24 * 1024**2) - 1)  # 0.958: a bit above ViT-L
    mem = memory_breakdown(gemma, h100, Layout(), 8192, engine="sglang")
    assert mem.gpu_memory_utilization == pytest.approx(base * 0.95 * vit)
    given = memory_breakdown(gemma, h100, Layout(), 8192, engine="sglang",
                             gpu_memory_utilization=0.8)  # fmt: skip
    assert given.gpu_memory_utilization == 0.8  # a stated fraction is not adjusted


def test_text_models_and_other_engines_keep_their_fraction() -> None:
    h100 = load_gpu("h100-sxm")
    llama = load_model("meta-llama/Llama-3.1-8B-Instruct")
    assert llama.vision_shape == (0, 0)
    mem = memory_breakdown(llama, h100, Layout(), 8192, engine="sglang")
    assert mem.gpu_memory_utilization == sglang_mem_fraction_static(h100, 1)
    gemma = load_model(str(CONFIGS / "google--gemma-3-4b-it.json"))
    assert memory_breakdown(gemma, h100, Layout(), 8192).gpu_memory_utilization == 0.9
