"""A simulated prompt is hashed once per view: the router's (routing blocks) and the
engine's (KV blocks) each hash its segments once, as runs, and build their chain from
those runs; a retry resends the same hashes without hashing again."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from gpufleet.engine import EngineConfig, EngineRequest
from gpufleet.native import is_compiled
from gpufleet.perf.step_time import LinearStepTimeModel
from gpufleet.routing import make_policy
from gpufleet.routing.prefix import ROUTING_BLOCK_TOKENS
from gpufleet.sim import clients as clients_module
from gpufleet.sim.scenario import Scenario, build_requests
from gpufleet.sim.simulator import FleetSimulator, SimConfig
from gpufleet.workload import SegmentHasher, SimRequest
from gpufleet.workload import segments as segments_module

STEP = LinearStepTimeModel(base_s=0.004, per_token_s=2e-5, per_context_token_s=1e-7)
BLOCK = 16  # the engine's KV block (the router's is ROUTING_BLOCK_TOKENS)


def count_hashing(monkeypatch: pytest.MonkeyPatch) -> Counter[tuple[int, Any]]:
    """Calls of `SegmentHasher.runs`, by (block size, segments); `chain` must not be used."""
    calls: Counter[tuple[int, Any]] = Counter()
    runs = SegmentHasher.runs

    def counted(self: SegmentHasher, segments: Any) -> Any:
        calls[self.block_tokens, segments] += 1
        return runs(self, segments)

    def no_chain(self: SegmentHasher, segments: Any) -> Any:
        raise AssertionError("the simulator builds chains from runs")

    monkeypatch.setattr(segments_module.SegmentHasher, "runs", counted)
    monkeypatch.setattr(segments_module.SegmentHasher, "chain", no_chain)
    return calls


def capture_prompts(
    monkeypatch: pytest.MonkeyPatch,
) -> list[tuple[int, tuple[int, ...], list[int], int]]:
    """(request index, router's hashes, engine's prompt hashes as sent, id of that list)
    for every engine request the simulator makes."""
    seen: list[tuple[int, tuple[int, ...], list[int], int]] = []
    make = clients_module.Clients.engine_request

    def spy(self: clients_module.Clients, live: Any, now_s: float) -> EngineRequest:
        ereq = make(self, live, now_s)
        hashes = ereq.block_hashes
        seen.append((live.req.index, live.info.prefix_hashes, list(hashes), id(hashes)))
        return ereq

    monkeypatch.setattr(clients_module.Clients, "engine_request", spy)
    return seen


def config(**kw: object) -> SimConfig:
    engine = EngineConfig(num_gpu_blocks=4096, block_size=BLOCK, max_num_seqs=64,
                          max_num_batched_tokens=2048, max_model_len=8192)  # fmt: skip
    return SimConfig(engine=engine, step_time_model=STEP, **kw)  # type: ignore[arg-type]


@pytest.mark.skipif(
    is_compiled(clients_module), reason="counts calls that compiled code makes directly"
)
def test_router_and_engine_each_hash_a_prompt_once(monkeypatch: pytest.MonkeyPatch) -> None:
    sc = Scenario(sessions=12, turns=3, rate=4.0, input_tokens=700, output_tokens=40,
                  range_ratio=0.5, prefix_groups=3, prefix_tokens=300, seed=5)  # fmt: skip
    reqs = build_requests(sc)
    # Each view exact: what a hasher of its own block size makes of the segments (these
    # segments hash by content, not by a counter, so a fresh hasher agrees).
    router, engine = SegmentHasher(ROUTING_BLOCK_TOKENS), SegmentHasher(BLOCK)
    views = {r.index: (router.chain(r.segments), engine.chain(r.segments)) for r in reqs}
    calls = count_hashing(monkeypatch)
    seen = capture_prompts(monkeypatch)
    result = FleetSimulator(config(replicas=2), reqs, make_policy("prefix_aware")).run()
    assert all(r.ok for r in result.requests) and len(seen) == len(reqs)
    firsts = [r for r in reqs if r.after is None]
    # The router hashes every request once; the engine every first turn once (a next
    # turn's engine hashes continue its previous turn's, unhashed).
    expected = Counter({(ROUTING_BLOCK_TOKENS, r.segments): 1 for r in reqs})
    for r in firsts:
        expected[BLOCK, r.segments] += 1
    assert calls == expected
    assert any(len(r.segments) > 1 for r in reqs)  # (shared prefixes: several segments)
    for index, prefix_hashes, engine_hashes, _ in seen:
        req = reqs[index]
        routing_view, engine_view = views[index]
        assert list(prefix_hashes) == routing_view
        assert prefix_hashes.runs == routing_view.runs  # type: ignore[attr-defined]
        assert len(prefix_hashes) == req.input_tokens // ROUTING_BLOCK_TOKENS
        if req.after is None:
            assert engine_hashes == engine_view
            assert len(engine_hashes) == req.input_tokens // BLOCK


@pytest.mark.skipif(
    is_compiled(clients_module), reason="counts calls that compiled code makes directly"
)
def test_a_retry_resends_the_same_hashes_without_hashing_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Requests 0 and 1 go to r0 (round robin) and r2 ... ; r0 crashes before any first
    # token, so its requests are retried on the other replica.
    from gpufleet.sim import faults as faults_module
    from gpufleet.sim.config import FaultSpec
    from gpufleet.sim.events import CRASH

    def arm(self: faults_module.SimFaults, replica: Any) -> None:
        if (replica.replica_id, replica.restarts) == ("r0", 0):
            self.events.push(0.001, CRASH, replica)

    monkeypatch.setattr(faults_module.SimFaults, "arm", arm)
    segs = ((segments_module.segment_key(segments_module.KIND_UNIQUE, 7), 900),)
    reqs = [SimRequest(i, 0.0, segs, 20) for i in range(4)]
    view = SegmentHasher(BLOCK).hashes(segs)
    calls = count_hashing(monkeypatch)
    seen = capture_prompts(monkeypatch)
    result = FleetSimulator(
        config(replicas=2, faults=FaultSpec(mtbf_s=1e12)), reqs, make_policy("round_robin")
    ).run()
    assert result.retries >= 1 and all(r.ok for r in result.requests)
    retried = [r.index for r in result.requests if r.attempts == 2]
    assert retried
    for index in retried:
        sent = [(hashes, ident) for i, _, hashes, ident in seen if i == index]
        assert len(sent) == 2
        assert sent[0][0] == sent[1][0] == view
        assert sent[0][1] != sent[1][1]  # (each attempt its own list: the engine grows it)
    # round robin reads no prefix hashes: only the engine hashes, once per request
    assert calls == Counter({(BLOCK, segs): len(reqs)})
