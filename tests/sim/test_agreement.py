"""sim_vs_live's verdict (`gpufleet.sim.agreement`): the simulator against live runs that
vary, judged on every request pooled and against both sides' noise, and a simulator that
is off a steady live fleet still disagrees."""

from __future__ import annotations

import numpy as np
import pytest

from gpufleet.sim.agreement import (
    compare_figures,
    compare_requests,
    mean_se,
    pooled_percentile,
    share_within,
)


def run(n_fast: int, n_slow: int, seed: int, fast_ms: float = 80.0, slow_ms: float = 450.0):
    """One run's TTFTs: a body around `fast_ms` and a tail around `slow_ms` (the burst's
    requests queued while the first scale-out cold-starts), shuffled."""
    rng = np.random.default_rng(seed)
    values = np.concatenate([rng.normal(fast_ms, 8.0, n_fast), rng.normal(slow_ms, 60.0, n_slow)])
    rng.shuffle(values)
    return [float(v) for v in values]


def test_a_simulator_off_a_steady_live_fleet_disagrees() -> None:
    """Live runs that do not vary give no allowance: 13 % off is off."""
    live = [run(450, 30, seed) for seed in range(3)]
    right = [run(450, 30, seed) for seed in range(10, 15)]
    assert compare_requests(live, right, 90).agrees
    assert compare_requests(live, right, 50).agrees
    for p in (50, 90):
        off = [[v * 1.13 for v in r] for r in right]
        got = compare_requests(live, off, p)
        assert not got.agrees, got
        assert got.error == pytest.approx(0.13, abs=0.03)


def test_a_simulator_inside_live_spread_on_a_knee_agrees() -> None:
    """Live p90 on a knee: two runs put 8 % of requests in the tail, one 14 % (its first
    scale-out landed late), so one run's p90 is several times the others'. A simulator
    whose runs straddle the knee as live's do agrees, though its pooled p90 is more than
    10 % off; one whose every run lies in the late mode does not."""
    live = [run(460, 40, 0), run(460, 40, 1), run(430, 70, 2)]
    per_run = [pooled_percentile([r], 90) for r in live]
    assert max(per_run) > 2 * min(per_run)  # the knee
    sim = [run(455, 45, 10), run(440, 60, 11), run(460, 40, 12), run(435, 65, 13),
           run(455, 45, 14)]  # fmt: skip
    got = compare_requests(live, sim, 90)
    assert abs(got.error) > 0.10 and got.agrees, got
    assert 0.85 < (got.share or 0.0) < 0.95
    late = [run(430, 70, seed) for seed in range(20, 25)]  # every run past the knee
    assert not compare_requests(live, late, 90).agrees


def test_a_run_s_share_within_a_latency() -> None:
    assert share_within([1.0, 2.0, 3.0, 4.0], 2.0) == 0.5
    assert share_within([], 2.0) == 0.0
    assert mean_se([5.0]) == 0.0
    assert mean_se([1.0, 1.0, 1.0]) == 0.0


def test_per_run_figures_alone_judge_means_against_their_standard_errors() -> None:
    """Results recorded before the requests were kept (wave 18's: live TTFT p90 186, 186,
    268 ms; the simulator's phases 229–263): +13 % is within two standard errors of a
    spread that wide; the same +13 % against three steady runs is not."""
    sim = [229.4, 238.1, 262.9, 248.3, 229.4]
    got = compare_figures([186.1, 186.1, 267.9], sim)
    assert got.error == pytest.approx(0.133, abs=0.001) and got.agrees
    assert not compare_figures([213.0, 213.5, 213.4], sim).agrees
    assert not compare_figures([186.1, 186.1, 267.9], [v * 1.5 for v in sim]).agrees
