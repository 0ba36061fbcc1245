"""Which prompt-prefix blocks each replica is believed to hold, LRU-bounded per replica.

The router cannot see replicas' caches; it remembers what it sent where. Blocks of one
prompt are touched last-to-first, so a prompt's first block is the most recent and a
replica's tail blocks are forgotten before the head they hang off (as vLLM evicts tails
first), which keeps every remembered prefix contiguous.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence


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
        holders = self._holders
        for h in reversed(hashes):
            if h in lru:
                lru.move_to_end(h)
            else:
                lru[h] = None
                owners = holders.get(h)
                if owners is None:
                    holders[h] = {replica_id}
                else:
                    owners.add(replica_id)
        self._evict(replica_id)

    def _evict(self, replica_id: str) -> None:
        lru = self._lru.get(replica_id)
        if lru is None:
            return
        cap = self.capacity_of(replica_id)
        holders = self._holders
        while len(lru) > cap:
            h, _ = lru.popitem(last=False)
            owners = holders.get(h)  # (inlined _drop_holder: this loop is hot)
            if owners is not None:
                owners.discard(replica_id)
                if not owners:
                    del holders[h]

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
