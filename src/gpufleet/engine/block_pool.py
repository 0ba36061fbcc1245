"""Paged KV blocks with a prefix cache, as vLLM v1's block pool keeps them.

The pool knows blocks, their reference counts and the hashes they are cached under; which
request holds which blocks is the `KVCacheManager`'s business. A block is an int id. A
block with ref count 0 is free; a free block may still hold a cached prefix (its hash stays
in `_cached`) until it is handed out again. Free blocks are handed out least-recently-freed
first, so cached prefixes are evicted LRU.
"""

from __future__ import annotations

from collections import OrderedDict
from itertools import islice


class BlockPool:
    def __init__(self, num_blocks: int, *, enable_caching: bool = True) -> None:
        if num_blocks < 1:
            raise ValueError(f"num_blocks must be >= 1, got {num_blocks}")
        self.num_blocks = num_blocks
        self.enable_caching = enable_caching
        self._ref_cnt = [0] * num_blocks
        self._hash_of: list[int | None] = [None] * num_blocks
        self._cached: dict[int, int] = {}  # block hash -> block id
        # Free blocks in eviction order: first the never used ones (ids _fresh..num_blocks-1,
        # kept as a range so that a large idle pool costs nothing), then the freed ones in
        # the order they were freed; the head is handed out (and evicted) first.
        self._fresh = 0
        self._free: OrderedDict[int, None] = OrderedDict()

    @property
    def num_free(self) -> int:
        return self.num_blocks - self._fresh + len(self._free)

    @property
    def usage(self) -> float:
        """Fraction of blocks held by requests (vLLM's kv_cache_usage_perc)."""
        return 1.0 - self.num_free / self.num_blocks

    def lookup(self, block_hash: int) -> int | None:
        return self._cached.get(block_hash)

    def cached_prefix(self, hashes: list[int], max_blocks: int) -> list[int]:
        """The cached blocks of the longest run of `hashes[:max_blocks]` that are cached."""
        get = self._cached.get
        out: list[int] = []
        for h in hashes[:max_blocks]:
            b = get(h)
            if b is None:
                break
            out.append(b)
        return out

    def hashes_of_next_free(self, n: int) -> set[int]:
        """The hashes cached at the next `n` blocks `allocate` would hand out (and evict)."""
        hash_of = self._hash_of
        n -= self.num_blocks - self._fresh  # never used blocks hold no hash
        if n <= 0 or not self._cached:
            return set()
        return {h for b in islice(self._free, n) if (h := hash_of[b]) is not None}

    def num_evictable(self, blocks: list[int]) -> int:
        """How many of `blocks` are free now (touching them takes them off the free list)."""
        ref = self._ref_cnt
        return sum(1 for b in blocks if ref[b] == 0)

    def touch(self, blocks: list[int]) -> None:
        """Take a reference on cached blocks a request reuses."""
        ref = self._ref_cnt
        free = self._free
        for b in blocks:
            if ref[b] == 0:
                del free[b]
            ref[b] += 1

    def allocate(self, n: int) -> list[int]:
        """Hand out n free blocks (caller checked num_free), evicting their cached hashes."""
        ref = self._ref_cnt
        out: list[int] = []
        fresh = self._fresh
        if fresh < self.num_blocks:
            take = min(n, self.num_blocks - fresh)
            out = list(range(fresh, fresh + take))
            ref[fresh : fresh + take] = [1] * take
            self._fresh = fresh + take
            n -= take
        popitem = self._free.popitem
        hash_of = self._hash_of
        cached = self._cached
        append = out.append
        for _ in range(n):
            b = popitem(False)[0]  # the head: least recently freed
            h = hash_of[b]
            if h is not None:  # a block holds a hash only while it is the cached one
                hash_of[b] = None
                del cached[h]
            ref[b] = 1
            append(b)
        return out

    def release(self, blocks: list[int]) -> None:
        """Drop one reference on each block; a request's tail blocks are evicted first."""
        ref = self._ref_cnt
        free = self._free
        for b in reversed(blocks):
            count = ref[b] - 1
            ref[b] = count
            if not count:
                free[b] = None

    def cache_range(self, blocks: list[int], hashes: list[int], start: int, stop: int) -> None:
        """Register blocks[k] under its chained hash hashes[k] for k in [start, stop); the
        first block registered under a hash keeps it (first writer wins, as in vLLM)."""
        if not self.enable_caching:
            return
        cached = self._cached
        hash_of = self._hash_of
        for k in range(start, stop):
            h = hashes[k]
            if h not in cached:
                b = blocks[k]
                cached[h] = b
                hash_of[b] = h

    def fingerprint(self) -> tuple[tuple[int, ...], tuple[tuple[int, int], ...], tuple[int, ...]]:
        """The whole state: free blocks in eviction order, cached hashes, reference counts
        (two pools with equal fingerprints behave identically from here on)."""
        free = (*range(self._fresh, self.num_blocks), *self._free)
        return free, tuple(sorted(self._cached.items())), tuple(self._ref_cnt)
