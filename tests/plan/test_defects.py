"""The defects of issue 14, each as a user met it; every test failed before its fix."""

from __future__ import annotations

import dataclasses

import pytest

from gpufleet.errors import UserError
from gpufleet.perf.calibration import default_calibration
from gpufleet.perf.comm import MIB
from gpufleet.perf.layer_costs import compute_dtype
from gpufleet.perf.step_time import StepBatch
from gpufleet.plan.closed_loop import predict_closed_loop
from gpufleet.plan.engines import engine_rules
from gpufleet.plan.layout import Layout
from gpufleet.plan.memory import memory_breakdown
from gpufleet.plan.perf_serving import layout_step_model, predict_serving, scheduler_for
from gpufleet.plan.search import PlanRequest, plan
from gpufleet.plan.weights import weight_bytes_per_gpu
from gpufleet.specs import load_gpu, load_model
from gpufleet.specs.gpus import GpuSpec
from gpufleet.specs.quant import NVFP4

GIB = 1 << 30
H100 = load_gpu("h100-sxm")
B200 = load_gpu("b200")


def _weights_gib(name: str, tp: int, gpu: str = "h100-sxm") -> float:
    model = load_model(name)
    layout = Layout(tp=tp, weight_dtype=model.checkpoint_dtype, kv_dtype="bf16")
    return weight_bytes_per_gpu(model, layout, load_gpu(gpu)) / GIB


def test_dense_nvfp4_checkpoint_is_four_bit_and_fast_on_blackwell() -> None:
    model = load_model("RedHatAI/Llama-3.1-70B-Instruct-NVFP4")
    assert model.checkpoint_dtype == "nvfp4"
    # 70.6B params at 4.5 bits + bf16 embeddings / lm_head: ~40 GiB, not bf16's 131 GiB.
    assert 36 < _weights_gib(model.name, 1, "b200") < 44
    b200 = plan(PlanRequest(model=model, gpu=B200, rps=1, disaggregation="off"))
    assert b200.chosen.layout.num_gpus == 1 and b200.chosen.layout.weight_dtype == "nvfp4"
    assert b200.chosen.performance is not None and b200.chosen.performance.ttft_s < 1.0
    # W4A4 on Blackwell's fp4 tensor cores; Hopper has none: weight-only W4A16 at bf16.
    assert compute_dtype(NVFP4, B200) == "fp4" and compute_dtype(NVFP4, H100) == "bf16"
    layout = b200.chosen.layout
    b200_step = layout_step_model(model, B200, layout)
    h100_step = layout_step_model(model, H100, layout)
    prompt = StepBatch(prefill_tokens=(4096,), prefill_context_tokens=(0,))
    assert h100_step.step_time_s(prompt) > 4 * b200_step.step_time_s(prompt)


def test_a_kv_cache_that_holds_no_request_is_rejected_not_run_one_at_a_time() -> None:
    with pytest.raises(UserError, match="less than one request"):
        scheduler_for(H100, kv_capacity_tokens=1000, tokens_per_request=1536)
    assert scheduler_for(H100, kv_capacity_tokens=3072, tokens_per_request=1536).max_running == 2


def test_engines_admit_and_budget_memory_their_own_way() -> None:
    rules = {e: engine_rules(e, H100, tp=1) for e in ("vllm", "sglang", "trtllm")}
    # vLLM and SGLang admit on blocks in use (the prompt and part of the output), TRT-LLM's
    # guaranteed-no-evict scheduler reserves the whole request.
    assert rules["vllm"].admission_tokens(1024, 1024) < 2048
    assert rules["sglang"].admission_tokens(1024, 1024) < 2048
    assert rules["trtllm"].admission_tokens(1024, 1024) == 2048
    # SGLang's --mem-fraction-static comes from the GPU's memory, not vLLM's 0.9.
    assert rules["sglang"].memory_fraction != 0.9 and rules["sglang"].mixed_prefill is False
    model = load_model("llama-3.1-8b")
    layout = Layout(tp=1, weight_dtype="bf16", kv_dtype="bf16")

    def kv(engine: str, fraction: float | None = None) -> float:
        return memory_breakdown(model, H100, layout, 8192, engine=engine,
                                gpu_memory_utilization=fraction).kv_cache_bytes  # fmt: skip

    vllm = memory_breakdown(model, H100, layout, 8192, engine="vllm")
    assert vllm.usable_bytes == pytest.approx(0.9 * H100.memory_bytes)
    assert kv("sglang") < kv("vllm")  # 0.834 of the GPU on an 80 GB card
    # vLLM's fraction is of the whole GPU (weights inside it); TRT-LLM's of the memory
    # free after the weights: halving it halves TRT-LLM's KV, and cuts vLLM's by more.
    assert kv("trtllm", 0.45) == pytest.approx(kv("trtllm", 0.9) / 2, rel=0.01)
    assert kv("vllm", 0.45) < 0.4 * kv("vllm", 0.9)


def test_gemma2_ties_embeddings_alternates_sliding_layers_and_logs_kv_tokens_as_vllm() -> None:
    model = load_model("google/gemma-2-27b-it")  # its config.json has no tie_word_embeddings
    assert model.tie_word_embeddings
    assert _weights_gib(model.name, 1) == pytest.approx(50.72, rel=0.01)  # vLLM 0.19 log
    windows = [layer.sliding_window for layer in model.layers[:4]]
    assert windows == [4096, None, 4096, None]  # alternating, not every layer sliding
    layout = Layout(tp=1, weight_dtype="bf16", kv_dtype="bf16")
    mem = memory_breakdown(model, H100, layout, 8192, gpu_memory_utilization=0.95,
                           engine_version=(0, 19, 0))  # fmt: skip
    assert mem.kv_tokens_logged == pytest.approx(58672, rel=0.03)  # "GPU KV cache size"
    # Its effective capacity for 8192-token sequences is larger: sliding layers hold 4096.
    assert mem.kv_capacity_tokens > 1.2 * mem.kv_tokens_logged


@pytest.mark.parametrize(
    ("name", "tp", "logged_gib", "why"),
    [
        ("openai/gpt-oss-120b", 1, 65.97, "MXFP4 experts padded for the Marlin kernel"),
        ("meta-llama/Llama-4-Scout-17B-16E-Instruct", 4, 53.12, "RoPE cache, vision encoder"),
        ("meta-llama/Llama-3.1-405B-Instruct-FP8", 8, 57.752, "modules_to_not_convert bf16"),
    ],
)
def test_weights_as_vllm_logs_them(name: str, tp: int, logged_gib: float, why: str) -> None:
    assert _weights_gib(name, tp) == pytest.approx(logged_gib, rel=0.03), why


def test_gpu_memory_utilization_offers_layouts_the_default_does_not() -> None:
    req = dict(
        model=load_model("meta-llama/Llama-3.1-70B"), gpu=H100, quant="bf16", max_gpus=2,
        input_tokens=512, output_tokens=256, max_model_len=4096, disaggregation="off",
    )  # fmt: skip
    with pytest.raises(UserError, match="max-gpus"):
        plan(PlanRequest(**req))
    p = plan(PlanRequest(**req, gpu_memory_utilization=0.95))
    assert p.chosen.layout.num_gpus == 2 and p.chosen.memory.kv_cache_bytes > 0
    assert "--gpu-memory-utilization 0.95" in p.launch.vllm
    assert "--mem-fraction-static 0.95" in p.launch.sglang


def test_sglang_prefills_of_arrivals_land_in_tpot_with_short_outputs() -> None:
    """SGLang runs a prefill batch on its own between decode batches (no chunked mixing by
    default): with short outputs each request's TPOT carries the arrivals' prefills."""
    model = load_model("llama-3.1-8b")
    layout = Layout(tp=1, weight_dtype="bf16", kv_dtype="bf16")
    step = layout_step_model(model, H100, layout)  # one step model: only scheduling differs
    args = (model, H100, layout, 2048, 32, 64)
    vllm = predict_serving(*args, backend="vllm", step_model=step)
    sglang = predict_serving(*args, backend="sglang", step_model=step)
    assert sglang.tpot_s > 1.3 * vllm.tpot_s


def test_gb200_nvl72_is_in_the_catalog_and_tp_ep_across_trays_is_planned() -> None:
    gb200, gb300 = load_gpu("gb200"), load_gpu("gb300")
    assert gb200.domain_gpus == gb300.domain_gpus == 72 and gb200.gpus_per_node == 4
    kimi = load_model("moonshotai/Kimi-K2-Instruct")
    p = plan(PlanRequest(model=kimi, gpu=gb200, rps=5, disaggregation="off"))
    assert p.chosen.layout.stage_gpus > gb200.gpus_per_node
    assert not any("beyond one NVLink domain" in d.reason for d in p.decisions)


def test_sglang_packs_the_prompts_that_arrived_into_one_prefill_iteration() -> None:
    """Short outputs at high concurrency on SGLang: ~70 prompts a second arrive; each
    prefill-only iteration takes all those waiting (one iteration's fixed cost for several
    prompts), so decodes keep most of the GPU (measured TPOT ~34 ms at TP 8, c=448)."""
    model = load_model("llama-3.1-8b")
    h200 = load_gpu("h200")
    layout = Layout(tp=8, weight_dtype="bf16", kv_dtype="bf16")
    step = layout_step_model(model, h200, layout, backend="sglang")
    p = predict_serving(model, h200, layout, 1000, 100, 448, backend="sglang", step_model=step)
    n = round(p.running_decodes)
    decode_s = step.step_time_s(StepBatch(num_decode=n, decode_context_tokens=n * 1050))
    assert p.prefill_share < 0.8
    assert p.tpot_s < 4 * decode_s


def test_experts_split_by_tensor_parallelism_cost_their_flops_once() -> None:
    """Qwen3-235B on 8 H200s, experts sliced over 8 GPUs (moe_tp 8, ep 1) or spread whole
    (ep 8): the same expert FLOPs over the same GPUs. The slice's FLOPs were divided by the
    GPUs a second time, so a TP-sharded prefill looked 8x cheaper in its experts (and the
    fit pushed TRT-LLM's grouped-GEMM efficiency to its floor to make up for it)."""
    model = load_model("Qwen/Qwen3-235B-A22B-FP8")
    h200 = load_gpu("h200")
    prefill = StepBatch(prefill_tokens=(16384,), prefill_context_tokens=(0,))

    def work_s(ep: int, skew: float) -> float:
        cal = dataclasses.replace(default_calibration(), routing_skew=skew)
        layout = Layout(tp=8, ep=ep, weight_dtype="fp8")
        step = layout_step_model(model, h200, layout, calibration=cal)
        return step.breakdown_s(prefill)["compute_and_memory_s"]

    # Same attention and dense GEMMs; under even routing the slices do no less work than
    # whole experts, and under skewed routing whole experts on EP ranks do more: the
    # busiest rank (the others wait for it) holds more than its share of the popular ones.
    assert work_s(1, 0.0) >= work_s(8, 0.0) * (1 - 1e-9)
    assert work_s(8, 1.0) > work_s(1, 1.0)


def test_small_tp_all_reduces_run_on_the_engines_nvlink_kernels() -> None:
    """Decode all-reduces (~1 MiB at TP 8) run on the engines' own one-/two-shot NVLink
    kernels, ~10 µs each, not NCCL's mid-size curve (~35 µs): Llama-70B at TP 8 all-reduces
    160 times per step, so the curve alone cost a decode step ~4 ms too much (and the fit
    pinned the all-reduce latency at its 2 µs floor to make up for it). Over PCIe, NCCL."""
    model = load_model("meta-llama/Llama-3.1-70B")
    layout = Layout(tp=8, weight_dtype="fp8", kv_dtype="fp8")
    decode = StepBatch(num_decode=64, decode_context_tokens=64 * 2048)
    cal = dataclasses.replace(default_calibration(), allreduce_latency_s=10e-6)

    def allreduce_s(gpu: GpuSpec) -> float:
        step = layout_step_model(model, gpu, layout, calibration=cal)
        return step.breakdown_s(decode)["allreduce_s"]

    # 10 µs + 1 MiB x 2 x 7/8 at 450 GB/s, 160 times.
    assert allreduce_s(H100) == pytest.approx(160 * (10e-6 + 2 * MIB * 7 / 8 / 450e9), rel=0.05)
    assert allreduce_s(load_gpu("l40s")) > 3 * allreduce_s(H100)


def test_overlap_scheduling_engines_start_a_new_prefill_one_iteration_later() -> None:
    """SGLang and TRT-LLM form iteration i+1 while the GPU runs iteration i (both by
    default; vLLM's async scheduling is opt-in): a request arriving during i is first
    scheduled in i+2, so its TTFT holds one more iteration than vLLM's would."""
    h200 = load_gpu("h200")
    assert scheduler_for(h200, backend="sglang").iterations_ahead == 1
    assert scheduler_for(h200, backend="trtllm").iterations_ahead == 1
    assert scheduler_for(h200, backend="vllm").iterations_ahead == 0
    model = load_model("llama-3.1-8b")
    layout = Layout(tp=1, weight_dtype="bf16", kv_dtype="bf16")
    step = layout_step_model(model, h200, layout, backend="trtllm")
    shape = scheduler_for(h200, backend="trtllm")
    late = predict_closed_loop(step, 1024, 256, 32, shape)
    now = predict_closed_loop(step, 1024, 256, 32, dataclasses.replace(shape, iterations_ahead=0))
    assert late.ttft_s - now.ttft_s == pytest.approx(late.tpot_s, rel=0.25)
