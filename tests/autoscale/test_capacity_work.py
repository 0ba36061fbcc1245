"""The capacity within the SLO as a rate of work where the gateway counts prompt and
output tokens apart: output + weight × prompt tokens (a prompt token costs a replica a
fraction of an output token), so a mix that turns output-heavy at the same total tokens
lowers what a replica holds at once, which neither requests nor unweighted tokens see."""

from __future__ import annotations

from dataclasses import replace

import pytest

from autoscale.helpers import even, fleet
from gpufleet.autoscale.capacity import SloCapacity
from gpufleet.autoscale.policies.default import DefaultPolicy
from gpufleet.autoscale.signals import FleetSignals, Percentiles

LIGHT = (1000.0, 800.0)  # (tokens, prompt tokens) a request: prompt-heavy
HEAVY = (1000.0, 200.0)  # the same tokens, output-heavy


def signals(admitted: int, mix: tuple[float, float] | None) -> FleetSignals:
    tpot = Percentiles(0.05 / 3, 0.05 / 2, 0.05)
    tokens, prompt = mix if mix is not None else (None, None)
    return replace(fleet(even(4, 40)), admitted_total=admitted, tpot_s=tpot, window_s=60.0,
                   latency_requests=500, tokens_per_request=tokens,
                   prompt_tokens_per_request=prompt)  # fmt: skip


def run(cap: SloCapacity, mix_after: tuple[float, float] | None) -> float:
    """5 req/s per replica of the light mix within the SLO (p99 TPOT 50 ms from 20 ms
    alone), then the mix turns: what a replica holds, before any window says more."""
    admitted = 0
    for t in range(200):
        admitted += 20
        cap.add(float(t), signals(admitted, LIGHT))
    cap.add(200.0, signals(admitted + 20, mix_after))
    got = cap.estimate_rps()
    assert got is not None
    return got


def capacity(**kw: object) -> SloCapacity:
    return SloCapacity(tpot_slo_s=0.1, quantile=0.99, smooth_s=60.0, tpot_unloaded_s=0.02,
                       **kw)  # type: ignore[arg-type]  # fmt: skip


def test_a_capacity_in_weighted_work_follows_an_output_heavier_mix() -> None:
    weighted = capacity(prompt_token_weight=0.25)
    # Light: 200 + 0.25 × 800 = 400 work a request; 5 req/s × 400 × (1 − 0.2) / (1 − 0.4)
    # = 2,667 work/s. Heavy: 800 + 0.25 × 200 = 850 a request → 3.14 req/s.
    assert run(weighted, HEAVY) == pytest.approx(8000 / 3 / 850)
    assert weighted.estimate_work() == (pytest.approx(8000 / 3), "work/s")
    # Unweighted tokens and requests see the same 1,000 tokens: 6.67 req/s, unchanged.
    assert run(capacity(in_tokens=True), HEAVY) == pytest.approx(20 / 3)
    assert run(capacity(), HEAVY) == pytest.approx(20 / 3)


def test_the_weighted_work_holds_its_last_mix_when_the_prompts_go_uncounted() -> None:
    # A window without the prompt count (a live gateway whose streams carry no usage)
    # keeps the last mix seen rather than mixing units.
    assert run(capacity(prompt_token_weight=0.25), None) == pytest.approx(20 / 3)


def test_the_default_policy_passes_its_weight_to_the_capacity() -> None:
    policy = DefaultPolicy(ttft_p90_slo_s=2.0, tpot_p90_slo_s=0.1, prompt_token_weight=0.2)
    assert policy._slo_capacity.prompt_token_weight == 0.2
    assert DefaultPolicy()._slo_capacity.prompt_token_weight is None  # off by default
