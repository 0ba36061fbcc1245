"""LoRA in the simulator: a Zipf adapter workload on replicas with adapter slots, routed by
adapter affinity or blind to adapters (the same engine, fleet core and policies as live)."""

from __future__ import annotations

import functools
from typing import Any

import pytest

from gpufleet.errors import UserError
from gpufleet.sim.scenario import Scenario, build_requests, run_scenario

BASE = Scenario(
    num_requests=600, rate=12.0, input_tokens=400, output_tokens=100, range_ratio=0.5,
    replicas=3, lora_adapters=16, lora_zipf=1.0, max_loras=2, seed=11,
)  # fmt: skip


@functools.cache
def summary(routing: str) -> dict[str, Any]:
    return run_scenario(BASE.with_field("routing", routing))


def test_requests_ask_for_zipf_popular_adapters() -> None:
    adapters = [r.adapter for r in build_requests(BASE)]
    assert None not in adapters
    counts = {a: adapters.count(a) for a in set(adapters)}
    assert counts["lora-001"] > counts.get("lora-008", 0) > 0


@pytest.mark.parametrize("blind", ["round_robin", "least_outstanding"])
def test_adapter_affinity_hits_gpu_slots_more_and_loads_less(blind: str) -> None:
    affine, other = summary("lora_affinity"), summary(blind)
    assert affine["completed"] == other["completed"] == 600
    lo, lb = affine["lora"], other["lora"]
    assert lo["admissions"] == lb["admissions"] == 600
    assert lo["gpu_slot_hit_rate"] > lb["gpu_slot_hit_rate"] + 0.05
    assert lo["disk_loads"] < lb["disk_loads"]
    assert affine["ttft_ms"]["median"] < other["ttft_ms"]["median"]


def test_no_lora_block_without_adapters_and_bad_flags_named() -> None:
    plain = run_scenario(BASE.with_field("lora_adapters", None).with_field("num_requests", 50))
    assert plain["lora"] is None
    with pytest.raises(UserError, match="lora-zipf"):
        build_requests(BASE.with_field("lora_zipf", -1.0))
