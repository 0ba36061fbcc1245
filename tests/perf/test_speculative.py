"""Multi-token prediction (perf.speculative): tokens per iteration and the iteration's cost."""

from __future__ import annotations

import pytest

from gpufleet.perf.speculative import SpeculativeStepModel, accepted_tokens
from gpufleet.perf.step_time import LinearStepTimeModel, StepBatch
from gpufleet.plan.closed_loop import SchedulerShape, predict_closed_loop


def test_accepted_tokens_is_the_expected_accepted_prefix_plus_one() -> None:
    assert accepted_tokens(0, 0.7) == 1.0
    assert accepted_tokens(1, 0.6) == pytest.approx(1.6)
    assert accepted_tokens(3, 0.5) == pytest.approx(1 + 0.5 + 0.25 + 0.125)
    assert accepted_tokens(3, 1.0) == 4.0
    with pytest.raises(ValueError):
        accepted_tokens(2, 1.5)


def test_drafts_and_verification_cost_more_than_a_plain_step() -> None:
    base = LinearStepTimeModel(base_s=0.002, per_token_s=1e-4, per_context_token_s=1e-8)
    batch = StepBatch(num_decode=8, decode_context_tokens=8 * 2000)
    plain = base.step_time_s(batch)
    spec = SpeculativeStepModel(base, draft_tokens=3, layers=10)
    # Verification: 3 more tokens per sequence (24 x 0.1 ms) at no more context; drafts:
    # 3 passes of one layer's share of the plain step (the fixed part counts here: the
    # linear model has no breakdown to take it out).
    expected = plain + 24 * 1e-4 + 3 * plain / 10
    assert spec.step_time_s(batch) == pytest.approx(expected)
    assert SpeculativeStepModel(base, 0, 10).step_time_s(batch) == plain
    # A prefill-only iteration has nothing to verify or draft.
    prefill = StepBatch(prefill_tokens=(512,), prefill_context_tokens=(0,))
    assert spec.step_time_s(prefill) == base.step_time_s(prefill)


def test_tpot_is_the_iteration_over_the_tokens_it_emits() -> None:
    base = LinearStepTimeModel(base_s=0.010, per_token_s=1e-5)
    spec = SpeculativeStepModel(base, draft_tokens=3, layers=60)
    one = predict_closed_loop(spec, 1024, 1024, 4, SchedulerShape())
    two = predict_closed_loop(spec, 1024, 1024, 4, SchedulerShape(accepted_tokens=2.0))
    # Same iterations, twice the tokens each: half the time per token, and more requests
    # per second through the same iterations.
    assert two.tpot_s == pytest.approx(one.tpot_s / 2, rel=0.02)
    assert two.requests_per_s > 1.8 * one.requests_per_s
    # The first token still waits whole iterations, not tokens' worth of them.
    assert two.ttft_s == pytest.approx(one.ttft_s, rel=0.05)
