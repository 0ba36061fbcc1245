"""The roofline step-time model, the all-reduce curve and the closed-loop solver."""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import pytest

from gpufleet.perf.comm import MIB, AllReduceCurve
from gpufleet.perf.roofline import RooflineStepTimeModel
from gpufleet.perf.step_time import LinearStepTimeModel, StepBatch, StepTimeModel
from gpufleet.plan.closed_loop import balance_wait_iterations, batch_wait_iterations
from gpufleet.plan.layout import Layout
from gpufleet.plan.perf_serving import (
    SchedulerShape,
    max_concurrency_within_slo,
    predict_closed_loop,
    predict_serving,
)
from gpufleet.specs.catalog import load_model
from gpufleet.specs.gpus import load_gpu

H100 = load_gpu("h100-sxm")
H200 = load_gpu("h200")
LLAMA_8B = load_model("meta-llama/Llama-3.1-8B")
LLAMA_70B = load_model("meta-llama/Llama-3.1-70B")
DSV3 = load_model("deepseek-ai/DeepSeek-V3")


def decode(n: int, ctx: int = 1024) -> StepBatch:
    return StepBatch(num_decode=n, decode_context_tokens=n * ctx)


def prefill(n: int, ctx: int = 0) -> StepBatch:
    return StepBatch(prefill_tokens=(n,), prefill_context_tokens=(ctx,))


# ---- all-reduce curve ------------------------------------------------------------------


def test_allreduce_bus_bandwidth_matches_nccl_tests_points() -> None:
    curve = AllReduceCurve(link_gbps=450.0)
    assert curve.bus_gbps(512 * MIB) == pytest.approx(445, rel=0.01)
    assert curve.bus_gbps(64 * MIB) == pytest.approx(362, rel=0.01)
    assert curve.bus_gbps(16 * MIB) == pytest.approx(240, rel=0.01)


def test_allreduce_small_messages_pay_latency_not_bandwidth() -> None:
    curve = AllReduceCurve(link_gbps=450.0, latency_s=10e-6)
    assert curve.all_reduce_s(4096, 8) == pytest.approx(10e-6)
    # A 1 MiB decode all-reduce is far slower than peak bandwidth would say.
    peak_only_s = 1 * MIB * 2 * 7 / 8 / 450e9
    assert curve.all_reduce_s(1 * MIB, 8) > 3 * peak_only_s
    assert curve.all_reduce_s(1, 1) == 0.0


def test_allreduce_time_grows_with_size_and_shrinks_with_faster_links() -> None:
    slow, fast = AllReduceCurve(225.0), AllReduceCurve(450.0)
    sizes = [64 * 1024, 1 * MIB, 16 * MIB, 128 * MIB, 1024 * MIB]
    times = [fast.all_reduce_s(s, 8) for s in sizes]
    assert times == sorted(times)
    assert slow.all_reduce_s(256 * MIB, 8) > 1.9 * fast.all_reduce_s(256 * MIB, 8)


# ---- step time ---------------------------------------------------------------------------


def model_for(spec=LLAMA_8B, gpu=H100, **layout: object) -> RooflineStepTimeModel:
    return RooflineStepTimeModel(spec, gpu, Layout(**layout))  # type: ignore[arg-type]


def test_is_a_step_time_model_and_empty_batch_is_free() -> None:
    m = model_for()
    assert isinstance(m, StepTimeModel)
    assert m.step_time_s(StepBatch()) == 0.0
    assert m.pipeline_stages == 1


def test_decode_is_bandwidth_bound_so_batching_is_nearly_free() -> None:
    m = model_for()
    one, many = m.step_time_s(decode(1)), m.step_time_s(decode(32))
    assert many > one
    assert many < 2 * one  # 32x the tokens, well under 2x the time: weights read once
    # 8B bf16 reads 16 GB of weights: at 3.35 TB/s that alone is ~4.8 ms.
    assert 4.8e-3 < one < 12e-3


def test_decode_grows_with_context() -> None:
    m = model_for()
    assert m.step_time_s(decode(64, 8192)) > m.step_time_s(decode(64, 512))


def test_prefill_is_compute_bound_and_linear_at_large_sizes() -> None:
    m = model_for()
    t4k, t8k = m.step_time_s(prefill(4096)), m.step_time_s(prefill(8192))
    assert 1.8 < t8k / t4k < 2.4  # linear GEMMs plus a growing attention term
    # 2 x 8B FLOPs per token at < 989 TFLOP/s: at least 0.13 ms per token.
    assert t8k > 8192 * 2 * 8e9 / 989e12


def test_attention_context_costs_prefill_time() -> None:
    m = model_for()
    assert m.step_time_s(prefill(2048, ctx=30000)) > 1.3 * m.step_time_s(prefill(2048))


def test_h200_decodes_faster_than_h100_and_fp8_faster_than_bf16() -> None:
    assert model_for(gpu=H200).step_time_s(decode(8)) < model_for().step_time_s(decode(8))
    fp8 = model_for(weight_dtype="fp8")
    assert fp8.step_time_s(decode(8)) < 0.8 * model_for().step_time_s(decode(8))
    assert fp8.step_time_s(prefill(8192)) < 0.7 * model_for().step_time_s(prefill(8192))


def test_tensor_parallel_helps_but_all_reduce_costs() -> None:
    tp1 = model_for(LLAMA_70B, weight_dtype="fp8")
    tp4 = model_for(LLAMA_70B, tp=4, weight_dtype="fp8")
    t1, t4 = tp1.step_time_s(decode(16)), tp4.step_time_s(decode(16))
    assert t4 < t1
    assert t4 > t1 / 4  # communication and overhead: less than linear speed-up
    assert tp4.breakdown_s(decode(16))["allreduce_s"] > 0
    assert tp1.breakdown_s(decode(16))["allreduce_s"] == 0


def test_pipeline_parallel_exposes_stages_and_adds_hops() -> None:
    pp1 = model_for(LLAMA_70B, tp=4, weight_dtype="fp8")
    pp2 = model_for(LLAMA_70B, tp=4, pp=2, weight_dtype="fp8")
    assert pp2.pipeline_stages == 2
    assert pp2.step_time_s(decode(16)) > pp1.step_time_s(decode(16))


def test_moe_decode_reads_only_touched_experts() -> None:
    m = model_for(DSV3, H200, tp=8, ep=8, weight_dtype="fp8")
    one, many = m.step_time_s(decode(1)), m.step_time_s(decode(256))
    # One token touches 8 of 256 experts per layer; 256 tokens touch nearly all.
    assert many > 2 * one


def test_model_is_pure() -> None:
    m = model_for(DSV3, H200, tp=8, ep=8, weight_dtype="fp8")
    b = StepBatch(prefill_tokens=(512, 100), prefill_context_tokens=(0, 900), num_decode=7,
                  decode_context_tokens=7000)  # fmt: skip
    assert m.step_time_s(b) == m.step_time_s(b)


# ---- closed loop -------------------------------------------------------------------------

LINEAR = LinearStepTimeModel(base_s=0.01, per_token_s=2e-5, per_context_token_s=1e-8)


def test_one_client_ttft_is_its_prefill_and_tpot_its_decode_step() -> None:
    p = predict_closed_loop(LINEAR, 1000, 100, 1)
    prefill_s = LINEAR.step_time_s(prefill(1000))
    decode_s = LINEAR.step_time_s(decode(1, 1050))
    assert p.tpot_s == pytest.approx(decode_s, rel=0.05)
    assert prefill_s <= p.ttft_s <= prefill_s + decode_s
    assert p.requests_per_s == pytest.approx(1 / (p.ttft_s + 99 * p.tpot_s), rel=1e-6)


def test_latency_and_throughput_grow_with_concurrency() -> None:
    preds = [predict_closed_loop(LINEAR, 2000, 200, c) for c in (1, 4, 16, 64)]
    for a, b in itertools.pairwise(preds):
        assert b.ttft_s >= a.ttft_s
        assert b.tpot_s >= a.tpot_s
        assert b.output_tokens_per_s > a.output_tokens_per_s
        # Little's law in every prediction.
        assert b.requests_per_s * b.e2e_latency_s == pytest.approx(b.concurrency, rel=1e-6)


def test_separate_prefill_batches_stall_decodes_more_than_mixed() -> None:
    mixed = predict_closed_loop(LINEAR, 4000, 100, 32, SchedulerShape(mixed_prefill=True))
    separate = predict_closed_loop(LINEAR, 4000, 100, 32, SchedulerShape(mixed_prefill=False))
    assert separate.tpot_s > mixed.tpot_s


def test_clients_beyond_max_running_wait_in_queue() -> None:
    capped = predict_closed_loop(LINEAR, 500, 100, 64, SchedulerShape(max_running=16))
    free = predict_closed_loop(LINEAR, 500, 100, 16)
    assert capped.requests_per_s == pytest.approx(free.requests_per_s, rel=0.01)
    assert capped.ttft_s > free.ttft_s + 30 * free.tpot_s


def test_first_wave_of_a_finite_benchmark_adds_queueing() -> None:
    steady = predict_closed_loop(LINEAR, 2000, 100, 32)
    bench = predict_closed_loop(LINEAR, 2000, 100, 32, requests_per_client=4)
    assert bench.ttft_s > steady.ttft_s
    assert bench.tpot_s == steady.tpot_s


def test_batch_waiting_holds_prompts_for_its_timeout_at_low_load() -> None:
    # TRT-LLM's batch_wait_timeout_iters: with 4 clients the held prompts never reach the
    # token threshold (0.9 x 16384), so each waits about the whole 20-iteration window.
    plain = predict_closed_loop(LINEAR, 1024, 1024, 4, SchedulerShape(max_num_batched_tokens=16384))
    held = predict_closed_loop(
        LINEAR,
        1024,
        1024,
        4,
        SchedulerShape(max_num_batched_tokens=16384, batch_wait_iterations=20,
                       batch_wait_tokens=int(0.9 * 16384)),
    )  # fmt: skip
    assert held.ttft_s - plain.ttft_s == pytest.approx(20 * held.tpot_s, rel=0.1)
    assert held.tpot_s == pytest.approx(plain.tpot_s, rel=0.02)
    # A threshold one prompt reaches releases it at once: no wait.
    low = SchedulerShape(batch_wait_iterations=20, batch_wait_tokens=1000)
    assert predict_closed_loop(LINEAR, 1024, 1024, 4, low).ttft_s == pytest.approx(
        predict_closed_loop(LINEAR, 1024, 1024, 4).ttft_s, rel=1e-3
    )


def test_batch_wait_window_closes_early_when_prompts_arrive_fast() -> None:
    # The window ends at the timeout, or once enough prompts (with the decodes) reach the
    # threshold; prompts that join a window wait less than the one that opened it.
    assert batch_wait_iterations(20, 0, 1024, 8, 0.0) == 20.0
    assert batch_wait_iterations(20, 0, 1024, 8, 1.0) == pytest.approx(20 * 11 / 21)
    # 3 prompts reach 3000 tokens beside 8 decodes: the window lasts 2 arrivals.
    assert batch_wait_iterations(20, 3000, 1024, 8, 0.5) == pytest.approx(4 * 2 / 3)
    assert batch_wait_iterations(20, 1000, 1024, 8, 0.5) == 0.0


def test_attention_dp_balancing_holds_prompts_until_every_rank_has_one() -> None:
    # TRT-LLM's enable_balance (timeout_iters 60): at low load the window times out, so a
    # prompt waits most of 60 iterations; one rank alone never waits; fast arrivals fill
    # every rank (about 8 x H(8) = 21.7 prompts for 8 ranks) before the timeout.
    assert balance_wait_iterations(60, 8, 0.0) == 60.0
    assert balance_wait_iterations(60, 1, 0.0) == 0.0
    needed = 8 * sum(1 / k for k in range(1, 9))
    assert balance_wait_iterations(60, 8, 2.0) == pytest.approx(
        (needed - 1) / 2 * (1 + (needed - 1) / 2) / needed
    )
    plain = SchedulerShape(max_num_batched_tokens=8192)
    held = SchedulerShape(
        max_num_batched_tokens=8192, balance_timeout_iterations=60, balance_ranks=8
    )
    free = predict_closed_loop(LINEAR, 1024, 1024, 16, plain)
    balanced = predict_closed_loop(LINEAR, 1024, 1024, 16, held)
    assert balanced.ttft_s - free.ttft_s > 30 * balanced.tpot_s
    assert balanced.tpot_s == pytest.approx(free.tpot_s, rel=0.05)
    # One client per rank: the prompting rank has no decode left, which releases the hold.
    assert predict_closed_loop(LINEAR, 1024, 1024, 1, held).ttft_s == pytest.approx(
        predict_closed_loop(LINEAR, 1024, 1024, 1, plain).ttft_s, rel=1e-3
    )


def test_bad_arguments_are_rejected() -> None:
    with pytest.raises(ValueError):
        predict_closed_loop(LINEAR, 0, 10, 1)


def test_max_concurrency_is_the_largest_meeting_both_slos() -> None:
    best = max_concurrency_within_slo(LINEAR, 1000, 200, ttft_slo_s=0.5, tpot_slo_s=0.03)
    assert best is not None
    assert best.ttft_s <= 0.5 and best.tpot_s <= 0.03
    over = predict_closed_loop(LINEAR, 1000, 200, best.concurrency + 1)
    assert over.ttft_s > 0.5 or over.tpot_s > 0.03
    assert max_concurrency_within_slo(LINEAR, 1000, 200, ttft_slo_s=0.001, tpot_slo_s=1) is None


def test_predict_serving_for_a_layout() -> None:
    layout = Layout(tp=2, weight_dtype="fp8")
    p = predict_serving(LLAMA_70B, H100, layout, 1024, 256, 16)
    assert 0 < p.ttft_s < 5 and 0 < p.tpot_s < 0.2
    assert p.output_tokens_per_s == pytest.approx(p.requests_per_s * 256)


def test_mixed_iterations_are_capped_by_the_token_budget() -> None:
    # Long prompts, short answers: prefill demand exceeds what the budget lets through,
    # so prompts queue (TTFT grows) while TPOT stays at most one full-budget iteration.
    sched = SchedulerShape(max_num_batched_tokens=2048)
    full_s = LINEAR.step_time_s(
        StepBatch(prefill_tokens=(2048,), prefill_context_tokens=(0,), num_decode=0)
    )
    preds = [predict_closed_loop(LINEAR, 8000, 20, c, sched) for c in (8, 32, 128)]
    for p in preds:
        assert p.tpot_s <= full_s * 1.1
    assert preds[-1].ttft_s > 3 * preds[0].ttft_s
    assert preds[-1].output_tokens_per_s >= 0.95 * preds[0].output_tokens_per_s


@dataclass(frozen=True)
class Pipelined:
    """A real StepTimeModel with pipeline stages: LINEAR's times, two micro-batches in flight."""

    pipeline_stages: int = 2

    def step_time_s(self, batch: StepBatch) -> float:
        return LINEAR.step_time_s(batch)


def test_pipeline_micro_batches_add_throughput_not_latency() -> None:
    flat = predict_closed_loop(LINEAR, 1000, 200, 16)
    piped = predict_closed_loop(Pipelined(), 1000, 200, 32)
    # Each of the two micro-batches runs 16 clients exactly like the flat model.
    assert piped.tpot_s == pytest.approx(flat.tpot_s)
    assert piped.ttft_s == pytest.approx(flat.ttft_s)
    assert piped.requests_per_s == pytest.approx(2 * flat.requests_per_s)
    assert piped.requests_per_s * piped.e2e_latency_s == pytest.approx(32, rel=1e-6)


def test_roofline_pp_layout_serves_more_at_the_same_latency() -> None:
    layout = Layout(tp=4, pp=2, weight_dtype="fp8")
    one = predict_serving(LLAMA_70B, H100, layout, 1024, 256, 1)
    many = predict_serving(LLAMA_70B, H100, layout, 1024, 256, 2)
    # A lone request pays the whole pipeline; a second fills the bubble at no TPOT cost.
    assert many.tpot_s == pytest.approx(one.tpot_s, rel=0.01)
    assert many.output_tokens_per_s == pytest.approx(2 * one.output_tokens_per_s, rel=0.02)


def test_moe_gemm_efficiency_slows_prefill_not_decode() -> None:
    import dataclasses
    from types import MappingProxyType

    from gpufleet.perf.calibration import default_calibration

    cal = default_calibration()
    base = dataclasses.replace(cal.backend("trtllm"), moe_gemm_efficiency=1.0)
    slow = dataclasses.replace(base, moe_gemm_efficiency=0.1)
    fast_cal = dataclasses.replace(cal, backends=MappingProxyType({"x": base}))
    slow_cal = dataclasses.replace(cal, backends=MappingProxyType({"x": slow}))
    model, gpu = load_model("Qwen/Qwen3-235B-A22B"), load_gpu("h200")
    layout = Layout(tp=4, weight_dtype="fp8")
    fast_m = RooflineStepTimeModel(model, gpu, layout, calibration=fast_cal, backend="x")
    slow_m = RooflineStepTimeModel(model, gpu, layout, calibration=slow_cal, backend="x")
    prefill = StepBatch(prefill_tokens=(4096,), prefill_context_tokens=(0,))
    decode = StepBatch(num_decode=8, decode_context_tokens=8 * 2048)
    # Compute-bound grouped GEMMs (prefill) pay the kernel's FLOP/s; decode reads weights.
    assert slow_m.step_time_s(prefill) > 1.3 * fast_m.step_time_s(prefill)
    assert slow_m.step_time_s(decode) == pytest.approx(fast_m.step_time_s(decode))


def test_identical_requests_in_a_closed_loop_do_not_queue_below_saturation() -> None:
    """Clients that all send the same isl / osl arrive evenly spaced once they drift apart
    (deterministic service and arrivals: Kingman's factor 0): the planner's TTFT is the
    iteration in progress and the prompt's own prefill, not an exponential queue's wait."""
    from gpufleet.plan.closed_loop import FIXED_LENGTH_QUEUE_SCALE
    from gpufleet.plan.perf_serving import _serving_setup

    layout = Layout(tp=1, weight_dtype="fp8")
    got = predict_serving(LLAMA_70B, H100, layout, 1024, 256, 16)
    cal, step, sched = _serving_setup(
        LLAMA_70B, H100, layout, 1024, 256, "vllm", None, None, None, None, None
    )
    no_queue = predict_closed_loop(
        step, 1024, 256, 16, sched, ttft_overhead_s=cal.backend("vllm").ttft_overhead_s,
        queue_scale=0.0,
    )  # fmt: skip
    exponential = predict_closed_loop(
        step, 1024, 256, 16, sched, ttft_overhead_s=cal.backend("vllm").ttft_overhead_s,
        queue_scale=1.0,
    )  # fmt: skip
    assert FIXED_LENGTH_QUEUE_SCALE == 0.0
    assert got.ttft_s == pytest.approx(no_queue.ttft_s, rel=1e-9)
    assert exponential.ttft_s > got.ttft_s
