"""The block pool behaves exactly as the plain pool: an ordered dict of every free block.

`ReferencePool` is the straightforward implementation (every free block in an ordered dict
from the start, one Python step per block); random sequences of what the KV cache manager
does (admit with prefix hits, grow, register blocks under hashes that sometimes repeat,
release) must give the same answers and the same state in both.
"""

from __future__ import annotations

import random
from collections import OrderedDict

import pytest

from gpufleet.engine import BlockPool


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
        return tuple(self.free), tuple(sorted(self.cached.items())), tuple(self.ref)


@pytest.mark.parametrize("seed", range(12))
def test_pool_matches_the_reference_pool(seed: int) -> None:
    rng = random.Random(seed)
    num_blocks = rng.choice([8, 64, 300])
    pool, ref = BlockPool(num_blocks), ReferencePool(num_blocks)
    chains = [[rng.getrandbits(63) - (1 << 62) for _ in range(40)] for _ in range(6)]
    held: list[list[int]] = []  # blocks per request
    for _ in range(400):
        op = rng.random()
        if op < 0.45:  # admit: reuse the cached prefix of a chain, allocate the rest
            hashes = rng.choice(chains)[: rng.randrange(1, 40)]
            hits = pool.cached_prefix(hashes, len(hashes))
            assert hits == ref.cached_prefix(hashes, len(hashes))
            need = rng.randrange(0, 12)
            assert pool.num_evictable(hits) == ref.num_evictable(hits)
            if need > pool.num_free - pool.num_evictable(hits):
                continue
            pool.touch(hits)
            ref.touch(hits)
            assert pool.hashes_of_next_free(need) == ref.hashes_of_next_free(need)
            blocks = hits + pool.allocate(need)
            assert blocks == hits + ref.allocate(need)
            stop = min(len(blocks), len(hashes))
            pool.cache_range(blocks, hashes, len(hits), stop)
            ref.cache_range(blocks, hashes, len(hits), stop)
            held.append(blocks)
        elif op < 0.6 and held:  # grow a request by a few blocks
            blocks = rng.choice(held)
            need = rng.randrange(1, 4)
            if need <= pool.num_free:
                new = pool.allocate(need)
                assert new == ref.allocate(need)
                blocks.extend(new)
        elif held:  # a request ends
            blocks = held.pop(rng.randrange(len(held)))
            pool.release(blocks)
            ref.release(blocks)
        assert pool.num_free == ref.num_free
        assert pool.usage == 1.0 - ref.num_free / num_blocks
    assert pool.fingerprint() == ref.fingerprint()
    for blocks in held:
        pool.release(blocks)
        ref.release(blocks)
    assert pool.fingerprint() == ref.fingerprint()


def test_reset_prefix_cache_forgets_every_prefix_only_when_idle() -> None:
    """SGLang's /flush_cache: refused while a request holds blocks, else no hash survives."""
    pool = BlockPool(8)
    blocks = pool.allocate(3)
    pool.cache_range(blocks, [11, 12, 13], 0, 3)
    assert not pool.reset_prefix_cache()  # held: refused, nothing forgotten
    assert pool.cached_prefix([11, 12, 13], 3) == blocks
    pool.release(blocks)
    assert pool.cached_prefix([11, 12, 13], 3) == blocks  # free but still cached
    assert pool.reset_prefix_cache()
    assert pool.cached_prefix([11], 1) == [] and pool.hashes_of_next_free(8) == set()
    assert pool.num_free == 8


def test_a_hash_twice_in_one_registration_keeps_its_first_block() -> None:
    """The bulk path (one dict update) must give what block-by-block registration gives
    when a hash repeats in the same call or is cached already (first writer wins)."""
    pool, ref = BlockPool(8), ReferencePool(8)
    blocks = pool.allocate(6)
    assert blocks == ref.allocate(6)
    hashes = [11, 12, 11, 13, 14, 12]
    pool.cache_range(blocks, hashes, 0, 3)
    ref.cache_range(blocks, hashes, 0, 3)
    pool.cache_range(blocks, hashes, 3, 6)
    ref.cache_range(blocks, hashes, 3, 6)
    assert pool.fingerprint() == ref.fingerprint()
    assert pool.cached_prefix([11, 12], 2) == [blocks[0], blocks[1]]
    pool.release(blocks)
    ref.release(blocks)
    assert pool.allocate(8) == ref.allocate(8)  # evicting gives back exactly the cache's
    assert pool.fingerprint() == ref.fingerprint()


def test_bulk_registration_with_a_repeat_keeps_the_first_block() -> None:
    """Many hashes go through the bulk path (a few go one by one): a hash repeated in one
    call, or cached already, still keeps its first block there."""
    pool, ref = BlockPool(16), ReferencePool(16)
    blocks = pool.allocate(12)
    assert blocks == ref.allocate(12)
    first = [21, 22, 23, 24, 25, 22]  # 22 twice in one call
    pool.cache_range(blocks, first, 0, 6)
    ref.cache_range(blocks, first, 0, 6)
    again = [*first, 21, 26, 27, 28, 29, 30]  # 21 cached already (block 0)
    pool.cache_range(blocks, again, 6, 12)
    ref.cache_range(blocks, again, 6, 12)
    assert pool.fingerprint() == ref.fingerprint()
    assert pool.cached_prefix([21, 22], 2) == [blocks[0], blocks[1]]


def test_registering_new_hashes_directly_is_registering_them() -> None:
    """`cache_new_blocks` (the caller knows the hashes are new) leaves the state
    `cache_blocks` leaves."""
    pool, same = BlockPool(8), BlockPool(8)
    blocks = pool.allocate(5)
    assert blocks == same.allocate(5)
    pool.cache_new_blocks(blocks, [31, 32, 33, 34, 35])
    same.cache_blocks(blocks, [31, 32, 33, 34, 35])
    assert pool.fingerprint() == same.fingerprint()
    pool.release(blocks)
    same.release(blocks)
    assert pool.allocate(8) == same.allocate(8)
    assert pool.fingerprint() == same.fingerprint()
