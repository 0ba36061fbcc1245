"""Which request holds which KV blocks (vLLM v1's `KVCacheManager`). Pure.

The scheduler asks and never edits a block list: `get_computed_blocks` finds a new
request's longest cached prefix, `allocate_slots` gives a request the blocks its next
tokens need (and registers its full blocks in the prefix cache), `free` hands them back.
`allocate_decode_slots` does what `allocate_slots` does for each step of a run of decode
iterations the engine jumps over, in the same order, so the pool ends up the same.
"""

from __future__ import annotations

from collections.abc import Iterable

from gpufleet.engine.block_pool import BlockPool
from gpufleet.engine.request import EngineRequest


class KVCacheManager:
    def __init__(self, num_blocks: int, block_size: int, *, enable_caching: bool = True) -> None:
        self.block_size = block_size
        self.enable_caching = enable_caching
        self.pool = BlockPool(num_blocks, enable_caching=enable_caching)
        self._blocks: dict[str, list[int]] = {}  # request id -> its blocks, in token order
        self._num_cached: dict[str, int] = {}  # request id -> its leading cached blocks

    @property
    def num_blocks(self) -> int:
        return self.pool.num_blocks

    @property
    def num_free_blocks(self) -> int:
        return self.pool.num_free

    @property
    def usage(self) -> float:
        """Fraction of blocks held by requests (vLLM's kv_cache_usage_perc)."""
        return self.pool.usage

    def usage_with(self, more_blocks: int) -> float:
        """What `usage` will be once `more_blocks` more blocks are handed out."""
        return 1.0 - (self.pool.num_free - more_blocks) / self.pool.num_blocks

    def blocks_of(self, request_id: str) -> tuple[int, ...]:
        """The blocks a request holds (a copy: read-only for callers)."""
        return tuple(self._blocks.get(request_id, ()))

    def get_computed_blocks(self, req: EngineRequest, *, peek: bool = False) -> list[int]:
        """Cached blocks of the request's longest cached prefix, never covering its last
        token (that one must be computed to produce the next token). Changes nothing but
        the request's own list of block hashes (not even that with `peek`)."""
        if not self.enable_caching:
            return []
        bs = self.block_size
        tokens = req.all_token_ids
        max_blocks = (len(tokens) - 1) // bs
        hashes = req.block_hashes
        if len(hashes) < max_blocks:
            if peek:
                hashes = hashes + req.next_block_hashes(bs, len(tokens) // bs)
            else:
                req.extend_block_hashes(bs)
        return self.pool.cached_prefix(hashes, max_blocks)

    def num_new_blocks(self, req: EngineRequest, num_tokens: int) -> int:
        """Blocks a running request needs to hold `num_tokens` tokens in all."""
        return -(-num_tokens // self.block_size) - len(self._blocks[req.request_id])

    def allocate_slots(
        self,
        req: EngineRequest,
        num_new_tokens: int,
        new_computed_blocks: list[int] | None = None,
    ) -> bool:
        """Give `req` the blocks for its computed tokens plus `num_new_tokens`, and register
        its full blocks in the prefix cache. False (and nothing changed) when the free
        blocks do not suffice.

        `new_computed_blocks` admits a waiting request: the cached prefix blocks it reuses
        (from `get_computed_blocks`; its computed tokens are those blocks' tokens).
        """
        bs = self.block_size
        pool = self.pool
        rid = req.request_id
        if new_computed_blocks is not None:
            hits = new_computed_blocks
            end = len(hits) * bs + num_new_tokens
            need = -(-end // bs) - len(hits)
            if need > pool.num_free - pool.num_evictable(hits):
                return False
            pool.touch(hits)
            blocks = hits + pool.allocate(need)
            self._blocks[rid] = blocks
            self._num_cached[rid] = len(hits)
            if self.enable_caching:
                self._cache_full_blocks(req, blocks, end)
            return True
        blocks = self._blocks[rid]
        end = req.num_computed_tokens + num_new_tokens
        need = -(-end // bs) - len(blocks)
        if need > 0:
            if need > pool.num_free:
                return False
            blocks.extend(pool.allocate(need))
        # (most steps are decodes that fill no block: skip the call then)
        if self.enable_caching and end // bs > self._num_cached[rid]:
            self._cache_full_blocks(req, blocks, end)
        return True

    def allocate_decode_slots(self, slots: Iterable[tuple[EngineRequest, int]]) -> None:
        """`allocate_slots(req, end - req.num_computed_tokens)` for each (req, end) in order,
        for running requests whose tokens up to `end` are known; the caller has checked that
        the free blocks suffice. Slots where no block fills or is needed may be left out."""
        bs = self.block_size
        pool = self.pool
        caching = self.enable_caching
        blocks_of = self._blocks
        num_cached = self._num_cached
        for req, end in slots:
            blocks = blocks_of[req.request_id]
            need = -(-end // bs) - len(blocks)
            if need > 0:
                blocks.extend(pool.allocate(need))
            if caching and end // bs > num_cached[req.request_id]:
                self._cache_full_blocks(req, blocks, end)

    def allocate_decode_run(
        self, members: list[EngineRequest], computed: list[int], num_steps: int
    ) -> bool:
        """What `allocate_decode_slots` does for `num_steps` decode steps of `members` (all
        running, in running order, with `computed` tokens before the first step and their
        tokens generated), in bulk: False (nothing changed) when the result could differ,
        i.e. when a hash the run registers is also cached at a block it evicts, or twice.

        Member m needs a block at step k when (computed[m] + k) % bs == 0, so every bs
        steps the same members ask in the same order: by that phase, then running order.
        """
        bs = self.block_size
        n = len(members)
        full_cycles, part = divmod(num_steps, bs)
        if part:
            phase = [-c % bs for c in computed]
            total = full_cycles * n + len([p for p in phase if p < part])
        else:
            phase, total = [], full_cycles * n
        pool = self.pool
        filled: list[tuple[str, int, int]] = []  # (request id, first, stop) of full blocks
        fresh: list[int] = []  # their hashes, in that order
        any_old = False  # some of them are cached (at other blocks) already
        num_cached = self._num_cached
        if self.enable_caching:
            keep = filled.append
            for r, c in zip(members, computed, strict=True):
                rid = r.request_id
                first, stop = num_cached[rid], (c + num_steps) // bs
                if stop > first:
                    hashes = r.block_hashes
                    if len(hashes) < stop:  # (its tokens up to `stop` blocks are known)
                        hashes += r.next_block_hashes(bs, stop)
                    fresh += hashes[first:stop]
                    keep((rid, first, stop))
            any_old = bool(fresh) and pool.any_cached(fresh)
            if fresh and (
                len(set(fresh)) < len(fresh)
                or (  # (a hash cached nowhere is not cached at a block the run evicts)
                    any_old and not pool.hashes_of_next_free(total).isdisjoint(fresh)
                )
            ):
                return False
        blocks_of = self._blocks
        if total:
            handed_out = pool.allocate(total)
            if n == 1:
                blocks_of[members[0].request_id] += handed_out
            else:
                if not phase:
                    phase = [-c % bs for c in computed]
                order = sorted(range(n), key=phase.__getitem__)
                for q in range(min(n, total)):  # (the q-th to ask gets every n-th block)
                    blocks_of[members[order[q]].request_id] += handed_out[q::n]
        if fresh:  # register every member's new full blocks at once (no hash repeats)
            blocks: list[int] = []
            for rid, first, stop in filled:
                blocks += blocks_of[rid][first:stop]
                num_cached[rid] = stop
            if any_old:  # (some are cached elsewhere already: the first writer keeps them)
                pool.cache_blocks(blocks, fresh)
            else:
                pool.cache_new_blocks(blocks, fresh)
        return True

    def free(self, req: EngineRequest) -> None:
        """Hand back every block of `req` (its tail first, so it is evicted first)."""
        blocks = self._blocks.pop(req.request_id, None)
        self._num_cached.pop(req.request_id, None)
        if blocks:
            self.pool.release(blocks)

    def _cache_full_blocks(self, req: EngineRequest, blocks: list[int], num_tokens: int) -> None:
        full = num_tokens // self.block_size
        rid = req.request_id
        start = self._num_cached[rid]
        if full <= start:
            return
        if len(req.block_hashes) < full:
            req.extend_block_hashes(self.block_size, full)
        self.pool.cache_range(blocks, req.block_hashes, start, full)
        self._num_cached[rid] = full
