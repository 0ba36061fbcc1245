"""Segmented prompts hash like token prompts would; traces slice and scale."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpufleet.errors import UserError
from gpufleet.hash_runs import chain_runs
from gpufleet.sim.scenario import Scenario, build_requests
from gpufleet.workload import (
    KIND_PREFIX,
    KIND_TRACE_BLOCK,
    KIND_UNIQUE,
    SegmentHasher,
    common_prefix_tokens,
    read_trace,
    segment_key,
    sim_requests,
    slice_records,
    trace_shapes,
)

P = segment_key(KIND_PREFIX, 1)
A = segment_key(KIND_UNIQUE, 1)
B = segment_key(KIND_UNIQUE, 2)


def shared_hashes(x: list[int], y: list[int]) -> int:
    n = 0
    for a, b in zip(x, y, strict=False):
        if a != b:
            break
        n += 1
    return n


@pytest.mark.parametrize("prefix_tokens", [0, 5, 16, 100, 512])
def test_equal_prefixes_share_exactly_their_full_blocks(prefix_tokens: int) -> None:
    h = SegmentHasher(16)
    x = ((P, prefix_tokens), (A, 300)) if prefix_tokens else ((A, 300),)
    y = ((P, prefix_tokens), (B, 300)) if prefix_tokens else ((B, 300),)
    hx, hy = h.hashes(x), h.hashes(y)
    assert len(hx) == (prefix_tokens + 300) // 16
    shared = common_prefix_tokens(x, y)
    assert shared == prefix_tokens
    assert shared_hashes(hx, hy) == prefix_tokens // 16
    # A second hasher (empty cache) gives the same values: the cache changes no hash.
    assert SegmentHasher(16).hashes(x) == hx


def test_a_truncated_segment_shares_its_head_with_the_full_one() -> None:
    h = SegmentHasher(16)
    full, cut = h.hashes(((P, 512), (A, 40))), h.hashes(((P, 300), (A, 40)))
    assert shared_hashes(full, cut) == 300 // 16
    assert len(set(full) & set(cut)) == 300 // 16


def test_trace_blocks_are_numbered_so_new_blocks_run_on() -> None:
    """A trace's blocks are numbered the first time their (parent, key) is seen: equal
    prefixes still share exactly their full blocks, other blocks never collide, and a
    prompt's new blocks are one run of consecutive ints (what the block pool and the
    router's index keep as one run). `chain` knows its runs."""
    h = SegmentHasher(16)
    t = [segment_key(KIND_TRACE_BLOCK, i) for i in range(8)]
    first = h.chain(((t[0], 512), (t[1], 512), (t[2], 512)))
    again = h.chain(((t[0], 512), (t[1], 512), (t[3], 512), (t[4], 200)))
    other = h.chain(((t[1], 512), (t[0], 512)))  # same blocks, other order: other hashes
    assert shared_hashes(first, again) == 64
    assert not set(other) & (set(first) | set(again))
    assert len(set(first) | set(again) | set(other)) == 96 + 32 + 12 + 64
    assert len(again.runs) == 2  # the shared head, then its new blocks in one run
    for chain in (first, again, other):
        assert [x for a, n in chain.runs for x in range(a, a + n)] == chain
        assert chain.runs == chain_runs(chain)
    # longer than when first seen: the head as numbered, the rest still its own
    longer = h.chain(((t[0], 512), (t[1], 512), (t[2], 600)))
    assert longer[:96] == first and len(set(longer)) == len(longer) == 96 + 5


def test_a_trace_block_after_several_parents_keeps_a_numbering_for_each() -> None:
    """A block's numbers are its (parent, key)'s, however many parents a key follows and
    in whatever order they come (the hasher keeps a key's first parent apart)."""
    h = SegmentHasher(16)
    t = [segment_key(KIND_TRACE_BLOCK, i) for i in range(4)]
    prompts = [((t[p], 512), (t[3], 512)) for p in (0, 1, 2, 0, 2, 1)] + [((t[3], 512),)]
    chains = [h.hashes(p) for p in prompts]
    again = [h.hashes(p) for p in reversed(prompts)][::-1]
    assert chains == again  # (numbered once: seen again, the same)
    tails = {tuple(c[32:]) for c in chains[:6]} | {tuple(chains[6])}
    assert len(tails) == 4  # t[3] after t[0], t[1], t[2], and first
    assert len(set().union(*map(set, chains))) == 3 * 32 + 4 * 32


def _write_mooncake(path: Path) -> None:
    rows = [
        {"timestamp": 0, "input_length": 1000, "output_length": 10, "hash_ids": [0, 1]},
        {"timestamp": 500, "input_length": 600, "output_length": 0, "hash_ids": [0, 2]},
        {"timestamp": 2000, "input_length": 1200, "output_length": 5, "hash_ids": [0, 1]},
        {"timestamp": 4000, "input_length": 50, "output_length": 5, "hash_ids": [9]},
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_trace_slice_speedup_and_shared_blocks(tmp_path: Path) -> None:
    path = tmp_path / "mc.jsonl"
    _write_mooncake(path)
    records = read_trace(path)
    window = slice_records(records, start_s=0.5, duration_s=3.0)
    reqs = sim_requests(trace_shapes(window, speedup=2.0))
    assert [r.arrival_s for r in reqs] == [0.0, 0.75]  # 0.5 s and 2.0 s, from 0.5, at 2x
    assert [r.input_tokens for r in reqs] == [600, 1200]
    assert reqs[0].output_tokens == 1  # a zero-length answer is raised to one token
    # Request 3 of the trace (1200 tokens over blocks 0, 1 and its own rest) shares the
    # 1000 tokens of blocks 0 and 1 with request 1 of the trace.
    all_reqs = sim_requests(trace_shapes(records))
    assert common_prefix_tokens(all_reqs[0].segments, all_reqs[2].segments) == 1000
    assert common_prefix_tokens(all_reqs[0].segments, all_reqs[1].segments) == 512
    assert len(slice_records(records, limit=2)) == 2
    with pytest.raises(ValueError, match="speedup"):
        list(trace_shapes(records, speedup=0))
    with pytest.raises(UserError, match="--speedup"):
        build_requests(Scenario(trace=str(path), speedup=0))
