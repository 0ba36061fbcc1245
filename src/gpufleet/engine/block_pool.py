"""Paged KV blocks with a prefix cache, as vLLM v1's block pool keeps them.

The pool knows blocks, their reference counts and the hashes they are cached under; which
request holds which blocks is the `KVCacheManager`'s business. A block is an int id. A
block with ref count 0 is free; a free block may still hold a cached prefix (its hash stays
in `_cached`) until it is handed out again. Free blocks are handed out least-recently-freed
first, so cached prefixes are evicted LRU.

A request holds hundreds of blocks (a 12k-token prompt: 750), so every operation works on
a whole run of blocks with C-level bulk operations (slices, `map`, set and dict updates)
instead of one Python step per block:

* a held block's count is 1 unless it is in `_extra` (the references beyond the first:
  prefix hits shared by running requests);
* the free blocks are the never used ones (ids `_fresh`..num_blocks-1, kept as a range)
  and the set `_free`; their eviction order is the queue `_order` of freed blocks, oldest
  first. A free block reused as a prefix hit leaves `_free` at once but its place in the
  queue only when the queue reaches it: `_stale` counts such left-behind entries per block
  (they always come before the block's live entry, which was queued when it was freed
  again).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from itertools import compress, islice, repeat
from operator import not_

_popleft = deque.popleft
_NO_HASH = object()  # what a block without a cached hash maps to (cached under nothing)


def _consume(it: Iterator[object]) -> None:
    deque(it, maxlen=0)


class BlockPool:
    def __init__(self, num_blocks: int, *, enable_caching: bool = True) -> None:
        if num_blocks < 1:
            raise ValueError(f"num_blocks must be >= 1, got {num_blocks}")
        self.num_blocks = num_blocks
        self.enable_caching = enable_caching
        self._extra: dict[int, int] = {}  # block -> references beyond its first (if any)
        self._hash_of: dict[int, int] = {}  # block -> the hash it is cached under
        self._cached: dict[int, int] = {}  # block hash -> block id
        self._fresh = 0  # blocks _fresh.. were never used (handed out first, in id order)
        self._free: set[int] = set()  # freed blocks not handed out (or reused) since
        self._order: deque[int] = deque()  # freed blocks, least recently freed first
        self._stale: dict[int, int] = {}  # block -> entries of it in _order left behind

    @property
    def num_free(self) -> int:
        return self.num_blocks - self._fresh + len(self._free)

    @property
    def usage(self) -> float:
        """Fraction of blocks held by requests (vLLM's kv_cache_usage_perc)."""
        return 1.0 - self.num_free / self.num_blocks

    def reset_prefix_cache(self) -> bool:
        """Forget every cached prefix; refused (False) while a request holds blocks."""
        if self.num_free < self.num_blocks:
            return False
        self._hash_of.clear()
        self._cached.clear()
        return True

    def lookup(self, block_hash: int) -> int | None:
        return self._cached.get(block_hash)

    def cached_prefix(self, hashes: list[int], max_blocks: int) -> list[int]:
        """The cached blocks of the longest run of `hashes[:max_blocks]` that are cached."""
        get = self._cached.get
        out: list[int] = []
        start, size = 0, 8  # look up in chunks that double: cost grows with the run found
        stop = min(max_blocks, len(hashes))
        while start < stop:
            found = list(map(get, hashes[start : min(stop, start + size)]))
            if None in found:
                out += found[: found.index(None)]  # type: ignore[arg-type]
                break
            out += found  # type: ignore[arg-type]
            start += size
            size *= 2
        return out

    def _free_in_order(self) -> Iterator[int]:
        """The freed blocks in eviction order (skipping entries left behind)."""
        stale = dict(self._stale)
        for b in self._order:
            left = stale.get(b)
            if left:
                stale[b] = left - 1
            else:
                yield b

    def hashes_of_next_free(self, n: int) -> set[int]:
        """The hashes cached at the next `n` blocks `allocate` would hand out (and evict)."""
        n -= self.num_blocks - self._fresh  # never used blocks hold no hash
        if n <= 0 or not self._cached:
            return set()
        get = self._hash_of.get
        return {h for b in islice(self._free_in_order(), n) if (h := get(b)) is not None}

    def any_cached(self, hashes: list[int]) -> bool:
        """Whether any of `hashes` is cached (at any block)."""
        return not self._cached.keys().isdisjoint(hashes)

    def num_evictable(self, blocks: list[int]) -> int:
        """How many of `blocks` are free now (touching them takes them off the free list)."""
        return sum(map(self._free.__contains__, blocks))

    def touch(self, blocks: list[int]) -> None:
        """Take a reference on cached blocks a request reuses."""
        free = self._free
        if not free.isdisjoint(blocks):  # free ones leave the set, their queue entries stay
            reused = [b for b in blocks if b in free]
            blocks = [b for b in blocks if b not in free]
            free.difference_update(reused)
            self._add_one(self._stale, reused)
        self._add_one(self._extra, blocks)

    @staticmethod
    def _add_one(counts: dict[int, int], blocks: list[int]) -> None:
        for b in blocks:
            counts[b] = counts.get(b, 0) + 1

    def allocate(self, n: int) -> list[int]:
        """Hand out n free blocks (caller checked num_free), evicting their cached hashes."""
        out: list[int] = []
        fresh = self._fresh
        if fresh < self.num_blocks:
            take = min(n, self.num_blocks - fresh)
            out = list(range(fresh, fresh + take))
            self._fresh = fresh + take
            n -= take
        if n <= 0:
            return out
        order = self._order
        taken = list(map(_popleft, repeat(order, n)))  # the least recently freed
        stale = self._stale
        if stale and not stale.keys().isdisjoint(taken):
            taken = self._skip_stale(taken, n)
        self._free.difference_update(taken)
        hash_of = self._hash_of
        if hash_of:  # a block holds a hash only while it is the cached one: drop both
            hashes = map(hash_of.pop, taken, repeat(_NO_HASH))
            _consume(map(self._cached.pop, hashes, repeat(None)))  # type: ignore[arg-type]
        out += taken
        return out

    def _skip_stale(self, popped: list[int], n: int) -> list[int]:
        """The first n live entries of the queue, `popped` being its first n entries."""
        stale = self._stale
        live: list[int] = []
        batch = popped
        while True:
            flags = list(map(stale.__contains__, batch))
            keep = list(map(not_, flags))
            for i in compress(range(len(batch)), flags):  # (the first entries are stale)
                b = batch[i]
                left = stale.get(b)
                if left is None:
                    keep[i] = True
                elif left == 1:
                    del stale[b]
                else:
                    stale[b] = left - 1
            live += compress(batch, keep)
            if len(live) == n:
                return live
            batch = list(map(_popleft, repeat(self._order, n - len(live))))

    def release(self, blocks: list[int]) -> None:
        """Drop one reference on each block; a request's tail blocks are evicted first."""
        extra = self._extra
        if extra and not extra.keys().isdisjoint(blocks):
            blocks = self._drop_extra(blocks)
        self._order.extend(reversed(blocks))
        self._free.update(blocks)

    def _drop_extra(self, blocks: list[int]) -> list[int]:
        """Drop a reference on the shared ones; the blocks this frees, in their order."""
        extra = self._extra
        shared = list(map(extra.__contains__, blocks))
        head = len(shared) - shared[::-1].index(True)  # shared blocks are prefix hits: early
        freed: list[int] = []
        for b in blocks[:head]:
            count = extra.get(b)
            if count is None:
                freed.append(b)
            elif count == 1:
                del extra[b]
            else:
                extra[b] = count - 1
        freed += blocks[head:]
        return freed

    def cache_range(self, blocks: list[int], hashes: list[int], start: int, stop: int) -> None:
        """Register blocks[k] under its chained hash hashes[k] for k in [start, stop); the
        first block registered under a hash keeps it (first writer wins, as in vLLM)."""
        if self.enable_caching and stop > start:
            self.cache_blocks(blocks[start:stop], hashes[start:stop])

    def cache_blocks(self, blocks: list[int], hashes: list[int]) -> None:
        """Register blocks[k] under hashes[k], in order (first writer wins)."""
        if not self.enable_caching:
            return
        cached = self._cached
        if len(hashes) > 4 and cached.keys().isdisjoint(hashes):  # many and all new: in bulk
            before = len(cached)
            cached.update(zip(hashes, blocks, strict=True))
            if len(cached) == before + len(hashes):
                self._hash_of.update(zip(blocks, hashes, strict=True))
                return
            _consume(map(cached.pop, hashes, repeat(None)))  # a hash twice: undo, then slowly
        hash_of = self._hash_of  # a few, or a hash seen before (or twice here): one by one
        for h, b in zip(hashes, blocks, strict=True):
            if h not in cached:
                cached[h] = b
                hash_of[b] = h

    def cache_new_blocks(self, blocks: list[int], hashes: list[int]) -> None:
        """`cache_blocks` for distinct hashes the caller knows are cached nowhere."""
        if self.enable_caching:
            self._cached.update(zip(hashes, blocks, strict=True))
            self._hash_of.update(zip(blocks, hashes, strict=True))

    def fingerprint(self) -> tuple[tuple[int, ...], tuple[tuple[int, int], ...], tuple[int, ...]]:
        """The whole state: free blocks in eviction order, cached hashes, reference counts
        (two pools with equal fingerprints behave identically from here on)."""
        free = (*range(self._fresh, self.num_blocks), *self._free_in_order())
        refs = [1] * self.num_blocks
        for b in free:
            refs[b] = 0
        for b, more in self._extra.items():
            refs[b] += more
        return free, tuple(sorted(self._cached.items())), tuple(refs)
