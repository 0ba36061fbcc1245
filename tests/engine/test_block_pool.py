"""The block pool behaves exactly as the plain pool: an ordered dict of every free block.

`ReferencePool` is the straightforward implementation (block ids, every free block in an
ordered dict from the start, one Python step per block); random sequences of what the KV
cache manager does (admit with prefix hits, grow, register blocks under hashes that run
on, overlap other runs in every way and sometimes repeat, release) must give the same
answers and the same state in the run-based pool (compared by what blocks hold: the
run-based pool has no block ids).
"""

from __future__ import annotations

import random
from collections import OrderedDict
from itertools import pairwise

import pytest

from gpufleet.engine import BlockPool
from gpufleet.engine.block_pool import _SPAN_BITS
from gpufleet.engine.block_runs import Held, Run
from gpufleet.hash_runs import chain_runs, consecutive


class ReferencePool:
    def __init__(self, num_blocks: int) -> None:
        self.ref = [0] * num_blocks
        self.hash_of: list[int | None] = [None] * num_blocks
        self.cached: dict[int, int] = {}
        self.free: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))

    @property
    def num_free(self) -> int:
        return len(self.free)

    def cached_prefix(self, hashes: list[int], max_blocks: int) -> list[int]:
        out = []
        for h in hashes[:max_blocks]:
            b = self.cached.get(h)
            if b is None:
                break
            out.append(b)
        return out

    def hashes_of_next_free(self, n: int) -> set[int]:
        return {h for b in list(self.free)[:n] if (h := self.hash_of[b]) is not None}

    def num_evictable(self, blocks: list[int]) -> int:
        return sum(1 for b in blocks if self.ref[b] == 0)

    def touch(self, blocks: list[int]) -> None:
        for b in blocks:
            if self.ref[b] == 0:
                del self.free[b]
            self.ref[b] += 1

    def allocate(self, n: int) -> list[int]:
        out = []
        for _ in range(n):
            b, _ = self.free.popitem(last=False)
            h = self.hash_of[b]
            if h is not None:
                self.hash_of[b] = None
                if self.cached.get(h) == b:
                    del self.cached[h]
            self.ref[b] = 1
            out.append(b)
        return out

    def release(self, blocks: list[int]) -> None:
        for b in reversed(blocks):
            self.ref[b] -= 1
            if self.ref[b] == 0:
                self.free[b] = None

    def cache_range(self, blocks: list[int], hashes: list[int], start: int, stop: int) -> None:
        for k in range(start, stop):
            if hashes[k] not in self.cached:
                self.cached[hashes[k]] = blocks[k]
                self.hash_of[blocks[k]] = hashes[k]

    def fingerprint(self) -> tuple[object, ...]:
        """As `BlockPool.fingerprint`: what free blocks hold, cached hashes' references."""
        free = tuple(self.hash_of[b] for b in self.free)
        return free, tuple(sorted((h, self.ref[b]) for h, b in self.cached.items()))


def random_chain(rng: random.Random, length: int, longest: int = 30) -> list[int]:
    """Hashes in runs of consecutive ints from a small space, so that runs of different
    chains overlap in every way (a head, a tail, a middle part, all), with a repeat now
    and then."""
    out: list[int] = []
    while len(out) < length:
        if out and rng.random() < 0.05:
            out.append(rng.choice(out))  # a repeat
            continue
        start = rng.randrange(0, 400)
        out += range(start, start + rng.randrange(1, longest))
    return out[:length]


class Request:
    def __init__(self, blocks: list[int], held: Held, tail: int, chain: list[int]) -> None:
        self.blocks, self.held, self.tail, self.chain = blocks, held, tail, chain


@pytest.mark.parametrize("seed", range(24))
def test_pool_matches_the_reference_pool(seed: int) -> None:
    rng = random.Random(seed)
    num_blocks = rng.choice([8, 64, 300])
    pool, ref = BlockPool(num_blocks), ReferencePool(num_blocks)
    longest = (30, 3, 2)[seed % 3]  # (runs of one, mostly or only: a live replica's)
    base = [random_chain(rng, 60, longest) for _ in range(4)]
    chains = [
        c[: rng.randrange(1, 60)] + random_chain(rng, 20, longest) for c in base for _ in range(2)
    ]
    held: list[Request] = []
    for _ in range(400):
        op = rng.random()
        if op < 0.45:  # admit: reuse the cached prefix of a chain, allocate the rest
            whole = rng.choice(chains)
            hashes = whole[: rng.randrange(1, 80)]
            hits = pool.cached_prefix(chain_runs(hashes), len(hashes))
            ref_hits = ref.cached_prefix(hashes, len(hashes))
            assert len(hits) == len(ref_hits)
            assert pool.cached_prefix_of(hashes, len(hashes)).runs == hits.runs
            assert [h for h0, n in hits.runs for h in range(h0, h0 + n)] == hashes[: len(hits)]
            need = rng.randrange(0, 12)
            assert pool.num_evictable(hits) == ref.num_evictable(ref_hits)
            if need > pool.num_free - pool.num_evictable(hits):
                continue
            pool.touch(hits)
            ref.touch(ref_hits)
            assert pool.hashes_of_next_free(need) == ref.hashes_of_next_free(need)
            pool.allocate(need)
            blocks = ref_hits + ref.allocate(need)
            stop = min(len(blocks), len(hashes))
            mine = list(hits.runs)
            pool.register(chain_runs(hashes, len(hits), stop), mine)
            ref.cache_range(blocks, hashes, len(ref_hits), stop)
            assert sum(n for _, n in mine) == stop
            held.append(Request(blocks, mine, len(blocks) - stop, whole))
        elif op < 0.6 and held:  # grow a request by a few blocks
            req = rng.choice(held)
            need = rng.randrange(1, 4)
            if need <= pool.num_free:
                assert pool.hashes_of_next_free(need) == ref.hashes_of_next_free(need)
                pool.allocate(need)
                req.blocks.extend(ref.allocate(need))
                req.tail += need
                # its tokens fill some of them: register their hashes (a decode's blocks)
                start = len(req.blocks) - req.tail
                stop = min(len(req.blocks), len(req.chain), start + rng.randrange(0, 4))
                if stop > start:
                    pool.register(chain_runs(req.chain, start, stop), req.held)
                    ref.cache_range(req.blocks, req.chain, start, stop)
                    req.tail -= stop - start
        elif held:  # a request ends
            req = held.pop(rng.randrange(len(held)))
            pool.release(req.held, req.tail)
            ref.release(req.blocks)
        assert pool.num_free == ref.num_free
        assert pool.usage == 1.0 - ref.num_free / num_blocks
        probe = rng.choice(chains)[: rng.randrange(1, 10)]
        assert pool.any_cached(chain_runs(probe)) == any(h in ref.cached for h in probe)
        assert pool.fingerprint() == ref.fingerprint()
        assert_spans_index_runs(pool)
    for req in held:
        pool.release(req.held, req.tail)
        ref.release(req.blocks)
    assert pool.fingerprint() == ref.fingerprint()


def assert_spans_index_runs(pool: BlockPool) -> None:
    """Each cached run is under exactly the spans of 256 hashes it meets, runs never
    overlap, and the pool counts them."""
    under: dict[int, list[int]] = {}
    runs = {}
    for k, got in pool._spans.items():
        for run in [got] if isinstance(got, Run) else got:
            assert run.size >= 1
            under.setdefault(id(run), []).append(k)
            runs[id(run)] = run
    for key, run in runs.items():
        first, last = run.start >> _SPAN_BITS, (run.start + run.size - 1) >> _SPAN_BITS
        assert sorted(under[key]) == list(range(first, last + 1))
    ordered = sorted(runs.values(), key=lambda r: r.start)
    for a, b in pairwise(ordered):
        assert a.start + a.size <= b.start
    assert pool.num_cached_runs == len(runs)


@pytest.mark.parametrize("seed", range(4))
def test_consecutive_finds_the_run(seed: int) -> None:
    rng = random.Random(seed)
    chain = random_chain(rng, 300)
    for i in range(len(chain)):
        limit = rng.randrange(1, len(chain) - i + 1)
        k = 1
        while k < limit and chain[i + k] == chain[i] + k:
            k += 1
        assert consecutive(chain, i, limit) == k


def test_reset_prefix_cache_forgets_every_prefix_only_when_idle() -> None:
    """SGLang's /flush_cache: refused while a request holds blocks, else no hash survives."""
    pool = BlockPool(8)
    pool.allocate(3)
    held: Held = []
    pool.register([(11, 3)], held)
    assert not pool.reset_prefix_cache()  # held: refused, nothing forgotten
    assert len(pool.cached_prefix([(11, 3)], 3)) == 3
    pool.release(held)
    assert len(pool.cached_prefix([(11, 3)], 3)) == 3  # free but still cached
    assert pool.reset_prefix_cache()
    assert len(pool.cached_prefix([(11, 1)], 1)) == 0 and pool.hashes_of_next_free(8) == set()
    assert pool.num_free == 8


def test_a_hash_twice_in_one_registration_keeps_its_first_block() -> None:
    """A hash repeated in one registration, or cached already, stays at its first block
    (first writer wins): the later block holds nothing."""
    pool, ref = BlockPool(8), ReferencePool(8)
    pool.allocate(6)
    blocks = ref.allocate(6)
    hashes = [11, 12, 11, 13, 14, 12]
    held: Held = []
    pool.register(chain_runs(hashes, 0, 3), held)
    pool.register(chain_runs(hashes, 3, 6), held)
    ref.cache_range(blocks, hashes, 0, 3)
    ref.cache_range(blocks, hashes, 3, 6)
    assert held == [(11, 2), (None, 1), (13, 2), (None, 1)]
    assert pool.fingerprint() == ref.fingerprint()
    pool.release(held)
    ref.release(blocks)
    assert pool.hashes_of_next_free(8) == ref.hashes_of_next_free(8)
    pool.allocate(8)
    ref.allocate(8)
    assert pool.fingerprint() == ref.fingerprint()


def test_a_hit_in_the_middle_of_a_free_run_keeps_the_rest_in_place() -> None:
    """A free run partly reused (its middle) leaves its upper and lower rests where they
    were in the eviction order."""
    pool, ref = BlockPool(12), ReferencePool(12)
    pool.allocate(10)
    blocks = ref.allocate(10)
    chain = list(range(100, 110))
    held: Held = []
    pool.register(chain_runs(chain), held)
    ref.cache_range(blocks, chain, 0, 10)
    pool.release(held)
    ref.release(blocks)
    middle = [103, 104, 105]
    hits = pool.cached_prefix(chain_runs(middle), 3)
    ref_hits = ref.cached_prefix(middle, 3)
    pool.touch(hits)
    ref.touch(ref_hits)
    assert pool.fingerprint() == ref.fingerprint()
    pool.allocate(5)  # the 2 never used, then 109..107
    ref.allocate(5)
    assert pool.fingerprint() == ref.fingerprint()
    pool.release(list(hits.runs))
    ref.release(ref_hits)
    assert pool.fingerprint() == ref.fingerprint()


def test_runs_over_many_spans_are_found_split_and_evicted_like_the_reference() -> None:
    """Runs longer than a span of the index (and 64-bit hashes beyond a machine int, at
    span edges) are found, split by a hit in their middle, grown and evicted block by
    block as the reference pool does."""
    for base in (1000, (1 << 63) - 700, -(1 << 63) + 3):
        pool, ref = BlockPool(1500), ReferencePool(1500)
        chain = list(range(base, base + 1200))
        pool.allocate(1200)
        blocks = ref.allocate(1200)
        held: Held = []
        pool.register(chain_runs(chain, 0, 1000), held)
        pool.register(chain_runs(chain, 1000, 1200), held)  # (grows its run)
        ref.cache_range(blocks, chain, 0, 1200)
        assert held == [(base, 1200)]
        assert_spans_index_runs(pool)
        pool.release(held)
        ref.release(blocks)
        middle = chain[300:900]
        hits = pool.cached_prefix(chain_runs(middle), len(middle))
        assert len(hits) == len(ref.cached_prefix(middle, len(middle))) == 600
        pool.touch(hits)  # (splits the run in three)
        ref_hits = ref.cached_prefix(middle, 600)
        ref.touch(ref_hits)
        assert_spans_index_runs(pool)
        assert pool.num_cached_runs == 3
        for n in (1, 255, 257, 300):  # (the free parts, upper first, from their tops)
            pool.allocate(n)
            ref.allocate(n)
            assert pool.fingerprint() == ref.fingerprint()
            assert_spans_index_runs(pool)
        assert pool.any_cached([(base + 287, 20)])  # (the held middle from 300)
        # (300 never used blocks went first, then 513 from the free parts' tops)
        assert not pool.any_cached([(base + 87, 213), (base + 900, 300)])
        assert pool.any_cached([(base + 86, 1)])
        assert pool.cached_prefix([(base + 300, 600)], 600).runs == [(base + 300, 600)]
