"""SGLang's scheduling of new prompts played out (`validation.sglang_loop`): each rule is a
test that fails without it."""

from __future__ import annotations

import pytest

from gpufleet.perf.step_time import StepBatch
from gpufleet.validation.sglang_loop import simulate_sglang_loop

PREFILL_S = 0.010  # a prefill batch, whatever it holds
DECODE_S = 0.001  # a decode step, whatever its size


class FixedSteps:
    """Prefill batches take PREFILL_S, decode steps DECODE_S: the loop's order shows."""

    def step_time_s(self, batch: StepBatch) -> float:
        if batch.prefill_tokens and batch.num_decode:
            raise AssertionError("SGLang never mixes prefill chunks with decodes by default")
        return PREFILL_S if batch.prefill_tokens else DECODE_S


def test_prompts_that_fit_the_chunk_share_one_prefill_batch() -> None:
    r = simulate_sglang_loop(
        FixedSteps(), 1000, 10, 4, chunk_tokens=8192, max_running=4096, requests_per_client=1
    )
    assert r.prefill_batches == 1
    assert r.ttft_s == pytest.approx(PREFILL_S)
    assert r.tpot_s == pytest.approx(DECODE_S)


def test_prefill_batches_are_capped_by_the_chunk_and_decodes_wait_for_all_of_them() -> None:
    # One 1000-token prompt per batch: the first waits one batch, the fourth four; decodes
    # start only when no prompt waits, so the first prompt's decodes wait three batches.
    osl = 11
    r = simulate_sglang_loop(
        FixedSteps(), 1000, osl, 4, chunk_tokens=1000, max_running=4096, requests_per_client=1
    )
    assert r.prefill_batches == 4
    assert r.ttft_s == pytest.approx(2.5 * PREFILL_S)
    assert r.tpot_s == pytest.approx(DECODE_S + 1.5 * PREFILL_S / (osl - 1))


def test_a_prompt_longer_than_the_chunk_is_prefilled_in_chunks() -> None:
    r = simulate_sglang_loop(
        FixedSteps(), 3000, 2, 1, chunk_tokens=1024, max_running=4096, requests_per_client=1
    )
    assert r.prefill_batches == 3 and r.ttft_s == pytest.approx(3 * PREFILL_S)


def test_clients_that_arrive_together_stay_together_without_jitter() -> None:
    # Every wave is a first wave: a cohort decodes in step and finishes in step.
    kw = {"chunk_tokens": 1000, "max_running": 4096, "requests_per_client": 3}
    r = simulate_sglang_loop(FixedSteps(), 1000, 11, 4, **kw)
    assert r.requests == 12 and r.prefill_batches == 12
    assert r.ttft_s == pytest.approx(r.first_wave_ttft_s)
    spread = simulate_sglang_loop(FixedSteps(), 1000, 11, 4, jitter_s=1.0, **kw)
    assert spread.ttft_s < r.ttft_s  # arrivals spread over a second wait for fewer others


def test_the_running_cap_holds_prompts_back() -> None:
    capped = simulate_sglang_loop(
        FixedSteps(), 1000, 11, 4, chunk_tokens=8192, max_running=2, requests_per_client=1
    )
    # Two run, the other two wait for them to finish: 10 decode steps and a second batch.
    assert capped.prefill_batches == 2
    assert capped.ttft_s == pytest.approx(PREFILL_S + (PREFILL_S + 10 * DECODE_S) / 2)


def test_unequal_output_lengths_break_the_cohorts_up() -> None:
    kw = {"chunk_tokens": 1000, "max_running": 4096, "requests_per_client": 4}
    step = simulate_sglang_loop(FixedSteps(), 1000, 101, 8, **kw)
    spread = simulate_sglang_loop(FixedSteps(), 1000, 101, 8, output_spread=0.2, **kw)
    assert step.ttft_s == pytest.approx(step.first_wave_ttft_s)  # every wave a first wave
    later_step = (step.ttft_s * 32 - step.first_wave_ttft_s * 8) / 24
    later_spread = (spread.ttft_s * 32 - spread.first_wave_ttft_s * 8) / 24
    assert later_spread < 0.8 * later_step


def test_clients_started_out_of_step_merge_only_where_prefill_is_much_of_the_time() -> None:
    # Started spread over a decode phase, a client whose prompt lands in another's prefill
    # phase joins that cohort for good: with prefill a tenth of the cycle (10 decodes) they
    # merge within a few cycles, with prefill a small share (1000 decodes) few do.
    kw = {"chunk_tokens": 1000, "max_running": 4096, "requests_per_client": 6}
    short = simulate_sglang_loop(FixedSteps(), 1000, 11, 8, start_spread=True, **kw)
    long = simulate_sglang_loop(FixedSteps(), 1000, 1001, 8, start_spread=True, **kw)
    assert short.requests == long.requests == 48
    assert long.ttft_s < 1.5 * PREFILL_S < 3 * PREFILL_S < short.ttft_s
