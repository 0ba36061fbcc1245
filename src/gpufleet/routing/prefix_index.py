"""Which prompt-prefix blocks each replica is believed to hold, LRU-bounded per replica.

The router cannot see replicas' caches; it remembers what it sent where. Blocks of one
prompt are touched last-to-first, so a prompt's first block is the most recent and a
replica's tail blocks are forgotten before the head they hang off (as vLLM evicts tails
first), which keeps every remembered prefix contiguous.

It also remembers where prompts branch: a block that prompts have continued in two
different ways ends a prefix they share (a system prompt, an agent's tools), while the
blocks of one conversation's history past it are continued only by its own next turns
(each turn resends the last one whole). `shared_depth` tells the two apart.

Hashes are chained (a block's hash fixes every block before it), so what the replicas
hold is closed under prefixes. Everything is kept as runs of consecutive hashes
(`gpufleet.hash_runs`): a replica's blocks as runs in recency order, and the blocks any
replica holds as runs with their number of holders and the first block seen after each
(h + 1 inside a run), so a prompt of ~200 blocks costs a few steps per run.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right, insort
from collections import deque
from collections.abc import Iterable, Sequence
from itertools import compress

from gpufleet.hash_runs import RunIndex, chain_runs, runs_known

Runs = list[tuple[int, int]]


class _Seg:
    """Hashes start..start+size-1 one replica holds, touched together: the higher ones
    less recently (a prompt's blocks are touched last-to-first)."""

    __slots__ = ("size", "start")

    def __init__(self, start: int, size: int) -> None:
        self.start = start
        self.size = size


class _Segs(RunIndex[_Seg]):
    """A replica's runs, with the lookup every routing decision makes for every replica."""

    __slots__ = ()

    def leading(self, runs: Runs) -> int:
        """How many leading blocks of the chain `runs` it holds."""
        # (`find` written out: this runs for every replica at every decision)
        segs, starts = self._runs, self._starts
        total = 0
        for h, n in runs:
            end = h + n
            while h < end:
                seg = segs.get(h)
                if seg is None:
                    i = bisect_right(starts, h) - 1
                    if i < 0:
                        return total
                    seg = segs[starts[i]]
                b = seg.start + seg.size
                if b <= h:
                    return total
                if b > end:
                    b = end
                total += b - h
                h = b
        return total


class _Lru:
    """One replica's blocks: its runs, and the queue of them least recent first (an entry
    whose run was touched again since is empty, or has moved on: size 0)."""

    __slots__ = ("held", "index", "order")

    def __init__(self) -> None:
        self.index = _Segs()
        self.order: deque[_Seg] = deque()
        self.held = 0

    def leading(self, runs: Runs) -> int:
        """How many leading blocks of the chain `runs` it holds."""
        return self.index.leading(runs)

    def touch(self, runs: Runs) -> Runs:
        """Make the chain `runs` the most recent, last block first; the parts it did not
        hold."""
        index, order = self.index, self.order
        new: Runs = []
        for h, n in reversed(runs):
            at_h = None  # a run it held from h on, wholly inside: the new one takes its key
            for seg, a, b in index.pieces(h, n):
                if seg is None:
                    new.append((a, b - a))
                    continue
                s, e = seg.start, seg.start + seg.size
                if b < e:  # it keeps its upper rest, and its place
                    index.move(seg, b, e - b)
                    if s < a:  # (the lower rest goes right after it)
                        lower = _Seg(s, a - s)
                        index.add(lower)
                        order.insert(order.index(seg) + 1, lower)
                elif s < a:
                    seg.size = a - s
                else:
                    if s == h:
                        at_h = seg
                    else:
                        index.drop(seg)
                    seg.size = 0
            seg = _Seg(h, n)
            if at_h is not None:
                index.replace(at_h, seg)
            else:
                index.add(seg)
            order.append(seg)
        self.held += sum(k for _, k in new)
        if len(order) > 2 * len(index) + 64:  # (mostly runs touched again since: drop them)
            self.order = deque(s for s in order if s.size)
        return new

    def evict(self, excess: int) -> Runs:
        """Forget its `excess` least recent blocks; which they were."""
        order, out = self.order, []
        self.held -= excess
        while excess > 0:
            seg = order[0]
            if not seg.size:
                order.popleft()
                continue
            take = min(excess, seg.size)
            top = seg.start + seg.size
            out.append((top - take, take))
            excess -= take
            if take == seg.size:
                order.popleft()
                self.index.drop(seg)
            seg.size -= take
        return out


class _Span:
    """Hashes start..start+size-1 that `count` replicas hold; the first block seen after
    hash h is h + 1, after the last one `child` (None: none seen)."""

    __slots__ = ("child", "count", "size", "start")

    def __init__(self, start: int, size: int, count: int, child: int | None) -> None:
        self.start = start
        self.size = size
        self.count = count
        self.child = child


class PrefixIndex:
    """Per-replica LRU sets of chained block hashes plus what any replica holds.

    Memory is bounded by `capacity_blocks` per replica (and so by replicas x capacity).
    """

    def __init__(self, capacity_blocks: int) -> None:
        if capacity_blocks < 1:
            raise ValueError("capacity_blocks must be >= 1")
        self.capacity_blocks = capacity_blocks
        self._capacity: dict[str, int] = {}
        self._lru: dict[str, _Lru] = {}
        self._spans: RunIndex[_Span] = RunIndex()  # blocks some replica holds
        # blocks seen continued by a second, other child: branch points
        self._branching: set[int] = set()
        self._branching_sorted: list[int] = []  # the same, in order (found by range)
        self._last: tuple[Sequence[int], Runs] = ((), [])

    def _runs(self, hashes: Sequence[int]) -> Runs:
        known = runs_known(hashes)
        if known is not None:  # (a `HashChain` or `RunList`: its maker knew them)
            return known
        last, runs = self._last
        if hashes is not last or type(hashes) is not tuple:  # (match, then insert: once)
            runs = chain_runs(hashes)
            self._last = (hashes, runs)
        return runs

    def set_capacity(self, replica_id: str, capacity_blocks: int) -> None:
        """A replica's own cache size, when it is known (e.g. from its reported KV blocks)."""
        self._capacity[replica_id] = max(1, capacity_blocks)
        self._evict(replica_id)

    def capacity_of(self, replica_id: str) -> int:
        return self._capacity.get(replica_id, self.capacity_blocks)

    def blocks_held(self, replica_id: str) -> int:
        lru = self._lru.get(replica_id)
        return lru.held if lru is not None else 0

    def total_blocks(self) -> int:
        return sum(lru.held for lru in self._lru.values())

    def insert(self, replica_id: str, hashes: Sequence[int]) -> None:
        """Record that `replica_id` now holds the prefix `hashes` (a routing decision)."""
        lru = self._lru.get(replica_id)
        if lru is None:
            lru = self._lru[replica_id] = _Lru()
        runs = self._runs(hashes)
        new = lru.touch(runs)
        if new:
            self._note_children(runs)
            nxt = {h + n: hashes[i] for i, (h, n) in self._ends(runs)}
            for h, n in reversed(new):  # (in chain order)
                self._hold(h, n, nxt)
        self._evict(replica_id)

    @staticmethod
    def _ends(runs: Runs) -> list[tuple[int, tuple[int, int]]]:
        """(position after it, run) for each run but the last."""
        out, pos = [], 0
        for h, n in runs[:-1]:
            pos += n
            out.append((pos, (h, n)))
        return out

    def _note_children(self, runs: Runs) -> None:
        """Note the first child of the last block of `runs` some replica holds, when it
        goes on to one nobody holds (before they are added as held)."""
        spans = self._spans
        parent: int | None = None
        for h, n in runs:
            for span, a, b in spans.pieces(h, n):
                if span is None:
                    if parent is not None:
                        at = spans.find(parent)
                        assert at is not None
                        if parent < at.start + at.size - 1:  # its child is parent + 1
                            self._add_branching(parent)
                        elif at.child is None:
                            at.child = a
                        elif at.child != a:
                            self._add_branching(parent)
                    return
                parent = b - 1

    def _add_branching(self, h: int) -> None:
        if h not in self._branching:
            self._branching.add(h)
            insort(self._branching_sorted, h)

    def _hold(self, h: int, n: int, nxt: dict[int, int]) -> None:
        """One more replica holds h..h+n-1 (`nxt`: the block after a chain run's end)."""
        spans = self._spans
        for span, a, b in spans.pieces(h, n):
            if span is None:  # nobody held them: their children are the chain's
                spans.add(_Span(a, b - a, 1, b if b < h + n else nxt.get(b)))
            else:
                self._isolate(span, a, b).count += 1

    def _isolate(self, span: _Span, a: int, b: int) -> _Span:
        """The span of hashes a..b-1 cut out of `span` (which holds them)."""
        spans = self._spans
        s, e = span.start, span.start + span.size
        if b < e:
            spans.add(_Span(b, e - b, span.count, span.child))
            span.size = b - s
            span.child = b
        if s < a:
            part = _Span(a, b - a, span.count, span.child)
            span.size = a - s
            span.child = a
            spans.add(part)
            return part
        return span

    def _release(self, runs: Iterable[tuple[int, int]]) -> None:
        """One replica fewer holds each of `runs`: forget what nobody holds any more."""
        spans, branching, ordered = self._spans, self._branching, self._branching_sorted
        for h, n in runs:
            for span, a, b in spans.pieces(h, n):
                assert span is not None, "a replica's blocks are held"
                part = self._isolate(span, a, b)
                part.count -= 1
                if not part.count:
                    spans.drop(part)
                    if ordered:
                        i, j = bisect_left(ordered, a), bisect_left(ordered, b)
                        if i < j:
                            branching.difference_update(ordered[i:j])
                            del ordered[i:j]

    def _evict(self, replica_id: str) -> None:
        lru = self._lru.get(replica_id)
        if lru is None:
            return
        excess = lru.held - self.capacity_of(replica_id)
        if excess > 0:
            self._release(lru.evict(excess))

    def shared_depth(self, hashes: Sequence[int], limit: int) -> int:
        """Leading blocks of `hashes`, among its first `limit`, up to the deepest one that
        prompts have continued in more than one way: what other prompts share, as opposed
        to the history of one conversation past it."""
        branching = self._branching
        if not branching or limit <= 0:
            return 0
        runs = runs_known(hashes)
        if runs is not None:  # (run by run, the last branch point in each found by bisection)
            ordered = self._branching_sorted
            deepest = pos = 0
            for h, n in runs:
                m = min(n, limit - pos)
                if m <= 0:
                    break
                j = bisect_left(ordered, h + m)
                if j and ordered[j - 1] >= h:
                    deepest = pos + ordered[j - 1] - h + 1
                pos += n
            return deepest
        head = hashes[:limit]
        if branching.isdisjoint(head):
            return 0
        *_, last = compress(range(len(head)), map(branching.__contains__, head))
        return last + 1

    def match(self, hashes: Sequence[int], replica_ids: Iterable[str]) -> dict[str, int]:
        """Leading blocks of `hashes` each of `replica_ids` holds (absent ids: 0)."""
        out = dict.fromkeys(replica_ids, 0)
        if not hashes:
            return out
        runs = self._runs(hashes)
        lrus = self._lru
        for rid in out:
            lru = lrus.get(rid)
            if lru is not None:
                out[rid] = lru.index.leading(runs)
        return out

    def remove_replica(self, replica_id: str) -> None:
        lru = self._lru.pop(replica_id, None)
        self._capacity.pop(replica_id, None)
        if lru is not None:
            self._release([(s.start, s.size) for s in lru.index.values()])
