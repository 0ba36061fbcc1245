"""Paged KV blocks with a prefix cache, as vLLM v1's block pool keeps them, in runs.

The pool counts blocks and knows which hashes are cached, with how many references, and
in which order free blocks are evicted; which request holds which blocks is the
`KVCacheManager`'s business. Free blocks are handed out least-recently-freed first (never
used ones before all), so cached prefixes are evicted LRU, a request's tail first.

A block is known by what it holds, not by an id: a cached block by its hash (a hash is
cached at one block at most), any other block is one of many interchangeable ones. That
lets the pool work on runs: the simulator's chains of block hashes are a few runs of
consecutive ints (`gpufleet.hash_runs`), and a run of cached hashes with the same
reference count is one `Run`, so a request's 750 blocks are admitted, cached, freed and
evicted in a few steps each instead of 750. A run is split where a request shares only
part of it, and grows while its only holder's decode fills blocks. The free queue holds
anonymous block counts and (run, generation) entries; a free run taken as a prefix hit
stays in the queue until it is reached (its entry is stale once the run is held or freed
again). The runs are found through one dict by the spans of 256 hashes they cover: no
sorted list of starts to bisect, whose int objects, scattered in memory, made each step
of a bisection a cache miss once 256 replicas' pools were full. A live replica's hashes
are unrelated (runs of one), each a run under its own span.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator, Sequence

from gpufleet.engine.block_runs import NO_BLOCKS, Blocks, Held, Run, append_held
from gpufleet.hash_runs import Runs, consecutive

# The runs are indexed by the spans of 256 hashes they cover (hash >> 8): a lookup is one
# dict read, with no sorted list of ~1,100 starts to bisect (each of its ~11 steps read an
# int object somewhere in memory: with 256 full pools, a cache miss each).
_SPAN_BITS = 8


class BlockPool:
    def __init__(self, num_blocks: int, *, enable_caching: bool = True) -> None:
        if num_blocks < 1:
            raise ValueError(f"num_blocks must be >= 1, got {num_blocks}")
        self.num_blocks = num_blocks
        self.enable_caching = enable_caching
        self._fresh = num_blocks  # never used blocks (handed out first)
        self._num_free = num_blocks
        self._order: deque[int | tuple[Run, int]] = deque()  # freed, oldest first
        # span (hash >> _SPAN_BITS) -> the run, or the runs, holding hashes in it (runs
        # never overlap; a run is under each span it meets)
        self._spans: dict[int, Run | list[Run]] = {}
        self._num_runs = 0

    @property
    def num_free(self) -> int:
        return self._num_free

    @property
    def num_cached_runs(self) -> int:
        """How many runs of cached hashes the pool keeps (a diagnostic)."""
        return self._num_runs

    @property
    def usage(self) -> float:
        """Fraction of blocks held by requests (vLLM's kv_cache_usage_perc)."""
        return 1.0 - self._num_free / self.num_blocks

    def reset_prefix_cache(self) -> bool:
        """Forget every cached prefix; refused (False) while a request holds blocks."""
        if self._num_free < self.num_blocks:
            return False
        queued = self._num_free - self._fresh
        self._order = deque([queued] if queued else [])
        self._spans.clear()
        self._num_runs = 0
        return True

    # ------------------------------------------------------------ the index of runs

    def _find(self, h: int) -> Run | None:
        """The run holding hash h, if it is cached."""
        got = self._spans.get(h >> _SPAN_BITS)
        if got is None:
            return None
        if isinstance(got, Run):
            return got if got.start <= h < got.start + got.size else None
        for run in got:
            if run.start <= h < run.start + run.size:
                return run
        return None

    def _next_start(self, h: int, end: int) -> int:
        """The first hash of h+1..end-1 that starts a run, or `end`: the first cached one
        there when h is not cached or its run ends at h."""
        first = end
        spans = self._spans
        for k in range((h + 1) >> _SPAN_BITS, ((end - 1) >> _SPAN_BITS) + 1):
            got = spans.get(k)
            if got is None:
                continue
            if isinstance(got, Run):
                if h < got.start < first:
                    first = got.start
                continue
            for run in got:
                if h < run.start < first:
                    first = run.start
        return first

    def _overlaps(self, h: int, n: int) -> bool:
        """Whether any of hashes h..h+n-1 is cached."""
        end = h + n
        spans = self._spans
        for k in range(h >> _SPAN_BITS, ((end - 1) >> _SPAN_BITS) + 1):
            got = spans.get(k)
            if got is None:
                continue
            if isinstance(got, Run):
                if got.start < end and got.start + got.size > h:
                    return True
                continue
            for run in got:
                if run.start < end and run.start + run.size > h:
                    return True
        return False

    def _put(self, run: Run, k: int, stop: int) -> None:
        """Index `run` under spans k..stop-1."""
        spans = self._spans
        while k < stop:
            got = spans.get(k)
            if got is None:
                spans[k] = run
            elif isinstance(got, Run):
                spans[k] = [got, run]
            else:
                got.append(run)
            k += 1

    def _take(self, run: Run, k: int, stop: int) -> None:
        """Take `run` off spans k..stop-1."""
        spans = self._spans
        while k < stop:
            got = spans[k]
            if isinstance(got, Run):
                del spans[k]
            else:
                got.remove(run)
                if len(got) == 1:
                    spans[k] = got[0]
            k += 1

    def _add(self, run: Run) -> None:
        """Cache `run`."""
        self._put(run, run.start >> _SPAN_BITS, ((run.start + run.size - 1) >> _SPAN_BITS) + 1)
        self._num_runs += 1

    def _drop(self, run: Run) -> None:
        self._take(run, run.start >> _SPAN_BITS, ((run.start + run.size - 1) >> _SPAN_BITS) + 1)
        self._num_runs -= 1

    def _resize(self, run: Run, size: int) -> None:
        """Make `run` hold its first `size` hashes (1 or more)."""
        was = ((run.start + run.size - 1) >> _SPAN_BITS) + 1
        now = ((run.start + size - 1) >> _SPAN_BITS) + 1
        if now > was:
            self._put(run, was, now)
        elif now < was:
            self._take(run, now, was)
        run.size = size

    def _isolate(self, run: Run, a: int, b: int) -> Run:
        """The run of hashes a..b-1, split off `run` (which holds them) if it holds more.
        The parts of a free run keep their places in the queue, its upper part first."""
        s, e = run.start, run.start + run.size
        if s == a and e == b:
            return run
        part = Run(a, b - a, run.refs)
        if b < e:  # `run` keeps the upper rest (and its queue entry: it is evicted first)
            self._drop(run)
            run.start, run.size = b, e - b
            self._add(run)
            if s < a:
                lower = Run(s, a - s, run.refs)
                self._add(lower)
                if not run.refs:  # (a free run: the lower rest goes right after it)
                    order = self._order
                    order.insert(order.index((run, run.gen)) + 1, (lower, 0))
        else:  # `run` keeps the lower rest
            self._resize(run, a - s)
        self._add(part)
        return part

    def _covering(self, h: int, n: int) -> Iterator[tuple[Run, int, int]]:
        """(run, a, b) for the runs holding the cached hashes h..h+n-1, in order, each with
        the part [a, b) of its hashes in that range."""
        end = h + n
        while h < end:
            run = self._find(h)
            assert run is not None, "a held or hit block is cached"
            b = min(end, run.start + run.size)
            yield run, h, b
            h = b

    # ------------------------------------------------------------ what the manager asks

    def cached_prefix(self, chain: Runs, max_blocks: int) -> Blocks:
        """The cached blocks of the longest run of the chain's first `max_blocks` blocks
        that are cached (`chain`: the chain's runs of consecutive hashes)."""
        runs: list[tuple[int, int]] = []
        left = max_blocks
        for h, n in chain:
            end = h + min(n, left)
            while h < end:
                run = self._find(h)
                if run is None:
                    return Blocks(runs, max_blocks - left) if runs else NO_BLOCKS
                k = min(end, run.start + run.size) - h
                if runs and runs[-1][0] + runs[-1][1] == h:
                    runs[-1] = (runs[-1][0], runs[-1][1] + k)
                else:
                    runs.append((h, k))
                left -= k
                h += k
            if not left:
                break
        return Blocks(runs, max_blocks - left) if runs else NO_BLOCKS

    def cached_prefix_of(self, hashes: Sequence[int], max_blocks: int) -> Blocks:
        """`cached_prefix` for a chain given as its hashes (its runs found as far as
        its cached prefix goes)."""
        stop = min(max_blocks, len(hashes))
        runs: list[tuple[int, int]] = []
        i = 0
        while i < stop:
            h = hashes[i]
            run = self._find(h)
            if run is None:
                break
            k = consecutive(hashes, i, min(run.start + run.size - h, stop - i))
            if runs and runs[-1][0] + runs[-1][1] == h:
                runs[-1] = (runs[-1][0], runs[-1][1] + k)
            else:
                runs.append((h, k))
            i += k
        return Blocks(runs, i) if runs else NO_BLOCKS

    def hashes_of_next_free(self, n: int) -> set[int]:
        """The hashes cached at the next `n` blocks `allocate` would hand out (and evict)."""
        n -= self._fresh
        out: set[int] = set()
        for entry in self._order:
            if n <= 0:
                break
            if type(entry) is int:
                n -= entry
                continue
            run, gen = entry  # type: ignore[misc]
            if run.gen == gen and not run.refs and run.size:
                take = min(n, run.size)
                top = run.start + run.size
                out.update(range(top - take, top))
                n -= take
        return out

    def any_cached(self, runs: Runs) -> bool:
        """Whether any hash of `runs` is cached."""
        # (a loop, not `any` over a generator calling a bound method held in a local:
        # compiled, those are generic calls, ~6,000 instructions a call here)
        for h, n in runs:  # noqa: SIM110
            if self._overlaps(h, n):
                return True
        return False

    def num_evictable(self, blocks: Blocks) -> int:
        """How many of `blocks` are free now (touching them takes them off the free list)."""
        free = 0
        for h, n in blocks.runs:
            for run, a, b in self._covering(h, n):
                if not run.refs:
                    free += b - a
        return free

    def touch(self, blocks: Blocks) -> None:
        """Take a reference on cached blocks a request reuses."""
        for h, n in blocks.runs:
            for run, a, b in list(self._covering(h, n)):
                part = self._isolate(run, a, b)
                if not part.refs:
                    self._num_free -= part.size
                part.refs += 1

    def allocate(self, n: int) -> None:
        """Hand out n free blocks (caller checked num_free), evicting their cached hashes."""
        self._num_free -= n
        fresh = self._fresh
        if fresh:
            take = min(n, fresh)
            self._fresh = fresh - take
            n -= take
        order = self._order
        while n > 0:
            entry = order[0]
            if type(entry) is int:
                if entry > n:
                    order[0] = entry - n
                    return
                order.popleft()
                n -= entry
                continue
            run, gen = entry  # type: ignore[misc]
            if run.gen != gen or run.refs or not run.size:  # left behind: not free
                order.popleft()
                continue
            if run.size > n:  # evict its top n hashes (a request's tail goes first)
                self._resize(run, run.size - n)
                return
            order.popleft()
            n -= run.size
            self._drop(run)
            run.size = 0

    def register(self, chain: Runs, held: Held) -> None:
        """Cache the hashes of `chain` (runs of them) at the blocks a request just filled
        (held by it alone, holding nothing yet), and add what those blocks hold now to
        the request's `held`. A hash cached already stays where it is (first writer
        wins, as in vLLM); a run the request alone holds grows on (a decode's blocks)."""
        if not self.enable_caching:
            total = sum(n for _, n in chain)
            if total:
                append_held(held, None, total)
            return
        for h, n in chain:
            end = h + n
            last, m = held[-1] if held else (None, 0)
            if last is not None and last + m == h:  # (a decode's blocks: the usual case)
                own = self._find(h - 1)  # (this request holds it: cached)
                if (
                    own is not None
                    and own.refs == 1
                    and own.start + own.size == h
                    and self._next_start(h - 1, end) == end  # (none of them cached)
                ):
                    self._resize(own, own.size + n)  # (only this request holds it)
                    held[-1] = (last, m + n)
                    continue
            while h < end:
                run = self._find(h)
                if run is not None:  # cached elsewhere: this block holds nothing
                    b = min(end, run.start + run.size)
                    append_held(held, None, b - h)
                    h = b
                    continue
                b = self._next_start(h, end)
                last, m = held[-1] if held else (None, 0)
                if last is not None and last + m == h:  # (a decode's blocks, usually)
                    run = self._find(h - 1)
                    if run is not None and run.refs == 1 and run.start + run.size == h:
                        self._resize(run, run.size + b - h)  # (only it holds the run)
                        held[-1] = (last, m + b - h)
                        h = b
                        continue
                self._add(Run(h, b - h, 1))
                held.append((h, b - h))
                h = b

    def release(self, held: Held, more: int = 0) -> None:
        """Drop one reference on each of `held`'s blocks, then on `more` blocks that hold
        nothing past them; the freed ones queue tail first (evicted first)."""
        order = self._order
        freed = more
        if more:
            self._queue_anonymous(more)
        for h, n in reversed(held):
            if h is None:
                self._queue_anonymous(n)
                freed += n
                continue
            run = self._find(h)
            if (
                run is not None and run.start == h and run.size == n
            ):  # (one whole run: the usual case)
                run.refs -= 1
                if not run.refs:
                    run.gen += 1
                    order.append((run, run.gen))
                    freed += n
                continue
            for run, a, b in reversed(list(self._covering(h, n))):
                part = self._isolate(run, a, b)
                part.refs -= 1
                if not part.refs:
                    part.gen += 1
                    order.append((part, part.gen))
                    freed += part.size
        self._num_free += freed

    def _queue_anonymous(self, n: int) -> None:
        order = self._order
        if order and type(order[-1]) is int:
            order[-1] += n
        else:
            order.append(n)

    def fingerprint(self) -> tuple[tuple[int | None, ...], tuple[tuple[int, int], ...]]:
        """The whole state: what the free blocks hold in eviction order (None: nothing),
        cached hashes with their reference counts (two pools with equal fingerprints
        behave identically from here on)."""
        free: list[int | None] = [None] * self._fresh
        for entry in self._order:
            if type(entry) is int:
                free += [None] * entry
                continue
            run, gen = entry  # type: ignore[misc]
            if run.gen == gen and not run.refs and run.size:
                free += range(run.start + run.size - 1, run.start - 1, -1)
        runs: dict[int, Run] = {}
        for got in self._spans.values():
            for run in [got] if isinstance(got, Run) else got:
                runs[run.start] = run
        cached = sorted(
            (h, run.refs) for run in runs.values() for h in range(run.start, run.start + run.size)
        )
        return tuple(free), tuple(cached)
