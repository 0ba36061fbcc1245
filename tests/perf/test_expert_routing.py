"""Skewed expert routing: fewer distinct experts per batch than uniform routing says, and
the busiest EP rank (the one the others wait for) carrying more than its even share."""

from __future__ import annotations

import dataclasses

import pytest

from gpufleet.perf.calibration import default_calibration
from gpufleet.perf.expert_routing import ExpertRouting, expert_pick_probabilities
from gpufleet.perf.roofline import RooflineStepTimeModel
from gpufleet.perf.step_time import StepBatch
from gpufleet.plan.layout import Layout
from gpufleet.specs.catalog import load_model
from gpufleet.specs.gpus import load_gpu


@pytest.mark.parametrize("skew", [0.0, 0.5, 1.0, 1.5])
def test_pick_probabilities_sum_to_top_k_and_stay_probabilities(skew: float) -> None:
    p = expert_pick_probabilities(256, 8, skew)
    assert sum(p) == pytest.approx(8.0)
    assert all(0.0 < x <= 1.0 for x in p)
    assert list(p) == sorted(p, reverse=True)


def test_no_skew_is_uniform_routing() -> None:
    r = ExpertRouting(256, 8, 0.0)
    for tokens in (1, 4, 64, 1000):
        assert r.rank_distinct_experts(tokens) == pytest.approx(256 * (1 - (1 - 8 / 256) ** tokens))
    assert ExpertRouting(256, 8, 0.0, ep=8).busiest_assignment_share == pytest.approx(1 / 8)


def test_skewed_routing_touches_fewer_experts_until_the_batch_reaches_them_all() -> None:
    uniform, skewed = ExpertRouting(256, 8, 0.0), ExpertRouting(256, 8, 1.0)
    assert skewed.rank_distinct_experts(1) == pytest.approx(8.0)  # one token: k experts
    for tokens in (4, 16, 64, 256):
        assert skewed.rank_distinct_experts(tokens) < uniform.rank_distinct_experts(tokens)
    assert skewed.rank_distinct_experts(100_000) == pytest.approx(256.0, rel=1e-3)


def test_busiest_ep_rank_carries_more_than_its_share_under_skew() -> None:
    r = ExpertRouting(128, 8, 1.0, ep=4)
    assert 0.25 < r.busiest_assignment_share < 1.0
    # ... and reads at least as many experts as the average rank.
    whole = ExpertRouting(128, 8, 1.0)
    assert r.rank_distinct_experts(32) >= whole.rank_distinct_experts(32) / 4


def test_skew_makes_mid_batch_moe_decode_cheaper() -> None:
    """The decode step of a TP-sharded MoE grows with the experts read: fewer under skew."""
    model, gpu = load_model("deepseek-ai/DeepSeek-V3"), load_gpu("h200")
    layout = Layout(tp=8, weight_dtype="fp8")
    cal = default_calibration()
    times = {}
    for skew in (0.0, 1.0):
        m = RooflineStepTimeModel(
            model, gpu, layout, calibration=dataclasses.replace(cal, routing_skew=skew)
        )
        times[skew] = m.step_time_s(StepBatch(num_decode=32, decode_context_tokens=32 * 2048))
    assert times[1.0] < 0.9 * times[0.0]
