"""Which prompt-prefix blocks each replica is believed to hold, LRU-bounded per replica.

The router cannot see replicas' caches; it remembers what it sent where. Blocks of one
prompt are touched last-to-first, so a prompt's first block is the most recent and a
replica's tail blocks are forgotten before the head they hang off (as vLLM evicts tails
first), which keeps every remembered prefix contiguous.
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
        self._holders: dict[int, set[str]] = {}

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
            owners = map(self._holders.setdefault, new, iter(set, None))
            _consume(map(set.add, owners, repeat(replica_id)))
        self._evict(replica_id)

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
        _consume(map(set.discard, map(holders.__getitem__, old), repeat(replica_id)))
        _consume(map(holders.__delitem__, [h for h in old if not holders[h]]))

    def _drop_holder(self, h: int, replica_id: str) -> None:
        owners = self._holders.get(h)
        if owners is not None:
            owners.discard(replica_id)
            if not owners:
                del self._holders[h]

    def match(self, hashes: Sequence[int], replica_ids: Iterable[str]) -> dict[str, int]:
        """Leading blocks of `hashes` each of `replica_ids` holds (absent ids: 0)."""
        out = dict.fromkeys(replica_ids, 0)
        if not hashes:
            return out
        alive = self._holders.get(hashes[0], set()) & out.keys()
        i = 0
        while alive:
            i += 1
            if i == len(hashes):
                break
            owners = self._holders.get(hashes[i])
            nxt = alive & owners if owners else set()
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
