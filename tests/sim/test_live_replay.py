"""What the simulator models so it can stand beside a live fleet: a slowed replica
(`--time-scale`), the HTTP path before the engine, the phase of the autoscaler's ticks,
and the cold start the actuator observed of the initial replicas."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from gpufleet.autoscale.decision import ReplicaBounds, ScalingDecision
from gpufleet.autoscale.signals import FleetSignals
from gpufleet.routing import make_policy
from gpufleet.sim.config import AutoscaleSpec
from gpufleet.sim.scenario import Scenario, build_config, build_requests, run_scenario
from gpufleet.sim.simulator import FleetSimulator

ONE = Scenario(rate=1.0, num_requests=1, input_tokens=500, output_tokens=20, replicas=1)


def ttft_and_tpot(**kw: Any) -> tuple[float, float]:
    s = run_scenario(dataclasses.replace(ONE, **kw))
    return s["ttft_ms"]["mean"], s["tpot_ms"]["mean"]


def test_time_scale_and_overhead_each_add_what_they_say() -> None:
    ttft, tpot = ttft_and_tpot()
    slow_ttft, slow_tpot = ttft_and_tpot(time_scale=3.0)
    assert slow_tpot == pytest.approx(3 * tpot)
    assert slow_ttft == pytest.approx(3 * ttft)
    late_ttft, late_tpot = ttft_and_tpot(request_overhead_s=0.05)
    assert late_ttft == pytest.approx(ttft + 50.0)  # an idle engine: the path adds as is
    assert late_tpot == pytest.approx(tpot)


class Recorder:
    """A scaling policy that keeps what it is shown and never changes the fleet."""

    name = "recorder"

    def __init__(self) -> None:
        self.seen: list[tuple[float, FleetSignals]] = []

    def decide(self, now_s: float, signals: FleetSignals) -> ScalingDecision:
        self.seen.append((now_s, signals))
        return ScalingDecision(signals.current_replicas, "hold", self.name, now_s,
                               signals.current_replicas)  # fmt: skip


def run_recorded(**kw: Any) -> Recorder:
    sc = Scenario(rate=5.0, num_requests=20, input_tokens=200, output_tokens=20, replicas=2,
                  autoscale="queue_depth", startup_s=12.0, **kw)  # fmt: skip
    recorder = Recorder()
    base = build_config(sc)
    assert base.autoscale is not None
    cfg = dataclasses.replace(base, autoscale=AutoscaleSpec(recorder, 1.0, 12.0))
    FleetSimulator(cfg, build_requests(sc), make_policy("round_robin", seed=0)).run()
    return recorder


def test_ticks_come_at_their_phase_and_the_initial_cold_start_is_known() -> None:
    at_zero, shifted = run_recorded(), run_recorded(tick_phase_s=0.4)
    assert [t for t, _ in at_zero.seen[:3]] == [0.0, 1.0, 2.0]
    assert [t for t, _ in shifted.seen[:3]] == pytest.approx([0.4, 1.4, 2.4])
    # The initial replicas loaded once (the live actuator saw it): the policy knows it.
    assert at_zero.seen[0][1].cold_start_s == 12.0


def test_bounds_still_hold_for_phased_ticks() -> None:
    sc = Scenario(rate=30.0, num_requests=200, input_tokens=2000, output_tokens=100,
                  max_num_seqs=4, autoscale="queue_depth", min_replicas=1, max_replicas=3,
                  startup_s=2.0, tick_phase_s=0.3, scrape_phase_s=0.7)  # fmt: skip
    s = run_scenario(sc)
    assert s["completed"] == 200 and s["scaling_changes"]
    assert all(c["t_s"] % 1.0 == pytest.approx(0.3) for c in s["scaling_changes"])
    assert ReplicaBounds(1, 3).clamp(s["peak_ready_replicas"]) == s["peak_ready_replicas"]
