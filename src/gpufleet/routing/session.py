"""Sticky sessions by consistent hashing with bounded loads (Mirrokni, Thorup and
Zadimoghaddam, "Consistent Hashing with Bounded Loads", SODA 2018).

Each replica owns `vnodes` points on a 64-bit ring. A session key hashes to a point and
walks clockwise to the first replica whose load is under the bound
ceil(balance_factor * (total in-flight + 1) / n): a hot session spills to the next
replica on its walk instead of overloading one, and a replica leaving moves only the
sessions that were on it (every other walk is unchanged). Keys hash with blake2b, so every
gateway process agrees on placement.
"""

from __future__ import annotations

import bisect
import hashlib
import math
from collections.abc import Iterator, Sequence

from gpufleet.routing.base import PolicyBase, random_min
from gpufleet.routing.load import in_flight
from gpufleet.routing.types import ReplicaView, RequestInfo


def stable_hash64(text: str) -> int:
    data = text.encode("utf-8", "surrogatepass")  # a lone surrogate (valid JSON) hashes too
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "big")


class HashRing:
    """Points of every replica seen so far; eligibility is decided per lookup."""

    def __init__(self, vnodes: int) -> None:
        self.vnodes = vnodes
        self._points: list[int] = []
        self._owners: list[str] = []
        self._members: set[str] = set()

    def __contains__(self, replica_id: str) -> bool:
        return replica_id in self._members

    def add(self, replica_id: str) -> None:
        if replica_id in self._members:
            return
        self._members.add(replica_id)
        for i in range(self.vnodes):
            point = stable_hash64(f"{replica_id}#{i}")
            at = bisect.bisect_left(self._points, point)
            self._points.insert(at, point)
            self._owners.insert(at, replica_id)

    def remove(self, replica_id: str) -> None:
        if replica_id not in self._members:
            return
        self._members.discard(replica_id)
        keep = [(p, o) for p, o in zip(self._points, self._owners, strict=True) if o != replica_id]
        self._points = [p for p, _ in keep]
        self._owners = [o for _, o in keep]

    def walk(self, key_point: int) -> Iterator[str]:
        """Distinct replica ids in clockwise order from `key_point` (lazily)."""
        n = len(self._points)
        start = bisect.bisect_left(self._points, key_point)
        seen: set[str] = set()
        for k in range(n):
            owner = self._owners[(start + k) % n]
            if owner not in seen:
                seen.add(owner)
                yield owner
                if len(seen) == len(self._members):
                    return


class SessionAffinity(PolicyBase):
    """Consistent hashing with bounded loads on `RequestInfo.session_key`.

    Requests without a session key go to the least outstanding replica.
    """

    name = "session"

    def __init__(
        self, *, seed: int | None = None, balance_factor: float = 1.25, vnodes: int = 64
    ) -> None:
        super().__init__(seed=seed)
        if balance_factor < 1.0:
            raise ValueError("balance_factor must be >= 1.0 (1.0 means perfectly even)")
        if vnodes < 1:
            raise ValueError("vnodes must be >= 1")
        self.balance_factor = balance_factor
        self.ring = HashRing(vnodes)

    def capacity(self, replicas: Sequence[ReplicaView]) -> int:
        """The most in-flight requests a replica may hold after taking this one."""
        total = sum(in_flight(r) for r in replicas) + 1
        return max(1, math.ceil(self.balance_factor * total / len(replicas)))

    def choose(self, request: RequestInfo, replicas: Sequence[ReplicaView]) -> ReplicaView | None:
        if not replicas:
            return None
        if request.session_key is None:
            return random_min(self.rng, replicas, in_flight)
        by_id = {r.replica_id: r for r in replicas}
        for rid in by_id:
            self.ring.add(rid)
        cap = self.capacity(replicas)
        for rid in self.ring.walk(stable_hash64(request.session_key)):
            replica = by_id.get(rid)
            if replica is not None and in_flight(replica) + 1 <= cap:
                return replica
        # Unreachable while cap >= mean load + 1, kept as a guard: least loaded.
        return random_min(self.rng, replicas, in_flight)

    def on_replica_removed(self, replica_id: str) -> None:
        self.ring.remove(replica_id)
