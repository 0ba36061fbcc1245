"""SGLang's and TensorRT-LLM's KV budgets against what their startup logs show
(benchmarks/data/sglang_startups.csv, trtllm_startups.csv; benchmarks/engine_memory_accuracy.py)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

from gpufleet.plan.layout import Layout
from gpufleet.plan.memory import GIB, memory_breakdown, sglang_free_before_load_bytes
from gpufleet.plan.weights import stage_weight_bytes
from gpufleet.specs import load_gpu, load_model


def test_sglang_kv_pool_is_its_fraction_of_the_memory_free_before_loading() -> None:
    """ModelRunner.profile_max_num_token: the pool is free-after-load - total_gpu_memory x
    (1 - mem_fraction_static), total_gpu_memory being what was free before loading; so the
    fraction applies to the memory left after the CUDA context and the all-reduce buffers,
    not to the device's total. SGLang's docs log (Llama-3.1-8B, H100, 0.88): avail 78.81 GB
    before and 63.72 GB after loading, K + V 54.26 GB = 0.88 x 78.81 - 15.09."""
    model, gpu = load_model("meta-llama/Meta-Llama-3.1-8B"), load_gpu("h100-sxm")
    for tp in (1, 4):
        layout = Layout(tp=tp)
        mem = memory_breakdown(model, gpu, layout, 8192, gpu_memory_utilization=0.88,
                               engine="sglang")  # fmt: skip
        free = sglang_free_before_load_bytes(layout, gpu)
        weights = stage_weight_bytes(model, layout, 0, gpu)
        assert mem.kv_cache_bytes == pytest.approx(0.88 * free - weights)
    # The docs log's own arithmetic, which the rule reproduces from its logged inputs.
    logged_kv = 0.88 * 78.81 - (78.81 - 63.72)
    assert logged_kv == pytest.approx(27.13 * 2, abs=0.01)


def test_sglang_kv_pool_of_qwen3_235b_fp8_on_four_h100s_matches_its_log() -> None:
    """vllm-project/vllm#21348: Qwen3-235B-A22B-FP8, TP 4 on H100, --mem-fraction-static
    0.93 logs 'KV Cache is allocated. #tokens: 367404, K size: 8.23 GB, V size: 8.23 GB'.
    Charging the CUDA context and the all-reduce buffers in full against 0.93 x total
    (instead of 0.93 of what they leave) put it at 15.97 GiB, -3.0 %; now 16.38, -0.5 %."""
    mem = memory_breakdown(
        load_model("Qwen/Qwen3-235B-A22B"), load_gpu("h100-sxm"), Layout(tp=4, weight_dtype="fp8"),
        40960, gpu_memory_utilization=0.93, engine="sglang",
    )  # fmt: skip
    assert mem.kv_cache_bytes / GIB == pytest.approx(16.46, rel=0.01)
    assert mem.kv_tokens_logged == pytest.approx(367404, rel=0.01)


def test_trtllm_kv_cache_is_its_fraction_of_what_the_profiling_run_left() -> None:
    """NVIDIA/TensorRT-LLM#6294 (0.20.0, H100, Llama-3.1-8B-Instruct-FP8, fp8 KV, trtllm-bench:
    fraction 0.8, max_num_tokens 23552): 'Allocated 52.51 GiB for max tokens in paged KV cache
    (860320)'; KvCacheCreator gives (total - peak of the dummy run) x fraction."""
    mem = memory_breakdown(
        load_model("meta-llama/Meta-Llama-3.1-8B"), load_gpu("h100-sxm"),
        Layout(weight_dtype="fp8", kv_dtype="fp8"), 8192, gpu_memory_utilization=0.8,
        max_num_batched_tokens=23552, engine="trtllm",
    )  # fmt: skip
    assert mem.kv_cache_bytes / GIB == pytest.approx(52.51, rel=0.01)


def _benchmark() -> ModuleType:
    path = Path(__file__).resolve().parents[2] / "benchmarks" / "engine_memory_accuracy.py"
    spec = importlib.util.spec_from_file_location("engine_memory_accuracy", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.process  # importing the benchmark stamps the run with `git rev-parse`
def test_engine_startups_are_sourced_and_within_10_percent() -> None:
    report = _benchmark().run()
    for engine, part in report["engines"].items():
        assert part["cases"], engine
        assert all(c["source"].startswith("https://") for c in part["cases"])
        for key in ("kv_gib", "kv_tokens"):
            assert part["summary"][key]["worst_abs_error_pct"] < 10.0, (engine, key)
