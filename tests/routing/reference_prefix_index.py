"""The prefix index as it was before it kept runs (one Python step or dict entry per block): the
reference `test_prefix_index_runs` compares the run-based index with.

The router cannot see replicas' caches; it remembers what it sent where. Blocks of one
prompt are touched last-to-first, so a prompt's first block is the most recent and a
replica's tail blocks are forgotten before the head they hang off (as vLLM evicts tails
first), which keeps every remembered prefix contiguous.

It also remembers where prompts branch: a block that prompts have continued in two
different ways ends a prefix they share (a system prompt, an agent's tools), while the
blocks of one conversation's history past it are continued only by its own next turns
(each turn resends the last one whole). `shared_depth` tells the two apart.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Iterable, Iterator, Sequence
from itertools import islice, repeat

_MISSING = object()


def _consume(it: Iterator[object]) -> None:
    deque(it, maxlen=0)


class PrefixIndex:
    """Per-replica LRU sets of chained block hashes plus a reverse map hash -> holders.

    Memory is bounded by `capacity_blocks` per replica (and so by replicas x capacity).
    """

    def __init__(self, capacity_blocks: int) -> None:
        if capacity_blocks < 1:
            raise ValueError("capacity_blocks must be >= 1")
        self.capacity_blocks = capacity_blocks
        self._capacity: dict[str, int] = {}
        self._lru: dict[str, OrderedDict[int, None]] = {}
        # hash -> its holder, or the set of them when several hold it
        self._holders: dict[int, str | set[str]] = {}
        # hash -> the first block seen after it (a chained hash has one parent, so a pair
        # is noted once, when the child is new); blocks seen continued by a second, other
        # child are branch points
        self._first_child: dict[int, int] = {}
        self._branching: set[int] = set()

    def set_capacity(self, replica_id: str, capacity_blocks: int) -> None:
        """A replica's own cache size, when it is known (e.g. from its reported KV blocks)."""
        self._capacity[replica_id] = max(1, capacity_blocks)
        self._evict(replica_id)

    def capacity_of(self, replica_id: str) -> int:
        return self._capacity.get(replica_id, self.capacity_blocks)

    def blocks_held(self, replica_id: str) -> int:
        lru = self._lru.get(replica_id)
        return len(lru) if lru is not None else 0

    def total_blocks(self) -> int:
        return sum(len(lru) for lru in self._lru.values())

    def insert(self, replica_id: str, hashes: Sequence[int]) -> None:
        """Record that `replica_id` now holds the prefix `hashes` (a routing decision)."""
        lru = self._lru.get(replica_id)
        if lru is None:
            lru = self._lru[replica_id] = OrderedDict()
        # Touch last-to-first (in bulk: take them all out, put them back reversed); the
        # ones it did not hold gain it as a holder.
        was = list(map(lru.pop, hashes, repeat(_MISSING)))
        lru.update(zip(reversed(hashes), repeat(None)))
        if _MISSING in was:
            new = [h for h, w in zip(hashes, was, strict=True) if w is _MISSING]
            self._note_children(hashes)
            holders = self._holders
            if holders.keys().isdisjoint(new):  # usually: blocks nobody else holds
                holders.update(zip(new, repeat(replica_id)))
            else:
                for h in new:
                    self._add_holder(h, replica_id)
        self._evict(replica_id)

    def _note_children(self, hashes: Sequence[int]) -> None:
        """Note the parent of each block of `hashes` no replica holds yet (before they are
        added as held)."""
        holders = self._holders
        k = next((i for i, h in enumerate(hashes) if h not in holders), len(hashes))
        if k == len(hashes):
            return
        first = self._first_child
        if k > 0 and first.setdefault(hashes[k - 1], hashes[k]) != hashes[k]:
            self._branching.add(hashes[k - 1])
        first.update(zip(hashes[k:-1], hashes[k + 1 :], strict=True))

    def _forget(self, hashes: Iterable[int]) -> None:
        """No replica holds `hashes` any more: forget what followed them."""
        first, branching = self._first_child, self._branching
        for h in hashes:
            first.pop(h, None)
            branching.discard(h)

    def shared_depth(self, hashes: Sequence[int], limit: int) -> int:
        """Leading blocks of `hashes`, among its first `limit`, up to the deepest one that
        prompts have continued in more than one way: what other prompts share, as opposed
        to the history of one conversation past it."""
        branching = self._branching
        for k in range(min(limit, len(hashes)) - 1, -1, -1):
            if hashes[k] in branching:
                return k + 1
        return 0

    def _evict(self, replica_id: str) -> None:
        lru = self._lru.get(replica_id)
        if lru is None:
            return
        excess = len(lru) - self.capacity_of(replica_id)
        if excess <= 0:
            return
        old = list(islice(lru, excess))  # the least recently touched
        _consume(map(lru.__delitem__, old))
        holders = self._holders
        owners = list(map(holders.__getitem__, old))
        if owners.count(replica_id) == len(owners):  # it was their only holder
            _consume(map(holders.__delitem__, old))
            self._forget(old)
        else:
            for h in old:
                self._drop_holder(h, replica_id)
            self._forget(h for h in old if h not in holders)

    def _add_holder(self, h: int, replica_id: str) -> None:
        owners = self._holders.get(h)
        if owners is None:
            self._holders[h] = replica_id
        elif isinstance(owners, set):
            owners.add(replica_id)
        elif owners != replica_id:
            self._holders[h] = {owners, replica_id}

    def _drop_holder(self, h: int, replica_id: str) -> None:
        owners = self._holders.get(h)
        if owners is None:
            return
        if isinstance(owners, set):
            owners.discard(replica_id)
            if len(owners) == 1:
                self._holders[h] = next(iter(owners))
        elif owners == replica_id:
            del self._holders[h]

    def _owners(self, h: int) -> set[str]:
        owners = self._holders.get(h)
        if owners is None:
            return set()
        return owners if isinstance(owners, set) else {owners}

    def match(self, hashes: Sequence[int], replica_ids: Iterable[str]) -> dict[str, int]:
        """Leading blocks of `hashes` each of `replica_ids` holds (absent ids: 0)."""
        out = dict.fromkeys(replica_ids, 0)
        if not hashes:
            return out
        alive = self._owners(hashes[0]) & out.keys()
        i = 0
        while alive:
            i += 1
            if i == len(hashes):
                break
            nxt = alive & self._owners(hashes[i])
            for rid in alive - nxt:
                out[rid] = i
            alive = nxt
        for rid in alive:
            out[rid] = i
        return out

    def remove_replica(self, replica_id: str) -> None:
        lru = self._lru.pop(replica_id, None)
        self._capacity.pop(replica_id, None)
        if lru is None:
            return
        for h in lru:
            self._drop_holder(h, replica_id)
        self._forget(h for h in lru if h not in self._holders)
