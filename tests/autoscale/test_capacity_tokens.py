"""The capacity within the SLO as a rate of work (prompt + output tokens per second) where
the gateway counts tokens: it holds across request mixes, which a rate of requests does not."""

from __future__ import annotations

from dataclasses import replace

import pytest

from autoscale.helpers import even, fleet
from gpufleet.autoscale.capacity import SloCapacity
from gpufleet.autoscale.signals import FleetSignals, Percentiles


def signals(
    n_ready: int, admitted: int, tpot_p99_s: float, tokens_per_request: float | None
) -> FleetSignals:
    tpot = Percentiles(tpot_p99_s / 3, tpot_p99_s / 2, tpot_p99_s)
    return replace(fleet(even(n_ready, 40)), admitted_total=admitted, tpot_s=tpot,
                   window_s=60.0, latency_requests=500,
                   tokens_per_request=tokens_per_request)  # fmt: skip


def run(cap: SloCapacity, heavy_tokens: float | None, light_tokens: float | None) -> float:
    """Light requests at 5 req/s per replica within the SLO, then the mix turns heavy:
    what a replica holds at the heavy mix, before any window under it says more."""
    admitted = 0
    for t in range(0, 200):
        admitted += 20
        cap.add(float(t), signals(4, admitted, 0.05, light_tokens))
    admitted += 20
    cap.add(200.0, signals(4, admitted, 0.05, heavy_tokens))
    got = cap.estimate_rps()
    assert got is not None
    return got


def test_a_capacity_in_tokens_follows_the_mix_one_in_requests_does_not() -> None:
    new = SloCapacity(
        tpot_slo_s=0.1, quantile=0.99, smooth_s=60.0, tpot_unloaded_s=0.02, in_tokens=True
    )
    # 5 req/s of 1,000 tokens at 50 ms from 20 ms alone: × (1 − 0.2) / (1 − 0.4) = 6,667
    # tokens/s; at 3,000 tokens a request: 2.22 req/s.
    assert run(new, heavy_tokens=3000.0, light_tokens=1000.0) == pytest.approx(20 / 9)
    assert new.estimate_work() == (pytest.approx(20000 / 3), "tokens/s")
    old = SloCapacity(tpot_slo_s=0.1, quantile=0.99, smooth_s=60.0, tpot_unloaded_s=0.02)
    assert run(old, heavy_tokens=None, light_tokens=None) == pytest.approx(20 / 3)  # requests
    assert old.estimate_work() == (pytest.approx(20 / 3), "req/s")
