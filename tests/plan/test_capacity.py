"""The plan's concurrent sequences: min(max_num_seqs, KV tokens // tokens per request)."""

from __future__ import annotations

import dataclasses

import pytest

from gpufleet.errors import UserError
from gpufleet.plan.capacity import (
    DEFAULT_TOKENS_PER_REQUEST,
    concurrent_sequences,
    replica_capacity,
)
from gpufleet.plan.engines import engine_rules
from gpufleet.plan.perf_serving import scheduler_for, shape_of
from gpufleet.specs.gpus import load_gpu

LLAMA = "meta-llama/Llama-3.1-8B"


def test_scheduler_limit_wins_when_the_kv_cache_holds_more() -> None:
    assert concurrent_sequences(256, 400_000, 1280) == 256


def test_kv_cache_wins_when_it_holds_fewer() -> None:
    assert concurrent_sequences(256, 100_000, 1000) == 100
    assert concurrent_sequences(256, 100_999, 1000) == 100  # whole requests only


def test_never_below_one() -> None:
    assert concurrent_sequences(256, 500, 1280) == 1
    assert concurrent_sequences(256, 0, 1280) == 1


@pytest.mark.parametrize(
    ("seqs", "kv", "tokens", "field"),
    [(0, 1000, 10, "max_num_seqs"), (8, 1000, 0, "tokens_per_request"), (8, -1, 10, "kv")],
)
def test_bad_inputs_name_the_field(seqs: int, kv: int, tokens: int, field: str) -> None:
    with pytest.raises(UserError) as e:
        concurrent_sequences(seqs, kv, tokens)
    assert field in (e.value.field or "")


def test_default_request_is_the_plans_default() -> None:
    assert DEFAULT_TOKENS_PER_REQUEST == 1024 + 256


def test_scheduler_shape_uses_the_same_rule() -> None:
    gpu = load_gpu("h100-sxm")
    shape = scheduler_for(gpu, max_num_seqs=256, kv_capacity_tokens=50_000, tokens_per_request=1000)
    assert shape.max_running == concurrent_sequences(256, 50_000, 1000) == 50


def test_replica_capacity_is_bounded_by_max_num_seqs() -> None:
    cap = replica_capacity(LLAMA, "h100-sxm", max_num_seqs=8)
    assert cap.sequences == 8
    assert cap.kv_capacity_tokens is not None and cap.kv_capacity_tokens > 100_000
    assert "max_num_seqs 8" in cap.source and "1280 per request" in cap.source
    assert "default request 1024 in + 256 out" in cap.describe()


def test_replica_capacity_is_bounded_by_kv_for_long_requests() -> None:
    cap = replica_capacity(LLAMA, "h100-sxm", max_num_seqs=1024, tokens_per_request=32_000)
    assert cap.kv_capacity_tokens is not None
    assert cap.sequences == cap.kv_capacity_tokens // 32_000
    assert 1 <= cap.sequences < 1024
    # Twice the GPUs (tp 2) hold more KV, so more of those requests run at once.
    tp2 = replica_capacity(LLAMA, "h100-sxm", tp=2, max_num_seqs=1024, tokens_per_request=32_000)
    assert tp2.sequences > cap.sequences


def test_the_planner_and_the_accuracy_harness_read_batch_waiting_from_the_rules() -> None:
    # One translation of an engine's rules into the solver's shape: a recipe's TRT-LLM
    # batch waiting (20 iterations, 0.9 of the token budget) reaches it whoever builds it.
    rules = dataclasses.replace(
        engine_rules("trtllm", load_gpu("h200_sxm"), tp=2),
        batch_wait_iters=20,
        batch_wait_max_tokens_ratio=0.9,
    )
    shape = shape_of(rules, max_running=64, max_output_tokens_per_s=1e5)
    assert shape.batch_wait_iterations == 20
    assert shape.batch_wait_tokens == int(0.9 * rules.max_num_batched_tokens)
    assert shape_of(rules, max_running=64, max_output_tokens_per_s=1e5,
                    max_num_batched_tokens=1000).batch_wait_tokens == 900  # fmt: skip
