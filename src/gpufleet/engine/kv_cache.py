"""Paged KV blocks with a prefix cache, as vLLM v1's block pool keeps them.

Block ownership lives here and only here. A block is an int id. A block with ref count 0
is free; a free block may still hold a cached prefix (its hash stays in `_cached`) until
it is handed out again. Free blocks are handed out least-recently-freed first, so cached
prefixes are evicted LRU.
"""

from __future__ import annotations

from collections import OrderedDict


class BlockPool:
    def __init__(self, num_blocks: int, *, enable_caching: bool = True):
        if num_blocks < 1:
            raise ValueError(f"num_blocks must be >= 1, got {num_blocks}")
        self.num_blocks = num_blocks
        self.enable_caching = enable_caching
        self._ref_cnt = [0] * num_blocks
        self._hash_of: list[int | None] = [None] * num_blocks
        self._cached: dict[int, int] = {}  # block hash -> block id
        # Free blocks in eviction order: the head is handed out (and evicted) first.
        self._free: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def free_list(self) -> OrderedDict[int, None]:
        """The free blocks themselves (read-only for callers; its len() is num_free)."""
        return self._free

    @property
    def usage(self) -> float:
        """Fraction of blocks held by requests (vLLM's kv_cache_usage_perc)."""
        return 1.0 - len(self._free) / self.num_blocks

    @property
    def num_cached(self) -> int:
        return len(self._cached)

    def reset_prefix_cache(self) -> bool:
        """Forget every cached prefix; refused (False) while a request holds blocks."""
        if len(self._free) < self.num_blocks:
            return False
        self._cached.clear()
        self._hash_of = [None] * self.num_blocks
        return True

    def lookup(self, block_hash: int) -> int | None:
        return self._cached.get(block_hash)

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
        popitem = self._free.popitem
        ref = self._ref_cnt
        hash_of = self._hash_of
        cached = self._cached
        out = []
        for _ in range(n):
            b, _none = popitem(False)  # the head: least recently freed
            h = hash_of[b]
            if h is not None:
                hash_of[b] = None
                if cached.get(h) == b:
                    del cached[h]
            ref[b] = 1
            out.append(b)
        return out

    def release(self, blocks: list[int]) -> None:
        """Drop one reference on each block; a request's tail blocks are evicted first."""
        ref = self._ref_cnt
        free = self._free
        for b in reversed(blocks):
            ref[b] -= 1
            if ref[b] == 0:
                free[b] = None

    def cache(self, block: int, block_hash: int) -> None:
        """Register a full block under its chained hash (first writer wins, as in vLLM)."""
        if self.enable_caching and block_hash not in self._cached:
            self._cached[block_hash] = block
            self._hash_of[block] = block_hash

    def cache_range(self, blocks: list[int], hashes: list[int], start: int, stop: int) -> None:
        """`cache(blocks[k], hashes[k])` for k in [start, stop), in one call (hot path)."""
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
