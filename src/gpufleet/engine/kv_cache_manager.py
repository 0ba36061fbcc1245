"""Which request holds which KV blocks (vLLM v1's `KVCacheManager`). Pure.

The scheduler asks and never edits a block list: `get_computed_blocks` finds a new
request's longest cached prefix, `allocate_slots` gives a request the blocks its next
tokens need (and registers its full blocks in the prefix cache), `free` hands them back.
`allocate_decode_slots` does what `allocate_slots` does for each step of a run of decode
iterations the engine jumps over, in the same order, so the pool ends up the same.

A request's blocks are known by what they hold (see `block_pool`): its leading
`num_cached` blocks as runs of cached hashes and blocks that hold none (their hash was
cached at another block first), then `tail` blocks that hold nothing yet.

A counted answer's blocks filled in decode runs are registered lazily (`lazy_answers`):
nothing can look their hashes up while the request runs (they are its own; a session's
next turn comes after it finishes), so they are registered once, in one step, when that
could show: before its blocks are freed, and before a lookup or another registration
touches the hashes they may take. A request's answer range (up to its max_tokens) is
reserved when it goes lazy, only if none of it is cached; a reservation a lookup or a
registration meets is flushed first. The pool ends as eager registration leaves it (the
same cached hashes, references and eviction order: `fingerprint`); blocks are still
handed out at once, so free counts and usage do not change.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterable
from itertools import pairwise

from gpufleet.engine.block_pool import BlockPool
from gpufleet.engine.block_runs import NO_BLOCKS, Blocks, Held, extend_chain
from gpufleet.engine.request import EngineRequest
from gpufleet.hash_runs import HashChain, Runs, chain_runs, slice_runs


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
        # request id -> [blocks registered, answer base, limit] of a lazy answer (its
        # blocks up to num_cached are filled); its reserved hashes base+registered ..
        # base+limit-1 by their start
        self._lazy: dict[str, list[int]] = {}
        self._resv_starts: list[int] = []
        # (end, request id) at its start's index in _resv_starts (no lookup by long hash)
        self._resv_spans: list[tuple[int, str]] = []
        self.lazy_answers = enable_caching

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
            if self._resv_starts:
                self._flush_reserved(chain_runs(hashes[:max_blocks]))
            return self.pool.cached_prefix_of(hashes, max_blocks)
        if len(req.block_hashes) < max_blocks:
            if peek:
                more = chain_runs(req.next_block_hashes(bs, num_tokens // bs))
                chain = self._runs_of(req) + more
                if self._resv_starts:
                    self._flush_reserved(chain)
                return self.pool.cached_prefix(chain, max_blocks)
            req.extend_block_hashes(bs)
        chain = self._runs_of(req)
        if self._resv_starts:
            self._flush_reserved(chain)
        return self.pool.cached_prefix(chain, max_blocks)

    def _runs_of(self, req: EngineRequest) -> Runs:
        """The runs of consecutive hashes in the request's block hashes (found once, or
        known from its prompt's maker)."""
        hashes = req.block_hashes
        rid = req.request_id
        if type(hashes) is HashChain:  # (held as its runs: always whole, never copied)
            self._chain[rid] = (len(hashes), hashes.runs)
            return hashes.runs
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
        self,
        members: list[EngineRequest],
        computed: list[int],
        num_steps: int,
        *,
        lazy: bool = True,
    ) -> bool:
        """What `allocate_decode_slots` does for `num_steps` decode steps of `members` (all
        running, in running order, with `computed` tokens before the first step and their
        tokens generated), in bulk: False (nothing changed) when the result could differ,
        i.e. when a hash the run registers is also cached at a block it evicts, or twice.

        A member needs a block at each step k where computed + k is a multiple of the block
        size: as blocks are anonymous, only their number (taken from the free queue at
        once) and each member's count matter. Each member's full blocks are registered
        after them all, in running order (none of their hashes is touched in between); a
        counted answer's are left to register lazily (see the module's docstring).
        """
        bs = self.block_size
        pool = self.pool
        tail = self._tail
        total = 0
        if not self.enable_caching:
            for i, r in enumerate(members):
                c = computed[i]
                k = -c // bs - -(c + num_steps) // bs  # blocks it gets: ceil(end/bs) - ceil(c/bs)
                if k > 0:
                    tail[r.request_id] += k
                    total += k
            if total:
                pool.allocate(total)
            return True
        num_cached = self._num_cached
        lazies = self._lazy
        lazy = lazy and self.lazy_answers
        # (rid, blocks it gets, first and stop of its blocks filled, their hashes' runs)
        changes: list[tuple[str, int, int, int, Runs | None]] = []
        fresh: list[int] = []  # the hashes registered, in that order
        reserve: list[tuple[str, int, int, int, int]] = []  # (rid, base, first, stop, limit)
        for i, r in enumerate(members):  # (compiled, a zip with strict= is a generic call)
            c = computed[i]
            end = c + num_steps
            k = -c // bs - -end // bs
            total += k
            rid = r.request_id
            stop = end // bs
            pending = lazies.get(rid)
            first = num_cached[rid]
            if pending is not None:  # (a lazy answer: its reservation holds its blocks)
                if stop > pending[2]:
                    return self._unlazy_run(members, computed, num_steps)
                if stop > first:
                    hashes = r.block_hashes
                    if len(hashes) < stop:  # (a HashChain takes the range as one run)
                        extend_chain(hashes, pending[1], stop)
                    changes.append((rid, k, first, stop, None))
                elif k:
                    changes.append((rid, k, first, first, None))
                continue
            if stop <= first:
                if k:
                    changes.append((rid, k, first, first, None))
                continue
            hashes = r.block_hashes
            # A counted answer's blocks past its prompt hash as base + j once the base is
            # known (`CountedOutputRequest.next_block_hashes`): one run, no list to check.
            base = None
            if first >= r.num_prompt_tokens // bs:
                base = r.answer_base
                if base is None and r.counted_output:  # (its first answer block: hashed
                    hashes += r.next_block_hashes(bs, stop)  # here, which finds its base)
                    base = r.answer_base
            if base is not None:
                if len(hashes) < stop:
                    extend_chain(hashes, base, stop)
                if lazy:
                    limit = self._answer_limit(r)
                    if stop <= limit:
                        reserve.append((rid, base, first, stop, limit))
                        changes.append((rid, k, first, stop, None))
                        continue
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
        if reserve or (fresh and self._resv_starts):
            # the reservations must meet no cached hash, no other one, no hash registered
            wanted = [(base + first, limit - first) for _, base, first, _, limit in reserve]
            if (
                self._reserved_among(wanted + chain_runs(sorted(set(fresh))) if fresh else wanted)
                or pool.any_cached(wanted)
                or _overlapping(wanted, fresh)
            ):
                return self._unlazy_run(members, computed, num_steps)
        if fresh and (
            len(set(fresh)) < len(fresh)
            # (hashes the run evicts are cached ones: then some of these are cached)
            or not pool.hashes_of_next_free(total).isdisjoint(fresh)
        ):
            return False
        if total:
            pool.allocate(total)
        held = self._held  # (`pool.register` called as a method: compiled, a native call)
        for rid, k, first, stop, chain in changes:  # in order: tails, then registration
            tail[rid] += k - (stop - first)
            num_cached[rid] = stop
            if chain is not None:
                pool.register(chain, held[rid])
        for rid, base, first, _stop, limit in reserve:
            self._add_reservation(rid, base, first, limit)
        return True

    def _unlazy_run(
        self, members: list[EngineRequest], computed: list[int], num_steps: int
    ) -> bool:
        """`allocate_decode_run` registering at once, every lazy answer registered first
        (a reservation met another hash: a collision, or a chain unlike a counted one)."""
        for rid in list(self._lazy):
            self._flush(rid)
        return self.allocate_decode_run(members, computed, num_steps, lazy=False)

    def _reserve(self, rid: str, base: int, first: int, stop: int, req: EngineRequest) -> bool:
        """Make a counted answer's blocks first..stop-1 lazy, reserving its answer's hashes
        from `first` on, if none of them is cached or reserved (else False: nothing done)."""
        limit = self._answer_limit(req)
        wanted = [(base + first, limit - first)]
        if stop > limit or self._reserved_among(wanted) or self.pool.any_cached(wanted):
            return False
        self._add_reservation(rid, base, first, limit)
        return True

    def _answer_limit(self, req: EngineRequest) -> int:
        """The blocks a request can fill at most (prompt + max_tokens): its answer's
        reservation ends there."""
        return -(-(req.num_prompt_tokens + req.max_tokens) // self.block_size)

    def _add_reservation(self, rid: str, base: int, first: int, limit: int) -> None:
        """Make `rid`'s answer lazy from block `first`, reserving hashes base+first ..
        base+limit-1 (the caller checked that none is cached or reserved)."""
        self._lazy[rid] = [first, base, limit]
        starts = self._resv_starts
        i = bisect_right(starts, base + first)
        starts.insert(i, base + first)
        self._resv_spans.insert(i, (base + limit, rid))

    def _reserved_among(self, chain: Runs) -> list[str]:
        """The requests whose reservations meet the hashes of `chain` (runs)."""
        starts, spans = self._resv_starts, self._resv_spans
        out: list[str] = []
        for h, n in chain:
            i = bisect_right(starts, h + n - 1) - 1
            while i >= 0:
                end, rid = spans[i]
                if end <= h:
                    break  # (reservations are disjoint: those before end earlier)
                out.append(rid)
                i -= 1
        return out

    def _flush_reserved(self, chain: Runs) -> None:
        """Register the lazy answers whose reservations meet `chain`'s hashes (before a
        lookup or registration of them)."""
        for rid in self._reserved_among(chain):
            if rid in self._lazy:
                self._flush(rid)

    def _flush(self, rid: str) -> None:
        """Register a lazy answer's filled blocks and drop its reservation."""
        first, base, _limit = self._lazy.pop(rid)
        stop = self._num_cached[rid]
        start = base + first
        starts = self._resv_starts
        i = bisect_right(starts, start) - 1
        del starts[i]
        del self._resv_spans[i]
        if stop > first:
            self.pool.register([(start, stop - first)], self._held[rid])

    def fingerprint(self) -> tuple[tuple[int | None, ...], tuple[tuple[int, int], ...]]:
        """The pool's `fingerprint` as eager registration would leave it (lazy answers'
        blocks cached, held by their requests alone), changing nothing."""
        free, cached = self.pool.fingerprint()
        more = [
            (h, 1)
            for rid, (first, base, _) in self._lazy.items()
            for h in range(base + first, base + self._num_cached[rid])
        ]
        return free, tuple(sorted(cached + tuple(more))) if more else cached

    def free(self, req: EngineRequest) -> None:
        """Hand back every block of `req` (its tail first, so it is evicted first)."""
        rid = req.request_id
        if rid in self._lazy:
            self._flush(rid)
        self._chain.pop(rid, None)
        held = self._held.pop(rid, None)
        if held is None:
            return
        del self._num_cached[rid]
        self.pool.release(held, self._tail.pop(rid))

    def _cache_full_blocks(self, req: EngineRequest, num_tokens: int) -> None:
        full = num_tokens // self.block_size
        rid = req.request_id
        pending = self._lazy.get(rid)
        if pending is not None and full > pending[2]:
            self._flush(rid)  # (past its reservation: cannot be, but be exact)
            pending = None
        start = self._num_cached[rid]
        if full <= start:
            return
        if len(req.block_hashes) < full:
            req.extend_block_hashes(self.block_size, full)
        base = req.answer_base
        if pending is not None or (
            base is not None
            and self.lazy_answers
            and start >= req.num_prompt_tokens // self.block_size
            and self._reserve(rid, base, start, full, req)
        ):  # (answer blocks in its reservation: left lazy)
            self._tail[rid] -= full - start
            self._num_cached[rid] = full
            return
        found, runs = self._chain.get(rid, (0, []))
        hashes = req.block_hashes
        if type(hashes) is HashChain:
            chain = slice_runs(hashes.runs, start, full)
        elif found >= full:  # (its runs are known: the prompt's, found for its hits)
            chain = slice_runs(runs, start, full)
        else:  # (a decode's few blocks: found here)
            chain = chain_runs(req.block_hashes, start, full)
        if self._resv_starts:  # (another's reservation: its blocks registered first)
            self._flush_reserved(chain)
        self.pool.register(chain, self._held[rid])
        self._tail[rid] -= full - start
        self._num_cached[rid] = full


def _overlapping(ranges: Runs, hashes: list[int]) -> bool:
    """Whether any of `hashes` lies in one of `ranges` (or two ranges meet)."""
    ordered = sorted(ranges)
    for (h, n), (h2, _) in pairwise(ordered):
        if h + n > h2:
            return True
    return any(h <= x < h + n for h, n in ranges for x in hashes)
