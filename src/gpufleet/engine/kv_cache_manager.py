"""Which request holds which KV blocks (vLLM v1's `KVCacheManager`). Pure.

The scheduler asks and never edits a block list: `get_computed_blocks` finds a new
request's longest cached prefix, `allocate_slots` gives a request the blocks its next
tokens need (and registers its full blocks in the prefix cache), `free` hands them back.
`allocate_decode_slots` does what `allocate_slots` does for each step of a run of decode
iterations the engine jumps over, in the same order, so the pool ends up the same.

A request's blocks are known by what they hold (see `block_pool`): its leading
`num_cached` blocks as runs of cached hashes and blocks that hold none (their hash was
cached at another block first), then `tail` blocks that hold nothing yet.
"""

from __future__ import annotations

from collections.abc import Iterable

from gpufleet.engine.block_pool import BlockPool
from gpufleet.engine.block_runs import NO_BLOCKS, Blocks, Held
from gpufleet.engine.request import EngineRequest
from gpufleet.hash_runs import Runs, chain_runs, slice_runs


class KVCacheManager:
    def __init__(self, num_blocks: int, block_size: int, *, enable_caching: bool = True) -> None:
        self.block_size = block_size
        self.enable_caching = enable_caching
        self.pool = BlockPool(num_blocks, enable_caching=enable_caching)
        self._held: dict[str, Held] = {}  # request id -> its first num_cached blocks
        self._num_cached: dict[str, int] = {}  # request id -> its leading cached blocks
        self._tail: dict[str, int] = {}  # request id -> its blocks past those
        # request id -> (hashes found in runs, the runs) of its block hashes
        self._chain: dict[str, tuple[int, Runs]] = {}

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

    def get_computed_blocks(self, req: EngineRequest, *, peek: bool = False) -> Blocks:
        """Cached blocks of the request's longest cached prefix, never covering its last
        token (that one must be computed to produce the next token). Changes nothing but
        the request's own list of block hashes (not even that with `peek`)."""
        if not self.enable_caching:
            return NO_BLOCKS
        bs = self.block_size
        num_tokens = req.num_tokens
        max_blocks = (num_tokens - 1) // bs
        if req.request_id not in self._chain and req.prompt_runs is None:
            # (runs not known: found as far as the cached prefix goes, not further)
            hashes = req.block_hashes
            if len(hashes) < max_blocks:
                if peek:
                    hashes = hashes + req.next_block_hashes(bs, num_tokens // bs)
                else:
                    req.extend_block_hashes(bs)
            return self.pool.cached_prefix_of(hashes, max_blocks)
        if len(req.block_hashes) < max_blocks:
            if peek:
                more = chain_runs(req.next_block_hashes(bs, num_tokens // bs))
                return self.pool.cached_prefix(self._runs_of(req) + more, max_blocks)
            req.extend_block_hashes(bs)
        return self.pool.cached_prefix(self._runs_of(req), max_blocks)

    def _runs_of(self, req: EngineRequest) -> Runs:
        """The runs of consecutive hashes in the request's block hashes (found once, or
        known from its prompt's maker)."""
        hashes = req.block_hashes
        rid = req.request_id
        known = self._chain.get(rid)
        if known is None:
            runs = req.prompt_runs
            known = (sum(n for _, n in runs), list(runs)) if runs else (0, [])
            if known[0] > len(hashes):  # (not the hashes it holds now)
                known = (0, [])
            self._chain[rid] = known
        found, runs = known
        if found < len(hashes):
            more = chain_runs(hashes, found)
            if runs and runs[-1][0] + runs[-1][1] == more[0][0]:  # (it runs on)
                runs[-1] = (runs[-1][0], runs[-1][1] + more[0][1])
                del more[0]
            runs += more
            self._chain[rid] = (len(hashes), runs)
        return runs

    def allocate_slots(
        self,
        req: EngineRequest,
        num_new_tokens: int,
        new_computed_blocks: Blocks | None = None,
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
            num_hits = len(hits)
            end = num_hits * bs + num_new_tokens
            need = -(-end // bs) - num_hits
            if need > pool.num_free - (pool.num_evictable(hits) if num_hits else 0):
                return False
            if num_hits:
                pool.touch(hits)
            pool.allocate(need)
            self._held[rid] = list(hits.runs)
            self._num_cached[rid] = num_hits
            self._tail[rid] = need
            if self.enable_caching:
                self._cache_full_blocks(req, end)
            return True
        end = req.num_computed_tokens + num_new_tokens
        num_cached = self._num_cached[rid]
        need = -(-end // bs) - num_cached - self._tail[rid]
        if need > 0:
            if need > pool.num_free:
                return False
            pool.allocate(need)
            self._tail[rid] += need
        # (most steps are decodes that fill no block: skip the call then)
        if self.enable_caching and end // bs > num_cached:
            self._cache_full_blocks(req, end)
        return True

    def allocate_decode_slots(self, slots: Iterable[tuple[EngineRequest, int]]) -> None:
        """`allocate_slots(req, end - req.num_computed_tokens)` for each (req, end) in order,
        for running requests whose tokens up to `end` are known; the caller has checked that
        the free blocks suffice. Slots where no block fills or is needed may be left out."""
        bs = self.block_size
        pool = self.pool
        caching = self.enable_caching
        tail = self._tail
        num_cached = self._num_cached
        for req, end in slots:
            rid = req.request_id
            need = -(-end // bs) - num_cached[rid] - tail[rid]
            if need > 0:
                pool.allocate(need)
                tail[rid] += need
            if caching and end // bs > num_cached[rid]:
                self._cache_full_blocks(req, end)

    def allocate_decode_run(
        self, members: list[EngineRequest], computed: list[int], num_steps: int
    ) -> bool:
        """What `allocate_decode_slots` does for `num_steps` decode steps of `members` (all
        running, in running order, with `computed` tokens before the first step and their
        tokens generated), in bulk: False (nothing changed) when the result could differ,
        i.e. when a hash the run registers is also cached at a block it evicts, or twice.

        A member needs a block at each step k where computed + k is a multiple of the block
        size: as blocks are anonymous, only their number (taken from the free queue at
        once) and each member's count matter. Each member's full blocks are registered
        after them all, in running order (none of their hashes is touched in between).
        """
        bs = self.block_size
        pool = self.pool
        tail = self._tail
        total = 0
        if not self.enable_caching:
            for r, c in zip(members, computed, strict=True):
                k = -c // bs - -(c + num_steps) // bs  # blocks it gets: ceil(end/bs) - ceil(c/bs)
                if k > 0:
                    tail[r.request_id] += k
                    total += k
            if total:
                pool.allocate(total)
            return True
        num_cached = self._num_cached
        # (rid, blocks it gets, first and stop of its blocks filled, their hashes' runs)
        changes: list[tuple[str, int, int, int, Runs | None]] = []
        fresh: list[int] = []  # the hashes registered, in that order
        for r, c in zip(members, computed, strict=True):
            end = c + num_steps
            k = -c // bs - -end // bs
            total += k
            rid = r.request_id
            first, stop = num_cached[rid], end // bs
            if stop <= first:
                if k:
                    changes.append((rid, k, first, first, None))
                continue
            hashes = r.block_hashes
            # A counted answer's blocks past its prompt hash as base + j once the base is
            # known (`CountedOutputRequest.next_block_hashes`): one run, no list to check.
            base = r.answer_base if first >= r.num_prompt_tokens // bs else None
            if base is not None:
                if len(hashes) < stop:
                    hashes += range(base + len(hashes), base + stop)
                fresh += range(base + first, base + stop)
                changes.append((rid, k, first, stop, [(base + first, stop - first)]))
                continue
            if len(hashes) < stop:  # (its tokens up to `stop` blocks are known)
                hashes += r.next_block_hashes(bs, stop)
            new = hashes[first:stop]
            fresh += new
            h = new[0]
            # (an answer's blocks hash as consecutive ints: one run)
            runs = (
                [(h, stop - first)]
                if new[-1] - h == stop - first - 1
                and (stop - first < 3 or new == list(range(h, h + stop - first)))
                else chain_runs(new)
            )
            changes.append((rid, k, first, stop, runs))
        if fresh and (
            len(set(fresh)) < len(fresh)
            # (hashes the run evicts are cached ones: then some of these are cached)
            or not pool.hashes_of_next_free(total).isdisjoint(fresh)
        ):
            return False
        if total:
            pool.allocate(total)
        register, held = pool.register, self._held
        for rid, k, first, stop, chain in changes:  # in order: tails, then registration
            tail[rid] += k - (stop - first)
            if chain is not None:
                register(chain, held[rid])
                num_cached[rid] = stop
        return True

    def free(self, req: EngineRequest) -> None:
        """Hand back every block of `req` (its tail first, so it is evicted first)."""
        rid = req.request_id
        self._chain.pop(rid, None)
        held = self._held.pop(rid, None)
        if held is None:
            return
        del self._num_cached[rid]
        self.pool.release(held, self._tail.pop(rid))

    def _cache_full_blocks(self, req: EngineRequest, num_tokens: int) -> None:
        full = num_tokens // self.block_size
        rid = req.request_id
        start = self._num_cached[rid]
        if full <= start:
            return
        if len(req.block_hashes) < full:
            req.extend_block_hashes(self.block_size, full)
        found, runs = self._chain.get(rid, (0, []))
        if found >= full:  # (its runs are known: the prompt's, found for its hits)
            chain = slice_runs(runs, start, full)
        else:  # (a decode's few blocks: found here)
            chain = chain_runs(req.block_hashes, start, full)
        self.pool.register(chain, self._held[rid])
        self._tail[rid] -= full - start
        self._num_cached[rid] = full
