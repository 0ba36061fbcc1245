"""sim_vs_live gives the simulator the live gateway's routing blocks for its workload."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpufleet.fleet.traffic import demo_workload
from gpufleet.routing.prefix import ROUTING_BLOCK_TOKENS, request_prefix_hashes
from gpufleet.workload import (
    RatePhase,
    SegmentHasher,
    sim_requests,
    synthetic_shapes,
    text_conversations,
)

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
PLAN = (RatePhase("steady", 20.0, 2.0, 2.0),)


@pytest.mark.process  # importing the benchmark asks git for the commit (record.py)
def test_the_simulator_hashes_as_many_routing_blocks_as_the_gateway(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """prefix_aware counts its costs in routing blocks: the gateway hashes 256 bytes of the
    rendered prompt per block, the simulator a number of tokens. With the default 64 (~4
    bytes a token) the replicas' ~6.7-byte words made a ~512-token prompt 8 blocks in the
    simulator and 13 live, and the two routed the burst's requests to different replicas."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import sim_vs_live

    shapes = list(synthetic_shapes(demo_workload(PLAN, 0)))
    live = [
        len(request_prefix_hashes({"messages": [{"role": "user", "content": c.turns[0].text}]},
                                  "/v1/chat/completions"))
        for c in text_conversations(shapes)
    ]  # fmt: skip
    requests = sim_requests(shapes)
    assert len(requests) == len(live) > 10

    def sim_blocks(block_tokens: int) -> list[int]:
        hasher = SegmentHasher(block_tokens)
        return [len(tuple(hasher.hashes(r.segments))) for r in requests]

    assert sim_blocks(ROUTING_BLOCK_TOKENS) != live  # what the simulator assumed before
    got = sim_blocks(sim_vs_live.block_tokens(PLAN, 0))
    matched = sum(a == b for a, b in zip(got, live, strict=True))
    assert matched >= 0.9 * len(live)
