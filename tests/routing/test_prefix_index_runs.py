"""The run-based prefix index answers exactly as the per-block one did.

`reference_prefix_index.PrefixIndex` is the index before it kept runs (an ordered dict per
replica, a dict entry per block); random routing decisions over prompts that share system
prompts, continue conversations and branch (hashed as the simulator hashes them: runs of
numbered trace blocks, hashed unique text, mixed blocks) must give the same matches,
shared depths and block counts in both, through evictions and removed replicas.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

import pytest

from gpufleet.hash_runs import HashChain
from gpufleet.routing.prefix_index import PrefixIndex
from gpufleet.workload.segments import (
    KIND_TRACE_BLOCK,
    KIND_UNIQUE,
    SegmentHasher,
    Segments,
    segment_key,
)

from .reference_prefix_index import PrefixIndex as ReferenceIndex


def random_prompts(rng: random.Random, count: int) -> list[Segments]:
    systems = [
        tuple(
            (segment_key(KIND_TRACE_BLOCK, rng.randrange(50)), 8)
            for _ in range(rng.randrange(1, 4))
        )
        for _ in range(3)
    ]
    prompts: list[Segments] = []
    for i in range(count):
        if prompts and rng.random() < 0.4:  # a conversation's next turn: resend, add
            head = rng.choice(prompts)
        else:
            head = rng.choice(systems) if rng.random() < 0.7 else ()
        tail = tuple(
            (segment_key(KIND_TRACE_BLOCK, rng.randrange(200)), rng.choice([8, 8, 8, 5, 12]))
            if rng.random() < 0.8
            else (segment_key(KIND_UNIQUE, i), rng.randrange(1, 20))
            for _ in range(rng.randrange(1, 5))
        )
        prompts.append(head + tail)
    return prompts


@pytest.mark.parametrize("seed", range(20))
def test_run_index_matches_the_per_block_index(seed: int) -> None:
    rng = random.Random(seed)
    hasher = SegmentHasher(4)
    made = [hasher.chain(p) for p in random_prompts(rng, 60)]
    # as the simulator sends them (its runs alone), as a list that knows its runs, or as
    # plain tuples (runs found here)
    makers = (tuple, lambda c: c, lambda c: HashChain(c.runs))
    chains: list[Sequence[int]] = [makers[seed % 3](c) for c in made]
    chains = [c for c in chains if c]
    capacity = rng.choice([5, 20, 60])
    idx, ref = PrefixIndex(capacity), ReferenceIndex(capacity)
    replicas = ["a", "b", "c", "d"]
    for _ in range(300):
        op = rng.random()
        chain = rng.choice(chains)
        if op < 0.6:
            rid = rng.choice(replicas)
            assert idx.match(chain, replicas) == ref.match(chain, replicas)
            limit = rng.randrange(0, len(chain) + 2)
            assert idx.shared_depth(chain, limit) == ref.shared_depth(chain, limit)
            idx.insert(rid, chain)
            ref.insert(rid, chain)
        elif op < 0.7:
            rid, cap = rng.choice(replicas), rng.randrange(1, 2 * capacity)
            idx.set_capacity(rid, cap)
            ref.set_capacity(rid, cap)
        elif op < 0.75:
            rid = rng.choice(replicas)
            idx.remove_replica(rid)
            ref.remove_replica(rid)
        else:
            assert idx.match(chain, replicas) == ref.match(chain, replicas)
            limit = rng.randrange(0, len(chain) + 2)
            assert idx.shared_depth(chain, limit) == ref.shared_depth(chain, limit)
        for rid in replicas:
            assert idx.blocks_held(rid) == ref.blocks_held(rid)
        assert idx.total_blocks() == ref.total_blocks()
        assert idx._branching == ref._branching
    for rid in replicas:
        idx.remove_replica(rid)
    assert len(idx._spans) == 0 and idx._branching == set()


def test_a_replica_queue_drops_the_runs_touched_again() -> None:
    """Touching a prompt again leaves its older queue entries behind; below capacity no
    eviction ever reaches them, so the queue is compacted instead of growing."""
    idx = PrefixIndex(10_000)
    chains = [tuple(range(k * 100, k * 100 + 40)) for k in range(3)]
    for i in range(1000):
        idx.insert("a", chains[i % 3])
    assert idx.blocks_held("a") == 120
    assert len(idx._lru["a"].order) <= 2 * 3 + 64
    assert idx.match(chains[0], ["a"]) == {"a": 40}
