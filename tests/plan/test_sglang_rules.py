"""SGLang's documented scheduler defaults in the planner's engine model (plan.engines):
each test fails without the rule it names."""

from __future__ import annotations

import pytest

from gpufleet.errors import UserError
from gpufleet.plan.engines import (
    SGLANG_CLIP_MAX_NEW_TOKENS,
    SGLANG_MIN_NEW_TOKEN_RATIO,
    engine_max_running,
    engine_rules,
    kv_admitted_running,
    sglang_max_running_requests,
)
from gpufleet.plan.perf_serving import scheduler_for
from gpufleet.specs import load_gpu

H100 = load_gpu("h100-sxm")
LLAMA_CONTEXT = 131072


def test_sglang_request_pool_follows_the_kv_pool_and_context() -> None:
    # KV tokens / context x 512, clamped to [2048, 4096], at most half the KV tokens.
    assert sglang_max_running_requests(200_000, LLAMA_CONTEXT) == 2048
    assert sglang_max_running_requests(20_000_000, LLAMA_CONTEXT) == 4096
    assert sglang_max_running_requests(300_000, 32768) == 4096  # 4687 clamped
    assert sglang_max_running_requests(3000, LLAMA_CONTEXT) == 1500
    sglang, vllm = engine_rules("sglang", H100), engine_rules("vllm", H100)
    assert engine_max_running(sglang, 200_000, LLAMA_CONTEXT) == 2048
    assert engine_max_running(vllm, 200_000, LLAMA_CONTEXT) == vllm.max_num_seqs


def test_the_planner_runs_no_more_than_sglangs_request_pool() -> None:
    shape = scheduler_for(
        H100,
        backend="sglang",
        kv_capacity_tokens=400_000,
        tokens_per_request=100,
        context_tokens=LLAMA_CONTEXT,
    )
    assert shape.max_running == 2048  # the KV cache alone would hold 4000
    given = scheduler_for(
        H100,
        backend="sglang",
        max_num_seqs=3000,
        kv_capacity_tokens=400_000,
        tokens_per_request=100,
        context_tokens=LLAMA_CONTEXT,
    )
    assert given.max_running == 3000  # --max-running-requests given: the user's


def test_sglang_reserves_at_most_the_clipped_output_for_a_running_request() -> None:
    rules = engine_rules("sglang", H100)
    short = rules.admission_tokens(1024, 1024)
    assert short == pytest.approx(1024 + 512 + SGLANG_MIN_NEW_TOKEN_RATIO * 512)
    osl = 4 * SGLANG_CLIP_MAX_NEW_TOKENS
    clip = SGLANG_CLIP_MAX_NEW_TOKENS
    # Tokens still to come, min(remaining, 4096), averaged over the request's life.
    reserved = clip - clip * clip / (2 * osl)
    assert rules.admission_tokens(1024, osl) == pytest.approx(
        1024 + osl / 2 + SGLANG_MIN_NEW_TOKEN_RATIO * reserved
    )
    assert reserved < osl / 2


def test_sglang_prefill_batches_stay_within_max_prefill_tokens() -> None:
    b200 = load_gpu("b200")
    assert engine_rules("sglang", b200).max_num_batched_tokens == 16384
    assert engine_rules("sglang", H100).max_num_batched_tokens == 8192


def test_one_admission_cap_for_the_planner_and_the_row_validation() -> None:
    # plan.perf_serving.scheduler_for and validation.measured both take this one rule: the
    # engine's own cap (SGLang's from its pool), the KV fit below it, 0 when none fits.
    sglang, vllm = engine_rules("sglang", H100), engine_rules("vllm", H100)
    assert kv_admitted_running(sglang, 400_000, 100, LLAMA_CONTEXT) == 2048
    assert kv_admitted_running(sglang, 400_000, 1000, LLAMA_CONTEXT) == 400
    assert kv_admitted_running(vllm, 400_000, 100, LLAMA_CONTEXT) == vllm.max_num_seqs
    assert kv_admitted_running(vllm, 400_000, 100, LLAMA_CONTEXT, max_num_seqs=7) == 7
    assert kv_admitted_running(vllm, 400_000, 0, None) == vllm.max_num_seqs
    assert kv_admitted_running(vllm, 99, 100, LLAMA_CONTEXT) == 0
    with pytest.raises(UserError, match="less than one request"):
        scheduler_for(H100, kv_capacity_tokens=99, tokens_per_request=100)
