"""The simulator gives the same results whether engines jump over decode runs or step.

Every request's times, tokens, replica and fate, every replica's record, every scaling
decision and the fleet size over time must be identical; only the number of events (and
the CPU time) differs.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import pytest

from gpufleet.routing import make_policy
from gpufleet.sim.results import SimResult
from gpufleet.sim.scenario import Scenario, build_config, build_requests
from gpufleet.sim.simulator import FleetSimulator
from gpufleet.workload import parse_rate_steps

SCENARIOS = {
    "prefix groups, prefix_aware": Scenario(
        num_requests=300, rate=40.0, input_tokens=600, output_tokens=120, range_ratio=0.8,
        prefix_groups=8, prefix_tokens=512, replicas=3, routing="prefix_aware", seed=3,
    ),
    "sessions, small KV cache (preemptions)": Scenario(
        sessions=40, turns=4, rate=6.0, input_tokens=300, output_tokens=150, range_ratio=0.9,
        replicas=2, routing="session", gpu_memory_utilization=0.23, max_model_len=8192,
        max_num_batched_tokens=1024, seed=4,
    ),
    "autoscaled, cold starts and drains, PP=2": Scenario(
        model="meta-llama/Llama-3.1-70B", tp=4, pp=2, rate_steps=parse_rate_steps("2:20,40:20,1:30"), input_tokens=800, output_tokens=200, range_ratio=0.9, replicas=1,
        routing="power_of_two", autoscale="queue_depth", min_replicas=1, max_replicas=4,
        startup_s=5.0, drain_deadline_s=1.0, seed=5,
    ),
    "closed loop": Scenario(
        num_requests=200, concurrency=24, input_tokens=400, output_tokens=300,
        range_ratio=0.9, replicas=2, routing="queue_depth", seed=6,
    ),
    "LoRA adapters over max_loras, lora_affinity": Scenario(
        num_requests=300, rate=30.0, input_tokens=400, output_tokens=120, range_ratio=0.8,
        replicas=3, routing="lora_affinity", lora_adapters=12, max_loras=2, seed=7,
    ),
}  # fmt: skip


@functools.cache
def simulate(name: str, jump: bool) -> SimResult:
    sc = SCENARIOS[name]
    cfg = dataclasses.replace(build_config(sc), jump_decode_runs=jump)
    return FleetSimulator(cfg, build_requests(sc), make_policy(sc.routing, seed=sc.seed)).run()


def comparable(result: SimResult) -> dict[str, Any]:
    return {
        "requests": [dataclasses.astuple(r) for r in result.requests],
        "replicas": [dataclasses.astuple(r) for r in result.replicas],
        "decisions": result.decisions,
        "fleet_size": result.fleet_size,
        "end_s": result.end_s,
    }


@pytest.mark.parametrize("name", SCENARIOS)
def test_jumping_engines_give_the_stepped_results(name: str) -> None:
    stepped = simulate(name, jump=False)
    jumped = simulate(name, jump=True)
    assert comparable(jumped) == comparable(stepped)
    assert sum(r.ok for r in stepped.requests) > 0.5 * len(stepped.requests)
    assert jumped.events < 0.5 * stepped.events


def test_the_scenarios_preempt_scale_and_cut() -> None:
    """What the comparison covers: preemptions, scale-out and scale-in, drains cut short."""
    sessions = simulate("sessions, small KV cache (preemptions)", jump=True)
    assert sum(r.preemptions for r in sessions.replicas) > 0
    scaled = simulate("autoscaled, cold starts and drains, PP=2", jump=True)
    deltas = [d.delta for d in scaled.scaling_changes]
    assert any(d > 0 for d in deltas) and any(d < 0 for d in deltas)
    assert any(r.error == "drain_deadline" for r in scaled.requests)
